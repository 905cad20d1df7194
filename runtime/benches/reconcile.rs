//! Cost of one reconcile of the HelloWorld seed request: `GuestPre::call` on one thread (a
//! fresh Store and instance per call, driven by a current-thread runtime), and
//! `Sandbox::reconcile` (the async path: instance slot, the call on the calling task, epoch
//! yields), plus module compile times and guest sizes. Then:
//!
//! - **P1**, the sandbox against the alternatives: HelloWorld grown to 1 KiB, 64 KiB and 1 MiB
//!   of JSON (an annotation of padding), reconciled five ways — `GuestPre::call`, the same
//!   guest built without WASI (`wasm32-unknown-unknown`), the same Rust function natively with
//!   the same JSON work (the floor), a Rust webhook and Metacontroller's Python webhook over
//!   loopback HTTP/1.1 (see `webhook/`) — interleaved in rounds, so that noise on the machine
//!   hits every way alike.
//! - **P5**, what epoch interruption costs a guest that computes: the hostile guest's
//!   `compute` mode on an Engine with it and on one without, interleaved.
//!
//! - **Python guests** (issue 25, `reconcile/python.rs`): the Python HelloWorld beside the Rust
//!   one — size, compile time with and without the compiled cache, phases, one reconcile at
//!   1 KiB interleaved with the other ways, memory per running instance.
//! - **P1 as the runtime calls a busy controller** (`reconcile/ahead.rs`): instances made
//!   ahead against instances made on the call's path, the native floor and the Python
//!   webhook; latency and CPU.
//! - **Shadow rollouts** (`reconcile/shadow.rs`): one reconcile without and with a candidate
//!   module called beside it, and the comparison of the two answers; latency and CPU.
//!
//! `make bench`, or `cargo bench -p kubewasm --bench reconcile [-- ITERATIONS] [python|shadow|ahead]`
//! (`python`: that section alone, `make bench-python`; `shadow`, `ahead`: that section alone);
//! `KUBEWASM_BENCH_ITERS` also sets the iterations (default 20000). To measure one change to
//! a guest or the SDK at a time, `KUBEWASM_BENCH_CANDIDATE=path/to/hello_world.wasm` adds
//! that build as a fifth way of P1, interleaved with the others (this machine is too noisy to
//! compare separate runs). `make test` runs it with
//! 20 iterations, a debug build, to keep it working: those numbers mean nothing.

use kubewasm_test_support::guests as common;
#[path = "reconcile/ahead.rs"]
mod ahead;
#[path = "reconcile/python.rs"]
mod python;
#[path = "reconcile/shadow.rs"]
mod shadow;
mod webhook;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kubewasm::sandbox::{
    Action, GuestPre, Limits, NoReads, Request, Response, Sandbox, SandboxConfig, SharedReads,
    request_to_wire,
};
use serde_json::{Value, json};

use webhook::{Answer, Hook};

const GUESTS: [&str; 3] = ["hello_world", "configmap_restarter", "hostile"];

/// Rounds of P1 (at most): each times a batch of every way in turn.
const P1_ROUNDS: usize = 25;

/// Rounds of P5 (at most): short ones, so that the two ways see the same moments.
const P5_ROUNDS: usize = 50;

/// `spec.rounds` of the hostile guest's `compute` mode in P5: a few milliseconds per call.
const P5_COMPUTE_ROUNDS: u64 = 2_000_000;

