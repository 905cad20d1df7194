//! The live runtime: watches WasmControllers and the ConfigMaps holding their modules, starts
//! and stops controllers, hot-reloads modules, and writes each controller's status.
//!
//! **Why not kube-runtime's `Controller` here** (each controller's own reconcile loop is
//! built from kube-runtime's watcher and reflector, with the client-go work-queue semantics):
//! the manager's "object" is a controller declared by either of two kinds (namespaced and
//! cluster-wide) plus its module, which changes through a third kind (ConfigMaps), files under
//! `--module-dir`, and RBAC (access reviews); and every step of it mutates state shared by all
//! controllers — the runner table, the shared watches (started and released by reference
//! count), the sandbox's compiled-module cache and the lease fence. A `Controller<K>` runs
//! reconciles of different objects concurrently on an `Arc` context, so all of that would sit
//! behind locks for no gain: starting a controller is rare and cheap next to its reconciles.
//! One `select!` loop owns the state instead, and takes from kube-runtime what fits: the
//! watchers of both kinds with their backoff, and per-controller exponential backoff for
//! controllers that cannot start (the retry interval doubling per failure, capped at the
//! access-review period so that a controller granted its RBAC later still starts within one period).

mod compile_budget;
mod compiles;
mod config;
mod declared;
mod fetching;
mod life;
mod lifecycle;
mod messages;
mod modules;
mod promotion;
mod quarantine;
mod setup;
mod sharding;
mod shared_images;
mod status;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, reflector};
use kube::{Api, Client, ResourceExt};

use crate::api::{ClusterWasmController, WasmController, WasmControllerSpec};
use crate::controller::{Fence, ObjectKey, Resolver, SharedWatches};
use crate::host::{AccessReviews, GuestState};
use crate::metrics::Metrics;
use crate::sandbox::Sandbox;

use declared::{Seen, watch_declared};

pub use crate::api::LimitCaps;
pub use crate::api::Problem;
use crate::sync::Locks as _;
pub use config::ManagerConfig;
pub use quarantine::QUARANTINE_CONFIG_MAP;

/// Most declared controllers taken from the watches at once (and so started side by side).
const MAX_DECLARED_BATCH: usize = 1024;

/// Controllers whose setup (discovery, access reviews) runs at once.
const PARALLEL_STARTS: usize = 32;

/// How often the manager loop says it is alive when it has nothing else to do.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// How long a start waits for the first list of ServiceAccounts' opt-ins (one paginated list
/// of their metadata, beside the ConfigMaps'): past it, starts read ServiceAccounts until it
/// is done.
const OPT_INS_FIRST_LIST: Duration = Duration::from_secs(10);

/// How soon after controllers were started their statuses are written.
const STATUS_SOON: Duration = Duration::from_millis(200);

/// How long a controller may be starting or waiting for its caches before its status says
/// so. Most are Ready sooner, and then their status is written once instead of twice: ten
/// thousand starting are twenty thousand status writes otherwise, and the API server's time
/// is what a start waits on.
const UNSETTLED_SHOWN_AFTER: Duration = Duration::from_secs(5);

/// How long the API server gets to answer one request of the runtime (its response's
/// headers, and then each part of its body): a request that hangs fails with a timeout
/// instead of holding whatever waits on it. Watches are not bounded this way.
pub const API_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long connecting to the API server may take.
pub const API_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `config` with every request bounded in time ([`API_REQUEST_TIMEOUT`]): for every client
/// of the runtime but its watches' (the leader election's too).
pub fn request_config(mut config: kube::Config) -> kube::Config {
    config = watch_config(config);
    config.read_timeout = Some(API_REQUEST_TIMEOUT);
    // From when a request is sent, not from when its pooled connection went idle.
    config.reset_reader_on_write = true;
    config
}

/// `config` for watches: connecting and sending bounded; reading is not (a watch may have
/// nothing to say for minutes; kube-runtime's watcher has its own idle timeout).
fn watch_config(mut config: kube::Config) -> kube::Config {
    config.connect_timeout = Some(API_CONNECT_TIMEOUT);
    config.write_timeout = Some(API_REQUEST_TIMEOUT);
    config
}

