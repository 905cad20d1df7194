//! P1 as the runtime calls a busy controller: `Sandbox::reconcile_ahead` with the
//! controller's `Ready` — the call in the instance made ahead for it, then (after the clock, as
//! the runtime does it while the actions' writes are on their way) the spent one dropped and
//! the next made —, beside the same call making its instance on the call's path, the native floor and
//! Metacontroller's Python webhook. HelloWorld (its wasip2 build and the one without WASI) at
//! 1 KiB and 64 KiB, the Python HelloWorld at 1 KiB; ways interleaved in rounds.
//!
//! - **Latency** is the event handed to the sandbox → the actions decoded. Each call comes
//!   [`GAP`] after the one before, as events do (every way waits alike, so that each finds the
//!   machine's caches as the others do); an instance made ahead is waited for up to 5 ms more
//!   before the clock starts (how many calls it served is printed: a call that finds none makes
//!   its own).
//! - **Back to back**: the calls one after another, each timed the same way.
//! - **CPU** per reconcile is the whole process's (every thread; instantiation and teardown
//!   included wherever they run), from the process's CPU clock, back to back. The Python
//!   webhook's CPU is its client's only (the server is another process).
//!
//! The Python HelloWorld is also timed in a sandbox that copies each instance's memory
//! (`--copy-instance-memory`, with 16 MiB of each slot kept resident).
//!
//! To measure one change at a time: `KUBEWASM_BENCH_CANDIDATE=path/to/hello_world.wasm` adds
//! that build as two more ways (on the call's path, made ahead), interleaved with the others;
//! `KUBEWASM_BENCH_PYTHON_CANDIDATE=path/to/python_hello_world.wasm` adds another build of the
//! Python HelloWorld (made ahead, mapped and copied) beside the shipped one.
//! To profile one way: `KUBEWASM_BENCH_WAYS=<part of its label>` runs only the ways whose
//! label has it, and `KUBEWASM_PERF_MAP=1` names the guests' compiled functions for `perf`
//! (`/tmp/perf-<pid>.map`; build the guest without `strip` to get its own names).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kubewasm::sandbox::{
    GuestPre, Limits, NoReads, Ready, Request, Sandbox, SandboxConfig, SharedReads, Tidy,
};

use super::webhook::{self, Hook};
use super::{Series, common, sized_request, time};

/// Rounds, each a batch of every way in turn.
const ROUNDS: usize = 20;

/// The resident memory per slot of the sandbox that copies memories: above the Python
/// guest's 12.5 MiB heap snapshot (`--copy-instance-memory --instance-resident-memory 16Mi`).
const COPIED_RESIDENT: usize = 16 << 20;

/// The pause before each timed call (every way).
const GAP: Duration = Duration::from_micros(50);

/// CPU time this process has used, every thread (ns).
fn cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

enum Kind {
    Native,
    /// `Sandbox::reconcile` without a `Ready`: the instance made and dropped on the call's path.
    Path(Arc<GuestPre>),
    /// With the controller's `Ready`.
    Ahead(Arc<GuestPre>, Ready),
    /// The same in the sandbox that copies each instance's memory (`copy_memory`).
    AheadCopied(Arc<GuestPre>, Ready),
    PythonHook,
}

struct Way {
    label: &'static str,
    kind: Kind,
    latency: Series,
    /// Calls timed, and how many an instance made ahead served.
    timed: usize,
    served: usize,
    cpu_ns: u64,
    cpu_calls: usize,
    /// Latency back to back, and how many calls an instance made ahead served there.
    hot: Series,
    hot_served: usize,
}

impl Way {
    fn new(label: &'static str, kind: Kind) -> Way {
        Way {
            label,
            kind,
            latency: Series::default(),
            timed: 0,
            served: 0,
            cpu_ns: 0,
            cpu_calls: 0,
            hot: Series::default(),
            hot_served: 0,
        }
    }
}

struct Bench {
    sandbox: Sandbox,
    /// A sandbox with `copy_memory` and [`COPIED_RESIDENT`] (the Python section).
    copied: Sandbox,
    client: tokio::runtime::Runtime,
    hook: Option<Hook>,
    reads: SharedReads,
    limits: Limits,
}

