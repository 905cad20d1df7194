//! Starting and stopping controllers: many at once in chunks (their modules read, their
//! setups run and their statuses written side by side), stopped together within one
//! timeout, retried with backoff when they cannot start.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use crate::api::Reason;
use crate::host::{Runner, Stored};
use crate::sandbox::GuestPre;

use super::setup::ReadAccess;
use super::{ControllerId, Manager, PARALLEL_STARTS, Problem, status};

/// Controllers started together before their statuses are written (see
/// [`Manager::start_all`]).
const START_CHUNK: usize = 4 * PARALLEL_STARTS;

/// How many controllers starting together list every saved states' object once, instead of
/// one list each (a runtime's start, shards taken over).
const LIST_STATES_FROM: usize = PARALLEL_STARTS;

/// How long a stopping controller's running reconciles may take to finish; then they are
/// aborted.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long setting one controller up may take (discovery of each kind it declares, access
/// reviews): what a spec names cannot hold the manager longer.
pub(super) const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Backoff of a controller that cannot start.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Retry {
    failures: u32,
    pub(super) at: Option<tokio::time::Instant>,
}

impl Manager {
    /// The runner of a controller that puts its finalizer on parents, if it runs here: when
    /// the controller goes away, its finalizers are removed once the runner has stopped (so
    /// that no reconcile adds one back), and no parent waits for a controller that no longer
    /// exists.
    pub(super) fn finalizing_runner(&self, id: &ControllerId) -> Option<Arc<Runner>> {
        let m = self.controllers.get(id)?;
        let runner = m.life.runner()?;
        (m.spec.finalize && self.fence_of(id).is_open()).then(|| runner.clone())
    }

    pub(super) async fn stop(&mut self, id: &ControllerId) {
        self.stop_all(std::slice::from_ref(id), HashMap::new());
    }

    /// Stops these controllers without waiting for them: each stops taking work at once, and
    /// a task of its own lets its running reconciles finish within [`STOP_TIMEOUT`], aborts
    /// them past it, and then, for those in `releasing`, removes their finalizers from the
    /// parents (after the stop, so that no reconcile adds one back). Nothing a tenant's guest
    /// does while it finishes holds the manager; a controller started again meanwhile (a
    /// changed spec) takes no work from the old runner, whose last reconciles may still end
    /// beside its first ones.
    pub(super) fn stop_all(
        &mut self,
        ids: &[ControllerId],
        mut releasing: HashMap<ControllerId, Arc<Runner>>,
    ) {
        for id in ids {
            let Some((runner, task)) = self.controllers.get_mut(id).and_then(|m| m.life.stop())
            else {
                continue;
            };
            runner.stop();
            let release = releasing.remove(id);
            let id = id.clone();
            tokio::spawn(async move {
                finish(&id, task).await;
                drop(runner);
                if let Some(runner) = release {
                    release_finalizers(runner).await;
                }
            });
        }
    }

    /// Stops these controllers and waits until they have (shutting down: the process is
    /// about to exit).
    pub(super) async fn stop_all_and_wait(&mut self, ids: &[ControllerId]) {
        let stopping: Vec<_> = ids
            .iter()
            .filter_map(|id| {
                let (runner, task) = self.controllers.get_mut(id)?.life.stop()?;
                runner.stop();
                Some((id.clone(), task))
            })
            .collect();
        futures::future::join_all(stopping.into_iter().map(|(id, task)| async move {
            finish(&id, task).await;
        }))
        .await;
        self.watches.release_unused();
    }

    /// Loads the modules and starts these controllers; problems end up in their statuses.
    /// Modules are read [`PARALLEL_STARTS`] at once and compiled once per digest; the setups,
    /// which wait on the API server (discovery, access reviews), run [`PARALLEL_STARTS`] at
    /// once. Many controllers are started in chunks of [`START_CHUNK`], and the settled
    /// statuses of one chunk are written while the next but one is started (its modules read,
    /// its controllers set up): both wait on the API server, and a thousand controllers
    /// starting would otherwise show no status until the last one started.
    pub(super) async fn start_all(&mut self, ids: &[ControllerId]) {
        if ids.is_empty() {
            return;
        }
        let mut unique = HashSet::new();
        let over = over_namespace_cap(
            self.controllers.keys(),
            self.config.max_controllers_per_namespace,
        );
        let ids: Vec<ControllerId> = ids
            .iter()
            .filter(|id| unique.insert(*id))
            .filter(|id| !self.refuse_over_cap(id, &over))
            .cloned()
            .collect();
        let stored = self.stored_states(&ids).await;
        let (mut writing, mut set_up) = (None, None);
        for chunk in ids.chunks(START_CHUNK) {
            // Starting many is progress too: each chunk is bounded (reads, setups).
            self.metrics.manager_beat(true);
            // A chunk's statuses are written while the next but one starts: both wait on the
            // API server, and neither needs the other's answers.
            let start = self.start_chunk(chunk, stored.as_ref());
            match writing.take() {
                Some(writes) => {
                    let (written, ()) = futures::future::join(writes, start).await;
                    self.record_written(written);
                }
                None => start.await,
            }
            // The chunk before's statuses, now that its runners had this chunk's setup to
            // find their caches synced: settled (Ready), they are written here, not left to
            // the status ticks, which would hold the starts up writing them.
            if ids.len() > START_CHUNK
                && let Some(before) = set_up.replace(chunk)
            {
                writing = Some(self.status_writes(Some(before), status::settled));
            }
        }
        if let Some(writes) = writing {
            let written = writes.await;
            self.record_written(written);
        }
        if let Some(last) = set_up {
            let written = self.status_writes(Some(last), status::settled).await;
            self.record_written(written);
        }
    }