fn main() {
    let iters = iterations();
    let async_iters = (iters / 10).max(100);
    print_machine(iters);
    if std::env::args().skip(1).any(|a| a == "shadow") {
        let sandbox = Sandbox::new(SandboxConfig::default()).expect("the sandbox starts");
        let load = |name: &str| {
            let bytes = std::fs::read(common::guest(name)).expect("reading the guest");
            sandbox.load(&bytes).expect("the guest loads")
        };
        shadow::section(&load("hello_world"), load("hello_world_howdy"), iters);
        return;
    }
    if std::env::args().skip(1).any(|a| a == "ahead") {
        ahead::section(iters);
        return;
    }
    if std::env::args().skip(1).any(|a| a == "python") {
        let sandbox = Sandbox::new(SandboxConfig::default()).expect("the sandbox starts");
        let bytes = std::fs::read(common::guest("hello_world")).expect("reading the guest");
        let started = Instant::now();
        let guest = sandbox.load(&bytes).expect("the guest loads");
        println!(
            "module compile (cranelift, uncached): hello_world {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        python::section(guest, iters);
        return;
    }

    println!("guest sizes:");
    let mut modules = Vec::new();
    for name in GUESTS {
        let bytes = std::fs::read(common::guest(name)).expect("reading the guest");
        println!("  {name:<22} {:>9} bytes", bytes.len());
        modules.push((name, bytes));
    }

    println!("module compile (cranelift, uncached):");
    let sandbox = Sandbox::new(SandboxConfig::default()).expect("the sandbox starts");
    for (name, bytes) in &modules {
        let started = Instant::now();
        sandbox.load(bytes).expect("the guest loads");
        println!(
            "  {name:<22} {:>9.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
    }

    let guest = sandbox.load(&modules[0].1).expect("cached");
    let no_wasi = no_wasi(&sandbox);
    let candidate = candidate(&sandbox);
    let request = seed_request();
    let reads: SharedReads = Arc::new(NoReads);
    let limits = Limits::default();
    let mut times = time_calls(&guest, &request, &reads, &limits, 100, iters);
    report("GuestPre::call, one thread", &mut times);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut times = runtime.block_on(async {
        let mut times = Vec::with_capacity(async_iters);
        for _ in 0..async_iters {
            let started = Instant::now();
            let outcome = sandbox
                .reconcile(
                    "bench",
                    guest.clone(),
                    request.clone(),
                    reads.clone(),
                    limits,
                )
                .await
                .expect("reconcile");
            times.push(started.elapsed());
            std::hint::black_box(outcome);
        }
        times
    });
    report("Sandbox::reconcile, awaited one by one", &mut times);
    drop(runtime);

    for (label, bytes, divisor) in [
        ("1 KiB", 1 << 10, 1),
        ("64 KiB", 64 << 10, 20),
        ("1 MiB", 1 << 20, 200),
    ] {
        let calls = (iters / divisor).max(20);
        let request = sized_request(bytes);
        println!("GuestPre::call, {label} object: where the time goes, median of {calls} calls:");
        breakdown(&guest, &request, &reads, &limits, calls, false);
        println!(
            "GuestPre::call_wire, {label} object, its documents serialized once as the runtime keeps them (Watch::text), median of {calls} calls:"
        );
        breakdown(&guest, &request, &reads, &limits, calls, true);
        println!(
            "GuestPre::call, {label} object, the build without WASI: where the time goes, median of {calls} calls:"
        );
        breakdown(&no_wasi, &request, &reads, &limits, calls, false);
        if let Some(candidate) = &candidate {
            println!(
                "GuestPre::call, {label} object, the candidate build: where the time goes, median of {calls} calls:"
            );
            breakdown(candidate, &request, &reads, &limits, calls, false);
        }
    }
    p1(guest.clone(), no_wasi, candidate, iters);
    ahead::section(iters);
    let howdy = std::fs::read(common::guest("hello_world_howdy")).expect("reading the Howdy build");
    let howdy = sandbox.load(&howdy).expect("the Howdy build loads");
    shadow::section(&guest, howdy, iters);
    p5(&sandbox, &modules[2].1, iters);
    python::section(guest, iters);
}

/// The machine the numbers come from.
fn print_machine(iters: usize) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| k.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into());
    let build = if cfg!(debug_assertions) {
        "debug build: the numbers mean nothing"
    } else {
        "release build"
    };
    println!(
        "machine: {cores} cores (nproc), {cpu}, Linux {kernel}, load average {load}; {build}, {iters} iterations"
    );
}

