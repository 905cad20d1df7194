//! Restart through the manager: how long `kubewasm run` takes until N WasmControllers whose
//! modules come from a registry are all `Ready` — on its first start (both caches empty), on a
//! restart with the compiled cache (`--compiled-cache-dir`) and the module cache
//! (`--module-cache-dir`) it filled, and on a restart with the module cache but an empty
//! compiled cache — and how long a moved tag takes until the status shows the new digest and
//! the new module reconciles (`--module-poll-seconds 1`).
//!
//! The bench starts a local control plane (no node) and a `docker-registry` on loopback. Each
//! of the N controllers lives in a namespace of its own (`restart-NNN`, one tenant each, as
//! many teams' controllers would: a tenant pulls one image at a time) with the hello-world
//! example's RBAC and WasmController, its module `spec.module.image` =
//! `REGISTRY/restart/mNNN:v1`: hello_world.wasm with a custom section naming its index, so
//! each has its own bytes, layer and manifest digests, pushed with `kubewasm push`. The runtime
//! is the `kubewasm` cargo built beside the bench (`KUBEWASM_RUN_BIN` names another); each run
//! is timed from spawning it until a watch has seen `Ready=True` on all N, statuses cleared
//! before. The runtime's counters (`/metrics`: modules compiled / from the compiled cache,
//! layers pulled / from the module cache) are read at that moment, so each row says what it
//! measured.
//!
//! `make bench-restart` (`cargo test -p kubewasm --bench restart -- N…`, default 1 and 100):
//! the dev profile, dependencies (wasmtime's cranelift among them) at opt-level 2.
//! `KUBEWASM_RESTART_MOVES` sets the tag moves per N (default 3).

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use kubewasm::api::WasmController;
use kubewasm_test_support::registry::Registry;
use kubewasm_test_support::runtime::{RuntimeProcess, kubewasm_bin};
use kubewasm_test_support::{ControlPlane, apply, apply_all, cluster, eventually, guests};
use serde_json::json;

/// The longest a runtime may take until all are Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// How long a moved tag may take to run.
const MOVE_TIMEOUT: Duration = Duration::from_secs(60);

/// Statuses cleared at once.
const PARALLEL_WRITES: usize = 16;

/// The runtime's log filter: as deployed.
const LOG_FILTER: &str = "info";

