//! The parent: the guest applying the object it reconciles, and setting its status.

use std::collections::HashSet;

use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::controller::Kind;
use crate::sandbox::ObjectRef;

use super::{ActionError, Executor, Outcome};

impl Executor<'_> {
    /// The guest applies its own parent (e.g. to fill in a field): skipped when every field it
    /// sets already has that value, so that a controller that rewrites its parent does not
    /// trigger itself forever.
    pub(super) async fn apply_parent(
        &self,
        kind: &Kind,
        r: &ObjectRef,
        object: &Value,
        outcome: &mut Outcome,
    ) -> Result<(), ActionError> {
        if let Some(parent) = self.parent
            && is_subset(object, parent)
        {
            return Ok(());
        }
        self.server_side_apply(kind, r, object, outcome).await
    }

    pub(super) async fn set_status(
        &self,
        status: &Value,
        outcome: &mut Outcome,
    ) -> Result<(), ActionError> {
        let Some(parent) = self.parent else {
            return Ok(());
        };
        if parent.get("status") == Some(status) {
            self.held.forget(self.target);
            return Ok(());
        }
        if outcome.wrote_child && self.held.hold(self.target) {
            tracing::debug!(
                "status of {} left to the next reconcile, which the child just written brings",
                self.target
            );
            return Ok(());
        }
        self.held.forget(self.target);
        let api = self
            .parent_kind
            .api(self.client.clone(), self.target.namespace.as_deref());
        let body = json!({
            "apiVersion": self.target.api_version,
            "kind": self.target.kind,
            "metadata": {"name": self.target.name},
            "status": status,
        });
        // With a status subresource, status is written there (server-side apply, so fields
        // the guest stops setting go away); without one it is part of the object itself.
        self.may_write().await?;
        let result = if self.parent_kind.has_status {
            let params = PatchParams::apply(&self.field_manager).force();
            api.patch_status(&self.target.name, &params, &Patch::Apply(&body))
                .await
        } else {
            let merge = json!({"status": status});
            api.patch(
                &self.target.name,
                &PatchParams::default(),
                &Patch::Merge(&merge),
            )
            .await
        };
        let written = result.map_err(|source| ActionError::Api {
            what: format!("set status of {}", self.target),
            source,
        })?;
        // A kind without a status (a ConfigMap, a Secret) accepts the patch and drops the
        // field: said, not logged as done.
        if !self.parent_kind.has_status && !is_empty(status) && written.data.get("status").is_none()
        {
            return Err(ActionError::Invalid(format!(
                "set_status on {}: {} ({}) has no status, the API server dropped it; keep what the controller must remember with Response::set_state, or write it into an annotation or a field of the object (apply), or make the parent a kind with a status (a CRD with `subresources: {{status: {{}}}}`)",
                self.target, self.target.kind, self.target.api_version
            )));
        }
        let version = written.metadata.resource_version;
        outcome.written(format!("set status of {}", self.target), version, true);
        Ok(())
    }
}

/// The parents of one controller whose last status was held back.
///
/// A reconcile that created, replaced or updated an owned child computed its status from the
/// children as they were before: Metacontroller's HelloWorld says `pods: 0` on the reconcile
/// that creates the Pod. The child's watch event brings the parent back within milliseconds,
/// with the child observed, and that reconcile writes the status that holds (`pods: 1`).
/// So such a status is not written: one API write less per created child, and no status that
/// is stale the moment it lands. Never twice in a row for a parent: the reconcile after a held
/// status writes its status whatever it did, so a guest that writes a child on every
/// reconcile still has every other status written. If the next reconcile fails, its failure
/// is what the controller's status shows; the guest's status comes with the next success.
#[derive(Debug, Default)]
pub struct HeldStatuses(std::sync::Mutex<HashSet<String>>);

impl HeldStatuses {
    /// Holds back the status of `target`, unless its last one was held: `false` then (write it).
    fn hold(&self, target: &ObjectRef) -> bool {
        let key = target.to_string();
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if held.remove(&key) {
            return false;
        }
        held.insert(key);
        true
    }

    /// `target`'s status was written, or it needs none, or the parent is gone.
    pub(super) fn forget(&self, target: &ObjectRef) {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !held.is_empty() {
            held.remove(&target.to_string());
        }
    }
}

/// A status that says nothing (`null`, `{}`): a kind without a status keeps it as well.
fn is_empty(status: &Value) -> bool {
    match status {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}

/// Whether every field set in `desired` has the same value in `observed`: the API server adds
/// defaults, so equality would never hold. Lists are compared element by element from the
/// start, and the observed one may be longer (the server may append, e.g. admission-added
/// tolerations).
pub(super) fn is_subset(desired: &Value, observed: &Value) -> bool {
    match (desired, observed) {
        (Value::Object(d), Value::Object(o)) => d
            .iter()
            .all(|(k, dv)| o.get(k).is_some_and(|ov| is_subset(dv, ov)) || dv.is_null()),
        (Value::Array(d), Value::Array(o)) => {
            d.len() <= o.len() && d.iter().zip(o).all(|(a, b)| is_subset(a, b))
        }
        (d, o) => d == o,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_ignores_server_defaults_but_sees_changed_values() {
        let desired =
            json!({"spec": {"containers": [{"name": "hello", "command": ["echo", "Hello, A!"]}]}});
        let observed = json!({"spec": {"containers": [{"name": "hello", "command": ["echo", "Hello, A!"],
            "imagePullPolicy": "Always"}], "dnsPolicy": "ClusterFirst"}, "status": {}});
        assert!(is_subset(&desired, &observed));
        let changed =
            json!({"spec": {"containers": [{"name": "hello", "command": ["echo", "Hello, B!"]}]}});
        assert!(!is_subset(&changed, &observed));
        let appended = json!({"spec": {"containers": [{"name": "hello", "command": ["echo", "Hello, A!"]},
            {"name": "sidecar"}]}});
        assert!(is_subset(&desired, &appended), "a list the server extended");
        assert!(
            !is_subset(&appended, &observed),
            "a list shorter than desired"
        );
    }
}
