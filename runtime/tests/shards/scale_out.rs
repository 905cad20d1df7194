//! Replicas that share the work, as processes: three `kubewasm run --leader-elect` over 30
//! tenants (one HelloWorld controller each, every tenant in a shard of its own), then one
//! killed without a word (SIGKILL) with a change made at once, then (one started in its
//! place, as the Deployment would) scaled 3 → 4 → 2 while changes flow the whole time.
//!
//! Checked: each replica runs between 5 and 15 controllers and none runs in two (the statuses
//! say where each runs); the killed replica's shards are taken within the Lease duration + 5 s
//! and the change made in the gap is carried out exactly once (one new Pod); every change made
//! while scaling is carried out; and, from every replica's own records of its reconciles
//! (its log: the replica, the object and so the shard, the time), no object was reconciled
//! by a replica before the one that reconciled it last had handed its controller over (or
//! died).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use kubewasm::controller::{DEFAULT_SHARDS, shard_of};
use serde_json::json;

use super::support::cluster::{
    apply_all, ensure_crds, example, guest, hello_worlds, module_config_map,
};
use super::support::runtime::{RuntimeProcess, finish};
use super::support::shards::{one_per_shard, replica_args};
use super::support::{ControlPlane, RUNTIME_NAMESPACE, eventually};

const TENANTS: usize = 30;
const LEASE_SECONDS: u64 = 6;
const WAIT: Duration = Duration::from_secs(120);

async fn set_up(cp: &ControlPlane, client: &Client, ns: &str, wasm: &[u8]) -> Result<()> {
    cp.namespace_named(ns).await?;
    apply_all(client, &example("hello-world/rbac.yaml", ns)?).await?;
    apply_all(
        client,
        &[module_config_map(
            ns,
            "hello-controller",
            "hello_world.wasm",
            wasm,
        )],
    )
    .await?;
    apply_all(client, &example("hello-world/controller.yaml", ns)?).await?;
    apply_all(client, &example("hello-world/hello.yaml", ns)?).await
}

/// Where each tenant's controller runs, by its status, once every one is Ready: tenant →
/// replica identity.
async fn placement(client: &Client, tenants: &[String]) -> Result<BTreeMap<String, String>> {
    let mut placed = BTreeMap::new();
    for ns in tenants {
        let status = super::support::cluster::controller_status(client, ns, "hello-world").await?;
        let ready = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ensure!(
            ready,
            "{ns}/hello-world is not Ready: {:?}",
            status.conditions
        );
        let replica = status.replica.context("no status.replica")?;
        placed.insert(ns.clone(), replica);
    }
    Ok(placed)
}

/// Whether each tenant's status names its shard, and the replica holding that shard's Lease.
async fn agrees_with_leases(
    client: &Client,
    run: &str,
    placed: &BTreeMap<String, String>,
) -> Result<()> {
    let leases = Api::namespaced(client.clone(), RUNTIME_NAMESPACE);
    for (ns, replica) in placed {
        let shard = format!("{run}-shard-{:03}", shard_of(ns, DEFAULT_SHARDS));
        let status = super::support::cluster::controller_status(client, ns, "hello-world").await?;
        ensure!(
            status.shard.as_deref() == Some(shard.as_str()),
            "{ns}: status.shard {:?}, not {shard}",
            status.shard
        );
        let holder = super::holder_of(&leases, &shard).await?;
        ensure!(
            holder.as_deref() == Some(replica.as_str()),
            "{ns} runs in {replica} but {shard} is held by {holder:?}"
        );
    }
    Ok(())
}

/// Controllers per replica.
fn counts(placed: &BTreeMap<String, String>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for replica in placed.values() {
        *counts.entry(replica.clone()).or_default() += 1;
    }
    counts
}

/// The identity a replica's log says it has.
fn identity(runtime: &RuntimeProcess) -> Option<String> {
    let log = runtime.log();
    let line = log.lines().find(|l| l.contains("sharing the work"))?;
    let start = line.find("identity=\"")? + "identity=\"".len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].to_owned())
}

