//! Step 7: a hostile tenant against the runtime as installed (two replicas, its own RBAC from
//! `deploy/`, JSON logs, the real node). Namespace `e2e-hostile`, opted in, declares specs that
//! name a URL instead of an apiVersion (the API server refuses them) and a controller whose
//! guest logs a million empty lines, tries to forge runtime log lines, floods stdout, loops and
//! allocates. Meanwhile the HelloWorld tutorial keeps being served: `who` patched, its new Pod
//! prints the new greeting. No runtime Pod restarts (no crash, no OOM kill), every line the
//! leader logged is one JSON object, none forged, and the tenant's guest lines stay within its
//! log rate (the Deployment's defaults: 100 lines/s, burst 1000). Then 20 busy controllers are
//! deleted at once and the tutorial is served right after; then the tenant stores 24 MiB of
//! ConfigMaps with large annotations while one of its controllers may read ConfigMaps: the
//! namespace is held back from the caches (`CacheBudgetExceeded`), the tutorial is still
//! served, and the leader's peak memory stays under its container's limit. Last, with its
//! caches still at their cap, it fills the formula's other terms at once: a gzip bomb named by
//! 16 controllers (module reads) and a module whose compile meets the Deployment's
//! `--compile-memory` (512Mi): the bomb's controllers say `ModuleInvalid`, the heavy module is
//! `Quarantined` naming the limit, the tutorial is served, the runtime process stays under its
//! share of the limit and the container under the limit, and nothing restarts.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::cluster::{
    NodeCluster, RUNTIME_SELECTOR, SYSTEM, WAIT, patch_who, wait_greeting, wait_running,
};
use crate::module_file::restarts;
use crate::support::hostile_registry::{HostileRegistry, MARKER};
use crate::support::{LogLines, apply, apply_all, eventually, json_log_lines, tenant_binding};
use crate::timings::{Timings, secs};

const NS: &str = "e2e-hostile";
const GROUP: &str = "e2e.kubewasm.dev";

/// The Deployment's `--max-log-lines-per-second` and `--log-line-burst` (the defaults).
const LOG_LINES_PER_SECOND: u64 = 100;
const LOG_LINE_BURST: u64 = 1000;

/// How long the storm runs before the checks.
const STORM: Duration = Duration::from_secs(30);

