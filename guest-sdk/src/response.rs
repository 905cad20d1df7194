//! What a reconcile wants done: an ordered list of actions, built with `Response`'s methods.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ObjectRef;

/// Whether an Event reports something normal or something to look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventType {
    /// Routine progress.
    Normal,
    /// Something went wrong or needs attention.
    Warning,
}

/// One thing the guest wants done. The host checks each against the controller's declaration
/// and carries them out in order.
///
/// In the response document each action is an object with one key, the action's name in
/// camelCase (`{"apply": {...}}`, `{"deleteAllOf": {...}}`, `{"requeueAfterMillis": 1000}`);
/// see the `respond` function of the WIT contract. Unknown keys are refused, so a typo does
/// not pass silently.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Action {
    /// Create or update an object with server-side apply. A partial object (only the fields
    /// this controller manages) touches only those fields.
    Apply(Value),
    /// Delete one object.
    Delete(ObjectRef),
    /// Delete every object of a kind whose labels match a selector.
    #[serde(rename_all = "camelCase")]
    DeleteAllOf {
        /// `apiVersion` of the objects to delete.
        api_version: String,
        /// `kind` of the objects to delete.
        kind: String,
        /// Namespace to delete in; `None` means the target's namespace.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        namespace: Option<String>,
        /// A label selector such as `app=web,tier!=db` (see [`crate::selector`]).
        label_selector: String,
        /// Only objects whose `creationTimestamp` is strictly earlier than this time (RFC 3339,
        /// e.g. `2026-11-23T12:00:00Z`): those created since, e.g. the replacements of the
        /// ones deleted, are left alone.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        created_before: Option<String>,
    },
    /// Replace the target's `status` with this JSON object.
    SetStatus(Value),
    /// Record an Event on the target.
    Event {
        /// Normal or Warning.
        #[serde(rename = "type")]
        event_type: EventType,
        /// A short CamelCase reason, e.g. `PodsRestarted`.
        reason: String,
        /// A sentence a person can read.
        message: String,
    },
    /// Reconcile the target again after this delay (millisecond precision).
    #[serde(rename = "requeueAfterMillis", with = "millis")]
    RequeueAfter(Duration),
    /// Save this controller's state for the target (`None`: forget it); handed back in
    /// [`crate::Request::state`]. The runtime writes it before it runs the next action.
    SetState(Option<String>),
    /// While [`crate::Request::finalizing`]: clean-up is done, remove the finalizer once the
    /// response's other actions succeeded (`false` is the same as leaving it out).
    Finalized(bool),
}

/// The most bytes of the state a controller saves for one object ([`Action::SetState`]); a
/// longer state fails the reconcile. Keep a digest or a version, not the data.
pub const MAX_STATE_BYTES: usize = 512;

/// A delay as whole milliseconds (saturating at `u64::MAX`).
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(delay: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

impl Action {
    /// Delete every `api_version`/`kind` object in `namespace` (`None`: the target's) whose
    /// labels match `label_selector`.
    pub fn delete_all_of(
        api_version: impl Into<String>,
        kind: impl Into<String>,
        namespace: Option<&str>,
        label_selector: impl Into<String>,
    ) -> Self {
        Action::DeleteAllOf {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(str::to_string),
            label_selector: label_selector.into(),
            created_before: None,
        }
    }
}

/// The output of one reconcile: actions carried out in order. An empty response means
/// "nothing to do".
///
/// ```
/// use kubewasm_guest_sdk::{EventType, Response};
/// use serde_json::json;
///
/// let response = Response::new()
///     .apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}))
///     .set_status(json!({"ready": true}))
///     .event(EventType::Normal, "Configured", "wrote ConfigMap c");
/// assert_eq!(response.actions.len(), 3);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Response {
    /// The actions, carried out in order.
    pub actions: Vec<Action>,
}

impl Response {
    /// A response with no actions.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append any action.
    #[must_use]
    pub fn push(mut self, action: Action) -> Self {
        self.actions.push(action);
        self
    }

    /// Apply an object (server-side apply); takes JSON or an [`crate::object::ObjectBuilder`].
    #[must_use]
    pub fn apply(self, object: impl Into<Value>) -> Self {
        self.push(Action::Apply(object.into()))
    }

