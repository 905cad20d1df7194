//! The state a controller saves per object (`setState`, handed back as `request.state`), kept
//! in objects of the runtime's own kind `WasmControllerState` (see `api/state.rs` for why
//! there), so that it outlives the runtime, is the same for every replica, and is visible to
//! the controller's owner (`kubectl get wasmcontrollerstates -o yaml`).
//!
//! A controller's states are spread over [`STATE_SHARDS`] objects by a hash of the object key,
//! each created when its first state is saved. Bounds: [`MAX_GUEST_STATE_BYTES`] per object,
//! the operator's quota per controller in bytes (`--max-state-bytes-per-controller`, keys
//! included), and [`MAX_SHARD_BYTES`] per shard object (far below what etcd takes).
//!
//! **Writes are batched and still come first.** A save is a JSON merge patch of the shard's
//! `spec.entries` (`null` deletes a key), sent before the guest's next action runs: an action
//! after `setState` runs only once the state is stored. Saves of one shard that arrive while
//! a write of it is in flight wait for it and then go together in the next write (group
//! commit): a controller reconciling many objects at once makes one write per shard per round
//! trip, not one per object. The memory copy changes only after the API server took the
//! write. An entry is forgotten once its object is gone.
//!
//! **Moved from the status.** Runtimes before this kept the states in the controller's
//! `status.guestState`; the first load of a controller moves any found there into its shards
//! and removes the field.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use sha2::{Digest as _, Sha256};
use tokio::sync::oneshot;

use crate::api::{
    ClusterWasmController, STATE_OF_LABEL, WasmController, WasmControllerState,
    WasmControllerStateSpec, state_prefix,
};
use crate::sandbox::MAX_GUEST_STATE_BYTES;
use crate::sync::Locks as _;

/// Shard objects per controller: few enough that saves left behind gather in each during
/// [`LINGER`], enough that 10,000 objects' states fit (16 MiB at most).
pub const STATE_SHARDS: u32 = 16;

/// How long a save left behind ([`GuestState::set_behind`]) waits for others of its shard,
/// to be written together.
pub const LINGER: std::time::Duration = std::time::Duration::from_millis(100);

/// The most bytes of entries (keys and values) one shard object holds.
pub const MAX_SHARD_BYTES: usize = 1 << 20;

/// Shard objects read a page when a controller's states are loaded.
const LOAD_PAGE: u32 = 8;

/// What one entry costs against the bounds: its key and value, and the JSON around them.
fn cost(key: &str, value: &str) -> usize {
    key.len() + value.len() + 6
}

/// The shard of an object key.
pub fn shard_of_key(key: &str) -> usize {
    let hash = Sha256::digest(key.as_bytes());
    (u32::from_be_bytes([hash[0], hash[1], hash[2], hash[3]]) % STATE_SHARDS) as usize
}

/// Where a controller's states are kept.
#[derive(Clone)]
pub enum StateOwner {
    /// In WasmControllerState objects.
    Store(Box<Store>),
    /// Nowhere (offline runs, tests): kept in memory only.
    Memory,
}

/// The shards of one controller, and where its states were kept before.
#[derive(Clone)]
pub struct Store {
    api: Api<WasmControllerState>,
    /// `WasmController/<name>` or `ClusterWasmController/<name>`.
    controller: String,
    /// Name prefix and label value ([`state_prefix`]).
    prefix: String,
    /// The controller, as the shards' owner (`None` until its uid is known: no owner then).
    owner: Option<OwnerReference>,
    legacy: Legacy,
}

/// The controller's status, where runtimes before this one kept the states.
#[derive(Clone)]
enum Legacy {
    Namespaced(Api<WasmController>, String),
    Cluster(Api<ClusterWasmController>, String),
}

