//! Guest state at scale: the Chronos pod watcher (`guests/pod-watcher`) as a WasmController
//! over `count` Pods (10,000) created before it is applied, then `changes` of them (1,000)
//! relabelled 32 at a time. Printed: how long until every Pod's state is stored, the API writes
//! that stored them (the shard objects' generations) against the one write per save a store
//! without batching makes, the peak and average writes a second (sampled every second), and
//! the bytes per object — of the entries, and of the WasmControllerState objects as the API
//! server keeps them (JSON) — and what the Pods take in the runtime's cache once listed
//! (`kubewasm_cache_bytes`, against the default cap per namespace) with its VmRSS then.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use kubewasm::api::{STATE_OF_LABEL, WasmControllerState, state_prefix};
use serde_json::json;

use crate::BENCH_LOG_FILTER;
use crate::cluster::{apply_all, guest, prepare};
use crate::pod_states::{ROOMY, WriteRate, all_of, manifests, stored};
use crate::restarter::create_pod;
use crate::runtime::RuntimeProcess;
use crate::support::{ControlPlane, eventually};

/// How many Pods, and how many of them change.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    /// Pods, each with its state.
    pub count: usize,
    /// Pods relabelled after every state is stored.
    pub changes: usize,
}

/// How long all states may take to be stored.
const TIMEOUT: Duration = Duration::from_secs(600);

pub async fn bench(cp: &ControlPlane, size: Size) -> Result<()> {
    let (client, ns) = prepare(cp, "state").await;
    println!(
        "\n## State: the pod watcher over {} Pods, then {} relabelled",
        size.count, size.changes
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let names: Vec<String> = (0..size.count).map(|i| format!("p-{i:05}")).collect();
    let creating = Instant::now();
    all_of(names.iter().map(|name| create_pod(&pods, name, "many"))).await?;
    println!("{} Pods created in {:.1?}", size.count, creating.elapsed());

    let mut runtime = RuntimeProcess::start_with_log_filter(
        &cp.runtime_kubeconfig(),
        &ns,
        &ROOMY,
        BENCH_LOG_FILTER,
    );
    let result = measure(&client, &ns, &names, size, &runtime).await;
    let stopped = runtime.stop();
    let _ = cp.delete_namespace(&ns).await;
    result?;
    stopped
}

async fn measure(
    client: &Client,
    ns: &str,
    names: &[String],
    size: Size,
    runtime: &RuntimeProcess,
) -> Result<()> {
    let rate = WriteRate::sample(client, ns);
    let started = Instant::now();
    apply_all(client, &manifests(ns, &guest("pod_watcher"))).await?;
    let writes = eventually(
        &format!("a saved state for each of the {} Pods", size.count),
        TIMEOUT,
        || async {
            let (entries, _, writes) = stored(client, ns).await?;
            ensure!(
                entries.len() == size.count,
                "{} of {} saved",
                entries.len(),
                size.count
            );
            Ok(Some(writes))
        },
    )
    .await?;
    let took = started.elapsed();
    let peak = rate.peak();
    let (_, metrics) = runtime.http_get("/metrics").await?;
    let cached = metrics
        .lines()
        .find_map(|l| l.strip_prefix("kubewasm_cache_bytes "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .context("no kubewasm_cache_bytes in the runtime's metrics")?;
    let (rss, _) = crate::runtime::memory_kib(runtime.pid())?;
    let (entry_bytes, object_bytes, shards) = bytes(client, ns).await?;
    let per = |b: usize| b as f64 / size.count as f64;
    println!(
        "| | first list: {} Pods | {} relabelled |",
        size.count, size.changes
    );
    println!("| --- | --- | --- |");
    let first = format!(
        "| every state stored, from the controller applied / the first change | {took:.1?} |"
    );

    let rate = WriteRate::sample(client, ns);
    let changing = Instant::now();
    let relabel = Patch::Merge(json!({"metadata": {"labels": {"app": "relabelled"}}}));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let changed = &names[..size.changes];
    all_of(changed.iter().map(|name| {
        let (pods, relabel) = (&pods, &relabel);
        async move {
            pods.patch(name, &PatchParams::default(), relabel)
                .await
                .with_context(|| format!("relabelling Pod {name}"))?;
            Ok(())
        }
    }))
    .await?;
    let patched = changing.elapsed();
    let after = eventually(
        &format!("the states of the {} relabelled Pods saved", size.changes),
        TIMEOUT,
        || async {
            let (entries, _, writes) = stored(client, ns).await?;
            let stale = changed
                .iter()
                .filter(|n| {
                    !entries
                        .get(&format!("{ns}/{n}"))
                        .is_some_and(|s| s.contains("relabelled"))
                })
                .count();
            ensure!(stale == 0, "{stale} not saved yet");
            Ok(Some(writes))
        },
    )
    .await?;
    let took_changes = changing.elapsed();
    let peak_changes = rate.peak();
    let change_writes = after - writes;
    println!("{first} {took_changes:.1?} (the patches took {patched:.1?}) |");
    println!(
        "| API writes that stored them (a store without batching: one per save) | {writes} ({:.1} states a write) | {change_writes} ({:.1} a write) |",
        size.count as f64 / writes.max(1) as f64,
        size.changes as f64 / change_writes.max(1) as f64
    );
    println!(
        "| state writes a second: peak (1 s samples) / average | {peak:.0} / {:.0} | {peak_changes:.0} / {:.0} |",
        writes as f64 / took.as_secs_f64(),
        change_writes as f64 / took_changes.as_secs_f64()
    );
    println!(
        "bytes per object: {:.0} in entries (key and value), {:.0} as stored in {shards} WasmControllerState objects (JSON, metadata included)",
        per(entry_bytes),
        per(object_bytes)
    );
    let cap = kubewasm::controller::CacheCaps::default().per_namespace as f64;
    println!(
        "the runtime's cache once the {} Pods were listed: {:.1} MiB weighed ({:.0} bytes a Pod; the default cap per namespace is {:.0} MiB), VmRSS {:.0} MiB",
        size.count,
        cached / f64::from(1u32 << 20),
        cached / size.count as f64,
        cap / f64::from(1u32 << 20),
        rss as f64 / 1024.0
    );
    Ok(())
}

/// Bytes of the pod watcher's entries (keys and values), of its state objects as JSON, and
/// how many objects.
async fn bytes(client: &Client, ns: &str) -> Result<(usize, usize, usize)> {
    let api: Api<WasmControllerState> = Api::namespaced(client.clone(), ns);
    let prefix = state_prefix("WasmController", "pod-watcher");
    let objects = api
        .list(&kube::api::ListParams::default().labels(&format!("{STATE_OF_LABEL}={prefix}")))
        .await?;
    let entries = objects
        .items
        .iter()
        .flat_map(|o| o.spec.entries.iter())
        .map(|(k, v)| k.len() + v.len())
        .sum();
    let json: usize = objects
        .items
        .iter()
        .map(|o| serde_json::to_vec(o).map_or(0, |b| b.len()))
        .sum();
    Ok((entries, json, objects.items.len()))
}