    /// Delete one object.
    #[must_use]
    pub fn delete(self, object: ObjectRef) -> Self {
        self.push(Action::Delete(object))
    }

    /// Delete every object of a kind matching a label selector (see [`Action::delete_all_of`]).
    #[must_use]
    pub fn delete_all_of(
        self,
        api_version: impl Into<String>,
        kind: impl Into<String>,
        namespace: Option<&str>,
        label_selector: impl Into<String>,
    ) -> Self {
        self.push(Action::delete_all_of(
            api_version,
            kind,
            namespace,
            label_selector,
        ))
    }

    /// Delete every object of a kind matching a label selector and created strictly before
    /// `created_before` (RFC 3339).
    #[must_use]
    pub fn delete_all_created_before(
        self,
        api_version: impl Into<String>,
        kind: impl Into<String>,
        namespace: Option<&str>,
        label_selector: impl Into<String>,
        created_before: impl Into<String>,
    ) -> Self {
        let mut action = Action::delete_all_of(api_version, kind, namespace, label_selector);
        if let Action::DeleteAllOf {
            created_before: before,
            ..
        } = &mut action
        {
            *before = Some(created_before.into());
        }
        self.push(action)
    }

    /// Save this controller's state for the target (see [`Action::SetState`]).
    #[must_use]
    pub fn set_state(self, state: impl Into<String>) -> Self {
        self.push(Action::SetState(Some(state.into())))
    }

    /// Forget this controller's state for the target.
    #[must_use]
    pub fn clear_state(self) -> Self {
        self.push(Action::SetState(None))
    }

    /// Clean-up is done: let the deletion of the target go on (see [`Action::Finalized`]).
    #[must_use]
    pub fn finalized(self) -> Self {
        self.push(Action::Finalized(true))
    }

    /// Replace the target's status.
    ///
    /// Set after an apply that writes an owned child (creates, replaces or updates it), the
    /// status is left to the next reconcile, which the child's watch event brings at once
    /// with the child observed: a status counting children would be stale when written. Never
    /// twice in a row for one parent; set before the child's apply, it is written as usual.
    #[must_use]
    pub fn set_status(self, status: Value) -> Self {
        self.push(Action::SetStatus(status))
    }

    /// Record an Event on the target.
    #[must_use]
    pub fn event(
        self,
        event_type: EventType,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        self.push(Action::Event {
            event_type,
            reason: reason.into(),
            message: message.into(),
        })
    }

    /// Reconcile the target again after `delay`.
    #[must_use]
    pub fn requeue_after(self, delay: Duration) -> Self {
        self.push(Action::RequeueAfter(delay))
    }

    /// The state this response saves (the last `setState`): `Some(None)` forgets it.
    pub fn state(&self) -> Option<Option<&str>> {
        self.actions.iter().rev().find_map(|action| match action {
            Action::SetState(state) => Some(state.as_deref()),
            _ => None,
        })
    }

    /// Whether this response says clean-up is done.
    pub fn is_finalized(&self) -> bool {
        self.actions
            .iter()
            .any(|action| matches!(action, Action::Finalized(true)))
    }

    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.actions.is_empty()
    }

    /// The objects this response applies, in order.
    pub fn applied(&self) -> Vec<&Value> {
        self.actions
            .iter()
            .filter_map(|action| match action {
                Action::Apply(object) => Some(object),
                _ => None,
            })
            .collect()
    }

    /// The status this response sets (the last one, if several).
    pub fn status(&self) -> Option<&Value> {
        self.actions.iter().rev().find_map(|action| match action {
            Action::SetStatus(status) => Some(status),
            _ => None,
        })
    }

    /// The events this response records, as `(type, reason, message)`.
    pub fn events(&self) -> Vec<(EventType, &str, &str)> {
        self.actions
            .iter()
            .filter_map(|action| match action {
                Action::Event {
                    event_type,
                    reason,
                    message,
                } => Some((*event_type, reason.as_str(), message.as_str())),
                _ => None,
            })
            .collect()
    }
}
