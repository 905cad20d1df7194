//! Damping of keys that bring themselves back: a reconcile that asks to be requeued at once,
//! or that writes what its own watches see (its status, its children, another parent), calls
//! for the next reconcile of its key by itself. Repeated without any change from outside, that
//! is a spin: a guest answering `requeue-after(0)`, or setting a different status every time,
//! would write to one object as fast as the replica lets it (1,993 status writes in 10 s,
//! issue 38). controller-runtime backs such a key off exponentially (its default
//! `ItemExponentialFailureRateLimiter`, 5 ms doubling to 1,000 s) until the key is forgotten;
//! so does this, with the queue's one [`Backoff`], counting per key.
//!
//! The rule:
//! - A successful reconcile **brings its key back** when it wrote an object (not an Event, not
//!   saved state) or asked for a `requeue-after` shorter than [`SPIN_REQUEUE`] (1 s). Then the
//!   key's backoff counts one more try, and its next reconcile waits that long: 5 ms, 10 ms,
//!   20 ms, … up to 1,000 s after the one before — whatever brings it back meanwhile (its own
//!   watch events, a requeue, a resync) waits with it. A requeue it asked for is stretched to
//!   that delay (and to the operator's `--min-requeue-millis`).
//! - A reconcile that does neither forgets the key's backoff: the controller reached a fixed
//!   point. A `requeue-after` of 1 s or more is then honoured as asked (a poll is not a spin).
//! - **A change from outside** forgets it too, so the next reconcile runs at once: the parent
//!   at a resourceVersion that is neither the one the last reconcile was handed nor one this
//!   controller's own writes left ([`OWN_VERSIONS`] of them remembered), the parent gone or
//!   back, or another module. That is controller-runtime's `Forget` on new inputs — minus the
//!   echoes of the controller's own writes, which would otherwise undo the damping on every
//!   write. A child's change does not forget it (children change by the controller's own
//!   hand too); such a reconcile waits out the delay, and runs.
//!
//! So one object's writes are bounded however idle the replica is: 11 in the first 10 s of a
//! spin, 14 in the first minute, 21 in the first hour, then one per 1,000 s (a requeue-zero
//! spin: 10, 14, 21, the first eight at the 1 s floor). A well-behaved controller
//! converges within a reconcile or two (its writes' echoes find nothing to do): its delays
//! stay at 5–10 ms. Memory: a key is remembered from a reconcile that brought it back to the
//! next reconcile of it (bounded by the keys the controller reconciles, as failures are);
//! the own resourceVersions are a ring of [`OWN_VERSIONS`].

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::Mutex;
use std::time::Duration;

use crate::controller::Backoff;
use crate::sandbox::Digest;
use crate::sync::Locks as _;

/// A `requeue-after` shorter than this asks to come back at once: the key spins.
pub const SPIN_REQUEUE: Duration = Duration::from_secs(1);

/// The first delay of a spinning key (controller-runtime's default rate limiter).
pub const SPIN_BASE: Duration = Duration::from_millis(5);

/// The longest delay of a spinning key (controller-runtime's default rate limiter).
pub const SPIN_MAX: Duration = Duration::from_secs(1000);

/// How many resourceVersions of its own writes a controller remembers.
pub const OWN_VERSIONS: usize = 256;

/// What a reconcile ran on: the parent's resourceVersion (`None`: gone) and the module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inputs {
    /// The parent's resourceVersion as cached, `None` when it is gone.
    pub version: Option<String>,
    /// The module's digest.
    pub module: Digest,
}

/// One controller's spinning keys (see the module doc).
pub struct Spins<K> {
    backoff: Backoff<K, Inputs>,
    /// Hashes of the resourceVersions this controller's writes left, the latest last.
    own: Mutex<VecDeque<u64>>,
    hasher: RandomState,
}

