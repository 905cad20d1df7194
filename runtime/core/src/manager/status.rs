//! A controller's status: conditions a person can act on, digest, counters, last error.

use std::sync::atomic::Ordering;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::api::{ClusterWasmController, Reason, WasmController, WasmControllerStatus};

use prometheus_client::metrics::counter::Counter;

use super::life::Phase;
use super::{ControllerId, Managed, Manager, UNSETTLED_SHOWN_AFTER};
use crate::host::MAX_LISTED_FINALIZING;
use crate::sync::Locks as _;

/// Most bytes of a condition's message: a spec's own strings (kinds, paths) appear in some,
/// and the status must stay writable whatever the spec says.
const MAX_CONDITION_MESSAGE_BYTES: usize = 4096;

fn condition(
    type_: &str,
    ok: bool,
    reason: Reason,
    message: String,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.to_string(),
        message: crate::sandbox::guest_text(&message, MAX_CONDITION_MESSAGE_BYTES).into_owned(),
        observed_generation: generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

/// Where a controller runs, as its status says.
#[derive(Debug, Clone, Default)]
pub(super) struct Place {
    /// This replica's identity (`None` without `--leader-elect`).
    pub(super) replica: Option<String>,
    /// The shard Lease its tenant belongs to.
    pub(super) shard: Option<String>,
}

/// The status this controller should show now, run where `place` says.
fn desired(m: &Managed, place: Place, namespaced: bool) -> WasmControllerStatus {
    let g = m.generation;
    let digest = m.life.guest().map(|g| g.digest().to_string());
    // The image a module was pulled as: `module sha256:… (image registry/repo@sha256:…)`.
    let shown = digest.as_ref().map(|d| match m.life.image() {
        Some(image) => format!("{d} (image {image})"),
        None => d.clone(),
    });
    let module_ready = match (m.life.module_problem(), &shown) {
        (None, Some(d)) => condition(
            "ModuleReady",
            true,
            Reason::ModuleLoaded,
            format!("module {d} is loaded"),
            g,
        ),
        (Some(p), Some(d)) => condition(
            "ModuleReady",
            false,
            p.reason,
            format!("{}; still running the last good module {d}", p.message),
            g,
        ),
        (Some(p), None) => condition("ModuleReady", false, p.reason, p.message.clone(), g),
        (None, None) => condition(
            "ModuleReady",
            false,
            Reason::ModuleNotLoaded,
            "module not loaded yet".into(),
            g,
        ),
    };
    let mut events_refused = None;
    let (reconciles, failures, failing, finalizing, unowned) = match m.life.runner() {
        Some(runner) => {
            let s = runner.stats();
            events_refused = s.events_refused.locked().clone();
            let unowned: Vec<String> = s.unowned.locked().iter().cloned().collect();
            let failing = s.failing.locked();
            let failing = (
                failing.count(),
                failing.latest().cloned(),
                failing.latest_keys(MAX_LISTED_FAILING),
            );
            let waiting = s.finalizing.locked();
            let mut finalizing: Vec<String> = waiting
                .iter()
                .take(MAX_LISTED_FINALIZING)
                .map(ToString::to_string)
                .collect();
            if waiting.len() > MAX_LISTED_FINALIZING {
                finalizing.push(format!(
                    "and {} more",
                    waiting.len() - MAX_LISTED_FINALIZING
                ));
            }
            (
                s.reconciles.load(Ordering::Relaxed),
                s.failures.load(Ordering::Relaxed),
                failing,
                finalizing,
                unowned,
            )
        }
        None => (0, 0, (0, None, Vec::new()), Vec::new(), Vec::new()),
    };
    let (failing_count, last_error, failing_objects) = failing;
    let ready = match m.life.phase() {
        Phase::Running(runner) if !runner.synced() => condition(
            "Ready",
            false,
            Reason::WaitingForCaches,
            super::messages::waiting_for_caches(&runner.watched_kinds(), &runner.unlisted()),
            g,
        ),
        Phase::Running(runner) if let Some(why) = runner.withheld() => condition(
            "Ready",
            false,
            Reason::CacheBudgetExceeded,
            why.to_string(),
            g,
        ),
        Phase::Running(_) => {
            // The operator's clamps first: a long failure message must not cut them off.
            let mut message = format!("reconciling {} objects", m.spec.parent.kind);
            let clamped = m.life.access().map(|a| a.clamped.join("; "));
            if let Some(c) = clamped.filter(|c| !c.is_empty()) {
                message = format!("{message}; {c}");
            }
            // A refused update: READY still True (the last good module runs), and says so.
            if let (Some(p), Some(d)) = (m.life.module_problem(), &shown) {
                message = format!(
                    "{message} with the last good module {d}; the module now declared is refused ({}): {}",
                    p.reason, p.message
                );
            }
            if !unowned.is_empty() {
                message = format!(
                    "{message}; it applies {} without an owner (granted in spec.grants, not declared in spec.children): nothing deletes them with their parent — declare the kind in spec.children to own them",
                    unowned.join(", ")
                );
            }
            if let Some(why) = &events_refused {
                let account = m.life.access().map(|a| &a.account);
                message = format!(
                    "{message}; {}",
                    super::messages::events_refused(account, why, namespaced)
                );
            }
            match (&last_error, failing_count) {
                (None, _) => {}
                (Some(p), 0 | 1) => message = format!("{message}; one is failing: {}", p.message),
                (Some(p), n) => {
                    message = format!("{message}; {n} are failing, the latest: {}", p.message);
                }
            }
            // Running, but an object is failing: READY says so (`kubectl get wc`), and why.
            match &last_error {
                Some(p) => condition("Ready", false, p.reason, message, g),
                None => condition("Ready", true, Reason::Running, message, g),
            }
        }
        Phase::Refused(p) => condition("Ready", false, p.reason, p.message.clone(), g),
        Phase::ModuleFailed(p) => {
            condition("Ready", false, Reason::ModuleNotReady, p.message.clone(), g)
        }
        Phase::Compiling(digest) => condition(
            "Ready",
            false,
            Reason::Starting,
            format!("starting: its module {digest} is being compiled"),
            g,
        ),
        Phase::Starting => condition("Ready", false, Reason::Starting, "starting".into(), g),
    };
    let degraded = match &last_error {
        Some(p) => condition(
            "Degraded",
            true,
            p.reason,
            failing_message(failing_count, p),
            g,
        ),
        None => condition(
            "Degraded",
            false,
            Reason::ReconcilesSucceeding,
            "the last reconciles succeeded".into(),
            g,
        ),
    };
    WasmControllerStatus {
        conditions: vec![module_ready, ready, degraded],
        module_digest: digest,
        observed_generation: g,
        module_revision: m.life.version().and_then(|v| v.shown()),
        replica: place.replica,
        shard: place.shard,
        reconciles,
        failures,
        last_error: last_error.map(|p| p.message),
        failing: u64::try_from(failing_count).unwrap_or(u64::MAX),
        failing_objects,
        finalizing,
        guest_state: Default::default(),
        rollout: rollout(m),
    }
}

/// What the status shows of the candidate's shadow run, while the spec names a candidate:
/// the runner's counts and differences, and why no candidate (or not the newest) runs.
fn rollout(m: &Managed) -> Option<crate::api::RolloutStatus> {
    let declared = m.plan.candidate.as_ref()?;
    let shadow = m.life.runner().and_then(|r| r.shadow().status());
    let problem = match declared {
        Err(why) => Some(why.clone()),
        Ok(_) => match (m.life.candidate_problem(), &shadow, m.life.candidate()) {
            (Some(p), ..) => Some(p.message.clone()),
            (None, None, None) => Some("the candidate module is not loaded yet".into()),
            // Loaded, and compared once the controller runs.
            (None, None, Some(_)) => None,
            (None, Some(_), _) => None,
        },
    };
    let mut status = shadow.unwrap_or_else(|| crate::api::RolloutStatus {
        candidate: m
            .life
            .candidate()
            .map(|(g, image)| crate::host::shadow::shown(g.digest(), image)),
        ..Default::default()
    });
    let problem = match &m.promotion {
        Some(Err(why)) => Some(format!(
            "spec.rollout.promoteAfter was reached but the candidate was not promoted: {why}"
        )),
        _ => problem,
    };
    status.problem =
        problem.map(|p| crate::sandbox::guest_text(&p, MAX_CONDITION_MESSAGE_BYTES).into_owned());
    Some(status)
}

/// Most objects named in `status.failingObjects`.
const MAX_LISTED_FAILING: usize = 5;

/// What `Degraded` says while objects are failing: the latest failure, and how many fail.
fn failing_message(count: usize, latest: &crate::api::Problem) -> String {
    match count {
        0 | 1 => latest.message.clone(),
        n => format!("{n} objects are failing; the latest: {}", latest.message),
    }
}

/// Keeps `lastTransitionTime` of conditions whose status did not change.
fn keep_transition_times(new: &mut WasmControllerStatus, old: Option<&WasmControllerStatus>) {
    let Some(old) = old else { return };
    for c in &mut new.conditions {
        if let Some(prev) = old
            .conditions
            .iter()
            .find(|o| o.type_ == c.type_ && o.status == c.status)
        {
            c.last_transition_time = prev.last_transition_time.clone();
        }
    }
}

impl Manager {
    /// Writes every controller's status that changed since it was last written,
    /// [`PARALLEL_STATUS_WRITES`] at once.
    pub(super) async fn write_statuses(&mut self) {
        let writes = self.status_writes(None, |_| true);
        let written = writes.await;
        self.record_written(written);
    }

    /// The writes of the statuses that changed since they were last written, among those
    /// `which` takes (of the controllers `only` names, if given), as a future that borrows nothing of the manager: it can run while the
    /// manager reads the next modules ([`Manager::start_all`]). Hand what it returns to
    /// [`Manager::record_written`].
    pub(super) fn status_writes(
        &self,
        only: Option<&[ControllerId]>,
        which: impl Fn(&WasmControllerStatus) -> bool,
    ) -> impl std::future::Future<Output = Vec<StatusWritten>> + Send + 'static {
        // The gauge goes with the statuses: whoever sees a controller Ready sees it counted.
        let running = self
            .controllers
            .values()
            .filter(|m| m.life.running())
            .count();
        self.metrics.set_controllers(running);
        self.metrics
            .set_cache(self.watches.accounts(), self.watches.len());
        self.metrics.set_module_reads(&self.reads);
        self.metrics.set_state_bytes(self.state_accounts.total());
        self.metrics.set_capsule_bytes(self.capsules.total());
        self.metrics.set_modules_loaded(self.sandbox.loaded_count());
        self.set_shard_metrics();
        // Each status is made (messages formatted) to be compared with the one written: only
        // for `only` when given (a chunk of ten thousand starting), not for every controller.
        let candidates: Box<dyn Iterator<Item = (&ControllerId, &Managed)>> = match only {
            Some(ids) => Box::new(
                ids.iter()
                    .filter_map(|id| Some((id, self.controllers.get(id)?))),
            ),
            None => Box::new(self.controllers.iter()),
        };
        let changed: Vec<(ControllerId, WasmControllerStatus)> = if self.fence.is_open() {
            candidates
                // Only while this replica may act for it: a shard lost or being given up is
                // the next holder's to write.
                .filter(|(id, _)| self.fence_of(id).is_open())
                .filter_map(|(id, m)| {
                    let mut status = desired(m, self.place_of(id), id.namespace.is_some());
                    keep_transition_times(&mut status, m.written.as_ref());
                    (m.written.as_ref() != Some(&status)
                        && which(&status)
                        && shown(&status, m.since.elapsed()))
                    .then(|| (id.clone(), status))
                })
                .collect()
        } else {
            Vec::new() // the new leader writes them now
        };
        let client = self.client.clone();
        let writes = self.writes.clone();
        async move {
            let (count, writing) = (changed.len(), std::time::Instant::now());
            let written: Vec<StatusWritten> = futures::stream::iter(changed)
                .map(|(id, status)| {
                    let client = &client;
                    // The tenant's turn at the replica's writes, as its controllers' writes
                    // wait for theirs (one more "controller" of the tenant); not had in time
                    // (a busy replica), it is written at a later tick instead.
                    let lane = writes.lane(
                        id.namespace.as_deref().unwrap_or_default(),
                        STATUS_LANE,
                        Counter::default(),
                    );
                    async move {
                        tokio::time::timeout(STATUS_TURN_WAIT, lane.take())
                            .await
                            .ok()?;
                        let result = write_status(client, &id, &status).await;
                        Some(StatusWritten(id, status, result))
                    }
                })
                .buffer_unordered(PARALLEL_STATUS_WRITES)
                .filter_map(std::future::ready)
                .collect()
                .await;
            if count > 0 {
                tracing::debug!(count, "statuses written in {:.2?}", writing.elapsed());
            }
            written
        }
    }

    /// Remembers what [`Manager::status_writes`] wrote, so that it is not written again.
    pub(super) fn record_written(&mut self, written: Vec<StatusWritten>) {
        for StatusWritten(id, status, result) in written {
            match result {
                Ok(()) => {
                    if let Some(m) = self.controllers.get_mut(&id) {
                        m.written = Some(status);
                    }
                }
                Err(e) => tracing::warn!(controller = %id, "could not write status: {e}"),
            }
        }
    }
}

