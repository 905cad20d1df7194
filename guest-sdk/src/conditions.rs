//! Status conditions shaped like `metav1.Condition`, set the way Kubernetes' own
//! `meta.SetStatusCondition` sets them, so that kstatus, `kubectl wait` and people read them.
//!
//! A guest writes its parent's whole status each reconcile ([`crate::Response::set_status`]),
//! so the status is built fresh from what the guest observed; [`set`] adds one condition to
//! it and takes from the parent's current status only what must survive: the condition's
//! `lastTransitionTime`, kept while its `status` stays the same. An unchanged status is then
//! byte-for-byte the parent's, and the runtime does not write it again.
//!
//! What reads what:
//! - **kstatus** (`sigs.k8s.io/cli-utils`; the health checks of Flux, kpt, Config Sync): `metadata.generation`
//!   against `status.observedGeneration` (different: *InProgress*), then `Reconciling`
//!   `True` (*InProgress*) or `Stalled` `True` (*Failed*); otherwise a custom resource is
//!   *Current*. It does not read `Ready` or the per-condition `observedGeneration`. Both
//!   conditions are "abnormal-true": leave them out when all is well.
//! - **`Ready`** is what people, `kubectl wait --for=condition=Ready` and most dashboards
//!   look at; each condition's `observedGeneration` says which spec it describes.
//!
//! [`set`] writes both `observedGeneration`s from the parent's `metadata.generation` (none
//! when the parent has none). Only use it on kinds with a status subresource: without one,
//! the API server counts every status write as a new generation, and an
//! `observedGeneration` would never catch up (each write would start another reconcile).
//!
//! ```
//! use kubewasm_guest_sdk::conditions::{self, Condition, Status};
//! use kubewasm_guest_sdk::{Error, Response};
//! use serde_json::json;
//!
//! # fn main() -> Result<(), Error> {
//! let parent = json!({
//!     "apiVersion": "example.com/v1", "kind": "Site",
//!     "metadata": {"name": "web", "namespace": "demo", "generation": 3},
//! });
//! let ready_pods = 2;
//! let mut status = json!({ "readyPods": ready_pods });
//! if ready_pods > 0 {
//!     conditions::set(&mut status, &parent, Condition::ready(Status::True, "PodsReady", "2 Pods ready"))?;
//! } else {
//!     conditions::set(&mut status, &parent, Condition::ready(Status::False, "NoPodReady", "waiting for Pods"))?;
//!     conditions::set(&mut status, &parent, Condition::reconciling("NoPodReady", "waiting for Pods"))?;
//! }
//! assert_eq!(status["observedGeneration"], 3);
//! assert_eq!(status["conditions"][0]["type"], "Ready");
//! assert_eq!(status["conditions"][0]["observedGeneration"], 3);
//! let response = Response::new().set_status(status);
//! # let _ = response;
//! # Ok(())
//! # }
//! ```

use std::time::SystemTime;

use serde_json::{Map, Value, json};

use crate::Error;

/// The object is fully reconciled and working (the positive summary condition).
pub const READY: &str = "Ready";
/// kstatus: the controller is still working towards the spec (`True` means *InProgress*).
pub const RECONCILING: &str = "Reconciling";
/// kstatus: the controller cannot make progress without a change (`True` means *Failed*).
pub const STALLED: &str = "Stalled";

/// The longest `message` kept (`metav1.Condition`'s limit); a longer one is cut there.
pub const MAX_MESSAGE_BYTES: usize = 32_768;
/// The longest `reason` (`metav1.Condition`'s limit).
pub const MAX_REASON_BYTES: usize = 1_024;
/// The longest `type` (`metav1.Condition`'s limit).
pub const MAX_TYPE_BYTES: usize = 316;

/// A condition's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// The controller cannot tell (yet).
    Unknown,
}