pub async fn hostile_tenant(
    cluster: &NodeCluster,
    hostile_wasm: &std::path::Path,
    timings: &mut Timings,
) -> Result<()> {
    let client = &cluster.client;
    let before = restarts(cluster).await?;
    let started = Instant::now();
    install(cluster, hostile_wasm).await?;

    // Specs that name a URL as their parent's apiVersion: refused by the CRD's schema.
    for api_version in [
        "apps/v1/namespaces/hello/deployments?watch=1&timeoutSeconds=86400",
        "apps/v1?a=b",
    ] {
        let mut spec = controller("url");
        spec["spec"]["parent"] = json!({"apiVersion": api_version, "kind": "Deployment"});
        if apply(client, &spec).await.is_ok() {
            bail!("the API server took apiVersion {api_version:?}");
        }
    }

    apply(client, &controller("storm")).await?;
    let modes = ["log-lines", "forge-log", "flood", "loop", "alloc"];
    for mode in modes {
        for copy in 0..2 {
            let probe = json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Probe",
                "metadata": {"name": format!("{mode}-{copy}"), "namespace": NS,
                    "labels": {"role": "storm"}},
                "spec": {"mode": mode}});
            eventually("the Probe CRD served", WAIT, || async {
                apply(client, &probe).await.map(Some)
            })
            .await?;
        }
    }
    timings.note(format!(
        "hostile tenant installed, specs refused, storm started: {}",
        secs(started.elapsed())
    ));

    // The tutorial is served during the storm.
    tokio::time::sleep(STORM / 2).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "hello");
    let old = pods.get("your-name").await?.uid().unwrap_or_default();
    let patched = Instant::now();
    patch_who(&cluster.kubectl, "Storm").await?;
    wait_greeting(
        client,
        "hello",
        "your-name",
        "Hello, Storm!",
        Some(&old),
        WAIT,
    )
    .await?;
    timings.note(format!(
        "during the storm, who patched -> new Pod your-name Succeeded: {}",
        secs(patched.elapsed())
    ));
    tokio::time::sleep(STORM.saturating_sub(started.elapsed())).await;

    // Nothing restarted (no crash, no OOM kill), on either replica.
    let after = restarts(cluster).await?;
    ensure!(
        after == before,
        "runtime Pods restarted during the storm: before {before:?}, after {after:?}"
    );
    // The replica holding the hostile tenant's shard runs its controllers and caches.
    let leader = crate::cluster::runner_pod(client, NS).await?;
    let log = cluster
        .kubectl
        .run(&["-n", SYSTEM, "logs", &leader])
        .await?;
    let LogLines { lines, guest } = json_log_lines(&log, &format!("{NS}/storm"))?;
    let running = started.elapsed();
    let bound = LOG_LINE_BURST + LOG_LINES_PER_SECOND * (running.as_secs() + 1);
    timings.note(format!(
        "{leader} (runs {NS}): {lines} log lines in all, {guest} of them the hostile tenant's guests' in {} (its rate allows {bound}); no restart",
        secs(running)
    ));
    ensure!(
        guest <= bound,
        "the hostile tenant's guests logged {guest} lines, more than its rate allows ({bound})"
    );
    ensure!(
        guest > 0,
        "no line of the hostile tenant's guests at all: is it running?"
    );
    let leader_pod = Api::<Pod>::namespaced(client.clone(), SYSTEM)
        .get(&leader)
        .await?;

    many_stopped_at_once(cluster, timings).await?;
    hoarded(cluster, &leader_pod, timings).await?;
    let after = restarts(cluster).await?;
    ensure!(
        after == before,
        "runtime Pods restarted: before {before:?}, after {after:?}"
    );
    // The operator's rollout replaces the Pods: from here on, no restart of the new ones.
    let (registry, leader_pod) = hostile_registry(cluster, &leader_pod, timings).await?;
    let before = restarts(cluster).await?;
    formula_filled(cluster, &leader_pod, &registry, timings).await?;
    let after = restarts(cluster).await?;
    ensure!(
        after == before,
        "runtime Pods restarted: before {before:?}, after {after:?}"
    );
    cluster
        .kubectl
        .run(&["delete", "namespace", NS, "--wait=false"])
        .await?;
    Ok(())
}

/// Controllers stopped together: busy ones (their guests loop until the operator's time limit)
/// deleted at once.
const MANY: usize = 20;

/// `MANY` controllers whose guests loop are deleted at once; the tutorial is served right
/// after (stops run beside the manager, each bounded by its grace period, not one by one).
async fn many_stopped_at_once(cluster: &NodeCluster, timings: &mut Timings) -> Result<()> {
    let client = &cluster.client;
    let probe = json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Probe",
        "metadata": {"name": "busy", "namespace": NS, "labels": {"role": "busy"}},
        "spec": {"mode": "loop"}});
    apply(client, &probe).await?;
    let names: Vec<String> = (0..MANY).map(|i| format!("busy-{i}")).collect();
    for name in &names {
        let mut spec = controller(name);
        spec["spec"]["parent"]["labelSelector"] = json!("role=busy");
        apply(client, &spec).await?;
    }
    let wcs = wasm_controllers(client);
    eventually(
        "the busy controllers running their guests",
        WAIT,
        || async {
            let mut running = 0;
            for name in &names {
                let wc = wcs.get(name).await?;
                if wc
                    .data
                    .pointer("/status/reconciles")
                    .and_then(Value::as_u64)
                    > Some(0)
                {
                    running += 1;
                }
            }
            Ok((running >= MANY / 2).then_some(()))
        },
    )
    .await?;
    let stopping = Instant::now();
    for name in &names {
        wcs.delete(name, &Default::default()).await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "hello");
    let old = pods.get("your-name").await?.uid().unwrap_or_default();
    patch_who(&cluster.kubectl, "Many").await?;
    wait_greeting(
        client,
        "hello",
        "your-name",
        "Hello, Many!",
        Some(&old),
        WAIT,
    )
    .await?;
    timings.note(format!(
        "{MANY} busy controllers deleted at once, then who patched -> new Pod your-name Succeeded: {} after the first delete",
        secs(stopping.elapsed())
    ));
    Ok(())
}

