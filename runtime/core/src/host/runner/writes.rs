//! The runner's own writes, beside the guest's actions: its finalizer on a parent (added,
//! removed when the clean-up is done, released from every parent when the controller goes)
//! and a gone object's saved state. Each passes the controller's [`WriteGate`]
//! (budget, then fence), as the actions do.
//!
//! [`WriteGate`]: crate::controller::WriteGate

use std::time::Duration;

use serde_json::Value;

use crate::api::{Problem, Reason};
use crate::controller::ObjectKey;

use super::super::actions::api_message;
use super::Runner;

impl Runner {
    /// Adds (`add`) or removes this controller's finalizer on a parent, as observed. After an
    /// add, the guest is called once the watch brings the parent back with it; a conflict (the
    /// parent changed meanwhile) or a parent gone waits for the watch's news.
    pub(super) async fn write_finalizer(
        &self,
        parent: &Value,
        add: bool,
    ) -> Result<Option<Duration>, Problem> {
        let Some(f) = &self.setup.finalizer else {
            return Ok(None);
        };
        let (client, kind) = (self.setup.client.clone(), self.setup.parent.kind());
        let what = if add { "add" } else { "remove" };
        if !self.setup.writes.admit().await {
            return Ok(None);
        }
        let name = parent
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let written = if add {
            f.add(client, kind, parent).await
        } else {
            f.remove(client, kind, parent).await
        };
        match written {
            Ok(()) => {
                tracing::info!("{what} finalizer on {name}: done");
                Ok(None)
            }
            // Changed or gone since observed: the watch brings the news, and a reconcile.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(None),
            Err(e) => Err(Problem::new(
                Reason::ActionFailed,
                format!(
                    "could not {what} this controller's finalizer on {name}: {} (the ServiceAccount needs `patch` on {})",
                    api_message(&e),
                    kind.resource.plural
                ),
            )),
        }
    }

    /// Forgets the saved state of an object that is gone.
    pub(super) async fn forget_state(&self, key: &str) -> Result<(), Problem> {
        if !self.setup.state.changes(key, None) {
            return Ok(());
        }
        if !self.setup.writes.admit().await {
            return Ok(());
        }
        // The object is gone: nothing of it follows, so the forget goes with other saves.
        self.setup
            .state
            .set_behind(key, None, self.setup.writes.fence())
            .map_err(|e| Problem::new(e.reason(), e.to_string()))
    }

    /// Removes this controller's finalizer from every parent that carries it, without
    /// calling the guest: the controller is going away (deleted, or `spec.finalize` turned
    /// off while the runtime was not running it). Failures are logged.
    pub async fn release_finalizers(&self) {
        let Some(f) = &self.setup.finalizer else {
            return;
        };
        for parent in self.setup.parent.store().state() {
            let key = ObjectKey::of(&parent);
            if !self.in_scope(&key) {
                continue;
            }
            let json = parent.json();
            if !f.is_on(&json) {
                continue;
            }
            if !self.setup.writes.admit().await {
                return;
            }
            match f
                .remove(self.setup.client.clone(), self.setup.parent.kind(), &json)
                .await
            {
                Ok(()) => {
                    tracing::info!(controller = self.setup.id.as_str(), object = %key, "released finalizer {}", f.name())
                }
                Err(e) => {
                    tracing::warn!(controller = self.setup.id.as_str(), object = %key, "could not release finalizer {}: {}; remove it with kubectl patch (metadata.finalizers)", f.name(), api_message(&e))
                }
            }
        }
    }
}
