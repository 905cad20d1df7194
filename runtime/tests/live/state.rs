//! Guest state at scale, live: the Chronos pod watcher (`guests/pod-watcher`) as a
//! WasmController over 600 Pods of its namespace — more than the 256 objects a controller's
//! status used to hold — saves a state for every Pod in its WasmControllerState shards, at
//! least two Pods a write on average (saves left behind gather for 100 ms); a runtime killed (SIGKILL) and started again repeats no line; 100 Pods
//! deleted are each reported once and their states forgotten. And a state an older runtime
//! left in `status.guestState` is moved into the shards and the field removed.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Result, ensure};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use kubewasm::api::{STATE_OF_LABEL, WasmController, WasmControllerState, state_prefix};
use serde_json::{Value, json};

use crate::cluster::{WAIT, apply_all, guest, module_config_map, prepare, saved_state};
use crate::restarter::create_pod;
use crate::runtime::{RuntimeProcess, finish};
use crate::support::{ControlPlane, eventually};

const PODS: usize = 600;
const DELETED: usize = 100;

/// The pod watcher as a WasmController of `ns`, acting as ServiceAccount `watcher`.
fn manifests(ns: &str, wasm: &[u8]) -> Vec<Value> {
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
async fn stored(client: &Client, ns: &str) -> Result<(BTreeMap<String, String>, usize, i64)> {
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

/// How many times the pod watcher logged `what` (`added`, `deleted`) for each Pod of `ns`.
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

#[tokio::test]
async fn six_hundred_pods_each_reported_once_their_states_in_shards_across_a_kill() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "state").await;
    // Every line of the guest's is counted: its log rate is not what this test is about.
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &[
            "--max-log-lines-per-second",
            "100000",
            "--log-line-burst",
            "100000",
        ],
    );
    let result = many_states(&client, &ns, &mut runtime).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn many_states(client: &Client, ns: &str, runtime: &mut RuntimeProcess) -> Result<()> {
    apply_all(client, &manifests(ns, &guest("pod_watcher"))).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = (0..PODS).map(|i| format!("p-{i:04}")).collect();
    futures::stream::iter(&names)
        .map(|name| create_pod(&pods, name, "many"))
        .buffer_unordered(16)
        .collect::<Vec<Result<()>>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;
    let all: BTreeSet<String> = names.iter().map(|n| format!("{ns}/{n}")).collect();
    let started = std::time::Instant::now();
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
    ensure!(
        (8..=16).contains(&shards),
        "{PODS} states in {shards} objects, want them spread over up to 16"
    );
    ensure!(
        writes as usize * 2 <= PODS,
        "{PODS} states saved by {writes} writes: not batched"
    );
    let log = runtime.log_since(0);
    let added = reported(&log, ns, "added");
    ensure!(
        added.len() == PODS && added.values().all(|&n| n == 1),
        "{} Pods reported added, {} more than once",
        added.len(),
        added.values().filter(|&&n| n > 1).count()
    );
    eprintln!(
        "{PODS} states saved in {shards} WasmControllerState objects by {writes} writes ({:.1} states a write) within {:.1?} of the first Pod",
        PODS as f64 / writes.max(1) as f64,
        started.elapsed()
    );

    // Killed without a word and started again: every Pod is seen again with its state, and
    // no line repeats.
    runtime.kill()?;
    let offset = runtime.log_len();
    runtime.start_again();
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
    .await?;
    // Each Pod reconciled once more (resync of the first list) before this looks.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let again = reported(&runtime.log_since(offset), ns, "added");
    ensure!(
        again.is_empty(),
        "{} Pods reported added again after the restart: {:?}",
        again.len(),
        again.keys().take(5).collect::<Vec<_>>()
    );

    // 100 deleted: each reported once, its state forgotten.
    let offset = runtime.log_len();
    let now = DeleteParams::default().grace_period(0);
    futures::stream::iter(&names[..DELETED])
        .map(|name| pods.delete(name, &now))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, kube::Error>>()?;
    let left: BTreeSet<String> = names[DELETED..]
        .iter()
        .map(|n| format!("{ns}/{n}"))
        .collect();
    eventually(
        &format!("the states of the {DELETED} deleted Pods forgotten"),
        WAIT,
        || async {
            let (entries, _, _) = stored(client, ns).await?;
            let keys: BTreeSet<String> = entries.keys().cloned().collect();
            ensure!(keys == left, "{} states, want {}", keys.len(), left.len());
            Ok(Some(()))
        },
    )
    .await?;
    let deleted = reported(&runtime.log_since(offset), ns, "deleted");
    ensure!(
        deleted.len() == DELETED && deleted.values().all(|&n| n == 1),
        "{} Pods reported deleted ({} more than once), want {DELETED} once each",
        deleted.len(),
        deleted.values().filter(|&&n| n > 1).count()
    );
    Ok(())
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
