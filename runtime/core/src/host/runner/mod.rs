//! One live controller: feeds its work queue from the shared watches, runs the reconcile
//! pipeline for each key ([`pipeline`]: prepare, call, apply, settle), and keeps the counters
//! its status reports. Its writes outside the guest's actions (finalizers, forgotten state)
//! are in [`writes`]; every write passes the controller's [`WriteGate`].

mod capsule;
mod failing;
mod pipeline;
mod shadowing;
mod spins;
mod writes;

pub use failing::Failing;
pub use shadowing::CANDIDATE_DIFFERS;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use kube::Client;
use kubewasm_guest_sdk::query;
use kubewasm_guest_sdk::selector::Selector;
use tokio::sync::{Semaphore, broadcast};
use tracing::Instrument;

use crate::api::Problem;
use crate::controller::{Backoff, Cached, Change, Kind, ObjectKey, Watch, WorkQueue, WriteGate};
use crate::metrics::Metrics;
use crate::sandbox::{GuestPre, Limits, MAX_GUEST_MESSAGE_BYTES, Ready, Sandbox, guest_text};

use super::actions::{ChildKind, EventRecorder, HeldStatuses};
use super::cache::CacheSource;
use super::finalizer::Finalizer;
use super::grants::Permissions;
use super::kinds::DeclaredKinds;
use super::state::GuestState;
use crate::sync::{Locks as _, RwLocks as _};

/// Most bytes of a failure's message kept for the status (`lastError`, `Degraded`) and the
/// log: room for a guest's own bounded message and the API server's words around it.
pub const MAX_LAST_ERROR_BYTES: usize = 2 * MAX_GUEST_MESSAGE_BYTES;

/// Counters and the last error, for the controller's status.
#[derive(Debug, Default)]
pub struct Stats {
    /// Reconcile calls made.
    pub reconciles: AtomicU64,
    /// Reconcile calls that failed.
    pub failures: AtomicU64,
    /// The objects failing now, and why.
    pub failing: Mutex<Failing>,
    /// Parents being deleted whose clean-up the guest has not said done.
    pub finalizing: Mutex<std::collections::BTreeSet<ObjectKey>>,
    /// Kinds the guest applied without an owner (granted, not declared in `spec.children`):
    /// at most the kinds it declared.
    pub unowned: Mutex<std::collections::BTreeSet<String>>,
    /// What the API server said when the controller's last Event was refused (403), until
    /// one is recorded again.
    pub events_refused: Mutex<Option<String>>,
}

impl Stats {
    /// Keeps what `outcome` says of Events: refused (why), or recorded (no longer refused).
    pub fn events(&self, outcome: &super::actions::Outcome) {
        let mut refused = self.events_refused.locked();
        if let Some(why) = &outcome.events_refused {
            *refused = Some(crate::sandbox::guest_text(why, MAX_LAST_ERROR_BYTES).into_owned());
        } else if outcome.events_recorded {
            *refused = None;
        }
    }
}

