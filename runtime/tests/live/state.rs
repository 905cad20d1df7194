//! Guest state at scale, live: the Chronos pod watcher (`guests/pod-watcher`) as a
//! WasmController over 5,000 Pods of its namespace — far more than the 256 objects a
//! controller's status used to hold — saves a state for every Pod in its WasmControllerState
//! shards, many Pods a write (saves left behind gather for 100 ms), at a bounded number of
//! writes a second (printed). A runtime killed (SIGKILL) and started again repeats no line.
//! Then 1,000 Pods are deleted and 1,000 relabelled, the runtime stopped (SIGTERM, as a
//! rollout does) halfway through and started again after the rest: each deletion and each
//! relabel is reported exactly once, nothing else, and the deleted Pods' states are forgotten.
//! And a state an older runtime left in `status.guestState` is moved into the shards and the
//! field removed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use kubewasm::api::{STATE_OF_LABEL, WasmController, WasmControllerState, state_prefix};
use kubewasm::host::{LINGER, STATE_SHARDS};
use serde_json::{Value, json};

use crate::cluster::{WAIT, apply_all, guest, module_config_map, prepare, saved_state};
use crate::restarter::create_pod;
use crate::runtime::{RuntimeProcess, finish};
use crate::support::{ControlPlane, eventually};

const PODS: usize = 5_000;
/// Pods deleted, and as many others relabelled, with a restart halfway through.
const CHURNED: usize = 1_000;
/// Requests to the API server at once while creating and changing Pods.
pub const AT_ONCE: usize = 32;

/// `kubewasm run` counting every line of the guest's (its log rate is not what this is about).
/// The caches are at their defaults: 5,000 Pods in one namespace are under the default cap
/// per namespace (64 MiB) since each is cached as its text (`controller::Cached`); as decoded
/// `DynamicObject`s they took about 13 KB each and the namespace was held back at ~4,700.
pub const ROOMY: [&str; 4] = [
    "--max-log-lines-per-second",
    "1000000",
    "--log-line-burst",
    "1000000",
];

/// The pod watcher as a WasmController of `ns`, acting as ServiceAccount `watcher`.
pub fn manifests(ns: &str, wasm: &[u8]) -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "watcher", "namespace": ns,
                "annotations": {"kubewasm.dev/wasm-controllers": "allowed"}}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "watcher", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "watcher", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "watcher"},
            "subjects": [{"kind": "ServiceAccount", "name": "watcher", "namespace": ns}]}),
        module_config_map(ns, "pod-watcher", "pod_watcher.wasm", wasm),
        json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "WasmController",
            "metadata": {"name": "pod-watcher", "namespace": ns},
            "spec": {"module": {"configMap": {"name": "pod-watcher", "key": "pod_watcher.wasm"}},
                "parent": {"apiVersion": "v1", "kind": "Pod"},
                "serviceAccountName": "watcher",
                "limits": {"concurrency": 8}}}),
    ]
}

/// Every state the controller keeps, from its WasmControllerState objects, how many objects
/// hold them, and how many writes made them (each write of an object's spec is a generation).
pub async fn stored(client: &Client, ns: &str) -> Result<(BTreeMap<String, String>, usize, i64)> {
    let api: Api<WasmControllerState> = Api::namespaced(client.clone(), ns);
    let prefix = state_prefix("WasmController", "pod-watcher");
    let shards = api
        .list(&ListParams::default().labels(&format!("{STATE_OF_LABEL}={prefix}")))
        .await?;
    let count = shards.items.len();
    let writes = shards
        .items
        .iter()
        .map(|s| s.metadata.generation.unwrap_or(0))
        .sum();
    let entries = shards
        .items
        .into_iter()
        .flat_map(|s| s.spec.entries.into_iter())
        .collect();
    Ok((entries, count, writes))
}

/// The state writes a second, sampled about every second while it lives: the highest rate
/// seen over one sample.
pub struct WriteRate {
    peak: Arc<Mutex<f64>>,
    task: tokio::task::JoinHandle<()>,
}