/// Where one call's time goes: the median of each phase the sandbox measures
/// ([`kubewasm::sandbox::Phases`]) and of what is left of the caller's time after them (the
/// Store's teardown: the instance slot handed back, touched pages reset).
fn breakdown(
    guest: &GuestPre,
    request: &Request,
    reads: &SharedReads,
    limits: &Limits,
    calls: usize,
    serialized_once: bool,
) {
    let wire = request_to_wire(request);
    let mut parts: [Vec<f64>; 6] = Default::default();
    for _ in 0..calls {
        // The runtime hands over its own copy of the texts; made before the clock starts.
        let copy = serialized_once.then(|| wire.clone());
        let started = Instant::now();
        let outcome = if let Some(wire) = copy {
            guest.call(wire, reads.clone(), limits)
        } else {
            guest.call(request, reads.clone(), limits)
        }
        .expect("reconcile");
        let total = started.elapsed();
        let p = outcome.phases;
        let teardown = total.saturating_sub(p.setup + p.instantiate + p.request + p.call);
        for (i, d) in [p.setup, p.instantiate, p.request, p.call, teardown, total]
            .into_iter()
            .enumerate()
        {
            parts[i].push(d.as_secs_f64() * 1e6);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let names = [
        "setup (Store, limiter)",
        "instantiate",
        "request to WIT",
        "call (lower, guest, respond)",
        "teardown",
        "total",
    ];
    for (name, v) in names.iter().zip(parts.iter_mut()) {
        println!("    {name:<30} {:>7.1} µs", median(v));
    }
}

/// `calls` timings of `GuestPre::call` on this thread, after `warm_up` untimed calls.
fn time_calls(
    guest: &GuestPre,
    request: &Request,
    reads: &SharedReads,
    limits: &Limits,
    warm_up: usize,
    calls: usize,
) -> Vec<Duration> {
    for _ in 0..warm_up {
        guest.call(request, reads.clone(), limits).expect("warm-up");
    }
    (0..calls)
        .map(|_| {
            let started = Instant::now();
            let outcome = guest
                .call(request, reads.clone(), limits)
                .expect("reconcile");
            let elapsed = started.elapsed();
            std::hint::black_box(outcome);
            elapsed
        })
        .collect()
}

/// The ways P1 reconciles, in the order of its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Sandbox,
    /// The same guest built without WASI (`wasm32-unknown-unknown`).
    NoWasi,
    /// Another build of `hello_world.wasm` (`KUBEWASM_BENCH_CANDIDATE`).
    Candidate,
    /// The Python HelloWorld (`python_hello_world.wasm`, the Python section only).
    PythonGuest,
    Native,
    RustHook,
    PythonHook,
}

impl Way {
    fn label(self) -> &'static str {
        match self {
            Way::Sandbox => "sandbox (GuestPre::call)",
            Way::NoWasi => "sandbox, built without WASI",
            Way::Candidate => "sandbox, candidate build",
            Way::PythonGuest => "sandbox, Python guest",
            Way::Native => "native floor",
            Way::RustHook => "Rust webhook (axum, HTTP)",
            Way::PythonHook => "Python webhook (http.server)",
        }
    }
}

/// Everything P1 needs to reconcile each way.
struct Ways {
    guest: Arc<GuestPre>,
    /// The same guest built without WASI (P1 only).
    no_wasi: Option<Arc<GuestPre>>,
    candidate: Option<Arc<GuestPre>>,
    /// The Python guest, for the Python section.
    python_guest: Option<Arc<GuestPre>>,
    reads: SharedReads,
    limits: Limits,
    /// The current-thread runtime the HTTP client runs on (this thread).
    client: tokio::runtime::Runtime,
    rust: Hook,
    python: Option<Hook>,
}

impl Ways {
    fn start(
        guest: Arc<GuestPre>,
        no_wasi: Option<Arc<GuestPre>>,
        candidate: Option<Arc<GuestPre>>,
    ) -> Ways {
        let client = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the client's runtime");
        let rust = Hook::rust(&client);
        let python = Hook::python(&client);
        if python.is_none() {
            println!("python3 not found: the Python webhook column is skipped");
        }
        Ways {
            guest,
            no_wasi,
            candidate,
            python_guest: None,
            reads: Arc::new(NoReads),
            limits: Limits::default(),
            client,
            rust,
            python,
        }
    }

    fn all(&self) -> Vec<Way> {
        let mut ways = vec![Way::Sandbox];
        if self.no_wasi.is_some() {
            ways.push(Way::NoWasi);
        }
        if self.candidate.is_some() {
            ways.push(Way::Candidate);
        }
        ways.extend([Way::Native, Way::RustHook]);
        if self.python.is_some() {
            ways.push(Way::PythonHook);
        }
        ways
    }

    /// The hook of `way`, and the runtime its client runs on.
    fn hook(&mut self, way: Way) -> (&mut Hook, &tokio::runtime::Runtime) {
        let hook = match way {
            Way::RustHook => &mut self.rust,
            Way::PythonHook => self.python.as_mut().expect("the Python hook runs"),
            Way::Sandbox | Way::NoWasi | Way::Candidate | Way::PythonGuest | Way::Native => {
                unreachable!("{way:?} is no hook")
            }
        };
        (hook, &self.client)
    }

