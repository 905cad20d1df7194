//! Shadow runs of a candidate module (`spec.candidate`): on the reconciles sampled, the
//! candidate is called with the live module's request, through the same grants, in the
//! tenant's fair share, and its answer is compared with the live one's ([`compare`]);
//! nothing it answers is carried out. Each running controller's [`Shadow`] counts what was
//! compared and keeps the last differences — a few for its status, the last
//! [`KEPT_DIFFERENCES`] in full for its team (`kubewasm rollout diff`, through the
//! `diffs` subresource, [`ShadowStore::of`]) — charged to its namespace's account.

pub mod compare;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use serde::Serialize;

use crate::api::{RolloutStatus, ShadowDifference};
use crate::host::{StateAccounts, StateBook};
use crate::sandbox::{Digest, GuestPre, guest_text};
use crate::sync::{Locks as _, RwLocks as _};

/// Differing reconciles kept in full per controller, the latest last.
pub const KEPT_DIFFERENCES: usize = 20;

/// Differences shown in the status, the latest first.
pub const SHOWN_DIFFERENCES: usize = 3;

/// Lines of one difference shown in the status.
const SHOWN_LINES: usize = 8;

/// Bytes of one line shown in the status.
const SHOWN_LINE_BYTES: usize = 256;

/// The `kind` of the `diffs` subresource's answer.
pub const DIFF_LIST_KIND: &str = "ShadowDifferenceList";

/// One reconcile whose candidate answer differed from the live one.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Differed {
    /// The object reconciled.
    pub object: String,
    /// When (RFC 3339).
    pub at: String,
    /// The candidate compared (`sha256:…`).
    pub candidate: String,
    /// Each difference, one line each ([`compare::differences`]).
    pub changes: Vec<String>,
}

impl Differed {
    fn bytes(&self) -> usize {
        self.object.len()
            + self.at.len()
            + self.candidate.len()
            + self.changes.iter().map(|c| c.len() + 8).sum::<usize>()
            + 64
    }
}

/// What one controller's shadow runs found, since its candidate last changed.
#[derive(Debug, Default)]
struct Record {
    /// The candidate compared (`sha256:…`, and the image it was pulled as).
    shown: Option<String>,
    compared: u64,
    differing: u64,
    /// The last differing reconciles, the latest last.
    recent: VecDeque<Differed>,
    /// Dropped for want of room in the namespace's account.
    dropped: u64,
}

/// A running controller's candidate and what comparing it found; dropped with its runner,
/// crediting what it was charged.
pub struct Shadow {
    candidate: RwLock<Option<Arc<GuestPre>>>,
    sample_every: u64,
    calls: AtomicU64,
    record: Arc<Mutex<Record>>,
    book: StateBook,
}

/// Every running controller's shadow record, by controller (`namespace/name`, or `name`), for
/// its team to fetch.
pub struct ShadowStore {
    accounts: Arc<StateAccounts>,
    records: Mutex<HashMap<String, Weak<Mutex<Record>>>>,
}

impl ShadowStore {
    /// A store charging each namespace at most `cap_per_namespace` bytes of kept differences.
    pub fn new(cap_per_namespace: usize) -> Arc<ShadowStore> {
        Arc::new(ShadowStore {
            accounts: StateAccounts::new(cap_per_namespace),
            records: Mutex::default(),
        })
    }

    /// The shadow of controller `id` starting now, comparing one reconcile in
    /// `sample_every` once it is handed a candidate ([`Shadow::set`]).
    pub fn open(&self, id: &str, namespace: Option<&str>, sample_every: u32) -> Shadow {
        let record: Arc<Mutex<Record>> = Arc::default();
        let mut records = self.records.locked();
        records.retain(|_, r| r.strong_count() > 0);
        records.insert(id.to_owned(), Arc::downgrade(&record));
        Shadow {
            candidate: RwLock::new(None),
            sample_every: u64::from(sample_every.max(1)),
            calls: AtomicU64::new(0),
            record,
            book: self.accounts.open(namespace),
        }
    }

    /// The differences kept of controller `id`, as the `diffs` subresource answers them
    /// (`None`: it does not run here).
    pub fn of(&self, id: &str) -> Option<serde_json::Value> {
        let record = self.records.locked().get(id).and_then(Weak::upgrade)?;
        let r = record.locked();
        Some(serde_json::json!({
            "apiVersion": "kubewasm.dev/v1alpha1",
            "kind": DIFF_LIST_KIND,
            "controller": id,
            "candidate": r.shown,
            "compared": r.compared,
            "differing": r.differing,
            "dropped": r.dropped,
            "items": r.recent,
        }))
    }

