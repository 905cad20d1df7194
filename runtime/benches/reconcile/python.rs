//! The Python HelloWorld guest (issue 25: `guests/python-hello-world`, a componentize-py
//! component) beside the Rust one, in one run: its size, its compile time uncached and its
//! load from a warm compiled cache, where one call's time goes, one reconcile at 1 KiB
//! interleaved with the Rust guest, the native floor and both webhooks, and what a running
//! instance costs in memory — with what a replica of `deploy/runtime/deployment.yaml` has for
//! them.
//!
//! A Python call takes milliseconds, so it gets few calls per round; in `make test`'s tiny
//! run (a debug build) it is a handful of calls and one compile into the cache, nothing
//! timed is asserted.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubewasm::sandbox::{
    CompiledCache, GuestPre, Limits, NoReads, Sandbox, SandboxConfig, SharedReads,
};
use kubewasm_test_support::runtime::memory_kib;

use super::{P1_ROUNDS, Series, Way, Ways, breakdown, check_same_answer, common, sized_request};

/// The guest's file name in the guest directory (without `.wasm`).
const GUEST: &str = "python_hello_world";

/// From this many iterations on, a run also compiles the module without a cache (a debug
/// build takes 13–24 s per compile of it, so `make test`'s tiny run compiles it once).
const FULL_RUN_ITERS: usize = 1000;

/// Instances held at once when measuring what a running instance costs: one, and the
/// Deployment's `--max-instances`, and the sandbox's default pool.
const CONCURRENT: [usize; 3] = [1, 8, 32];

/// The Deployment the replica's numbers are read from.
const DEPLOYMENT: &str = "deploy/runtime/deployment.yaml";

/// The Python section: `rust` is the Rust HelloWorld, loaded.
pub fn section(rust: Arc<GuestPre>, iters: usize) {
    let path = common::guest_dir().join(format!("{GUEST}.wasm"));
    let Ok(bytes) = std::fs::read(&path) else {
        println!(
            "Python guest: {} is missing (make python-guests): the section is skipped",
            path.display()
        );
        return;
    };
    let rust_bytes = std::fs::read(common::guest("hello_world")).expect("hello_world.wasm");
    println!("Python guest (issue 25): {}", path.display());
    for (name, b) in [(GUEST, &bytes), ("hello_world", &rust_bytes)] {
        println!(
            "  {name:<22} {:>10} bytes, {:>9} gzip -9",
            b.len(),
            gzip_best(b)
        );
    }
    if iters >= FULL_RUN_ITERS {
        let sandbox = Sandbox::new(SandboxConfig::default()).expect("the sandbox starts");
        let started = Instant::now();
        sandbox.load(&bytes).expect("the Python guest compiles");
        println!(
            "  compile (cranelift, no cache)          {:>9.1} ms",
            ms(started.elapsed())
        );
    }
    let cache = tempfile::tempdir().expect("a temp dir for the compiled cache");
    let guest = cached_loads(cache.path(), &bytes);

    let reads: SharedReads = Arc::new(NoReads);
    let limits = Limits::default();
    let request = sized_request(1 << 10);
    let outcome = guest
        .call(&request, reads.clone(), &limits)
        .expect("the Python guest reconciles");
    let rust_outcome = rust
        .call(&request, reads.clone(), &limits)
        .expect("the Rust guest reconciles");
    println!(
        "  linear memory after a call (CallOutcome::memory_bytes): Python {:.1} MiB, Rust {:.1} MiB",
        mib(outcome.memory_bytes),
        mib(rust_outcome.memory_bytes)
    );
    let calls = (iters / 100).clamp(3, 200);
    println!("  Python guest, 1 KiB object: where the time goes, median of {calls} calls:");
    breakdown(&guest, &request, &reads, &limits, calls, false);
    interleaved(rust, guest.clone(), iters);
    let per_instance = running_instances(cache.path(), &bytes);
    replica(per_instance, outcome.memory_bytes);
}