    /// The guest `way` calls (the shipped build, the one without WASI, the candidate or the
    /// Python guest).
    fn guest(&self, way: Way) -> &GuestPre {
        match way {
            Way::NoWasi => self.no_wasi.as_deref().expect("the build without WASI"),
            Way::Candidate => self.candidate.as_deref().expect("a candidate was given"),
            Way::PythonGuest => self.python_guest.as_deref().expect("the Python guest"),
            _ => &self.guest,
        }
    }

    fn answer(&mut self, way: Way, request: &Request) -> Answer {
        match way {
            Way::Sandbox | Way::NoWasi | Way::Candidate | Way::PythonGuest => Answer::Response(
                self.guest(way)
                    .call(request, self.reads.clone(), &self.limits)
                    .expect("the sandbox reconciles")
                    .response,
            ),
            Way::Native => Answer::Response(webhook::native(request, &self.limits)),
            Way::RustHook | Way::PythonHook => {
                let limits = self.limits;
                let (hook, client) = self.hook(way);
                hook.answer(client, request, &limits)
            }
        }
    }

    fn time(&mut self, way: Way, request: &Request, calls: usize) -> Vec<Duration> {
        match way {
            Way::Sandbox | Way::NoWasi | Way::Candidate | Way::PythonGuest => time_calls(
                self.guest(way),
                request,
                &self.reads,
                &self.limits,
                0,
                calls,
            ),
            Way::Native => (0..calls)
                .map(|_| {
                    let started = Instant::now();
                    let response = webhook::native(request, &self.limits);
                    let elapsed = started.elapsed();
                    std::hint::black_box(response);
                    elapsed
                })
                .collect(),
            Way::RustHook | Way::PythonHook => {
                let limits = self.limits;
                let (hook, client) = self.hook(way);
                hook.time(client, request, &limits, calls)
            }
        }
    }
}

/// The part of an answer every way must agree on: the Pod named after the parent, its
/// greeting, and the status.
#[derive(Debug, PartialEq)]
struct Greeting {
    pod: Value,
    command: Value,
    status: Value,
}

impl Greeting {
    fn of(answer: &Answer) -> Greeting {
        match answer {
            Answer::Response(response) => {
                let pod = response.actions.iter().find_map(|a| match a {
                    Action::Apply(o) if o["kind"] == "Pod" => Some(o),
                    _ => None,
                });
                let status = response.actions.iter().find_map(|a| match a {
                    Action::SetStatus(s) => Some(s.clone()),
                    _ => None,
                });
                let pod = pod.unwrap_or_else(|| panic!("no Pod applied: {response:?}"));
                Greeting {
                    pod: pod["metadata"]["name"].clone(),
                    command: pod["spec"]["containers"][0]["command"].clone(),
                    status: status.unwrap_or_else(|| panic!("no status set: {response:?}")),
                }
            }
            Answer::Metacontroller(desired) => {
                let pod = &desired["children"][0];
                Greeting {
                    pod: pod["metadata"]["name"].clone(),
                    command: pod["spec"]["containers"][0]["command"].clone(),
                    status: desired["status"].clone(),
                }
            }
        }
    }
}

/// Before timing: every way of `all` gives the same answer to `request` (the same response
/// exactly where the response is kubewasm's).
fn check_same_answer(ways: &mut Ways, all: &[Way], request: &Request) {
    let expected = Greeting {
        pod: json!("your-name"),
        command: json!(["echo", "Hello, Your Name!"]),
        status: json!({"pods": 0}),
    };
    let mut responses: Vec<(Way, Response)> = Vec::new();
    for &way in all {
        let answer = ways.answer(way, request);
        assert_eq!(Greeting::of(&answer), expected, "{}", way.label());
        if let Answer::Response(response) = answer {
            responses.push((way, response));
        }
    }
    for (way, response) in &responses[1..] {
        assert_eq!(
            response,
            &responses[0].1,
            "{} answers unlike {}",
            way.label(),
            responses[0].0.label()
        );
    }
}

/// HelloWorld built without WASI (`make guests`; docs/03-writing-a-controller.md, "Guests without WASI").
fn no_wasi(sandbox: &Sandbox) -> Arc<GuestPre> {
    let bytes = std::fs::read(common::guest_without_wasi("hello_world"))
        .expect("reading hello_world.wasm built without WASI");
    println!("hello_world built without WASI: {} bytes", bytes.len());
    sandbox.load(&bytes).expect("the build without WASI loads")
}

