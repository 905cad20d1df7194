//! Cost of one reconcile of the HelloWorld seed request: `GuestPre::call` on one thread (a
//! fresh Store and instance per call, driven by a current-thread runtime), and
//! `Sandbox::reconcile` (the async path: instance slot, the call on the calling task, epoch
//! yields), plus module compile times and guest sizes; then `GuestPre::call` with the same
//! HelloWorld grown to 1 KiB, 64 KiB and 1 MiB of JSON (an annotation of padding).
//!
//! `make bench`, or `cargo bench -p kubewasm --bench reconcile [-- ITERATIONS]`;
//! `KUBEWASM_BENCH_ITERS` also sets the iterations (default 20000).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kubewasm::sandbox::{GuestPre, Limits, NoReads, Request, Sandbox, SandboxConfig, SharedReads};
use serde_json::json;

const GUESTS: [&str; 3] = ["hello_world", "configmap_restarter", "hostile"];

fn main() {
    let iters = iterations();
    let async_iters = (iters / 10).max(100);

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
                .reconcile(guest.clone(), request.clone(), reads.clone(), limits)
                .await
                .expect("reconcile");
            times.push(started.elapsed());
            std::hint::black_box(outcome);
        }
        times
    });
    report("Sandbox::reconcile, awaited one by one", &mut times);

    for (label, bytes, divisor) in [
        ("1 KiB", 1 << 10, 1),
        ("64 KiB", 64 << 10, 20),
        ("1 MiB", 1 << 20, 200),
    ] {
        let request = sized_request(bytes);
        let calls = (iters / divisor).max(20);
        let mut times = time_calls(
            &guest,
            &request,
            &reads,
            &limits,
            (calls / 10).max(5),
            calls,
        );
        report(&format!("GuestPre::call, {label} object"), &mut times);
        breakdown(&guest, &request, &reads, &limits, calls);
    }
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
) {
    let mut parts: [Vec<f64>; 6] = Default::default();
    for _ in 0..calls {
        let started = Instant::now();
        let outcome = guest
            .call(request, reads.clone(), limits)
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
        "setup (Store, WASI)",
        "instantiate",
        "request to WIT",
        "call (lower, guest, respond)",
        "teardown",
        "total",
    ];
    println!("  where the time goes, median of {calls} calls:");
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