/// Loads `bytes` into a sandbox with an empty compiled cache in `dir` (compiled and stored),
/// then into a second one on the same directory (loaded from it); the second's guest.
fn cached_loads(dir: &std::path::Path, bytes: &[u8]) -> Arc<GuestPre> {
    let config = || SandboxConfig {
        compiled_cache: Some(CompiledCache {
            dir: dir.to_owned(),
            max_bytes: CompiledCache::DEFAULT_MAX_BYTES,
        }),
        ..SandboxConfig::default()
    };
    let first = Sandbox::new(config()).expect("a sandbox with a compiled cache");
    let started = Instant::now();
    first.load(bytes).expect("the Python guest compiles");
    let stored = started.elapsed();
    assert_eq!(
        first.compilations().compiled(),
        1,
        "compiled into the cache"
    );
    drop(first);
    let on_disk = kubewasm_test_support::dir_bytes(dir);
    let (rss_before, _) = memory_kib(std::process::id()).expect("VmRSS");
    let second = Sandbox::new(config()).expect("a sandbox on the same cache");
    let started = Instant::now();
    let guest = second.load(bytes).expect("the Python guest loads");
    let loaded = started.elapsed();
    let (rss_after, _) = memory_kib(std::process::id()).expect("VmRSS");
    assert_eq!(second.compilations().cached(), 1, "loaded from the cache");
    println!(
        "  compile into an empty compiled cache  {:>9.1} ms ({:.1} MiB on disk: wasmtime's entry, zstd)",
        ms(stored),
        mib(on_disk as usize)
    );
    println!(
        "  load from the warm compiled cache     {:>9.1} ms (VmRSS +{:.1} MiB across the load: the compiled module in memory)",
        ms(loaded),
        rss_after.saturating_sub(rss_before) as f64 / 1024.0
    );
    guest
}

/// One reconcile at 1 KiB: the Python guest, the Rust guest, the native floor and both
/// webhooks, interleaved in rounds as P1 is; the Python guest gets fewer calls per round.
fn interleaved(rust: Arc<GuestPre>, python: Arc<GuestPre>, iters: usize) {
    let mut ways = Ways::start(rust, None, None);
    ways.python_guest = Some(python);
    let mut all = vec![Way::PythonGuest, Way::Sandbox, Way::Native, Way::RustHook];
    if ways.python.is_some() {
        all.push(Way::PythonHook);
    }
    let request = sized_request(1 << 10);
    // The Python guest first: every other kubewasm answer must equal its response exactly.
    check_same_answer(&mut ways, &all, &request);
    let python_calls = (iters / 10).clamp(2, 1000);
    let rounds = P1_ROUNDS.min(python_calls);
    let batch = |way: Way| match way {
        Way::PythonGuest => python_calls / rounds,
        _ => (iters / rounds).max(1),
    };
    for &way in &all {
        ways.time(way, &request, batch(way).min(20));
    }
    let mut series: Vec<Series> = all.iter().map(|_| Series::default()).collect();
    for round in 0..rounds {
        for k in 0..all.len() {
            let i = (round + k) % all.len();
            series[i].add(ways.time(all[i], &request, batch(all[i])));
        }
    }
    println!(
        "  1 KiB object, interleaved ({rounds} rounds; per round {} Python guest calls, {} of each other way; the same answer checked first, the Python guest's response equal to the Rust guest's):",
        batch(Way::PythonGuest),
        batch(Way::Sandbox)
    );
    println!(
        "    {:<30} {:>11} {:>11}   {:<33} {:>12}",
        "way", "median", "p99", "round medians min / median / max", "÷ Rust guest"
    );
    let rust_median = series[1].median();
    for (way, series) in all.iter().zip(&mut series) {
        let (min, mid, max) = series.round_medians();
        println!(
            "    {:<30} {:>11} {:>11}   {:<33} {:>11.2}×",
            way.label(),
            super::time(series.median()),
            super::time(series.quantile(0.99)),
            format!(
                "{} / {} / {}",
                super::time(min),
                super::time(mid),
                super::time(max)
            ),
            series.median().as_secs_f64() / rust_median.as_secs_f64()
        );
    }
}

