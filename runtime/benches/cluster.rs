//! Whole-cluster benchmarks against a local control plane that this bench starts (etcd,
//! kube-apiserver and kube-controller-manager on loopback, no node: Pods stay Pending and a
//! deleted Pod is gone at once):
//!
//! - P2: a ConfigMap's data changes → its annotated Pods are deleted, by kubewasm's restarter,
//!   a native kube-rs loop (the floor) and the magalix tutorial's Python controller
//!   ([`restart`]);
//! - P4: 1,000 HelloWorlds created at once, until each has its Pod and status, by `kubewasm
//!   run` (as shipped and with its write caps lifted) and by a raw kube-rs client making the
//!   same writes ([`hello`]);
//! - P6: 3,000 HelloWorlds across 30 tenants, by 1, 2 and 3 `kubewasm run --leader-elect`
//!   replicas and by raw clients, one per tenant ([`tenants`]);
//! - state: the Chronos pod watcher over 10,000 Pods, then 1,000 of them relabelled: time,
//!   API writes, writes a second and bytes per object of the guest states ([`state`]).
//!
//! `make bench-cluster`, or `cargo bench -p kubewasm --bench cluster [-- WORDS]` with words
//! `p2`, `p4`, `p6`, `state` (default all), `tiny` (a few seconds' worth: proves it still runs),
//! `no-python`, and sizes `rounds=N` (P2: 20 per restarter; P4: 3 each of the lifted runtime
//! and the raw client; P6: 1 of each), `count=N` (P4: 1000 HelloWorlds; P6: 100 per tenant),
//! `shipped=N` (P4: 1 round of the runtime as shipped), `tenants=N` (P6: 30), `replicas=N`
//! (P6: 1, 2, …, N; 3), `pods=N` and `changes=N` (state: 10,000 and 1,000).
//! The Python controller needs the official `kubernetes` client in the venv
//! `$KUBEWASM_CACHE/py` (made by `make bench-cluster`); `tiny` leaves it out when it is missing.
//! Numbers are printed, never asserted.

use kubewasm_test_support as support;

use kubewasm_test_support::cluster;
#[allow(dead_code)]
#[path = "../tests/live/restarter.rs"]
mod restarter;
use kubewasm_test_support::runtime;

#[path = "cluster/hello.rs"]
mod hello;
// Its tests are not compiled here, and what only they use is unused.
#[allow(dead_code, unused_imports)]
#[path = "../tests/live/state.rs"]
mod pod_states;
#[path = "cluster/restart.rs"]
mod restart;
#[path = "cluster/state.rs"]
mod state;
#[path = "cluster/stats.rs"]
mod stats;
#[path = "cluster/tenants.rs"]
mod tenants;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use support::ControlPlane;

/// `RUST_LOG` of `kubewasm run` in the bench: `info`, as deployed.
pub const BENCH_LOG_FILTER: &str = "info";

/// `--max-writes-per-second` and `--write-burst` no round comes near: the operator's caps lifted.
pub const UNCAPPED: &str = "1000000";

/// The Python of the tutorial's controller.
mod python {
    use super::*;

    /// `$KUBEWASM_CACHE/py`: the venv with the official `kubernetes` client.
    pub fn venv() -> PathBuf {
        let cache = std::env::var_os("KUBEWASM_CACHE").map_or_else(
            || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/kubewasm"),
            PathBuf::from,
        );
        cache.join("py")
    }

    /// The venv's interpreter, if it has the `kubernetes` package.
    pub fn interpreter() -> Result<PathBuf> {
        let python = venv().join("bin/python");
        let ok = std::process::Command::new(&python)
            .args(["-c", "import kubernetes"])
            .output()
            .is_ok_and(|out| out.status.success());
        if !ok {
            bail!(
                "{} cannot import `kubernetes`: run `make bench-cluster` (or `python3 -m venv {venv} && {venv}/bin/pip install kubernetes`), or pass `no-python`",
                python.display(),
                venv = venv().display()
            );
        }
        Ok(python)
    }
}

/// What to run, from the words after `--`.
struct Plan {
    p2: Option<restart::Size>,
    p4: Option<hello::Size>,
    p6: Option<tenants::Size>,
    state: Option<state::Size>,
    python: bool,
}