/// Names a WasmController (`namespace: Some`) or a ClusterWasmController (`None`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ControllerId {
    /// Namespace of a WasmController.
    pub namespace: Option<String>,
    pub name: String,
}

impl std::fmt::Display for ControllerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

/// What the manager knows of one declared controller.
struct Managed {
    spec: WasmControllerSpec,
    /// The spec, parsed once ([`crate::api::Plan`]): its module's source (an image reference
    /// is parsed by a regex: not once per controller at every reload of ten thousand), its
    /// account, and what its setup acts on.
    plan: Arc<crate::api::Plan>,
    /// The guest's saved states, kept across restarts of the controller in this process.
    state: Arc<GuestState>,
    generation: Option<i64>,
    /// Its uid (the Events about it name it).
    uid: Option<String>,
    /// Whether its candidate was promoted by `spec.rollout.promoteAfter` (tried once per
    /// declaration), or why not.
    promotion: Option<Result<(), String>>,
    /// Whether it runs, its module, its backoff: every change of them is a transition of
    /// [`life::Life`].
    life: life::Life,
    written: Option<crate::api::WasmControllerStatus>,
    /// When it was declared, or its runner last started: a status still unsettled (starting,
    /// waiting for its caches) is written only [`UNSETTLED_SHOWN_AFTER`] past it.
    since: std::time::Instant,
}

/// Keys of ConfigMaps that changed since the manager last took them.
#[derive(Default)]
struct ChangedConfigMaps {
    keys: std::sync::Mutex<HashSet<ObjectKey>>,
    /// Holds a wake-up for the manager when it is not waiting.
    notify: tokio::sync::Notify,
}

impl ChangedConfigMaps {
    fn add(&self, key: ObjectKey) {
        self.keys.locked().insert(key);
        self.notify.notify_one();
    }

    fn take(&self) -> HashSet<ObjectKey> {
        std::mem::take(&mut *self.keys.locked())
    }
}

/// The live runtime.
pub struct Manager {
    /// Requests and answers, each within [`API_REQUEST_TIMEOUT`].
    client: Client,
    /// Watches (no read timeout: see [`watch_config`]).
    watch_client: Client,
    /// Watches whose lists come whole from the API server's cache, each cut off past
    /// `--metadata-list-bytes` ([`crate::controller::capped_lists`]).
    capped_watch_client: Client,
    base_config: kube::Config,
    config: ManagerConfig,
    sandbox: Sandbox,
    metrics: Arc<Metrics>,
    watches: SharedWatches,
    resolver: Resolver,
    access: AccessReviews,
    fence: Fence,
    /// The replica's API writes, shared fairly between tenants.
    writes: crate::controller::WriteScheduler,
    controllers: HashMap<ControllerId, Managed>,
    /// Modules whose compile ended the compiler: not compiled again.
    quarantine: quarantine::Quarantine,
    /// Compiles under way, beside the loop.
    compiles: compiles::Compiles,
    compile_budget: compile_budget::CompileBudget,
    /// What each namespace's controllers' saved states take, against its cap.
    state_accounts: Arc<crate::host::StateAccounts>,
    /// Every running controller's failed reconciles, for its team (`host::capsules`).
    capsules: Arc<crate::host::capsules::CapsuleStore>,
    /// Every running controller's candidate's differences, for its team (`host::shadow`).
    shadows: Arc<crate::host::shadow::ShadowStore>,
    /// Metadata of the ConfigMaps modules may come from (see [`modules`]).
    module_config_maps: Option<reflector::Store<PartialObjectMeta<ConfigMap>>>,
    /// Registry pulls, beside the loop.
    pulls: Arc<crate::sources::Pulls>,
    /// Every controller's module fetch, beside the loop (see [`fetching`]).
    fetches: Arc<crate::sources::Fetches<fetching::Answer>>,
    /// Module reads in flight: one per module version, charged to `--module-read-bytes`.
    reads: Arc<crate::sources::ModuleReads>,
    /// Compiled modules of anonymous digest-pinned images, by reference.
    shared_images: Arc<shared_images::SharedImages>,
    /// The shards this replica holds, when replicas share the work (`None`: it runs all).
    sharding: Option<sharding::Sharding>,
    /// Every declared controller as last seen, run here or not (see [`sharding`]).
    declared: HashMap<ControllerId, declared::Seen>,
}

