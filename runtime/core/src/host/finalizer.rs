//! A controller's finalizer on its parents (`spec.finalize`), Metacontroller's finalize hook:
//! the runtime adds it to every parent before the guest first acts on it; while a parent is
//! being deleted the guest is called with `finalizing`, cleans up and answers `finalized`;
//! the runtime then removes the finalizer and the deletion goes on.
//!
//! The name is `wasmcontroller.kubewasm.dev/<name>` for a WasmController (its parents are all
//! in its namespace) and `clusterwasmcontroller.kubewasm.dev/<name>` for a
//! ClusterWasmController, so two controllers never share one. Both writes are JSON merge
//! patches of `metadata.finalizers` carrying the `resourceVersion` the list was read at: a
//! concurrent change to the list (another controller's finalizer) fails with 409 instead of
//! being overwritten, and the next reconcile, fed by the watch, tries again. They are sent as
//! the controller's ServiceAccount, which therefore needs `patch` on its parents.
//!
//! When the controller goes away (its WasmController deleted, or `spec.finalize` turned off)
//! the runtime removes its finalizer from every parent that carries it, without calling the
//! guest: there is no controller left to clean up, and a parent must not stay undeletable for
//! a controller that no longer exists.

use kube::Client;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::controller::Kind;

/// Longest name part of a qualified name (`prefix/name`), which finalizers are.
const MAX_NAME_PART: usize = 63;

/// One controller's finalizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finalizer(String);

/// What the finalizer means for one parent as observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Alive and not yet carrying the finalizer: add it before anything else.
    Missing,
    /// Alive and carrying it.
    Held,
    /// Being deleted and carrying it: the guest cleans up.
    Finalizing,
    /// Being deleted without it (never added, or already removed): nothing to hold.
    Released,
}

impl Finalizer {
    /// The finalizer of WasmController `name` (namespaced) or ClusterWasmController `name`.
    /// Fails when the name is too long to make one.
    pub fn for_controller(namespaced: bool, name: &str) -> Result<Finalizer, String> {
        if name.len() > MAX_NAME_PART {
            return Err(format!(
                "spec.finalize: a finalizer's name may be at most {MAX_NAME_PART} characters and it is this controller's name ({} characters); rename the controller",
                name.len()
            ));
        }
        let prefix = if namespaced {
            "wasmcontroller.kubewasm.dev"
        } else {
            "clusterwasmcontroller.kubewasm.dev"
        };
        Ok(Finalizer(format!("{prefix}/{name}")))
    }

    /// The finalizer as it appears in `metadata.finalizers`.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// Where `parent` stands.
    pub fn phase(&self, parent: &Value) -> Phase {
        let held = finalizers(parent).any(|f| f == self.0);
        let deleting = parent.pointer("/metadata/deletionTimestamp").is_some();
        match (deleting, held) {
            (false, false) => Phase::Missing,
            (false, true) => Phase::Held,
            (true, true) => Phase::Finalizing,
            (true, false) => Phase::Released,
        }
    }

    /// Whether `parent` carries this finalizer.
    pub fn is_on(&self, parent: &Value) -> bool {
        finalizers(parent).any(|f| f == self.0)
    }

    /// Adds the finalizer to `parent` (as observed), keeping the others.
    pub async fn add(
        &self,
        client: Client,
        kind: &Kind,
        parent: &Value,
    ) -> Result<(), kube::Error> {
        let mut list: Vec<&str> = finalizers(parent).collect();
        list.push(&self.0);
        patch(client, kind, parent, &list).await
    }

    /// Removes the finalizer from `parent` (as observed), keeping the others.
    pub async fn remove(
        &self,
        client: Client,
        kind: &Kind,
        parent: &Value,
    ) -> Result<(), kube::Error> {
        let list: Vec<&str> = finalizers(parent).filter(|f| *f != self.0).collect();
        patch(client, kind, parent, &list).await
    }
}

fn finalizers(parent: &Value) -> impl Iterator<Item = &str> {
    parent
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// Sets `metadata.finalizers` to `list`, on the condition that the object is still at the
/// observed `resourceVersion`.
async fn patch(
    client: Client,
    kind: &Kind,
    parent: &Value,
    list: &[&str],
) -> Result<(), kube::Error> {
    let namespace = parent
        .pointer("/metadata/namespace")
        .and_then(Value::as_str);
    let name = parent
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let version = parent.pointer("/metadata/resourceVersion").cloned();
    let body = json!({"metadata": {"finalizers": list, "resourceVersion": version}});
    kind.api(client, namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_phases() {
        let f = Finalizer::for_controller(true, "hello").unwrap();
        assert_eq!(f.name(), "wasmcontroller.kubewasm.dev/hello");
        let c = Finalizer::for_controller(false, "hello").unwrap();
        assert_eq!(c.name(), "clusterwasmcontroller.kubewasm.dev/hello");
        let long = "x".repeat(64);
        let err = Finalizer::for_controller(true, &long).unwrap_err();
        assert!(err.contains("at most 63 characters"), "{err}");

        let alive = json!({"metadata": {"name": "a"}});
        assert_eq!(f.phase(&alive), Phase::Missing);
        let held = json!({"metadata": {"name": "a", "finalizers": ["other", f.name()]}});
        assert_eq!(f.phase(&held), Phase::Held);
        assert_eq!(c.phase(&held), Phase::Missing);
        let deleting = json!({"metadata": {"name": "a", "finalizers": [f.name()],
            "deletionTimestamp": "2026-11-23T12:00:00Z"}});
        assert_eq!(f.phase(&deleting), Phase::Finalizing);
        assert_eq!(c.phase(&deleting), Phase::Released);
    }
}
