//! Events on the parent. A guest that reports the same thing on every reconcile makes one
//! Event whose `count` grows (and whose message and `lastTimestamp` are the latest), not one
//! object per occurrence: the aggregation kube-runtime's `events::Recorder` does, kept on
//! `core/v1` Events so that the RBAC of existing controllers (`events: create, patch` in the
//! core group, as the tutorials grant) keeps working.
//!
//! Occurrences are counted per object, type and reason, for [`SERIES_TTL`] after the last
//! one; each controller remembers at most [`MAX_SERIES`] of them (the oldest is forgotten
//! first), so a guest cannot grow the runtime's memory by inventing reasons.
//!
//! Before that, every occurrence passes its object's spam filter, client-go's
//! `EventSourceObjectSpamFilter`: a token bucket per controller (the Event's source) and
//! object, [`SPAM_BURST`] (25) at once, then one more per [`SPAM_REFILL`] (5 minutes). An
//! occurrence over it is dropped, not written: counted on `kubewasm_events_dropped_total
//! {controller}`, and logged once each time an object's bucket runs dry. So one object gets at
//! most 25 Event writes from one controller in any 5 minutes, plus one per 5 minutes, whatever
//! its guest emits (a guest emitting 500 per reconcile made 1,719 in 10 s, issue 38). The
//! filter is not reset when the object changes: the guest's own writes change it. Each
//! controller remembers at most [`MAX_SPAM_OBJECTS`] buckets: a full bucket is the same as
//! none and is forgotten first, then the one with the most tokens left (forgetting it gives
//! back the fewest).

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::sandbox::EventType;

use super::{ActionError, Executor, Outcome, str_at};
use crate::sync::Locks as _;

/// How long after its last occurrence an Event is counted on rather than created anew.
pub const SERIES_TTL: Duration = Duration::from_secs(600);

/// The most Event series one controller remembers.
pub const MAX_SERIES: usize = 256;

/// Events one object may get from one controller at once (client-go's spam filter burst).
pub const SPAM_BURST: u32 = 25;

/// Then one more Event per this long (client-go's spam filter: a rate of 1/300 per second).
pub const SPAM_REFILL: Duration = Duration::from_secs(300);

/// The most objects whose spam filter one controller remembers.
pub const MAX_SPAM_OBJECTS: usize = 1024;

/// One controller's Events so far: which Event object each (object, type, reason) went to,
/// and each object's spam filter.
#[derive(Debug, Default)]
pub struct EventRecorder {
    hasher: RandomState,
    series: Mutex<HashMap<u64, Series>>,
    spam: Mutex<HashMap<u64, Bucket>>,
    /// Occurrences dropped by the spam filter.
    dropped: Counter,
}

/// One object's spam filter: tokens left, as of `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: u32,
    at: tokio::time::Instant,
    /// Whether its running dry was logged since a token was last taken.
    said: bool,
}

impl Bucket {
    /// Refills the bucket up to now: one token per whole [`SPAM_REFILL`] since `at`.
    fn refill(&mut self, now: tokio::time::Instant) {
        let elapsed = now.saturating_duration_since(self.at);
        let periods = elapsed.as_secs() / SPAM_REFILL.as_secs();
        let missing = u64::from(SPAM_BURST.saturating_sub(self.tokens));
        if periods >= missing {
            self.tokens = SPAM_BURST;
            self.at = now;
        } else {
            // periods < missing <= SPAM_BURST: fits a u32.
            let periods = u32::try_from(periods).unwrap_or(0);
            self.tokens = self.tokens.saturating_add(periods);
            self.at += SPAM_REFILL.saturating_mul(periods);
        }
    }
}

/// What the spam filter says of one occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spam {
    /// Write it.
    Admitted,
    /// Drop it; the object's bucket just ran dry (`true`: say so once).
    Dropped(bool),
}

#[derive(Debug, Clone)]
struct Series {
    /// The Event object's name.
    name: String,
    count: i32,
    last: Instant,
}

impl EventRecorder {
    /// A recorder counting the occurrences its spam filter drops on `dropped`.
    pub fn new(dropped: Counter) -> Self {
        EventRecorder {
            dropped,
            ..EventRecorder::default()
        }
    }

    /// Takes a token of the spam filter of the object `object_uid` (see the module doc).
    fn admit(&self, object_uid: &str) -> Spam {
        let key = self.hasher.hash_one(("spam", object_uid));
        let now = tokio::time::Instant::now();
        let mut spam = self.spam.locked();
        if spam.len() >= MAX_SPAM_OBJECTS && !spam.contains_key(&key) {
            spam.retain(|_, b| {
                b.refill(now);
                b.tokens < SPAM_BURST
            });
            if spam.len() >= MAX_SPAM_OBJECTS
                && let Some(fullest) = spam
                    .iter()
                    .max_by_key(|(_, b)| (b.tokens, std::cmp::Reverse(b.at)))
                    .map(|(k, _)| *k)
            {
                // The one whose forgetting gives back the fewest Events.
                spam.remove(&fullest);
            }
        }
        let bucket = spam.entry(key).or_insert(Bucket {
            tokens: SPAM_BURST,
            at: now,
            said: false,
        });
        bucket.refill(now);
        if bucket.tokens > 0 {
            bucket.tokens -= 1;
            bucket.said = false;
            return Spam::Admitted;
        }
        let first = !std::mem::replace(&mut bucket.said, true);
        drop(spam);
        self.dropped.inc();
        Spam::Dropped(first)
    }