    /// Reads the modules of `chunk`, loads them and sets its controllers up.
    async fn start_chunk(&mut self, chunk: &[ControllerId], stored: Option<&Stored>) {
        let fetched = self.read_modules(chunk).await;
        self.load_fetched(fetched);
        self.retain_modules();
        self.set_up_all(chunk, stored).await;
    }

    /// Refuses a controller past its namespace's cap (its status says so); whether it was.
    fn refuse_over_cap(&mut self, id: &ControllerId, over: &HashSet<ControllerId>) -> bool {
        if !over.contains(id) {
            return false;
        }
        let cap = self.config.max_controllers_per_namespace;
        if let Some(m) = self.controllers.get_mut(id) {
            m.life.refuse(Problem::new(
                Reason::TooManyControllers,
                format!(
                    "namespace {} has more WasmControllers than the {cap} this runtime's operator allows per namespace (`kubewasm run --max-controllers-per-namespace`); the first {cap} by name run: remove one",
                    id.namespace.as_deref().unwrap_or_default()
                ),
            ));
        }
        true
    }

    /// Which of these controllers have saved states, from one list of every shard object,
    /// when at least [`LIST_STATES_FROM`] start together ([`Stored`]); `None` otherwise, or
    /// when that list could not say (each reads its own then).
    pub(super) async fn stored_states(&self, ids: &[ControllerId]) -> Option<Stored> {
        if ids.len() < LIST_STATES_FROM {
            return None;
        }
        let wanted: HashSet<(String, String)> = ids
            .iter()
            .filter_map(|id| self.controllers.get(id)?.state.place())
            .collect();
        Stored::list(&self.client, self.config.namespace.as_deref(), &wanted).await
    }

    /// Sets up and runs these controllers (their modules loaded), [`PARALLEL_STARTS`] at once;
    /// `stored` says which have saved states, when known.
    pub(super) async fn set_up_all(&mut self, ids: &[ControllerId], stored: Option<&Stored>) {
        let loaded: Vec<_> = ids
            .iter()
            .filter_map(|id| {
                let m = self.controllers.get(id)?;
                Some((
                    id.clone(),
                    (m.spec.clone(), m.plan.clone(), m.uid.clone()),
                    m.state.clone(),
                    m.life.guest()?.clone(),
                ))
            })
            .collect();
        let this = &*self;
        let set_up: Vec<_> = futures::stream::iter(loaded)
            .map(|(id, (spec, plan, uid), state, guest)| async move {
                let setup = this.setup(&id, (&spec, &plan, uid.as_deref()), (state, stored));
                let result = tokio::time::timeout(SETUP_TIMEOUT, setup)
                    .await
                    .unwrap_or_else(|_| {
                        Err(Problem::new(
                            Reason::SetupTimedOut,
                            format!(
                                "setting the controller up (discovery of its kinds, access reviews) took more than {}s; retrying",
                                SETUP_TIMEOUT.as_secs()
                            ),
                        ))
                    });
                (id, guest, result)
            })
            .buffer_unordered(PARALLEL_STARTS)
            .collect()
            .await;
        for (id, guest, result) in set_up {
            self.started(&id, guest, result);
        }
    }

    /// Runs a controller that was set up, or records why it could not be.
    fn started(
        &mut self,
        id: &ControllerId,
        guest: Arc<GuestPre>,
        result: Result<(crate::host::ControllerSetup, ReadAccess), Problem>,
    ) {
        let Some(m) = self.controllers.get_mut(id) else {
            return;
        };
        match result {
            Ok((setup, access)) => {
                let runner = Runner::new(setup, guest, m.life.image().map(str::to_owned));
                let candidate = m.life.candidate();
                runner.set_candidate(candidate.map(|(g, i)| (g.clone(), i.map(str::to_owned))));
                let task = tokio::spawn(runner.clone().run());
                m.life.start(runner, task, access);
                m.since = std::time::Instant::now();
                tracing::info!(controller = %id, "controller started");
            }
            Err(problem) => {
                // Said once per new problem: retries of the same one stay quiet.
                let (reason, message) = (problem.reason, problem.message.clone());
                if m.life.refuse(problem) {
                    tracing::warn!(controller = %id, %reason, "controller cannot start: {message}");
                }
            }
        }
    }

