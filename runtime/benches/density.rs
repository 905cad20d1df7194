//! Density: how long one `kubewasm run` takes until N WasmControllers are all `Ready`, and
//! how much memory it holds then, on a local control plane this bench starts (no node).
//!
//! For each N (ascending; default 10, 100, 500, 1000) the bench first creates what is missing
//! of N namespaces `density-NNNN`, each with the hello-world example's ServiceAccount, Role
//! and RoleBinding, its own module ConfigMap (the same `hello_world.wasm` bytes) and its
//! WasmController, and prints how long that took, then waits until the API server has been
//! asked no write for 3 s (kube-controller-manager adds each new namespace's ServiceAccount
//! and root CA ConfigMap for a while after; runs beside that measured it, not the runtime;
//! its token Secrets, which 1.20 still makes and Kubernetes 1.24 on do not, are left out:
//! `KUBEWASM_NO_TOKEN_CONTROLLER`). Only then is the runtime started, so the
//! times below measure the runtime alone: from spawning the release binary to the moment the
//! bench's watch sees condition `Ready=True` on all N, with VmRSS and VmHWM
//! (`/proc/PID/status`) and the CPU time it used (`/proc/PID/stat`) read at that moment.
//!
//! Cold and warm: the runtime's only compilation cache is in its process (one compiled
//! component per module digest, `sandbox::Sandbox::load`); there is no on-disk cache, so
//! every start compiles `hello_world.wasm` once. *cold* is the first start after the N
//! objects were created (nothing has listed them for a runtime yet); *warm* is every later
//! start of a fresh process on the same objects (the API server, etcd and the page cache
//! have served them before). Cold and warm runs alternate (cold, warm, warm, ...); between
//! runs the runtime is stopped (SIGTERM) and every status is cleared.
//!
//! After each warm run, the floor ([`floor_once`]): the API calls a runtime cannot do without
//! (list the WasmControllers and the ConfigMaps' metadata, read each module ConfigMap, write
//! each `Ready` status), made by a raw kube-rs client on the same API server, so that the
//! runtime's time reads against what the API server on these cores can do.
//!
//! Each run prints what the API server was asked meanwhile, by verb and resource, from its own
//! metrics (`density/requests.rs`).
//!
//! `KUBEWASM_DENSITY_CANDIDATE=<another kubewasm>` runs it too, a warm run beside each of the
//! runtime's (the first alternating), to measure one change side by side.
//! `KUBEWASM_DENSITY_EXAMPLE=configmap-restarter` runs the ConfigMap restarter in every namespace
//! instead of HelloWorld (its parent is every ConfigMap of its namespace, its own module
//! ConfigMap included: a cache of a core kind with large objects).
//!
//! `KUBEWASM_DENSITY_IMAGE=1` takes the module from a registry instead (`density/image.rs`):
//! pushed once, named by digest by every WasmController, the runtime run with its module and
//! compiled caches; `KUBEWASM_DENSITY_EXAMPLE=python-hello-world` (the Python HelloWorld, too
//! large for a ConfigMap) implies it. The floor then reads no module.
//!
//! `cargo bench -p kubewasm --bench density [-- N...]`; `KUBEWASM_DENSITY_ROUNDS` sets the
//! warm rounds per N (default 3), `KUBEWASM_DENSITY_BINARY` another `kubewasm` binary to
//! measure (e.g. a copy of an older build; default: the one cargo built). Tiny mode for `make test`: `cargo test -p kubewasm --bench
//! density -- 3` (a debug build: its numbers mean nothing). With `KUBEWASM_DENSITY_PERF`
//! set, each run is profiled (`perf record --call-graph dwarf -p`, start to all Ready). Each
//! run prints what the API server was asked (`density/requests.rs`) and the CPU time the API
//! server and etcd used beside the runtime's (`density/cpu.rs`); with
//! `KUBEWASM_APISERVER_PROFILING=true KUBEWASM_DENSITY_APISERVER_PROFILE=<seconds>`, a CPU
//! profile of the API server over each run's first seconds, beside its log. The runtime's log of each run is
//! kept in the control plane's state directory (`RUST_LOG` is passed on, default
//! `kubewasm=info`).

use kubewasm_test_support as support;

use kubewasm_test_support::cluster;

