//! The live runtime: watches WasmControllers and the ConfigMaps holding their modules, starts
//! and stops controllers, hot-reloads modules, and writes each controller's status.

mod caps;
mod modules;
mod status;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use kubewasm_guest_sdk::selector::Selector;
use tokio::task::JoinHandle;

use crate::api::{ClusterWasmController, Verb, WasmController, WasmControllerSpec};
use crate::controller::{Fence, Kind, Resolver, SharedWatches, TokenBucket, Watch};
use crate::host::{
    AccessReviews, CacheSource, ChildKind, ControllerSetup, DeclaredKinds, Permissions, Runner,
    ServiceAccount,
};
use crate::metrics::Metrics;
use crate::sandbox::{GuestPre, Sandbox, SandboxConfig};

pub use caps::LimitCaps;
pub use status::Problem;

/// Settings of the live runtime.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// Sandbox settings (instance pool size etc.).
    pub sandbox: SandboxConfig,
    /// How often modules given as file paths are re-read for changes.
    pub module_poll: Duration,
    /// How often controller statuses are written (when changed).
    pub status_interval: Duration,
    /// How often controllers that could not start are tried again.
    pub retry_interval: Duration,
    /// Host only the WasmControllers of this namespace (and no ClusterWasmControllers).
    pub namespace: Option<String>,
    /// The only directory `spec.module.path` of a ClusterWasmController may name a file in;
    /// `None`: module files are refused.
    pub module_dir: Option<std::path::PathBuf>,
    /// Kinds controllers may make the runtime watch.
    pub watchable: crate::controller::WatchableKinds,
    /// The most a spec may ask for (memory, time, concurrency).
    pub caps: LimitCaps,
    /// The shortest `requeue-after` a guest gets (a guest asking for less gets this).
    pub requeue_floor: Duration,
    /// API writes per second each controller may make, and its burst.
    pub writes_per_second: f64,
    /// Writes a controller may make at once after a quiet spell.
    pub write_burst: u32,
    /// How long an answer of a SubjectAccessReview is reused, and how often running
    /// controllers' read permissions are checked again.
    pub access_review_ttl: Duration,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig {
            sandbox: SandboxConfig::default(),
            module_poll: Duration::from_secs(5),
            status_interval: Duration::from_secs(2),
            retry_interval: Duration::from_secs(5),
            namespace: None,
            module_dir: None,
            watchable: crate::controller::WatchableKinds::default(),
            access_review_ttl: Duration::from_secs(30),
            caps: LimitCaps::default(),
            requeue_floor: Duration::from_secs(1),
            writes_per_second: 10.0,
            write_burst: 50,
        }
    }
}

/// Names a WasmController (`namespace: Some`) or a ClusterWasmController (`None`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ControllerId {
    /// Namespace of a WasmController.
    pub namespace: Option<String>,
    /// Name.
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
    generation: Option<i64>,
    runner: Option<(Arc<Runner>, JoinHandle<()>)>,
    guest: Option<Arc<GuestPre>>,
    module_problem: Option<Problem>,
    setup_problem: Option<Problem>,
    /// What its ServiceAccount was found allowed to read when it started.
    access: Option<ReadAccess>,
    written: Option<crate::api::WasmControllerStatus>,
}

/// The live runtime.
pub struct Manager {
    client: Client,
    base_config: kube::Config,
    config: ManagerConfig,
    sandbox: Sandbox,
    metrics: Arc<Metrics>,
    watches: SharedWatches,
    resolver: Resolver,
    access: AccessReviews,
    fence: Fence,
    controllers: HashMap<ControllerId, Managed>,
    config_maps: Option<Arc<Watch>>,
}

enum Declared {
    Upsert(ControllerId, Option<i64>, Box<WasmControllerSpec>),
    Delete(ControllerId),
    Relisted(HashSet<ControllerId>, bool),
}