/// One record of a replica's log: when, and of which object.
struct Record {
    at: Timestamp,
    replica: usize,
    /// `reconciled` or `gone` (the controller handed over, or the replica killed).
    what: &'static str,
}

/// Every replica's reconciles of `tenant`'s HelloWorld, and when each replica gave the
/// controller up (`handed over` or, stopping, `giving up every shard` in its log; `ended`:
/// when the test killed or stopped it).
fn records(
    runtimes: &[RuntimeProcess],
    ended: &BTreeMap<usize, Timestamp>,
    tenant: &str,
) -> Vec<Record> {
    let object = format!("object={tenant}/your-name}}");
    let controller = format!("controller={tenant}/hello-world");
    let mut all = Vec::new();
    for (replica, runtime) in runtimes.iter().enumerate() {
        for line in runtime.log().lines() {
            let what = if line.contains(&object) && line.contains(" reconciled ") {
                "reconciled"
            } else if line.contains(&controller) && line.contains("controller handed over") {
                "gone"
            } else if line.contains("giving up every shard") {
                // A stop (SIGTERM): its controllers stopped and its fences closed before it
                // released the Leases, however long the process then takes to exit.
                "gone"
            } else {
                continue;
            };
            let Some(at) = line.split_whitespace().next().and_then(|t| t.parse().ok()) else {
                continue;
            };
            all.push(Record { at, replica, what });
        }
        if let Some(at) = ended.get(&replica) {
            all.push(Record {
                at: *at,
                replica,
                what: "gone",
            });
        }
    }
    all.sort_by_key(|r| r.at);
    all
}

/// No object reconciled by a replica while another still ran its controller: whenever the
/// records of one object pass from replica A to replica B, A had given it up before.
fn never_two_at_once(
    runtimes: &[RuntimeProcess],
    ended: &BTreeMap<usize, Timestamp>,
    tenants: &[String],
) -> Result<usize> {
    let mut handovers = 0;
    for tenant in tenants {
        let mut running: Option<usize> = None;
        let mut given_up = BTreeSet::new();
        for record in records(runtimes, ended, tenant) {
            if record.what == "gone" {
                given_up.insert(record.replica);
                continue;
            }
            // A replica's last reconciles may end just after it said it hands over: they
            // still come before anyone else's.
            if running == Some(record.replica) {
                continue;
            }
            if let Some(other) = running {
                ensure!(
                    given_up.contains(&other),
                    "{tenant}/your-name reconciled by replica {} at {} while replica {other} still ran it",
                    record.replica,
                    record.at
                );
            }
            handovers += 1;
            given_up.remove(&record.replica);
            running = Some(record.replica);
        }
    }
    Ok(handovers)
}

/// Changes `who` of tenant `ns`'s HelloWorld.
async fn change(client: &Client, ns: &str, who: &str) -> Result<()> {
    hello_worlds(client, ns)
        .patch(
            "your-name",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"who": who}})),
        )
        .await?;
    Ok(())
}

/// Waits until every tenant's Pod says hello to what `last` says was set last.
async fn all_carried_out(client: &Client, last: &BTreeMap<String, String>) -> Result<()> {
    eventually("every change carried out", WAIT, || async {
        for (ns, who) in last {
            let pod = Api::<Pod>::namespaced(client.clone(), ns)
                .get_opt("your-name")
                .await?;
            let says = pod
                .and_then(|p| p.spec)
                .and_then(|s| s.containers.into_iter().next())
                .and_then(|c| c.command)
                .map(|c| c.join(" "))
                .unwrap_or_default();
            ensure!(
                says.contains(&format!("Hello, {who}!")),
                "{ns}/your-name runs {says:?}, not Hello, {who}!"
            );
        }
        Ok(Some(()))
    })
    .await
}

