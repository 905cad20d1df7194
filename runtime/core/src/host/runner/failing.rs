//! Which objects of a controller are failing now, and why: what its `Degraded` condition,
//! `Ready` and `lastError` report. An object enters when its reconcile fails and leaves when
//! it next succeeds (a deleted parent's reconcile succeeds), so a success on one object never
//! hides another's failure.

use std::collections::BTreeMap;

use crate::api::Problem;
use crate::controller::ObjectKey;

/// The objects whose last reconcile failed. Bounded by the parents the controller reconciles
/// (a key enters only from a reconcile), each message by `MAX_LAST_ERROR_BYTES`.
#[derive(Debug, Default)]
pub struct Failing {
    by_key: BTreeMap<ObjectKey, (u64, Problem)>,
    /// Orders the failures: the largest is the latest.
    next: u64,
}

impl Failing {
    /// `key`'s reconcile failed with `problem`: it is the latest failure now.
    pub fn failed(&mut self, key: ObjectKey, problem: Problem) {
        self.next += 1;
        self.by_key.insert(key, (self.next, problem));
    }

    /// `key`'s reconcile succeeded: it is no longer failing.
    pub fn succeeded(&mut self, key: &ObjectKey) {
        self.by_key.remove(key);
    }

    /// How many objects are failing.
    pub fn count(&self) -> usize {
        self.by_key.len()
    }

    /// The keys of the `n` latest failures among the objects failing now, the latest first.
    pub fn latest_keys(&self, n: usize) -> Vec<String> {
        let mut failing: Vec<(u64, &ObjectKey)> = self
            .by_key
            .iter()
            .map(|(k, (order, _))| (*order, k))
            .collect();
        failing.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        failing.iter().take(n).map(|(_, k)| k.to_string()).collect()
    }

    /// The latest failure among the objects failing now.
    pub fn latest(&self) -> Option<&Problem> {
        self.by_key
            .values()
            .max_by_key(|(order, _)| *order)
            .map(|(_, p)| p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Reason;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            namespace: Some("ns".into()),
            name: name.into(),
        }
    }

    #[test]
    fn a_success_elsewhere_does_not_hide_a_failure() {
        let mut f = Failing::default();
        f.failed(key("a"), Problem::new(Reason::ReconcileFailed, "a: boom"));
        f.succeeded(&key("b"));
        assert_eq!(f.count(), 1);
        assert_eq!(f.latest().map(|p| p.message.as_str()), Some("a: boom"));
    }

    #[test]
    fn the_latest_failure_is_reported_until_it_recovers() {
        let mut f = Failing::default();
        f.failed(key("a"), Problem::new(Reason::ReconcileFailed, "a: first"));
        f.failed(key("b"), Problem::new(Reason::Trapped, "b: second"));
        assert_eq!(f.latest().map(|p| p.message.as_str()), Some("b: second"));
        f.failed(key("a"), Problem::new(Reason::ReconcileFailed, "a: third"));
        assert_eq!(f.latest().map(|p| p.message.as_str()), Some("a: third"));
        assert_eq!(f.latest_keys(5), ["ns/a", "ns/b"]);
        assert_eq!(f.latest_keys(1), ["ns/a"]);
        f.succeeded(&key("a"));
        assert_eq!(f.latest().map(|p| p.message.as_str()), Some("b: second"));
        f.succeeded(&key("b"));
        assert_eq!(f.count(), 0);
        assert!(f.latest().is_none());
    }
}