fn main() -> Result<()> {
    let mut sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .filter(|&n| n > 0)
        .collect();
    if sizes.is_empty() {
        sizes = vec![1, 100];
    }
    sizes.sort_unstable();
    sizes.dedup();
    let moves = std::env::var("KUBEWASM_RESTART_MOVES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3usize);
    println!(
        "restart: load average at the start {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let state_dir = ControlPlane::state_dir_of_this_process();
    let control_plane = ControlPlane::start(&state_dir, Some(std::process::id()))?;
    let registry = Registry::start()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let result = runtime.block_on(measure(&control_plane, &registry, &sizes, moves));
    control_plane.stop()?;
    let rows = result?;
    print_table(&rows);
    Ok(())
}

/// One start of the runtime until all N were Ready, and what it counted.
struct Run {
    ready: Duration,
    /// `kubewasm_modules_compiled`, `_from_compiled_cache`, `_pulled`, `_from_module_cache`.
    counts: [u64; 4],
}

/// What one N measured.
struct Row {
    n: usize,
    cold: Run,
    warm: Run,
    empty_compiled: Run,
    /// Per tag move: until the status showed the new digest, and until a HelloWorld created
    /// then was reconciled by it.
    moves: Vec<(Duration, Duration)>,
}

async fn measure(
    control_plane: &ControlPlane,
    registry: &Registry,
    sizes: &[usize],
    moves: usize,
) -> Result<Vec<Row>> {
    let client = control_plane.client().await?;
    cluster::ensure_crds(control_plane, &client).await?;
    let scratch = tempfile::tempdir()?;
    let hello = cluster::guest("hello_world");
    let mut rows = Vec::new();
    let mut existing = 0;
    for &n in sizes {
        let started = Instant::now();
        for i in existing..n {
            create(&client, registry, scratch.path(), &hello, i).await?;
        }
        eprintln!(
            "N={n}: pushed and declared {} modules in {:.1?}",
            n - existing,
            started.elapsed()
        );
        existing = n;
        // Fresh caches per N: the cold run fills them.
        let (compiled, modules) = (tempfile::tempdir()?, tempfile::tempdir()?);
        let empty = tempfile::tempdir()?;
        let runs = [
            ("cold: both caches empty", compiled.path()),
            ("restart: both caches filled", compiled.path()),
            ("restart: compiled cache empty", empty.path()),
        ];
        let mut measured = Vec::new();
        for (what, compiled_dir) in runs {
            let (mut runtime, run) = run_once(
                control_plane,
                &client,
                registry,
                compiled_dir,
                modules.path(),
                n,
            )
            .await;
            runtime.stop()?;
            let run = run.inspect_err(|_| runtime.report_failure())?;
            eprintln!(
                "N={n} {what}: Ready in {:.2?}; compiled {}, from the compiled cache {}, pulled {}, from the module cache {}",
                run.ready, run.counts[0], run.counts[1], run.counts[2], run.counts[3]
            );
            measured.push(run);
        }
        let (mut runtime, run) = run_once(
            control_plane,
            &client,
            registry,
            compiled.path(),
            modules.path(),
            n,
        )
        .await;
        run.inspect_err(|_| runtime.report_failure())?;
        let mut timed = Vec::new();
        for round in 0..moves {
            let took = move_tag(&client, registry, scratch.path(), &hello, n, round)
                .await
                .inspect_err(|_| runtime.report_failure())?;
            eprintln!(
                "N={n} tag move {round}: new digest in the status after {:.2?}, reconciled by it after {:.2?}",
                took.0, took.1
            );
            timed.push(took);
        }
        runtime.stop()?;
        eprintln!(
            "N={n}: the tag moves' runtime log: {}",
            runtime.keep_log().display()
        );
        let mut measured = measured.into_iter();
        let mut next = || measured.next().context("a run is missing");
        rows.push(Row {
            n,
            cold: next()?,
            warm: next()?,
            empty_compiled: next()?,
            moves: timed,
        });
    }
    Ok(rows)
}

/// Module `i`: hello_world with its own custom section (`round` > 0: a later build of it).
fn module(hello: &[u8], i: usize, round: usize) -> Vec<u8> {
    let payload = format!("restart bench module {i} build {round}");
    guests::with_custom_section(hello.to_vec(), "kubewasm-bench", payload.as_bytes())
}

/// Pushes module `i` as `restart/mNNN:v1` and declares namespace `restart-NNN` with the
/// hello-world example's RBAC and a WasmController of that image.
async fn create(
    client: &Client,
    registry: &Registry,
    scratch: &Path,
    hello: &[u8],
    i: usize,
) -> Result<()> {
    let ns = format!("restart-{i:03}");
    push(registry, scratch, &module(hello, i, 0), i)?;
    apply(
        client,
        &json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"kubewasm.dev/tenant": "enabled"}}}),
    )
    .await?;
    apply_all(client, &cluster::example("hello-world/rbac.yaml", &ns)?).await?;
    let mut controller = cluster::example("hello-world/controller.yaml", &ns)?;
    let mut controller = cluster::take(&mut controller, "WasmController")?;
    controller["spec"]["module"] = json!({"image": image(registry, i)});
    apply(client, &controller).await?;
    Ok(())
}

fn image(registry: &Registry, i: usize) -> String {
    format!("{}/restart/m{i:03}:v1", registry.addr())
}