/// Another build of `hello_world.wasm` to measure beside the shipped one
/// (`KUBEWASM_BENCH_CANDIDATE`), loaded into `sandbox`.
fn candidate(sandbox: &Sandbox) -> Option<Arc<GuestPre>> {
    candidate_bytes("KUBEWASM_BENCH_CANDIDATE")
        .map(|bytes| sandbox.load(&bytes).expect("the candidate loads"))
}

/// The module the environment variable `var` names, read (its path and size printed), when
/// it is set.
fn candidate_bytes(var: &str) -> Option<Vec<u8>> {
    std::env::var_os(var).map(|path| {
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {var} {path:?}: {e}"));
        println!(
            "{var}: {} ({} bytes)",
            std::path::Path::new(&path).display(),
            bytes.len()
        );
        bytes
    })
}

/// P1: the sandbox against the native floor and two webhooks, interleaved.
fn p1(
    guest: Arc<GuestPre>,
    no_wasi: Arc<GuestPre>,
    candidate: Option<Arc<GuestPre>>,
    iters: usize,
) {
    let mut ways = Ways::start(guest, Some(no_wasi), candidate);
    let all = ways.all();
    println!(
        "P1: one HelloWorld reconcile, {} ways interleaved (rounds: a batch of each way in turn, the first way rotating)",
        all.len()
    );
    for (label, bytes, divisor) in [
        ("1 KiB", 1 << 10, 1),
        ("64 KiB", 64 << 10, 20),
        ("1 MiB", 1 << 20, 100),
    ] {
        let request = sized_request(bytes);
        check_same_answer(&mut ways, &all, &request);
        let calls = (iters / divisor).max(20);
        let rounds = P1_ROUNDS.min(calls);
        let batch = calls / rounds;
        for &way in &all {
            ways.time(way, &request, (calls / 10).clamp(2, 200));
        }
        let mut series: Vec<Series> = all.iter().map(|_| Series::default()).collect();
        for round in 0..rounds {
            for k in 0..all.len() {
                let i = (round + k) % all.len();
                series[i].add(ways.time(all[i], &request, batch));
            }
        }
        println!(
            "  {label} object ({rounds} rounds × {batch} calls per way; same answer from every way checked first):"
        );
        println!(
            "    {:<30} {:>11} {:>11}   {:<33} {:>10}",
            "way", "median", "p99", "round medians min / median / max", "÷ sandbox"
        );
        let sandbox = series[0].median();
        for (way, series) in all.iter().zip(&mut series) {
            let (min, mid, max) = series.round_medians();
            println!(
                "    {:<30} {:>11} {:>11}   {:<33} {:>9.2}×",
                way.label(),
                time(series.median()),
                time(series.quantile(0.99)),
                format!("{} / {} / {}", time(min), time(mid), time(max)),
                series.median().as_secs_f64() / sandbox.as_secs_f64()
            );
        }
    }
}

/// P5: the hostile guest's `compute` mode with epoch interruption and without, interleaved.
fn p5(sandbox: &Sandbox, hostile: &[u8], iters: usize) {
    let off = Sandbox::new(SandboxConfig {
        epoch_interruption: false,
        ..SandboxConfig::default()
    })
    .expect("a sandbox without epoch interruption");
    let guests = [
        ("on", sandbox.load(hostile).expect("hostile loads")),
        ("off", off.load(hostile).expect("hostile loads")),
    ];
    let request = Request::for_object(json!({
        "apiVersion": "example.com/v1",
        "kind": "Hostile",
        "metadata": {"name": "compute", "namespace": "default"},
        "spec": {"mode": "compute", "rounds": P5_COMPUTE_ROUNDS},
    }))
    .expect("a valid request")
    .with_controller("default/hostile");
    let reads: SharedReads = Arc::new(NoReads);
    let limits = Limits::default();
    let answers: Vec<Response> = guests
        .iter()
        .map(|(_, guest)| {
            guest
                .call(&request, reads.clone(), &limits)
                .expect("compute returns")
                .response
        })
        .collect();
    assert_eq!(answers[0], answers[1], "the same work both ways");

    let calls = (iters / 50).max(10);
    let rounds = P5_ROUNDS.min(calls);
    let batch = calls / rounds;
    let mut series = [Series::default(), Series::default()];
    for (_, guest) in &guests {
        time_calls(guest, &request, &reads, &limits, 2, 0);
    }
    let mut ratios = Vec::with_capacity(rounds);
    for round in 0..rounds {
        for k in 0..2 {
            let i = (round + k) % 2;
            let (_, guest) = &guests[i];
            series[i].add(time_calls(guest, &request, &reads, &limits, 0, batch));
        }
        let [on, off] = &series;
        ratios.push(on.last_round().as_secs_f64() / off.last_round().as_secs_f64());
    }
    ratios.sort_unstable_by(f64::total_cmp);
    println!(
        "P5: hostile `compute` ({P5_COMPUTE_ROUNDS} rounds of splitmix64, no host calls), epoch interruption on vs off, {rounds} rounds × {batch} calls each, interleaved:"
    );
    for ((label, _), series) in guests.iter().zip(&mut series) {
        let (min, mid, max) = series.round_medians();
        println!(
            "    epoch interruption {label:<3}  median {}, p99 {}, round medians {} / {} / {}",
            time(series.median()),
            time(series.quantile(0.99)),
            time(min),
            time(mid),
            time(max)
        );
    }
    let overhead =
        (series[0].median().as_secs_f64() / series[1].median().as_secs_f64() - 1.0) * 1e2;
    let round_overhead = |r: f64| format!("{:+.1}%", (r - 1.0) * 1e2);
    println!(
        "    overhead of epoch interruption: {overhead:+.1}% (medians); per round {} / {} / {} (min / median / max)",
        round_overhead(ratios[0]),
        round_overhead(ratios[ratios.len() / 2]),
        round_overhead(ratios[ratios.len() - 1])
    );
}

