//! Typed request and response of one reconcile, as the rest of the runtime sees them.
//!
//! The WIT types carry JSON as strings; these carry parsed [`serde_json::Value`]s, checked
//! once at the boundary so that nothing past the sandbox handles malformed guest output.

use std::time::Duration;

use kubewasm_guest_sdk::selector::Selector;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::bindings::wit;
use super::text::{MAX_EVENT_REASON_BYTES, MAX_GUEST_MESSAGE_BYTES, bounded, prefix};

/// Names one Kubernetes object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    /// `apiVersion`, e.g. `v1`.
    pub api_version: String,
    /// `kind`, e.g. `Pod`.
    pub kind: String,
    /// Namespace; `None` for cluster-scoped objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

impl ObjectRef {
    /// Reads the reference out of an object's `apiVersion`, `kind` and `metadata`.
    pub fn of(object: &Value) -> Result<ObjectRef, String> {
        let field = |ptr: &str| object.pointer(ptr).and_then(Value::as_str);
        let missing = |what: &str| format!("not a Kubernetes object: missing `{what}`");
        if !object.is_object() {
            return Err(format!(
                "not a Kubernetes object: expected a JSON object, got `{}`",
                short(object)
            ));
        }
        Ok(ObjectRef {
            api_version: field("/apiVersion")
                .ok_or_else(|| missing("apiVersion"))?
                .to_owned(),
            kind: field("/kind").ok_or_else(|| missing("kind"))?.to_owned(),
            namespace: field("/metadata/namespace").map(str::to_owned),
            name: field("/metadata/name")
                .ok_or_else(|| missing("metadata.name"))?
                .to_owned(),
        })
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {}/{}", self.kind, ns, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// What one reconcile is about.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The controller, as `namespace/name`.
    pub controller: String,
    /// The parent object this call is about.
    pub target: ObjectRef,
    /// The parent as last observed; `None` when it is gone.
    pub parent: Option<Value>,
    /// Observed children (composite controllers).
    pub children: Vec<Value>,
}

impl Request {
    /// A request about an object that exists, with no children.
    pub fn for_object(controller: &str, object: Value) -> Result<Request, String> {
        Ok(Request {
            controller: controller.to_owned(),
            target: ObjectRef::of(&object)?,
            parent: Some(object),
            children: Vec::new(),
        })
    }

    pub(crate) fn to_wit(&self) -> wit::Request {
        wit::Request {
            controller: self.controller.clone(),
            target: self.target.clone().into(),
            parent: self.parent.as_ref().map(Value::to_string),
            children: self.children.iter().map(Value::to_string).collect(),
        }
    }
}

/// Delete every object of a kind matching a label selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteSelector {
    /// `apiVersion` of the objects.
    pub api_version: String,
    /// `kind` of the objects.
    pub kind: String,
    /// Namespace; `None` means the target's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Label selector, e.g. `app=frontend`; it parses, and it [narrows](Selector::narrows).
    pub label_selector: String,
}

/// Normal or Warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    /// Routine progress.
    Normal,
    /// Needs attention.
    Warning,
}

/// An Event to record on the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Normal or Warning.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// Short CamelCase reason, at most [`MAX_EVENT_REASON_BYTES`].
    pub reason: String,
    /// Readable message, at most [`MAX_GUEST_MESSAGE_BYTES`].
    pub message: String,
}

/// One thing a guest asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Server-side apply of this object.
    Apply(Value),
    /// Delete one object.
    Delete(ObjectRef),
    /// Delete all objects matching a selector.
    DeleteAllOf(DeleteSelector),
    /// Replace the target's status.
    SetStatus(Value),
    /// Record an Event on the target.
    Event(Event),
    /// Reconcile the target again after this delay.
    RequeueAfter(Duration),
}

/// The actions a guest returned, checked for shape.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Response {
    /// Actions in the order the guest gave them.
    pub actions: Vec<Action>,
}

impl Response {
    /// Checks and converts what the guest returned. `Err` says which action was malformed.
    pub(crate) fn from_wit(response: wit::Response, max_bytes: usize) -> Result<Response, String> {
        let size: usize = response.actions.iter().map(action_size).sum();
        if size > max_bytes {
            return Err(format!(
                "response is {} bytes, more than the limit of {} bytes",
                size, max_bytes
            ));
        }
        let actions = response
            .actions
            .into_iter()
            .enumerate()
            .map(|(i, a)| Action::from_wit(a).map_err(|e| format!("action {}: {e}", i + 1)))
            .collect::<Result<_, _>>()?;
        Ok(Response { actions })
    }

