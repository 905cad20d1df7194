//! One Engine for the process, a cache of compiled guests by digest, and the epoch ticker.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use wasmtime::Engine;
use wasmtime::component::{Component, Linker};

use super::accept::utf8_strings_only;
use super::ahead::{Holding, Made, Make, Ready, Tidy, drop_ready, start_sweeper};
use super::call::{self, CallOutcome, CallState, Instance, Linked, Prepare, Spent};
use super::compiled::{self, Compilations, CompiledCache};
use super::compiler::ChildCompiler;
use super::digest::Digest;
use super::error::{CallError, LoadError};
use super::limits::Limits;
use super::output::SharedLines;
use super::pool::{PageReset, engine_config, machine_has_swap, start_epoch_ticker};
use super::rate::TenantRate;
use super::slots::FairSlots;
use super::types::{IntoWire, SharedReads, WireRequest};
use crate::sync::Locks as _;

/// Engine-wide settings. Per-call limits live in [`Limits`].
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Guest instances that may exist at once (the pooling allocator's size): running calls
    /// and instances made ahead (see [`Ready`]) together; calls beyond this wait for a free
    /// slot, and a call that would wait first drops the instances made ahead.
    pub max_instances: u32,
    /// The largest per-call memory limit any controller may ask for (pool slot size).
    pub max_memory_bytes: usize,
    /// The largest module accepted.
    pub max_module_bytes: usize,
    /// How often the epoch advances; deadlines are counted in these ticks.
    pub epoch_tick: Duration,
    /// Epoch interruption: compiled-in deadline checks, the ticker thread, a yield every tick.
    /// A measuring knob, on by default and always on in the runtime: `false` exists only so the
    /// reconcile bench can measure what it costs, because without it nothing stops a guest that
    /// computes forever (no deadline, no yield, so no timeout either).
    pub epoch_interruption: bool,
    /// Guest log lines (host `log`, stdout, stderr) the runtime writes per second for one
    /// tenant (a namespace, or one cluster controller), all its controllers together; the
    /// rest are counted and dropped.
    pub log_lines_per_second: f64,
    /// Lines a tenant may log at once after a quiet spell.
    pub log_line_burst: u32,
    /// Compiled modules kept on disk across restarts; `None`: every start compiles.
    pub compiled_cache: Option<CompiledCache>,
    /// Compiles in a child process under limits (the runtime's way); `None`: in this process
    /// (tools, tests, benches: the module is the user's own).
    pub compiler: Option<ChildCompiler>,
    /// Linear memory each pool slot keeps resident between instances: what a call touched
    /// below it is reset in place (only the touched pages, with PAGEMAP_SCAN) rather than
    /// handed back to the kernel and faulted in again by the next instance.
    pub resident_memory_bytes: usize,
    /// Each instance's memory is initialized by copying its module's data into the slot,
    /// instead of mapping that data copy-on-write. With `resident_memory_bytes` above a
    /// module's data, its instances then start with every page resident and the copies made
    /// at instantiation (off the latency path for an instance made ahead), where a mapped
    /// one copies each page at its first write during the call: what a Python guest's heap
    /// snapshot (12.5 MiB, thousands of pages written per call) pays. Costs CPU per
    /// instantiation (the whole data copied) and keeps up to `resident_memory_bytes` of each
    /// slot resident.
    pub copy_memory: bool,
    /// Writes `/tmp/perf-<pid>.map` naming each guest function's compiled code, so that `perf`
    /// shows where a guest spends its time (a measuring knob: the benches set it from
    /// `KUBEWASM_PERF_MAP`; off in the runtime).
    pub perf_map: bool,
}

/// [`SandboxConfig::resident_memory_bytes`] by default: a Rust guest's memory (its 128 KiB
/// stack, its data, the first allocations) stays resident; a Python guest's heap snapshot
/// does not.
const DEFAULT_RESIDENT_MEMORY_BYTES: usize = 2 << 20;

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            max_instances: 32,
            max_memory_bytes: 512 << 20,
            // `sources::DEFAULT_MAX_MODULE_BYTES` (a test checks it): `kubewasm run` sets both
            // from `--max-module-bytes`.
            max_module_bytes: 64 << 20,
            epoch_tick: Duration::from_millis(10),
            epoch_interruption: true,
            log_lines_per_second: 100.0,
            log_line_burst: 1000,
            compiled_cache: None,
            compiler: None,
            resident_memory_bytes: DEFAULT_RESIDENT_MEMORY_BYTES,
            copy_memory: false,
            perf_map: false,
        }
    }
}

