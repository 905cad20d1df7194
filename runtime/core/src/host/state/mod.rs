//! The state a controller saves per object (`setState`, handed back as `request.state`), kept
//! in objects of the runtime's own kind `WasmControllerState` (see `api/state.rs` for why
//! there), so that it outlives the runtime, is the same for every replica, and is visible to
//! the controller's owner (`kubectl get wasmcontrollerstates -o yaml`).
//!
//! A controller's states are spread over [`STATE_SHARDS`] objects by a hash of the object key,
//! each created when its first state is saved ([`store`]). Bounds ([`entries`]):
//! [`MAX_GUEST_STATE_BYTES`] per object, the operator's quota per controller in bytes
//! (`--max-state-bytes-per-controller`, keys included), [`MAX_SHARD_BYTES`] per shard object
//! (far below what etcd takes), and the operator's cap per namespace, all its controllers
//! together (`--max-state-bytes-per-namespace`, [`budget`]).
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

mod budget;
mod entries;
mod error;
mod store;
mod stored;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::sandbox::MAX_GUEST_STATE_BYTES;
use crate::sync::Locks as _;

pub use budget::{DEFAULT_MAX_STATE_BYTES_PER_NAMESPACE, StateAccounts, StateBook};
pub use entries::shard_of_key;
use entries::{Entries, cost_of};
pub use error::StateError;
pub use store::StateOwner;
pub use stored::Stored;

/// Shard objects per controller: few enough that saves left behind gather in each during
/// [`LINGER`], enough that 10,000 objects' states fit (16 MiB at most).
pub const STATE_SHARDS: u32 = 16;

/// How long a save left behind ([`GuestState::set_behind`]) waits for others of its shard,
/// to be written together.
pub const LINGER: std::time::Duration = std::time::Duration::from_millis(100);

/// The most bytes of entries (keys and values) one shard object holds.
pub const MAX_SHARD_BYTES: usize = 1 << 20;

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

/// One controller's saved states, by object key (`namespace/name`, or `name` when
/// cluster-scoped, as [`crate::controller::ObjectKey`] displays).
pub struct GuestState {
    owner: StateOwner,
    quota: usize,
    /// What its states take in its namespace's account: told after every change of
    /// `entries`, under its lock; dropped with the states, it credits them.
    book: StateBook,
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
    /// A controller's states, kept by `owner`, at most `quota` bytes, charged to its
    /// namespace's `book`; `found` is what its status held (moved into the shards by
    /// [`GuestState::load`]).
    pub fn new(
        owner: StateOwner,
        quota: usize,
        book: StateBook,
        found: BTreeMap<String, String>,
    ) -> GuestState {
        GuestState {
            owner,
            quota,
            book,
            entries: Mutex::default(),
            shards: (0..STATE_SHARDS).map(|_| Shard::default()).collect(),
            found: Mutex::new(found),
            loaded: tokio::sync::OnceCell::new(),
            failed: Mutex::default(),
        }
    }

    /// Kept in memory only (offline runs and tests), with no bounds but each state's size.
    pub fn in_memory() -> GuestState {
        let book = StateAccounts::new(usize::MAX).open(None);
        GuestState::new(StateOwner::Memory, usize::MAX, book, BTreeMap::new())
    }

    /// Reads the stored states, once (later calls return at once): before the controller's
    /// first reconcile. States found in the status are moved into the shards (those the
    /// shards already hold win), and the status field removed. Entries past the bounds of
    /// the controller (an object edited by hand) are not loaded, and so never handed to a
    /// guest; what is loaded is charged to the namespace however much that is (it is stored:
    /// a namespace over its cap, the operator having lowered it, saves no more until it is
    /// under it again).
    ///
    /// `stored`, when many controllers start together, says which have shard objects at all:
    /// one that has none is not asked for them.
    pub async fn load(&self, stored: Option<&Stored>) -> Result<(), StateError> {
        self.loaded
            .get_or_try_init(|| self.load_once(stored))
            .await
            .map(drop)
    }

    /// Where its shards live (namespace, name prefix), unless kept in memory only.
    pub fn place(&self) -> Option<(String, String)> {
        match &self.owner {
            StateOwner::Store(store) => {
                let (home, prefix) = store.place();
                Some((home.to_owned(), prefix.to_owned()))
            }
            StateOwner::Memory => None,
        }
    }

    async fn load_once(&self, stored: Option<&Stored>) -> Result<(), StateError> {
        let found = std::mem::take(&mut *self.found.locked());
        let StateOwner::Store(store) = &self.owner else {
            self.keep_loaded(found.into_iter().map(|(k, v)| (shard_of_key(&k), k, v)));
            return Ok(());
        };
        let (home, prefix) = store.place();
        let shards = match stored {
            Some(stored) if !stored.has(home, prefix) => Vec::new(),
            _ => store.read().await?,
        };
        self.keep_loaded(
            shards
                .into_iter()
                .flat_map(|(shard, entries)| entries.into_iter().map(move |(k, v)| (shard, k, v))),
        );
        if found.is_empty() {
            return Ok(());
        }
        let moving: Vec<(String, String)> = {
            let entries = self.entries.locked();
            found
                .into_iter()
                .filter(|(k, v)| v.len() <= MAX_GUEST_STATE_BYTES && entries.get(k).is_none())
                .collect()
        };
        let saves = moving.iter().map(|(k, v)| self.set(k, Some(v)));
        for saved in futures::future::join_all(saves).await {
            saved
                .map_err(|e| StateError::Load(format!("moving it from status.guestState: {e}")))?;
        }
        store.clear_legacy().await?;
        tracing::info!(
            controller = store.controller(),
            "moved {} saved states from status.guestState into WasmControllerState objects",
            moving.len()
        );
        Ok(())
    }