impl Status {
    /// `"True"`, `"False"` or `"Unknown"`, as written in the object.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [Status::True, Status::False, Status::Unknown]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

impl From<bool> for Status {
    fn from(holds: bool) -> Self {
        if holds { Status::True } else { Status::False }
    }
}

/// One condition to set: what [`set`] does not fill in itself (`observedGeneration`,
/// `lastTransitionTime`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `type`, e.g. [`READY`]: CamelCase, or `example.com/CamelCase`.
    pub type_: String,
    /// `status`.
    pub status: Status,
    /// `reason`: one CamelCase word a program can match, e.g. `PodsReady`.
    pub reason: String,
    /// `message`: a sentence for people.
    pub message: String,
}

impl Condition {
    /// A condition of any type.
    pub fn new(
        type_: impl Into<String>,
        status: impl Into<Status>,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// [`READY`] with this status (`true`/`false` or a [`Status`]).
    pub fn ready(
        status: impl Into<Status>,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::new(READY, status, reason, message)
    }

    /// [`RECONCILING`] `True`: kstatus reports the object *InProgress*.
    pub fn reconciling(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(RECONCILING, Status::True, reason, message)
    }

    /// [`STALLED`] `True`: kstatus reports the object *Failed*.
    pub fn stalled(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(STALLED, Status::True, reason, message)
    }
}

/// Set `condition` in `status.conditions` (replacing one of the same type), stamped with the
/// parent's `metadata.generation` here and as `status.observedGeneration`, and with a
/// `lastTransitionTime` of now unless the parent's current status has this condition with
/// the same `status` (then its time is kept). `status` becomes a JSON object if it is not one.
///
/// Fails (permanently) when the type or the reason is not one the API server accepts
/// (`metav1.Condition`'s rules); a message longer than [`MAX_MESSAGE_BYTES`] is cut.
///
/// Not in guests built without WASI (docs/03-writing-a-controller.md, "Guests without WASI"): they have no clock;
/// [`set_at`] with a time from elsewhere (e.g. the parent's) works there.
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
pub fn set(status: &mut Value, parent: &Value, condition: Condition) -> Result<(), Error> {
    set_at(status, parent, condition, SystemTime::now())
}

/// [`set`] with `now` as the current time, for tests that compare whole statuses.
pub fn set_at(
    status: &mut Value,
    parent: &Value,
    condition: Condition,
    now: SystemTime,
) -> Result<(), Error> {
    validate_type(&condition.type_)?;
    validate_reason(&condition.reason)?;
    let generation = parent
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    let since = find(parent, &condition.type_)
        .filter(|old| old.get("status").and_then(Value::as_str) == Some(condition.status.as_str()))
        .and_then(|old| old.get("lastTransitionTime")?.as_str())
        .map_or_else(|| crate::time::rfc3339(now), str::to_string);

    let mut entry = Map::new();
    entry.insert("type".into(), json!(condition.type_));
    entry.insert("status".into(), json!(condition.status.as_str()));
    if let Some(generation) = generation {
        entry.insert("observedGeneration".into(), json!(generation));
    }
    entry.insert("lastTransitionTime".into(), json!(since));
    entry.insert("reason".into(), json!(condition.reason));
    entry.insert("message".into(), json!(cut(condition.message)));

    let fields = as_object(status);
    if let Some(generation) = generation {
        fields.insert("observedGeneration".into(), json!(generation));
    }
    let list = fields.entry("conditions").or_insert_with(|| json!([]));
    if !list.is_array() {
        *list = json!([]);
    }
    if let Value::Array(list) = list {
        let same_type = |c: &Value| c.get("type").and_then(Value::as_str) == Some(&condition.type_);
        match list.iter_mut().find(|c| same_type(c)) {
            Some(existing) => *existing = Value::Object(entry),
            None => list.push(Value::Object(entry)),
        }
    }
    Ok(())
}

/// The condition of this type in `obj.status.conditions`, if any.
pub fn find<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
}

/// The `status` of the condition of this type in `obj` (`None`: no such condition, or not
/// one of `True`/`False`/`Unknown`). Works for any object with conditions, e.g. a child
/// Deployment's `Available`.
pub fn status_of(obj: &Value, type_: &str) -> Option<Status> {
    Status::parse(find(obj, type_)?.get("status")?.as_str()?)
}