/// A compiled, pre-instantiated guest: cheap to call many times, each call in a fresh Store.
pub struct GuestPre {
    digest: Digest,
    size: usize,
    linked: Linked,
    engine: Engine,
    epoch_tick: Duration,
    /// Its instantiation failed or took too long ahead: made on the call's path only.
    ahead_refused: AtomicBool,
}

impl std::fmt::Debug for GuestPre {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestPre")
            .field("digest", &self.digest)
            .field("size", &self.size)
            .finish()
    }
}

impl GuestPre {
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// The module's size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Runs one reconcile on this thread, in a fresh Store with `limits`: the entry for tools
    /// (`kubewasm reconcile`, tests, benches). `request` is a `Request` (serialized here,
    /// counted in [`Phases::request`](super::Phases)) or a [`WireRequest`] already serialized.
    pub fn call(
        &self,
        request: impl IntoWire,
        reads: SharedReads,
        limits: &Limits,
    ) -> Result<CallOutcome, CallError> {
        block_on(self.call_serialized(request, reads, limits, None))
    }

    /// Serializes the request (timed), then [`GuestPre::run`] in an instance made here; the
    /// spent Store is dropped here too.
    async fn call_serialized(
        &self,
        request: impl IntoWire,
        reads: SharedReads,
        limits: &Limits,
        lines: Option<SharedLines>,
    ) -> Result<CallOutcome, CallError> {
        let (wire, serialized) = serialize(request);
        let (outcome, spent) = self.run(wire, serialized, reads, limits, lines, None).await;
        drop(spent);
        outcome
    }

    /// Makes an instance of this module (see [`call::instantiate`]), prepared when `prepare`
    /// says so and the module exports `prepare`. Ended at `deadline` wherever the guest is: the
    /// epoch deadline traps one that computes, this timeout drops one blocked in a host call
    /// (a WASI sleep in a start function or in `prepare`), with its Store.
    pub(crate) async fn instantiate(
        &self,
        controller: &str,
        limits: &Limits,
        deadline: Duration,
        lines: Option<SharedLines>,
        prepare: Prepare,
    ) -> Result<Instance, CallError> {
        let tick = self.epoch_tick;
        let making = call::instantiate(
            &self.engine,
            &self.linked,
            tick,
            controller,
            limits,
            deadline,
            lines,
            prepare,
        );
        tokio::time::timeout(deadline + tick * 2, making)
            .await
            .unwrap_or(Err(CallError::Timeout { limit: deadline }))
    }

    /// Whether it exports `prepare` (world `prepared-controller`): its instances made ahead are
    /// prepared before their call.
    pub fn prepares(&self) -> bool {
        self.linked.prepares()
    }

    /// Marks the module as made on the call's path only; true when it already was.
    pub(crate) fn refuse_ahead(&self) -> bool {
        self.ahead_refused.swap(true, Ordering::AcqRel)
    }

    /// Whether instances of it may be made ahead: not once making one ahead failed or took
    /// longer than [`MAKE_DEADLINE`](super::MAKE_DEADLINE) (its instantiation runs guest code).
    pub fn may_be_made_ahead(&self) -> bool {
        !self.ahead_refused.load(Ordering::Acquire)
    }