impl Manager {
    /// A manager acting with `base_config`'s identity for watches and statuses.
    pub fn new(base_config: kube::Config, config: ManagerConfig) -> anyhow::Result<Manager> {
        let client = Client::try_from(base_config.clone())?;
        let sandbox = Sandbox::new(config.sandbox.clone())?;
        Ok(Manager {
            watches: SharedWatches::new(client.clone(), config.namespace.clone()),
            resolver: Resolver::new(client.clone()),
            access: AccessReviews::new(client.clone(), config.access_review_ttl),
            fence: Fence::default(),
            client,
            base_config,
            config,
            sandbox,
            metrics: Arc::default(),
            controllers: HashMap::new(),
            config_maps: None,
        })
    }

    /// Acts only while `fence` is open: once it closes (leadership lost), every controller is
    /// aborted at once, no reconcile starts, no write is sent, and [`Manager::run`] returns.
    #[must_use]
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = fence;
        self
    }

    /// The runtime's metrics, to serve them (see [`crate::metrics::serve`]).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Runs until `shutdown` resolves, then stops every controller and lets running
    /// reconciles finish.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<()> {
        let server = self.base_config.cluster_url.clone();
        let cm_kind = self.resolver.resolve("v1", "ConfigMap").await.with_context(|| {
            format!("cannot reach the Kubernetes API server at {server}; check KUBECONFIG and that the cluster is up")
        })?;
        let cms = self.watches.watch(&cm_kind);
        let mut cm_changes = cms.subscribe();
        cms.ready().await;
        self.config_maps = Some(cms);
        self.metrics.set_ready(true);

        let (tx, mut declared) = tokio::sync::mpsc::channel(256);
        // `--namespace`: only that namespace's WasmControllers, and no ClusterWasmControllers,
        // so that several runtimes can share a cluster without acting on each other's.
        let wc = match &self.config.namespace {
            Some(ns) => Api::<WasmController>::namespaced(self.client.clone(), ns),
            None => Api::<WasmController>::all(self.client.clone()),
        };
        tokio::spawn(watch_declared(wc, tx.clone(), |o: WasmController| {
            let id = ControllerId {
                namespace: o.namespace(),
                name: o.name_any(),
            };
            (id, o.metadata.generation, o.spec)
        }));
        if self.config.namespace.is_none() {
            let cwc = Api::<ClusterWasmController>::all(self.client.clone());
            tokio::spawn(watch_declared(cwc, tx, |o: ClusterWasmController| {
                let id = ControllerId {
                    namespace: None,
                    name: o.name_any(),
                };
                (id, o.metadata.generation, o.spec.controller)
            }));
        }

        let mut status_tick = tokio::time::interval(self.config.status_interval);
        let mut retry_tick = tokio::time::interval(self.config.retry_interval);
        let mut poll_tick = tokio::time::interval(self.config.module_poll);
        let mut access_tick = tokio::time::interval(self.config.access_review_ttl);
        access_tick.tick().await;
        let mut shutdown = std::pin::pin!(shutdown);
        tracing::info!("kubewasm runtime started");
        let fence = self.fence.clone();
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = fence.closed() => break,
                Some(event) = declared.recv() => self.on_declared(event).await,
                change = cm_changes.recv() => match change {
                    Ok(change) => self.on_config_map(&change.key).await,
                    Err(_) => self.reload_all(|_| true).await,
                },
                _ = status_tick.tick() => {
                    let running = self.controllers.values().filter(|m| m.runner.is_some()).count();
                    self.metrics.set_controllers(running);
                    self.write_statuses().await
                }
                _ = retry_tick.tick() => self.retry_failed().await,
                _ = access_tick.tick() => self.recheck_access().await,
                _ = poll_tick.tick() => self.reload_all(|spec| spec.module.path.is_some()).await,
            }
        }
        if !self.fence.is_open() {
            tracing::warn!("leadership lost: aborting every controller");
            for m in self.controllers.values_mut() {
                if let Some((runner, task)) = m.runner.take() {
                    runner.stop();
                    task.abort();
                }
            }
            return Ok(());
        }
        tracing::info!("shutting down: stopping controllers");
        let ids: Vec<ControllerId> = self.controllers.keys().cloned().collect();
        for id in &ids {
            self.stop(id).await;
        }
        self.write_statuses().await;
        Ok(())
    }

    async fn on_declared(&mut self, event: Declared) {
        match event {
            Declared::Upsert(id, generation, spec) => {
                let known = self.controllers.get(&id);
                if known.is_some_and(|m| m.generation == generation && m.spec == *spec) {
                    return;
                }
                self.stop(&id).await;
                let guest = self.controllers.remove(&id).and_then(|m| m.guest);
                let managed = Managed {
                    spec: *spec,
                    generation,
                    runner: None,
                    guest,
                    module_problem: None,
                    setup_problem: None,
                    access: None,
                    written: None,
                };
                self.controllers.insert(id.clone(), managed);
                self.start(&id).await;
            }
            Declared::Delete(id) => {
                self.stop(&id).await;
                self.controllers.remove(&id);
                tracing::info!(controller = %id, "controller removed");
            }
            Declared::Relisted(seen, cluster) => {
                let gone: Vec<ControllerId> = self
                    .controllers
                    .keys()
                    .filter(|id| id.namespace.is_none() == cluster && !seen.contains(id))
                    .cloned()
                    .collect();
                for id in gone {
                    self.stop(&id).await;
                    self.controllers.remove(&id);
                }
            }
        }
    }

    async fn stop(&mut self, id: &ControllerId) {
        if let Some((runner, task)) = self.controllers.get_mut(id).and_then(|m| m.runner.take()) {
            runner.stop();
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
            drop(runner);
            self.watches.release_unused();
        }
    }

    /// Loads the module and starts the controller; problems end up in its status.
    async fn start(&mut self, id: &ControllerId) {
        self.load_module(id).await;
        let Some(m) = self.controllers.get(id) else {
            return;
        };
        let Some(guest) = m.guest.clone() else { return };
        match self.setup(id, &m.spec).await {
            Ok((setup, access)) => {
                let runner = Runner::new(setup, guest);
                let task = tokio::spawn(runner.clone().run());
                if let Some(m) = self.controllers.get_mut(id) {
                    m.setup_problem = None;
                    m.access = Some(access);
                    m.runner = Some((runner, task));
                }
                tracing::info!(controller = %id, "controller started");
            }
            Err(problem) => {
                if let Some(m) = self.controllers.get_mut(id) {
                    // Said once per new problem: retries of the same one stay quiet.
                    if m.setup_problem.as_ref() != Some(&problem) {
                        tracing::warn!(controller = %id, reason = problem.reason, "controller cannot start: {}", problem.message);
                    }
                    m.setup_problem = Some(problem);
                }
            }
        }
    }

    async fn setup(
        &self,
        id: &ControllerId,
        spec: &WasmControllerSpec,
    ) -> Result<(ControllerSetup, ReadAccess), Problem> {
        let asked = spec
            .limits
            .resolve()
            .map_err(|m| Problem::new("InvalidSpec", m))?;
        let asked_concurrency = spec.limits.concurrency.unwrap_or(1).max(1) as usize;
        let (limits, concurrency, clamped) = self.config.caps.apply(asked, asked_concurrency);
        let parent_selector = match &spec.parent.label_selector {
            Some(s) => Some(Selector::parse(s).map_err(|e| {
                Problem::new(
                    "InvalidSpec",
                    format!("spec.parent.labelSelector `{s}`: {e}"),
                )
            })?),
            None => None,
        };
        // The operator's rules come first: nothing is looked up for a kind it does not allow.
        for (field, api_version, kind) in readable_declarations(spec) {
            if !self.config.watchable.allows(api_version, kind) {
                return Err(Problem::new(
                    "NotWatchable",
                    format!(
                        "{field} names {kind} ({api_version}), which this runtime does not let controllers watch or read (its operator's `kubewasm run --watchable-kinds {}`); remove it from the spec or ask the operator",
                        self.config.watchable
                    ),
                ));
            }
        }
        // Resolve every declared kind (and only those): scope is known before any check.
        let mut kinds = DeclaredKinds::default();
        let declared = std::iter::once((&spec.parent.api_version, &spec.parent.kind))
            .chain(spec.children.iter().map(|c| (&c.api_version, &c.kind)))
            .chain(spec.grants.iter().map(|g| (&g.api_version, &g.kind)));
        for (api_version, kind) in declared {
            let resolved = self.resolver.resolve(api_version, kind).await.map_err(|e| {
                Problem::new(
                    "KindNotFound",
                    format!("the API server does not serve {kind} ({api_version}): {e}; apply its CustomResourceDefinition"),
                )
            })?;
            if id.namespace.is_some() && !resolved.namespaced {
                return Err(Problem::new(
                    "InvalidSpec",
                    format!(
                        "{kind} ({api_version}) is cluster-scoped, and a WasmController acts only in its own namespace; remove it from the spec, or ask a cluster admin for a ClusterWasmController"
                    ),
                ));
            }
            kinds.insert(resolved);
        }
        let kind_of = |api_version: &str, kind: &str| {
            kinds
                .get(api_version, kind)
                .cloned()
                .expect("every declared kind was resolved above")
        };
        // Authorize: the ServiceAccount must be allowed to read whatever it will be handed.
        let access = ReadAccess {
            clamped,
            account: service_account(id, spec),
            kinds: readable_declarations(spec)
                .map(|(_, api_version, kind)| kind_of(api_version, kind))
                .collect(),
        };
        self.check_access(id, &access).await?;

        let parent_kind = kind_of(&spec.parent.api_version, &spec.parent.kind);
        let parent = self.watches.watch(&parent_kind);
        let mut children = Vec::new();
        let mut readable = vec![parent.clone()];
        for c in &spec.children {
            let watch = self.watches.watch(&kind_of(&c.api_version, &c.kind));
            readable.push(watch.clone());
            children.push((
                ChildKind {
                    kind: watch.kind().clone(),
                    strategy: c.update_strategy,
                },
                watch,
            ));
        }
        for g in spec.grants.iter().filter(|g| g.verbs.iter().any(is_read)) {
            readable.push(self.watches.watch(&kind_of(&g.api_version, &g.kind)));
        }
        let client = self
            .impersonating(&access.account.namespace, &access.account.name)
            .map_err(|e| Problem::new("ClientError", e.to_string()))?;
        let setup = ControllerSetup {
            id: id.to_string(),
            namespace: id.namespace.clone(),
            parent,
            parent_selector,
            children,
            reads: CacheSource::new(readable),
            permissions: Arc::new(Permissions::from_spec(
                &id.to_string(),
                id.namespace.as_deref(),
                spec,
            )),
            limits,
            concurrency,
            resync: spec.resync_period(),
            requeue_floor: self.config.requeue_floor,
            budget: TokenBucket::new(self.config.writes_per_second, self.config.write_burst),
            fence: self.fence.clone(),
            client,
            kinds,
            sandbox: self.sandbox.clone(),
            metrics: self.metrics.clone(),
        };
        Ok((setup, access))
    }

    /// Whether the controller's ServiceAccount may still read what it is handed.
    async fn check_access(&self, id: &ControllerId, access: &ReadAccess) -> Result<(), Problem> {
        let kinds: Vec<&Kind> = access.kinds.iter().collect();
        match self
            .access
            .check_reads(&id.name, &access.account, id.namespace.as_deref(), &kinds)
            .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(missing)) => Err(Problem::new("Forbidden", missing.to_string())),
            Err(failed) => Err(Problem::new("AccessReviewFailed", failed.to_string())),
        }
    }

    /// Stops running controllers whose ServiceAccount lost a read they need; they start
    /// again by themselves (on the retry timer) once RBAC allows it.
    async fn recheck_access(&mut self) {
        let running: Vec<(ControllerId, ReadAccess)> = self
            .controllers
            .iter()
            .filter(|(_, m)| m.runner.is_some())
            .filter_map(|(id, m)| Some((id.clone(), m.access.clone()?)))
            .collect();
        for (id, access) in running {
            if let Err(problem) = self.check_access(&id, &access).await {
                tracing::warn!(controller = %id, reason = problem.reason, "stopping the controller: {}", problem.message);
                self.stop(&id).await;
                if let Some(m) = self.controllers.get_mut(&id) {
                    m.setup_problem = Some(problem);
                }
                self.watches.release_unused();
            }
        }
    }

    /// A client that acts as the ServiceAccount (impersonation), so RBAC judges every write.
    /// No groups are named: the API server gives an impersonated ServiceAccount its own, and
    /// the runtime needs `impersonate` on `serviceaccounts` only, not on `groups`.
    fn impersonating(&self, namespace: &str, name: &str) -> Result<Client, kube::Error> {
        let mut config = self.base_config.clone();
        config.auth_info.impersonate = Some(format!("system:serviceaccount:{namespace}:{name}"));
        Client::try_from(config)
    }

    async fn retry_failed(&mut self) {
        let ids: Vec<ControllerId> = self
            .controllers
            .iter()
            .filter(|(_, m)| m.runner.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            if let Some(problem) = self
                .controllers
                .get(&id)
                .and_then(|m| m.setup_problem.as_ref())
                && problem.reason == "KindNotFound"
            {
                let spec = &self.controllers[&id].spec;
                self.resolver
                    .forget(&spec.parent.api_version, &spec.parent.kind)
                    .await;
            }
            self.start(&id).await;
        }
    }
}