impl Plan {
    fn from_args() -> Result<Plan> {
        let words: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with("--"))
            .collect();
        let mut sizes = std::collections::HashMap::new();
        for word in &words {
            if let Some((key, value)) = word.split_once('=') {
                if ![
                    "rounds", "count", "shipped", "tenants", "replicas", "pods", "changes",
                ]
                .contains(&key)
                {
                    bail!(
                        "unknown size `{key}`: expected rounds=N, count=N, shipped=N, tenants=N, replicas=N, pods=N or changes=N"
                    );
                }
                let n: usize = value
                    .parse()
                    .with_context(|| format!("`{word}`: not a number"))?;
                sizes.insert(key.to_owned(), n);
            } else if !["tiny", "p2", "p4", "p6", "state", "no-python"].contains(&word.as_str()) {
                bail!(
                    "unknown word `{word}`: expected p2, p4, p6, state, tiny, no-python or a size"
                );
            }
        }
        let has = |w: &str| words.iter().any(|a| a == w);
        let (p2, p4, p6, state) = match (has("p2"), has("p4"), has("p6"), has("state")) {
            (false, false, false, false) => (true, true, true, true),
            chosen => chosen,
        };
        let tiny = has("tiny");
        let size = |key: &str, full: usize, tiny_size: usize| {
            sizes
                .get(key)
                .copied()
                .unwrap_or(if tiny { tiny_size } else { full })
        };
        let p2 = p2.then(|| restart::Size {
            rounds: size("rounds", 20, 1),
            matching: if tiny { 2 } else { 5 },
        });
        let p4 = p4.then(|| hello::Size {
            count: size("count", 1000, 20),
            rounds: size("rounds", 3, 1),
            shipped_rounds: size("shipped", 1, 1),
        });
        let p6 = p6.then(|| tenants::Size {
            tenants: size("tenants", 30, 3),
            per_tenant: size("count", 100, 5),
            replicas: (1..=size("replicas", 3, 2)).collect(),
            rounds: size("rounds", 1, 1),
        });
        let state = state.then(|| state::Size {
            count: size("pods", 10_000, 50),
            changes: size("changes", 1000, 10),
        });
        let mut python = p2.is_some() && !has("no-python");
        if python && tiny && python::interpreter().is_err() {
            eprintln!(
                "P2: the Python controller is left out (no venv; `make bench-cluster` makes it)"
            );
            python = false;
        }
        Ok(Plan {
            p2,
            p4,
            p6,
            state,
            python,
        })
    }
}

fn main() -> Result<()> {
    let plan = Plan::from_args()?;
    if plan.python {
        python::interpreter()?;
    }
    let state_dir = ControlPlane::state_dir_of_this_process();
    let cp = ControlPlane::start(&state_dir, Some(std::process::id()))
        .context("starting the local control plane")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(run(&cp, &plan));
    drop(runtime);
    let stopped = cp.stop();
    result?;
    stopped
}

async fn run(cp: &ControlPlane, plan: &Plan) -> Result<()> {
    print_machine(cp);
    if let Some(size) = plan.p2 {
        restart::bench(cp, size, plan.python).await?;
    }
    if let Some(size) = plan.p4 {
        hello::bench(cp, size).await?;
    }
    if let Some(size) = plan.p6.clone() {
        tenants::bench(cp, size).await?;
    }
    if let Some(size) = plan.state {
        state::bench(cp, size).await?;
    }
    print_load("load at the end");
    Ok(())
}

/// CPUs, memory, load and the Kubernetes version: numbers mean little without them.
fn print_machine(cp: &ControlPlane) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").map(|m| m.trim().to_owned()))
        .unwrap_or_default();
    let version = cp
        .cluster_env()
        .get("KUBEWASM_KUBE_VERSION")
        .cloned()
        .unwrap_or_else(|| "an existing cluster".into());
    println!(
        "machine: {cpus} CPUs ({model}), {memory}; kube-apiserver {version} on loopback, no node"
    );
    println!(
        "kubewasm run: {} (`{}` names another); this bench, the native floor and the raw client: {} build",
        runtime::kubewasm_bin().display(),
        runtime::BIN_ENV,
        if cfg!(debug_assertions) {
            "debug (dependencies at opt-level 2)"
        } else {
            "release"
        }
    );
    print_load("load at the start");
}

fn print_load(what: &str) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!("{what} (1, 5, 15 min): {}", load.join(" "));
}
