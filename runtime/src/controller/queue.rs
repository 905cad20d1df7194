//! A work queue of keys: deduplicated, never the same key twice at once, delayed adds, and
//! per-key exponential backoff (the client-go workqueue semantics, in a few lines).

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

/// Per-key exponential backoff: `base * 2^(failures-1)`, capped.
pub struct Backoff<K> {
    failures: Mutex<HashMap<K, u32>>,
    base: Duration,
    max: Duration,
}

impl<K: Eq + Hash> Backoff<K> {
    /// Backoff from `base` up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            failures: Mutex::default(),
            base,
            max,
        }
    }

    /// Records a failure and returns how long to wait before the next try.
    pub fn failed(&self, key: K) -> Duration {
        let mut f = self.failures.locked();
        let n = f.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        let factor = 2u32.saturating_pow((*n - 1).min(20));
        self.base.saturating_mul(factor).min(self.max)
    }

    /// Forgets the failures of a key after it succeeded.
    pub fn succeeded(&self, key: &K) {
        self.failures.locked().remove(key);
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

    #[test]
    fn backoff_doubles_up_to_the_cap_and_resets() {
        let b = Backoff::new(Duration::from_millis(500), Duration::from_secs(3));
        assert_eq!(b.failed("k"), Duration::from_millis(500));
        assert_eq!(b.failed("k"), Duration::from_secs(1));
        assert_eq!(b.failed("k"), Duration::from_secs(2));
        assert_eq!(b.failed("k"), Duration::from_secs(3));
        b.succeeded(&"k");
        assert_eq!(b.failed("k"), Duration::from_millis(500));
    }
}
