//! The request of one reconcile as the sandbox hands it to the guest, and the check of the
//! guest's response.
//!
//! The domain model (the request, object references, the response and its actions) is the
//! guest SDK's, defined once; this module converts the request to WIT and checks the
//! response document where it enters, so that nothing past the sandbox handles malformed or
//! oversized output.

use std::fmt;
use std::time::Duration;

use kubewasm_guest_sdk::selector::Selector;
pub use kubewasm_guest_sdk::{
    Action, Error, EventType, ObjectRef, Reads, Request, Response, WireRequest,
};
use serde::de::{DeserializeSeed, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::bindings::wit;
use super::limits::{Limits, MAX_GUEST_STATE_BYTES};
use super::text::{MAX_EVENT_REASON_BYTES, MAX_GUEST_MESSAGE_BYTES, guest_text, prefix};

/// What a call takes: a [`Request`] (serialized for the call) or a [`WireRequest`] already
/// serialized (as the runtime keeps each cached object's text).
pub trait IntoWire {
    /// The request as the guest is called with it.
    fn into_wire(self) -> WireRequest;
}

impl IntoWire for WireRequest {
    fn into_wire(self) -> WireRequest {
        self
    }
}

impl IntoWire for &Request {
    fn into_wire(self) -> WireRequest {
        request_to_wire(self)
    }
}

impl IntoWire for Request {
    fn into_wire(self) -> WireRequest {
        request_to_wire(&self)
    }
}

/// The request as the guest receives it: each JSON document serialized once, as text. What
/// the WIT export is called with, and what the reconcile bench's native and webhook columns
/// hand to the SDK's parsing.
pub fn request_to_wire(request: &Request) -> WireRequest {
    WireRequest {
        controller: request.controller.clone(),
        target: request.target.clone(),
        parent: request.parent.as_ref().map(Value::to_string),
        children: request.children.iter().map(Value::to_string).collect(),
        previous: request.previous.as_ref().map(Value::to_string),
        state: request.state.clone(),
        finalizing: request.finalizing,
    }
}

/// The request as the WIT export takes it: its documents moved, not copied or serialized again.
pub(crate) fn wire_to_wit(wire: WireRequest) -> wit::Request {
    let target = wire.target;
    wit::Request {
        controller: wire.controller,
        target: wit::ObjectRef {
            api_version: target.api_version,
            kind: target.kind,
            namespace: target.namespace,
            name: target.name,
        },
        parent: wire.parent,
        children: wire.children,
        previous: wire.previous,
        state: wire.state,
        finalizing: wire.finalizing,
    }
}

/// Checks and decodes the response document a guest handed to `respond`: at most
/// [`Limits::response_bytes`] long (checked before parsing), at most [`Limits::actions`]
/// actions (parsing stops at the first one too many), each action well-formed. Event text is
/// cut to the API server's bounds rather than refused. `Err` says what was wrong, and for an
/// action which one.
pub fn decode_response(json: &str, limits: &Limits) -> Result<Response, String> {
    if json.len() > limits.response_bytes {
        return Err(format!(
            "response is {} bytes, more than the limit of {} bytes",
            json.len(),
            limits.response_bytes
        ));
    }
    let mut de = serde_json::Deserializer::from_str(json);
    let actions = Document {
        max_actions: limits.actions,
    }
    .deserialize(&mut de)
    .and_then(|actions| de.end().map(|()| actions))
    .map_err(|e| format!("not a response document ({{\"actions\": [...]}}): {e}"))?;
    let actions = actions
        .into_iter()
        .enumerate()
        .map(|(i, a)| check_action(a).map_err(|e| format!("action {}: {e}", i + 1)))
        .collect::<Result<_, _>>()?;
    Ok(Response { actions })
}

/// `{"actions": [...]}`, read with a bound on the number of actions.
struct Document {
    max_actions: usize,
}

impl<'de> DeserializeSeed<'de> for Document {
    type Value = Vec<Action>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Vec<Action>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Document {
    type Value = Vec<Action>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object with the field `actions`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<Action>, A::Error> {
        let mut actions = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key != "actions" {
                let _ = map.next_value::<IgnoredAny>()?;
                return Err(A::Error::unknown_field(&key, &["actions"]));
            }
            if actions.is_some() {
                return Err(A::Error::duplicate_field("actions"));
            }
            actions = Some(map.next_value_seed(Actions {
                max: self.max_actions,
            })?);
        }
        actions.ok_or_else(|| A::Error::missing_field("actions"))
    }
}

/// The `actions` list, refused at the first action past `max`.
struct Actions {
    max: usize,
}

impl<'de> DeserializeSeed<'de> for Actions {
    type Value = Vec<Action>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Vec<Action>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Actions {
    type Value = Vec<Action>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of actions")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Action>, A::Error> {
        let mut actions = Vec::new();
        while let Some(action) = seq.next_element::<Action>()? {
            if actions.len() == self.max {
                return Err(A::Error::custom(format!(
                    "more than the limit of {} actions in one response",
                    self.max
                )));
            }
            actions.push(action);
        }
        Ok(actions)
    }
}

fn check_action(action: Action) -> Result<Action, String> {
    Ok(match action {
        Action::Apply(object) => {
            ObjectRef::of(&object).map_err(|e| format!("apply: {e}"))?;
            Action::Apply(object)
        }
        Action::SetStatus(status) => {
            if !status.is_object() {
                return Err(format!(
                    "setStatus: status must be a JSON object, got `{}`",
                    guest_text(&status.to_string(), 60)
                ));
            }
            Action::SetStatus(status)
        }
        Action::DeleteAllOf {
            api_version,
            kind,
            namespace,
            label_selector,
            created_before,
        } => {
            check_delete_selector(&label_selector).map_err(|e| format!("deleteAllOf: {e}"))?;
            if let Some(time) = &created_before {
                parse_time(time).map_err(|e| format!("deleteAllOf: createdBefore: {e}"))?;
            }
            Action::DeleteAllOf {
                api_version,
                kind,
                namespace,
                label_selector,
                created_before,
            }
        }
        Action::SetState(Some(state)) if state.len() > MAX_GUEST_STATE_BYTES => {
            return Err(format!(
                "setState: the state is {} bytes, more than the limit of {MAX_GUEST_STATE_BYTES} bytes per object; keep a digest or a version, not the data",
                state.len()
            ));
        }
        Action::Event {
            event_type,
            reason,
            message,
        } => Action::Event {
            event_type,
            reason: guest_text(
                prefix(&reason, MAX_EVENT_REASON_BYTES),
                MAX_EVENT_REASON_BYTES,
            )
            .into_owned(),
            message: guest_text(&message, MAX_GUEST_MESSAGE_BYTES).into_owned(),
        },
        other @ (Action::Delete(_)
        | Action::RequeueAfter(_)
        | Action::SetState(_)
        | Action::Finalized(_)) => other,
    })
}

/// A time as the API server writes it (RFC 3339, e.g. `2026-11-23T12:00:00Z`); the message
/// quotes at most 64 bytes of what it got.
pub fn parse_time(time: &str) -> Result<jiff::Timestamp, String> {
    time.parse().map_err(|e| {
        format!(
            "`{}` is not an RFC 3339 time such as 2026-11-23T12:00:00Z: {e}",
            guest_text(time, 64)
        )
    })
}

/// The shortest requeue delay a response asks for, if any.
pub fn requeue_delay(response: &Response) -> Option<Duration> {
    response
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::RequeueAfter(d) => Some(*d),
            _ => None,
        })
        .min()
}

