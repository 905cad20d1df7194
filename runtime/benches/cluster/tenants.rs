//! P6: many HelloWorlds across many tenants, hosted by 1, 2 and 3 `kubewasm run
//! --leader-elect` replicas sharing the work, against the raw write floor of the same run (a
//! raw kube-rs client per tenant, acting as that tenant's ServiceAccount, making the same
//! Pods and statuses with no watch, no reconcile and no rate).
//!
//! Each round sets up its own tenants (namespaces, each with the example's RBAC, module
//! ConfigMap and WasmController; their names picked so that each is in a shard of its own,
//! which spreads them evenly over the replicas), starts the replicas and waits until every
//! controller is Ready and the replicas have settled their shares (not timed), then creates
//! the HelloWorlds — [`hello::CREATE_CONCURRENCY`] at a time across all tenants — and times
//! until each has its Pod and `status.pods = 1`. Then it stops the replicas and deletes the
//! namespaces (waited for).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::Client;
use kube::api::ListParams;
use kubewasm::controller::{DEFAULT_SHARDS, ROLE_LABEL, SHARD_SET_LABEL};

use crate::BENCH_LOG_FILTER;
use crate::cluster::{apply, apply_all, example, guest, module_config_map};
use crate::hello::{Round, delete_namespace, measure_many};
use crate::runtime::RuntimeProcess;
use crate::stats::{Samples, ms};
use crate::support::shards::{one_per_shard, replica_args};
use crate::support::{ControlPlane, RUNTIME_NAMESPACE, eventually};

/// What P6 runs.
#[derive(Debug, Clone)]
pub struct Size {
    /// Tenants (namespaces), one WasmController each.
    pub tenants: usize,
    /// HelloWorlds per tenant.
    pub per_tenant: usize,
    /// Replica counts to run, each against the raw floor.
    pub replicas: Vec<usize>,
    /// Rounds of each.
    pub rounds: usize,
}

/// Who writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Writer {
    Raw,
    Replicas(usize),
}

impl Writer {
    fn name(self) -> String {
        match self {
            Writer::Raw => "raw kube-rs clients (one per tenant, 8 in flight each)".into(),
            Writer::Replicas(1) => "kubewasm, 1 replica (as shipped)".into(),
            Writer::Replicas(n) => format!("kubewasm, {n} replicas (as shipped)"),
        }
    }
}

/// What one round measured, and how many controllers each replica ran.
type Measured = (Round, BTreeMap<String, usize>);

/// Runs P6 and prints its table.
pub async fn bench(cp: &ControlPlane, size: Size) -> Result<()> {
    let admin = cp.client().await?;
    crate::cluster::ensure_crds(cp, &admin).await?;
    let mut results: BTreeMap<Writer, Vec<Measured>> = BTreeMap::new();
    for round in 0..size.rounds {
        let mut order: Vec<Writer> = std::iter::once(Writer::Raw)
            .chain(size.replicas.iter().map(|n| Writer::Replicas(*n)))
            .collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for writer in order {
            let measured = one(cp, &admin, writer, &size)
                .await
                .with_context(|| format!("a round of {}", writer.name()))?;
            eprintln!(
                "  P6 round: {:<48} converged {} ({} writes; controllers per replica {:?})",
                writer.name(),
                ms(measured.0.converged),
                measured.0.writes,
                measured.1.values().collect::<Vec<_>>()
            );
            results.entry(writer).or_default().push(measured);
        }
    }
    println!(
        "P6: {} HelloWorlds across {} tenants ({} each; {} creates in flight) → each has its Pod and status.pods = 1",
        size.tenants * size.per_tenant,
        size.tenants,
        size.per_tenant,
        crate::hello::CREATE_CONCURRENCY
    );
    let raw = results
        .get(&Writer::Raw)
        .map(|r| Samples::new(r.iter().map(|(m, _)| m.converged).collect()).median());
    for (writer, rounds) in &results {
        let converged = Samples::new(rounds.iter().map(|(m, _)| m.converged).collect());
        let rates: Vec<String> = rounds
            .iter()
            .map(|(m, _)| format!("{:.0}", m.writes as f64 / m.converged.as_secs_f64()))
            .collect();
        let latencies = Samples::new(
            rounds
                .iter()
                .flat_map(|(m, _)| m.latencies.clone())
                .collect(),
        );
        println!("  {}", writer.name());
        println!("    all converged: {}", converged.rounds());
        println!(
            "    writes seen per round {:?}; writes/s {}",
            rounds.iter().map(|(m, _)| m.writes).collect::<Vec<_>>(),
            rates.join(", ")
        );
        println!(
            "    per HelloWorld, created → status: {}",
            latencies.percentiles()
        );
        if let Writer::Replicas(_) = writer {
            println!(
                "    controllers per replica: {:?}",
                rounds
                    .iter()
                    .map(|(_, spread)| spread.values().copied().collect::<Vec<_>>())
                    .collect::<Vec<_>>()
            );
            if let Some(raw) = raw {
                println!(
                    "    above the raw floor (medians): {}",
                    crate::stats::overhead(converged.median(), raw)
                );
            }
        }
    }
    Ok(())
}