    /// One reconcile (`serialized`: the time its request took to serialize, counted in
    /// [`Phases::request`](super::Phases)), in `made` when it is given (an instance made
    /// ahead), else in a fresh one made here; ended at `limits.timeout` wherever the guest is
    /// (computing: the epoch deadline traps; blocked in a host or WASI call: the call is
    /// dropped, its Store with it). The Store comes back spent when the call ended in time, for
    /// the caller to drop.
    async fn run(
        &self,
        wire: WireRequest,
        serialized: Duration,
        reads: SharedReads,
        limits: &Limits,
        lines: Option<SharedLines>,
        made: Option<Instance>,
    ) -> (Result<CallOutcome, CallError>, Option<Spent>) {
        let controller = wire.controller.clone();
        let call = async {
            let instance = match made {
                Some(instance) => instance,
                None => match self
                    .instantiate(&controller, limits, limits.timeout, lines, Prepare::Never)
                    .await
                {
                    Ok(instance) => instance,
                    Err(e) => return (Err(e), None),
                },
            };
            let (outcome, spent) = call::call(instance, self.epoch_tick, wire, reads).await;
            (outcome, Some(spent))
        };
        // The epoch deadline fires first for a computing guest; this catches one that waits.
        let grace = limits.timeout + self.epoch_tick * 2;
        match tokio::time::timeout(grace, call).await {
            Ok((mut outcome, spent)) => {
                if let Ok(done) = &mut outcome {
                    done.phases.request += serialized;
                }
                (outcome, spent)
            }
            Err(_) => (
                Err(CallError::Timeout {
                    limit: limits.timeout,
                }),
                None,
            ),
        }
    }
}

/// The request as the guest gets it, and how long that took.
fn serialize(request: impl IntoWire) -> (WireRequest, Duration) {
    let serializing = Instant::now();
    let wire = request.into_wire();
    (wire, serializing.elapsed())
}

/// Drives a call on this thread's current-thread tokio runtime.
fn block_on<T>(call: impl std::future::Future<Output = T>) -> T {
    thread_local! {
        // Building a current-thread runtime fails only when the process cannot make a timer
        // (out of file descriptors): no guest or spec is involved, and nothing could go on.
        #[allow(clippy::expect_used)]
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread tokio runtime");
    }
    RUNTIME.with(|rt| rt.block_on(call))
}

struct Inner {
    engine: Engine,
    linker: Linker<CallState>,
    modules: Mutex<HashMap<Digest, Arc<GuestPre>>>,
    /// Held while compiling: modules are loaded side by side (beside the manager loop), and
    /// a thousand controllers of one module must compile it once, not once per thread.
    compiling: Mutex<()>,
    /// This engine's directory of the compiled-module cache, when there is one.
    compiled_dir: Option<PathBuf>,
    /// How the modules loaded so far were had: compiled, or from the compiled cache.
    compilations: Compilations,
    /// Instance slots: running calls and instances made ahead.
    slots: FairSlots,
    /// Controllers holding an instance made ahead (swept when idle).
    holding: Arc<Mutex<Holding>>,
    log_rate: Arc<TenantRate>,
    config: SandboxConfig,
    page_reset: PageReset,
}

/// The process-wide sandbox. Cloning is cheap and shares everything.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("config", &self.inner.config)
            .finish()
    }
}

impl Sandbox {
    /// Builds the Engine (epoch interruption, pooling allocator) and starts its epoch ticker.
    /// Without [`SandboxConfig::epoch_interruption`] there is no ticker.
    pub fn new(config: SandboxConfig) -> Result<Sandbox, LoadError> {
        let swap = machine_has_swap();
        let page_reset = PageReset::on_this_machine(swap);
        page_reset.log();
        let engine = Engine::new(&engine_config(&config, swap)).map_err(LoadError::Engine)?;
        let compiled_dir = match &config.compiled_cache {
            None => None,
            Some(cache) => Some(cache.open(&engine).map_err(|e| {
                LoadError::Engine(wasmtime::Error::msg(format!(
                    "the compiled-module cache in {}: {e}",
                    cache.dir.display()
                )))
            })?),
        };
        let mut linker = Linker::new(&engine);
        call::add_to_linker(&mut linker).map_err(LoadError::Engine)?;
        if config.epoch_interruption {
            start_epoch_ticker(&engine, config.epoch_tick);
        } else {
            tracing::warn!(
                "epoch interruption is off: guests that compute are never stopped (a setting for measuring only)"
            );
        }
        Ok(Sandbox {
            inner: Arc::new(Inner {
                engine,
                linker,
                modules: Mutex::new(HashMap::new()),
                compiling: Mutex::new(()),
                compiled_dir,
                compilations: Compilations::default(),
                slots: FairSlots::new(config.max_instances as usize),
                holding: start_sweeper(),
                log_rate: Arc::new(TenantRate::new(
                    config.log_lines_per_second,
                    config.log_line_burst,
                )),
                config,
                page_reset,
            }),
        })
    }