    /// Occurrences dropped by the spam filter so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    fn key(&self, object_uid: &str, event_type: EventType, reason: &str) -> u64 {
        self.hasher.hash_one((object_uid, event_type, reason))
    }

    /// The series to count this occurrence on, if a recent one exists.
    fn recent(&self, key: u64) -> Option<Series> {
        let series = self.series.locked();
        series
            .get(&key)
            .filter(|s| s.last.elapsed() < SERIES_TTL)
            .cloned()
    }

    fn remember(&self, key: u64, name: String, count: i32) {
        let mut series = self.series.locked();
        if series.len() >= MAX_SERIES && !series.contains_key(&key) {
            series.retain(|_, s| s.last.elapsed() < SERIES_TTL);
            if series.len() >= MAX_SERIES
                && let Some(oldest) = series.iter().min_by_key(|(_, s)| s.last).map(|(k, _)| *k)
            {
                series.remove(&oldest);
            }
        }
        let last = Instant::now();
        series.insert(key, Series { name, count, last });
    }

    fn forget(&self, key: u64) {
        let mut series = self.series.locked();
        series.remove(&key);
    }
}

impl Executor<'_> {
    /// Records one Event on the parent outside a guest's actions (the runtime's own, such as
    /// a failed reconcile's): [`Executor::record_event`] alone, nothing else of `execute`.
    pub async fn record_event_only(
        &self,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) -> Result<Outcome, ActionError> {
        let mut outcome = Outcome::default();
        self.record_event(event_type, reason, message, &mut outcome)
            .await?;
        Ok(outcome)
    }

    /// Records an Event on the parent, or counts it on the Event recorded for the same
    /// object, type and reason less than [`SERIES_TTL`] ago.
    pub(super) async fn record_event(
        &self,
        event_type: EventType,
        reason: &str,
        message: &str,
        outcome: &mut Outcome,
    ) -> Result<(), ActionError> {
        let Some(parent) = self.parent else {
            return Ok(());
        };
        let namespace = self
            .target
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let uid = str_at(parent, "/metadata/uid").unwrap_or_default();
        match self.events.admit(uid) {
            Spam::Admitted => {}
            Spam::Dropped(first) => {
                if first {
                    tracing::info!(
                        "Events on {} dropped from now on (Event {reason} the first): this controller recorded {SPAM_BURST} on it lately, its spam filter's burst; one more is let through every {} s (counted on kubewasm_events_dropped_total)",
                        self.target,
                        SPAM_REFILL.as_secs()
                    );
                }
                return Ok(());
            }
        }
        let key = self.events.key(uid, event_type, reason);
        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &namespace);
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let what = || format!("record Event {reason} on {}", self.target);

        if let Some(series) = self.events.recent(key) {
            let count = series.count.saturating_add(1);
            let patch = json!({"count": count, "lastTimestamp": now, "message": message});
            self.may_write().await?;
            match api
                .patch(&series.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    outcome.events_recorded = true;
                    self.events.remember(key, series.name, count);
                    outcome.changes.push(format!(
                        "counted Event {reason} on {} ({count} times)",
                        self.target
                    ));
                    return Ok(());
                }
                // Gone (the API server's Event TTL, or deleted): start a new one.
                Err(kube::Error::Api(s)) if s.code == 404 => self.events.forget(key),
                // The right to patch taken away: as for a refused create, below.
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    self.events.forget(key);
                    outcome.events_refused = Some(s.message.clone());
                    outcome.skipped.push(format!(
                        "Event {reason} on {} not counted: {}",
                        self.target, s.message
                    ));
                    return Ok(());
                }
                Err(source) => {
                    return Err(ActionError::Api {
                        what: what(),
                        source,
                    });
                }
            }
        }

        let event = CoreEvent {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", self.target.name)),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some(self.target.api_version.clone()),
                kind: Some(self.target.kind.clone()),
                name: Some(self.target.name.clone()),
                namespace: self.target.namespace.clone(),
                uid: Some(uid.to_owned()).filter(|u| !u.is_empty()),
                ..ObjectReference::default()
            },
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            type_: Some(match event_type {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            source: Some(EventSource {
                component: Some(self.field_manager.clone()),
                host: None,
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..CoreEvent::default()
        };
        self.may_write().await?;
        let created = match api.create(&PostParams::default(), &event).await {
            Ok(created) => created,
            // An Event is a note to people, not part of the work: a ServiceAccount that may
            // not create Events (the restarter tutorial's `joe`) still gets its work done;
            // the controller's status says its Events are not recorded and how to allow them
            // (a RoleBinding to kubewasm-guest-events), and the runtime's log what was lost.
            Err(kube::Error::Api(s)) if s.code == 403 => {
                outcome.events_refused = Some(s.message.clone());
                outcome.skipped.push(format!(
                    "Event {reason} on {} not recorded: {} (bind ClusterRole {} to the controller's ServiceAccount to see them)",
                    self.target, s.message, crate::host::access::GUEST_EVENTS_ROLE
                ));
                return Ok(());
            }
            Err(source) => {
                return Err(ActionError::Api {
                    what: what(),
                    source,
                });
            }
        };
        outcome.events_recorded = true;
        if let Some(name) = created.metadata.name {
            self.events.remember(key, name, 1);
        }
        outcome
            .changes
            .push(format!("recorded Event {reason} on {}", self.target));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_per_object_type_and_reason_and_bounded() {
        let recorder = EventRecorder::default();
        let key = recorder.key("uid-1", EventType::Normal, "Synced");
        assert_eq!(key, recorder.key("uid-1", EventType::Normal, "Synced"));
        assert_ne!(key, recorder.key("uid-2", EventType::Normal, "Synced"));
        assert_ne!(key, recorder.key("uid-1", EventType::Warning, "Synced"));
        assert_ne!(key, recorder.key("uid-1", EventType::Normal, "Other"));
        assert!(recorder.recent(key).is_none());
        recorder.remember(key, "e-1".into(), 1);
        assert_eq!(recorder.recent(key).map(|s| s.name), Some("e-1".into()));
        for i in 0..MAX_SERIES * 2 {
            recorder.remember(
                recorder.key("uid", EventType::Normal, &i.to_string()),
                format!("e{i}"),
                1,
            );
        }
        assert_eq!(recorder.series.lock().unwrap().len(), MAX_SERIES);
        recorder.forget(key);
        assert!(recorder.recent(key).is_none());
    }

    /// How many of `n` occurrences on `uid` the filter lets through now.
    fn admitted(recorder: &EventRecorder, uid: &str, n: usize) -> usize {
        (0..n)
            .filter(|_| recorder.admit(uid) == Spam::Admitted)
            .count()
    }

    #[tokio::test(start_paused = true)]
    async fn the_spam_filter_lets_a_burst_through_then_one_per_five_minutes() {
        let recorder = EventRecorder::new(Counter::default());
        assert_eq!(admitted(&recorder, "uid-1", 500), 25);
        assert_eq!(recorder.dropped(), 475);
        // Another object has a bucket of its own.
        assert_eq!(admitted(&recorder, "uid-2", 30), 25);
        // Said once per dry spell: the first drop only.
        assert_eq!(recorder.admit("uid-1"), Spam::Dropped(false));
        tokio::time::sleep(SPAM_REFILL - Duration::from_secs(1)).await;
        assert_eq!(admitted(&recorder, "uid-1", 10), 0);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(recorder.admit("uid-1"), Spam::Admitted, "one per 5 minutes");
        assert_eq!(
            recorder.admit("uid-1"),
            Spam::Dropped(true),
            "dry again: said"
        );
        assert_eq!(recorder.admit("uid-1"), Spam::Dropped(false));
        // An hour of quiet refills 12, not more than the burst after long enough.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(admitted(&recorder, "uid-1", 100), 12);
        tokio::time::sleep(Duration::from_secs(86_400)).await;
        assert_eq!(admitted(&recorder, "uid-1", 100), 25);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_over_ten_seconds_writes_at_most_the_burst() {
        // 500 Events per reconcile, a reconcile every 100 ms for 10 s: 25 written.
        let recorder = EventRecorder::new(Counter::default());
        let mut written = 0;
        for _ in 0..100 {
            written += admitted(&recorder, "uid", 500);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(written, 25);
        assert_eq!(recorder.dropped(), 50_000 - 25);
    }

    #[tokio::test(start_paused = true)]
    async fn the_spam_filter_remembers_a_bounded_number_of_objects() {
        let recorder = EventRecorder::new(Counter::default());
        // Objects that took one Event each: their buckets are not full for 5 minutes.
        for i in 0..MAX_SPAM_OBJECTS * 3 {
            assert_eq!(admitted(&recorder, &format!("uid-{i}"), 1), 1);
        }
        assert_eq!(recorder.spam.lock().unwrap().len(), MAX_SPAM_OBJECTS);
        // Full again after 5 minutes: forgotten first, for free.
        tokio::time::sleep(SPAM_REFILL).await;
        assert_eq!(admitted(&recorder, "uid-new", 1), 1);
        assert_eq!(recorder.spam.lock().unwrap().len(), 1);
    }
}