#[path = "density/cpu.rs"]
mod cpu;
#[path = "density/image.rs"]
mod image;
#[path = "density/requests.rs"]
mod requests;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use kubewasm::api::WasmController;
use serde_json::{Value, json};

use cpu::ControlPlaneCpu;
use image::Modules;
use requests::Requests;
use support::{ControlPlane, FIELD_MANAGER};

/// Sizes measured when none are given.
const SIZES: [usize; 4] = [10, 100, 500, 1000];

/// Label on every namespace the bench creates.
const DENSITY_LABEL: &str = "kubewasm.dev/density";

/// Objects created (or statuses cleared) at once.
const PARALLEL_WRITES: usize = 16;

/// The longest a runtime may take until all are Ready before the run counts as failed.
const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// How the API server names a WasmController's status write in its metrics.
const STATUS_WRITES: &str = "PATCH kubewasm.dev/wasmcontrollers/status";

/// The longest the bench waits for kube-controller-manager to be done with new namespaces.
const SETTLE_LIMIT: Duration = Duration::from_secs(600);

/// How long a stopping runtime may take before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

fn main() -> Result<()> {
    let sizes = sizes();
    let rounds: usize = std::env::var("KUBEWASM_DENSITY_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let example = Example::from_env()?;
    let wasm = cluster::guest(example.guest);
    let state_dir = ControlPlane::state_dir_of_this_process();
    // No token Secret per ServiceAccount (as from Kubernetes 1.24 on): 1.20's token controller
    // would write 20,000 for 10,000 namespaces, for most of an hour, beside every run.
    let control_plane = ControlPlane::start_without_tokens(&state_dir, Some(std::process::id()))?;
    let runtime = tokio::runtime::Runtime::new()?;
    let result = runtime.block_on(measure(
        &control_plane,
        &state_dir,
        example,
        &wasm,
        &sizes,
        rounds,
    ));
    control_plane.stop()?;
    let rows = result?;
    print_tables(&rows);
    Ok(())
}

/// Sizes from the command line (numbers; cargo's own `--bench` is skipped), else [`SIZES`].
fn sizes() -> Vec<usize> {
    let mut sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .filter(|&n| n > 0)
        .collect();
    if sizes.is_empty() {
        sizes = SIZES.to_vec();
    }
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// What one N measured.
struct Row {
    n: usize,
    /// Objects created to reach N (namespaces of the sizes before it already existed).
    created: usize,
    create: Duration,
    cold: Run,
    warm: Vec<Run>,
    /// [`floor_once`] after each warm run: the API calls alone.
    floor: Vec<Duration>,
    /// Warm runs of `KUBEWASM_DENSITY_CANDIDATE`, one per round beside the runtime's.
    candidate: Vec<Run>,
}

/// One start of the runtime until all are Ready.
#[derive(Debug)]
struct Run {
    ready: Duration,
    rss_kib: u64,
    hwm_kib: u64,
    /// The runtime's CPU time (user and system) from its start to all Ready.
    cpu: Duration,
    /// What it asked of the API server from its start to all Ready.
    asked: Requests,
    /// The API server's and etcd's CPU time meanwhile.
    control_plane_cpu: ControlPlaneCpu,
}

async fn measure(
    control_plane: &ControlPlane,
    state_dir: &Path,
    example: Example,
    wasm: &[u8],
    sizes: &[usize],
    rounds: usize,
) -> Result<Vec<Row>> {
    let client = control_plane.client().await?;
    cluster::ensure_crds(control_plane, &client).await?;
    let binary = std::env::var_os("KUBEWASM_DENSITY_BINARY").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_kubewasm")),
        PathBuf::from,
    );
    let image_mode = matches!(example.module, Declared::Image)
        || std::env::var("KUBEWASM_DENSITY_IMAGE").is_ok_and(|v| !v.is_empty() && v != "0");
    let modules = if image_mode {
        Modules::push(&binary, wasm)?
    } else {
        Modules::ConfigMap
    };
    let fixture = Fixture::new(&client, example, wasm, &modules).await?;
    let candidate = std::env::var_os("KUBEWASM_DENSITY_CANDIDATE").map(PathBuf::from);
    eprintln!(
        "runtime: {}; every namespace runs deploy/examples/{} (KUBEWASM_DENSITY_EXAMPLE), its module ({} bytes) {}",
        binary.display(),
        example.dir,
        wasm.len(),
        match modules.image() {
            Some(image) => format!(
                "from a registry, {image} (KUBEWASM_DENSITY_IMAGE), with the runtime's module and compiled caches"
            ),
            None => "in a ConfigMap of its own".into(),
        }
    );
    let runtime_args = modules.runtime_args();
    if let Some(c) = &candidate {
        eprintln!(
            "candidate (KUBEWASM_DENSITY_CANDIDATE): {}, a warm run beside each of the runtime's, the first alternating",
            c.display()
        );
    }
    let mut rows = Vec::new();
    let mut existing = 0;
    for &n in sizes {
        let started = Instant::now();
        futures::stream::iter(existing..n)
            .map(|i| fixture.create(i))
            .buffer_unordered(PARALLEL_WRITES)
            .try_collect::<Vec<()>>()
            .await?;
        let create = started.elapsed();
        let created = n - existing;
        existing = n;
        eprintln!("N={n}: created {created} namespaces with their objects in {create:.1?}");
        let settled = Requests::quiet(&client, SETTLE_LIMIT).await?;
        eprintln!(
            "N={n}: the control plane was done with the new namespaces {settled:.1?} later (no write for 3 s)"
        );
        let mut cold = None;
        let mut warm = Vec::new();
        let mut floor = Vec::new();
        let mut candidate_runs = Vec::new();
        for round in 0..=rounds {
            let candidate_first = round % 2 == 0;
            let candidate_run = |c| {
                run_candidate(
                    c,
                    &runtime_args,
                    control_plane.kubeconfig(),
                    &client,
                    n,
                    state_dir,
                    round,
                )
            };
            if let Some(c) = candidate.as_ref().filter(|_| round > 0 && candidate_first) {
                candidate_runs.push(candidate_run(c).await?);
            }
            clear_statuses(&client).await?;
            let log = state_dir.join(format!("kubewasm-density-{n}-{round}.log"));
            let run = run_once(
                &binary,
                &runtime_args,
                control_plane.kubeconfig(),
                &client,
                n,
                &log,
            )
            .await?;
            eprintln!(
                "N={n} {}: Ready in {:.2?}, VmRSS {} KiB, VmHWM {} KiB, CPU {:.2?}",
                if round == 0 { "cold" } else { "warm" },
                run.ready,
                run.rss_kib,
                run.hwm_kib,
                run.cpu
            );
            run.asked.print("its start", n);
            run.control_plane_cpu
                .print("its start", ("the runtime", Some(run.cpu)), run.ready);
            if round == 0 {
                cold = Some(run);
            } else {
                warm.push(run);
                clear_statuses(&client).await?;
                let asked_before = Requests::read(&client).await?;
                let (cpu_before, own_before) = (ControlPlaneCpu::read(), own_cpu());
                let profiling = cpu::profile_api_server(
                    &client,
                    state_dir.join(format!("floor-{n}-{round}.apiserver.pprof")),
                );
                let took = floor_once(&client, n, wasm.len()).await?;
                let (cpu, own) = (ControlPlaneCpu::read().since(&cpu_before), own_cpu());
                if let Some(profiling) = profiling {
                    let _ = profiling.await;
                }
                eprintln!("N={n} floor: the same API calls by a raw client in {took:.2?}");
                Requests::read(&client)
                    .await?
                    .since(&asked_before)
                    .print("the floor", n);
                let own = own
                    .ok()
                    .zip(own_before.ok())
                    .map(|(a, b)| a.saturating_sub(b));
                cpu.print("the floor", ("the bench (the floor's client)", own), took);
                floor.push(took);
                if let Some(c) = candidate.as_ref().filter(|_| !candidate_first) {
                    candidate_runs.push(candidate_run(c).await?);
                }
            }
        }
        rows.push(Row {
            n,
            created,
            create,
            cold: cold.context("no cold run")?,
            warm,
            floor,
            candidate: candidate_runs,
        });
    }
    Ok(rows)
}

/// The example every namespace runs (`KUBEWASM_DENSITY_EXAMPLE`).
#[derive(Debug, Clone, Copy)]
struct Example {
    /// Its directory under `deploy/examples/`.
    dir: &'static str,
    /// The guest (`<guest>.wasm`).
    guest: &'static str,
    /// Where its controller.yaml takes the module from.
    module: Declared,
    /// A manifest whose cluster-scoped objects it needs too (the runtime's watch of its
    /// parent kind), when its own `rbac.yaml` leaves them to another example.
    cluster_rbac: Option<&'static str>,
}

impl Example {
    /// `hello-world` (the default: parent a small CRD) or `configmap-restarter` (parent every
    /// ConfigMap of the namespace, its own module ConfigMap included: what a cache of a core
    /// kind with large objects costs), or `python-hello-world` (HelloWorld in Python, from a
    /// registry).
    fn from_env() -> Result<Example> {
        match std::env::var("KUBEWASM_DENSITY_EXAMPLE").as_deref() {
            Err(_) | Ok("hello-world") => Ok(Example {
                dir: "hello-world",
                guest: "hello_world",
                module: Declared::ConfigMap {
                    name: "hello-controller",
                    key: "hello_world.wasm",
                },
                cluster_rbac: None,
            }),
            Ok("configmap-restarter") => Ok(Example {
                dir: "configmap-restarter",
                guest: "configmap_restarter",
                module: Declared::ConfigMap {
                    name: "configmap-restarter",
                    key: "configmap_restarter.wasm",
                },
                cluster_rbac: None,
            }),
            Ok("python-hello-world") => Ok(Example {
                dir: "python-hello-world",
                guest: "python_hello_world",
                module: Declared::Image,
                cluster_rbac: Some("hello-world/rbac.yaml"),
            }),
            Ok(other) => bail!(
                "KUBEWASM_DENSITY_EXAMPLE={other}: expected hello-world, configmap-restarter or python-hello-world"
            ),
        }
    }
}

/// Where an example's controller.yaml takes its module from.
#[derive(Debug, Clone, Copy)]
enum Declared {
    /// A ConfigMap's key, which the bench makes in every namespace (unless modules come from
    /// a registry: `KUBEWASM_DENSITY_IMAGE`).
    ConfigMap {
        name: &'static str,
        key: &'static str,
    },
    /// An image: the module is larger than a ConfigMap holds.
    Image,
}

/// Creates the objects of one namespace, with each kind resolved once.
struct Fixture {
    client: Client,
    /// The example's RBAC, WasmController and the module ConfigMap, in namespace `NAMESPACE`
    /// (replaced per namespace).
    objects: Vec<(ApiResource, Value)>,
}

const NAMESPACE: &str = "density-placeholder";

impl Fixture {
    async fn new(
        client: &Client,
        example: Example,
        wasm: &[u8],
        modules: &Modules,
    ) -> Result<Fixture> {
        let mut docs = cluster::example(&format!("{}/rbac.yaml", example.dir), NAMESPACE)?;
        if let Some(rbac) = example.cluster_rbac {
            // Only the runtime's watch of the parent kind: the rest is the example's own.
            let cluster_roles = cluster::example(rbac, NAMESPACE)?
                .into_iter()
                .filter(|d| d["kind"] == "ClusterRole");
            docs.extend(cluster_roles);
        }
        let mut controller =
            cluster::example(&format!("{}/controller.yaml", example.dir), NAMESPACE)?;
        match (modules.image(), example.module) {
            (Some(image), _) => {
                for doc in controller
                    .iter_mut()
                    .filter(|d| d["kind"] == "WasmController")
                {
                    doc["spec"]["module"] = json!({ "image": image });
                }
            }
            (None, Declared::ConfigMap { name, key }) => {
                docs.push(cluster::module_config_map(NAMESPACE, name, key, wasm));
            }
            (None, Declared::Image) => bail!("{}: its module comes from a registry", example.dir),
        }
        docs.extend(controller);
        let mut objects = Vec::new();
        for doc in docs {
            let api_version = doc["apiVersion"].as_str().context("no apiVersion")?;
            let kind = doc["kind"].as_str().context("no kind")?;
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
            let gvk = GroupVersionKind::gvk(group, version, kind);
            let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
                .await
                .with_context(|| format!("discovering {kind} ({api_version})"))?;
            if caps.scope == kube::discovery::Scope::Cluster {
                // Once for all namespaces (the runtime's aggregated watch role).
                support::apply(client, &doc).await?;
            } else {
                objects.push((resource, doc));
            }
        }
        Ok(Fixture {
            client: client.clone(),
            objects,
        })
    }

    /// Namespace `density-NNNN` (`index`) and its objects, server-side applied.
    async fn create(&self, index: usize) -> Result<()> {
        let ns = format!("density-{index:04}");
        let namespace: Namespace = serde_json::from_value(json!({
            // Enabled by the cluster admin, as every tenant namespace must be.
            "metadata": {"name": ns, "labels": {DENSITY_LABEL: "true", "kubewasm.dev/tenant": "enabled"}}
        }))?;
        match Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &namespace)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e).context(format!("creating namespace {ns}")),
        }
        for (resource, doc) in &self.objects {
            let object = cluster::in_namespace(doc.clone(), &ns);
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &ns, resource)
                .patch(
                    name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&object),
                )
                .await
                .with_context(|| format!("applying {} {ns}/{name}", resource.kind))?;
        }
        Ok(())
    }
}