    /// The shortest requeue delay asked for, if any.
    pub fn requeue_after(&self) -> Option<Duration> {
        self.actions
            .iter()
            .filter_map(|a| match a {
                Action::RequeueAfter(d) => Some(*d),
                _ => None,
            })
            .min()
    }
}

fn action_size(action: &wit::Action) -> usize {
    match action {
        wit::Action::Apply(s) | wit::Action::SetStatus(s) => s.len(),
        wit::Action::Delete(r) => r.name.len() + r.kind.len() + r.api_version.len(),
        wit::Action::DeleteAllOf(d) => d.label_selector.len() + d.kind.len(),
        wit::Action::EmitEvent(e) => e.reason.len() + e.message.len(),
        wit::Action::RequeueAfter(_) => 8,
    }
}

fn parse(what: &str, json: &str) -> Result<Value, String> {
    serde_json::from_str(json).map_err(|e| format!("{what}: not valid JSON: {e}"))
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 60 {
        format!("{}…", &s[..s.floor_char_boundary(60)])
    } else {
        s
    }
}

impl Action {
    fn from_wit(action: wit::Action) -> Result<Action, String> {
        Ok(match action {
            wit::Action::Apply(json) => {
                let object = parse("apply", &json)?;
                ObjectRef::of(&object).map_err(|e| format!("apply: {e}"))?;
                Action::Apply(object)
            }
            wit::Action::Delete(r) => Action::Delete(r.into()),
            wit::Action::DeleteAllOf(d) => {
                check_delete_selector(&d.label_selector)
                    .map_err(|e| format!("delete-all-of: {e}"))?;
                Action::DeleteAllOf(DeleteSelector {
                    api_version: d.api_version,
                    kind: d.kind,
                    namespace: d.namespace,
                    label_selector: d.label_selector,
                })
            }
            wit::Action::SetStatus(json) => {
                let status = parse("set-status", &json)?;
                if !status.is_object() {
                    return Err(format!(
                        "set-status: status must be a JSON object, got `{}`",
                        short(&status)
                    ));
                }
                Action::SetStatus(status)
            }
            wit::Action::EmitEvent(e) => Action::Event(Event {
                event_type: match e.event_type {
                    wit::EventType::Normal => EventType::Normal,
                    wit::EventType::Warning => EventType::Warning,
                },
                reason: prefix(&e.reason, MAX_EVENT_REASON_BYTES).to_owned(),
                message: bounded(&e.message, MAX_GUEST_MESSAGE_BYTES).into_owned(),
            }),
            wit::Action::RequeueAfter(ms) => Action::RequeueAfter(Duration::from_millis(ms)),
        })
    }
}

/// A delete-all-of selector must parse and must name a label the objects have: one built
/// only from `!=`, `notin` and `!key` (or nothing) matches nearly every object of the kind.
fn check_delete_selector(selector: &str) -> Result<(), String> {
    let parsed = Selector::parse(selector).map_err(|e| e.to_string())?;
    if !parsed.narrows() {
        return Err(format!(
            "label selector {:?} would match every object without those labels, nearly all of them; name at least one label the objects must have, e.g. app=web",
            bounded(selector, 128)
        ));
    }
    Ok(())
}

impl From<ObjectRef> for wit::ObjectRef {
    fn from(r: ObjectRef) -> Self {
        wit::ObjectRef {
            api_version: r.api_version,
            kind: r.kind,
            namespace: r.namespace,
            name: r.name,
        }
    }
}

impl From<wit::ObjectRef> for ObjectRef {
    fn from(r: wit::ObjectRef) -> Self {
        ObjectRef {
            api_version: r.api_version,
            kind: r.kind,
            namespace: r.namespace,
            name: r.name,
        }
    }
}

