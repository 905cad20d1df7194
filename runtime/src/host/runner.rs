//! One live controller: feeds its work queue from the shared watches, calls the guest for each
//! key, carries out the actions, and keeps the counters its status reports.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use kube::Client;
use kube::api::DynamicObject;
use kubewasm_guest_sdk::query;
use kubewasm_guest_sdk::selector::Selector;
use serde_json::Value;
use tokio::sync::{Semaphore, broadcast};
use tracing::Instrument;

use crate::api::Reason;
use crate::controller::{Backoff, Change, Fence, ObjectKey, TokenBucket, Watch, WorkQueue};
use crate::metrics::Metrics;
use crate::sandbox::{
    Action, EventType, GuestPre, Limits, MAX_GUEST_MESSAGE_BYTES, ObjectRef, Sandbox, WireRequest,
    guest_text, requeue_delay,
};

use super::actions::{ChildKind, EventRecorder, Executor};
use super::cache::{CacheSource, to_json};
use super::finalizer::{Finalizer, Phase};
use super::grants::Permissions;
use super::kinds::DeclaredKinds;
use super::reads::GrantedReads;
use super::state::GuestState;

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
    /// The last failure, cleared by the next success.
    pub last_error: Mutex<Option<(Reason, String)>>,
    /// Parents being deleted whose clean-up the guest has not said done.
    pub finalizing: Mutex<std::collections::BTreeSet<ObjectKey>>,
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
    /// API writes this controller may make (operator's `--max-writes-per-second`).
    pub budget: TokenBucket,
    /// Closed when this process may no longer act (leadership lost).
    pub fence: Fence,
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
}

/// How soon a parent whose clean-up the guest has not finished is looked at again, when the
/// guest does not say.
const FINALIZE_RETRY: Duration = Duration::from_secs(10);

/// How soon an object is looked at again while the caches list its namespace again.
const WITHHELD_RETRY: Duration = Duration::from_secs(1);

/// Most parents listed in the status as waiting for clean-up.
pub const MAX_LISTED_FINALIZING: usize = 16;

/// A running controller.
pub struct Runner {
    setup: ControllerSetup,
    guest: RwLock<Arc<GuestPre>>,
    queue: WorkQueue<ObjectKey>,
    backoff: Backoff<ObjectKey>,
    stats: Stats,
    synced: std::sync::atomic::AtomicBool,
    events: EventRecorder,
    /// Each parent as the last successful reconcile of it saw it (the request's `previous`):
    /// shared with the cache while unchanged, so at most one extra version per object.
    reconciled: Mutex<HashMap<ObjectKey, Arc<DynamicObject>>>,
}

impl Runner {
    /// A controller running `guest`; call [`Runner::run`] to start it.
    pub fn new(setup: ControllerSetup, guest: Arc<GuestPre>) -> Arc<Runner> {
        Arc::new(Runner {
            setup,
            guest: RwLock::new(guest),
            queue: WorkQueue::default(),
            backoff: Backoff::new(Duration::from_millis(500), Duration::from_secs(300)),
            stats: Stats::default(),
            synced: std::sync::atomic::AtomicBool::new(false),
            events: EventRecorder::default(),
            reconciled: Mutex::default(),
        })
    }

    /// The counters.
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
        self.guest.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Swaps in a new module (hot reload) and reconciles every parent with it.
    pub fn swap_guest(&self, guest: Arc<GuestPre>) {
        *self.guest.write().unwrap_or_else(|e| e.into_inner()) = guest;
        self.enqueue_all();
    }

    /// Stops handing out work; running reconciles finish.
    pub fn stop(&self) {
        self.queue.close();
    }