/// One status write: the controller, the status, and whether the API server took it.
pub(super) struct StatusWritten(ControllerId, WasmControllerStatus, Result<(), kube::Error>);

/// Whether a status is settled: Ready, or why not — not a controller still starting or
/// waiting for its first list, whose status changes again in a moment.
pub(super) fn settled(status: &WasmControllerStatus) -> bool {
    status.conditions.iter().any(|c| {
        c.type_ == "Ready"
            && (c.status == "True"
                || (c.reason != Reason::WaitingForCaches.to_string()
                    && c.reason != Reason::Starting.to_string()))
    })
}

/// Whether a status is written now, `since` its controller was declared or its runner
/// started: settled, or unsettled for [`UNSETTLED_SHOWN_AFTER`] already.
fn shown(status: &WasmControllerStatus, since: std::time::Duration) -> bool {
    settled(status) || since >= UNSETTLED_SHOWN_AFTER
}

/// The name status writes have among a tenant's controllers at the replica's write scheduler.
const STATUS_LANE: &str = "(status)";

/// How long a status write waits for its tenant's turn before it is left to a later tick: the
/// manager waits for a batch of status writes, so a replica busy with writes must not hold it.
const STATUS_TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Status writes in flight at once.
const PARALLEL_STATUS_WRITES: usize = 32;