/// Everything a running controller needs; built by the manager from a WasmController.
pub struct ControllerSetup {
    /// `namespace/name` (or `name` for cluster controllers).
    pub id: String,
    /// The namespace a WasmController is confined to; `None` for cluster controllers.
    pub namespace: Option<String>,
    /// The parent kind's watch.
    pub parent: Arc<Watch>,
    /// Only parents matching this selector.
    pub parent_selector: Option<Selector>,
    /// Owned kinds and their watches.
    pub children: Vec<(ChildKind, Arc<Watch>)>,
    /// Caches the guest may read from.
    pub reads: CacheSource,
    /// Declared permissions.
    pub permissions: Arc<Permissions>,
    /// Per-call limits.
    pub limits: Limits,
    /// Reconciles of this controller at once.
    pub concurrency: usize,
    /// Reconcile every parent at least this often.
    pub resync: Duration,
    /// The shortest `requeue-after` honoured (a guest asking for less gets this).
    pub requeue_floor: Duration,
    /// Every API write this controller makes passes here: its budget (the operator's
    /// `--max-writes-per-second`), then the fence (closed when this process may no longer act).
    pub writes: WriteGate,
    /// Client impersonating the controller's ServiceAccount.
    pub client: Client,
    /// Every kind the controller declared, resolved when it started.
    pub kinds: DeclaredKinds,
    /// The shared sandbox.
    pub sandbox: Sandbox,
    /// Where reconcile counts and durations go.
    pub metrics: Arc<Metrics>,
    /// The state the guest saves per object (kept across restarts of the controller).
    pub state: Arc<GuestState>,
    /// This controller's finalizer (`None` when its name cannot make one).
    pub finalizer: Option<Finalizer>,
    /// Whether the controller asked for its finalizer on its parents (`spec.finalize`);
    /// when not, a finalizer of it left on a parent is removed.
    pub finalize: bool,
    /// Where its failed reconciles are kept, for its team to replay.
    pub capsules: super::capsules::Capsules,
    /// Its candidate module and what comparing it found (`spec.candidate`).
    pub shadow: super::shadow::Shadow,
    /// The WasmController (or ClusterWasmController) itself, for the Events about it.
    pub controller_ref: Option<k8s_openapi::api::core::v1::ObjectReference>,
}

/// How soon an object is looked at again while the caches list its namespace again.
const WITHHELD_RETRY: Duration = Duration::from_secs(1);

/// How soon an object is looked at again when its reconcile could not start because the fence
/// was shut: a shard's fence shuts by time when a renewal is late and opens again when it
/// lands; when the shard is lost instead, the runner is stopped before then.
const FENCED_RETRY: Duration = Duration::from_secs(1);

/// Most parents listed in the status as waiting for clean-up.
pub const MAX_LISTED_FINALIZING: usize = 16;

/// What brought a key to the queue: a change of a parent, or of a child (the key is then
/// its controlling owner's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Parent,
    Child,
}

/// A running controller.
pub struct Runner {
    setup: ControllerSetup,
    guest: RwLock<Arc<GuestPre>>,
    queue: WorkQueue<ObjectKey>,
    backoff: Backoff<ObjectKey>,
    /// Keys that bring themselves back, backing off ([`spins`]).
    spins: spins::Spins<ObjectKey>,
    stats: Stats,
    synced: std::sync::atomic::AtomicBool,
    events: EventRecorder,
    /// Parents whose last status was held back because a child write brings them back.
    held: HeldStatuses,
    /// Each parent as the last successful reconcile of it saw it (the request's `previous`):
    /// shared with the cache while unchanged, so at most one extra version per object.
    reconciled: Mutex<HashMap<ObjectKey, Arc<Cached>>>,
    /// Keys whose last reconcile the guest failed with a permanent error, and on what.
    permanent: Mutex<HashMap<ObjectKey, pipeline::Attempt>>,
    /// Its next instance, made ahead while it is busy.
    ready: Ready,
}

impl Runner {
    /// A controller running `guest`; call [`Runner::run`] to start it.
    pub fn new(setup: ControllerSetup, guest: Arc<GuestPre>, image: Option<String>) -> Arc<Runner> {
        if let Some(image) = image {
            setup
                .capsules
                .pulled_as(format!("sha256:{}", guest.digest().hex()), image);
        }
        let events = EventRecorder::new(setup.metrics.events_dropped(&setup.id));
        Arc::new(Runner {
            setup,
            guest: RwLock::new(guest),
            queue: WorkQueue::default(),
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(300)),
            spins: spins::Spins::default(),
            stats: Stats::default(),
            synced: std::sync::atomic::AtomicBool::new(false),
            events,
            held: HeldStatuses::default(),
            reconciled: Mutex::default(),
            permanent: Mutex::default(),
            ready: Ready::new(),
        })
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Whether the caches this controller reads have listed once (it reconciles only then).
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// The kinds whose caches this controller waits for, for messages.
    pub fn watched_kinds(&self) -> Vec<String> {
        // Parent, children and read grants: the runner waits for all of them.
        self.setup.reads.kinds()
    }