impl<K: Eq + Hash + Clone> Default for Spins<K> {
    fn default() -> Self {
        Spins {
            backoff: Backoff::new(SPIN_BASE, SPIN_MAX),
            own: Mutex::default(),
            hasher: RandomState::new(),
        }
    }
}

impl<K: Eq + Hash + Clone> Spins<K> {
    /// How long `key` must still wait before it is reconciled with `now` (its inputs as they
    /// are): `None` to run it now. A change from outside forgets the key's backoff.
    pub fn hold(&self, key: &K, now: &Inputs) -> Option<Duration> {
        let (wait, seen) = self.backoff.pending(key)?;
        let ours = now.version.as_deref().is_some_and(|v| self.is_own(v));
        if now.module != seen.module || (now.version != seen.version && !ours) {
            self.backoff.succeeded(key);
            return None;
        }
        (!wait.is_zero()).then_some(wait)
    }

    /// A reconcile of `key`, handed `inputs`, succeeded: it wrote an object (`wrote`) or not,
    /// and asked to be looked at again after `asked`. Returns when to requeue it: `asked`,
    /// at least `floor`, and for a spin at least the key's backoff.
    pub fn settled(
        &self,
        key: &K,
        inputs: Inputs,
        wrote: bool,
        asked: Option<Duration>,
        floor: Duration,
    ) -> Option<Duration> {
        let at_once = asked.is_some_and(|after| after < SPIN_REQUEUE);
        if !(wrote || at_once) {
            self.backoff.succeeded(key);
            return asked.map(|after| after.max(floor));
        }
        let delay = self.backoff.failed_with(key.clone(), inputs);
        asked.map(|after| {
            if at_once {
                after.max(floor).max(delay)
            } else {
                after.max(floor)
            }
        })
    }