    /// Tries again to start the controllers that could not start and whose backoff is over
    /// (see [`retry_delay`]).
    pub(super) async fn retry_failed(&mut self) {
        let now = tokio::time::Instant::now();
        let ids: Vec<ControllerId> = self
            .controllers
            .iter()
            .filter(|(_, m)| !m.life.running() && m.life.retry.at.is_none_or(|at| at <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            if let Some(problem) = self.controllers.get(id).and_then(|m| m.life.refused())
                && problem.reason == Reason::KindNotFound
            {
                let spec = &self.controllers[id].spec;
                self.resolver
                    .forget(&spec.parent.api_version, &spec.parent.kind)
                    .await;
            }
        }
        self.start_all(&ids).await;
        let cap = self
            .config
            .retry_interval
            .max(self.config.access_review_ttl);
        for id in &ids {
            if let Some(m) = self.controllers.get_mut(id) {
                m.life.retry = if m.life.running() {
                    Retry::default()
                } else {
                    let failures = m.life.retry.failures.saturating_add(1);
                    let delay = retry_delay(failures, self.config.retry_interval, cap);
                    Retry {
                        failures,
                        at: Some(tokio::time::Instant::now() + delay),
                    }
                };
            }
        }
    }
}

/// How long removing a gone controller's finalizers from its parents may take (a write per
/// parent, within the controller's write budget).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(120);

/// Removes a gone controller's finalizers from its parents beside the manager loop (the
/// runner has stopped): as many parents as the tenant has, each a write within its budget,
/// so the manager never waits for them; bounded by [`RELEASE_TIMEOUT`].
pub(super) async fn release_finalizers(runner: Arc<Runner>) {
    if tokio::time::timeout(RELEASE_TIMEOUT, runner.release_finalizers())
        .await
        .is_err()
    {
        tracing::warn!(
            "releasing a removed controller's finalizers took more than {RELEASE_TIMEOUT:?}: the rest stay; remove them with kubectl patch (metadata.finalizers)"
        );
    }
}

/// Waits for a stopping runner's task within [`STOP_TIMEOUT`]; past it the task is aborted
/// (its reconciles with it, as they are owned by it), so that nothing of a removed or revoked
/// controller writes any more.
pub(super) async fn finish(id: &ControllerId, mut task: tokio::task::JoinHandle<()>) {
    if tokio::time::timeout(STOP_TIMEOUT, &mut task).await.is_err() {
        tracing::warn!(controller = %id, "stopping controller still reconciling after {STOP_TIMEOUT:?}: aborted");
        task.abort();
    }
}

/// The namespaced controllers past `cap` in their namespace: the first `cap` by name may run,
/// so which ones run does not depend on the order they were declared or seen.
fn over_namespace_cap<'a>(
    ids: impl Iterator<Item = &'a ControllerId>,
    cap: usize,
) -> HashSet<ControllerId> {
    let mut by_namespace: std::collections::HashMap<&str, Vec<&ControllerId>> =
        std::collections::HashMap::new();
    for id in ids {
        if let Some(ns) = &id.namespace {
            by_namespace.entry(ns).or_default().push(id);
        }
    }
    by_namespace
        .into_values()
        .filter(|ids| ids.len() > cap)
        .flat_map(|mut ids| {
            ids.sort();
            ids.into_iter().skip(cap).cloned()
        })
        .collect()
}

/// How long to wait after the `failures`-th failed start in a row: `interval` doubling per
/// failure, at most `cap`.
fn retry_delay(failures: u32, interval: Duration, cap: Duration) -> Duration {
    interval
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_runs_its_first_controllers_by_name_up_to_the_cap() {
        let id = |ns: Option<&str>, name: &str| ControllerId {
            namespace: ns.map(str::to_owned),
            name: name.into(),
        };
        let all = [
            id(Some("a"), "c"),
            id(Some("a"), "a"),
            id(Some("a"), "b"),
            id(Some("b"), "z"),
            id(None, "x"),
            id(None, "y"),
            id(None, "w"),
        ];
        let over = over_namespace_cap(all.iter(), 2);
        assert_eq!(over, HashSet::from([id(Some("a"), "c")]));
        assert!(over_namespace_cap(all.iter(), 3).is_empty());
    }

    #[test]
    fn a_controller_that_cannot_start_is_retried_with_backoff_up_to_the_cap() {
        let (interval, cap) = (Duration::from_secs(5), Duration::from_secs(30));
        let delays: Vec<u64> = (1..=6)
            .map(|n| retry_delay(n, interval, cap).as_secs())
            .collect();
        assert_eq!(delays, [5, 10, 20, 30, 30, 30]);
        assert_eq!(retry_delay(u32::MAX, interval, cap), cap);
    }
}