    /// Bytes the kept differences of `namespace` take.
    pub fn used(&self, namespace: Option<&str>) -> usize {
        self.accounts.used(namespace)
    }
}

impl Shadow {
    /// Compares `candidate` (pulled as `image`) from the next reconcile on (`None`: none). A
    /// new candidate starts a new count.
    pub fn set(&self, candidate: Option<(Arc<GuestPre>, Option<String>)>) {
        let digest = candidate.as_ref().map(|(g, _)| g.digest());
        let before = self.candidate.read_locked().as_ref().map(|g| g.digest());
        if digest == before {
            return;
        }
        let mut record = self.record.locked();
        *record = Record {
            shown: candidate
                .as_ref()
                .map(|(guest, image)| shown(guest.digest(), image.as_deref())),
            ..Record::default()
        };
        self.book.set(0);
        *self.candidate.write_locked() = candidate.map(|(guest, _)| guest);
    }

    /// The candidate, when this reconcile is one of those compared.
    pub fn sample(&self) -> Option<Arc<GuestPre>> {
        let candidate = self.candidate.read_locked().clone()?;
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        n.is_multiple_of(self.sample_every).then_some(candidate)
    }

    /// The candidate compared now.
    pub fn candidate(&self) -> Option<Digest> {
        self.candidate.read_locked().as_ref().map(|g| g.digest())
    }

    /// One reconcile of `object` was compared with candidate `digest`: `changes` is how it
    /// differed (none: the same). Whether it is the first difference of this candidate.
    pub fn compared(&self, object: &str, digest: Digest, changes: Vec<String>) -> bool {
        let mut r = self.record.locked();
        if self.candidate() != Some(digest) {
            return false; // a reconcile that began with the candidate before
        }
        r.compared += 1;
        if changes.is_empty() {
            return false;
        }
        r.differing += 1;
        r.recent.push_back(Differed {
            object: object.to_owned(),
            at: k8s_openapi::jiff::Timestamp::now().to_string(),
            candidate: format!("{digest}"),
            changes,
        });
        while r.recent.len() > KEPT_DIFFERENCES {
            r.recent.pop_front();
        }
        // Within the namespace's account: this controller's oldest go first.
        loop {
            let held: usize = r.recent.iter().map(Differed::bytes).sum();
            if self.book.grow(held).is_ok() {
                break;
            }
            r.recent.pop_front();
            r.dropped += 1;
            if r.recent.is_empty() {
                self.book.set(0);
                break;
            }
        }
        r.differing == 1
    }

    /// Reconciles compared and, of them, differing.
    pub fn counts(&self) -> (u64, u64) {
        let r = self.record.locked();
        (r.compared, r.differing)
    }

    /// What the status shows of the shadow runs, while a candidate is compared.
    pub fn status(&self) -> Option<RolloutStatus> {
        let r = self.record.locked();
        let candidate = r.shown.clone()?;
        let last_differences = r
            .recent
            .iter()
            .rev()
            .take(SHOWN_DIFFERENCES)
            .map(|d| {
                let mut changes: Vec<String> = d
                    .changes
                    .iter()
                    .take(SHOWN_LINES)
                    .map(|c| guest_text(c, SHOWN_LINE_BYTES).into_owned())
                    .collect();
                if d.changes.len() > SHOWN_LINES {
                    changes.push(format!(
                        "and {} more: kubewasm rollout diff",
                        d.changes.len() - SHOWN_LINES
                    ));
                }
                ShadowDifference {
                    object: d.object.clone(),
                    changes,
                }
            })
            .collect();
        Some(RolloutStatus {
            candidate: Some(candidate),
            problem: None,
            compared: r.compared,
            differing: r.differing,
            last_differences,
        })
    }
}

/// A module as the status names it: `sha256:… (image registry/repo@sha256:…)`.
pub fn shown(digest: Digest, image: Option<&str>) -> String {
    match image {
        Some(image) => format!("{digest} (image {image})"),
        None => format!("{digest}"),
    }
}

#[cfg(test)]
mod tests;
