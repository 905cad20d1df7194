//! A work queue of keys: deduplicated, never the same key twice at once, delayed adds, and
//! per-key exponential backoff (the client-go workqueue semantics, in a few lines). The
//! backoff serves both failures and spins (`host::runner`'s damping).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use crate::sync::Locks as _;
use tokio::sync::Notify;
use tokio::time::Instant;

struct State<K> {
    ready: VecDeque<K>,
    queued: HashSet<K>,
    running: HashSet<K>,
    /// Keys added while running: queued again when they finish.
    rerun: HashSet<K>,
    /// Keys to add at a later time (the earliest wins).
    delayed: HashMap<K, Instant>,
    closed: bool,
}

/// A queue of keys to reconcile.
pub struct WorkQueue<K> {
    state: Mutex<State<K>>,
    notify: Notify,
}

impl<K: Clone + Eq + Hash> Default for WorkQueue<K> {
    fn default() -> Self {
        WorkQueue {
            state: Mutex::new(State {
                ready: VecDeque::new(),
                queued: HashSet::new(),
                running: HashSet::new(),
                rerun: HashSet::new(),
                delayed: HashMap::new(),
                closed: false,
            }),
            notify: Notify::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        self.state.locked()
    }

    /// Adds a key now. A key already waiting is not added twice; a key being worked on is
    /// queued again when that work is done.
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        s.delayed.remove(&key);
        Self::push(&mut s, key);
        drop(s);
        self.notify.notify_one();
    }

    fn push(s: &mut State<K>, key: K) {
        if s.running.contains(&key) {
            s.rerun.insert(key);
        } else if s.queued.insert(key.clone()) {
            s.ready.push_back(key);
        }
    }

