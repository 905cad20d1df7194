//! Shards over Leases against a real API server: replicas
//! (holders driven round by round here) share 30 shards equally as they come and go, a shard
//! is never open in two replicas at once — not while a new replica takes its share, not when
//! one stops renewing (frozen: its fences shut by time, before its Leases expire), not when one
//! leaves cleanly — and the Leases read as the map.

use kubewasm_test_support as support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::ListParams;
use kubewasm::controller::{SHARD_SET_LABEL, ShardHolder, ShardSettings};
use support::ControlPlane;

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
    // A set of its own, in a fresh namespace, so that tests do not share Leases.
    let ns = cp.namespace("shards").await?;
    let set = "kubewasm".to_owned();
    // As the admin: the runtime's Role gets `list` on leases (which the shard holder needs)
    // when `kubewasm run` runs shards; until then `live::identity` proves it has none.
    let client = cp.client().await?;
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
    Ok(())
}