/// `value` as a JSON object, made an empty one first when it is anything else.
fn as_object(value: &mut Value) -> &mut Map<String, Value> {
    if !value.is_object() {
        *value = json!({});
    }
    match value {
        Value::Object(map) => map,
        _ => unreachable!("just made an object"),
    }
}

fn cut(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        message.truncate(message.floor_char_boundary(MAX_MESSAGE_BYTES));
    }
    message
}

/// `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, at most [`MAX_REASON_BYTES`].
fn validate_reason(reason: &str) -> Result<(), Error> {
    let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':');
    let ok = reason.len() <= MAX_REASON_BYTES
        && reason.starts_with(|c: char| c.is_ascii_alphabetic())
        && reason.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        && reason.chars().all(inner);
    if ok {
        Ok(())
    } else {
        Err(Error::permanent(format!(
            "invalid condition reason {:?}: one CamelCase word such as `PodsReady` (letters, digits, `_`, `,`, `:`; at most {MAX_REASON_BYTES} bytes)",
            short(reason)
        )))
    }
}

/// A qualified name: `Name` or `example.com/Name`, at most [`MAX_TYPE_BYTES`].
fn validate_type(type_: &str) -> Result<(), Error> {
    let (prefix, name) = type_.rsplit_once('/').unwrap_or(("", type_));
    let alnum_ends = |s: &str| {
        s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    let name_ok = alnum_ends(name)
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = !type_.contains('/')
        || prefix.split('.').all(|label| {
            alnum_ends(label)
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        });
    if type_.len() <= MAX_TYPE_BYTES && name_ok && prefix_ok {
        Ok(())
    } else {
        Err(Error::permanent(format!(
            "invalid condition type {:?}: a name such as `Ready` or `example.com/Ready` (at most {MAX_TYPE_BYTES} bytes)",
            short(type_)
        )))
    }
}

/// At most the first 64 bytes of `text`, for messages.
fn short(text: &str) -> &str {
    &text[..text.floor_char_boundary(64)]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const T1: &str = "2026-11-23T12:00:00Z";
    const T2: &str = "2026-11-23T12:05:00Z";

    fn at(text: &str) -> SystemTime {
        let secs = match text {
            T1 => 1_795_435_200,
            T2 => 1_795_435_500,
            other => panic!("no instant for {other}"),
        };
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn parent(generation: i64, status: Value) -> Value {
        json!({
            "apiVersion": "example.com/v1", "kind": "Site",
            "metadata": {"name": "web", "namespace": "demo", "generation": generation},
            "status": status,
        })
    }

    fn ready(holds: bool) -> Condition {
        if holds {
            Condition::ready(true, "PodsReady", "2 Pods ready")
        } else {
            Condition::ready(false, "NoPodReady", "waiting for Pods")
        }
    }

    #[test]
    fn first_condition_is_stamped_with_generation_and_now() {
        let mut status = json!({"pods": 2});
        set_at(&mut status, &parent(4, json!(null)), ready(true), at(T1)).unwrap();
        assert_eq!(
            status,
            json!({
                "pods": 2,
                "observedGeneration": 4,
                "conditions": [{
                    "type": "Ready", "status": "True", "observedGeneration": 4,
                    "lastTransitionTime": T1, "reason": "PodsReady", "message": "2 Pods ready",
                }],
            })
        );
    }

    #[test]
    fn same_status_keeps_the_time_and_so_the_whole_status() {
        let mut first = json!({"pods": 2});
        set_at(&mut first, &parent(4, json!(null)), ready(true), at(T1)).unwrap();
        let mut again = json!({"pods": 2});
        set_at(&mut again, &parent(4, first.clone()), ready(true), at(T2)).unwrap();
        assert_eq!(again, first, "nothing changed, so nothing to write");

        // A new message or generation is no transition either.
        let mut newer = json!({"pods": 3});
        let changed = Condition::ready(true, "PodsReady", "3 Pods ready");
        set_at(&mut newer, &parent(5, first.clone()), changed, at(T2)).unwrap();
        let condition = &newer["conditions"][0];
        assert_eq!(condition["lastTransitionTime"], T1);
        assert_eq!(condition["observedGeneration"], 5);
        assert_eq!(condition["message"], "3 Pods ready");
    }

    #[test]
    fn a_changed_status_is_a_transition() {
        let mut first = json!({});
        set_at(&mut first, &parent(1, json!(null)), ready(true), at(T1)).unwrap();
        let mut status = json!({});
        set_at(&mut status, &parent(1, first), ready(false), at(T2)).unwrap();
        assert_eq!(status["conditions"][0]["lastTransitionTime"], T2);
        assert_eq!(status["conditions"][0]["status"], "False");
        assert_eq!(
            status_of(&json!({"status": status}), READY),
            Some(Status::False)
        );
    }

    #[test]
    fn setting_a_type_twice_replaces_it_and_others_keep_their_order() {
        let mut status = json!(null);
        let p = parent(1, json!(null));
        set_at(&mut status, &p, ready(false), at(T1)).unwrap();
        set_at(
            &mut status,
            &p,
            Condition::reconciling("NoPodReady", "waiting"),
            at(T1),
        )
        .unwrap();
        set_at(&mut status, &p, ready(true), at(T1)).unwrap();
        let types: Vec<&str> = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, [READY, RECONCILING]);
        let with = json!({"status": status});
        assert_eq!(status_of(&with, READY), Some(Status::True));
        assert_eq!(status_of(&with, RECONCILING), Some(Status::True));
        assert_eq!(status_of(&with, STALLED), None);
    }

    #[test]
    fn no_generation_means_no_observed_generation() {
        let p = json!({"metadata": {"name": "x"}});
        let mut status = json!({"conditions": "not a list"});
        set_at(
            &mut status,
            &p,
            Condition::stalled("BadSpec", "spec.size < 0"),
            at(T1),
        )
        .unwrap();
        assert_eq!(status.get("observedGeneration"), None);
        assert_eq!(status["conditions"][0].get("observedGeneration"), None);
        assert_eq!(status["conditions"][0]["type"], STALLED);
    }

    #[test]
    fn a_kept_time_needs_the_same_status_and_a_time() {
        let old = json!({"conditions": [
            {"type": "Ready", "status": "True", "reason": "PodsReady", "message": ""},
        ]});
        let mut status = json!({});
        set_at(&mut status, &parent(1, old), ready(true), at(T2)).unwrap();
        assert_eq!(status["conditions"][0]["lastTransitionTime"], T2);
    }

    #[test]
    fn bad_reasons_and_types_are_refused_long_messages_cut() {
        let p = parent(1, json!(null));
        let mut status = json!({});
        for reason in ["", "Pods Ready", "1stTry", "Trailing,", "Pods-Ready"] {
            let err =
                set_at(&mut status, &p, Condition::ready(true, reason, ""), at(T1)).unwrap_err();
            assert!(
                !err.retryable && err.message.contains("invalid condition reason"),
                "{err}"
            );
        }
        for type_ in ["", "Ready ", "-Ready", "Example.com/Ready", "a/", "/Ready"] {
            let err = set_at(
                &mut status,
                &p,
                Condition::new(type_, true, "Ok", ""),
                at(T1),
            )
            .unwrap_err();
            assert!(
                err.message.contains("invalid condition type"),
                "{type_:?}: {err}"
            );
        }
        for type_ in ["Ready", "example.com/Ready", "db-1.Available"] {
            set_at(
                &mut status,
                &p,
                Condition::new(type_, true, "Ok_2:x", ""),
                at(T1),
            )
            .unwrap();
        }
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        set_at(&mut status, &p, Condition::ready(true, "Ok", long), at(T1)).unwrap();
        let kept = status["conditions"][0]["message"].as_str().unwrap();
        assert_eq!(kept.len(), MAX_MESSAGE_BYTES);
    }
}