/// What a running controller's ServiceAccount must keep being allowed to read.
#[derive(Debug, Clone)]
struct ReadAccess {
    /// What the operator's caps changed in the spec's limits, for the status.
    clamped: Vec<String>,
    account: ServiceAccount,
    kinds: Vec<Kind>,
}

fn is_read(verb: &Verb) -> bool {
    matches!(verb, Verb::Get | Verb::List)
}

/// The kinds a controller is handed objects of: parent, children, read grants (with the
/// field that declares each, for messages).
fn readable_declarations(
    spec: &WasmControllerSpec,
) -> impl Iterator<Item = (&'static str, &str, &str)> {
    std::iter::once((
        "spec.parent",
        spec.parent.api_version.as_str(),
        spec.parent.kind.as_str(),
    ))
    .chain(
        spec.children
            .iter()
            .map(|c| ("spec.children", c.api_version.as_str(), c.kind.as_str())),
    )
    .chain(
        spec.grants
            .iter()
            .filter(|g| g.verbs.iter().any(is_read))
            .map(|g| ("spec.grants", g.api_version.as_str(), g.kind.as_str())),
    )
}

/// The ServiceAccount a controller acts as: in its own namespace (a ClusterWasmController:
/// its module's namespace, else `default`), named by the spec or `default`.
fn service_account(id: &ControllerId, spec: &WasmControllerSpec) -> ServiceAccount {
    let namespace = id
        .namespace
        .clone()
        .or_else(|| {
            spec.module
                .config_map
                .as_ref()
                .and_then(|c| c.namespace.clone())
        })
        .unwrap_or_else(|| "default".into());
    ServiceAccount {
        namespace,
        name: spec
            .service_account_name
            .clone()
            .unwrap_or_else(|| "default".into()),
    }
}