/// ConfigMaps the tenant stores, each with an annotation of `HOARD_BYTES` (the API server
/// takes at most 256 KiB of annotations per object): 24 MiB in all, over the Deployment's
/// `--max-cached-bytes-per-namespace` (16Mi).
const HOARD: usize = 120;
const HOARD_BYTES: usize = 200 << 10;

/// The runtime process's share of the Deployment's container memory limit (1408Mi: the rest,
/// 512Mi, is the compiler process's, `--compile-memory`).
const MEMORY_LIMIT: u64 = 896 << 20;

/// A controller that may read ConfigMaps makes the runtime cache them; the tenant then stores
/// more than its cap in ConfigMaps with large annotations. Its controller says
/// `CacheBudgetExceeded`, the tutorial is still served, and the leader's peak memory stays
/// under the container's limit.
async fn hoarded(cluster: &NodeCluster, leader: &Pod, timings: &mut Timings) -> Result<()> {
    let client = &cluster.client;
    let pid = leader_host_pid(leader)?;
    let (rss_before, _) = memory(pid)?;
    let mut hoarder = controller("hoarder");
    hoarder["spec"]["parent"]["labelSelector"] = json!("role=hoarder");
    hoarder["spec"]["grants"] =
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "verbs": ["get", "list"]}]);
    apply(client, &hoarder).await?;
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), NS);
    let hoarding = Instant::now();
    let annotation = "x".repeat(HOARD_BYTES);
    for i in 0..HOARD {
        let cm = serde_json::from_value(json!({
            "metadata": {"name": format!("hoard-{i}"), "annotations": {"hoard": annotation}},
        }))?;
        config_maps.create(&Default::default(), &cm).await?;
    }
    held_back(client).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "hello");
    let old = pods.get("your-name").await?.uid().unwrap_or_default();
    let patched = Instant::now();
    patch_who(&cluster.kubectl, "Hoard").await?;
    wait_greeting(
        client,
        "hello",
        "your-name",
        "Hello, Hoard!",
        Some(&old),
        WAIT,
    )
    .await?;
    let (rss, peak) = memory(pid)?;
    timings.note(format!(
        "{} MiB of ConfigMaps stored by the tenant in {}: held back, who patched -> Succeeded in {}; leader memory {} MiB before, {} MiB after, peak {} MiB (the runtime's share of the limit: {} MiB)",
        (HOARD * HOARD_BYTES) >> 20,
        secs(hoarding.elapsed()),
        secs(patched.elapsed()),
        rss_before >> 20,
        rss >> 20,
        peak >> 20,
        MEMORY_LIMIT >> 20
    ));
    ensure!(
        peak < MEMORY_LIMIT,
        "the leader's peak memory {peak} B is over the runtime's share of the container's limit"
    );
    Ok(())
}

/// Waits until the hoarder is held back at its namespace's cache cap.
async fn held_back(client: &kube::Client) -> Result<()> {
    let wcs = wasm_controllers(client);
    eventually(
        "the hoarder held back: Ready=False, CacheBudgetExceeded",
        WAIT,
        || async {
            let ready = condition(&wcs.get("hoarder").await?, "Ready");
            match ready["reason"] == "CacheBudgetExceeded" && ready["status"] == "False" {
                true => Ok(Some(())),
                false => bail!("Ready is {ready}"),
            }
        },
    )
    .await
}

