//! Events on the parent. A guest that reports the same thing on every reconcile makes one
//! Event whose `count` grows (and whose message and `lastTimestamp` are the latest), not one
//! object per occurrence: the aggregation kube-runtime's `events::Recorder` does, kept on
//! `core/v1` Events so that the RBAC of existing controllers (`events: create, patch` in the
//! core group, as the tutorials grant) keeps working.
//!
//! Occurrences are counted per object, type and reason, for [`SERIES_TTL`] after the last
//! one; each controller remembers at most [`MAX_SERIES`] of them (the oldest is forgotten
//! first), so a guest cannot grow the runtime's memory by inventing reasons.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// One controller's Events so far: which Event object each (object, type, reason) went to.
#[derive(Debug, Default)]
pub struct EventRecorder {
    hasher: RandomState,
    series: Mutex<HashMap<u64, Series>>,
}

#[derive(Debug, Clone)]
struct Series {
    /// The Event object's name.
    name: String,
    count: i32,
    last: Instant,
}

impl EventRecorder {
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
                    self.events.remember(key, series.name, count);
                    outcome.changes.push(format!(
                        "counted Event {reason} on {} ({count} times)",
                        self.target
                    ));
                    return Ok(());
                }
                // Gone (the API server's Event TTL, or deleted): start a new one.
                Err(kube::Error::Api(s)) if s.code == 404 => self.events.forget(key),
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
            // not create Events (the restarter tutorial's `joe`) still gets its work done,
            // and the runtime's log says what was not recorded.
            Err(kube::Error::Api(s)) if s.code == 403 => {
                outcome.skipped.push(format!(
                    "Event {reason} on {} not recorded: {} (grant `create` and `patch` on `events` to see them)",
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
        };
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
}
