//! Shards over Leases against a real API server: replicas
//! (holders driven round by round here) share 30 shards equally as they come and go, a shard
//! is never open in two replicas at once — not while a new replica takes its share, not when
//! one stops renewing (frozen: its fences shut by time, before its Leases expire), not when one
//! leaves cleanly — and the Leases read as the map. Then two `kubewasm run --leader-elect
//! --shards 1` processes: one holds the shard, the other waits, and takes it over at once when
//! the first stops on SIGTERM. All of it as the runtime's own ServiceAccount, whose Lease
//! rights are in its namespace only; each test names its set after a namespace of its own.

use kubewasm_test_support as support;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::ListParams;
use kubewasm::controller::{SHARD_SET_LABEL, ShardHolder, ShardSettings};
use support::{ControlPlane, RUNTIME_NAMESPACE, eventually};

#[path = "shards/scale_out.rs"]
mod scale_out;

const SHARDS: u32 = 30;
const LEASE: Duration = Duration::from_secs(3);

/// One round of every holder in `running`, each acking at once that the runners of the
/// shards it gives up are stopped (what the manager does); then the invariant: no shard open
/// in two holders.
async fn round(running: &[&Arc<ShardHolder>], all: &[&Arc<ShardHolder>]) -> Result<()> {
    for holder in running {
        holder.round().await?;
        for shard in holder.leaving() {
            holder.stopped(shard);
        }
    }
    exclusive(all)
}

/// No shard has an open fence in two holders.
fn exclusive(all: &[&Arc<ShardHolder>]) -> Result<()> {
    let mut open: BTreeMap<u32, String> = BTreeMap::new();
    for holder in all {
        for (shard, fence) in holder.held() {
            if !fence.is_open() {
                continue;
            }
            let me = holder.settings().identity.clone();
            if let Some(other) = open.insert(shard, me.clone()) {
                anyhow::bail!("shard {shard} is open in {other} and {me}");
            }
        }
    }
    Ok(())
}

/// How many shards each holder has open.
fn open_counts(all: &[&Arc<ShardHolder>]) -> Vec<usize> {
    all.iter()
        .map(|h| h.held().values().filter(|f| f.is_open()).count())
        .collect()
}

/// Rounds (about three a Lease, as the holders run them) until `done` says the shares are
/// right; the invariant is checked after every round.
async fn until(
    what: &str,
    running: &[&Arc<ShardHolder>],
    all: &[&Arc<ShardHolder>],
    done: impl Fn(&[usize]) -> bool,
) -> Result<()> {
    for _ in 0..40 {
        round(running, all).await?;
        if done(&open_counts(all)) {
            return Ok(());
        }
        tokio::time::sleep(LEASE / 3).await;
    }
    anyhow::bail!("{what}: shares stayed {:?}", open_counts(all))
}

#[tokio::test]
async fn replicas_share_the_shards_and_never_hold_one_twice() -> Result<()> {
    let cp = ControlPlane::shared();
    // A set of its own (named after a fresh namespace), so that tests do not share Leases;
    // as the runtime's own ServiceAccount, in its namespace: its Role is all it needs.
    let set = cp.namespace("shards").await?;
    let ns = RUNTIME_NAMESPACE.to_owned();
    let client = cp.runtime_client().await?;
    let holder = |identity: &str| {
        Arc::new(ShardHolder::new(
            client.clone(),
            ShardSettings {
                namespace: ns.clone(),
                prefix: set.clone(),
                shards: SHARDS,
                identity: identity.into(),
                duration: LEASE,
            },
        ))
    };
    let (a, b, c) = (
        holder("replica-a"),
        holder("replica-b"),
        holder("replica-c"),
    );
    let all = [&a, &b, &c];

    // Alone, a replica takes every shard.
    until("a alone", &[&a], &all, |n| n == [30, 0, 0]).await?;
    // A second replica appears: a gives up half (fences first), b takes them.
    until("a and b", &[&a, &b], &all, |n| n == [15, 15, 0]).await?;
    // A third: ten each.
    until("a, b and c", &[&a, &b, &c], &all, |n| n == [10, 10, 10]).await?;

    // The Leases read as the map: 30 shard Leases, each held by one of the three.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let listed = leases
        .list(&ListParams::default().labels(&format!("{SHARD_SET_LABEL}={set}")))
        .await?;
    let mut holders: BTreeMap<String, usize> = BTreeMap::new();
    let mut shards = 0;
    for lease in &listed.items {
        let name = lease.metadata.name.clone().unwrap_or_default();
        if !name.contains("-shard-") {
            continue;
        }
        shards += 1;
        let holder = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        *holders.entry(holder).or_default() += 1;
    }
    ensure!(shards == 30, "{shards} shard Leases");
    ensure!(
        holders
            == BTreeMap::from([
                ("replica-a".into(), 10),
                ("replica-b".into(), 10),
                ("replica-c".into(), 10)
            ]),
        "{holders:?}"
    );

    // c freezes (no more rounds): its fences shut by time, two thirds into the Lease, before
    // anyone may take its shards; then a and b take them.
    tokio::time::sleep(LEASE * 2 / 3 + Duration::from_millis(100)).await;
    ensure!(
        open_counts(&[&c]) == [0],
        "a frozen replica's fences are still open"
    );
    until("c frozen", &[&a, &b], &all, |n| n == [15, 15, 0]).await?;

    // a leaves cleanly: its shards are free at once, b takes all of them.
    a.release_all().await;
    until("a gone", &[&b], &all, |n| n == [0, 30, 0]).await?;
    b.release_all().await;

    // The member Lease of a replica gone is deleted by the others, so that the list each
    // round reads does not grow with every restart: a released one (a's) at the next round, an
    // expired one (c's) only 20 Lease durations after it expired (not waited for here).
    b.round().await?;
    let members = leases
        .list(&ListParams::default().labels(&format!("{SHARD_SET_LABEL}={set}")))
        .await?
        .items
        .into_iter()
        .filter_map(|l| l.metadata.name)
        .filter(|n| n.contains("-member-replica-a"))
        .count();
    ensure!(members == 0, "a's released member Lease is still there");
    b.release_all().await;
    Ok(())
}