impl StateOwner {
    /// The shards of the controller `namespace/name` (a WasmController) or `name` (a
    /// ClusterWasmController, whose shards live in `cluster_namespace`, the runtime's own),
    /// uid `uid`, written with `client` (the runtime's own identity).
    pub fn of(
        client: Client,
        namespace: Option<&str>,
        name: &str,
        uid: Option<&str>,
        cluster_namespace: &str,
    ) -> StateOwner {
        let (kind, legacy, home) = match namespace {
            Some(ns) => (
                "WasmController",
                Legacy::Namespaced(Api::namespaced(client.clone(), ns), name.to_owned()),
                ns,
            ),
            None => (
                "ClusterWasmController",
                Legacy::Cluster(Api::all(client.clone()), name.to_owned()),
                cluster_namespace,
            ),
        };
        let owner = uid.map(|uid| OwnerReference {
            api_version: "kubewasm.dev/v1alpha1".into(),
            kind: kind.into(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            ..OwnerReference::default()
        });
        StateOwner::Store(Box::new(Store {
            api: Api::namespaced(client, home),
            controller: format!("{kind}/{name}"),
            prefix: state_prefix(kind, name),
            owner,
            legacy,
        }))
    }
}

/// Why a state could not be saved or loaded.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StateError {
    /// Saving it would take the controller past its quota.
    #[error(
        "cannot save state for {key}: this controller's states would take more than its quota of {quota} bytes (--max-state-bytes-per-controller; {used} used by {objects} objects); state is forgotten when its object is gone, or the guest can forget it with setState(null)"
    )]
    Full {
        /// The object's key.
        key: String,
        /// The quota.
        quota: usize,
        /// Bytes used now.
        used: usize,
        /// Objects with state now.
        objects: usize,
    },
    /// Saving it would take its shard object past [`MAX_SHARD_BYTES`].
    #[error(
        "cannot save state for {key}: its shard of this controller's states would hold more than {MAX_SHARD_BYTES} bytes; keep smaller states"
    )]
    ShardFull {
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
    /// The API server refused or failed the write.
    #[error("saving state for {key} in its WasmControllerState failed: {message}")]
    Api {
        /// The object's key.
        key: String,
        /// What the API server said.
        message: String,
    },
    /// The states could not be read when the controller started.
    #[error("reading this controller's saved states failed: {0}; retrying")]
    Load(String),
}

/// What a write of a shard answered, for every save it carried.
type Written = Result<(), String>;

/// Saves of one shard waiting for the next write.
#[derive(Default)]
struct Pending {
    changes: BTreeMap<String, Option<String>>,
    waiters: Vec<oneshot::Sender<Written>>,
    /// Keys saved behind: nobody waits for them, so a failure is kept for
    /// [`GuestState::settled`].
    behind: std::collections::HashSet<String>,
    /// A flush of the shard is scheduled.
    scheduled: bool,
    /// The fence of the saves left behind: none is sent once the shard is no longer held (a
    /// replica that lost the controller's shard, or woke past its Lease, writes nothing; one
    /// giving the shard up writes them while its controllers stop).
    fence: Option<crate::controller::Fence>,
}

/// One shard: the saves waiting, the keys being written, and the lock its writer holds.
#[derive(Default)]
struct Shard {
    pending: Mutex<Pending>,
    /// Keys of the write in flight (taken from `pending` under its lock).
    in_flight: Mutex<std::collections::HashSet<String>>,
    writing: tokio::sync::Mutex<()>,
}

/// The states as stored, and what they cost.
#[derive(Default)]
struct Entries {
    map: BTreeMap<String, String>,
    used: usize,
    per_shard: Vec<usize>,
}

impl Entries {
    fn set(&mut self, key: &str, value: Option<&str>) {
        if self.per_shard.is_empty() {
            self.per_shard = vec![0; STATE_SHARDS as usize];
        }
        let shard = shard_of_key(key);
        if let Some(old) = self.map.remove(key) {
            let c = cost(key, &old);
            self.used -= c;
            self.per_shard[shard] -= c;
        }
        if let Some(v) = value {
            let c = cost(key, v);
            self.used += c;
            self.per_shard[shard] += c;
            self.map.insert(key.to_owned(), v.to_owned());
        }
    }
}