/// The tenant's own registry (`kubewasm_test_support::hostile_registry`), where the runtime's
/// Pods reach it: on the node's address (the test runs on the node), named by the operator as
/// a plain-HTTP registry (`--insecure-registry`, which also lets the runtime contact its
/// private address): the Deployment patched as an operator would, and rolled out. Returns the
/// registry and the Pod now running the tenant.
async fn hostile_registry(
    cluster: &NodeCluster,
    leader: &Pod,
    timings: &mut Timings,
) -> Result<(HostileRegistry, Pod)> {
    let client = &cluster.client;
    let node_ip = leader
        .status
        .as_ref()
        .and_then(|s| s.host_ip.clone())
        .context("the runtime Pod has no hostIP")?;
    let registry = HostileRegistry::start_on(&node_ip).await?;
    let started = Instant::now();
    let patch = json!([{"op": "add", "path": "/spec/template/spec/containers/0/args/-",
        "value": format!("--insecure-registry={}", registry.addr())}])
    .to_string();
    let kubectl = &cluster.kubectl;
    kubectl
        .run(&[
            "-n",
            SYSTEM,
            "patch",
            "deployment",
            "kubewasm",
            "--type=json",
            "-p",
            &patch,
        ])
        .await?;
    kubectl
        .run(&[
            "-n",
            SYSTEM,
            "rollout",
            "status",
            "deployment/kubewasm",
            "--timeout=300s",
        ])
        .await?;
    let old: Vec<String> = leader.metadata.name.clone().into_iter().collect();
    wait_running(client, SYSTEM, RUNTIME_SELECTOR, 2, &old, WAIT).await?;
    let runner = eventually("a new Pod runs the tenant", WAIT, || async {
        Ok(Some(crate::cluster::runner_pod(client, NS).await?))
    })
    .await?;
    // Its caches filled to their cap again.
    held_back(client).await?;
    timings.note(format!(
        "the operator allowed the tenant's registry {} (--insecure-registry), rolled out; {runner} runs the tenant, its caches at their cap again: {}",
        registry.addr(),
        secs(started.elapsed())
    ));
    let pod = Api::<Pod>::namespaced(client.clone(), SYSTEM)
        .get(&runner)
        .await?;
    Ok((registry, pod))
}

/// The Deployment's container memory limit: the runtime's share and one compile's.
const CONTAINER_LIMIT: u64 = 1408 << 20;

/// The tenant's registry's attacks a controller pulls from in the formula's step, and what its
/// status says of each.
const PULLED: [(&str, &str); 2] = [
    ("endless-token", "token is larger than 64Ki"),
    ("endless-manifest", "manifest is larger than 1Mi"),
];

/// Controllers naming the gzip bomb.
const BOMBED: usize = 16;

