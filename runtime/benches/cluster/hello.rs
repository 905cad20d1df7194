//! P4: many HelloWorlds created at once, until each has its Pod and `status.pods = 1`.
//!
//! Either `kubewasm run` hosts the example's hello-world WasmController (as shipped, or with
//! the operator's write caps lifted), or a raw kube-rs client makes the same writes — for each
//! HelloWorld, as soon as its create returned, a server-side apply of its Pod and of its status
//! — with no watch, no reconcile and no cap. Each round has a fresh namespace; a watch of
//! HelloWorlds and Pods, caught up before the first create, says when all have converged and
//! counts the writes it saw change something.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt as _, TryStreamExt as _, stream};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt as _};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::cluster::{
    apply, apply_all, ensure_condition, example, guest, hello_worlds, module_config_map, take,
    wait_status,
};
use crate::runtime::RuntimeProcess;
use crate::stats::{Samples, ms};
use crate::support::ControlPlane;
use crate::{BENCH_LOG_FILTER, UNCAPPED};

/// HelloWorld creates in flight at once (the admin client, the same for every writer).
pub const CREATE_CONCURRENCY: usize = 16;

/// The most reconciles of one controller at once that `kubewasm run` allows by default
/// (`--max-concurrency`), used by the lifted runtime and as the raw client's writes in flight.
const CONCURRENCY: usize = 8;

/// Field manager of the raw client's writes.
const RAW_MANAGER: &str = "raw-kube-rs";

/// How long a namespace of a finished round may take to go.
const NAMESPACE_GONE: Duration = Duration::from_secs(300);

/// Who makes the Pods and statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Writer {
    /// `kubewasm run` with the operator's default caps and the example's spec as it is.
    KubewasmShipped,
    /// `kubewasm run` with `--max-writes-per-second`/`--write-burst` lifted and `concurrency: 8`.
    KubewasmLifted,
    /// A raw kube-rs client, [`CONCURRENCY`] HelloWorlds in flight, no rate limit.
    Raw,
}

impl Writer {
    fn name(self) -> String {
        match self {
            Writer::KubewasmShipped => format!(
                "kubewasm, as shipped ({} writes/s, burst {}, the example's spec)",
                kubewasm::manager::ManagerConfig::default().writes_per_second,
                kubewasm::manager::ManagerConfig::default().write_burst
            ),
            Writer::KubewasmLifted => format!("kubewasm, caps lifted (concurrency {CONCURRENCY})"),
            Writer::Raw => format!("raw kube-rs client ({CONCURRENCY} in flight)"),
        }
    }
}

/// How many HelloWorlds, and rounds of the lifted runtime and the raw client (interleaved);
/// the runtime as shipped runs `shipped_rounds` (each takes minutes at 1,000).
#[derive(Debug, Clone, Copy)]
pub struct Size {
    /// HelloWorlds created at once.
    pub count: usize,
    /// Rounds of [`Writer::KubewasmLifted`] and [`Writer::Raw`].
    pub rounds: usize,
    /// Rounds of [`Writer::KubewasmShipped`].
    pub shipped_rounds: usize,
}

/// What one round measured.
#[derive(Debug)]
pub struct Round {
    /// First create sent → every HelloWorld has its Pod and `status.pods = 1`.
    pub converged: Duration,
    /// First create sent → the last create answered.
    pub created: Duration,
    /// Pod writes and status writes the watch saw change something.
    pub writes: u64,
    /// Per HelloWorld: its create answered → its `status.pods = 1` seen.
    pub latencies: Vec<Duration>,
}

/// Runs P4 and prints its table.
pub async fn bench(cp: &ControlPlane, size: Size) -> Result<()> {
    let admin = cp.client().await?;
    crate::cluster::ensure_crds(cp, &admin).await?;
    let mut order = Vec::new();
    for r in 0..size.rounds {
        if r % 2 == 0 {
            order.extend([Writer::KubewasmLifted, Writer::Raw]);
        } else {
            order.extend([Writer::Raw, Writer::KubewasmLifted]);
        }
    }
    order.extend(std::iter::repeat_n(
        Writer::KubewasmShipped,
        size.shipped_rounds,
    ));
    let mut results: HashMap<Writer, Vec<Round>> = HashMap::new();
    for writer in order {
        let round = round(cp, &admin, writer, size.count)
            .await
            .with_context(|| format!("a round of {}", writer.name()))?;
        eprintln!(
            "  P4 round: {:<55} converged {} ({} writes)",
            writer.name(),
            ms(round.converged),
            round.writes
        );
        results.entry(writer).or_default().push(round);
    }
    report(size, &results);
    Ok(())
}