/// One controller's saved states, by object key (`namespace/name`, or `name` when
/// cluster-scoped, as [`crate::controller::ObjectKey`] displays).
pub struct GuestState {
    owner: StateOwner,
    quota: usize,
    entries: Mutex<Entries>,
    shards: Vec<Shard>,
    /// `status.guestState` as the controller's object said when first seen: moved into the
    /// shards by the first [`GuestState::load`].
    found: Mutex<BTreeMap<String, String>>,
    loaded: tokio::sync::OnceCell<()>,
    /// Saves left behind whose write failed, by key, until [`GuestState::settled`] says so.
    failed: Mutex<std::collections::HashMap<String, String>>,
}

impl GuestState {
    /// A controller's states, kept by `owner`, at most `quota` bytes; `found` is what its
    /// status held (moved into the shards by [`GuestState::load`]).
    pub fn new(owner: StateOwner, quota: usize, found: BTreeMap<String, String>) -> GuestState {
        GuestState {
            owner,
            quota,
            entries: Mutex::default(),
            shards: (0..STATE_SHARDS).map(|_| Shard::default()).collect(),
            found: Mutex::new(found),
            loaded: tokio::sync::OnceCell::new(),
            failed: Mutex::default(),
        }
    }

    /// Kept in memory only (offline runs and tests).
    pub fn in_memory() -> GuestState {
        GuestState::new(StateOwner::Memory, usize::MAX, BTreeMap::new())
    }

    /// Reads the stored states, once (later calls return at once): before the controller's
    /// first reconcile. States found in the status are moved into the shards (those the
    /// shards already hold win), and the status field removed. Entries past the bounds (an
    /// object edited by hand) are not loaded, and so never handed to a guest.
    pub async fn load(&self) -> Result<(), StateError> {
        self.loaded
            .get_or_try_init(|| self.load_once())
            .await
            .map(drop)
    }