/// Clears the status of every WasmController, so that the next runtime starts from nothing
/// and the bench sees its own `Ready`.
async fn clear_statuses(client: &Client) -> Result<()> {
    let api: Api<WasmController> = Api::all(client.clone());
    let all = api.list(&Default::default()).await?;
    futures::stream::iter(all.items.into_iter().filter(|wc| wc.status.is_some()))
        .map(|wc| {
            let ns = wc.namespace().unwrap_or_default();
            let api: Api<WasmController> = Api::namespaced(client.clone(), &ns);
            async move {
                api.patch_status(
                    &wc.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": null})),
                )
                .await
                .with_context(|| format!("clearing the status of {ns}/{}", wc.name_any()))
            }
        })
        .buffer_unordered(PARALLEL_WRITES)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Starts the runtime, waits until all `n` WasmControllers are Ready, reads its memory, and
/// stops it.
async fn run_once(
    binary: &Path,
    args: &[String],
    kubeconfig: &Path,
    client: &Client,
    n: usize,
    log: &Path,
) -> Result<Run> {
    // Watching before the runtime starts: no Ready can be missed.
    let api: Api<WasmController> = Api::all(client.clone());
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    let mut ready = HashSet::new();
    let mut listed = false;
    while !listed {
        match events.next().await.context("the watch ended")?? {
            watcher::Event::InitDone => listed = true,
            _ => continue,
        }
    }
    let log_file = std::fs::File::create(log)?;
    let asked_before = Requests::read(client).await?;
    let cpu_before = ControlPlaneCpu::read();
    let profiling = cpu::profile_api_server(client, log.with_extension("apiserver.pprof"));
    let started = Instant::now();
    let mut child = Command::new(binary)
        .arg("run")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "kubewasm=info".into()),
        )
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let mut profiler = profile(child.id(), log)?;
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
    let memory = support::runtime::memory_kib(child.id());
    let cpu = support::runtime::cpu_time(child.id());
    let control_plane_cpu = ControlPlaneCpu::read().since(&cpu_before);
    let asked = Requests::read(client).await;
    if let Some(profiling) = profiling {
        let _ = profiling.await;
    }
    if let Some(perf) = &mut profiler {
        Command::new("kill")
            .arg("-INT")
            .arg(perf.id().to_string())
            .status()?;
        perf.wait()?;
    }
    stop(&mut child).await?;
    match waited {
        Ok(result) => result?,
        Err(_) => bail!(
            "{} of {n} WasmControllers Ready after {READY_TIMEOUT:?}; the runtime's log: {}",
            ready.len(),
            log.display()
        ),
    }
    let (rss_kib, hwm_kib) = memory?;
    let asked = asked?.since(&asked_before);
    ensure!(
        asked.count(STATUS_WRITES) >= n as f64,
        "the API server counted {} status writes for {n} controllers made Ready: are its metrics read right?",
        asked.count(STATUS_WRITES)
    );
    Ok(Run {
        ready: elapsed,
        rss_kib,
        hwm_kib,
        cpu: cpu?,
        asked,
        control_plane_cpu,
    })
}