/// The timings of one way: every call, and the median of each round.
#[derive(Default)]
struct Series {
    calls: Vec<Duration>,
    round_medians: Vec<Duration>,
}

impl Series {
    fn add(&mut self, mut batch: Vec<Duration>) {
        batch.sort_unstable();
        self.round_medians.push(batch[batch.len() / 2]);
        self.calls.extend(batch);
    }

    fn last_round(&self) -> Duration {
        *self.round_medians.last().expect("a round")
    }

    fn quantile(&mut self, q: f64) -> Duration {
        self.calls.sort_unstable();
        self.calls[((self.calls.len() - 1) as f64 * q).round() as usize]
    }

    fn median(&mut self) -> Duration {
        self.quantile(0.5)
    }

    /// Min, median and max of the rounds' medians.
    fn round_medians(&self) -> (Duration, Duration, Duration) {
        let mut medians = self.round_medians.clone();
        medians.sort_unstable();
        (
            medians[0],
            medians[medians.len() / 2],
            medians[medians.len() - 1],
        )
    }
}

/// A time in µs, or in ms from 10 ms up.
fn time(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 10_000.0 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.1} µs")
    }
}

/// The seed HelloWorld with an annotation that makes its JSON `bytes` long.
fn sized_request(bytes: usize) -> Request {
    let mut object = seed_request().parent.expect("the seed has a parent");
    let base = object.to_string().len() + r#","annotations":{"padding":""}"#.len();
    let padding = "x".repeat(bytes.saturating_sub(base));
    object["metadata"]["annotations"] = json!({ "padding": padding });
    debug_assert_eq!(object.to_string().len(), bytes.max(base));
    Request::for_object(object)
        .expect("a valid request")
        .with_controller("default/hello-world")
}

/// The first numeric argument (cargo passes `--bench` too), else `KUBEWASM_BENCH_ITERS`,
/// else 20000.
fn iterations() -> usize {
    std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .or_else(|| {
            std::env::var("KUBEWASM_BENCH_ITERS")
                .ok()
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(20_000)
        .max(1)
}

fn seed_request() -> Request {
    Request::for_object(json!({
        "apiVersion": "example.com/v1",
        "kind": "HelloWorld",
        "metadata": {"name": "your-name", "namespace": "default"},
        "spec": {"who": "Your Name"},
    }))
    .expect("a valid request")
    .with_controller("default/hello-world")
}

fn report(what: &str, times: &mut [Duration]) {
    times.sort_unstable();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let at = |q: f64| us(times[((times.len() - 1) as f64 * q).round() as usize]);
    let mean = times.iter().map(|&d| us(d)).sum::<f64>() / times.len() as f64;
    println!(
        "{what} ({} calls): median {:.1} µs, p90 {:.1} µs, p99 {:.1} µs, mean {:.1} µs",
        times.len(),
        at(0.5),
        at(0.9),
        at(0.99),
        mean
    );
}
