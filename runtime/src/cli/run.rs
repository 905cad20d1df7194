//! `kubewasm run`: host the cluster's WasmControllers until SIGTERM or Ctrl-C.

use std::time::Duration;

use anyhow::Context;
use kubewasm::api::Unit;
use kubewasm::controller::{CacheCaps, DEFAULT_SHARDS, ShardHolder, ShardSettings};
use kubewasm::manager::{Manager, ManagerConfig};
use kubewasm::sandbox::{ChildCompiler, CompiledCache, SandboxConfig};
use kubewasm::sources::ModuleCache;

/// A duration as whole milliseconds (the flags' unit).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Arguments of `kubewasm run`. Every default is the library's own (`ManagerConfig`,
/// `SandboxConfig`, `CacheCaps`, `SPEC_LIMITS`), read here, never written again.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Guest instances that may exist at once across all controllers: running calls, and the
    /// next instances of busy controllers made ahead (dropped whenever a call would wait).
    /// From 1 to 100000 (each slot reserves address space for its memories).
    #[arg(long, default_value_t = SandboxConfig::default().max_instances,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    max_instances: u32,

    /// Memory each of the `--max-instances` slots keeps resident between instances, a
    /// quantity: what a call touched below it is reset in place instead of faulted in again
    /// by the next instance. At most `--max-instances` times it stays resident.
    #[arg(long, default_value_t = Unit::Bytes.show(SandboxConfig::default().resident_memory_bytes as u64))]
    instance_resident_memory: String,

    /// Initialize each instance's memory by copying its module's data into the slot instead
    /// of mapping it copy-on-write: with `--instance-resident-memory` above a module's data
    /// (16Mi for the Python guests), its instances start with every page in place, and a
    /// Python guest's reconcile made ahead takes about a third of the time (the pages its
    /// interpreter writes are copied at instantiation, not at the first write of each during
    /// the call). Costs CPU per instantiation and keeps that memory of each slot resident.
    #[arg(long)]
    copy_instance_memory: bool,

    /// Seconds between re-reads of modules given as file paths.
    #[arg(long, default_value_t = ManagerConfig::default().module_poll.as_secs())]
    module_poll_seconds: u64,
    /// Host only the WasmControllers of this namespace (no ClusterWasmControllers); several
    /// runtimes can then share a cluster, one per namespace.
    #[arg(long)]
    namespace: Option<String>,
    /// The only directory whose files a ClusterWasmController may load as modules
    /// (`spec.module.path`); unset, module files are refused. WasmControllers never may.
    #[arg(long)]
    module_dir: Option<std::path::PathBuf>,
    /// Kinds controllers may make the runtime watch: `[!]group/Kind` rules, first match wins
    /// (`core` is the core group, `*` any group or kind). The default allows everything but
    /// Secrets and the `*.k8s.io` system groups.
    #[arg(long, default_value = kubewasm::controller::DEFAULT_WATCHABLE_KINDS)]
    watchable_kinds: kubewasm::controller::WatchableKinds,
    /// Seconds an answer about a controller's ServiceAccount's RBAC (SubjectAccessReview) is
    /// reused; running controllers are checked again this often.
    #[arg(long, default_value_t = ManagerConfig::default().access_review_ttl.as_secs())]
    access_review_seconds: u64,
    /// The operator's maxima for what a spec may ask (`--max-memory`, `--max-timeout-millis`,
    /// `--max-concurrency`, `--max-actions`, `--max-response-bytes`, `--max-log-bytes`): one
    /// table, `kubewasm::api::SPEC_LIMITS`.
    #[command(flatten)]
    caps: kubewasm::api::LimitCaps,
    /// The shortest delay before a reconcile that a guest asked for (`requeue-after`), in
    /// milliseconds: a guest asking for less (or 0) waits this long.
    #[arg(long, default_value_t = millis(ManagerConfig::default().requeue_floor))]
    min_requeue_millis: u64,
    /// API writes (applies, deletes, state, Events) this replica makes per second, shared
    /// fairly: a tenant (namespace) alone may use all of it; tenants that want more share it
    /// equally, however many controllers each runs.
    #[arg(long, default_value_t = ManagerConfig::default().writes_per_second)]
    max_writes_per_second: f64,
    /// Writes the replica may make at once after a quiet spell.
    #[arg(long, default_value_t = ManagerConfig::default().write_burst)]
    write_burst: u32,
    /// Guest log lines (host `log`, stdout, stderr) the runtime writes per second for one
    /// tenant (a namespace's controllers together, or one ClusterWasmController); the rest
    /// are counted and dropped.
    #[arg(long, default_value_t = SandboxConfig::default().log_lines_per_second)]
    max_log_lines_per_second: f64,
    /// WasmControllers one namespace may run: the first ones by name run, the others' status
    /// says why not. ClusterWasmControllers (the admin's) are not counted.
    #[arg(long, default_value_t = ManagerConfig::default().max_controllers_per_namespace)]
    max_controllers_per_namespace: usize,
    /// Distinct modules one namespace's WasmControllers may run (each stays compiled in
    /// memory while a controller runs it; controllers running the same module share it).
    #[arg(long, default_value_t = ManagerConfig::default().max_modules_per_namespace)]
    max_modules_per_namespace: usize,
    /// New modules compiled per namespace per hour, after `--compile-burst`: a tag that moves
    /// to a new digest at every poll cannot make the runtime compile forever. A module already
    /// compiled (by anyone) costs nothing.
    #[arg(long, default_value_t = ManagerConfig::default().compiles_per_hour)]
    compiles_per_hour: u32,
    /// New modules compiled per namespace at once, after a quiet spell.
    #[arg(long, default_value_t = ManagerConfig::default().compile_burst)]
    compile_burst: u32,
    /// CPU seconds the compiles of one namespace's new modules may take per hour (as many at
    /// once; a compile is charged when it ends, so one may overdraw): a tenant whose modules
    /// each take `--compile-cpu-seconds` cannot keep the one compiler busy for the hour. 0: not
    /// limited.
    #[arg(long, default_value_t = ManagerConfig::default().compile_cpu_seconds_per_hour)]
    compile_cpu_seconds_per_hour: u32,
    /// The most memory one namespace's objects may take in the shared caches (estimated from
    /// each object's JSON; a guest's text of it takes as much again), a quantity: a namespace over it is held back — its objects are dropped from the caches and
    /// handed to no controller, and its WasmControllers' Ready condition says why — until it
    /// is under 90% of it again. `0`: no cap.
    #[arg(long, default_value_t = Unit::Bytes.show(CacheCaps::default().per_namespace))]
    max_cached_bytes_per_namespace: String,
    /// The most memory the objects in the shared caches may take in all (estimated as for
    /// the cap per namespace), a quantity: while over it, the namespace holding the most is
    /// held back, then the next. Cluster-scoped objects are never held back. `0`: no cap.
    #[arg(long, default_value_t = Unit::Bytes.show(CacheCaps::default().total))]
    max_cached_bytes: String,
    /// The most bytes of saved states (`setState`: keys and values) one controller keeps, a
    /// quantity; a save past it fails that reconcile, saying so. The states are kept in
    /// WasmControllerState objects, 16 shards per controller of at most 1 MiB each.
    #[arg(long, default_value_t = Unit::Bytes.show(ManagerConfig::default().max_state_bytes_per_controller as u64))]
    max_state_bytes_per_controller: String,
    /// The most bytes of saved states the controllers of one namespace keep together (the
    /// ClusterWasmControllers together count as one namespace), a quantity: what bounds a
    /// namespace's WasmControllerState objects in etcd however many controllers it runs; a
    /// save past it fails that reconcile, and the controller's status says so
    /// (`StateBudgetExceeded`). Each replica counts the controllers it runs. `0`: no cap.
    #[arg(long, default_value_t = Unit::Bytes.show(ManagerConfig::default().max_state_bytes_per_namespace as u64))]
    max_state_bytes_per_namespace: String,
    /// The most bytes of capsules the controllers of one namespace keep together, a quantity:
    /// each controller keeps its last 5 failed reconciles (each at most 1 MiB: the request the
    /// guest was handed, its reads, the error) for its team to fetch and replay; past it a
    /// controller's oldest go first. In memory, on the replica running the controller.
    #[arg(long, default_value_t = Unit::Bytes.show(ManagerConfig::default().max_capsule_bytes_per_namespace as u64))]
    max_capsule_bytes_per_namespace: String,
    /// Keep the quarantined modules in ConfigMap `kubewasm-quarantine` of this namespace (the
    /// runtime's own): a module whose compile ended the compiler (a crash, `--compile-memory`,
    /// `--compile-cpu-seconds`) is not compiled again by any replica, nor by a later start.
    /// Unset: a replica remembers them until it restarts.
    #[arg(long, env = "KUBEWASM_QUARANTINE_NAMESPACE")]
    quarantine_namespace: Option<String>,
    /// The most bytes a module may have, a quantity: a module file, a ConfigMap's module after
    /// gunzip, an image's layer (refused unread when its manifest says more, and cut off when
    /// a registry sends more than it said).
    #[arg(long, default_value_t = Unit::Bytes.show(ManagerConfig::default().max_module_bytes))]
    max_module_bytes: String,
    /// The most bytes all module reads in flight may hold at once, a quantity: ConfigMaps
    /// read, layers pulled and modules gunzipped, each charged what it may come to before it
    /// is read, until the last controller waiting for it has compiled it. A read that does
    /// not fit waits, then is retried. At least twice --max-module-bytes (a gzipped layer at
    /// the cap and what it inflates to).
    #[arg(long, default_value_t = Unit::Bytes.show(ManagerConfig::default().module_read_bytes))]
    module_read_bytes: String,
    /// The most bytes one list of the ConfigMaps', ServiceAccounts' or Namespaces' metadata
    /// may read at once from the API server's watch cache, a quantity. Past it (very many of
    /// them, or large labels and annotations), they are listed in pages of 100 from etcd
    /// instead, which reads each object whole: a slower start, nothing more held.
    #[arg(long, default_value_t = Unit::Bytes.show(ManagerConfig::default().metadata_list_bytes as u64))]
    metadata_list_bytes: String,
    /// A registry (`HOST:PORT`, as image references name it) spoken to over plain HTTP instead
    /// of HTTPS; repeatable. Every other registry is HTTPS only.
    #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
    insecure_registries: Vec<String>,
    /// A registry (`HOST`, any port, or `HOST:PORT`) reached even though it is, or resolves
    /// to, an address no tenant may make the runtime contact (loopback, link-local, private
    /// and shared ranges, the API server, cluster names); repeatable. `--insecure-registry`
    /// registries are allowed too.
    #[arg(long = "allow-registry", value_name = "HOST[:PORT]")]
    allowed_registries: Vec<String>,
    /// A public key (PEM, ECDSA P-256: cosign's `cosign.pub`) that signs modules; repeatable.
    /// When given, a module from a registry is loaded only if its digest carries a cosign
    /// signature by one of these keys; ConfigMap and file modules are not affected.
    #[arg(long = "verify-key", value_name = "FILE")]
    verify_keys: Vec<std::path::PathBuf>,
    /// Guest log lines a tenant may log at once after a quiet spell.
    #[arg(long, default_value_t = SandboxConfig::default().log_line_burst)]
    log_line_burst: u32,
    /// Keep compiled modules in this directory (the runtime's own, e.g. an `emptyDir`; never
    /// one a tenant can write), so that a restart or a new leader loads them instead of
    /// compiling each again. Unset: every start compiles.
    #[arg(long, value_name = "DIR")]
    compiled_cache_dir: Option<std::path::PathBuf>,
    /// The most bytes of compiled modules kept there (least recently used go first, after
    /// every compile): the volume holds this and the one module being compiled.
    #[arg(long, default_value_t = CompiledCache::DEFAULT_MAX_BYTES)]
    compiled_cache_bytes: u64,
    /// The most memory one compile may use, a quantity: each new module is compiled in a child
    /// process (of this executable) limited to it; a module whose compile needs more is
    /// quarantined. The container's memory limit must hold it beside the runtime's own.
    #[arg(long, default_value_t = Unit::Bytes.show(ChildCompiler::DEFAULT_MAX_MEMORY_BYTES))]
    compile_memory: String,
    /// The most CPU time one compile may use, all its threads together, in seconds (and twice
    /// that, plus 10 s, of wall time); a module whose compile needs more is quarantined.
    #[arg(long, default_value_t = ChildCompiler::DEFAULT_MAX_CPU.as_secs())]
    compile_cpu_seconds: u64,
    /// Keep pulled modules (images' layers) in this directory by digest (the runtime's own,
    /// e.g. an `emptyDir`), so that a restart or a new leader reads them from disk instead of
    /// pulling each again; the manifest and config are still read from the registry every
    /// time, and an entry is hashed again on every read. Unset: every start pulls.
    #[arg(long, value_name = "DIR")]
    module_cache_dir: Option<std::path::PathBuf>,
    /// The most bytes of pulled modules kept there (least recently used go first).
    #[arg(long, default_value_t = ModuleCache::DEFAULT_MAX_BYTES)]
    module_cache_bytes: u64,
    /// The controllers' log lines: `--log-ring-bytes`, `--api-addr`, ... (`cli/log_server.rs`).
    #[command(flatten)]
    pub logs: super::log_server::LogArgs,
    /// Serve `/metrics` (Prometheus), `/healthz` and `/readyz` here, e.g. `0.0.0.0:8080`.
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Share the work with the other replicas running with the same Leases: the controllers
    /// are cut into `--shards` shards by tenant, each a Lease in
    /// `--leader-election-namespace`, and each replica runs the controllers of the shards it
    /// holds, about its share of them.
    #[arg(long)]
    leader_elect: bool,
    /// Namespace of the Leases (the runtime's own).
    #[arg(long, default_value = "default", env = "POD_NAMESPACE")]
    leader_election_namespace: String,
    /// Prefix of the Leases' names (`ID-shard-007`, `ID-member-REPLICA`): replicas with the
    /// same prefix share the work.
    #[arg(long, default_value = "kubewasm")]
    leader_election_id: String,
    /// How many shards the work is cut into (the same for every replica of the set): the most
    /// replicas that can share it. Changing it moves most tenants to another shard; stop
    /// every replica first.
    #[arg(long, default_value_t = DEFAULT_SHARDS, value_parser = clap::value_parser!(u32).range(1..=MAX_SHARDS))]
    shards: u32,
    /// Seconds a replica holds a Lease without renewing it: a replica that stops without a
    /// word has its shards run elsewhere this long after its last renewal.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
}

