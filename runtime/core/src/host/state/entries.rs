//! What one controller's saved states cost against its bounds: the entries as stored, and
//! the saves not yet answered, each key counted at its worst.
//!
//! A save is checked before it is written and kept in memory only once the API server took
//! it, and the saves of many objects wait for one write (group commit). Checked against the
//! stored bytes alone, a controller saving for a thousand objects within one linger would pass
//! every check and overshoot by all of them; so every value waiting or being written is
//! reserved until it is answered, and a key counts the largest of its stored value and the
//! values reserved for it — whichever of them ends up stored, the bounds hold.

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest as _, Sha256};

use super::{MAX_SHARD_BYTES, STATE_SHARDS, StateError};

/// What one entry costs against the bounds: its key and value, and the JSON around them.
pub(super) fn cost(key: &str, value: &str) -> usize {
    key.len() + value.len() + 6
}

/// What saving `value` (`None`: forgetting) for `key` costs once stored.
pub(super) fn cost_of(key: &str, value: Option<&str>) -> usize {
    value.map_or(0, |v| cost(key, v))
}

/// The shard of an object key.
pub fn shard_of_key(key: &str) -> usize {
    let hash = Sha256::digest(key.as_bytes());
    (u32::from_be_bytes([hash[0], hash[1], hash[2], hash[3]]) % STATE_SHARDS) as usize
}

/// The states as stored, and the saves not yet answered, with what they cost.
#[derive(Default)]
pub(super) struct Entries {
    map: BTreeMap<String, String>,
    /// Bytes stored, in all and per shard.
    used: usize,
    per_shard: Vec<usize>,
    /// The cost of every value waiting or being written, by key (0: a forget).
    reserved: HashMap<String, Vec<usize>>,
    /// What the saves not yet answered may add to the stored bytes, in all and per shard.
    extra: usize,
    extra_per_shard: Vec<usize>,
}

impl Entries {
    /// The state stored for `key`.
    pub(super) fn get(&self, key: &str) -> Option<&String> {
        self.map.get(key)
    }

    /// The keys with a state stored.
    pub(super) fn keys(&self) -> impl Iterator<Item = &String> {
        self.map.keys()
    }

    /// How many objects have a state stored.
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes stored.
    pub(super) fn used(&self) -> usize {
        self.used
    }

    /// Bytes the states take at worst, once every save waiting is answered.
    pub(super) fn worst(&self) -> usize {
        self.used + self.extra
    }

    /// What `key` may add to what is stored, at worst, were `also` reserved for it too.
    fn extra_of(&self, key: &str, also: usize) -> usize {
        let stored = self.map.get(key).map_or(0, |v| cost(key, v));
        let reserved = self.reserved.get(key).and_then(|r| r.iter().max().copied());
        reserved.unwrap_or(0).max(also).saturating_sub(stored)
    }

    /// Runs `change` on what is kept of `key`, keeping the sums right.
    fn change(&mut self, key: &str, change: impl FnOnce(&mut Entries)) {
        if self.per_shard.is_empty() {
            self.per_shard = vec![0; STATE_SHARDS as usize];
            self.extra_per_shard = vec![0; STATE_SHARDS as usize];
        }
        let shard = shard_of_key(key);
        let before = self.extra_of(key, 0);
        change(self);
        let after = self.extra_of(key, 0);
        self.extra = self.extra - before + after;
        self.extra_per_shard[shard] = self.extra_per_shard[shard] - before + after;
    }

    /// Checks a save of `value` for `key` against the controller's `quota` and its shard's
    /// bound, counting what is not answered yet; what the states would take at worst with it.
    pub(super) fn admit(
        &self,
        key: &str,
        value: Option<&str>,
        quota: usize,
    ) -> Result<usize, StateError> {
        let grows = self.extra_of(key, cost_of(key, value)) - self.extra_of(key, 0);
        if grows == 0 {
            return Ok(self.worst());
        }
        if self.worst() + grows > quota {
            return Err(StateError::Full {
                key: key.to_owned(),
                quota,
                used: self.used,
                objects: self.map.len(),
            });
        }
        let shard = shard_of_key(key);
        let in_shard = self.per_shard.get(shard).copied().unwrap_or(0)
            + self.extra_per_shard.get(shard).copied().unwrap_or(0);
        if in_shard + grows > MAX_SHARD_BYTES {
            return Err(StateError::ShardFull {
                key: key.to_owned(),
            });
        }
        Ok(self.worst() + grows)
    }

    /// A save costing `cost` once stored waits for `key`: counted until
    /// [`Entries::release`]d.
    pub(super) fn reserve(&mut self, key: &str, cost: usize) {
        self.change(key, |e| {
            e.reserved.entry(key.to_owned()).or_default().push(cost);
        });
    }

    /// A save reserved for `key` was answered, or replaced by a later one before it was
    /// sent: no longer counted apart (once stored, it counts as stored).
    pub(super) fn release(&mut self, key: &str, cost: usize) {
        self.change(key, |e| {
            let Some(costs) = e.reserved.get_mut(key) else {
                return;
            };
            if let Some(at) = costs.iter().position(|&c| c == cost) {
                costs.swap_remove(at);
            }
            if costs.is_empty() {
                e.reserved.remove(key);
            }
        });
    }

    /// The API server took `value` (`None`: the key was forgotten) for `key`.
    pub(super) fn store(&mut self, key: &str, value: Option<&str>) {
        self.change(key, |e| {
            let shard = shard_of_key(key);
            if let Some(old) = e.map.remove(key) {
                let c = cost(key, &old);
                e.used -= c;
                e.per_shard[shard] -= c;
            }
            if let Some(v) = value {
                let c = cost(key, v);
                e.used += c;
                e.per_shard[shard] += c;
                e.map.insert(key.to_owned(), v.to_owned());
            }
        });
    }
}