    /// Adds a key after a delay; an earlier pending time for the same key wins.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let at = Instant::now() + delay;
        let mut s = self.lock();
        if s.queued.contains(&key) {
            return;
        }
        let entry = s.delayed.entry(key).or_insert(at);
        *entry = (*entry).min(at);
        drop(s);
        self.notify.notify_one();
    }

    /// Waits for the next key and marks it running. `None` once the queue is closed.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            let wake_at = {
                let mut s = self.lock();
                if s.closed {
                    return None;
                }
                let now = Instant::now();
                let due: Vec<K> = s
                    .delayed
                    .iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in due {
                    s.delayed.remove(&key);
                    Self::push(&mut s, key);
                }
                if let Some(key) = s.ready.pop_front() {
                    s.queued.remove(&key);
                    s.running.insert(key.clone());
                    return Some(key);
                }
                s.delayed.values().min().copied()
            };
            match wake_at {
                Some(at) => {
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Marks a key's work finished.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        s.running.remove(key);
        if s.rerun.remove(key) {
            Self::push(&mut s, key.clone());
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Stops handing out keys; waiting `next` calls return `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
    }

    /// Resolves once [`WorkQueue::close`] was called.
    pub async fn closed(&self) {
        loop {
            let notified = self.notify.notified();
            if self.lock().closed {
                return;
            }
            notified.await;
        }
    }

    /// Keys waiting now (not delayed, not running).
    pub fn len(&self) -> usize {
        self.lock().ready.len()
    }

    /// Whether no key is waiting now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Per-key exponential backoff: `base * 2^(tries-1)`, capped at `max` (client-go's
/// `ItemExponentialFailureRateLimiter`). Each key waiting remembers until when it waits and a
/// note of what its last try ran on (`V`), so that a caller can tell whether anything changed
/// since. Bounded by the keys tried and not yet forgotten: a caller forgets a key when it
/// succeeds (or its inputs changed), as client-go's `Forget`.
pub struct Backoff<K, V = ()> {
    keys: Mutex<HashMap<K, Tries<V>>>,
    base: Duration,
    max: Duration,
}

struct Tries<V> {
    count: u32,
    until: Instant,
    note: V,
}

impl<K: Eq + Hash, V: Clone> Backoff<K, V> {
    /// Backoff from `base` up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            keys: Mutex::default(),
            base,
            max,
        }
    }

    /// Records another try of `key` that calls for waiting (a failure, a spin), made on
    /// `note`, and returns how long to wait before the next one.
    pub fn failed_with(&self, key: K, note: V) -> Duration {
        let mut keys = self.keys.locked();
        let count = keys.get(&key).map_or(1, |t| t.count.saturating_add(1));
        let factor = 2u32.saturating_pow(count.saturating_sub(1).min(20));
        let delay = self.base.saturating_mul(factor).min(self.max);
        let until = Instant::now() + delay;
        keys.insert(key, Tries { count, until, note });
        delay
    }

    /// How long `key` still waits (zero once due) and the note of its last try; `None` when
    /// it has none.
    pub fn pending(&self, key: &K) -> Option<(Duration, V)> {
        let keys = self.keys.locked();
        let tries = keys.get(key)?;
        let wait = tries.until.saturating_duration_since(Instant::now());
        Some((wait, tries.note.clone()))
    }

    /// Forgets the tries of a key after it succeeded.
    pub fn succeeded(&self, key: &K) {
        self.keys.locked().remove(key);
    }

    /// Keys remembered now.
    pub fn len(&self) -> usize {
        self.keys.locked().len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K: Eq + Hash, V: Clone + Default> Backoff<K, V> {
    /// Records a failure and returns how long to wait before the next try.
    pub fn failed(&self, key: K) -> Duration {
        self.failed_with(key, V::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn keys_are_deduplicated_and_never_run_twice_at_once() {
        let q = WorkQueue::default();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.next().await, Some("a"));
        q.add("a"); // while running: comes back after done
        assert_eq!(q.next().await, Some("b"));
        assert!(q.is_empty());
        q.done(&"a");
        assert_eq!(q.next().await, Some("a"));
        q.done(&"a");
        q.done(&"b");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_keys_come_back_after_their_delay() {
        let q = WorkQueue::default();
        q.add_after("late", Duration::from_secs(10));
        q.add_after("late", Duration::from_secs(3));
        let started = Instant::now();
        assert_eq!(q.next().await, Some("late"));
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn close_wakes_waiters() {
        let q = std::sync::Arc::new(WorkQueue::<u8>::default());
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.next().await }
        });
        let closed = tokio::spawn({
            let q = q.clone();
            async move { q.closed().await }
        });
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(waiter.await.unwrap(), None);
        closed.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_up_to_the_cap_and_resets() {
        let b: Backoff<&str> = Backoff::new(Duration::from_millis(500), Duration::from_secs(3));
        assert_eq!(b.failed("k"), Duration::from_millis(500));
        assert_eq!(b.failed("k"), Duration::from_secs(1));
        assert_eq!(b.failed("k"), Duration::from_secs(2));
        assert_eq!(b.failed("k"), Duration::from_secs(3));
        b.succeeded(&"k");
        assert_eq!(b.failed("k"), Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_key_says_how_long_it_still_waits_and_what_it_ran_on() {
        let b = Backoff::new(Duration::from_millis(5), Duration::from_secs(1000));
        assert_eq!(b.pending(&"k"), None);
        assert_eq!(b.failed_with("k", 7), Duration::from_millis(5));
        assert_eq!(b.failed_with("k", 8), Duration::from_millis(10));
        tokio::time::sleep(Duration::from_millis(4)).await;
        assert_eq!(b.pending(&"k"), Some((Duration::from_millis(6), 8)));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            b.pending(&"k"),
            Some((Duration::ZERO, 8)),
            "due, still counted"
        );
        // 5 ms doubling: the cap of 1,000 s after 19 tries, and it stays there.
        for _ in 3..=18 {
            b.failed_with("k", 0);
        }
        assert_eq!(b.failed_with("k", 0), Duration::from_secs(1000));
        assert_eq!(b.failed_with("k", 0), Duration::from_secs(1000));
        b.succeeded(&"k");
        assert!(b.is_empty());
    }
}
