//! The small state a controller saves per object (`setState`, handed back as `request.state`),
//! kept in its WasmController's status (`status.guestState`, one entry per object) so that it
//! outlives the runtime, is the same for every replica, and is visible to the controller's
//! owner (`kubectl get wasmcontroller -o yaml`).
//!
//! Why the status and not an object the guest writes: a guest's identity may not be allowed
//! to write anything (the restarter of the tutorials may only read ConfigMaps and delete
//! Pods), and the runtime already writes the status, with its own identity, through the
//! status subresource only. Bounds: [`MAX_GUEST_STATE_BYTES`] per object and
//! [`MAX_GUEST_STATE_OBJECTS`] objects per controller (about 200 KiB at most, far below what
//! etcd takes per object). An entry is forgotten once its object is gone.
//!
//! A write is a JSON merge patch of one key (`{"status":{"guestState":{key: value}}}`,
//! `null` deletes it), sent before the guest's next action runs: an action after `setState`
//! runs only once the state is stored. The memory copy changes only after the API server
//! took the write.

use std::collections::BTreeMap;
use std::sync::Mutex;

use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::api::{ClusterWasmController, WasmController};
use crate::sandbox::{MAX_GUEST_STATE_BYTES, MAX_GUEST_STATE_OBJECTS};
use crate::sync::Locks as _;

/// Where a controller's state is stored: its own object's status.
#[derive(Clone)]
pub enum StateOwner {
    /// A WasmController (namespace, name).
    Namespaced(Api<WasmController>, String),
    /// A ClusterWasmController (name).
    Cluster(Api<ClusterWasmController>, String),
    /// Nowhere (offline runs, tests): kept in memory only.
    Memory,
}

impl StateOwner {
    /// The status of `namespace/name` (a WasmController) or `name` (a ClusterWasmController),
    /// written with `client` (the runtime's own identity).
    pub fn of(client: Client, namespace: Option<&str>, name: &str) -> StateOwner {
        match namespace {
            Some(ns) => StateOwner::Namespaced(Api::namespaced(client, ns), name.to_owned()),
            None => StateOwner::Cluster(Api::all(client), name.to_owned()),
        }
    }
}

/// Why a state could not be saved.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The controller holds state for as many objects as it may.
    #[error(
        "cannot save state for {key}: this controller already keeps state for {MAX_GUEST_STATE_OBJECTS} objects, the most it may; state is forgotten when its object is gone, or the guest can forget it with setState(null)"
    )]
    Full {
        /// The object's key.
        key: String,
    },
    /// Larger than an entry may be (checked where the response enters, so only reached by a
    /// caller that skipped that).
    #[error("cannot save state for {key}: {len} bytes, more than {MAX_GUEST_STATE_BYTES}")]
    TooLarge {
        /// The object's key.
        key: String,
        /// Its length.
        len: usize,
    },
    /// The API server refused or failed the status write.
    #[error("saving state for {key} in the controller's status failed: {source}")]
    Api {
        /// The object's key.
        key: String,
        /// What the API server said.
        #[source]
        source: kube::Error,
    },
}

/// One controller's saved states, by object key (`namespace/name`, or `name` when
/// cluster-scoped, as [`crate::controller::ObjectKey`] displays).
pub struct GuestState {
    owner: StateOwner,
    entries: Mutex<BTreeMap<String, String>>,
}

impl GuestState {
    /// The states found in the controller's status when it was first seen. Entries past the
    /// bounds (a status edited by hand) are dropped from memory, and so never handed to a
    /// guest.
    pub fn new(owner: StateOwner, found: BTreeMap<String, String>) -> GuestState {
        let entries = found
            .into_iter()
            .filter(|(_, v)| v.len() <= MAX_GUEST_STATE_BYTES)
            .take(MAX_GUEST_STATE_OBJECTS)
            .collect();
        GuestState {
            owner,
            entries: Mutex::new(entries),
        }
    }

    /// Kept in memory only (offline runs and tests).
    pub fn in_memory() -> GuestState {
        GuestState::new(StateOwner::Memory, BTreeMap::new())
    }

    /// The state saved for `key`.
    pub fn get(&self, key: &str) -> Option<String> {
        self.lock().get(key).cloned()
    }

    /// The keys of every object with state.
    pub fn keys(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// How many objects have state.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no object has state.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Whether saving `value` for `key` changes anything.
    pub fn changes(&self, key: &str, value: Option<&str>) -> bool {
        self.lock().get(key).map(String::as_str) != value
    }

    /// Saves (`Some`) or forgets (`None`) the state of `key`: written to the status first,
    /// then kept in memory. A value equal to the saved one writes nothing.
    pub async fn set(&self, key: &str, value: Option<&str>) -> Result<(), StateError> {
        if !self.changes(key, value) {
            return Ok(());
        }
        if let Some(v) = value {
            if v.len() > MAX_GUEST_STATE_BYTES {
                return Err(StateError::TooLarge {
                    key: key.to_owned(),
                    len: v.len(),
                });
            }
            let entries = self.lock();
            if !entries.contains_key(key) && entries.len() >= MAX_GUEST_STATE_OBJECTS {
                return Err(StateError::Full {
                    key: key.to_owned(),
                });
            }
        }
        let patch = Patch::Merge(json!({"status": {"guestState": {key: value}}}));
        let params = PatchParams::default();
        let written = match &self.owner {
            StateOwner::Namespaced(api, name) => {
                api.patch_status(name, &params, &patch).await.map(drop)
            }
            StateOwner::Cluster(api, name) => {
                api.patch_status(name, &params, &patch).await.map(drop)
            }
            StateOwner::Memory => Ok(()),
        };
        written.map_err(|source| StateError::Api {
            key: key.to_owned(),
            source,
        })?;
        let mut entries = self.lock();
        match value {
            Some(v) => entries.insert(key.to_owned(), v.to_owned()),
            None => entries.remove(key),
        };
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.entries.locked()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn saves_forgets_and_refuses_past_the_bounds() {
        let state = GuestState::in_memory();
        state.set("ns/a", Some("one")).await.unwrap();
        assert_eq!(state.get("ns/a").as_deref(), Some("one"));
        assert!(!state.changes("ns/a", Some("one")));
        state.set("ns/a", None).await.unwrap();
        assert_eq!(state.get("ns/a"), None);

        let big = "x".repeat(MAX_GUEST_STATE_BYTES + 1);
        let err = state.set("ns/a", Some(&big)).await.unwrap_err();
        assert!(matches!(err, StateError::TooLarge { .. }), "{err}");

        for i in 0..MAX_GUEST_STATE_OBJECTS {
            state.set(&format!("ns/{i}"), Some("v")).await.unwrap();
        }
        let err = state.set("ns/one-more", Some("v")).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("already keeps state for 256 objects"),
            "{err}"
        );
        // Replacing an existing entry, or forgetting one, still works when full.
        state.set("ns/0", Some("w")).await.unwrap();
        state.set("ns/1", None).await.unwrap();
        state.set("ns/one-more", Some("v")).await.unwrap();
        assert_eq!(state.len(), MAX_GUEST_STATE_OBJECTS);
    }

    #[test]
    fn entries_past_the_bounds_in_a_status_are_not_loaded() {
        let found = BTreeMap::from([
            ("ns/ok".to_owned(), "v".to_owned()),
            ("ns/big".to_owned(), "x".repeat(MAX_GUEST_STATE_BYTES + 1)),
        ]);
        let state = GuestState::new(StateOwner::Memory, found);
        assert_eq!(state.get("ns/ok").as_deref(), Some("v"));
        assert_eq!(state.get("ns/big"), None);
    }
}
