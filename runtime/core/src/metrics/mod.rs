//! Prometheus metrics and health endpoints of `kubewasm run` (`/metrics`, `/healthz`, `/readyz`).

mod serve;

pub use serve::serve;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::sync::Locks as _;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of per-controller, per-outcome series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `namespace/name` of the controller.
    pub controller: String,
    /// `success`, or the failure reason (`Timeout`, `ActionFailed`, ...).
    pub result: String,
}

/// Labels of per-controller series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `namespace/name` of the controller.
    pub controller: String,
}

/// Labels of per-namespace series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabels {
    pub namespace: String,
}

/// Labels of per-shard series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabels {
    /// The shard's Lease (`kubewasm-shard-007`).
    pub shard: String,
}

type DurationFamily = Family<ControllerLabels, Histogram, fn() -> Histogram>;

/// Every metric the runtime exports.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<OutcomeLabels, Counter>,
    duration: DurationFamily,
    module_loads: Family<OutcomeLabels, Counter>,
    api_requests: Family<ControllerLabels, Counter>,
    reconciles_damped: Family<ControllerLabels, Counter>,
    events_dropped: Family<ControllerLabels, Counter>,
    shadow_compared: Family<ControllerLabels, Counter>,
    shadow_differing: Family<ControllerLabels, Counter>,
    in_flight: Gauge,
    controllers: Gauge,
    cache_bytes: Gauge,
    namespaces_held: Gauge,
    namespace_bytes: Family<NamespaceLabels, Gauge>,
    /// The namespaces `namespace_bytes` has series of, so that those gone are removed.
    namespaces: std::sync::Mutex<std::collections::HashSet<String>>,
    watches: Gauge,
    modules_compiled: Gauge,
    modules_quarantined: Gauge,
    modules_loaded: Gauge,
    modules_from_cache: Gauge,
    modules_pulled: Gauge,
    modules_from_module_cache: Gauge,
    module_read_bytes: Gauge,
    module_read_bytes_peak: Gauge,
    state_bytes: Gauge,
    capsule_bytes: Gauge,
    module_config_map_reads: Gauge,
    shard_controllers: Family<ShardLabels, Gauge>,
    ready: AtomicBool,
    /// When the manager loop last made progress (`None`: not running), for `/healthz`.
    manager_beat: std::sync::Mutex<Option<std::time::Instant>>,
    /// The `result` labels each controller's series were made with, so that a removed
    /// controller's series are removed too (names are tenants' to choose: series that
    /// outlived their controller would grow the runtime and Prometheus without end).
    results: std::sync::Mutex<std::collections::HashMap<String, std::collections::HashSet<String>>>,
}