async fn watch_declared<K, F>(api: Api<K>, tx: tokio::sync::mpsc::Sender<Declared>, split: F)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
    F: Fn(K) -> (ControllerId, Option<i64>, WasmControllerSpec),
{
    let cluster = K::kind(&()) == "ClusterWasmController";
    let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    let mut seen = HashSet::new();
    while let Some(event) = stream.next().await {
        let msg = match event {
            Ok(watcher::Event::Apply(o)) => {
                let (id, generation, spec) = split(o);
                Declared::Upsert(id, generation, Box::new(spec))
            }
            Ok(watcher::Event::InitApply(o)) => {
                let (id, generation, spec) = split(o);
                seen.insert(id.clone());
                Declared::Upsert(id, generation, Box::new(spec))
            }
            Ok(watcher::Event::Delete(o)) => Declared::Delete(split(o).0),
            Ok(watcher::Event::Init) => {
                seen.clear();
                continue;
            }
            Ok(watcher::Event::InitDone) => Declared::Relisted(std::mem::take(&mut seen), cluster),
            Err(err) => {
                let kind = K::kind(&());
                if err.to_string().contains("404") {
                    tracing::warn!(
                        kind = kind.as_ref(),
                        "the {kind} CustomResourceDefinition is not installed: `kubectl apply -f deploy/crds/kubewasm.dev.yaml`; retrying"
                    );
                } else {
                    tracing::warn!(
                        kind = kind.as_ref(),
                        "watch failed, retrying with backoff: {err}"
                    );
                }
                continue;
            }
        };
        if tx.send(msg).await.is_err() {
            return;
        }
    }
}