    /// How freed instance memory is reset on this machine.
    pub fn page_reset(&self) -> PageReset {
        self.inner.page_reset
    }

    /// Compiles and validates a module, or returns the cached guest with the same digest.
    pub fn load(&self, bytes: &[u8]) -> Result<Arc<GuestPre>, LoadError> {
        let digest = Digest::of(bytes);
        if let Some(guest) = self.lock_modules().get(&digest) {
            return Ok(guest.clone());
        }
        // One compile at a time (each uses every core): whoever waited finds it done.
        let _compiling = self.inner.compiling.locked();
        if let Some(guest) = self.lock_modules().get(&digest) {
            return Ok(guest.clone());
        }
        let guest = Arc::new(self.compile(bytes, digest)?);
        self.lock_modules().insert(digest, guest.clone());
        Ok(guest)
    }

    /// How the modules loaded so far were had: compiled, or from the compiled cache.
    pub fn compilations(&self) -> &Compilations {
        &self.inner.compilations
    }

    /// The compiled module of this digest, if it is loaded.
    pub fn loaded(&self, digest: &Digest) -> Option<Arc<GuestPre>> {
        self.lock_modules().get(digest).cloned()
    }

    /// How many compiled modules are loaded now.
    pub fn loaded_count(&self) -> usize {
        self.lock_modules().len()
    }

    /// Drops compiled modules no longer in `keep` (e.g. after a hot reload).
    pub fn retain(&self, keep: &[Digest]) {
        self.lock_modules().retain(|d, _| keep.contains(d));
    }

    /// Runs one reconcile for `tenant` on the calling task (the guest yields every epoch
    /// tick): the runtime's entry. It waits for a free instance slot first, fairly between
    /// tenants (a namespace's controllers, or one cluster controller), and shares the tenant's
    /// log rate; past its deadline the call is dropped and the slot freed. The runtime passes
    /// a [`WireRequest`]: each cached object serialized once per version.
    pub async fn reconcile(
        &self,
        tenant: &str,
        guest: Arc<GuestPre>,
        request: impl IntoWire,
        reads: SharedReads,
        limits: Limits,
    ) -> Result<CallOutcome, CallError> {
        let (result, tidy) = self.call(tenant, guest, request, reads, limits, None).await;
        // The Store and then the slot, here.
        drop(tidy);
        result
    }

    /// [`Sandbox::reconcile`] for a controller with its `ready`: the call uses the instance
    /// made ahead for it (when it was made of this module with these limits); the [`Tidy`]
    /// handed back drops the spent Store and, when the controller is busy, makes its next
    /// instance: run it once the answer is handed on (see [`Ready`]).
    pub async fn reconcile_ahead(
        &self,
        tenant: &str,
        guest: Arc<GuestPre>,
        request: impl IntoWire,
        reads: SharedReads,
        limits: Limits,
        ready: &Ready,
    ) -> (Result<CallOutcome, CallError>, Tidy) {
        self.call(tenant, guest, request, reads, limits, Some(ready))
            .await
    }

    async fn call(
        &self,
        tenant: &str,
        guest: Arc<GuestPre>,
        request: impl IntoWire,
        reads: SharedReads,
        limits: Limits,
        ready: Option<&Ready>,
    ) -> (Result<CallOutcome, CallError>, Tidy) {
        // The tenant's log lines per second are shared by its calls, taken a few at a time as
        // each logs (see `SharedLines`).
        let lines = SharedLines {
            rate: self.inner.log_rate.clone(),
            tenant: tenant.to_owned(),
        };
        let busy = ready.is_some_and(Ready::called);
        // The instance made ahead for this controller brings its slot; a call without one takes
        // a slot fairly, and when it would wait, the instances made ahead are dropped first
        // (they are worth having, never worth waiting for).
        let (instance, permit) = match ready.and_then(Ready::take) {
            Some(made) if made.serves(&guest.digest(), &limits) => {
                let Made { instance, slot, .. } = made;
                (Some(instance), slot)
            }
            other => {
                drop(other);
                if self.inner.slots.would_wait() {
                    drop_ready(&self.inner.holding);
                }
                (None, self.inner.slots.acquire(tenant).await)
            }
        };
        let (wire, serialized) = serialize(request);
        let controller = wire.controller.clone();
        // On this task, not a blocking thread: the guest yields every epoch tick, and a call
        // past its deadline is dropped with its Store, so the slot is free again at once.
        let (result, spent) = guest
            .run(
                wire,
                serialized,
                reads,
                &limits,
                Some(lines.clone()),
                instance,
            )
            .await;
        let make = match ready {
            Some(ready) if busy && guest.may_be_made_ahead() && !ready.holds() => {
                let slots = self.inner.slots.clone();
                Make::next(ready, guest, limits, controller, slots, lines)
            }
            _ => None,
        };
        // The Store first, then the slots it held.
        let tidy = Tidy::new((spent, permit), make, self.inner.holding.clone());
        (result, tidy)
    }