    /// The resources (`plural.group`) whose caches have not listed yet, for messages.
    pub fn unlisted(&self) -> Vec<String> {
        self.setup.reads.unlisted()
    }

    /// Why the objects of this controller's namespace are held back from it, if they are (a
    /// WasmController; a ClusterWasmController is only not handed those of such namespaces).
    pub fn withheld(&self) -> Option<crate::controller::Withheld> {
        self.setup
            .namespace
            .as_deref()
            .and_then(|ns| self.setup.parent.withheld(ns))
    }

    /// The module now running.
    pub fn guest(&self) -> Arc<GuestPre> {
        self.guest.read_locked().clone()
    }

    /// Swaps in a new module (hot reload) and reconciles every parent with it.
    /// `image` is the image it was pulled as (by manifest digest), if it came from a registry.
    pub fn swap_guest(&self, guest: Arc<GuestPre>, image: Option<String>) {
        if let Some(image) = image {
            (self.setup.capsules).pulled_as(format!("sha256:{}", guest.digest().hex()), image);
        }
        *self.guest.write_locked() = guest;
        self.enqueue_all();
    }

    /// Compares `candidate` (pulled as `image`) with the live module from now on (`None`:
    /// compares nothing); a new one is compared on every parent at once.
    pub fn set_candidate(&self, candidate: Option<(Arc<GuestPre>, Option<String>)>) {
        let new = candidate.as_ref().map(|(g, _)| g.digest()) != self.setup.shadow.candidate();
        let some = candidate.is_some();
        self.setup.shadow.set(candidate);
        if new && some && self.synced() {
            self.enqueue_all();
        }
    }

    /// Its candidate and what comparing it found.
    pub fn shadow(&self) -> &super::shadow::Shadow {
        &self.setup.shadow
    }

    /// Stops handing out work; running reconciles finish.
    pub fn stop(&self) {
        self.queue.close();
    }

    /// What a reconcile of `key` would run on now: the parent as cached, and the module.
    fn inputs(&self, key: &ObjectKey) -> spins::Inputs {
        spins::Inputs {
            version: self
                .setup
                .parent
                .get(key)
                .and_then(|p| p.metadata.resource_version.clone()),
            module: self.guest().digest(),
        }
    }

    /// Whether a key is one this controller reconciles: in its namespace (a WasmController),
    /// and a valid Kubernetes name — keys also come from what tenants write (a child's
    /// ownerReference, a saved state's key), and a key lands in log lines, the status and the
    /// guest's state.
    fn in_scope(&self, key: &ObjectKey) -> bool {
        let parent_namespaced = self.setup.parent.kind().namespaced;
        in_scope(self.setup.namespace.as_deref(), parent_namespaced, key)
    }

    /// Every parent in the cache, and every object the controller keeps state for that is not
    /// there: gone while the runtime was not watching (deleted while it was down, or between
    /// two of its watches), it is reconciled once without `parent`, which tells the guest and
    /// then forgets the state.
    fn enqueue_all(&self) {
        let store = self.setup.parent.store();
        for parent in store.state() {
            let key = ObjectKey::of(&parent);
            if self.in_scope(&key) {
                self.queue.add(key);
            }
        }
        for saved in self.setup.state.keys() {
            let key = ObjectKey::parse(&saved);
            if self.in_scope(&key) && self.setup.parent.get(&key).is_none() {
                self.queue.add(key);
            }
        }
    }