#[tokio::test]
async fn replicas_share_30_tenants_survive_a_kill_and_scale_without_running_one_twice() {
    let cp = ControlPlane::shared();
    let mut runtimes: Vec<RuntimeProcess> = Vec::new();
    let result = scenario(cp, &mut runtimes).await;
    let mut all: Vec<&mut RuntimeProcess> = runtimes.iter_mut().collect();
    finish(result, &mut all);
}

async fn scenario(cp: &ControlPlane, runtimes: &mut Vec<RuntimeProcess>) -> Result<()> {
    let client = cp.client().await?;
    ensure_crds(cp, &client).await?;
    let run = cp.namespace("scale").await?;
    let tenants = one_per_shard(&run, TENANTS);
    let wasm = guest("hello_world");
    futures::stream::iter(&tenants)
        .map(|ns| set_up(cp, &client, ns, &wasm))
        .buffer_unordered(6)
        .collect::<Vec<Result<()>>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;

    let kubeconfig = cp.runtime_kubeconfig();
    let lease = LEASE_SECONDS.to_string();
    let args = replica_args(&run, &["--lease-duration-seconds", &lease]);
    let start = |runtimes: &mut Vec<RuntimeProcess>| {
        runtimes.push(RuntimeProcess::start_with_args(&kubeconfig, "", &args));
        runtimes.len() - 1
    };
    for _ in 0..3 {
        start(runtimes);
    }
    let ids: Vec<String> = eventually("every replica says its identity", WAIT, || async {
        Ok(runtimes.iter().map(identity).collect::<Option<Vec<_>>>())
    })
    .await?;

    // 1. Three replicas: each runs 5 to 15 of the 30, each controller in one.
    let placed = eventually("30 controllers Ready over 3 replicas", WAIT, || async {
        let placed = placement(&client, &tenants).await?;
        let counts = counts(&placed);
        ensure!(counts.len() == 3, "run by {counts:?}");
        ensure!(
            counts.values().all(|n| (5..=15).contains(n)),
            "uneven: {counts:?}"
        );
        // A status names the replica that last wrote it: while the replicas first share
        // the shards out, one that gave a shard up still shows until its new holder
        // writes. Settled: every status names its shard's holder.
        agrees_with_leases(&client, &run, &placed).await?;
        Ok(Some(placed))
    })
    .await?;
    eprintln!("3 replicas: {:?}", counts(&placed));

    // 2. SIGKILL the busiest replica and change a HelloWorld it ran, at once.
    let counts_now = counts(&placed);
    let (victim_id, _) = counts_now
        .iter()
        .max_by_key(|(_, n)| **n)
        .context("no replica")?;
    let victim = ids
        .iter()
        .position(|id| id == victim_id)
        .context("the busiest replica is none of ours")?;
    let orphan = placed
        .iter()
        .find(|(_, r)| *r == victim_id)
        .map(|(ns, _)| ns.clone())
        .context("the victim runs nothing")?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &orphan);
    let before = pods.get("your-name").await?.uid().unwrap_or_default();
    let mut killed = BTreeMap::new();
    runtimes[victim].kill()?;
    killed.insert(victim, Timestamp::now());
    let killed_at = Instant::now();
    change(&client, &orphan, "Gap").await?;
    let moved: Vec<String> = placed
        .iter()
        .filter(|(_, r)| *r == victim_id)
        .map(|(ns, _)| format!("{run}-shard-{:03}", shard_of(ns, DEFAULT_SHARDS)))
        .collect();
    let leases = Api::namespaced(client.clone(), RUNTIME_NAMESPACE);
    let bound = Duration::from_secs(LEASE_SECONDS + 5);
    eventually(
        &format!(
            "the killed replica's {} shards held by the others",
            moved.len()
        ),
        bound,
        || async {
            for shard in &moved {
                let holder = super::holder_of(&leases, shard).await?.unwrap_or_default();
                ensure!(
                    !holder.is_empty() && holder != *victim_id,
                    "{shard} held by {holder:?}"
                );
            }
            Ok(Some(()))
        },
    )
    .await?;
    let taken = killed_at.elapsed();
    let after_kill = eventually("30 controllers Ready over the 2 left", WAIT, || async {
        let placed = placement(&client, &tenants).await?;
        ensure!(
            !placed.values().any(|r| r == victim_id),
            "still shown in the killed replica"
        );
        Ok(Some(counts(&placed)))
    })
    .await?;
    eventually("the change made in the gap carried out", WAIT, || async {
        let pod = pods.get_opt("your-name").await?.context("no Pod")?;
        let says = format!("{:?}", pod.spec.as_ref().map(|s| &s.containers[0].command));
        ensure!(says.contains("Hello, Gap!"), "runs {says}");
        Ok(Some(pod.uid().unwrap_or_default()))
    })
    .await?;
    // Exactly once: the Pod replaced once and left alone since.
    let first_new = pods.get("your-name").await?.uid().unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let still = pods.get("your-name").await?.uid().unwrap_or_default();
    ensure!(
        first_new != before && still == first_new,
        "Pod your-name: {before} before, {first_new} after the change, {still} 5 s later"
    );
    let gap_reconciles = records(runtimes, &killed, &orphan)
        .iter()
        .filter(|r| r.what == "reconciled" && r.replica != victim)
        .count();
    eprintln!(
        "killed {victim_id}: its {} shards held by the others {taken:.1?} after the kill (bound {bound:?}); now {after_kill:?}; {orphan} reconciled {gap_reconciles} times since",
        moved.len()
    );

    // 3. The killed one replaced (as the Deployment does), then scaled 3 → 4 → 2 while
    // changes flow.
    let flowing = Arc::new(AtomicBool::new(true));
    let changer = tokio::spawn({
        let (client, tenants, flowing) = (client.clone(), tenants.clone(), flowing.clone());
        async move {
            let mut last = BTreeMap::new();
            let mut n = 0usize;
            while flowing.load(Ordering::Relaxed) {
                let ns = &tenants[n % tenants.len()];
                let who = format!("Change {n}");
                if change(&client, ns, &who).await.is_ok() {
                    last.insert(ns.clone(), who);
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (last, n)
        }
    });
    let a = start(runtimes);
    let three = eventually(
        "30 controllers Ready over 3 replicas again",
        WAIT,
        || async {
            let placed = placement(&client, &tenants).await?;
            let counts = counts(&placed);
            ensure!(counts.len() == 3, "run by {counts:?}");
            Ok(Some(counts))
        },
    )
    .await?;
    let b = start(runtimes);
    eventually("30 controllers Ready over 4 replicas", WAIT, || async {
        let placed = placement(&client, &tenants).await?;
        let counts = counts(&placed);
        ensure!(counts.len() == 4, "run by {counts:?}");
        Ok(Some(()))
    })
    .await?;
    let four = counts(&placement(&client, &tenants).await?);
    // Two of the first three stop as a Deployment scaled down stops them (SIGTERM).
    let leaving: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    for i in &leaving {
        runtimes[*i].stop()?;
        // Exited: every record of it comes before this.
        killed.insert(*i, Timestamp::now());
    }
    let two = eventually(
        "30 controllers Ready over the 2 new replicas",
        WAIT,
        || async {
            let placed = placement(&client, &tenants).await?;
            let counts = counts(&placed);
            ensure!(counts.len() == 2, "run by {counts:?}");
            Ok(Some(counts))
        },
    )
    .await?;
    flowing.store(false, Ordering::Relaxed);
    let (last, changes) = changer.await?;
    all_carried_out(&client, &last).await?;
    for i in [a, b] {
        runtimes[i].ensure_running()?;
    }
    let handovers = never_two_at_once(runtimes, &killed, &tenants)?;
    eprintln!(
        "3 replicas again: {three:?}; 4 replicas: {four:?}; 2 replicas: {two:?}; {changes} changes made while scaling, all carried out; {handovers} times a controller started on a replica, never while another ran it"
    );
    Ok(())
}