    /// This controller's writes left these resourceVersions.
    pub fn wrote<'a>(&self, versions: impl IntoIterator<Item = &'a String>) {
        let mut own = self.own.locked();
        for v in versions {
            if own.len() >= OWN_VERSIONS {
                own.pop_front();
            }
            own.push_back(self.hasher.hash_one(v.as_str()));
        }
    }

    fn is_own(&self, version: &str) -> bool {
        let hash = self.hasher.hash_one(version);
        self.own.locked().contains(&hash)
    }

    /// Keys whose backoff is remembered now.
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.backoff.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::{Instant, sleep};

    fn at(version: &str) -> Inputs {
        Inputs {
            version: Some(version.into()),
            module: Digest([1; 32]),
        }
    }

    const FLOOR: Duration = Duration::from_secs(1);

    /// Runs a key that answers `requeue-after(0)` and writes nothing, as the runner does
    /// (hold, then reconcile, then settle), for `window`: when each reconcile ran.
    async fn requeue_zero(spins: &Spins<&'static str>, window: Duration) -> Vec<Duration> {
        let start = Instant::now();
        let mut runs = Vec::new();
        while start.elapsed() < window {
            if let Some(wait) = spins.hold(&"k", &at("1")) {
                sleep(wait).await;
                continue;
            }
            runs.push(start.elapsed());
            let after = spins.settled(&"k", at("1"), false, Some(Duration::ZERO), FLOOR);
            sleep(after.expect("a requeue was asked for")).await;
        }
        runs
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_requeued_at_once_backs_off_exponentially() {
        let spins = Spins::default();
        let runs = requeue_zero(&spins, Duration::from_secs(3600)).await;
        let within = |secs| {
            runs.iter()
                .filter(|r| **r < Duration::from_secs(secs))
                .count()
        };
        // The floor of 1 s for the first eight (5 ms … 640 ms is less), then doubling from
        // 1.28 s to the cap of 1,000 s.
        assert_eq!(within(10), 10, "{runs:?}");
        assert_eq!(within(60), 14, "{runs:?}");
        assert_eq!(within(3600), 21, "{runs:?}");
        let gaps: Vec<Duration> = runs.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(gaps[..8], [FLOOR; 8]);
        assert_eq!(gaps[8], Duration::from_millis(1280));
        assert_eq!(gaps[9], Duration::from_millis(2560));
        assert!(gaps.iter().all(|g| *g <= SPIN_MAX), "{gaps:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_that_writes_its_own_status_every_time_backs_off() {
        // Each reconcile sets a new status: its watch event comes back at once, at the
        // resourceVersion the write left.
        let spins = Spins::default();
        let start = Instant::now();
        let (mut version, mut writes) = (1u64, Vec::new());
        while start.elapsed() < Duration::from_secs(10) {
            let now = at(&version.to_string());
            if let Some(wait) = spins.hold(&"k", &now) {
                sleep(wait).await;
                continue;
            }
            version += 1;
            spins.wrote([&version.to_string()]);
            writes.push(start.elapsed());
            assert_eq!(spins.settled(&"k", now, true, None, FLOOR), None);
            sleep(Duration::from_millis(1)).await; // the watch event
        }
        // 5 ms doubling: 5 + 10 + … + 5.12 s < 10 s < … + 10.24 s.
        assert!((11..=12).contains(&writes.len()), "{writes:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_from_outside_resets_the_backoff() {
        let spins = Spins::default();
        for _ in 0..10 {
            spins.settled(&"k", at("1"), true, None, FLOOR);
        }
        // 2.56 s to wait on the inputs it ran on, and on its own write's echo.
        assert!(spins.hold(&"k", &at("1")).is_some());
        spins.wrote([&"2".to_owned()]);
        assert_eq!(
            spins.hold(&"k", &at("2")),
            Some(Duration::from_millis(2560))
        );
        // Someone else changed the parent: at once, and the backoff starts again at 5 ms.
        assert_eq!(spins.hold(&"k", &at("3")), None);
        assert_eq!(spins.remembered(), 0);
        spins.settled(&"k", at("3"), true, None, FLOOR);
        assert_eq!(spins.hold(&"k", &at("3")), Some(SPIN_BASE));
        // So does another module, and the parent gone.
        let other = Inputs {
            module: Digest([2; 32]),
            ..at("3")
        };
        assert_eq!(spins.hold(&"k", &other), None);
        spins.settled(&"k", at("3"), true, None, FLOOR);
        let gone = Inputs {
            version: None,
            ..at("3")
        };
        assert_eq!(spins.hold(&"k", &gone), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sane_requeue_is_honoured_and_a_quiet_reconcile_forgets() {
        let spins = Spins::default();
        let poll = Duration::from_secs(30);
        for _ in 0..100 {
            assert_eq!(
                spins.settled(&"k", at("1"), false, Some(poll), FLOOR),
                Some(poll)
            );
            assert_eq!(spins.hold(&"k", &at("1")), None);
        }
        // Shorter than the floor, not a spin: the floor (the operator's minimum).
        let after = Duration::from_millis(1500);
        assert_eq!(
            spins.settled(&"k", at("1"), false, Some(after), FLOOR),
            Some(after)
        );
        // A spin, then a reconcile that writes nothing and asks nothing: forgotten.
        for _ in 0..5 {
            spins.settled(&"k", at("1"), false, Some(Duration::ZERO), FLOOR);
        }
        assert_eq!(spins.remembered(), 1);
        spins.settled(&"k", at("1"), false, None, FLOOR);
        assert_eq!(spins.remembered(), 0);
        assert_eq!(spins.hold(&"k", &at("1")), None);
    }

    #[test]
    fn own_versions_are_a_bounded_ring() {
        let spins: Spins<&str> = Spins::default();
        let versions: Vec<String> = (0..OWN_VERSIONS * 2).map(|i| i.to_string()).collect();
        spins.wrote(&versions);
        assert_eq!(spins.own.lock().unwrap().len(), OWN_VERSIONS);
        assert!(!spins.is_own("0"), "the oldest is forgotten");
        assert!(spins.is_own(&(OWN_VERSIONS * 2 - 1).to_string()));
    }
}