const WAIT: Duration = Duration::from_secs(30);

struct Replica(Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `kubewasm run` hosting namespace `ns`, sharing its work in one shard with Leases
/// `kubewasm-system/<ns>-…`.
fn replica(cp: &ControlPlane, ns: &str, log: &std::path::Path) -> Result<Replica> {
    let log = std::fs::File::create(log)?;
    let child = Command::new(env!("CARGO_BIN_EXE_kubewasm"))
        .args(["run", "--namespace", ns, "--leader-elect", "--shards", "1"])
        .args(["--leader-election-namespace", RUNTIME_NAMESPACE])
        .args(["--leader-election-id", ns])
        .args(["--lease-duration-seconds", "3"])
        .env("KUBECONFIG", cp.runtime_kubeconfig())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    Ok(Replica(child))
}

async fn holder_of(api: &Api<Lease>, name: &str) -> Result<Option<String>> {
    Ok(api
        .get_opt(name)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

#[tokio::test]
async fn one_shard_two_replicas_one_runs_and_the_other_takes_over_on_sigterm() -> Result<()> {
    let cp = ControlPlane::shared();
    let ns = cp.namespace("replicas").await?;
    let shard = format!("{ns}-shard-000");
    let leases = Api::<Lease>::namespaced(cp.client().await?, RUNTIME_NAMESPACE);
    let dir = tempfile::tempdir()?;
    let mut first = replica(cp, &ns, &dir.path().join("first.log"))?;
    let first_id = format!("-{}", first.0.id());
    eventually("the first replica holding the shard", WAIT, || async {
        Ok(holder_of(&leases, &shard)
            .await?
            .filter(|h| h.ends_with(&first_id)))
    })
    .await?;
    let second = replica(cp, &ns, &dir.path().join("second.log"))?;
    let second_id = format!("-{}", second.0.id());
    // The second replica is counted (its member Lease), and the shard stays where it is: one
    // shard cannot be shared.
    eventually("the second replica's member Lease", WAIT, || async {
        let members = leases
            .list(&ListParams::default().labels(&format!("{SHARD_SET_LABEL}={ns}")))
            .await?
            .items
            .into_iter()
            .filter_map(|l| l.spec.and_then(|s| s.holder_identity))
            .filter(|h| h.ends_with(&second_id))
            .count();
        Ok((members > 0).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let now = holder_of(&leases, &shard).await?.unwrap_or_default();
    ensure!(
        now.ends_with(&first_id),
        "the second replica must not take a renewed shard (holder: {now})"
    );
    let second_log = std::fs::read_to_string(dir.path().join("second.log"))?;
    ensure!(
        !second_log.contains("holding 1 shards"),
        "the second replica took the shard too:\n{second_log}"
    );

    // SIGTERM the first: it stops its controllers and releases the shard, which the second
    // takes at its next round.
    Command::new("kill")
        .arg(first.0.id().to_string())
        .status()?;
    let status = first.0.wait()?;
    ensure!(
        status.success(),
        "the replica should exit cleanly on SIGTERM: {status}"
    );
    eventually("the second replica taking the shard over", WAIT, || async {
        Ok(holder_of(&leases, &shard)
            .await?
            .filter(|h| h.ends_with(&second_id)))
    })
    .await?;
    eventually(
        "the second replica saying it holds the shard",
        WAIT,
        || async {
            let log = std::fs::read_to_string(dir.path().join("second.log"))?;
            Ok(log.contains("holding 1 shards").then_some(()))
        },
    )
    .await?;
    drop(second);
    Ok(())
}
