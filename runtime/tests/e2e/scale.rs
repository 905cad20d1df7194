//! Step 9: the installed Deployment scaled to 3 and back to 2, as `kubectl scale` does it: the
//! shards split over every replica, each runtime Pod running controllers, and the
//! PodDisruptionBudget following the replicas.
//!
//! So that every replica has controllers whatever shards it holds, 32 ClusterWasmControllers
//! are made, one per shard (a ClusterWasmController's tenant is its name; the names are picked
//! by the shard they hash to), each the module file's HelloWorld controller of step 6 with a
//! selector no HelloWorld matches: they start, are Ready and reconcile nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use kubewasm::api::ClusterWasmController;
use kubewasm::controller::{DEFAULT_SHARDS, shard_of};
use serde_json::json;

use crate::cluster::{
    NodeCluster, RUNTIME_SELECTOR, SYSTEM, WAIT, holder_pod, shard_holder, wait_running,
    wait_shares,
};
use crate::support::eventually;
use crate::timings::{Timings, secs};

/// One ClusterWasmController name per shard.
fn spread_names() -> Vec<String> {
    let mut shards = BTreeSet::new();
    (0..)
        .map(|i| format!("e2e-spread-{i}"))
        .filter(|name| shards.insert(shard_of(name, DEFAULT_SHARDS)))
        .take(DEFAULT_SHARDS as usize)
        .collect()
}

/// The ClusterWasmController `name`: step 6's, reconciling nothing.
fn spread_controller(name: &str) -> Result<ClusterWasmController> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kubewasm.dev/v1alpha1",
        "kind": "ClusterWasmController",
        "metadata": {"name": name},
        "spec": {
            "module": {"path": "hello_world.wasm"},
            "parent": {
                "apiVersion": "example.com/v1",
                "kind": "HelloWorld",
                "labelSelector": "kubewasm.dev/e2e=spread-matches-nothing"
            },
            "serviceAccountName": "e2e-module-file",
            "serviceAccountNamespace": "default"
        }
    }))?)
}

/// `kubectl -n kubewasm-system get pdb kubewasm`: (expected Pods, disruptions allowed).
async fn disruption_budget(cluster: &NodeCluster) -> Result<(u32, u32)> {
    let out = cluster
        .kubectl
        .run(&[
            "-n",
            SYSTEM,
            "get",
            "pdb",
            "kubewasm",
            "-o",
            "jsonpath={.status.expectedPods} {.status.disruptionsAllowed}",
        ])
        .await?;
    let mut numbers = out.split_whitespace().map(str::parse::<u32>);
    match (numbers.next(), numbers.next()) {
        (Some(Ok(expected)), Some(Ok(allowed))) => Ok((expected, allowed)),
        _ => anyhow::bail!("the PodDisruptionBudget's status is {out:?}"),
    }
}

async fn wait_budget(cluster: &NodeCluster, replicas: u32) -> Result<()> {
    eventually(
        &format!("PodDisruptionBudget kubewasm expects {replicas} Pods and allows 1 disruption"),
        WAIT,
        || async {
            let (expected, allowed) = disruption_budget(cluster).await?;
            ensure!(
                expected == replicas && allowed == 1,
                "expects {expected}, allows {allowed}"
            );
            Ok(Some(()))
        },
    )
    .await
}

/// Waits until every spread controller is Ready, run by the holder of its shard, one of
/// `pods`; how many each Pod runs.
async fn wait_spread(
    client: &Client,
    names: &[String],
    pods: &[String],
) -> Result<BTreeMap<String, usize>> {
    let api: Api<ClusterWasmController> = Api::all(client.clone());
    eventually(
        &format!(
            "{} ClusterWasmControllers Ready, run by {pods:?}",
            names.len()
        ),
        WAIT,
        || async {
            let mut running: BTreeMap<String, usize> =
                pods.iter().map(|p| (p.clone(), 0)).collect();
            for name in names {
                let status = api.get(name).await?.status.unwrap_or_default();
                let ready = status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                ensure!(ready, "{name} is not Ready: {:?}", status.conditions);
                let replica = status.replica.clone().unwrap_or_default();
                let pod = holder_pod(&replica, pods)
                    .with_context(|| format!("{name} runs in {replica:?}, none of {pods:?}"))?;
                let holder = shard_holder(client, name).await?.unwrap_or_default();
                ensure!(
                    holder == replica,
                    "{name} says {replica} runs it, its shard is held by {holder}"
                );
                *running.entry(pod).or_default() += 1;
            }
            Ok(Some(running))
        },
    )
    .await
}

pub async fn scale(cluster: &NodeCluster, timings: &mut Timings) -> Result<()> {
    let client = &cluster.client;
    let kubectl = &cluster.kubectl;
    wait_budget(cluster, 2).await?;
    timings.note("PodDisruptionBudget kubewasm: 2 Pods expected, 1 disruption allowed");

    let names = spread_names();
    let api: Api<ClusterWasmController> = Api::all(client.clone());
    for name in &names {
        api.create(&PostParams::default(), &spread_controller(name)?)
            .await
            .with_context(|| format!("creating ClusterWasmController {name}"))?;
    }

    let started = Instant::now();
    kubectl
        .run(&["-n", SYSTEM, "scale", "deploy/kubewasm", "--replicas=3"])
        .await?;
    let three: Vec<String> = wait_running(client, SYSTEM, RUNTIME_SELECTOR, 3, &[], WAIT)
        .await?
        .into_keys()
        .collect();
    let shares = wait_shares(client, &three, WAIT).await?;
    let running = wait_spread(client, &names, &three).await?;
    ensure!(
        running.values().all(|n| *n > 0),
        "a runtime Pod runs no controller: {running:?}"
    );
    wait_budget(cluster, 3).await?;
    timings.note(format!(
        "scaled to 3: shards {shares:?}, the {} spread controllers run {running:?}, {} after kubectl scale; PodDisruptionBudget: 3 expected, 1 allowed",
        names.len(),
        secs(started.elapsed())
    ));

    let started = Instant::now();
    kubectl
        .run(&["-n", SYSTEM, "scale", "deploy/kubewasm", "--replicas=2"])
        .await?;
    let two: Vec<String> = wait_running(client, SYSTEM, RUNTIME_SELECTOR, 2, &[], WAIT)
        .await?
        .into_keys()
        .collect();
    let shares = wait_shares(client, &two, WAIT).await?;
    let running = wait_spread(client, &names, &two).await?;
    timings.note(format!(
        "scaled back to 2: shards {shares:?}, the spread controllers run {running:?}, {} after kubectl scale",
        secs(started.elapsed())
    ));
    for name in &names {
        api.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}