    /// Runs until [`Runner::stop`]: waits for the caches, then reconciles.
    pub async fn run(self: Arc<Self>) {
        let parent_changes = self.setup.parent.subscribe();
        let child_changes: Vec<_> = self
            .setup
            .children
            .iter()
            .map(|(_, w)| w.subscribe())
            .collect();
        // Parent, children and read grants: a first reconcile must not read an empty cache.
        let synced = async {
            self.setup.parent.ready().await;
            for (_, w) in &self.setup.children {
                w.ready().await;
            }
            self.setup.reads.ready().await;
        };
        tokio::select! {
            _ = synced => {}
            // Stopped before the caches ever listed (e.g. the runtime may not watch a kind).
            _ = self.queue.closed() => return,
        }
        self.synced.store(true, Ordering::Relaxed);
        tracing::info!(
            controller = self.setup.id.as_str(),
            "caches synced, starting to reconcile"
        );
        self.enqueue_all();

        let mut feeders = vec![tokio::spawn(
            self.clone().feed(parent_changes, Trigger::Parent),
        )];
        for rx in child_changes {
            feeders.push(tokio::spawn(self.clone().feed(rx, Trigger::Child)));
        }
        feeders.push(tokio::spawn(self.clone().resync()));

        let permits = Arc::new(Semaphore::new(self.setup.concurrency.max(1)));
        // Owned here, so that aborting this task (leadership lost) aborts them all.
        let mut running = tokio::task::JoinSet::new();
        while let Some(key) = self.queue.next().await {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            while running.try_join_next().is_some() {}
            let this = self.clone();
            running.spawn(async move {
                this.reconcile(&key).await;
                this.queue.done(&key);
                drop(permit);
            });
        }
        for f in feeders {
            f.abort();
        }
        // Let running reconciles finish, then write the saves they left behind (a stop loses
        // none; a fence shut meanwhile sends none).
        while running.join_next().await.is_some() {}
        let failed = self.setup.state.flush().await;
        if failed > 0 {
            tracing::warn!(
                controller = self.setup.id.as_str(),
                "stopping: {failed} shards of saved states could not be written; their objects are reconciled again by whoever runs this controller next"
            );
        }
    }