/// How long the manager loop may make no progress before `/healthz` fails and the kubelet
/// restarts the replica. Longer than the longest step it may take while working as it
/// should: one chunk of controllers starting, each setup bounded by 30 s.
pub const MANAGER_STALL_LIMIT: Duration = Duration::from_secs(300);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn duration_histogram() -> Histogram {
    // 0.25 ms .. ~8 s
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kubewasm");
        let reconciles = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles by controller and result",
            reconciles.clone(),
        );
        let duration: DurationFamily = Family::new_with_constructor(duration_histogram);
        registry.register(
            "reconcile_duration_seconds",
            "Time of one reconcile: guest call and actions",
            duration.clone(),
        );
        let module_loads = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "module_loads",
            "Module loads by controller and result",
            module_loads.clone(),
        );
        let api_requests = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "api_requests",
            "API requests sent for a controller's actions (writes, and a delete-by-selector's list): each takes a token of its write budget",
            api_requests.clone(),
        );
        let reconciles_damped = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "reconciles_damped",
            "Reconciles held back because their key brought itself back (a write it watches, a requeue-after under 1 s) with nothing changed from outside: its exponential backoff (5 ms doubling to 1,000 s)",
            reconciles_damped.clone(),
        );
        let shadow_compared = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "shadow_compared",
            "Reconciles whose answer the controller's candidate module (spec.candidate) was also asked for and compared with",
            shadow_compared.clone(),
        );
        let shadow_differing = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "shadow_differing",
            "Compared reconciles where the candidate's answer differed from the live module's (or one failed and the other did not)",
            shadow_differing.clone(),
        );
        let events_dropped = Family::<ControllerLabels, Counter>::default();
        registry.register(
            "events_dropped",
            "Events a controller recorded that were not written: over the spam filter of their object (a burst of 25, then one per 5 minutes)",
            events_dropped.clone(),
        );
        let in_flight = gauge(
            &mut registry,
            "reconciles_in_flight",
            "Reconciles running now",
        );
        let controllers = gauge(
            &mut registry,
            "controllers_running",
            "Controllers running now",
        );
        let cache_bytes = gauge(
            &mut registry,
            "cache_bytes",
            "Memory the objects held in the shared caches take, estimated (see --max-cached-bytes)",
        );
        let namespaces_held = gauge(
            &mut registry,
            "cache_namespaces_held_back",
            "Namespaces whose objects are held back from the caches (over --max-cached-bytes-per-namespace, or the largest while over --max-cached-bytes)",
        );
        let namespace_bytes = Family::<NamespaceLabels, Gauge>::default();
        registry.register(
            "cache_namespace_bytes",
            "Memory one namespace's objects take in the shared caches, estimated, stored or held back: what is charged against --max-cached-bytes-per-namespace (a namespace with nothing cached has no series)",
            namespace_bytes.clone(),
        );
        let watches = gauge(
            &mut registry,
            "cache_watches",
            "Shared watches running now (one per kind some controller needs)",
        );
        let modules_compiled = gauge(
            &mut registry,
            "modules_compiled",
            "Modules compiled since the runtime started",
        );
        let modules_quarantined = gauge(
            &mut registry,
            "modules_quarantined",
            "Modules this replica knows quarantined: their compile crashed the compiler or met --compile-memory or --compile-cpu-seconds",
        );
        let modules_loaded = gauge(
            &mut registry,
            "modules_loaded",
            "Compiled modules loaded now (each kept while a controller of this replica runs it)",
        );
        let modules_from_cache = gauge(
            &mut registry,
            "modules_from_compiled_cache",
            "Modules loaded already compiled from --compiled-cache-dir since the runtime started",
        );
        let modules_pulled = gauge(
            &mut registry,
            "modules_pulled",
            "Module layers read from a registry since the runtime started",
        );
        let modules_from_module_cache = gauge(
            &mut registry,
            "modules_from_module_cache",
            "Module layers read from --module-cache-dir instead of a registry since the runtime started",
        );
        let module_read_bytes = gauge(
            &mut registry,
            "module_read_bytes",
            "Bytes charged now to the module read budget (--module-read-bytes): modules read, pulled or gunzipped and not yet compiled",
        );
        let module_read_bytes_peak = gauge(
            &mut registry,
            "module_read_bytes_peak",
            "The most bytes charged to the module read budget at once since the runtime started",
        );
        let state_bytes = gauge(
            &mut registry,
            "state_bytes",
            "Bytes of saved state (setState keys and values) the controllers this replica runs hold, saves being written included; each namespace's at most --max-state-bytes-per-namespace",
        );
        let capsule_bytes = gauge(
            &mut registry,
            "capsule_bytes",
            "Bytes of capsules (failed reconciles kept for their teams to replay) the controllers this replica runs hold; each namespace's at most --max-capsule-bytes-per-namespace",
        );
        let module_config_map_reads = gauge(
            &mut registry,
            "module_config_map_reads",
            "Module ConfigMaps read since the runtime started (one read per version, shared by every controller naming it)",
        );
        let shard_controllers = Family::<ShardLabels, Gauge>::default();
        registry.register(
            "shard_controllers_running",
            "Controllers running now by shard, for each shard this replica holds (--leader-elect); a shard it does not hold has no series here",
            shard_controllers.clone(),
        );
        Metrics {
            shard_controllers,
            registry,
            modules_compiled,
            modules_quarantined,
            modules_loaded,
            modules_from_cache,
            modules_pulled,
            modules_from_module_cache,
            module_read_bytes,
            module_read_bytes_peak,
            state_bytes,
            capsule_bytes,
            module_config_map_reads,
            reconciles,
            duration,
            module_loads,
            api_requests,
            reconciles_damped,
            events_dropped,
            shadow_compared,
            shadow_differing,
            in_flight,
            controllers,
            cache_bytes,
            namespaces_held,
            namespace_bytes,
            namespaces: std::sync::Mutex::default(),
            watches,
            ready: AtomicBool::new(false),
            manager_beat: std::sync::Mutex::new(None),
            results: std::sync::Mutex::default(),
        }
    }
}