/// What running Python instances cost: `n` reconciles at once on one thread (a 200 µs epoch
/// tick makes each yield so often that all are instantiated before the first ends), VmHWM
/// (reset first) against VmRSS before; the largest cost per instance measured.
fn running_instances(cache: &std::path::Path, bytes: &[u8]) -> Option<f64> {
    let sandbox = Sandbox::new(SandboxConfig {
        compiled_cache: Some(CompiledCache {
            dir: cache.to_owned(),
            max_bytes: CompiledCache::DEFAULT_MAX_BYTES,
        }),
        epoch_tick: Duration::from_micros(200),
        ..SandboxConfig::default()
    })
    .expect("a sandbox for the memory measurement");
    let guest = sandbox.load(bytes).expect("the Python guest loads");
    let request = sized_request(1 << 10);
    let limits = Limits::default().with_timeout(Duration::from_secs(30));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // Once untimed: the pool slots' first use and the allocator's arenas are not the guest's.
    runtime.block_on(at_once(&sandbox, &guest, &request, limits, 2));
    println!(
        "  running Python instances at once (VmHWM reset, then n reconciles on one thread; VmHWM − VmRSS before):"
    );
    let mut worst: Option<f64> = None;
    for n in CONCURRENT {
        let (rss, _) = memory_kib(std::process::id()).expect("VmRSS");
        let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let overlap = runtime.block_on(at_once(&sandbox, &guest, &request, limits, n));
        let (after, hwm) = memory_kib(std::process::id()).expect("VmHWM");
        let per = hwm.saturating_sub(rss) as f64 / 1024.0 / n as f64;
        println!(
            "    n = {n:>2}: at most {overlap} in flight at once; VmHWM +{:.1} MiB, {per:.2} MiB per instance; VmRSS after {:+.1} MiB{}",
            hwm.saturating_sub(rss) as f64 / 1024.0,
            (after as f64 - rss as f64) / 1024.0,
            if reset {
                ""
            } else {
                " (VmHWM could not be reset: an earlier peak)"
            }
        );
        if reset && overlap == n {
            worst = Some(worst.map_or(per, |w: f64| w.max(per)));
        }
    }
    worst
}

/// `n` reconciles started together on this thread; how many were in flight at once at most.
async fn at_once(
    sandbox: &Sandbox,
    guest: &Arc<GuestPre>,
    request: &kubewasm::sandbox::Request,
    limits: Limits,
    n: usize,
) -> usize {
    let spans = futures::future::join_all((0..n).map(|_| async {
        let started = Instant::now();
        let outcome = sandbox
            .reconcile(
                "bench",
                guest.clone(),
                request,
                Arc::new(NoReads) as SharedReads,
                limits,
            )
            .await
            .expect("the Python guest reconciles");
        std::hint::black_box(outcome);
        (started, Instant::now())
    }))
    .await;
    // Most spans open at one moment: at each start, those started and not yet ended.
    spans
        .iter()
        .map(|(at, _)| spans.iter().filter(|(s, e)| s <= at && e > at).count())
        .max()
        .unwrap_or(0)
}

/// What the Deployment's replica has for Python controllers, from its limits and what this
/// run measured.
fn replica(per_instance_mib: Option<f64>, linear_bytes: usize) {
    let path = common_workspace().join(DEPLOYMENT);
    let Some((limit, max_instances)) = deployment_limits(&path) else {
        println!(
            "  {}: no memory limit and --max-instances found",
            path.display()
        );
        return;
    };
    let Some(per) = per_instance_mib else {
        println!(
            "  a replica ({DEPLOYMENT}: {limit:.0} MiB, --max-instances={max_instances}): no per-instance cost measured (VmHWM not reset, or the calls did not overlap)"
        );
        return;
    };
    println!(
        "  a replica ({DEPLOYMENT}: limits.memory {limit:.0} MiB, --max-instances={max_instances}): {max_instances} Python instances running at once cost {:.1} MiB resident ({per:.2} MiB each; each has {:.1} MiB of linear memory, most of it never touched); the rest of the limit, {:.0} MiB, is for the runtime, its caches, the compiled modules and the idle controllers (the density bench measures those)",
        per * max_instances as f64,
        mib(linear_bytes),
        limit - per * max_instances as f64
    );
}

/// `limits.memory` (MiB) and `--max-instances` of the Deployment's container.
fn deployment_limits(path: &std::path::Path) -> Option<(f64, usize)> {
    let text = std::fs::read_to_string(path).ok()?;
    let doc: serde_json::Value = serde_yaml::from_str(&text).ok()?;
    let container = &doc["spec"]["template"]["spec"]["containers"][0];
    let memory = container["resources"]["limits"]["memory"].as_str()?;
    let limit = if let Some(mi) = memory.strip_suffix("Mi") {
        mi.parse::<f64>().ok()?
    } else {
        memory.strip_suffix("Gi")?.parse::<f64>().ok()? * 1024.0
    };
    let max_instances = container["args"]
        .as_array()?
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix("--max-instances=")?.parse().ok())?;
    Some((limit, max_instances))
}

fn common_workspace() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn gzip_best(bytes: &[u8]) -> usize {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(bytes).expect("gzip in memory");
    gz.finish().expect("gzip in memory").len()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}