    async fn load_once(&self) -> Result<(), StateError> {
        let found = std::mem::take(&mut *self.found.locked());
        let StateOwner::Store(store) = &self.owner else {
            let mut entries = self.entries.locked();
            for (k, v) in found
                .iter()
                .filter(|(_, v)| v.len() <= MAX_GUEST_STATE_BYTES)
            {
                entries.set(k, Some(v));
            }
            return Ok(());
        };
        // A few objects a page, and no more pages than the shards: whoever may write the
        // namespace may label objects as these, and what the runtime reads is bounded.
        let mut params = ListParams::default()
            .labels(&format!("{STATE_OF_LABEL}={}", store.prefix))
            .limit(LOAD_PAGE);
        let mut seen = 0;
        loop {
            let page = store
                .api
                .list(&params)
                .await
                .map_err(|e| StateError::Load(crate::host::actions::api_message(&e)))?;
            seen += page.items.len();
            let mut entries = self.entries.locked();
            for object in page.items {
                let shard = object.spec.shard;
                let name = format!("{}-{shard:02}", store.prefix);
                if object.spec.controller != store.controller
                    || shard >= STATE_SHARDS
                    || object.metadata.name.as_deref() != Some(name.as_str())
                {
                    continue; // not one of this controller's shards (labelled by hand)
                }
                for (k, v) in object.spec.entries {
                    if v.len() <= MAX_GUEST_STATE_BYTES
                        && shard_of_key(&k) == shard as usize
                        && entries.used + cost(&k, &v) <= self.quota
                        && !entries.map.contains_key(&k)
                    {
                        entries.set(&k, Some(&v));
                    }
                }
            }
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() && seen < 2 * STATE_SHARDS as usize => {
                    params = params.continue_token(&token);
                }
                _ => break,
            }
        }
        if found.is_empty() {
            return Ok(());
        }
        let moving: Vec<(String, String)> = {
            let entries = self.entries.locked();
            found
                .into_iter()
                .filter(|(k, v)| v.len() <= MAX_GUEST_STATE_BYTES && !entries.map.contains_key(k))
                .collect()
        };
        let saves = moving.iter().map(|(k, v)| self.set(k, Some(v)));
        for saved in futures::future::join_all(saves).await {
            saved
                .map_err(|e| StateError::Load(format!("moving it from status.guestState: {e}")))?;
        }
        let clear = Patch::Merge(json!({"status": {"guestState": null}}));
        let params = PatchParams::default();
        let cleared = match &store.legacy {
            Legacy::Namespaced(api, name) => {
                api.patch_status(name, &params, &clear).await.map(drop)
            }
            Legacy::Cluster(api, name) => api.patch_status(name, &params, &clear).await.map(drop),
        };
        cleared.map_err(|e| {
            StateError::Load(format!(
                "removing status.guestState once moved: {}",
                crate::host::actions::api_message(&e)
            ))
        })?;
        tracing::info!(
            controller = store.controller.as_str(),
            "moved {} saved states from status.guestState into WasmControllerState objects",
            moving.len()
        );
        Ok(())
    }

    /// The state saved for `key`.
    pub fn get(&self, key: &str) -> Option<String> {
        self.entries.locked().map.get(key).cloned()
    }

    /// The keys of every object with state.
    pub fn keys(&self) -> Vec<String> {
        self.entries.locked().map.keys().cloned().collect()
    }

    /// How many objects have state.
    pub fn len(&self) -> usize {
        self.entries.locked().map.len()
    }

    /// Whether no object has state.
    pub fn is_empty(&self) -> bool {
        self.entries.locked().map.is_empty()
    }

    /// Bytes the states take against the quota.
    pub fn used_bytes(&self) -> usize {
        self.entries.locked().used
    }

    /// Whether saving `value` for `key` changes anything.
    pub fn changes(&self, key: &str, value: Option<&str>) -> bool {
        self.entries.locked().map.get(key).map(String::as_str) != value
    }

    /// Checks a save against the bounds; its shard.
    fn admit(&self, key: &str, value: Option<&str>) -> Result<usize, StateError> {
        let shard_index = shard_of_key(key);
        let Some(v) = value else {
            return Ok(shard_index);
        };
        if v.len() > MAX_GUEST_STATE_BYTES {
            return Err(StateError::TooLarge {
                key: key.to_owned(),
                len: v.len(),
            });
        }
        let entries = self.entries.locked();
        let freed = entries.map.get(key).map_or(0, |old| cost(key, old));
        let needed = cost(key, v);
        if entries.used - freed + needed > self.quota {
            return Err(StateError::Full {
                key: key.to_owned(),
                quota: self.quota,
                used: entries.used,
                objects: entries.map.len(),
            });
        }
        let in_shard = entries.per_shard.get(shard_index).copied().unwrap_or(0);
        if in_shard - freed + needed > MAX_SHARD_BYTES {
            return Err(StateError::ShardFull {
                key: key.to_owned(),
            });
        }
        Ok(shard_index)
    }

    /// Saves (`Some`) or forgets (`None`) the state of `key`: written to its shard first,
    /// together with the other saves of that shard waiting, then kept in memory. A value
    /// equal to the saved one writes nothing.
    pub async fn set(&self, key: &str, value: Option<&str>) -> Result<(), StateError> {
        if !self.changes(key, value) {
            return Ok(());
        }
        let shard_index = self.admit(key, value)?;
        let shard = &self.shards[shard_index];
        let (tx, mut rx) = oneshot::channel();
        {
            let mut pending = shard.pending.locked();
            pending
                .changes
                .insert(key.to_owned(), value.map(str::to_owned));
            pending.behind.remove(key);
            pending.waiters.push(tx);
        }
        let written = {
            let _writer = shard.writing.lock().await;
            match rx.try_recv() {
                // The writer before this one carried it.
                Ok(written) => written,
                // Taken by a writer that was cancelled (its reconcile stopped) before it
                // answered: whether it was stored is not known, so it is not taken as stored.
                Err(oneshot::error::TryRecvError::Closed) => {
                    Err("the write carrying it was cancelled".to_owned())
                }
                Err(oneshot::error::TryRecvError::Empty) => {
                    let written = self.write_pending(shard_index).await;
                    rx.try_recv().unwrap_or(written)
                }
            }
        };
        written.map_err(|message| StateError::Api {
            key: key.to_owned(),
            message,
        })
    }

    /// Saves or forgets the state of `key` without waiting for the write: it goes with the
    /// other saves of its shard within [`LINGER`]. For a save that no action of the same
    /// reconcile follows: the next reconcile of `key` waits for it first
    /// ([`GuestState::settled`]), so nothing of that object runs before it is stored, and a
    /// controller that stops writes it first ([`GuestState::flush`]; a replica handing the shard
    /// over too: its fence is left, not shut, until its controllers have stopped). A runtime
    /// killed within those milliseconds, or a replica that lost the shard, loses it, as if it
    /// had stopped before the save.
    pub fn set_behind(
        self: &Arc<Self>,
        key: &str,
        value: Option<&str>,
        fence: crate::controller::Fence,
    ) -> Result<(), StateError> {
        if !self.changes(key, value) {
            return Ok(());
        }
        let shard_index = self.admit(key, value)?;
        let schedule = {
            let mut pending = self.shards[shard_index].pending.locked();
            pending
                .changes
                .insert(key.to_owned(), value.map(str::to_owned));
            pending.behind.insert(key.to_owned());
            pending.fence = Some(fence);
            !std::mem::replace(&mut pending.scheduled, true)
        };
        if schedule {
            let this = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep(LINGER).await;
                let _writer = this.shards[shard_index].writing.lock().await;
                let _ = this.write_pending(shard_index).await;
            });
        }
        Ok(())
    }

    /// Writes every save left behind now, without waiting for [`LINGER`]: when the
    /// controller stops (its reconciles have finished), so that a runtime stopped with
    /// SIGTERM, or a controller changed or removed, loses none of them. Saves whose fence is
    /// shut are not sent (see [`GuestState::set_behind`]). Returns how many shards failed.
    pub async fn flush(&self) -> usize {
        let mut failed = 0;
        for (index, shard) in self.shards.iter().enumerate() {
            // The writer lock even with nothing waiting: a lingering writer may have taken the
            // shard's saves a moment ago, and its write must be answered before this returns
            // (the process may exit right after).
            let _writer = shard.writing.lock().await;
            if !shard.pending.locked().changes.is_empty()
                && self.write_pending(index).await.is_err()
            {
                failed += 1;
            }
        }
        failed
    }

    /// Waits until no save of `key` is waiting or being written; the failure of one left
    /// behind, if it failed (it is then not stored, and not in memory either).
    pub async fn settled(&self, key: &str) -> Result<(), StateError> {
        let index = shard_of_key(key);
        let shard = &self.shards[index];
        let busy = {
            let pending = shard.pending.locked();
            pending.changes.contains_key(key) || shard.in_flight.locked().contains(key)
        };
        if busy {
            let _writer = shard.writing.lock().await;
            if shard.pending.locked().changes.contains_key(key) {
                let _ = self.write_pending(index).await;
            }
        }
        match self.failed.locked().remove(key) {
            Some(message) => Err(StateError::Api {
                key: key.to_owned(),
                message,
            }),
            None => Ok(()),
        }
    }

    /// One write of everything shard `index` has waiting; its writer lock must be held.
    async fn write_pending(&self, index: usize) -> Written {
        let shard = &self.shards[index];
        let batch = {
            let mut pending = shard.pending.locked();
            let batch = std::mem::take(&mut *pending);
            *shard.in_flight.locked() = batch.changes.keys().cloned().collect();
            batch
        };
        if batch.changes.is_empty() {
            return Ok(());
        }
        // Held is enough: a save left behind was made while the fence was open, and a shard
        // being given up keeps its Lease until its controllers have stopped (and flushed).
        let written = if batch.fence.as_ref().is_some_and(|f| !f.is_held()) {
            Err("not sent: this runtime no longer holds the controller's shard".to_owned())
        } else {
            self.write(index, &batch.changes).await
        };
        match &written {
            Ok(()) => {
                let mut entries = self.entries.locked();
                for (k, v) in &batch.changes {
                    entries.set(k, v.as_deref());
                }
            }
            Err(message) => {
                let mut failed = self.failed.locked();
                for key in batch.behind {
                    failed.insert(key, message.clone());
                }
            }
        }
        // Only now: whoever finds the key no longer in flight finds it in memory (or failed).
        shard.in_flight.locked().clear();
        for waiter in batch.waiters {
            let _ = waiter.send(written.clone());
        }
        written
    }

    /// One write of shard `index`: a merge patch of its entries, or its creation.
    async fn write(&self, index: usize, changes: &BTreeMap<String, Option<String>>) -> Written {
        let StateOwner::Store(store) = &self.owner else {
            return Ok(());
        };
        let name = format!("{}-{index:02}", store.prefix);
        let patch = Patch::Merge(json!({"spec": {"entries": changes}}));
        let message = |e: &kube::Error| crate::host::actions::api_message(e);
        match store
            .api
            .patch(&name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(message(&e)),
        }
        let object = WasmControllerState {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(BTreeMap::from([(
                    STATE_OF_LABEL.to_owned(),
                    store.prefix.clone(),
                )])),
                owner_references: store.owner.clone().map(|o| vec![o]),
                ..ObjectMeta::default()
            },
            spec: WasmControllerStateSpec {
                controller: store.controller.clone(),
                shard: index as u32,
                entries: changes
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
                    .collect(),
            },
        };
        match store.api.create(&PostParams::default(), &object).await {
            Ok(_) => Ok(()),
            // Made meanwhile (by a replica that ran this controller a moment ago): patch it.
            Err(kube::Error::Api(s)) if s.code == 409 => store
                .api
                .patch(&name, &PatchParams::default(), &patch)
                .await
                .map(drop)
                .map_err(|e| message(&e)),
            Err(e) => Err(message(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[tokio::test]
    async fn saves_forgets_and_refuses_past_the_quota() {
        let state = GuestState::new(StateOwner::Memory, 10 * cost("ns/0", "v"), BTreeMap::new());
        state.set("ns/a", Some("one")).await.unwrap();
        assert_eq!(state.get("ns/a").as_deref(), Some("one"));
        assert!(!state.changes("ns/a", Some("one")));
        state.set("ns/a", None).await.unwrap();
        assert_eq!(state.get("ns/a"), None);
        assert_eq!(state.used_bytes(), 0);

        let big = "x".repeat(MAX_GUEST_STATE_BYTES + 1);
        let err = state.set("ns/a", Some(&big)).await.unwrap_err();
        assert!(matches!(err, StateError::TooLarge { .. }), "{err}");

        for i in 0..10 {
            state.set(&format!("ns/{i}"), Some("v")).await.unwrap();
        }
        let err = state.set("ns/x", Some("v")).await.unwrap_err();
        assert!(
            err.to_string().contains("--max-state-bytes-per-controller"),
            "{err}"
        );
        // Replacing an existing entry by one as large, or forgetting one, still works when
        // full.
        state.set("ns/0", Some("w")).await.unwrap();
        state.set("ns/1", None).await.unwrap();
        state.set("ns/x", Some("v")).await.unwrap();
        assert_eq!(state.len(), 10);
    }

    #[tokio::test]
    async fn ten_thousand_objects_fit_the_default_quota() {
        let state = GuestState::new(StateOwner::Memory, 8 << 20, BTreeMap::new());
        let value = "s".repeat(MAX_GUEST_STATE_BYTES);
        for i in 0..10_000 {
            state
                .set(
                    &format!("namespace-{:04}/pod-{i:05}", i % 1000),
                    Some(&value),
                )
                .await
                .unwrap();
        }
        assert_eq!(state.len(), 10_000);
        assert!(state.used_bytes() <= 8 << 20, "{}", state.used_bytes());
    }

    #[tokio::test]
    async fn states_found_in_the_status_are_loaded_within_the_bounds() {
        let found = BTreeMap::from([
            ("ns/ok".to_owned(), "v".to_owned()),
            ("ns/big".to_owned(), "x".repeat(MAX_GUEST_STATE_BYTES + 1)),
        ]);
        let state = GuestState::new(StateOwner::Memory, usize::MAX, found);
        assert_eq!(state.get("ns/ok"), None, "nothing before the load");
        state.load().await.unwrap();
        assert_eq!(state.get("ns/ok").as_deref(), Some("v"));
        assert_eq!(state.get("ns/big"), None);
    }

    #[test]
    fn keys_spread_over_every_shard() {
        let mut seen = vec![0usize; STATE_SHARDS as usize];
        for i in 0..1600 {
            seen[shard_of_key(&format!("ns/pod-{i}"))] += 1;
        }
        assert!(seen.iter().all(|&n| (50..=150).contains(&n)), "{seen:?}");
    }

    /// What the mock API server was sent: method, path, body.
    type Sent = std::sync::Arc<Mutex<Vec<(String, String, Value)>>>;

    /// A mock API server that answers every request with HTTP `status` (200: a
    /// WasmControllerState) after a moment, recording method, path and body.
    fn api_server_answering(status: u16) -> (Client, Sent) {
        use http::{Request, Response};
        use kube::client::Body;
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let sent = std::sync::Arc::new(Mutex::new(Vec::new()));
        tokio::spawn({
            let sent = sent.clone();
            async move {
                while let Some((request, respond)) = handle.next_request().await {
                    let method = request.method().to_string();
                    let path = request.uri().path().to_owned();
                    let bytes = request
                        .into_body()
                        .collect_bytes()
                        .await
                        .unwrap_or_default();
                    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                    sent.locked().push((method, path, body));
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    let reply = if status == 200 {
                        json!({"apiVersion": "kubewasm.dev/v1alpha1",
                            "kind": "WasmControllerState", "metadata": {"name": "s"},
                            "spec": {"controller": "c", "shard": 0}})
                    } else {
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "message": "etcd is unhappy", "reason": "InternalError", "code": status})
                    };
                    respond.send_response(
                        Response::builder()
                            .status(status)
                            .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                            .unwrap(),
                    );
                }
            }
        });
        (Client::new(service, "ns"), sent)
    }

    #[tokio::test]
    async fn saves_of_one_shard_waiting_for_a_write_go_together_in_the_next() {
        let (state, sent) = store_answering(200);
        let keys = keys_of_shard_7(50);
        let saves = keys.iter().map(|k| state.set(k, Some("seen")));
        for saved in futures::future::join_all(saves).await {
            saved.unwrap();
        }
        let sent = sent.locked().clone();
        assert!(
            sent.len() <= 3,
            "{} writes for 50 saves of one shard",
            sent.len()
        );
        let mut written = std::collections::BTreeSet::new();
        for (method, path, body) in &sent {
            assert_eq!(method, "PATCH");
            assert!(
                path.ends_with(&format!(
                    "/namespaces/ns/wasmcontrollerstates/{}-07",
                    state_prefix("WasmController", "hello")
                )),
                "{path}"
            );
            written.extend(body["spec"]["entries"].as_object().unwrap().keys().cloned());
        }
        assert_eq!(written, keys.iter().cloned().collect());
        assert_eq!(state.len(), 50);
    }

    /// The states of WasmController ns/hello, kept through a mock API server answering
    /// `status`.
    fn store_answering(status: u16) -> (Arc<GuestState>, Sent) {
        let (client, sent) = api_server_answering(status);
        let owner = StateOwner::of(
            client,
            Some("ns"),
            "hello",
            Some("uid-1"),
            "kubewasm-system",
        );
        (
            Arc::new(GuestState::new(owner, usize::MAX, BTreeMap::new())),
            sent,
        )
    }

    /// Keys of one shard (7).
    fn keys_of_shard_7(n: usize) -> Vec<String> {
        (0..)
            .map(|i| format!("ns/pod-{i}"))
            .filter(|k| shard_of_key(k) == 7)
            .take(n)
            .collect()
    }

    #[tokio::test]
    async fn saves_left_behind_go_in_one_write_and_the_next_reconcile_waits_for_it() {
        let (state, sent) = store_answering(200);
        let keys = keys_of_shard_7(40);
        for k in &keys {
            state
                .set_behind(k, Some("seen"), crate::controller::Fence::default())
                .unwrap();
        }
        assert!(
            sent.locked().is_empty(),
            "nothing written before the linger"
        );
        assert_eq!(
            state.get(&keys[0]),
            None,
            "not in memory before it is stored"
        );
        // The next reconcile of an object waits for its save.
        state.settled(&keys[39]).await.unwrap();
        assert_eq!(state.get(&keys[39]).as_deref(), Some("seen"));
        assert_eq!(state.len(), 40);
        let sent = sent.locked().clone();
        assert_eq!(sent.len(), 1, "40 saves in {} writes", sent.len());
        assert_eq!(sent[0].2["spec"]["entries"].as_object().unwrap().len(), 40);
        // An object with nothing waiting does not wait.
        state.settled("ns/other").await.unwrap();
    }

    #[tokio::test]
    async fn a_save_left_behind_that_fails_fails_the_next_reconcile_and_is_not_kept() {
        let (state, sent) = store_answering(500);
        let key = &keys_of_shard_7(1)[0];
        state
            .set_behind(key, Some("seen"), crate::controller::Fence::default())
            .unwrap();
        let err = state.settled(key).await.unwrap_err().to_string();
        assert!(err.contains("etcd is unhappy"), "{err}");
        assert_eq!(state.get(key), None);
        assert!(!sent.locked().is_empty());
        // Said once: the reconcile after the failed one goes on with what is stored.
        state.settled(key).await.unwrap();
    }

    #[tokio::test]
    async fn a_save_left_behind_is_written_when_its_shard_is_being_given_up() {
        let (state, sent) = store_answering(200);
        let key = &keys_of_shard_7(1)[0];
        let fence = crate::controller::Fence::default();
        state.set_behind(key, Some("seen"), fence.clone()).unwrap();
        fence.leave(); // handed over: the Lease is kept until the controller has stopped
        assert_eq!(state.flush().await, 0);
        assert_eq!(sent.locked().len(), 1);
        assert_eq!(state.get(key).as_deref(), Some("seen"));
    }

    #[tokio::test]
    async fn a_save_left_behind_is_not_sent_once_the_fence_is_shut() {
        let (state, sent) = store_answering(200);
        let key = &keys_of_shard_7(1)[0];
        let fence = crate::controller::Fence::default();
        state.set_behind(key, Some("seen"), fence.clone()).unwrap();
        fence.close(); // the shard lost before the linger ended
        let err = state.settled(key).await.unwrap_err().to_string();
        assert!(err.contains("no longer holds"), "{err}");
        assert!(sent.locked().is_empty(), "sent: {:?}", sent.locked());
        assert_eq!(state.get(key), None);
    }

    // Paused time: the linger is 100 ms of the test's clock, the mock's answers 20 ms each.
    #[tokio::test(start_paused = true)]
    async fn a_flush_waits_for_the_write_a_lingering_writer_has_in_flight() {
        let (state, sent) = store_answering(200);
        let key = &keys_of_shard_7(1)[0];
        state
            .set_behind(key, Some("seen"), crate::controller::Fence::default())
            .unwrap();
        // The linger is over and its writer has sent the save; the answer takes 20 ms more.
        tokio::time::sleep(LINGER + std::time::Duration::from_millis(5)).await;
        assert_eq!(sent.locked().len(), 1, "the lingering writer sent it");
        assert_eq!(state.get(key), None, "not answered yet");
        assert_eq!(state.flush().await, 0);
        assert_eq!(
            state.get(key).as_deref(),
            Some("seen"),
            "answered when flush returns"
        );
    }

    // Paused time: the linger is 100 ms of the test's clock, the mock's answers 20 ms each.
    #[tokio::test(start_paused = true)]
    async fn a_flush_writes_the_saves_left_behind_at_once() {
        let (state, sent) = store_answering(200);
        let keys = keys_of_shard_7(3);
        let other = (0..)
            .map(|i| format!("ns/other-{i}"))
            .find(|k| shard_of_key(k) != 7)
            .unwrap();
        for k in keys.iter().chain([&other]) {
            state
                .set_behind(k, Some("seen"), crate::controller::Fence::default())
                .unwrap();
        }
        let started = tokio::time::Instant::now();
        assert_eq!(state.flush().await, 0);
        assert!(started.elapsed() < LINGER, "waited for the linger");
        assert_eq!(state.len(), 4, "every save stored when the flush returns");
        assert_eq!(sent.locked().len(), 2, "one write per shard");
        // The lingering writers find nothing left.
        tokio::time::sleep(LINGER * 2).await;
        assert_eq!(sent.locked().len(), 2);
    }
}