/// The most shards a set may have (`--shards`): a replica renews each shard it holds every
/// third of a Lease.
const MAX_SHARDS: i64 = 999;

/// Connects with the kubeconfig (or in-cluster config) and runs the manager.
/// Runs the controllers; `logs` is the store the logging layer fills (`args.logs.store()`).
pub fn run(args: Args, logs: std::sync::Arc<kubewasm::logs::LogStore>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    rt.block_on(async move {
        // Files the flags name are read before anything else: a wrong one is said first.
        let verify_keys = args
            .verify_keys
            .iter()
            .map(|path| kubewasm::sources::cosign::TrustedKey::read(path))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("--verify-key {e}"))?;
        let mut config = ManagerConfig::default();
        config.sandbox.max_instances = args.max_instances;
        config.sandbox.resident_memory_bytes =
            kubewasm::api::parse_bytes(&args.instance_resident_memory).map_err(|e| {
                anyhow::anyhow!("--instance-resident-memory {}: {e}", args.instance_resident_memory)
            })?;
        config.sandbox.copy_memory = args.copy_instance_memory;
        config.sandbox.log_lines_per_second = args.max_log_lines_per_second;
        config.sandbox.log_line_burst = args.log_line_burst;
        config.sandbox.compiled_cache = args.compiled_cache_dir.map(|dir| CompiledCache {
            dir,
            max_bytes: args.compiled_cache_bytes,
        });
        config.sandbox.compiler = Some(ChildCompiler {
            program: std::env::current_exe()
                .context("cannot find this executable, which compiles modules in a child process")?,
            max_memory_bytes: match kubewasm::api::parse_bytes(&args.compile_memory) {
                Ok(0) | Err(_) => anyhow::bail!(
                    "--compile-memory {}: give a quantity above 0, e.g. 640Mi",
                    args.compile_memory
                ),
                Ok(bytes) => bytes as u64,
            },
            max_cpu: Duration::from_secs(args.compile_cpu_seconds.max(1)),
        });
        config.namespace = args.namespace;
        config.module_poll = Duration::from_secs(args.module_poll_seconds.max(1));
        config.module_dir = args.module_dir;
        config.watchable = args.watchable_kinds;
        config.access_review_ttl = Duration::from_secs(args.access_review_seconds.max(1));
        config.requeue_floor = Duration::from_millis(args.min_requeue_millis);
        config.caps = args.caps;
        // A pool slot holds the most memory any spec may get: no more, so that the operator's
        // maximum is also what the pooling allocator reserves.
        config.sandbox.max_memory_bytes = config.caps.memory_bytes();
        config.writes_per_second = args.max_writes_per_second;
        config.write_burst = args.write_burst;
        config.max_controllers_per_namespace = args.max_controllers_per_namespace.max(1);
        config.max_modules_per_namespace = args.max_modules_per_namespace.max(1);
        config.compiles_per_hour = args.compiles_per_hour;
        config.compile_burst = args.compile_burst.max(1);
        config.compile_cpu_seconds_per_hour = args.compile_cpu_seconds_per_hour;
        config.quarantine_namespace = args.quarantine_namespace;
        config.max_module_bytes = match kubewasm::api::parse_bytes(&args.max_module_bytes) {
            Ok(0) | Err(_) => anyhow::bail!(
                "--max-module-bytes {}: give a quantity above 0, e.g. 64Mi",
                args.max_module_bytes
            ),
            Ok(bytes) => bytes as u64,
        };
        config.module_read_bytes = match kubewasm::api::parse_bytes(&args.module_read_bytes) {
            Ok(bytes) if bytes as u64 >= config.max_module_bytes.saturating_mul(2) => bytes as u64,
            _ => anyhow::bail!(
                "--module-read-bytes {}: give a quantity of at least twice --max-module-bytes ({}), e.g. 128Mi: a gzipped layer at the cap and what it inflates to are held at once",
                args.module_read_bytes,
                Unit::Bytes.show(config.max_module_bytes.saturating_mul(2))
            ),
        };
        config.metadata_list_bytes = match kubewasm::api::parse_bytes(&args.metadata_list_bytes) {
            Ok(bytes) if bytes > 0 => bytes,
            _ => anyhow::bail!(
                "--metadata-list-bytes {}: give a quantity above 0, e.g. 32Mi",
                args.metadata_list_bytes
            ),
        };
        let kube_config = kube::Config::infer().await.context(
            "cannot find a Kubernetes configuration: set KUBECONFIG (e.g. `eval \"$(make -s cluster-up)\"`) or run inside a cluster",
        )?;
        // One cap for a module's bytes, fetched and compiled alike.
        config.sandbox.max_module_bytes =
            usize::try_from(config.max_module_bytes).unwrap_or(usize::MAX);
        config.insecure_registries = args.insecure_registries;
        config.allowed_registries = args.allowed_registries;
        config.verify_keys = verify_keys;
        if let Some(dir) = args.module_cache_dir {
            config.module_cache = ModuleCache::new(dir, args.module_cache_bytes);
        }
        let cap = |flag: &str, value: &str| -> anyhow::Result<u64> {
            let bytes = kubewasm::api::parse_bytes(value)
                .map_err(|e| anyhow::anyhow!("--{flag} {value}: {e}"))?;
            Ok(if bytes == 0 { u64::MAX } else { bytes as u64 })
        };
        config.cache_caps = kubewasm::controller::CacheCaps {
            per_namespace: cap(
                "max-cached-bytes-per-namespace",
                &args.max_cached_bytes_per_namespace,
            )?,
            total: cap("max-cached-bytes", &args.max_cached_bytes)?,
        };
        config.max_state_bytes_per_controller = usize::try_from(cap(
            "max-state-bytes-per-controller",
            &args.max_state_bytes_per_controller,
        )?)
        .unwrap_or(usize::MAX);
        config.max_state_bytes_per_namespace = usize::try_from(cap(
            "max-state-bytes-per-namespace",
            &args.max_state_bytes_per_namespace,
        )?)
        .unwrap_or(usize::MAX);
        config.max_capsule_bytes_per_namespace = usize::try_from(cap(
            "max-capsule-bytes-per-namespace",
            &args.max_capsule_bytes_per_namespace,
        )?)
        .unwrap_or(usize::MAX);
        config.runtime_namespace = args.leader_election_namespace.clone();
        config.logs = logs.clone();
        let manager = Manager::new(kube_config.clone(), config)?;
        let client = kube::Client::try_from(kubewasm::manager::request_config(kube_config.clone()))?;
        if let Some(addr) = args.metrics_addr {
            let bound = kubewasm::metrics::serve(addr, manager.metrics())
                .await
                .with_context(|| format!("cannot serve metrics on {addr}"))?;
            tracing::info!("serving /metrics, /healthz and /readyz on http://{bound}");
        }
        if !args.leader_elect {
            args.logs.start(logs, kept(&manager), client, None);
            return manager.run(shutdown_signal()).await;
        }
        // Unique per process, as client-go's hostname + uuid: in a container the pid is always
        // 1, and a restarted replica must not take its predecessor's unexpired Leases as its own.
        let nonce = std::hash::BuildHasher::hash_one(
            &std::collections::hash_map::RandomState::new(),
            std::time::SystemTime::now(),
        );
        let identity = format!(
            "{}-{:08x}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "kubewasm".into()),
            nonce as u32,
            std::process::id()
        );
        let settings = ShardSettings {
            namespace: args.leader_election_namespace,
            prefix: args.leader_election_id,
            shards: args.shards,
            identity,
            duration: Duration::from_secs(args.lease_duration_seconds.max(3)),
        };
        tracing::info!(
            identity = settings.identity,
            namespace = settings.namespace,
            shards = settings.shards,
            "sharing the work: {} shard Leases {}-shard-NNN",
            settings.shards,
            settings.prefix
        );
        let rounds = Rounds::start(
            kubewasm::manager::request_config(kube_config.clone()),
            settings,
        )?;
        args.logs.start(logs, kept(&manager), client, Some(rounds.holder.clone()));
        let result = manager
            .with_shards(rounds.holder.clone())
            .run(shutdown_signal())
            .await;
        // The controllers have stopped: the shards may go to the others at once.
        rounds.stop();
        result
    })
}