/// The formula's terms at once, the tenant's caches still held at their cap (`hoarded`): a gzip
/// bomb (64 MiB of zeros, 63 KiB gzipped) named by [`BOMBED`] controllers, and a module of one
/// function of 800,000 operations (5.6 MB, about 341 KB gzipped in a ConfigMap) whose compile
/// needs about 470 MiB of memory, past the Deployment's `--compile-memory=512Mi` as the kernel
/// counts it (`RLIMIT_DATA` counts what is mapped writable, not only what is touched).
async fn formula_filled(
    cluster: &NodeCluster,
    leader: &Pod,
    registry: &HostileRegistry,
    timings: &mut Timings,
) -> Result<()> {
    use std::io::Write as _;
    let client = &cluster.client;
    let pid = leader_host_pid(leader)?;
    let started = Instant::now();
    let gzip = |bytes: &[u8]| -> Result<Vec<u8>> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(bytes)?;
        Ok(gz.finish()?)
    };
    let heavy = crate::support::guests::heavy_component(
        800_000,
        127,
        crate::support::guests::Operands::Ring,
    );
    let hex = crate::cluster::sha256(&heavy)
        .trim_start_matches("sha256:")
        .to_owned();
    let heavy_gz = gzip(&heavy)?;
    let bomb_gz = gzip(&vec![0u8; 64 << 20])?;
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let module = |name: &str, config_map: &str| {
        let mut c = controller(name);
        c["spec"]["module"] = json!({"configMap": {"name": config_map, "key": "module.wasm"}});
        c["spec"]["parent"]["labelSelector"] = json!(format!("role={name}"));
        c
    };
    let mut objects = vec![
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "heavy", "namespace": NS},
            "binaryData": {"module.wasm": b64(&heavy_gz)}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bomb", "namespace": NS},
            "binaryData": {"module.wasm": b64(&bomb_gz)}}),
        module("heavy", "heavy"),
    ];
    objects.extend((0..BOMBED).map(|i| module(&format!("bomb-{i:02}"), "bomb")));
    // The tenant's registry: an endless token, an endless manifest.
    for (repository, _) in PULLED {
        let mut c = controller(repository);
        c["spec"]["module"] = json!({"image": registry.image(repository)});
        c["spec"]["parent"]["labelSelector"] = json!(format!("role={repository}"));
        objects.push(c);
    }
    apply_all(client, &objects).await?;

    let wcs = wasm_controllers(client);
    let module_ready = |name: String, check: fn(&Value, &str) -> bool, hex: String| {
        let wcs = wcs.clone();
        async move {
            let c = condition(&wcs.get(&name).await?, "ModuleReady");
            match check(&c, &hex) {
                true => Ok(Some(())),
                false => bail!("{name}: ModuleReady is {c}"),
            }
        }
    };
    eventually(
        "the heavy module quarantined, naming the limit",
        WAIT,
        || {
            module_ready(
                "heavy".into(),
                |c, hex| {
                    c["reason"] == "Quarantined"
                        && c["message"]
                            .as_str()
                            .is_some_and(|m| m.contains(hex) && m.contains("512 MiB"))
                },
                hex.clone(),
            )
        },
    )
    .await?;
    let quarantined = started.elapsed();
    for i in 0..BOMBED {
        eventually("a bomb's controller refused", WAIT, || {
            module_ready(
                format!("bomb-{i:02}"),
                |c, _| {
                    c["reason"] == "ModuleInvalid"
                        && c["message"].as_str().is_some_and(|m| m.contains("32×"))
                },
                String::new(),
            )
        })
        .await?;
    }
    for (repository, says) in PULLED {
        eventually("a pull from the tenant's registry refused", WAIT, || {
            module_ready(
                repository.to_owned(),
                |c, says| {
                    c["status"] == "False"
                        && c["message"]
                            .as_str()
                            .is_some_and(|m| !m.contains(MARKER) && m.contains(says))
                },
                says.to_owned(),
            )
        })
        .await?;
    }
    let sent: Vec<u64> = PULLED.iter().map(|(r, _)| registry.sent(r)).collect();
    ensure!(
        sent.iter().all(|&b| b > 0),
        "the tenant's registry sent {sent:?} bytes: was it reached?"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "hello");
    let old = pods.get("your-name").await?.uid().unwrap_or_default();
    let patched = Instant::now();
    patch_who(&cluster.kubectl, "Formula").await?;
    wait_greeting(
        client,
        "hello",
        "your-name",
        "Hello, Formula!",
        Some(&old),
        WAIT,
    )
    .await?;
    let (rss, peak) = memory(pid)?;
    let container = container_peak(pid);
    timings.note(format!(
        "heavy module ({} KiB gzipped) quarantined at the compile limit in {}, {BOMBED} controllers of a gzip bomb refused, pulls from the tenant's registry refused ({} MiB of endless token and {} MiB of endless manifest sent), who patched -> Succeeded in {}; runtime {} MiB now, peak {} MiB (its share {} MiB); container peak {} (limit {} MiB)",
        heavy_gz.len() >> 10,
        secs(quarantined),
        sent[0] >> 20,
        sent[1] >> 20,
        secs(patched.elapsed()),
        rss >> 20,
        peak >> 20,
        MEMORY_LIMIT >> 20,
        container.map_or_else(|| "unknown (no cgroup v1 memory.max_usage_in_bytes)".to_owned(), |b| format!("{} MiB", b >> 20)),
        CONTAINER_LIMIT >> 20
    ));
    ensure!(
        peak < MEMORY_LIMIT,
        "the runtime's peak memory {peak} B is over its share of the container's limit"
    );
    if let Some(container) = container {
        ensure!(
            container < CONTAINER_LIMIT,
            "the container's peak memory {container} B is over its limit"
        );
    }
    Ok(())
}

/// The peak memory of the cgroup of process `pid` (its container: the runtime and its compiler
/// process), from cgroup v1's `memory.max_usage_in_bytes`.
fn container_peak(pid: u32) -> Option<u64> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    })?;
    std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory{path}/memory.max_usage_in_bytes"
    ))
    .ok()?
    .trim()
    .parse()
    .ok()
}