impl Bench {
    /// One reconcile of `way`: whether an instance made ahead served it, and what is left to
    /// tidy (the runtime runs it while the actions' writes are on their way: after the clock).
    fn call(&mut self, kind: &Kind, request: &Request) -> (bool, Option<Tidy>) {
        let (reads, limits) = (self.reads.clone(), self.limits);
        let (outcome, tidy) = match kind {
            Kind::Native => {
                std::hint::black_box(webhook::native(request, &limits));
                return (false, None);
            }
            Kind::PythonHook => {
                let hook = self.hook.as_mut().expect("the Python webhook runs");
                std::hint::black_box(hook.answer(&self.client, request, &limits));
                return (false, None);
            }
            Kind::Path(guest) => {
                let call = (self.sandbox).reconcile("bench", guest.clone(), request, reads, limits);
                (self.client.block_on(call), None)
            }
            Kind::Ahead(guest, ready) | Kind::AheadCopied(guest, ready) => {
                let sandbox = match kind {
                    Kind::AheadCopied(..) => &self.copied,
                    _ => &self.sandbox,
                };
                let guest = guest.clone();
                let call = sandbox.reconcile_ahead("bench", guest, request, reads, limits, ready);
                let (outcome, tidy) = self.client.block_on(call);
                (outcome, Some(tidy))
            }
        };
        let outcome = outcome.expect("the sandbox reconciles");
        let served = outcome.made_ahead;
        std::hint::black_box(outcome);
        (served, tidy)
    }

    fn tidy(&self, tidy: Option<Tidy>) {
        if let Some(tidy) = tidy {
            self.client.block_on(tidy.run());
        }
    }