impl WriteRate {
    /// Starts sampling the writes of the pod watcher of `ns`.
    pub fn sample(client: &Client, ns: &str) -> WriteRate {
        let peak = Arc::new(Mutex::new(0.0f64));
        let (client, ns, seen) = (client.clone(), ns.to_owned(), peak.clone());
        let task = tokio::spawn(async move {
            let mut last: Option<(Instant, i64)> = None;
            loop {
                if let Ok((_, _, writes)) = stored(&client, &ns).await {
                    let now = Instant::now();
                    if let Some((at, before)) = last {
                        let rate = (writes - before) as f64 / (now - at).as_secs_f64();
                        let mut peak = seen.lock().unwrap();
                        *peak = peak.max(rate);
                    }
                    last = Some((now, writes));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        WriteRate { peak, task }
    }

    /// Stops sampling; the peak rate.
    pub fn peak(self) -> f64 {
        self.task.abort();
        *self.peak.lock().unwrap()
    }
}

/// The most writes a second the saves of one controller can make when all are left behind:
/// each shard writes at most once a linger, twice when a reconcile of an object waits for its
/// save; the rest is room for a sample that is not a whole second.
fn rate_bound() -> f64 {
    4.0 * f64::from(STATE_SHARDS) / LINGER.as_secs_f64()
}

/// How many times the pod watcher logged `what` (`added`, `deleted`, `updated`) for each Pod
/// of `ns`.
fn reported(log: &str, ns: &str, what: &str) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    let prefix = format!("pod {ns}/");
    for line in log
        .lines()
        .filter(|l| l.contains("controller=\"") && l.contains("/pod-watcher\""))
    {
        let Some(at) = line.find(&prefix) else {
            continue;
        };
        let rest = &line[at + prefix.len()..];
        let mut words = rest.split_whitespace();
        if let (Some(name), Some(said)) = (words.next(), words.next())
            && said.trim_end_matches(':') == what
        {
            *seen.entry(name.to_owned()).or_default() += 1;
        }
    }
    seen
}

/// Says which of `names` were not reported exactly once in `seen`, and what else was.
fn exactly_once(seen: &BTreeMap<String, usize>, names: &[String], what: &str) -> Result<()> {
    let want: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    let missing: Vec<&&str> = want.iter().filter(|n| !seen.contains_key(**n)).collect();
    let repeated: Vec<(&String, &usize)> = seen.iter().filter(|(_, n)| **n > 1).collect();
    let other: Vec<&String> = seen.keys().filter(|n| !want.contains(n.as_str())).collect();
    ensure!(
        missing.is_empty() && repeated.is_empty() && other.is_empty(),
        "{what}: {} of {} not reported ({:?}…), {} more than once ({:?}…), {} others ({:?}…)",
        missing.len(),
        names.len(),
        missing.iter().take(3).collect::<Vec<_>>(),
        repeated.len(),
        repeated.iter().take(3).collect::<Vec<_>>(),
        other.len(),
        other.iter().take(3).collect::<Vec<_>>()
    );
    Ok(())
}

/// Runs each of `changes` against the API server, [`AT_ONCE`] at a time.
pub async fn all_of<F: std::future::Future<Output = Result<()>>>(
    changes: impl Iterator<Item = F>,
) -> Result<()> {
    futures::stream::iter(changes)
        .buffer_unordered(AT_ONCE)
        .collect::<Vec<Result<()>>>()
        .await
        .into_iter()
        .collect()
}

#[tokio::test]
async fn five_thousand_pods_each_change_reported_once_across_a_kill_and_a_restart_midway() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "state").await;
    let mut runtime =
        RuntimeProcess::start_with_args(&control_plane.runtime_kubeconfig(), &ns, &ROOMY);
    let result = many_states(&client, &ns, &mut runtime).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn many_states(client: &Client, ns: &str, runtime: &mut RuntimeProcess) -> Result<()> {
    // The Pods first, as on a cluster where the controller is installed late: its first list
    // hands it all 5,000 at once.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = (0..PODS).map(|i| format!("p-{i:04}")).collect();
    let creating = Instant::now();
    all_of(names.iter().map(|name| create_pod(&pods, name, "many"))).await?;
    let created = creating.elapsed();
    let rate = WriteRate::sample(client, ns);
    let started = Instant::now();
    apply_all(client, &manifests(ns, &guest("pod_watcher"))).await?;
    let all: BTreeSet<String> = names.iter().map(|n| format!("{ns}/{n}")).collect();
    let (shards, writes) = eventually(
        &format!("a saved state for each of the {PODS} Pods"),
        WAIT * 3,
        || async {
            let (entries, shards, writes) = stored(client, ns).await?;
            let keys: BTreeSet<String> = entries.keys().cloned().collect();
            ensure!(keys == all, "{} of {PODS} saved", keys.len());
            Ok(Some((shards, writes)))
        },
    )
    .await?;
    let saved = started.elapsed();
    let peak = rate.peak();
    ensure!(
        shards == STATE_SHARDS as usize,
        "{PODS} states in {shards} objects, want them spread over all {STATE_SHARDS}"
    );
    ensure!(
        writes as usize * 4 <= PODS,
        "{PODS} states saved by {writes} writes: not batched"
    );
    ensure!(
        peak <= rate_bound(),
        "state writes peaked at {peak:.0} a second, more than the {:.0} the shards and the linger allow",
        rate_bound()
    );
    let log = runtime.log_since(0);
    exactly_once(&reported(&log, ns, "added"), &names, "added")?;
    eprintln!(
        "{PODS} Pods created in {created:.1?}; their states saved in {shards} WasmControllerState objects by {writes} writes ({:.1} states a write) {saved:.1?} after the controller was applied; state writes peaked at {peak:.0}/s, {:.0}/s on average",
        PODS as f64 / writes.max(1) as f64,
        writes as f64 / saved.as_secs_f64()
    );

    // Killed without a word and started again: every Pod is seen again with its state, and
    // no line repeats.
    runtime.kill()?;
    let offset = runtime.log_len();
    runtime.start_again();
    ready(client, ns).await?;
    // Each Pod reconciled once more (resync of the first list) before this looks.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let again = reported(&runtime.log_since(offset), ns, "added");
    ensure!(
        again.is_empty(),
        "{} Pods reported added again after the restart: {:?}",
        again.len(),
        again.keys().take(5).collect::<Vec<_>>()
    );

    // 1,000 deleted and 1,000 relabelled, taking turns; told to stop (SIGTERM, as a rollout
    // does) at the 500th change while it is reconciling them, the rest changed while it
    // stops and is down, then started again.
    let offset = runtime.log_len();
    let pid = runtime.pid().to_string();
    let (deleted, relabelled) = (&names[..CHURNED], &names[CHURNED..2 * CHURNED]);
    let now = DeleteParams::default().grace_period(0);
    let relabel = Patch::Merge(json!({"metadata": {"labels": {"app": "relabelled"}}}));
    let change = |i: usize| {
        let (pods, now, relabel, pid) = (&pods, &now, &relabel, &pid);
        async move {
            if i == CHURNED / 2 {
                std::process::Command::new("kill")
                    .args(["-TERM", pid])
                    .status()?;
            }
            if i.is_multiple_of(2) {
                pods.delete(&deleted[i / 2], now).await.map(drop)?;
            } else {
                pods.patch(&relabelled[i / 2], &PatchParams::default(), relabel)
                    .await
                    .map(drop)?;
            }
            Ok(())
        }
    };
    let rate = WriteRate::sample(client, ns);
    let churn = Instant::now();
    all_of((0..CHURNED).map(change)).await?;
    runtime.stop()?; // already told: waits until it has exited
    let before_stop = runtime.log_since(offset);
    let seen_before =
        reported(&before_stop, ns, "deleted").len() + reported(&before_stop, ns, "updated").len();
    all_of((CHURNED..2 * CHURNED).map(change)).await?;
    runtime.start_again();
    let left: BTreeSet<String> = names[CHURNED..]
        .iter()
        .map(|n| format!("{ns}/{n}"))
        .collect();
    eventually(
        "the deleted Pods' states forgotten and the relabelled Pods' saved",
        WAIT * 2,
        || async {
            let (entries, _, _) = stored(client, ns).await?;
            let keys: BTreeSet<String> = entries.keys().cloned().collect();
            ensure!(keys == left, "{} states, want {}", keys.len(), left.len());
            let stale = relabelled
                .iter()
                .filter(|n| !entries[&format!("{ns}/{n}")].contains("relabelled"))
                .count();
            ensure!(stale == 0, "{stale} relabelled Pods' states not saved yet");
            Ok(Some(()))
        },
    )
    .await?;
    let took = churn.elapsed();
    let peak = rate.peak();
    // Anything reported late would show by now (the first list after the start is done).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = runtime.log_since(offset);
    exactly_once(&reported(&log, ns, "deleted"), deleted, "deleted")?;
    exactly_once(&reported(&log, ns, "updated"), relabelled, "relabelled")?;
    let added = reported(&log, ns, "added");
    ensure!(added.is_empty(), "reported added again: {added:?}");
    ensure!(
        seen_before > 0,
        "nothing was reported before the stop: the restart was not in the middle"
    );
    ensure!(
        peak <= rate_bound(),
        "state writes peaked at {peak:.0} a second, more than {:.0}",
        rate_bound()
    );
    eprintln!(
        "{CHURNED} deletions and {CHURNED} relabels ({seen_before} reported by the runtime told to stop at the 500th, the rest after the restart), each reported once, states up to date {took:.1?} after the first change; state writes peaked at {peak:.0}/s"
    );
    Ok(())
}

/// Waits until the pod watcher says Ready again.
async fn ready(client: &Client, ns: &str) -> Result<()> {
    eventually("the pod watcher Ready again", WAIT, || async {
        let status = crate::cluster::controller_status(client, ns, "pod-watcher").await?;
        let ready = crate::cluster::condition(&status, "Ready")?;
        ensure!(
            ready.status == "True",
            "Ready {}: {}",
            ready.status,
            ready.message
        );
        Ok(Some(()))
    })
    .await
}

#[tokio::test]
async fn a_state_left_in_the_status_by_an_older_runtime_is_moved_into_the_shards() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "state-moved").await;
    let key = format!("{ns}/kept");
    // What an older runtime saved for Pod `kept` (its phase, node, labels and containers as
    // the guest reports them), left in the status before any runtime of this version ran.
    let old = r#"{"p":"Pending","n":"-","l":{"v":{"app":"moved"}},"c":{"v":[]}}"#;
    leave_in_status(&client, &ns, &key, old)
        .await
        .expect("setting up the old state");
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = moved(&client, &ns, &key, old, &runtime).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn leave_in_status(client: &Client, ns: &str, key: &str, old: &str) -> Result<()> {
    apply_all(client, &manifests(ns, &guest("pod_watcher"))).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    create_pod(&pods, "kept", "moved").await?;
    let api: Api<WasmController> = Api::namespaced(client.clone(), ns);
    api.patch_status(
        "pod-watcher",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"guestState": {key: old}}})),
    )
    .await?;
    Ok(())
}

async fn moved(
    client: &Client,
    ns: &str,
    key: &str,
    old: &str,
    runtime: &RuntimeProcess,
) -> Result<()> {
    let api: Api<WasmController> = Api::namespaced(client.clone(), ns);
    eventually("the state moved into the shards", WAIT, || async {
        let saved = saved_state(client, ns, "WasmController", "pod-watcher", key).await?;
        ensure!(saved.as_deref() == Some(old), "saved: {saved:?}");
        let status = api.get("pod-watcher").await?.status.unwrap_or_default();
        ensure!(
            status.guest_state.is_empty(),
            "status.guestState still {:?}",
            status.guest_state
        );
        Ok(Some(()))
    })
    .await?;
    // The Pod is as the moved state says: nothing reported for it.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let added = reported(&runtime.log_since(0), ns, "added");
    ensure!(added.is_empty(), "reported added after the move: {added:?}");
    Ok(())
}