    async fn feed(self: Arc<Self>, mut rx: broadcast::Receiver<Arc<Change>>, trigger: Trigger) {
        let parent = self.setup.parent.kind();
        loop {
            match rx.recv().await {
                Ok(change) => {
                    let key = key_of(&change, trigger, parent);
                    if let Some(key) = key.filter(|k| self.in_scope(k)) {
                        self.queue.add(key);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => self.enqueue_all(),
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    async fn resync(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.setup.resync);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.enqueue_all();
        }
    }

    async fn reconcile(&self, key: &ObjectKey) {
        if !self.setup.writes.is_open() {
            // Not now: this replica may not act for the controller's shard at the moment.
            tracing::debug!(controller = self.setup.id.as_str(), object = %key, "held back for a second: the fence is shut (a renewal is late, or the shard is being given up)");
            self.queue.add_after(key.clone(), FENCED_RETRY);
            return;
        }
        // A namespace held back from the caches: its objects are not handed to any controller
        // (the cache lacks them, and a guest would take that for deletions). The watch of the
        // parent kind announces every object again when it has listed them again; the other
        // watches may still be listing then, so the key is looked at again soon.
        if let Some(ns) = &key.namespace
            && let Some(why) = self.setup.parent.withheld(ns)
        {
            tracing::debug!(controller = self.setup.id.as_str(), object = %key, "not reconciled: {why}");
            if why == crate::controller::Withheld::Relisting {
                self.queue.add_after(key.clone(), WITHHELD_RETRY);
            }
            return;
        }
        // A key that brought itself back (a write it watches, a requeue under 1 s) with
        // nothing changed from outside waits out its backoff, whatever brought it now.
        if let Some(wait) = self.spins.hold(key, &self.inputs(key)) {
            self.setup.metrics.damped(&self.setup.id);
            tracing::debug!(controller = self.setup.id.as_str(), object = %key, wait_ms = wait.as_millis(), "held back: its last reconcile brought it back by itself (a write it watches, or a requeue-after under 1 s) and nothing changed since");
            self.queue.add_after(key.clone(), wait);
            return;
        }
        // A permanent error of the guest's stands until the parent or the module changes (the
        // SDK's contract): a resync or a child's change does not call it again.
        if self.still_failing(key) {
            return;
        }
        let span =
            tracing::info_span!("reconcile", controller = self.setup.id.as_str(), object = %key);
        let in_flight = self.setup.metrics.start_reconcile();
        let started = std::time::Instant::now();
        let result = self.pipeline(key).instrument(span.clone()).await;
        drop(in_flight);
        let outcome = match &result {
            Ok(_) => "success",
            Err(failure) => failure.problem.reason.as_str(),
        };
        self.setup
            .metrics
            .reconciled(&self.setup.id, outcome, started.elapsed());
        let _enter = span.enter();
        match result {
            Ok(Some(after)) => {
                self.backoff.succeeded(key);
                self.queue.add_after(key.clone(), after);
            }
            Ok(None) => self.backoff.succeeded(key),
            Err(pipeline::Failure {
                problem: Problem { reason, message },
                permanent,
            }) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                // Guest text in it is bounded already; API server messages around it (which
                // may quote what the guest sent) are not: escaped and bounded as a whole.
                let message = guest_text(&message, MAX_LAST_ERROR_BYTES);
                let last =
                    guest_text(&format!("{key}: {message}"), MAX_LAST_ERROR_BYTES).into_owned();
                (self.stats.failing.locked()).failed(key.clone(), Problem::new(reason, last));
                match permanent {
                    Some(attempt) => {
                        tracing::warn!(
                            reason = reason.as_str(),
                            "reconcile failed with a permanent error, not retried until the object or the module changes: {message}"
                        );
                        self.backoff.succeeded(key);
                        self.permanent.locked().insert(key.clone(), attempt);
                    }
                    None => {
                        let delay = self.backoff.failed(key.clone());
                        tracing::warn!(reason = reason.as_str(), retry_in = ?delay, "reconcile failed: {message}");
                        self.queue.add_after(key.clone(), delay);
                    }
                }
                return;
            }
        }
        self.permanent.locked().remove(key);
        self.stats.failing.locked().succeeded(key);
    }
}

/// Whether a key is one a controller of `namespace` (`None`: a cluster controller) whose
/// parent kind is `parent_namespaced` (or not) reconciles: of the parent kind's scope (a
/// namespace exactly when the kind has them), in the controller's namespace, and a valid
/// Kubernetes name — keys also come from what tenants write (a child's ownerReference, a
/// saved state's key), and a key lands in log lines, the status and the guest's state. A key
/// of the wrong scope would be a forgery: `team-a/kube-system` for a cluster controller of
/// Namespaces named the real Namespace `kube-system` in a request that says `team-a`.
fn in_scope(namespace: Option<&str>, parent_namespaced: bool, key: &ObjectKey) -> bool {
    let scoped = key.namespace.is_some() == parent_namespaced;
    let placed = match namespace {
        Some(ns) => key.namespace.as_deref() == Some(ns),
        None => true,
    };
    scoped
        && placed
        && query::validate_name(&key.name).is_ok()
        && key
            .namespace
            .as_deref()
            .is_none_or(|ns| query::validate_namespace(ns).is_ok())
}

/// The key a change brings to the queue: the object itself for a parent; for a child, its
/// controlling owner of the parent kind, in the child's namespace if the parent kind is
/// namespaced (a cluster-scoped parent has none, whatever namespace its child is in).
fn key_of(change: &Change, trigger: Trigger, parent: &Kind) -> Option<ObjectKey> {
    let resource = &parent.resource;
    match trigger {
        Trigger::Parent => Some(change.key.clone()),
        Trigger::Child => change
            .owners
            .iter()
            .find(|o| {
                o.controller == Some(true)
                    && o.kind == resource.kind
                    && o.api_version == resource.api_version
            })
            .map(|o| ObjectKey {
                namespace: change.key.namespace.clone().filter(|_| parent.namespaced),
                name: o.name.clone(),
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn key(namespace: Option<&str>, name: &str) -> ObjectKey {
        ObjectKey {
            namespace: namespace.map(Into::into),
            name: name.into(),
        }
    }

    fn kind(api_version: &str, kind: &str, namespaced: bool) -> Kind {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        Kind {
            resource: kube::api::ApiResource {
                group: group.into(),
                version: version.into(),
                api_version: api_version.into(),
                kind: kind.into(),
                plural: format!("{}s", kind.to_lowercase()),
            },
            namespaced,
            has_status: true,
        }
    }

    #[test]
    fn a_namespaced_controller_takes_only_valid_keys_of_its_namespace() {
        assert!(in_scope(Some("team"), true, &key(Some("team"), "a")));
        assert!(!in_scope(Some("team"), true, &key(Some("other"), "a")));
        assert!(!in_scope(Some("team"), true, &key(None, "a")));
        assert!(in_scope(None, true, &key(Some("other"), "a")));
        assert!(in_scope(None, false, &key(None, "cluster-wide")));
        // Names written by tenants (an ownerReference) must be Kubernetes names.
        assert!(!in_scope(
            Some("team"),
            true,
            &key(Some("team"), &"x".repeat(1 << 20))
        ));
        assert!(!in_scope(
            Some("team"),
            true,
            &key(Some("team"), "a\nforged")
        ));
        assert!(!in_scope(None, true, &key(Some("Bad_NS"), "a")));
    }

    /// The forgery of issue 38: team-a writes a ConfigMap whose controlling owner is
    /// Namespace `kube-system`, to make a ClusterWasmController of Namespaces reconcile
    /// `team-a/kube-system` — the real Namespace (the cache ignored the key's namespace) in a
    /// request that says `team-a`, with a saved state of its own.
    #[test]
    fn a_cluster_controllers_key_cannot_be_forged_into_another_namespace() {
        let namespaces = kind("v1", "Namespace", false);
        let forged = key(Some("team-a"), "kube-system");
        // A key of the wrong scope, from any source (a child, a saved state), is refused.
        assert!(!in_scope(None, false, &forged));
        assert!(in_scope(None, false, &key(None, "kube-system")));
        assert!(!in_scope(None, true, &key(None, "kube-system")));
        // A child's change brings the owner's own key, never one in the child's namespace.
        let change = Change {
            key: key(Some("team-a"), "bait"),
            owners: vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Namespace".into(),
                name: "kube-system".into(),
                uid: "uid-of-kube-system".into(),
                controller: Some(true),
                ..OwnerReference::default()
            }],
        };
        let brought = key_of(&change, Trigger::Child, &namespaces);
        assert_eq!(brought, Some(key(None, "kube-system")));
        assert!(brought.is_some_and(|k| in_scope(None, false, &k)));
        // The saved state's key, as `enqueue_all` reads it back, is refused too.
        assert!(!in_scope(
            None,
            false,
            &ObjectKey::parse(&forged.to_string())
        ));
    }

    #[test]
    fn a_child_change_brings_its_controlling_parent_of_the_parent_kind() {
        let owner = |kind: &str, name: &str, controller: bool| OwnerReference {
            api_version: "example.com/v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller: Some(controller),
            ..OwnerReference::default()
        };
        let change = Change {
            key: key(Some("team"), "child"),
            owners: vec![
                owner("HelloWorld", "not-controller", false),
                owner("Other", "other-kind", true),
                owner("HelloWorld", "parent", true),
            ],
        };
        let hello = kind("example.com/v1", "HelloWorld", true);
        assert_eq!(
            key_of(&change, Trigger::Child, &hello),
            Some(key(Some("team"), "parent"))
        );
        assert_eq!(
            key_of(&change, Trigger::Parent, &hello),
            Some(key(Some("team"), "child"))
        );
        assert_eq!(
            key_of(&change, Trigger::Child, &kind("v1", "ConfigMap", true)),
            None
        );
    }
}
