//! What an answer does, normalised ([`effects`]), and how two answers differ
//! ([`differences`]), in lines a person reads.
//!
//! An answer's effects are keyed by what they act on: the objects applied and deleted (each
//! `deleteAllOf` expanded into the objects it would delete, where the controller may list
//! them), the target's status, its saved state, the Events by reason, the requeue and the
//! finalizer's removal. Order does not matter where the runtime's result does not depend on
//! it (different objects), and what the runtime fills in itself (an applied object's
//! namespace, the target's by default) is filled in on both sides before they are compared.
//! The last apply of an object, the last status and the last saved state are what count, as
//! they are what the object is left with.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::Problem;
use crate::sandbox::{Action, ObjectRef, guest_text};

/// Most lines of one reconcile's differences kept; the rest are counted.
pub const MAX_LINES: usize = 64;

/// Most bytes of one line of differences.
pub const MAX_LINE_BYTES: usize = 512;

/// Most bytes of one value shown in a line.
const MAX_VALUE_BYTES: usize = 160;

/// Most fields named for one object that differs; the rest are counted.
const MAX_FIELDS: usize = 8;

/// What a `deleteAllOf` asks to delete: the kind, the namespace (the target's when not
/// given), the selector and the time bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub label_selector: String,
    pub created_before: Option<String>,
}

/// What one answer does, by what it acts on.
pub type Effects = BTreeMap<String, Value>;

/// An answer as it is compared: what it does, or why it failed.
#[derive(Debug, Clone)]
pub enum Answered {
    /// The call answered these effects.
    Did(Effects),
    /// The call (or its answer) failed.
    Failed(Problem),
}

/// The effects of `actions`, answered for `target`. `expand` lists the objects a
/// `deleteAllOf` would delete (`None`: they cannot be listed, and the selection itself is
/// compared).
pub fn effects(
    actions: &[Action],
    target: &ObjectRef,
    expand: &mut dyn FnMut(&Selection) -> Option<Vec<Value>>,
) -> Effects {
    let mut effects = Effects::new();
    let default_ns = target.namespace.clone();
    for action in actions {
        match action {
            Action::Apply(object) => {
                let mut object = object.clone();
                let ns = str_at(&object, "/metadata/namespace")
                    .map(str::to_owned)
                    .or_else(|| default_ns.clone());
                if let (Some(ns), Some(meta)) = (&ns, object.get_mut("metadata"))
                    && let Some(meta) = meta.as_object_mut()
                {
                    meta.insert("namespace".into(), Value::String(ns.clone()));
                }
                let key = format!(
                    "apply {} {}",
                    kind_of(
                        str_at(&object, "/apiVersion").unwrap_or_default(),
                        str_at(&object, "/kind").unwrap_or_default()
                    ),
                    place(
                        ns.as_deref(),
                        str_at(&object, "/metadata/name").unwrap_or_default()
                    )
                );
                effects.insert(key, object);
            }
            Action::Delete(r) => {
                let ns = r.namespace.clone().or_else(|| default_ns.clone());
                effects.insert(
                    deleted(&r.api_version, &r.kind, ns.as_deref(), &r.name),
                    Value::Bool(true),
                );
            }
            Action::DeleteAllOf {
                api_version,
                kind,
                namespace,
                label_selector,
                created_before,
            } => {
                let selection = Selection {
                    api_version: api_version.clone(),
                    kind: kind.clone(),
                    namespace: namespace.clone().or_else(|| default_ns.clone()),
                    label_selector: label_selector.clone(),
                    created_before: created_before.clone(),
                };
                match expand(&selection) {
                    Some(objects) => {
                        for object in objects {
                            let name = str_at(&object, "/metadata/name").unwrap_or_default();
                            let ns = str_at(&object, "/metadata/namespace");
                            effects.insert(deleted(api_version, kind, ns, name), Value::Bool(true));
                        }
                    }
                    None => {
                        let key = format!(
                            "delete every {} matching {label_selector:?} in {}",
                            kind_of(api_version, kind),
                            selection.namespace.as_deref().unwrap_or("the cluster")
                        );
                        let before = created_before.clone().map_or(
                            Value::Bool(true),
                            |t| serde_json::json!({ "createdBefore": t }),
                        );
                        effects.insert(key, before);
                    }
                }
            }
            Action::SetStatus(status) => {
                effects.insert("set the status".into(), status.clone());
            }
            Action::Event {
                event_type,
                reason,
                message,
            } => {
                let key = format!("record a {event_type:?} Event {reason}");
                let messages = effects
                    .entry(key)
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Some(list) = messages.as_array_mut() {
                    list.push(Value::String(message.clone()));
                }
            }
            Action::RequeueAfter(after) => {
                let ms = u64::try_from(after.as_millis()).unwrap_or(u64::MAX);
                let shortest = effects
                    .get("requeue after (ms)")
                    .and_then(Value::as_u64)
                    .map_or(ms, |before| before.min(ms));
                effects.insert("requeue after (ms)".into(), Value::from(shortest));
            }
            Action::SetState(state) => {
                let state = state.clone().map_or(Value::Null, Value::String);
                effects.insert("save the state".into(), state);
            }
            Action::Finalized(true) => {
                effects.insert("remove the finalizer".into(), Value::Bool(true));
            }
            Action::Finalized(false) => {}
        }
    }
    effects
}