/// One round of `writer`: set up, measured, torn down. What it measured, and how many
/// controllers each replica ran.
async fn one(cp: &ControlPlane, admin: &Client, writer: Writer, size: &Size) -> Result<Measured> {
    let run = cp.namespace("p6").await?;
    let tenants = one_per_shard(&run, size.tenants);
    let wasm = guest("hello_world");
    let kubewasm = matches!(writer, Writer::Replicas(_));
    futures::stream::iter(&tenants)
        .map(|ns| {
            let wasm = &wasm;
            async move {
                cp.namespace_named(ns).await?;
                apply_all(admin, &example("hello-world/rbac.yaml", ns)?).await?;
                if kubewasm {
                    apply(
                        admin,
                        &module_config_map(ns, "hello-controller", "hello_world.wasm", wasm),
                    )
                    .await?;
                    apply_all(admin, &example("hello-world/controller.yaml", ns)?).await?;
                }
                anyhow::Ok(())
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;

    let mut replicas = Vec::new();
    let mut spread = BTreeMap::new();
    let mut namespaces = Vec::new();
    if let Writer::Replicas(n) = writer {
        let args = replica_args(&run, &[]);
        for _ in 0..n {
            replicas.push(RuntimeProcess::start_with_log_filter(
                &cp.runtime_kubeconfig(),
                "",
                &args,
                BENCH_LOG_FILTER,
            ));
        }
        spread = settled(admin, &run, &tenants, n).await?;
        namespaces.extend(tenants.iter().map(|ns| (ns.clone(), None)));
    } else {
        for ns in &tenants {
            let raw = cp
                .client_for_service_account(ns, "hello-controller")
                .await?;
            namespaces.push((ns.clone(), Some(raw)));
        }
    }
    let measured = measure_many(admin, namespaces, size.per_tenant).await;
    drop(replicas);
    futures::future::join_all(
        tenants
            .iter()
            .chain(std::iter::once(&run))
            .map(|ns| delete_namespace(cp, admin, ns)),
    )
    .await
    .into_iter()
    .collect::<Result<Vec<()>>>()?;
    Ok((measured?, spread))
}

/// Waits until every tenant's controller is Ready and the replicas have settled: the shard
/// Leases of set `run` split evenly between `n` replicas, and the statuses unmoved for a few
/// seconds. Controllers per replica.
async fn settled(
    admin: &Client,
    run: &str,
    tenants: &[String],
    n: usize,
) -> Result<BTreeMap<String, usize>> {
    let placement = || async {
        let mut placed = BTreeMap::new();
        for ns in tenants {
            let status = crate::cluster::controller_status(admin, ns, "hello-world").await?;
            let ready = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            anyhow::ensure!(ready, "{ns}/hello-world is not Ready");
            placed.insert(ns.clone(), status.replica.unwrap_or_default());
        }
        anyhow::Ok(placed)
    };
    let leases: Api<Lease> = Api::namespaced(admin.clone(), RUNTIME_NAMESPACE);
    let share = (DEFAULT_SHARDS as usize).div_ceil(n);
    let wait = std::time::Duration::from_secs(180);
    let placed = eventually(
        &format!(
            "{} controllers Ready, {DEFAULT_SHARDS} shards split over {n} replicas, settled",
            tenants.len()
        ),
        wait,
        || async {
            let listed = leases
                .list(
                    &ListParams::default()
                        .labels(&format!("{SHARD_SET_LABEL}={run},{ROLE_LABEL}=shard")),
                )
                .await?;
            let mut held: BTreeMap<String, usize> = BTreeMap::new();
            for lease in listed.items {
                let holder = lease
                    .spec
                    .and_then(|s| s.holder_identity)
                    .unwrap_or_default();
                *held.entry(holder).or_default() += 1;
            }
            anyhow::ensure!(
                held.len() == n
                    && !held.contains_key("")
                    && held.values().sum::<usize>() == DEFAULT_SHARDS as usize
                    && held.values().all(|h| *h <= share),
                "shards held: {held:?}"
            );
            let placed = placement().await?;
            tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            let again = placement().await?;
            anyhow::ensure!(again == placed, "still moving");
            Ok(Some(again))
        },
    )
    .await?;
    let mut counts = BTreeMap::new();
    for replica in placed.values() {
        *counts.entry(replica.clone()).or_default() += 1;
    }
    Ok(counts)
}