/// A delete-all-of selector must parse and must name a label the objects have: one built
/// only from `!=`, `notin` and `!key` (or nothing) matches nearly every object of the kind.
fn check_delete_selector(selector: &str) -> Result<(), String> {
    let parsed = Selector::parse(selector).map_err(|e| e.to_string())?;
    if !parsed.narrows() {
        return Err(format!(
            "label selector {:?} would match every object without those labels, nearly all of them; name at least one label the objects must have, e.g. app=web",
            guest_text(selector, 128)
        ));
    }
    Ok(())
}

/// The reads a guest may make during a call, shared with the call's host functions: the
/// SDK's [`Reads`] (one signature on both sides of the WIT boundary), thread-safe.
pub type SharedReads = std::sync::Arc<dyn Reads + Send + Sync>;

/// A cluster with nothing in it: every get finds nothing, every list is empty.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoReads;

impl Reads for NoReads {
    fn get(&self, _: &str, _: &str, _: Option<&str>, _: &str) -> Result<Option<Value>, Error> {
        Ok(None)
    }

    fn list(
        &self,
        _: &str,
        _: &str,
        _: Option<&str>,
        _: Option<&str>,
    ) -> Result<Vec<Value>, Error> {
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn decode(document: Value) -> Result<Response, String> {
        decode_response(&document.to_string(), &Limits::default())
    }

    #[test]
    fn the_sdk_encodes_what_the_host_decodes() {
        let sent = Response::new()
            .apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}))
            .delete(ObjectRef::new("v1", "Pod", Some("ns"), "p"))
            .delete_all_of("v1", "Pod", None, "app=web")
            .set_status(json!({"ready": true}))
            .event(EventType::Warning, "Stuck", "it is stuck")
            .requeue_after(Duration::from_millis(1500));
        let json = serde_json::to_string(&sent).unwrap();
        assert!(json.contains(r#"{"requeueAfterMillis":1500}"#), "{json}");
        assert!(
            json.contains(
                r#""deleteAllOf":{"apiVersion":"v1","kind":"Pod","labelSelector":"app=web"}"#
            ),
            "{json}"
        );
        assert!(
            json.contains(r#""event":{"type":"Warning","reason":"Stuck""#),
            "{json}"
        );
        assert_eq!(decode_response(&json, &Limits::default()).unwrap(), sent);
    }

    #[test]
    fn apply_must_be_a_kubernetes_object() {
        let err = decode(json!({"actions": [{"apply": 42}]})).unwrap_err();
        assert!(
            err.contains("action 1: apply: not a Kubernetes object"),
            "{err}"
        );
        let err = decode(json!({"actions": [{"apply": {"apiVersion": "v1", "kind": "Pod"}}]}))
            .unwrap_err();
        assert!(err.contains("missing `metadata.name`"), "{err}");
    }

    #[test]
    fn response_size_is_checked_before_parsing() {
        let big = format!(
            "{{\"actions\": [{{\"setStatus\": {{\"x\": \"{}\"}}}}]}}",
            "x".repeat(100)
        );
        let limits = Limits::default().with_response_bytes(10);
        let err = decode_response(&big, &limits).unwrap_err();
        assert!(err.contains("bytes, more than the limit of 10"), "{err}");
        // Not even looked at: invalid JSON past the limit is refused for its size.
        let err = decode_response(&"[".repeat(11), &limits).unwrap_err();
        assert!(err.contains("more than the limit of 10"), "{err}");
    }

    #[test]
    fn action_count_is_bounded() {
        let limits = Limits::default()
            .with_actions(3)
            .with_response_bytes(8 << 20);
        let document =
            |n: usize| json!({"actions": vec![json!({"requeueAfterMillis": 1000}); n]}).to_string();
        assert_eq!(
            decode_response(&document(3), &limits)
                .unwrap()
                .actions
                .len(),
            3
        );
        let err = decode_response(&document(200_000), &limits).unwrap_err();
        assert!(err.contains("more than the limit of 3 actions"), "{err}");
    }

    #[test]
    fn malformed_documents_say_what_is_wrong() {
        for (document, expected) in [
            ("", "EOF"),
            ("[]", "an object with the field `actions`"),
            ("{}", "missing field `actions`"),
            (r#"{"actions": [], "extra": 1}"#, "unknown field `extra`"),
            (
                r#"{"actions": [], "actions": []}"#,
                "duplicate field `actions`",
            ),
            (
                r#"{"actions": [{"explode": {}}]}"#,
                "unknown variant `explode`",
            ),
            (
                r#"{"actions": [{"requeueAfterMillis": -1}]}"#,
                "invalid value",
            ),
            (r#"{"actions": []} trailing"#, "trailing characters"),
        ] {
            let err = decode_response(document, &Limits::default()).unwrap_err();
            assert!(err.contains(expected), "{document}: {err}");
            assert!(err.starts_with("not a response document"), "{err}");
        }
    }

    fn delete_all_of(selector: &str) -> Result<Response, String> {
        decode(json!({"actions": [{"deleteAllOf": {
            "apiVersion": "v1", "kind": "ConfigMap", "labelSelector": selector
        }}]}))
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
                matches!(&response.actions[0], Action::DeleteAllOf { label_selector, .. } if label_selector == selector),
                "{response:?}"
            );
        }
        let err = delete_all_of("a in x").unwrap_err();
        assert!(err.contains("deleteAllOf: invalid label selector"), "{err}");
        let err = delete_all_of(&format!("a={}", "x".repeat(1 << 16))).unwrap_err();
        assert!(err.contains("more than the limit of 4096"), "{err}");
        assert!(err.len() < 400, "{err}");
    }

    #[test]
    fn event_reason_and_message_are_cut_not_refused() {
        let response = decode(json!({"actions": [{"event": {
            "type": "Warning", "reason": "Reason".repeat(100), "message": "é".repeat(1 << 18)
        }}]}))
        .unwrap();
        let Action::Event {
            reason, message, ..
        } = &response.actions[0]
        else {
            panic!("{response:?}")
        };
        assert_eq!(*reason, "Reason".repeat(100)[..MAX_EVENT_REASON_BYTES]);
        assert!(message.len() <= MAX_GUEST_MESSAGE_BYTES);
        assert!(message.starts_with("éé"));
        assert!(message.ends_with(" more bytes)"), "{message}");
    }

    #[test]
    fn shortest_requeue_wins() {
        let r = Response::new()
            .requeue_after(Duration::from_secs(5))
            .requeue_after(Duration::from_secs(2));
        assert_eq!(requeue_delay(&r), Some(Duration::from_secs(2)));
    }
}