impl Metrics {
    /// Records one finished reconcile.
    pub fn reconciled(&self, controller: &str, result: &str, took: Duration) {
        let labels = OutcomeLabels {
            controller: controller.to_owned(),
            result: result.to_owned(),
        };
        self.remember(controller, result);
        self.reconciles.get_or_create(&labels).inc();
        self.duration
            .get_or_create(&ControllerLabels {
                controller: controller.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// Counts a reconcile starting; the guard counts it finished when dropped.
    pub fn start_reconcile(&self) -> InFlight<'_> {
        self.in_flight.inc();
        InFlight(&self.in_flight)
    }

    /// Records a module load attempt.
    pub fn module_loaded(&self, controller: &str, result: &str) {
        let labels = OutcomeLabels {
            controller: controller.to_owned(),
            result: result.to_owned(),
        };
        self.remember(controller, result);
        self.module_loads.get_or_create(&labels).inc();
    }

    fn remember(&self, controller: &str, result: &str) {
        let mut results = self.results.locked();
        let known = results.entry(controller.to_owned()).or_default();
        if !known.contains(result) {
            known.insert(result.to_owned());
        }
    }

    /// Removes every series of a controller that no longer exists.
    pub fn forget(&self, controller: &str) {
        let results = self.results.locked().remove(controller).unwrap_or_default();
        for result in results {
            let labels = OutcomeLabels {
                controller: controller.to_owned(),
                result,
            };
            self.reconciles.remove(&labels);
            self.module_loads.remove(&labels);
        }
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        self.duration.remove(&labels);
        self.api_requests.remove(&labels);
        self.reconciles_damped.remove(&labels);
        self.events_dropped.remove(&labels);
        self.shadow_compared.remove(&labels);
        self.shadow_differing.remove(&labels);
    }

    /// Counts a reconcile of `controller` compared with its candidate's answer.
    pub fn shadow_compared(&self, controller: &str, differed: bool) {
        let labels = ControllerLabels {
            controller: controller.to_owned(),
        };
        self.shadow_compared.get_or_create(&labels).inc();
        if differed {
            self.shadow_differing.get_or_create(&labels).inc();
        }
    }

    /// Counts a reconcile of `controller` held back by its key's backoff (a spin).
    pub fn damped(&self, controller: &str) {
        self.reconciles_damped
            .get_or_create(&ControllerLabels {
                controller: controller.to_owned(),
            })
            .inc();
    }

    /// The counter of a controller's Events dropped by their object's spam filter.
    pub fn events_dropped(&self, controller: &str) -> Counter {
        self.events_dropped
            .get_or_create(&ControllerLabels {
                controller: controller.to_owned(),
            })
            .clone()
    }

    /// The counter of a controller's API requests, for its write budget to count on.
    pub fn api_requests(&self, controller: &str) -> Counter {
        self.api_requests
            .get_or_create(&ControllerLabels {
                controller: controller.to_owned(),
            })
            .clone()
    }

    /// Sets how many controllers run.
    pub fn set_controllers(&self, running: usize) {
        self.controllers
            .set(i64::try_from(running).unwrap_or(i64::MAX));
    }

    /// Sets the controllers running per shard held (the shards held are exactly these).
    pub fn set_shards(&self, running: &std::collections::BTreeMap<String, usize>) {
        self.shard_controllers.clear();
        for (shard, count) in running {
            self.shard_controllers
                .get_or_create(&ShardLabels {
                    shard: shard.clone(),
                })
                .set(i64::try_from(*count).unwrap_or(i64::MAX));
        }
    }

    /// Sets how many modules are quarantined.
    pub fn set_quarantined(&self, quarantined: usize) {
        self.modules_quarantined
            .set(i64::try_from(quarantined).unwrap_or(i64::MAX));
    }

    /// Sets how many compiled modules are loaded now.
    pub fn set_modules_loaded(&self, loaded: usize) {
        self.modules_loaded
            .set(i64::try_from(loaded).unwrap_or(i64::MAX));
    }

    /// Sets how the modules loaded so far were had: compiled, or from the compiled cache.
    pub fn set_compilations(&self, compiled: u64, from_cache: u64) {
        self.modules_compiled
            .set(i64::try_from(compiled).unwrap_or(i64::MAX));
        self.modules_from_cache
            .set(i64::try_from(from_cache).unwrap_or(i64::MAX));
    }

    /// Sets how the module layers pulled so far were had: from a registry, or from the module
    /// cache.
    pub fn set_pulls(&self, pulled: u64, from_cache: u64) {
        self.modules_pulled
            .set(i64::try_from(pulled).unwrap_or(i64::MAX));
        self.modules_from_module_cache
            .set(i64::try_from(from_cache).unwrap_or(i64::MAX));
    }

    /// Sets what the module reads hold now, held at most, and how many ConfigMaps they read.
    pub fn set_module_reads(&self, reads: &crate::sources::ModuleReads) {
        let gauge = |g: &Gauge, v: u64| g.set(i64::try_from(v).unwrap_or(i64::MAX));
        gauge(&self.module_read_bytes, reads.budget().in_use());
        gauge(&self.module_read_bytes_peak, reads.budget().peak());
        gauge(&self.module_config_map_reads, reads.config_map_reads());
    }

    /// Sets the bytes of saved state the controllers of this replica hold.
    pub fn set_state_bytes(&self, bytes: usize) {
        self.state_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Sets the bytes of capsules the controllers of this replica hold.
    pub fn set_capsule_bytes(&self, bytes: usize) {
        self.capsule_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Sets the bytes held in the caches, each namespace's account, how many namespaces are
    /// held back and how many watches run.
    pub fn set_cache(&self, accounts: &crate::controller::CacheAccounts, watches: usize) {
        self.cache_bytes
            .set(i64::try_from(accounts.stored_bytes()).unwrap_or(i64::MAX));
        self.namespaces_held
            .set(i64::try_from(accounts.held_namespaces().len()).unwrap_or(i64::MAX));
        self.watches.set(i64::try_from(watches).unwrap_or(i64::MAX));
        let now = accounts.namespaces();
        let mut known = self.namespaces.locked();
        let current: std::collections::HashSet<String> =
            now.iter().map(|(ns, _)| ns.clone()).collect();
        for gone in known.difference(&current) {
            self.namespace_bytes.remove(&NamespaceLabels {
                namespace: gone.clone(),
            });
        }
        for (namespace, bytes) in now {
            self.namespace_bytes
                .get_or_create(&NamespaceLabels { namespace })
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        *known = current;
    }

    /// Marks the runtime ready (caches synced) for `/readyz`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// The manager loop made progress (or, `running: false`, stopped on purpose).
    pub fn manager_beat(&self, running: bool) {
        *self.manager_beat.locked() = running.then(std::time::Instant::now);
    }

    /// Why the runtime is not healthy: the manager loop made no progress for longer than
    /// `limit`.
    pub fn unhealthy(&self, limit: Duration) -> Option<String> {
        let last = (*self.manager_beat.locked())?;
        let silent = last.elapsed();
        (silent > limit).then(|| {
            format!(
                "the manager loop has made no progress for {}s (limit {}s)\n",
                silent.as_secs(),
                limit.as_secs()
            )
        })
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// A gauge registered as `kubewasm_<name>` with `help`.
fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    let gauge = Gauge::default();
    registry.register(name, help, gauge.clone());
    gauge
}

/// Decrements the in-flight gauge when dropped.
pub struct InFlight<'a>(&'a Gauge);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_controllers_series_are_removed() {
        let m = Metrics::default();
        m.reconciled("ns/gone", "success", Duration::from_millis(1));
        m.reconciled("ns/gone", "Timeout", Duration::from_millis(1));
        m.module_loaded("ns/gone", "ModuleInvalid");
        m.api_requests("ns/gone").inc();
        m.damped("ns/gone");
        m.events_dropped("ns/gone").inc();
        m.reconciled("ns/kept", "success", Duration::from_millis(1));
        assert!(m.encode().contains("ns/gone"));
        m.forget("ns/gone");
        let text = m.encode();
        assert!(!text.contains("ns/gone"), "{text}");
        assert!(text.contains("ns/kept"), "{text}");
    }

    #[test]
    fn healthz_fails_only_while_a_running_manager_makes_no_progress() {
        let m = Metrics::default();
        assert_eq!(m.unhealthy(Duration::ZERO), None, "not running yet");
        m.manager_beat(true);
        assert_eq!(m.unhealthy(Duration::from_secs(60)), None);
        std::thread::sleep(Duration::from_millis(5));
        let why = m.unhealthy(Duration::from_millis(1)).unwrap();
        assert!(why.contains("no progress"), "{why}");
        m.manager_beat(false);
        assert_eq!(m.unhealthy(Duration::ZERO), None, "stopped on purpose");
    }

    #[test]
    fn counts_reconciles_by_result_and_in_flight() {
        let m = Metrics::default();
        m.reconciled("ns/c", "success", Duration::from_millis(2));
        m.reconciled("ns/c", "success", Duration::from_millis(3));
        m.reconciled("ns/c", "Timeout", Duration::from_secs(1));
        let guard = m.start_reconcile();
        let text = m.encode();
        assert!(
            text.contains(r#"kubewasm_reconciles_total{controller="ns/c",result="success"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kubewasm_reconciles_total{controller="ns/c",result="Timeout"} 1"#),
            "{text}"
        );
        assert!(text.contains("kubewasm_reconciles_in_flight 1"), "{text}");
        assert!(
            text.contains(r#"kubewasm_reconcile_duration_seconds_count{controller="ns/c"} 3"#),
            "{text}"
        );
        drop(guard);
        assert!(m.encode().contains("kubewasm_reconciles_in_flight 0"));
    }
}