/// The addresses of the API server at `url` (its IP, or what its name resolves to now): no
/// registry a tenant names may be there.
fn api_server_addresses(url: &http::Uri) -> Vec<std::net::IpAddr> {
    use std::net::ToSocketAddrs as _;
    let Some(host) = url.host() else {
        return Vec::new();
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse() {
        return vec![ip];
    }
    let port = url.port_u16().unwrap_or(443);
    (host, port)
        .to_socket_addrs()
        .map(|addrs| addrs.map(|a| a.ip()).collect())
        .unwrap_or_default()
}

impl Manager {
    /// A manager acting with `base_config`'s identity for watches and statuses.
    pub fn new(base_config: kube::Config, config: ManagerConfig) -> anyhow::Result<Manager> {
        // Without it nothing stops a guest that computes: a knob for the bench, never for hosting.
        anyhow::ensure!(
            config.sandbox.epoch_interruption,
            "the runtime needs epoch interruption (SandboxConfig::epoch_interruption)"
        );
        // Watches stream for minutes with nothing to read (kube-runtime's watcher has its own
        // idle timeout); every other request gets [`API_REQUEST_TIMEOUT`].
        let watch_client = Client::try_from(watch_config(base_config.clone()))?;
        let capped_watch_client = crate::controller::capped_lists(
            watch_config(base_config.clone()),
            config.metadata_list_bytes,
        )?;
        let base_config = request_config(base_config);
        let client = Client::try_from(base_config.clone())?;
        let sandbox = Sandbox::new(config.sandbox.clone())?;
        let budget =
            crate::sources::ReadBudget::new(config.module_read_bytes, crate::sources::BUDGET_WAIT);
        let registries = crate::sources::oci::RegistryConfig {
            read_budget: budget.clone(),
            insecure: config.insecure_registries.clone(),
            allowed: config.allowed_registries.clone(),
            api_server: api_server_addresses(&base_config.cluster_url),
            verify_keys: config.verify_keys.clone(),
            module_cache: config.module_cache.clone(),
            ..crate::sources::oci::RegistryConfig::new(config.max_module_bytes)
        };
        let pulls = crate::sources::Pulls::new(registries, config.module_poll);
        let compile_budget = compile_budget::CompileBudget::new(
            config.compiles_per_hour,
            config.compile_burst,
            config.compile_cpu_seconds_per_hour,
        );
        let state_accounts = crate::host::StateAccounts::new(config.max_state_bytes_per_namespace);
        let capsules =
            crate::host::capsules::CapsuleStore::new(config.max_capsule_bytes_per_namespace);
        // What a team fetches of its candidates' differences is charged like its capsules,
        // to an account of the same size.
        let shadows = crate::host::shadow::ShadowStore::new(config.max_capsule_bytes_per_namespace);
        Ok(Manager {
            pulls,
            reads: Arc::new(crate::sources::ModuleReads::new(budget)),
            fetches: crate::sources::Fetches::new(),
            shared_images: Arc::default(),
            watches: SharedWatches::new(
                watch_client.clone(),
                config.namespace.clone(),
                Arc::new(crate::controller::CacheAccounts::new(config.cache_caps)),
            ),
            watch_client,
            capped_watch_client,
            resolver: Resolver::new(client.clone()),
            access: AccessReviews::new(client.clone(), config.access_review_ttl),
            fence: Fence::default(),
            writes: crate::controller::WriteScheduler::new(
                config.writes_per_second,
                config.write_burst,
            ),
            client,
            base_config,
            config,
            sandbox,
            metrics: Arc::default(),
            controllers: HashMap::new(),
            quarantine: quarantine::Quarantine::off(),
            compiles: compiles::Compiles::new(),
            compile_budget,
            state_accounts,
            capsules,
            shadows,
            module_config_maps: None,
            sharding: None,
            declared: HashMap::new(),
        })
    }

    /// Acts only while `fence` is open: once it closes (leadership lost), every controller is
    /// aborted at once, no reconcile starts, no write is sent, and [`Manager::run`] returns.
    #[must_use]
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// Runs only the controllers of the shards `holder` holds (see [`sharding`]); their writes
    /// pass the fence of their shard. The holder's rounds are run by the caller.
    #[must_use]
    pub fn with_shards(mut self, holder: Arc<crate::controller::ShardHolder>) -> Self {
        self.sharding = Some(sharding::Sharding::new(holder));
        self
    }

    /// The runtime's metrics, to serve them (see [`crate::metrics::serve`]).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The failed reconciles its controllers keep, for the log server to hand their teams.
    pub fn capsules(&self) -> Arc<crate::host::capsules::CapsuleStore> {
        self.capsules.clone()
    }

    /// Its controllers' candidates' differences, for the log server to hand their teams.
    pub fn shadows(&self) -> Arc<crate::host::shadow::ShadowStore> {
        self.shadows.clone()
    }

    /// Runs until `shutdown` resolves, then stops every controller and lets running
    /// reconciles finish.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let server = self.base_config.cluster_url.clone();
        let connecting = std::time::Instant::now();
        tracing::info!(%server, "connecting to the API server");
        // Discovery first, for a clear error when the API server cannot be reached.
        self.resolver.resolve("v1", "ConfigMap").await.with_context(|| {
            format!("cannot reach the Kubernetes API server at {server}; check KUBECONFIG and that the cluster is up")
        })?;
        let discovered = connecting.elapsed();
        if let Some(ns) = &self.config.quarantine_namespace {
            self.quarantine = quarantine::Quarantine::load(self.client.clone(), ns).await;
            self.metrics.set_quarantined(self.quarantine.len());
        }
        // ServiceAccounts' opt-ins from a watch of their metadata, so that a controller's
        // start reads none; listed beside the ConfigMaps' metadata, and waited for a while
        // (until then, or while the watch fails, each start reads its ServiceAccount).
        let opt_ins = crate::host::OptIns::watch(
            self.watch_client.clone(),
            self.capped_watch_client.clone(),
            self.config.namespace.as_deref(),
        );
        // The namespaces a cluster admin enabled (their label), the same way.
        let namespaces = crate::host::OptIns::watch_namespaces(
            self.watch_client.clone(),
            self.capped_watch_client.clone(),
            self.config.namespace.as_deref(),
        );
        let (module_config_maps, cm_changes) = self.watch_config_map_metadata();
        module_config_maps
            .wait_until_ready()
            .await
            .context("the ConfigMap watch ended before its first list")?;
        opt_ins.first_list(OPT_INS_FIRST_LIST).await;
        self.access.watch_opt_ins(opt_ins);
        namespaces.first_list(OPT_INS_FIRST_LIST).await;
        self.access.watch_namespaces(namespaces);
        self.module_config_maps = Some(module_config_maps);
        self.metrics.set_ready(true);

        let (tx, mut declared) = tokio::sync::mpsc::channel(256);
        // `--namespace`: only that namespace's WasmControllers, and no ClusterWasmControllers,
        // so that several runtimes can share a cluster without acting on each other's.
        let wc = match &self.config.namespace {
            Some(ns) => Api::<WasmController>::namespaced(self.watch_client.clone(), ns),
            None => Api::<WasmController>::all(self.watch_client.clone()),
        };
        tokio::spawn(watch_declared(wc, tx.clone(), |o: WasmController| Seen {
            id: ControllerId {
                namespace: o.namespace(),
                name: o.name_any(),
            },
            uid: o.metadata.uid.clone(),
            generation: o.metadata.generation,
            spec: o.spec,
            guest_state: o.status.map(|s| s.guest_state).unwrap_or_default(),
        }));
        if self.config.namespace.is_none() {
            let cwc = Api::<ClusterWasmController>::all(self.watch_client.clone());
            tokio::spawn(watch_declared(cwc, tx, |o: ClusterWasmController| Seen {
                id: ControllerId {
                    namespace: None,
                    name: o.name_any(),
                },
                uid: o.metadata.uid.clone(),
                generation: o.metadata.generation,
                spec: o.spec.controller,
                guest_state: o.status.map(|s| s.guest_state).unwrap_or_default(),
            }));
        }

        let mut status_tick = tokio::time::interval(self.config.status_interval);
        let mut retry_tick = tokio::time::interval(self.config.retry_interval);
        let mut poll_tick = tokio::time::interval(self.config.module_poll);
        let mut access_tick = tokio::time::interval(self.config.access_review_ttl);
        access_tick.tick().await;
        // Statuses of controllers just started are written this soon, not at the next tick.
        // `soon`: armed, with how many controllers waited for their caches at the last write.
        let mut status_soon = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
        let mut soon: Option<usize> = None;
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::info!(
            module_config_maps = self
                .module_config_maps
                .as_ref()
                .map_or(0, |s| s.state().len()),
            "kubewasm runtime started in {:.2?} (discovery {discovered:.2?}, then the ConfigMaps' metadata listed)",
            connecting.elapsed()
        );
        let fence = self.fence.clone();
        let pulls = self.pulls.clone();
        let fetches = self.fetches.clone();
        let mut compiled = self.compiles.ended();
        // Marked changed: the shards taken before this loop started are taken up at once.
        let mut shard_changes = self.sharding.as_ref().map(|s| {
            let mut rx = s.holder.subscribe();
            rx.mark_changed();
            rx
        });
        // `/healthz` fails when this loop stops making progress (see MANAGER_STALL_LIMIT).
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        loop {
            self.metrics.manager_beat(true);
            tokio::select! {
                _ = heartbeat.tick() => {}
                _ = &mut shutdown => break,
                _ = fence.closed() => break,
                Some(event) = declared.recv() => {
                    // Whatever else is waiting too: their controllers start side by side.
                    let mut events = vec![event];
                    while events.len() < MAX_DECLARED_BATCH {
                        match declared.try_recv() {
                            Ok(event) => events.push(event),
                            Err(_) => break,
                        }
                    }
                    if self.on_declared(events).await && soon.is_none() {
                        status_soon.as_mut().reset(tokio::time::Instant::now() + STATUS_SOON);
                        soon = Some(usize::MAX);
                    }
                }
                _ = &mut status_soon, if soon.is_some() => {
                    self.write_statuses().await;
                    // Again soon while more of the started ones see their caches synced.
                    let waiting = self.waiting_for_caches();
                    soon = (waiting > 0 && Some(waiting) < soon).then_some(waiting);
                    if soon.is_some() {
                        status_soon.as_mut().reset(tokio::time::Instant::now() + STATUS_SOON);
                    }
                }
                _ = cm_changes.notify.notified() => {
                    let keys = cm_changes.take();
                    self.on_config_maps(&keys).await;
                }
                _ = status_tick.tick() => {
                    self.promote_due().await;
                    self.write_statuses().await;
                }
                _ = retry_tick.tick() => self.retry_failed().await,
                _ = access_tick.tick() => self.recheck_access().await,
                _ = poll_tick.tick() => self.reload_polled().await,
                pulled = pulls.notified() => self.on_fetched(&pulled).await,
                fetched = fetches.notified() => self.on_fetched(&fetched).await,
                Some(done) = async { compiled.as_mut()?.recv().await } => {
                    // Statuses of the controllers it concerns are written soon.
                    self.on_compiled(done).await;
                    if soon.is_none() {
                        status_soon.as_mut().reset(tokio::time::Instant::now() + STATUS_SOON);
                        soon = Some(usize::MAX);
                    }
                }
                () = sharding::shards_changed(&mut shard_changes) => {
                    self.on_shards().await;
                    if soon.is_none() {
                        status_soon.as_mut().reset(tokio::time::Instant::now() + STATUS_SOON);
                        soon = Some(usize::MAX);
                    }
                }
            }
        }
        self.metrics.manager_beat(false);
        if !self.fence.is_open() {
            tracing::warn!("leadership lost: aborting every controller");
            for m in self.controllers.values_mut() {
                if let Some((runner, task)) = m.life.stop() {
                    runner.stop();
                    task.abort();
                }
            }
            return Ok(());
        }
        tracing::info!("shutting down: stopping controllers");
        let ids: Vec<ControllerId> = self.controllers.keys().cloned().collect();
        self.stop_all_and_wait(&ids).await;
        self.write_statuses().await;
        Ok(())
    }

    /// Watches the metadata of ConfigMaps (of `--namespace`, or all) and collects the keys
    /// of those that changed, were deleted or were listed again, until the manager takes them.
    /// Collected, not queued: a queue that fills would stop the watch before its first list
    /// is done, which the manager waits for (thousands of namespaces, each with ConfigMaps).
    fn watch_config_map_metadata(
        &self,
    ) -> (
        reflector::Store<PartialObjectMeta<ConfigMap>>,
        Arc<ChangedConfigMaps>,
    ) {
        // `PartialObjectMeta`: the API server sends metadata only.
        let api = |client: &Client| -> Api<PartialObjectMeta<ConfigMap>> {
            match &self.config.namespace {
                Some(ns) => Api::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            }
        };
        // Listed from the API server's cache, not from etcd: etcd reads every ConfigMap
        // whole, modules included, for the API server to send its metadata (15 s of the API
        // server's time at 20,000 ConfigMaps holding 10,000 modules, before any controller
        // could start).
        let events = crate::controller::cached_then_paged(
            api(&self.capped_watch_client),
            api(&self.watch_client),
            crate::controller::watch_config(),
            "ConfigMaps' metadata",
        );
        let (store, writer) = reflector::store();
        let changed = Arc::new(ChangedConfigMaps::default());
        let collected = changed.clone();
        tokio::spawn(async move {
            let events = events
                // Only the name, namespace, uid and resourceVersion are used: the labels,
                // annotations and managedFields of every ConfigMap of the cluster (up to
                // 256 KiB of annotations each, tenants' to size) are not kept.
                .modify(|meta| {
                    let kept = std::mem::take(&mut meta.metadata);
                    meta.metadata = kube::api::ObjectMeta {
                        name: kept.name,
                        namespace: kept.namespace,
                        uid: kept.uid,
                        resource_version: kept.resource_version,
                        ..Default::default()
                    };
                })
                .reflect(writer)
                .touched_objects();
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(meta) => collected.add(ObjectKey {
                        namespace: meta.namespace(),
                        name: meta.name_any(),
                    }),
                    Err(err) => tracing::warn!(
                        kind = "ConfigMap",
                        "watch failed, retrying with backoff: {err}"
                    ),
                }
            }
        });
        (store, changed)
    }

    /// Running controllers whose caches have not listed yet.
    fn waiting_for_caches(&self) -> usize {
        let waiting = |m: &&Managed| m.life.runner().is_some_and(|r| !r.synced());
        self.controllers.values().filter(waiting).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_is_bounded_in_time_and_watches_only_when_connecting_and_sending() {
        let base = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let requests = request_config(base.clone());
        assert_eq!(requests.read_timeout, Some(API_REQUEST_TIMEOUT));
        assert_eq!(requests.connect_timeout, Some(API_CONNECT_TIMEOUT));
        assert_eq!(requests.write_timeout, Some(API_REQUEST_TIMEOUT));
        assert!(requests.reset_reader_on_write);
        // The API server's 429s (and 503s) are retried after its Retry-After, by kube.
        assert!(requests.default_retry);
        let watches = watch_config(base);
        assert_eq!(
            watches.read_timeout, None,
            "a watch may be quiet for minutes"
        );
        assert_eq!(watches.connect_timeout, Some(API_CONNECT_TIMEOUT));
    }

    #[test]
    fn a_controller_id_shows_as_kubectl_names_it() {
        let namespaced = ControllerId {
            namespace: Some("team".into()),
            name: "hello".into(),
        };
        let cluster = ControllerId {
            namespace: None,
            name: "pod-watcher".into(),
        };
        assert_eq!(namespaced.to_string(), "team/hello");
        assert_eq!(cluster.to_string(), "pod-watcher");
    }
}
