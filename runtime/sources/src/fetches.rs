//! Fetching a module beside the manager loop, for every kind of source: the manager asks for
//! a controller's module and is answered at once — with what the last fetch found, or "under
//! way" — and is woken ([`Fetches::notified`]) when a fetch has found something. So a
//! ConfigMap read that waits on the API server or on the read budget, a file on a slow disk
//! and a registry's pull hold a task each, never the loop that starts, stops and reports
//! every tenant's controllers.
//!
//! The job is the caller's (what is read and how is the sources' [`crate::fetch`]); this
//! type owns when it runs and what it may hold:
//! - **one at a time per controller**, keyed by the controller and by what it wants (its
//!   source as the spec names it): a fetch of an older spec ends unheard;
//! - **fairness per tenant**: a tenant (a namespace's controllers, or the cluster's) runs
//!   [`FETCHES_PER_TENANT`] at once, all tenants [`PARALLEL_FETCHES`]; a tenant whose reads
//!   never end holds its own turns, and the others' fetches go on;
//! - **bounded holding**: an answer nobody takes is dropped after [`UNTAKEN_TTL`] (with the
//!   bytes it holds, charged to the read budget where they were read), and forgetting a
//!   controller drops its answer;
//! - **nothing new, nothing said**: a job that finds nothing new (a pull still under way)
//!   answers `None` and wakes nobody; the next ask starts it again.
//!
//! Single flight by what is read (one read of a ConfigMap's version for every controller
//! naming it, one pull of an anonymous image) is the reads' and pulls' own
//! ([`crate::ModuleReads::shared`], [`crate::Pulls`]), below the jobs.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

use kubewasm_sandbox::sync::Locks as _;

/// Fetches running at once, for all tenants.
pub const PARALLEL_FETCHES: usize = 32;

/// Fetches one tenant runs at once.
pub const FETCHES_PER_TENANT: usize = 4;

/// How long an answer waits to be taken before it is dropped.
pub const UNTAKEN_TTL: Duration = Duration::from_secs(30);

/// What asking for a controller's module found.
#[derive(Debug)]
pub enum Asked<T> {
    /// A fetch is under way: the manager is woken when it has found something.
    Running,
    /// The last fetch's answer (taken: asked again, a new fetch starts).
    Done(T),
}

/// One controller's fetches.
struct Slot<T> {
    /// What the fetches are for (the source as the spec names it).
    wanted: String,
    /// Bumped when `wanted` changes: the answer of an older fetch is dropped.
    generation: u64,
    running: bool,
    finished: Option<(T, tokio::time::Instant)>,
}

/// Fetches beside the manager loop, one slot per controller (see the module doc).
pub struct Fetches<T> {
    permits: Arc<Semaphore>,
    tenants: Turns,
    slots: Mutex<HashMap<String, Slot<T>>>,
    done: Mutex<HashSet<String>>,
    notify: Notify,
}