    /// `calls` spaced calls of `way`, timed.
    fn latency(&mut self, way: &mut Way, request: &Request, calls: usize) {
        let mut times = Vec::with_capacity(calls);
        for _ in 0..calls {
            std::thread::sleep(GAP);
            if let Kind::Ahead(_, ready) | Kind::AheadCopied(_, ready) = &way.kind {
                let waited = Instant::now();
                while !ready.holds() && waited.elapsed() < Duration::from_millis(5) {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
            let started = Instant::now();
            let (served, tidy) = self.call(&way.kind, request);
            times.push(started.elapsed());
            self.tidy(tidy);
            way.timed += 1;
            way.served += usize::from(served);
        }
        way.latency.add(times);
    }

    /// `calls` calls of `way` back to back, each timed; the process's CPU time they took.
    fn back_to_back(&mut self, way: &mut Way, request: &Request, calls: usize) {
        let mut times = Vec::with_capacity(calls);
        let before = cpu_ns();
        for _ in 0..calls {
            let started = Instant::now();
            let (served, tidy) = self.call(&way.kind, request);
            times.push(started.elapsed());
            self.tidy(tidy);
            way.hot_served += usize::from(served);
        }
        way.cpu_ns += cpu_ns() - before;
        way.cpu_calls += calls;
        way.hot.add(times);
    }
}

/// Prints the section: `guest` and `no_wasi` are HelloWorld's two builds.
pub fn section(iters: usize) {
    let perf_map = std::env::var_os("KUBEWASM_PERF_MAP").is_some();
    let sandbox = Sandbox::new(SandboxConfig {
        perf_map,
        ..SandboxConfig::default()
    })
    .expect("the sandbox starts");
    let load = |path: std::path::PathBuf| {
        let bytes =
            std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        sandbox.load(&bytes).expect("the guest loads")
    };
    let guest = load(common::guest("hello_world"));
    let no_wasi = load(common::guest_without_wasi("hello_world"));
    let candidate = super::candidate(&sandbox);
    let python_path = common::guest_dir().join("python_hello_world.wasm");
    let python = python_path.exists().then(|| load(python_path.clone()));
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the client's runtime");
    let hook = Hook::python(&client);
    let copied = Sandbox::new(SandboxConfig {
        copy_memory: true,
        resident_memory_bytes: COPIED_RESIDENT,
        perf_map,
        ..SandboxConfig::default()
    })
    .expect("the sandbox that copies memories starts");
    let mut bench = Bench {
        sandbox: sandbox.clone(),
        copied: copied.clone(),
        client,
        hook,
        reads: Arc::new(NoReads),
        limits: Limits::default(),
    };
    println!(
        "P1 as the runtime calls a busy controller: instances made ahead (Sandbox::reconcile_ahead with the controller's Ready, tidied after the clock) against instances made on the call's path; {ROUNDS} rounds interleaved; latency with a {} µs gap before each call, CPU per reconcile (every thread) back to back; freed memory reset: {:?}",
        GAP.as_micros(),
        sandbox.page_reset()
    );
    for (label, bytes, divisor) in [("1 KiB", 1 << 10, 1), ("64 KiB", 64 << 10, 20)] {
        let request = sized_request(bytes);
        let mut ways = vec![
            Way::new("native floor", Kind::Native),
            Way::new("wasip2, on the call's path", Kind::Path(guest.clone())),
            Way::new(
                "wasip2, made ahead",
                Kind::Ahead(guest.clone(), Ready::new()),
            ),
            Way::new("no WASI, on the call's path", Kind::Path(no_wasi.clone())),
            Way::new(
                "no WASI, made ahead",
                Kind::Ahead(no_wasi.clone(), Ready::new()),
            ),
        ];
        if let Some(candidate) = &candidate {
            ways.push(Way::new(
                "candidate, on the call's path",
                Kind::Path(candidate.clone()),
            ));
            ways.push(Way::new(
                "candidate, made ahead",
                Kind::Ahead(candidate.clone(), Ready::new()),
            ));
        }
        run(
            &mut bench,
            &mut ways,
            &request,
            (iters / divisor / ROUNDS).max(5),
        );
        print(label, &mut ways);
    }
    let Some(python) = python else {
        println!(
            "  the Python guest: {} is missing (make python-guests)",
            python_path.display()
        );
        return;
    };
    let request = sized_request(1 << 10);
    let prepares = |guest: &GuestPre| match guest.prepares() {
        true => "exports `prepare` (prepared when made ahead)",
        false => "exports no `prepare`",
    };
    println!("  the Python HelloWorld {}", prepares(&python));
    let mut ways = Vec::new();
    if bench.hook.is_some() {
        ways.push(Way::new("Python webhook (http.server)", Kind::PythonHook));
    }
    ways.push(Way::new(
        "Python guest, on the call's path",
        Kind::Path(python.clone()),
    ));
    ways.push(Way::new(
        "Python guest, made ahead",
        Kind::Ahead(python, Ready::new()),
    ));
    let bytes = std::fs::read(&python_path).expect("reading the Python guest");
    let python_copied = copied.load(&bytes).expect("the Python guest loads");
    ways.push(Way::new(
        "Python, made ahead, memory copied",
        Kind::AheadCopied(python_copied, Ready::new()),
    ));
    // Another build of the Python HelloWorld, beside it (say, the SDK changed).
    if let Some(bytes) = super::candidate_bytes("KUBEWASM_BENCH_PYTHON_CANDIDATE") {
        let mapped = sandbox.load(&bytes).expect("the Python candidate loads");
        println!("  the Python candidate {}", prepares(&mapped));
        let copied = copied.load(&bytes).expect("the Python candidate loads");
        ways.push(Way::new(
            "Python candidate, made ahead",
            Kind::Ahead(mapped, Ready::new()),
        ));
        ways.push(Way::new(
            "Python candidate, made ahead, memory copied",
            Kind::AheadCopied(copied, Ready::new()),
        ));
    }
    run(
        &mut bench,
        &mut ways,
        &request,
        (iters / 400 / ROUNDS).max(3),
    );
    print("the Python HelloWorld, 1 KiB", &mut ways);
}

fn run(bench: &mut Bench, ways: &mut Vec<Way>, request: &Request, per_round: usize) {
    if let Ok(only) = std::env::var("KUBEWASM_BENCH_WAYS") {
        ways.retain(|w| w.label.contains(only.as_str()));
        if ways.is_empty() {
            return;
        }
    }
    // Warm-up: two calls each make a controller busy (its next instance is then made ahead).
    for way in ways.iter_mut() {
        for _ in 0..2 {
            let (_, tidy) = bench.call(&way.kind, request);
            bench.tidy(tidy);
        }
    }
    for round in 0..ROUNDS {
        for k in 0..ways.len() {
            let i = (round + k) % ways.len();
            bench.latency(&mut ways[i], request, per_round);
            bench.back_to_back(&mut ways[i], request, per_round);
        }
    }
}

fn print(label: &str, ways: &mut [Way]) {
    if ways.is_empty() {
        return;
    }
    println!("  {label}:");
    println!(
        "    {:<34} {:>10} {:>10} {:>8} {:>12} | {:>10} {:>8} {:>12} | {:>10} {:>8}",
        "way",
        "spaced",
        "p99",
        "÷ first",
        "made ahead",
        "back2back",
        "÷ first",
        "made ahead",
        "CPU/call",
        "÷ first"
    );
    let first = ways[0].latency.median();
    let first_hot = ways[0].hot.median();
    let first_cpu = ways[0].cpu_ns as f64 / ways[0].cpu_calls.max(1) as f64;
    for way in ways.iter_mut() {
        let cpu = way.cpu_ns as f64 / way.cpu_calls.max(1) as f64;
        let median = way.latency.median();
        let hot = way.hot.median();
        println!(
            "    {:<34} {:>10} {:>10} {:>7.2}× {:>12} | {:>10} {:>7.2}× {:>12} | {:>10} {:>7.2}×",
            way.label,
            time(median),
            time(way.latency.quantile(0.99)),
            median.as_secs_f64() / first.as_secs_f64(),
            format!("{}/{}", way.served, way.timed),
            time(hot),
            hot.as_secs_f64() / first_hot.as_secs_f64(),
            format!("{}/{}", way.hot_served, way.cpu_calls),
            time(Duration::from_nanos(cpu as u64)),
            cpu / first_cpu
        );
    }
}
