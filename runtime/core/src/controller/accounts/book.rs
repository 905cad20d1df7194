//! One watch's book: what it charged for each object it was brought, and per namespace.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{Admit, CacheAccounts, WatchId};
use crate::controller::ObjectKey;

/// What one watch charged to the accounts: the weight of every object it was brought (stored
/// or not) and their sum per namespace, which is all the ledger holds of it. Owned by the
/// watch's task, so that however the task ends — aborted when the last controller lets the
/// watch go, or returned — dropping it credits everything the watch charged, exactly once.
pub struct WatchBook {
    accounts: Arc<CacheAccounts>,
    id: WatchId,
    weights: HashMap<ObjectKey, u64>,
    /// Sum of `weights` per namespace (`None`: cluster-scoped), as last told to the ledger.
    sums: HashMap<Option<String>, u64>,
    /// While a (re)list runs: the objects it has brought so far.
    listing: Option<HashSet<ObjectKey>>,
}

impl WatchBook {
    pub(super) fn new(accounts: Arc<CacheAccounts>, id: WatchId) -> WatchBook {
        WatchBook {
            accounts,
            id,
            weights: HashMap::new(),
            sums: HashMap::new(),
            listing: None,
        }
    }

    /// The watch's number in the accounts.
    pub fn id(&self) -> WatchId {
        self.id
    }

    /// Object `key` now weighs `weight`: charged in place of what it was charged before (a
    /// relisted object already charged is not charged twice). Says whether the watch may
    /// store it.
    pub fn charge(&mut self, key: &ObjectKey, weight: u64) -> Admit {
        if let Some(seen) = &mut self.listing {
            seen.insert(key.clone());
        }
        let old = self.weights.insert(key.clone(), weight).unwrap_or(0);
        self.report(key.namespace.as_ref(), old, weight)
    }

    /// Object `key` is gone: what it was charged is credited.
    pub fn credit(&mut self, key: &ObjectKey) {
        if let Some(seen) = &mut self.listing {
            seen.remove(key);
        }
        if let Some(old) = self.weights.remove(key) {
            self.report(key.namespace.as_ref(), old, 0);
        }
    }

    /// A (re)list starts: objects charged before stay charged until [`WatchBook::listed`], which
    /// credits those it did not bring again. A list that starts over (the watcher failed
    /// midway) starts the count over.
    pub fn listing(&mut self) {
        self.listing = Some(HashSet::new());
    }

    /// The (re)list is done: objects charged before and not brought again are credited; says
    /// which (the cache drops them on its own).
    pub fn listed(&mut self) -> Vec<ObjectKey> {
        let Some(seen) = self.listing.take() else {
            return Vec::new();
        };
        let gone: Vec<ObjectKey> = self
            .weights
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in &gone {
            self.credit(key);
        }
        gone
    }

    /// Bytes the watch charged to `namespace` (`None`: cluster-scoped objects).
    pub fn charged(&self, namespace: Option<&str>) -> u64 {
        self.sums
            .get(&namespace.map(str::to_owned))
            .copied()
            .unwrap_or(0)
    }

    /// Objects the watch charged.
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    /// Whether the watch charged no object.
    pub fn is_empty(&self) -> bool {
        self.weights.is_empty()
    }

    fn report(&mut self, namespace: Option<&String>, old: u64, new: u64) -> Admit {
        let sum = self.sums.entry(namespace.cloned()).or_default();
        *sum = sum.saturating_sub(old).saturating_add(new);
        let sum = *sum;
        if sum == 0 {
            self.sums.remove(&namespace.cloned());
        }
        self.accounts
            .set(self.id, namespace.map(String::as_str), sum, new > 0)
    }
}

impl Drop for WatchBook {
    fn drop(&mut self) {
        self.accounts.release(self.id);
    }
}