/// One warm run of the candidate binary, from cleared statuses.
async fn run_candidate(
    binary: &Path,
    args: &[String],
    kubeconfig: &Path,
    client: &Client,
    n: usize,
    state_dir: &Path,
    round: usize,
) -> Result<Run> {
    clear_statuses(client).await?;
    let log = state_dir.join(format!("kubewasm-density-{n}-{round}-candidate.log"));
    let run = run_once(binary, args, kubeconfig, client, n, &log).await?;
    eprintln!(
        "N={n} candidate: Ready in {:.2?}, VmRSS {} KiB, VmHWM {} KiB, CPU {:.2?}",
        run.ready, run.rss_kib, run.hwm_kib, run.cpu
    );
    run.asked.print("its start", n);
    run.control_plane_cpu
        .print("its start", ("the runtime", Some(run.cpu)), run.ready);
    Ok(run)
}

/// The API server's part of making `n` controllers Ready, with nothing of kubewasm: a raw
/// kube-rs client makes the calls a starting runtime cannot do without — list the
/// WasmControllers and the ConfigMaps' metadata, read each module ConfigMap by name (as the
/// runtime does, from the watch cache), write each status with `Ready=True` — as many in
/// flight as the runtime ([`RUNTIME_IN_FLIGHT`]). No access review, no compile, no watch of
/// the parent kind: a floor, not a runtime. A module from a registry is not read (it is one
/// image for all: `module_bytes` long).
async fn floor_once(client: &Client, n: usize, module_bytes: usize) -> Result<Duration> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{ListParams, VersionMatch};
    use kube::core::PartialObjectMeta;

    let started = Instant::now();
    let from_cache = ListParams::default().match_any();
    let controllers = Api::<WasmController>::all(client.clone())
        .list(&from_cache)
        .await?;
    let metadata = Api::<PartialObjectMeta<ConfigMap>>::all(client.clone())
        .list_metadata(&from_cache)
        .await?;
    let versions: std::collections::HashMap<(String, String), String> = metadata
        .items
        .into_iter()
        .filter_map(|m| Some(((m.namespace()?, m.name_any()), m.metadata.resource_version?)))
        .collect();
    let done = futures::stream::iter(controllers.items)
        .map(|wc| {
            let ns = wc.namespace().unwrap_or_default();
            let cm = wc.spec.module.config_map.clone();
            let version = cm
                .as_ref()
                .and_then(|c| versions.get(&(ns.clone(), c.name.clone())).cloned());
            let image = wc.spec.module.image.is_some();
            async move {
                let bytes = if image {
                    module_bytes
                } else {
                    let cm = cm.context("a WasmController without a module ConfigMap")?;
                    let mut by_name =
                        ListParams::default().fields(&format!("metadata.name={}", cm.name));
                    if let Some(v) = &version {
                        by_name = by_name.at(v).matching(VersionMatch::NotOlderThan);
                    }
                    let found = Api::<ConfigMap>::namespaced(client.clone(), &ns)
                        .list(&by_name)
                        .await?;
                    let bytes = found
                        .items
                        .first()
                        .and_then(|c| c.binary_data.as_ref()?.get(&cm.key))
                        .map_or(0, |b| b.0.len());
                    ensure!(bytes > 0, "no module in ConfigMap {ns}/{}", cm.name);
                    bytes
                };
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                let condition = |type_: &str, status: &str, reason: &str, message: String| {
                    json!({"type": type_, "status": status, "reason": reason, "message": message,
                        "observedGeneration": wc.metadata.generation, "lastTransitionTime": now})
                };
                let status = json!({"status": {
                    "conditions": [
                        condition("ModuleReady", "True", "ModuleLoaded", format!("module of {bytes} bytes is loaded")),
                        condition("Ready", "True", "Running", "reconciling its parents".into()),
                        condition("Degraded", "False", "ReconcilesSucceeding", "the last reconciles succeeded".into()),
                    ],
                    "observedGeneration": wc.metadata.generation,
                    "reconciles": 0,
                    "failures": 0,
                }});
                Api::<WasmController>::namespaced(client.clone(), &ns)
                    .patch_status(&wc.name_any(), &PatchParams::default(), &Patch::Merge(&status))
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(RUNTIME_IN_FLIGHT)
        .try_collect::<Vec<()>>()
        .await?;
    ensure!(done.len() == n, "{} WasmControllers, want {n}", done.len());
    Ok(started.elapsed())
}

/// This process's CPU time (the floor's client, and the bench's own watch).
fn own_cpu() -> Result<Duration> {
    support::runtime::cpu_time(std::process::id())
}

/// Requests the runtime has in flight when it starts controllers (`PARALLEL_STARTS` and
/// `PARALLEL_STATUS_WRITES` in `runtime/core/src/manager`).
const RUNTIME_IN_FLIGHT: usize = 32;

/// With `KUBEWASM_DENSITY_PERF` set: `perf record` of the runtime until all are Ready,
/// written next to its log (`.perf.data`).
fn profile(pid: u32, log: &Path) -> Result<Option<Child>> {
    if std::env::var_os("KUBEWASM_DENSITY_PERF").is_none() {
        return Ok(None);
    }
    let perf = Command::new("perf")
        // DWARF unwinding: the release binary keeps no frame pointers.
        .args([
            "record",
            "-F",
            "299",
            "--call-graph",
            "dwarf,16384",
            "-q",
            "-o",
        ])
        .arg(log.with_extension("perf.data"))
        .arg("-p")
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .spawn()
        .context("starting perf")?;
    Ok(Some(perf))
}

fn is_ready(wc: &WasmController) -> bool {
    wc.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// SIGTERM, then SIGKILL after [`STOP_TIMEOUT`].
async fn stop(child: &mut Child) -> Result<()> {
    Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()?;
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("the runtime did not stop within {STOP_TIMEOUT:?}: killing it");
    child.kill()?;
    child.wait()?;
    Ok(())
}

fn print_tables(rows: &[Row]) {
    println!(
        "\nCreating the objects (namespace, ServiceAccount, Role, RoleBinding, the module ConfigMap unless modules come from a registry, WasmController; {PARALLEL_WRITES} namespaces at once):"
    );
    println!("| N | namespaces created | time | per namespace |");
    println!("|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.1} s | {:.1} ms |",
            r.n,
            r.created,
            r.create.as_secs_f64(),
            r.create.as_secs_f64() * 1e3 / r.created.max(1) as f64
        );
    }
    println!(
        "\n`kubewasm run` from start until all N are Ready (objects created beforehand); memory when they are:"
    );
    println!(
        "| N | cold: Ready | cold: VmRSS / VmHWM | warm: Ready min / median / max | warm: VmRSS median | warm: VmHWM max | floor: the API calls alone, min / median / max |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let mut ready: Vec<f64> = r.warm.iter().map(|w| w.ready.as_secs_f64()).collect();
        ready.sort_by(f64::total_cmp);
        let mut rss: Vec<u64> = r.warm.iter().map(|w| w.rss_kib).collect();
        rss.sort_unstable();
        let hwm = r.warm.iter().map(|w| w.hwm_kib).max().unwrap_or(0);
        let mut floor: Vec<f64> = r.floor.iter().map(Duration::as_secs_f64).collect();
        floor.sort_by(f64::total_cmp);
        println!(
            "| {} | {:.2} s | {} / {} | {:.2} / {:.2} / {:.2} s | {} | {} | {:.2} / {:.2} / {:.2} s |",
            r.n,
            r.cold.ready.as_secs_f64(),
            mib(r.cold.rss_kib),
            mib(r.cold.hwm_kib),
            ready[0],
            median(&ready),
            ready[ready.len() - 1],
            mib(median(&rss.iter().map(|&k| k as f64).collect::<Vec<_>>()) as u64),
            mib(hwm),
            floor[0],
            median(&floor),
            floor[floor.len() - 1],
        );
    }
    if rows.iter().all(|r| r.candidate.is_empty()) {
        return;
    }
    println!(
        "
The candidate (`KUBEWASM_DENSITY_CANDIDATE`), warm, beside the runtime's warm runs above:"
    );
    println!("| N | warm: Ready min / median / max | warm: VmRSS median | warm: VmHWM max |");
    println!("|---:|---:|---:|---:|");
    for r in rows.iter().filter(|r| !r.candidate.is_empty()) {
        let mut ready: Vec<f64> = r.candidate.iter().map(|w| w.ready.as_secs_f64()).collect();
        ready.sort_by(f64::total_cmp);
        let mut rss: Vec<f64> = r.candidate.iter().map(|w| w.rss_kib as f64).collect();
        rss.sort_by(f64::total_cmp);
        let hwm = r.candidate.iter().map(|w| w.hwm_kib).max().unwrap_or(0);
        println!(
            "| {} | {:.2} / {:.2} / {:.2} s | {} | {} |",
            r.n,
            ready[0],
            median(&ready),
            ready[ready.len() - 1],
            mib(median(&rss) as u64),
            mib(hwm),
        );
    }
}

/// The median of sorted values (the mean of the middle two for an even count).
fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

fn mib(kib: u64) -> String {
    format!("{:.0} MiB", kib as f64 / 1024.0)
}