impl<T: Send + 'static> Fetches<T> {
    /// [`PARALLEL_FETCHES`] at once, [`FETCHES_PER_TENANT`] per tenant.
    pub fn new() -> Arc<Fetches<T>> {
        Fetches::with_limits(PARALLEL_FETCHES, FETCHES_PER_TENANT)
    }

    /// `parallel` at once, `per_tenant` per tenant.
    pub fn with_limits(parallel: usize, per_tenant: usize) -> Arc<Fetches<T>> {
        Arc::new(Fetches {
            permits: Arc::new(Semaphore::new(parallel)),
            tenants: Turns::new(per_tenant),
            slots: Mutex::default(),
            done: Mutex::default(),
            notify: Notify::new(),
        })
    }

    /// The answer of `key`'s last fetch of `wanted`, taken; or [`Asked::Running`], after
    /// starting `job` (beside the caller, in `key`'s tenant's turn) when none runs. `key` is
    /// a controller as `namespace/name` (or `name`, the cluster's).
    pub fn ask<F>(self: &Arc<Self>, key: &str, wanted: &str, job: impl FnOnce() -> F) -> Asked<T>
    where
        F: Future<Output = Option<T>> + Send + 'static,
    {
        let mut slots = self.slots.locked();
        let slot = slots.entry(key.to_owned()).or_insert_with(|| Slot {
            wanted: wanted.to_owned(),
            generation: 0,
            running: false,
            finished: None,
        });
        if slot.wanted != wanted {
            slot.wanted = wanted.to_owned();
            slot.generation = slot.generation.wrapping_add(1);
            slot.running = false;
            slot.finished = None;
        }
        if let Some((answer, _)) = slot.finished.take() {
            return Asked::Done(answer);
        }
        if !slot.running {
            slot.running = true;
            let generation = slot.generation;
            let turn = self.tenants.of(tenant_of(key));
            let (this, key, job) = (self.clone(), key.to_owned(), job());
            tokio::spawn(async move {
                let answer = {
                    let _turn = turn.acquire_owned().await.ok();
                    let _permit = this.permits.clone().acquire_owned().await.ok();
                    job.await
                };
                this.finish(&key, generation, answer);
            });
        }
        Asked::Running
    }

    fn finish(&self, key: &str, generation: u64, answer: Option<T>) {
        {
            let mut slots = self.slots.locked();
            let Some(slot) = slots.get_mut(key).filter(|s| s.generation == generation) else {
                return;
            };
            slot.running = false;
            let Some(answer) = answer else {
                return;
            };
            slot.finished = Some((answer, tokio::time::Instant::now()));
        }
        self.done.locked().insert(key.to_owned());
        self.notify.notify_one();
    }

    /// Waits until a fetch has found something, and gives the keys of those that did.
    pub async fn notified(&self) -> HashSet<String> {
        self.notify.notified().await;
        std::mem::take(&mut *self.done.locked())
    }

    /// Forgets the fetches of keys `keep` says no (their controllers are gone: a running
    /// fetch ends unheard, an answer is dropped), and drops answers untaken for
    /// [`UNTAKEN_TTL`].
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let now = tokio::time::Instant::now();
        let mut slots = self.slots.locked();
        slots.retain(|key, _| keep(key));
        for slot in slots.values_mut() {
            if slot
                .finished
                .as_ref()
                .is_some_and(|(_, at)| now >= *at + UNTAKEN_TTL)
            {
                slot.finished = None;
            }
        }
        let tenants: HashSet<&str> = slots.keys().map(|k| tenant_of(k)).collect();
        self.tenants.retain(|tenant| tenants.contains(tenant));
    }

    /// Forgets `key`'s fetches (its controller is gone): a running fetch ends unheard, an
    /// answer is dropped.
    pub fn forget(&self, key: &str) {
        self.slots.locked().remove(key);
    }

    /// Fetches running, and answers not yet taken.
    pub fn in_flight(&self) -> (usize, usize) {
        let slots = self.slots.locked();
        let running = slots.values().filter(|s| s.running).count();
        let held = slots.values().filter(|s| s.finished.is_some()).count();
        (running, held)
    }
}

/// Each tenant's turns: a semaphore of so many permits per tenant, made when first asked for
/// and forgotten when its tenant has nothing left (and no permit is out).
pub(crate) struct Turns {
    per_tenant: usize,
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Turns {
    /// `per_tenant` turns each.
    pub(crate) fn new(per_tenant: usize) -> Turns {
        Turns {
            per_tenant,
            tenants: Mutex::default(),
        }
    }

    /// `tenant`'s turns.
    pub(crate) fn of(&self, tenant: &str) -> Arc<Semaphore> {
        self.tenants
            .locked()
            .entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_tenant)))
            .clone()
    }

    /// Forgets the tenants `keep` says no, unless one of their turns is taken.
    pub(crate) fn retain(&self, keep: impl Fn(&str) -> bool) {
        let per_tenant = self.per_tenant;
        self.tenants
            .locked()
            .retain(|tenant, turns| keep(tenant) || turns.available_permits() < per_tenant);
    }
}

/// The tenant of a controller's key: its namespace (`ns/name`), or `""` for the cluster's.
pub(crate) fn tenant_of(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

#[cfg(test)]
mod tests;