/// How `candidate` differs from `live`, one line each (none: the same), at most
/// [`MAX_LINES`] (the last says how many more there were), each at most [`MAX_LINE_BYTES`].
pub fn differences(live: &Answered, candidate: &Answered) -> Vec<String> {
    let mut lines = Vec::new();
    match (live, candidate) {
        (Answered::Failed(l), Answered::Failed(c)) => {
            if l.reason != c.reason {
                lines.push(format!(
                    "both failed, differently: the live module with {} ({}), the candidate with {} ({})",
                    l.reason, l.message, c.reason, c.message
                ));
            }
        }
        (Answered::Failed(l), Answered::Did(c)) => lines.push(format!(
            "the live module failed ({}: {}); the candidate answered {} effects",
            l.reason,
            l.message,
            c.len()
        )),
        (Answered::Did(l), Answered::Failed(c)) => lines.push(format!(
            "the candidate failed ({}: {}) where the live module answered {} effects",
            c.reason,
            c.message,
            l.len()
        )),
        (Answered::Did(l), Answered::Did(c)) => {
            for (key, value) in l {
                match c.get(key) {
                    None => lines.push(format!("{key}: only the live module does it")),
                    Some(other) if other != value => {
                        let mut fields = Vec::new();
                        field_changes("", value, other, &mut fields);
                        let more = fields.len().saturating_sub(MAX_FIELDS);
                        fields.truncate(MAX_FIELDS);
                        if more > 0 {
                            fields.push(format!("and {more} more fields"));
                        }
                        lines.push(format!("{key}: {}", fields.join("; ")));
                    }
                    Some(_) => {}
                }
            }
            for key in c.keys().filter(|k| !l.contains_key(*k)) {
                lines.push(format!("{key}: only the candidate would do it"));
            }
        }
    }
    let more = lines.len().saturating_sub(MAX_LINES - 1);
    if more > 1 {
        lines.truncate(MAX_LINES - 1);
        lines.push(format!("and {more} more differences"));
    }
    lines
        .into_iter()
        .map(|line| guest_text(&line, MAX_LINE_BYTES).into_owned())
        .collect()
}

/// Each field where `live` and `candidate` differ: `path: live → candidate`.
fn field_changes(path: &str, live: &Value, candidate: &Value, out: &mut Vec<String>) {
    if out.len() > MAX_FIELDS {
        return;
    }
    match (live, candidate) {
        (Value::Object(l), Value::Object(c)) => {
            let mut keys: Vec<&String> = l.keys().chain(c.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let at = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                match (l.get(key), c.get(key)) {
                    (Some(a), Some(b)) if a == b => {}
                    (Some(a), Some(b)) => field_changes(&at, a, b, out),
                    (Some(a), None) => out.push(format!("{at}: {} → (none)", shown(a))),
                    (None, Some(b)) => out.push(format!("{at}: (none) → {}", shown(b))),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(l), Value::Array(c)) if l.len() == c.len() => {
            for (i, (a, b)) in l.iter().zip(c).enumerate() {
                if a != b {
                    field_changes(&format!("{path}[{i}]"), a, b, out);
                }
            }
        }
        _ => {
            let at = if path.is_empty() { "(whole)" } else { path };
            out.push(format!("{at}: {} → {}", shown(live), shown(candidate)));
        }
    }
}

/// A value as JSON, cut to [`MAX_VALUE_BYTES`].
fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.len() <= MAX_VALUE_BYTES {
        return text;
    }
    let mut end = MAX_VALUE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

fn deleted(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> String {
    format!(
        "delete {} {}",
        kind_of(api_version, kind),
        place(namespace, name)
    )
}

fn kind_of(api_version: &str, kind: &str) -> String {
    format!("{kind} ({api_version})")
}

fn place(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    }
}

fn str_at<'v>(v: &'v Value, pointer: &str) -> Option<&'v str> {
    v.pointer(pointer).and_then(Value::as_str)
}