/// The shard rounds, on a thread and an async runtime of their own, with a client of their
/// own: however busy the guests keep the manager's runtime (a computing guest yields only
/// every epoch tick), a renewal is never queued behind them, and a late renewal would shut the
/// shard's fence.
struct Rounds {
    holder: std::sync::Arc<ShardHolder>,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Rounds {
    fn start(config: kube::Config, settings: ShardSettings) -> anyhow::Result<Rounds> {
        let (made, holder) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("kubewasm-shards".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ =
                            made.send(Err(anyhow::anyhow!("cannot start the shard rounds: {e}")));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let client = match kube::Client::try_from(config) {
                        Ok(client) => client,
                        Err(e) => {
                            let _ = made.send(Err(e.into()));
                            return;
                        }
                    };
                    let holder = std::sync::Arc::new(ShardHolder::new(client, settings));
                    let _ = made.send(Ok(holder.clone()));
                    tokio::select! {
                        () = holder.run() => {}
                        _ = stopped => {}
                    }
                    holder.release_all().await;
                });
            })
            .context("cannot start the shard rounds' thread")?;
        let holder = holder
            .recv()
            .context("the shard rounds' thread ended at once")??;
        Ok(Rounds {
            holder,
            stop,
            thread,
        })
    }

    /// Stops the rounds and gives every shard up (each fence shut first).
    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("received shutdown signal");
}

/// What the log server hands each team of its controllers besides their lines.
fn kept(manager: &Manager) -> kubewasm::logs::serve::Kept {
    kubewasm::logs::serve::Kept {
        capsules: manager.capsules(),
        shadows: manager.shadows(),
    }
}
