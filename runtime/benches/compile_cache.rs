//! Restart time with and without the compiled-module cache (`--compiled-cache-dir`): how long
//! a runtime takes to load `N` distinct modules when it compiles each, when it compiles each
//! into an empty cache (the first start), and when it loads them from the cache (every start
//! after: a restarted container, a replica on the same emptyDir).
//!
//! The modules are the hello_world guest made distinct by a custom section each (same code,
//! other digests), loaded one after another as the manager does. `make bench-compile`
//! (`cargo test -p kubewasm --bench compile_cache -- N…`, default 1 and 100): the dev
//! profile, whose dependencies (cranelift among them) are built at opt-level 2.

use std::time::{Duration, Instant};

use kubewasm::sandbox::{CompiledCache, Sandbox, SandboxConfig};
use kubewasm_test_support::guests;

fn sandbox(cache: Option<&std::path::Path>) -> Sandbox {
    let config = SandboxConfig {
        compiled_cache: cache.map(|dir| CompiledCache {
            dir: dir.to_owned(),
            max_bytes: CompiledCache::DEFAULT_MAX_BYTES,
        }),
        max_instances: 4,
        ..SandboxConfig::default()
    };
    match Sandbox::new(config) {
        Ok(s) => s,
        Err(e) => panic!("the sandbox does not start: {e}"),
    }
}

/// Loads every module into `sandbox`, returns the time and (compiled, from the cache).
fn load_all(sandbox: &Sandbox, modules: &[Vec<u8>]) -> (Duration, (u64, u64)) {
    let started = Instant::now();
    for module in modules {
        if let Err(e) = sandbox.load(module) {
            panic!("a module does not load: {e}");
        }
    }
    let c = sandbox.compilations();
    (started.elapsed(), (c.compiled(), c.cached()))
}

fn main() {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let counts = if counts.is_empty() {
        vec![1, 100]
    } else {
        counts
    };
    let wasm = match std::fs::read(guests::guest("hello_world")) {
        Ok(w) => w,
        Err(e) => panic!("hello_world.wasm: {e}"),
    };
    println!(
        "compile_cache: hello_world ({} bytes) as N distinct modules, loaded one by one",
        wasm.len()
    );
    for n in counts {
        let modules: Vec<Vec<u8>> = (0..n)
            .map(|i| guests::with_custom_section(wasm.clone(), "variant", &i.to_le_bytes()))
            .collect();
        let dir = match tempfile::tempdir() {
            Ok(d) => d,
            Err(e) => panic!("a temp dir: {e}"),
        };
        let (plain, plain_counts) = load_all(&sandbox(None), &modules);
        let (first, first_counts) = load_all(&sandbox(Some(dir.path())), &modules);
        let (restart, restart_counts) = load_all(&sandbox(Some(dir.path())), &modules);
        let disk: u64 = kubewasm_test_support::dir_bytes(dir.path());
        println!(
            "  N={n:<4} no cache {:>9.1} ms {plain_counts:?}   empty cache {:>9.1} ms {first_counts:?}   restart from the cache {:>9.1} ms {restart_counts:?}   ({:.1}x faster; {} KiB on disk)",
            plain.as_secs_f64() * 1e3,
            first.as_secs_f64() * 1e3,
            restart.as_secs_f64() * 1e3,
            plain.as_secs_f64() / restart.as_secs_f64().max(1e-9),
            disk >> 10
        );
    }
}