/// Reads a guest may make during a call. Implementations check grants and answer from a
/// cache or fixed state; an `Err` is handed to the guest as the reason its read was refused.
pub trait Reads: Send + Sync {
    /// One object, `Ok(None)` when it does not exist.
    fn get(&self, object: &ObjectRef) -> Result<Option<Value>, String>;
    /// Objects of a kind in a namespace (`None`: cluster-wide or the target's, as the
    /// implementation decides), filtered by an optional label selector.
    fn list(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Value>, String>;
}

/// A cluster with nothing in it: every get finds nothing, every list is empty.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoReads;

impl Reads for NoReads {
    fn get(&self, _: &ObjectRef) -> Result<Option<Value>, String> {
        Ok(None)
    }

    fn list(
        &self,
        _: &str,
        _: &str,
        _: Option<&str>,
        _: Option<&str>,
    ) -> Result<Vec<Value>, String> {
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn apply_must_be_a_kubernetes_object() {
        let bad = wit::Response {
            actions: vec![wit::Action::Apply("42".into())],
        };
        let err = Response::from_wit(bad, 1 << 20).unwrap_err();
        assert!(
            err.contains("action 1: apply: not a Kubernetes object"),
            "{err}"
        );
        let no_name = wit::Response {
            actions: vec![wit::Action::Apply(
                json!({"apiVersion":"v1","kind":"Pod"}).to_string(),
            )],
        };
        let err = Response::from_wit(no_name, 1 << 20).unwrap_err();
        assert!(err.contains("missing `metadata.name`"), "{err}");
    }

    #[test]
    fn response_size_is_bounded() {
        let big = wit::Response {
            actions: vec![wit::Action::SetStatus("x".repeat(100))],
        };
        let err = Response::from_wit(big, 10).unwrap_err();
        assert!(
            err.contains("100 bytes, more than the limit of 10"),
            "{err}"
        );
    }

    fn delete_all_of(selector: &str) -> Result<Response, String> {
        let response = wit::Response {
            actions: vec![wit::Action::DeleteAllOf(wit::DeleteSelector {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: None,
                label_selector: selector.into(),
            })],
        };
        Response::from_wit(response, 4 << 20)
    }

    #[test]
    fn delete_all_of_needs_a_label_that_must_exist() {
        for selector in ["", "  ", "!nonexistent", "a!=b", "a notin (b)", "!a,b!=c"] {
            let err = delete_all_of(selector).expect_err(selector);
            assert!(
                err.contains("name at least one label the objects must have, e.g. app=web"),
                "{selector}: {err}"
            );
        }
        for selector in ["a=b", "a", "a in (b)", "a=b,!c"] {
            let response = delete_all_of(selector).unwrap_or_else(|e| panic!("{selector}: {e}"));
            assert!(
                matches!(&response.actions[0], Action::DeleteAllOf(d) if d.label_selector == selector),
                "{response:?}"
            );
        }
        let err = delete_all_of("a in x").unwrap_err();
        assert!(
            err.contains("delete-all-of: invalid label selector"),
            "{err}"
        );
        let err = delete_all_of(&format!("a={}", "x".repeat(1 << 20))).unwrap_err();
        assert!(err.contains("more than the limit of 4096"), "{err}");
        assert!(err.len() < 400, "{err}");
    }

    #[test]
    fn event_reason_and_message_are_cut_not_refused() {
        let response = wit::Response {
            actions: vec![wit::Action::EmitEvent(wit::Event {
                event_type: wit::EventType::Warning,
                reason: "Reason".repeat(100),
                message: "é".repeat(1 << 20),
            })],
        };
        let response = Response::from_wit(response, 4 << 20).unwrap();
        let Action::Event(event) = &response.actions[0] else {
            panic!("{response:?}")
        };
        assert_eq!(event.reason, "Reason".repeat(100)[..MAX_EVENT_REASON_BYTES]);
        assert!(event.message.len() <= MAX_GUEST_MESSAGE_BYTES);
        assert!(event.message.starts_with("éé"));
        assert!(event.message.ends_with(" more bytes)"), "{}", event.message);
    }

    #[test]
    fn shortest_requeue_wins() {
        let r = Response {
            actions: vec![
                Action::RequeueAfter(Duration::from_secs(5)),
                Action::RequeueAfter(Duration::from_secs(2)),
            ],
        };
        assert_eq!(r.requeue_after(), Some(Duration::from_secs(2)));
    }
}