    /// Whether a key is one this controller reconciles: in its namespace (a WasmController),
    /// and a valid Kubernetes name — keys also come from what tenants write (a child's
    /// ownerReference, a saved state's key), and a key lands in log lines, the status and the
    /// guest's state.
    fn in_scope(&self, key: &ObjectKey) -> bool {
        let placed = match &self.setup.namespace {
            Some(ns) => key.namespace.as_deref() == Some(ns.as_str()),
            None => true,
        };
        placed
            && query::validate_name(&key.name).is_ok()
            && key
                .namespace
                .as_deref()
                .is_none_or(|ns| query::validate_namespace(ns).is_ok())
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

        let mut feeders = vec![tokio::spawn(self.clone().feed(parent_changes, None))];
        for rx in child_changes {
            feeders.push(tokio::spawn(self.clone().feed(rx, Some(()))));
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
        // Let running reconciles finish.
        while running.join_next().await.is_some() {}
    }

    async fn feed(self: Arc<Self>, mut rx: broadcast::Receiver<Arc<Change>>, child: Option<()>) {
        let parent = &self.setup.parent.kind().resource;
        loop {
            match rx.recv().await {
                Ok(change) => {
                    let key = match child {
                        None => Some(change.key.clone()),
                        Some(()) => change
                            .owners
                            .iter()
                            .find(|o| {
                                o.controller == Some(true)
                                    && o.kind == parent.kind
                                    && o.api_version == parent.api_version
                            })
                            .map(|o| ObjectKey {
                                namespace: change.key.namespace.clone(),
                                name: o.name.clone(),
                            }),
                    };
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
        if !self.setup.fence.is_open() {
            return; // leadership lost: the process is stopping, nothing starts any more
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
        let span =
            tracing::info_span!("reconcile", controller = self.setup.id.as_str(), object = %key);
        let in_flight = self.setup.metrics.start_reconcile();
        let started = std::time::Instant::now();
        let result = self.reconcile_inner(key).instrument(span.clone()).await;
        drop(in_flight);
        let outcome = match &result {
            Ok(_) => "success",
            Err((reason, _)) => reason.as_str(),
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
            Err((reason, message)) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                let delay = self.backoff.failed(key.clone());
                // Guest text in it is bounded already; API server messages around it (which
                // may quote what the guest sent) are not: escaped and bounded as a whole.
                let message = guest_text(&message, MAX_LAST_ERROR_BYTES);
                tracing::warn!(reason = reason.as_str(), retry_in = ?delay, "reconcile failed: {message}");
                let last =
                    guest_text(&format!("{key}: {message}"), MAX_LAST_ERROR_BYTES).into_owned();
                *self
                    .stats
                    .last_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = Some((reason, last));
                self.queue.add_after(key.clone(), delay);
                return;
            }
        }
        *self
            .stats
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// `Ok(Some(d))`: reconcile again after `d`. `Err((reason, message))`: failed.
    async fn reconcile_inner(&self, key: &ObjectKey) -> Result<Option<Duration>, (Reason, String)> {
        let s = &self.setup;
        let parent_watch = &s.parent;
        let parent = parent_watch.get(key);
        if let (Some(p), Some(sel)) = (&parent, &s.parent_selector) {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            if !sel.matches(&labels) {
                return Ok(None);
            }
        }
        let parent_json = parent.as_ref().map(|p| to_json(parent_watch, p));
        let finalizing = match (&parent_json, &s.finalizer) {
            (Some(p), Some(f)) => match (f.phase(p), s.finalize) {
                (Phase::Missing, true) => return self.write_finalizer(f, p, true).await,
                (Phase::Held | Phase::Finalizing, false) => {
                    return self.write_finalizer(f, p, false).await;
                }
                (Phase::Finalizing, true) => true,
                _ => false,
            },
            _ => false,
        };
        let (children, child_texts) = match &parent {
            Some(p) => self.children_of(p),
            None => (Vec::new(), Vec::new()),
        };
        // The guest gets each object as text, made once per version (`Watch::text`).
        let parent_text = parent
            .as_ref()
            .zip(parent_json.as_ref())
            .map(|(p, json)| parent_watch.text(p, || json.to_string()));
        let resource = &parent_watch.kind().resource;
        let target = ObjectRef {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
        };
        let previous = self
            .reconciled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
            .map(|p| parent_watch.text(&p, || to_json(parent_watch, &p).to_string()));
        let request = WireRequest {
            controller: s.id.clone(),
            target: target.clone(),
            parent: parent_text.as_deref().map(str::to_owned),
            children: child_texts.iter().map(|t| t.to_string()).collect(),
            previous: previous.as_deref().map(str::to_owned),
            state: s.state.get(&key.to_string()),
            finalizing,
        };
        let reads = Arc::new(GrantedReads::new(
            Arc::new(s.reads.clone()),
            s.permissions.clone(),
            key.namespace.clone(),
        ));
        self.stats.reconciles.fetch_add(1, Ordering::Relaxed);
        let outcome = s
            .sandbox
            .reconcile_wire(self.guest(), request, reads, s.limits)
            .await
            .map_err(|e| (e.reason(), e.to_string()))?;
        let finalized = finalizing && outcome.response.is_finalized();
        let mut actions = std::borrow::Cow::Borrowed(&outcome.response.actions);
        if finalizing && !finalized {
            actions.to_mut().push(Action::Event {
                event_type: EventType::Warning,
                reason: "FinalizationPending".into(),
                message: format!(
                    "the deletion waits for controller {} to finish its clean-up (its finalizer {} stays until it answers `finalized`)",
                    s.id,
                    s.finalizer.as_ref().map(Finalizer::name).unwrap_or_default()
                ),
            });
        }
        let state_key = key.to_string();
        let child_kinds: Vec<ChildKind> = s.children.iter().map(|(c, _)| c.clone()).collect();
        let executor = Executor {
            client: s.client.clone(),
            kinds: &s.kinds,
            budget: &s.budget,
            fence: &s.fence,
            permissions: &s.permissions,
            field_manager: format!("kubewasm/{}", s.id),
            parent_kind: parent_watch.kind(),
            parent: parent_json.as_ref(),
            target: &target,
            child_kinds: &child_kinds,
            children: &children,
            events: &self.events,
            state: (&s.state, &state_key),
        };
        let done = executor
            .execute(&actions)
            .await
            .map_err(|e| (Reason::ActionFailed, e.to_string()))?;
        for skipped in &done.skipped {
            tracing::warn!("{skipped}");
        }
        if parent.is_none() {
            // The object is gone: so is what the controller kept about it.
            self.forget_state(&state_key).await?;
        }
        let mut finalize_retry = None;
        {
            let mut waiting = self
                .stats
                .finalizing
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if finalizing && !finalized {
                waiting.insert(key.clone());
                finalize_retry = Some(FINALIZE_RETRY);
            } else {
                waiting.remove(key);
            }
        }
        if finalized && let (Some(f), Some(p)) = (&s.finalizer, &parent_json) {
            self.write_finalizer(f, p, false).await?;
        }
        {
            let mut reconciled = self.reconciled.lock().unwrap_or_else(|e| e.into_inner());
            match parent {
                Some(seen) => reconciled.insert(key.clone(), seen),
                None => reconciled.remove(key),
            };
        }
        for change in &done.changes {
            tracing::info!("{change}");
        }
        tracing::debug!(
            elapsed_ms = outcome.elapsed.as_secs_f64() * 1e3,
            actions = outcome.response.actions.len(),
            "reconciled"
        );
        let after = [
            requeue_delay(&outcome.response),
            done.requeue_after,
            finalize_retry,
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|after| after.max(s.requeue_floor));
        Ok(after)
    }

    /// Adds (`add`) or removes this controller's finalizer on a parent, as observed. After an
    /// add, the guest is called once the watch brings the parent back with it; a conflict (the
    /// parent changed meanwhile) or a parent gone waits for the watch's news.
    async fn write_finalizer(
        &self,
        f: &Finalizer,
        parent: &Value,
        add: bool,
    ) -> Result<Option<Duration>, (Reason, String)> {
        let (client, kind) = (self.setup.client.clone(), self.setup.parent.kind());
        let what = if add { "add" } else { "remove" };
        self.setup.budget.take().await;
        if !self.setup.fence.is_open() {
            return Ok(None);
        }
        let name = parent
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let written = if add {
            f.add(client, kind, parent).await
        } else {
            f.remove(client, kind, parent).await
        };
        match written {
            Ok(()) => {
                tracing::info!("{what} finalizer on {name}: done");
                Ok(None)
            }
            // Changed or gone since observed: the watch brings the news, and a reconcile.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(None),
            Err(e) => Err((
                Reason::ActionFailed,
                format!(
                    "could not {what} this controller's finalizer on {name}: {} (the ServiceAccount needs `patch` on {})",
                    super::actions::api_message(&e),
                    self.setup.parent.kind().resource.plural
                ),
            )),
        }
    }

    /// Forgets the saved state of an object that is gone.
    async fn forget_state(&self, key: &str) -> Result<(), (Reason, String)> {
        if !self.setup.state.changes(key, None) {
            return Ok(());
        }
        self.setup.budget.take().await;
        if !self.setup.fence.is_open() {
            return Ok(());
        }
        self.setup
            .state
            .set(key, None)
            .await
            .map_err(|e| (Reason::ActionFailed, e.to_string()))
    }

    /// Removes this controller's finalizer from every parent that carries it, without
    /// calling the guest: the controller is going away (deleted, or `spec.finalize` turned
    /// off while the runtime was not running it). Failures are logged.
    pub async fn release_finalizers(&self) {
        let Some(f) = &self.setup.finalizer else {
            return;
        };
        for parent in self.setup.parent.store().state() {
            let key = ObjectKey::of(&parent);
            if !self.in_scope(&key) {
                continue;
            }
            let json = to_json(&self.setup.parent, &parent);
            if !f.is_on(&json) {
                continue;
            }
            // A write like any other: within the controller's budget, and only while this
            // replica may act.
            self.setup.budget.take().await;
            if !self.setup.fence.is_open() {
                return;
            }
            match f
                .remove(self.setup.client.clone(), self.setup.parent.kind(), &json)
                .await
            {
                Ok(()) => {
                    tracing::info!(controller = self.setup.id.as_str(), object = %key, "released finalizer {}", f.name())
                }
                Err(e) => {
                    tracing::warn!(controller = self.setup.id.as_str(), object = %key, "could not release finalizer {}: {}; remove it with kubectl patch (metadata.finalizers)", f.name(), super::actions::api_message(&e))
                }
            }
        }
    }

    /// The children the parent controls, by name: as JSON for the actions, and as each
    /// version's text for the guest.
    fn children_of(&self, parent: &DynamicObject) -> (Vec<Value>, Vec<Arc<str>>) {
        let Some(uid) = parent.metadata.uid.as_deref() else {
            return (Vec::new(), Vec::new());
        };
        let mut found = Vec::new();
        for (_, watch) in &self.setup.children {
            for child in watch.owned_by(uid) {
                let owned = child
                    .metadata
                    .owner_references
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .any(|o| o.controller == Some(true) && o.uid == uid);
                if owned && child.metadata.namespace == parent.metadata.namespace {
                    found.push((to_json(watch, &child), watch, child));
                }
            }
        }
        found.sort_by(|(a, ..), (b, ..)| {
            a["metadata"]["name"]
                .as_str()
                .cmp(&b["metadata"]["name"].as_str())
        });
        let texts = found
            .iter()
            .map(|(json, watch, child)| watch.text(child, || json.to_string()))
            .collect();
        (found.into_iter().map(|(json, ..)| json).collect(), texts)
    }
}