    fn compile(&self, bytes: &[u8], digest: Digest) -> Result<GuestPre, LoadError> {
        let limit = self.inner.config.max_module_bytes;
        if bytes.len() > limit {
            return Err(LoadError::TooLarge {
                size: bytes.len(),
                limit,
            });
        }
        match bytes.get(..8) {
            Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => return Err(LoadError::NotAComponent),
            Some([0, b'a', b's', b'm', ..]) => {}
            _ => return Err(LoadError::NotWasm),
        }
        utf8_strings_only(bytes)?;
        let component = self.component(bytes, &digest)?;
        let instance_pre = self
            .inner
            .linker
            .instantiate_pre(&component)
            .map_err(LoadError::WrongWorld)?;
        let linked = Linked::new(&component, instance_pre).map_err(LoadError::WrongWorld)?;
        Ok(GuestPre {
            digest,
            size: bytes.len(),
            linked,
            engine: self.inner.engine.clone(),
            epoch_tick: self.inner.config.epoch_tick,
            ahead_refused: AtomicBool::new(false),
        })
    }

    /// The module compiled: from the compiled cache, or compiled (in the compiler process when
    /// there is one) into a file that is then mapped, and kept when there is a cache.
    fn component(&self, bytes: &[u8], digest: &Digest) -> Result<Component, LoadError> {
        let inner = &self.inner;
        let engine = &inner.engine;
        let cache = inner.compiled_dir.as_deref();
        let found = cache.and_then(|dir| compiled::load(engine, &compiled::entry(dir, digest)));
        inner.compilations.count(found.is_none());
        if let Some(found) = found {
            return Ok(found);
        }
        let compiler = inner.config.compiler.as_ref();
        let dir = match (cache, compiler) {
            (Some(dir), _) => dir.to_owned(),
            (None, Some(_)) => std::env::temp_dir(),
            // In this process, kept nowhere.
            (None, None) => return Component::new(engine, bytes).map_err(LoadError::Compile),
        };
        let temp = dir.join(format!(
            "{}{}-{}",
            compiled::TEMP,
            digest.hex(),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&temp);
        let io = |e: std::io::Error| {
            LoadError::Engine(wasmtime::Error::msg(format!(
                "writing the compiled module {}: {e}",
                temp.display()
            )))
        };
        let written = match compiler {
            Some(compiler) => compiler.compile(bytes, &temp, inner.config.epoch_interruption),
            None => engine
                .precompile_component(bytes)
                .map_err(LoadError::Compile)
                .and_then(|code| std::fs::write(&temp, code).map_err(io)),
        };
        let path = match (written, cache) {
            (Ok(()), Some(dir)) => {
                let entry = compiled::entry(dir, digest);
                std::fs::rename(&temp, &entry).map(|()| entry).map_err(io)
            }
            (Ok(()), None) => Ok(temp.clone()),
            (Err(e), _) => Err(e),
        };
        let mapped = path.and_then(|path| compiled::map(engine, &path));
        if let (Some(dir), Some(c)) = (cache, &inner.config.compiled_cache) {
            compiled::evict(dir, c.max_bytes);
        }
        // Renamed into the cache, or mapped (the mapping outlives the name): not needed.
        let _ = std::fs::remove_file(&temp);
        mapped
    }

    fn lock_modules(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, Arc<GuestPre>>> {
        self.inner.modules.locked()
    }
}