fn report(size: Size, results: &HashMap<Writer, Vec<Round>>) {
    println!(
        "P4: {} HelloWorlds created at once ({CREATE_CONCURRENCY} creates in flight) → each has \
         its Pod and status.pods = 1",
        size.count
    );
    let mut writers: Vec<&Writer> = results.keys().collect();
    writers.sort();
    let mut medians = HashMap::new();
    for writer in writers {
        let rounds = &results[writer];
        let converged = Samples::new(rounds.iter().map(|r| r.converged).collect());
        let created = Samples::new(rounds.iter().map(|r| r.created).collect());
        let rates: Vec<f64> = rounds
            .iter()
            .map(|r| r.writes as f64 / r.converged.as_secs_f64())
            .collect();
        let writes: Vec<u64> = rounds.iter().map(|r| r.writes).collect();
        let latencies = Samples::new(rounds.iter().flat_map(|r| r.latencies.clone()).collect());
        println!("  {}", writer.name());
        println!("    all converged: {}", converged.rounds());
        println!("    creates done:  median {}", ms(created.median()));
        println!(
            "    writes seen per round {writes:?}; writes/s (writes / time to converge) {}",
            rates
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!(
            "    per HelloWorld, created → status: {}",
            latencies.percentiles()
        );
        medians.insert(*writer, converged.median());
    }
    let at = |w| medians.get(&w).copied();
    if let (Some(lifted), Some(raw)) = (at(Writer::KubewasmLifted), at(Writer::Raw)) {
        println!(
            "  kubewasm (caps lifted) above the raw client (medians): {}",
            crate::stats::overhead(lifted, raw)
        );
    }
    if let (Some(shipped), Some(lifted)) = (at(Writer::KubewasmShipped), at(Writer::KubewasmLifted))
    {
        println!(
            "  explained by the shipped caps (as shipped − caps lifted): {}",
            crate::stats::overhead(shipped, lifted)
        );
    }
}

/// One round in a fresh namespace, which is deleted (and waited for) afterwards.
async fn round(cp: &ControlPlane, admin: &Client, writer: Writer, count: usize) -> Result<Round> {
    let ns = cp.namespace("p4").await?;
    apply_all(admin, &example("hello-world/rbac.yaml", &ns)?).await?;
    let runtime = match writer {
        Writer::Raw => None,
        Writer::KubewasmShipped | Writer::KubewasmLifted => {
            Some(start_runtime(cp, admin, &ns, writer).await?)
        }
    };
    let raw = match writer {
        Writer::Raw => Some(
            cp.client_for_service_account(&ns, "hello-controller")
                .await?,
        ),
        _ => None,
    };
    let result = measure(admin, &ns, count, raw).await;
    drop(runtime);
    delete_namespace(cp, admin, &ns).await?;
    result
}

/// `kubewasm run --namespace <ns>` hosting the example's WasmController.
async fn start_runtime(
    cp: &ControlPlane,
    admin: &Client,
    ns: &str,
    writer: Writer,
) -> Result<RuntimeProcess> {
    let wasm = guest("hello_world");
    apply(
        admin,
        &module_config_map(ns, "hello-controller", "hello_world.wasm", &wasm),
    )
    .await?;
    let mut controller = take(
        &mut example("hello-world/controller.yaml", ns)?,
        "WasmController",
    )?;
    let args: &[&str] = if writer == Writer::KubewasmLifted {
        controller["spec"]["limits"]["concurrency"] = json!(CONCURRENCY);
        &[
            "--max-writes-per-second",
            UNCAPPED,
            "--write-burst",
            UNCAPPED,
        ]
    } else {
        &[]
    };
    apply(admin, &controller).await?;
    let process =
        RuntimeProcess::start_with_log_filter(&cp.runtime_kubeconfig(), ns, args, BENCH_LOG_FILTER);
    wait_status(
        admin,
        ns,
        "hello-world",
        "hello-world becoming Ready",
        |s| ensure_condition(s, "Ready", "True").map(drop),
    )
    .await?;
    Ok(process)
}

/// Creates `count` HelloWorlds and waits until all converged; with `raw`, that client writes
/// each one's Pod and status as soon as its create returned.
async fn measure(admin: &Client, ns: &str, count: usize, raw: Option<Client>) -> Result<Round> {
    measure_many(admin, vec![(ns.to_owned(), raw)], count).await
}

/// [`measure`] over several namespaces at once: `count` HelloWorlds in each, created
/// [`CREATE_CONCURRENCY`] at a time across all of them (round-robin), converged when every
/// namespace has; each namespace's raw client, if given, writes its Pods and statuses.
pub async fn measure_many(
    admin: &Client,
    namespaces: Vec<(String, Option<Client>)>,
    count: usize,
) -> Result<Round> {
    let created_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut observers = Vec::new();
    let mut senders = HashMap::new();
    let mut writers = Vec::new();
    for (ns, raw) in namespaces {
        let (ready_tx, ready_rx) = oneshot::channel();
        observers.push(tokio::spawn(observe(
            admin.clone(),
            ns.clone(),
            count,
            ready_tx,
        )));
        ready_rx
            .await
            .context("the HelloWorld and Pod watches did not start")?;
        let (tx, rx) = mpsc::channel::<Created>(count.max(1));
        writers.extend(raw.map(|client| tokio::spawn(raw_writes(client, ns.clone(), rx))));
        senders.insert(ns, tx);
    }
    let names: Vec<String> = senders.keys().cloned().collect();

    let started = Instant::now();
    stream::iter((0..count).flat_map(|i| names.iter().map(move |ns| (i, ns))))
        .map(|(i, ns)| {
            let hellos = hello_worlds(admin, ns);
            let (tx, created_at) = (senders[ns].clone(), created_at.clone());
            async move {
                let name = format!("hello-{i:04}");
                let who = format!("number {i}");
                let object: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": "example.com/v1", "kind": "HelloWorld",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"who": who},
                }))?;
                let made = hellos.create(&PostParams::default(), &object).await?;
                created_at
                    .lock()
                    .unwrap()
                    .insert(format!("{ns}/{name}"), Instant::now());
                let uid = made.uid().unwrap_or_default();
                // Nobody listens without a raw writer.
                let _ = tx.send(Created { name, uid, who }).await;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<()>()
        .await?;
    let created = started.elapsed();
    drop(senders);

    let total = count * names.len();
    let timeout = Duration::from_secs(120) + Duration::from_millis(500) * total as u32;
    let all = tokio::time::timeout(timeout, futures::future::join_all(observers))
        .await
        .with_context(|| format!("not all {total} HelloWorlds converged within {timeout:?}"))?;
    for writer in writers {
        writer.await??;
    }
    let created_at = created_at.lock().unwrap();
    let (mut converged, mut writes, mut latencies) = (started, 0, Vec::new());
    for seen in all {
        let seen = seen??;
        converged = converged.max(seen.converged);
        writes += seen.writes;
        latencies.extend(
            seen.ok_at.iter().filter_map(|(name, at)| {
                Some(at.saturating_duration_since(*created_at.get(name)?))
            }),
        );
    }
    Ok(Round {
        converged: converged.duration_since(started),
        created,
        writes,
        latencies,
    })
}

/// What the watch saw.
struct Seen {
    converged: Instant,
    ok_at: HashMap<String, Instant>,
    writes: u64,
}

/// What the two watches say, reduced to what [`observe`] counts.
enum Change {
    /// One watch has listed what was there.
    Listed,
    /// A HelloWorld and its status (`null` without).
    Hello { name: String, status: Value },
    /// A Pod at a resourceVersion.
    Pod { name: String, version: String },
    /// A Pod is gone.
    PodGone(String),
    /// Nothing counted.
    Other,
}

impl Change {
    fn of_hello(event: watcher::Event<DynamicObject>) -> Change {
        match event {
            watcher::Event::InitDone => Change::Listed,
            watcher::Event::Apply(h) | watcher::Event::InitApply(h) => Change::Hello {
                status: h.data.get("status").cloned().unwrap_or(Value::Null),
                name: h.name_any(),
            },
            _ => Change::Other,
        }
    }

    fn of_pod(event: watcher::Event<Pod>) -> Change {
        match event {
            watcher::Event::InitDone => Change::Listed,
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => Change::Pod {
                version: p.resource_version().unwrap_or_default(),
                name: p.name_any(),
            },
            watcher::Event::Delete(p) => Change::PodGone(p.name_any()),
            _ => Change::Other,
        }
    }
}

/// Watches the namespace's HelloWorlds and Pods; says on `ready` once both listed, returns
/// once `count` HelloWorlds have `status.pods = 1` and `count` Pods exist.
async fn observe(
    client: Client,
    ns: String,
    count: usize,
    ready: oneshot::Sender<()>,
) -> Result<Seen> {
    let hellos =
        watcher(hello_worlds(&client, &ns), watcher::Config::default()).map_ok(Change::of_hello);
    let pods = watcher(
        Api::<Pod>::namespaced(client, &ns),
        watcher::Config::default(),
    )
    .map_ok(Change::of_pod);
    let mut changes = stream::select(hellos.boxed(), pods.boxed());
    let mut ready = Some(ready);
    let mut listed = 0;
    let mut statuses: HashMap<String, Value> = HashMap::new();
    let mut pod_versions: HashMap<String, String> = HashMap::new();
    let mut live_pods: HashSet<String> = HashSet::new();
    let mut ok_at = HashMap::new();
    let mut writes = 0;
    while let Some(change) = changes.try_next().await? {
        match change {
            Change::Listed => {
                listed += 1;
                if listed == 2
                    && let Some(ready) = ready.take()
                {
                    let _ = ready.send(());
                }
            }
            Change::Hello { name, status } => {
                if !status.is_null() && statuses.get(&name) != Some(&status) {
                    writes += 1;
                }
                if status["pods"].as_i64() == Some(1) {
                    ok_at
                        .entry(format!("{ns}/{name}"))
                        .or_insert_with(Instant::now);
                }
                statuses.insert(name, status);
            }
            Change::Pod { name, version } => {
                if pod_versions.insert(name.clone(), version.clone()) != Some(version) {
                    writes += 1;
                }
                live_pods.insert(name);
            }
            Change::PodGone(name) => {
                live_pods.remove(&name);
            }
            Change::Other => {}
        }
        if ok_at.len() >= count && live_pods.len() >= count {
            return Ok(Seen {
                converged: Instant::now(),
                ok_at,
                writes,
            });
        }
    }
    bail!("the watches of namespace {ns} ended")
}

/// A HelloWorld just created, for the raw client.
struct Created {
    name: String,
    uid: String,
    who: String,
}

/// The raw client: for each created HelloWorld, server-side apply of the Pod the
/// guest asks for (with the controller ownerReference the runtime adds) and of its status.
async fn raw_writes(client: Client, ns: String, rx: mpsc::Receiver<Created>) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let hellos = hello_worlds(&client, &ns);
    let params = PatchParams::apply(RAW_MANAGER).force();
    stream::unfold(rx, |mut rx| async {
        rx.recv().await.map(|item| (item, rx))
    })
    .map(|Created { name, uid, who }| {
        let (pods, hellos, params, ns) = (&pods, &hellos, &params, &ns);
        async move {
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "namespace": ns,
                        "labels": {"app.kubernetes.io/managed-by": "kubewasm",
                            "example.com/hello-world": name},
                        "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "HelloWorld",
                            "name": name, "uid": uid, "controller": true,
                            "blockOwnerDeletion": true}]},
                    "spec": {"restartPolicy": "OnFailure", "containers": [{"name": "hello",
                        "image": "busybox",
                        "command": ["echo", format!("Hello, {who}!")]}]}});
            pods.patch(&name, params, &Patch::Apply(&pod))
                .await
                .with_context(|| format!("applying Pod {name}"))?;
            let status = json!({"apiVersion": "example.com/v1", "kind": "HelloWorld",
                    "metadata": {"name": name}, "status": {"pods": 1}});
            hellos
                .patch_status(&name, params, &Patch::Apply(&status))
                .await
                .with_context(|| format!("writing the status of HelloWorld {name}"))?;
            anyhow::Ok(())
        }
    })
    .buffer_unordered(CONCURRENCY)
    .try_collect()
    .await
}

/// Deletes the round's namespace and waits until it is gone, so that the next round does not
/// share the API server with its garbage.
pub async fn delete_namespace(cp: &ControlPlane, admin: &Client, ns: &str) -> Result<()> {
    cp.delete_namespace(ns).await?;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    crate::support::eventually(
        &format!("namespace {ns} is gone"),
        NAMESPACE_GONE,
        || async { Ok(namespaces.get_opt(ns).await?.is_none().then_some(())) },
    )
    .await
}