/// Condition `type_` of a WasmController read as a plain object (`null` when it has none).
fn condition(wc: &DynamicObject, type_: &str) -> Value {
    wc.data
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or_default()
}

/// The tenant's WasmControllers, as plain objects (their status read by pointer).
fn wasm_controllers(client: &kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        NS,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "kubewasm.dev",
            "v1alpha1",
            "WasmController",
        )),
    )
}

/// The host pid of a Pod's runtime container (the node runs on this machine): the process
/// whose cgroup names the container's ID.
fn leader_host_pid(pod: &Pod) -> Result<u32> {
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .and_then(|c| c.container_id.as_deref())
        .and_then(|id| id.split("://").nth(1))
        .context("the runtime Pod has no container ID")?
        .to_owned();
    // The runtime's compiler processes are the same binary in the same cgroup, and end when
    // their compile does: the runtime is the one whose parent is none of them.
    let mut found = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cgroup) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if !cgroup.contains(&id) || comm.trim() != "kubewasm" {
            continue;
        }
        let parent = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("PPid:"))
                    .and_then(|p| p.trim().parse::<u32>().ok())
            });
        found.insert(pid, parent);
    }
    found
        .iter()
        .find(|(_, parent)| parent.is_none_or(|p| !found.contains_key(&p)))
        .map(|(pid, _)| *pid)
        .with_context(|| format!("no kubewasm process in the cgroup of container {id}"))
}

/// VmRSS and VmHWM (the peak) of a process, in bytes.
fn memory(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .with_context(|| format!("no {name} in /proc/{pid}/status"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()?;
        Ok(kib << 10)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

fn controller(name: &str) -> Value {
    json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "WasmController",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
            "parent": {"apiVersion": format!("{GROUP}/v1"), "kind": "Probe", "labelSelector": "role=storm"},
            "serviceAccountName": "attacker",
            "limits": {"memory": "1Ti", "timeoutMillis": 3_600_000, "concurrency": 1024,
                "logBytes": "1Ti"}}})
}

/// The tenant: its namespace opted in, an opted-in ServiceAccount with a Role on Probes, the
/// Probe CRD (with the labelled ClusterRole that lets the runtime watch Probes), the module.
async fn install(cluster: &NodeCluster, hostile_wasm: &std::path::Path) -> Result<()> {
    let client = &cluster.client;
    let rbac = |kind: &str, body: Value| {
        let mut o = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
            "metadata": {"name": "attacker", "namespace": NS}});
        for (k, v) in body.as_object().into_iter().flatten() {
            o[k] = v.clone();
        }
        o
    };
    let wasm = std::fs::read(hostile_wasm)
        .with_context(|| format!("reading {}", hostile_wasm.display()))?;
    use base64::Engine as _;
    let module = base64::engine::general_purpose::STANDARD.encode(&wasm);
    apply_all(
        client,
        &[
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {"kubewasm.dev/tenant": "enabled"}}}),
            tenant_binding(NS)?,
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("probes.{GROUP}")},
                "spec": {"group": GROUP, "scope": "Namespaced",
                    "names": {"plural": "probes", "singular": "probe", "kind": "Probe"},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                        "subresources": {"status": {}},
                        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "kubewasm-runtime-watch-e2e-probes",
                    "labels": {"kubewasm.dev/aggregate-to-runtime": "true"}},
                "rules": [{"apiGroups": [GROUP], "resources": ["probes"], "verbs": ["list", "watch"]}]}),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "attacker", "namespace": NS,
                "annotations": {"kubewasm.dev/wasm-controllers": "allowed"}}}),
            rbac("Role", json!({"rules": [
                {"apiGroups": [GROUP], "resources": ["probes"], "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": [GROUP], "resources": ["probes/status"], "verbs": ["get", "patch"]},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "patch"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]})),
            rbac("RoleBinding", json!({
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "attacker"},
                "subjects": [{"kind": "ServiceAccount", "name": "attacker", "namespace": NS}]})),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hostile", "namespace": NS},
                "binaryData": {"hostile.wasm": module}}),
        ],
    )
    .await
}