/// `kubewasm push` of `wasm` as module `i`'s tag.
fn push(registry: &Registry, scratch: &Path, wasm: &[u8], i: usize) -> Result<()> {
    let file = scratch.join(format!("m{i:03}.wasm"));
    std::fs::write(&file, wasm)?;
    let out = std::process::Command::new(kubewasm_bin())
        .arg("push")
        .arg(&file)
        .arg(image(registry, i))
        .arg("--insecure")
        .env("DOCKER_CONFIG", "/nonexistent")
        .output()?;
    ensure!(
        out.status.success(),
        "kubewasm push failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `kubewasm run` on every namespace, pulling from `registry`, with both caches.
fn start(
    control_plane: &ControlPlane,
    registry: &Registry,
    compiled: &Path,
    modules: &Path,
) -> RuntimeProcess {
    let (compiled, modules) = (
        compiled.display().to_string(),
        modules.display().to_string(),
    );
    RuntimeProcess::start_with_log_filter(
        control_plane.kubeconfig(),
        "",
        &[
            "--insecure-registry",
            registry.addr(),
            "--module-poll-seconds",
            "1",
            "--compiled-cache-dir",
            &compiled,
            "--module-cache-dir",
            &modules,
        ],
        LOG_FILTER,
    )
}

/// Clears every status, starts `kubewasm run` with both caches, and times it until a watch
/// has seen all `n` WasmControllers Ready; reads its counters then. The runtime is left
/// running (the caller stops it, and shows its log if the run failed).
async fn run_once(
    control_plane: &ControlPlane,
    client: &Client,
    registry: &Registry,
    compiled: &Path,
    modules: &Path,
    n: usize,
) -> (RuntimeProcess, Result<Run>) {
    if let Err(e) = clear_statuses(client).await {
        let runtime = start(control_plane, registry, compiled, modules);
        return (runtime, Err(e));
    }
    // Watching before the runtime starts: no Ready can be missed.
    let api: Api<WasmController> = Api::all(client.clone());
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let listed = async {
        loop {
            if let watcher::Event::InitDone = events.next().await.context("the watch ended")?? {
                return anyhow::Ok(());
            }
        }
    };
    let listed = listed.await;
    let started = Instant::now();
    let runtime = start(control_plane, registry, compiled, modules);
    let run = match listed {
        Ok(()) => until_ready(&mut events, &runtime, n, started).await,
        Err(e) => Err(e),
    };
    (runtime, run)
}

/// Waits until `events` have shown all `n` WasmControllers Ready, and reads the runtime's
/// counters.
async fn until_ready(
    events: &mut futures::stream::BoxStream<
        '_,
        Result<watcher::Event<WasmController>, watcher::Error>,
    >,
    runtime: &RuntimeProcess,
    n: usize,
    started: Instant,
) -> Result<Run> {
    let mut ready = HashSet::new();
    let waited = tokio::time::timeout(READY_TIMEOUT, async {
        while ready.len() < n {
            match events.next().await.context("the watch ended")?? {
                watcher::Event::Apply(wc) | watcher::Event::InitApply(wc) => {
                    let key = format!("{}/{}", wc.namespace().unwrap_or_default(), wc.name_any());
                    if is_ready(&wc) {
                        ready.insert(key);
                    } else {
                        ready.remove(&key);
                    }
                }
                _ => {}
            }
        }
        anyhow::Ok(())
    })
    .await;
    let elapsed = started.elapsed();
    match waited {
        Ok(result) => result?,
        Err(_) => bail!(
            "{} of {n} WasmControllers Ready after {READY_TIMEOUT:?}",
            ready.len()
        ),
    }
    let (_, metrics) = runtime.http_get("/metrics").await?;
    let counter = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("kubewasm_{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    Ok(Run {
        ready: elapsed,
        counts: [
            counter("modules_compiled"),
            counter("modules_from_compiled_cache"),
            counter("modules_pulled"),
            counter("modules_from_module_cache"),
        ],
    })
}

fn is_ready(wc: &WasmController) -> bool {
    // Ready for this runtime: a status written since the statuses were cleared.
    wc.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Clears every WasmController's status, so that the next runtime's `Ready` is its own.
async fn clear_statuses(client: &Client) -> Result<()> {
    let all = Api::<WasmController>::all(client.clone())
        .list(&Default::default())
        .await?;
    futures::stream::iter(all.items)
        .map(|wc| async move {
            let ns = wc.namespace().unwrap_or_default();
            Api::<WasmController>::namespaced(client.clone(), &ns)
                .patch_status(
                    &wc.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": null})),
                )
                .await
                .with_context(|| format!("clearing the status of {ns}/{}", wc.name_any()))
        })
        .buffer_unordered(PARALLEL_WRITES)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Moves module 0's tag to a new build (of size `n`, move `round`) under a running runtime: the time until
/// its status shows the new digest (`ModuleReady=True`), and until a HelloWorld created then
/// has `status.pods` = 1 (reconciled by the module the status names).
async fn move_tag(
    client: &Client,
    registry: &Registry,
    scratch: &Path,
    hello: &[u8],
    n: usize,
    round: usize,
) -> Result<(Duration, Duration)> {
    let ns = "restart-000";
    // A build no N before pushed: other bytes, another digest.
    let wasm = module(hello, 0, n * 1000 + round + 1);
    let want = cluster::sha256(&wasm);
    push(registry, scratch, &wasm, 0)?;
    let moved = Instant::now();
    // To read against the runtime's log (its `module loaded` line of restart-000).
    eprintln!(
        "N={n} tag move {round}: pushed at {}",
        k8s_openapi::jiff::Timestamp::now()
    );
    let api: Api<WasmController> = Api::namespaced(client.clone(), ns);
    eventually(
        "the moved tag's digest in the status",
        MOVE_TIMEOUT,
        || async {
            let status = api.get("hello-world").await?.status.unwrap_or_default();
            let loaded = status.module_digest.as_deref() == Some(want.as_str())
                && cluster::condition(&status, "ModuleReady").is_ok_and(|c| c.status == "True");
            Ok(loaded.then_some(()))
        },
    )
    .await?;
    let in_status = moved.elapsed();
    let name = format!("moved-{n}-{round}");
    cluster::create_hello_world(client, ns, &name, "restart").await?;
    cluster::wait_status_pods(client, ns, &name, 1).await?;
    Ok((in_status, moved.elapsed()))
}

fn print_table(rows: &[Row]) {
    println!(
        "\n`kubewasm run` from spawn until all N are Ready (modules from a registry, one per namespace):"
    );
    println!("| N | run | Ready | compiled / from compiled cache | pulled / from module cache |");
    println!("|---:|---|---:|---:|---:|");
    for r in rows {
        for (what, run) in [
            ("first start, both caches empty", &r.cold),
            ("restart, both caches filled", &r.warm),
            ("restart, compiled cache empty", &r.empty_compiled),
        ] {
            println!(
                "| {} | {what} | {:.2} s | {} / {} | {} / {} |",
                r.n,
                run.ready.as_secs_f64(),
                run.counts[0],
                run.counts[1],
                run.counts[2],
                run.counts[3]
            );
        }
    }
    println!(
        "\nTag moved (`kubewasm push` done) → the status shows the new digest, → a HelloWorld created then is reconciled (`--module-poll-seconds 1`):"
    );
    println!("| N | moves | new digest in the status | reconciled by the new module |");
    println!("|---:|---:|---|---|");
    for r in rows {
        let show = |pick: fn(&(Duration, Duration)) -> Duration| {
            r.moves
                .iter()
                .map(|m| format!("{:.2} s", pick(m).as_secs_f64()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "| {} | {} | {} | {} |",
            r.n,
            r.moves.len(),
            show(|m| m.0),
            show(|m| m.1)
        );
    }
}