/// The merge patch that writes `status`: a field the status no longer has is sent as `null`,
/// or the API server would keep the old value (a `lastError` after the recovery).
fn status_patch(status: &WasmControllerStatus) -> serde_json::Value {
    let mut status = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    if let Some(fields) = status.as_object_mut() {
        for cleared in ["lastError", "moduleDigest", "replica", "shard", "rollout"] {
            fields.entry(cleared).or_insert(serde_json::Value::Null);
        }
        if let Some(rollout) = fields.get_mut("rollout").and_then(|r| r.as_object_mut()) {
            for cleared in ["candidate", "problem"] {
                rollout.entry(cleared).or_insert(serde_json::Value::Null);
            }
        }
    }
    json!({ "status": status })
}

async fn write_status(
    client: &Client,
    id: &ControllerId,
    status: &WasmControllerStatus,
) -> Result<(), kube::Error> {
    let patch = Patch::Merge(status_patch(status));
    let params = PatchParams::default();
    match &id.namespace {
        Some(ns) => Api::<WasmController>::namespaced(client.clone(), ns)
            .patch_status(&id.name, &params, &patch)
            .await
            .map(drop),
        None => Api::<ClusterWasmController>::all(client.clone())
            .patch_status(&id.name, &params, &patch)
            .await
            .map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cleared_last_error_is_sent_as_null() {
        let cleared = status_patch(&WasmControllerStatus::default());
        assert_eq!(cleared["status"]["lastError"], serde_json::Value::Null);
        assert!(
            cleared["status"]
                .as_object()
                .is_some_and(|s| s.contains_key("lastError")),
            "{cleared}"
        );
        let failing = status_patch(&WasmControllerStatus {
            last_error: Some("x: boom".into()),
            ..WasmControllerStatus::default()
        });
        assert_eq!(failing["status"]["lastError"], "x: boom");
        // A rollout ended (candidate removed) and a candidate's problem gone are cleared too.
        assert!(
            cleared["status"]
                .as_object()
                .is_some_and(|s| s.contains_key("rollout"))
        );
        let loaded = status_patch(&WasmControllerStatus {
            rollout: Some(crate::api::RolloutStatus {
                candidate: Some("sha256:ab".into()),
                ..Default::default()
            }),
            ..WasmControllerStatus::default()
        });
        let rollout = loaded["status"]["rollout"].as_object().unwrap();
        assert_eq!(rollout["problem"], serde_json::Value::Null);
        assert!(rollout.contains_key("problem"));
    }

    fn with_ready(status: bool, reason: Reason) -> WasmControllerStatus {
        WasmControllerStatus {
            conditions: vec![condition("Ready", status, reason, "m".into(), None)],
            ..WasmControllerStatus::default()
        }
    }

    #[test]
    fn a_status_is_settled_when_ready_or_stuck_not_while_starting_and_shown_when_either() {
        use std::time::Duration;
        assert!(settled(&with_ready(true, Reason::Running)));
        assert!(settled(&with_ready(false, Reason::Forbidden)));
        assert!(settled(&with_ready(false, Reason::ModuleNotReady)));
        assert!(!settled(&with_ready(false, Reason::WaitingForCaches)));
        assert!(!settled(&with_ready(false, Reason::Starting)));
        // Unsettled, it is shown once it has been for a while; settled, at once.
        let waiting = with_ready(false, Reason::WaitingForCaches);
        assert!(!shown(&waiting, Duration::from_secs(1)));
        assert!(shown(&waiting, UNSETTLED_SHOWN_AFTER));
        assert!(shown(&with_ready(true, Reason::Running), Duration::ZERO));
        assert!(shown(&with_ready(false, Reason::Forbidden), Duration::ZERO));
        assert!(!settled(&WasmControllerStatus::default()));
    }
}
