//! The live runtime's settings ([`ManagerConfig`]): what `kubewasm run`'s flags set.

use std::time::Duration;

use crate::api::LimitCaps;
use crate::sandbox::SandboxConfig;

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
    /// API writes per second of the whole replica, shared fairly between tenants and, within
    /// a tenant, its controllers ([`crate::controller::WriteScheduler`]).
    pub writes_per_second: f64,
    /// Writes the replica may make at once after a quiet spell.
    pub write_burst: u32,
    /// How long an answer of a SubjectAccessReview is reused, and how often running
    /// controllers' read permissions are checked again.
    pub access_review_ttl: Duration,
    /// WasmControllers one namespace may run (the first by name run; the others say why not).
    pub max_controllers_per_namespace: usize,
    /// Distinct modules one namespace's WasmControllers may run.
    pub max_modules_per_namespace: usize,
    /// New modules compiled per tenant (namespace) per hour, after a burst
    /// ([`compile_budget`](super::compile_budget)).
    pub compiles_per_hour: u32,
    /// New modules compiled per tenant at once, after a quiet spell.
    pub compile_burst: u32,
    /// CPU seconds of compiling per tenant per hour, as many at once (0: not limited).
    pub compile_cpu_seconds_per_hour: u32,
    /// The most bytes a module may have (a file, a ConfigMap's after gunzip, an image's layer).
    pub max_module_bytes: u64,
    /// The most bytes all module reads, pulls and gunzips in flight may hold at once
    /// ([`crate::sources::ReadBudget`]).
    pub module_read_bytes: u64,
    /// The most bytes one list of the ConfigMaps', ServiceAccounts' or Namespaces' metadata
    /// may read from the API server's watch cache at once; past it, they are listed in pages
    /// from etcd ([`crate::controller::cached_then_paged`]).
    pub metadata_list_bytes: usize,
    /// Registries (`host:port`) spoken to over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// Registries (`host` or `host:port`) reached even at internal addresses
    /// ([`RegistryAccess`](crate::sources::oci::RegistryAccess)).
    pub allowed_registries: Vec<String>,
    /// Keys an image module's digest must be signed by (none: no signature asked for).
    pub verify_keys: Vec<crate::sources::cosign::TrustedKey>,
    /// Layers pulled before, kept on disk by digest; [`ModuleCache::off`](crate::sources::ModuleCache::off): none.
    pub module_cache: crate::sources::ModuleCache,
    /// The namespace of the ConfigMap of quarantined modules (see [`quarantine`](super::quarantine)); `None`:
    /// this replica remembers them until it restarts.
    pub quarantine_namespace: Option<String>,
    /// The most bytes of objects the caches hold for one namespace, and in all (see
    /// [`crate::controller::CacheAccounts`]).
    pub cache_caps: crate::controller::CacheCaps,
    /// The most bytes (keys and values) of saved states one controller keeps
    /// ([`crate::host::GuestState`]).
    pub max_state_bytes_per_controller: usize,
    /// The most bytes of saved states one namespace's controllers keep together
    /// ([`crate::host::StateAccounts`]).
    pub max_state_bytes_per_namespace: usize,
    /// The most bytes of capsules (failed reconciles kept for replay) the controllers of one
    /// namespace keep together (`host::capsules`).
    pub max_capsule_bytes_per_namespace: usize,
    /// The runtime's own namespace: where ClusterWasmControllers' saved states are kept.
    pub runtime_namespace: String,
    /// The controllers' log lines ([`crate::logs`]): a deleted controller's are dropped.
    pub logs: std::sync::Arc<crate::logs::LogStore>,
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
            writes_per_second: 1000.0,
            write_burst: 1000,
            max_controllers_per_namespace: 64,
            max_modules_per_namespace: 8,
            compiles_per_hour: 60,
            compile_burst: 16,
            compile_cpu_seconds_per_hour: 600,
            max_module_bytes: crate::sources::DEFAULT_MAX_MODULE_BYTES,
            module_read_bytes: crate::sources::DEFAULT_MODULE_READ_BYTES,
            // The metadata of ~50,000 ConfigMaps (about 650 bytes each as the API server
            // sends it), or ServiceAccounts (550) or Namespaces (800); decoded, it is held
            // with the response until its objects are cut to what is kept of them.
            metadata_list_bytes: 32 << 20,
            insecure_registries: Vec::new(),
            allowed_registries: Vec::new(),
            verify_keys: Vec::new(),
            module_cache: crate::sources::ModuleCache::off(),
            quarantine_namespace: None,
            cache_caps: crate::controller::CacheCaps::default(),
            max_state_bytes_per_controller: 8 << 20,
            max_state_bytes_per_namespace: crate::host::DEFAULT_MAX_STATE_BYTES_PER_NAMESPACE,
            max_capsule_bytes_per_namespace:
                crate::host::capsules::DEFAULT_MAX_CAPSULE_BYTES_PER_NAMESPACE,
            runtime_namespace: "default".into(),
            logs: std::sync::Arc::default(),
        }
    }
}