    /// Keeps the `(shard, key, value)`s read within the controller's bounds (the first of a
    /// key wins), and charges them.
    fn keep_loaded(&self, read: impl Iterator<Item = (usize, String, String)>) {
        let mut entries = self.entries.locked();
        for (shard, k, v) in read {
            if v.len() <= MAX_GUEST_STATE_BYTES
                && shard_of_key(&k) == shard
                && entries.get(&k).is_none()
                && entries.admit(&k, Some(&v), self.quota).is_ok()
            {
                entries.store(&k, Some(&v));
            }
        }
        self.book.set(entries.worst());
    }

    /// The state saved for `key`.
    pub fn get(&self, key: &str) -> Option<String> {
        self.entries.locked().get(key).cloned()
    }

    /// The keys of every object with state.
    pub fn keys(&self) -> Vec<String> {
        self.entries.locked().keys().cloned().collect()
    }

    /// How many objects have state.
    pub fn len(&self) -> usize {
        self.entries.locked().len()
    }

    /// Whether no object has state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the states take against the quota.
    pub fn used_bytes(&self) -> usize {
        self.entries.locked().used()
    }

    /// Whether saving `value` for `key` changes anything.
    pub fn changes(&self, key: &str, value: Option<&str>) -> bool {
        self.entries.locked().get(key).map(String::as_str) != value
    }

    /// Checks a save against the bounds and reserves what it costs until it is answered
    /// ([`entries`]); its shard. A forget is never refused.
    fn admit(&self, key: &str, value: Option<&str>) -> Result<usize, StateError> {
        if let Some(v) = value
            && v.len() > MAX_GUEST_STATE_BYTES
        {
            return Err(StateError::TooLarge {
                key: key.to_owned(),
                len: v.len(),
            });
        }
        let mut entries = self.entries.locked();
        let worst = entries.admit(key, value, self.quota)?;
        if worst > entries.worst() {
            self.book
                .grow(worst)
                .map_err(|used| StateError::NamespaceFull {
                    key: key.to_owned(),
                    whose: self.book.whose(),
                    cap: self.book.cap(),
                    used,
                    mine: entries.worst(),
                })?;
        }
        entries.reserve(key, cost_of(key, value));
        Ok(shard_of_key(key))
    }

    /// Saves admitted were answered, or replaced in their shard's batch by later ones before
    /// they were sent: what they reserved is let go, and the account told.
    fn release<'a>(&self, saves: impl IntoIterator<Item = (&'a str, Option<&'a str>)>) {
        let mut entries = self.entries.locked();
        for (key, value) in saves {
            entries.release(key, cost_of(key, value));
        }
        self.book.set(entries.worst());
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
        let replaced = {
            let mut pending = shard.pending.locked();
            pending.behind.remove(key);
            pending.waiters.push(tx);
            pending
                .changes
                .insert(key.to_owned(), value.map(str::to_owned))
        };
        if let Some(replaced) = &replaced {
            self.release([(key, replaced.as_deref())]);
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
        let (schedule, replaced) = {
            let mut pending = self.shards[shard_index].pending.locked();
            pending.behind.insert(key.to_owned());
            pending.fence = Some(fence);
            let replaced = pending
                .changes
                .insert(key.to_owned(), value.map(str::to_owned));
            (!std::mem::replace(&mut pending.scheduled, true), replaced)
        };
        if let Some(replaced) = &replaced {
            self.release([(key, replaced.as_deref())]);
        }
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
        // Its saves stay reserved until answered, or until this write is dropped unanswered
        // (its reconcile cancelled).
        let answered = Answered {
            state: self,
            changes: &batch.changes,
        };
        // Held is enough: a save left behind was made while the fence was open, and a shard
        // being given up keeps its Lease until its controllers have stopped (and flushed).
        let written = if batch.fence.as_ref().is_some_and(|f| !f.is_held()) {
            Err("not sent: this runtime no longer holds the controller's shard".to_owned())
        } else {
            match &self.owner {
                StateOwner::Store(store) => store.write(index, &batch.changes).await,
                StateOwner::Memory => Ok(()),
            }
        };
        match &written {
            Ok(()) => {
                let mut entries = self.entries.locked();
                for (k, v) in &batch.changes {
                    entries.store(k, v.as_deref());
                }
            }
            Err(message) => {
                let mut failed = self.failed.locked();
                for key in &batch.behind {
                    failed.insert(key.clone(), message.clone());
                }
            }
        }
        drop(answered);
        // Only now: whoever finds the key no longer in flight finds it in memory (or failed).
        shard.in_flight.locked().clear();
        for waiter in batch.waiters {
            let _ = waiter.send(written.clone());
        }
        written
    }
}

/// The saves of one write, let go when it is answered or dropped ([`GuestState::release`]).
struct Answered<'a> {
    state: &'a GuestState,
    changes: &'a BTreeMap<String, Option<String>>,
}

impl Drop for Answered<'_> {
    fn drop(&mut self) {
        let saves = self.changes.iter().map(|(k, v)| (k.as_str(), v.as_deref()));
        self.state.release(saves);
    }
}
