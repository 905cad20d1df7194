//! Shards over Leases: replicas share the work instead of electing one leader.
//!
//! The work is cut into a fixed number of shards; a controller belongs to shard
//! [`shard_of`]`(tenant)` (a stable hash of its namespace, or of a ClusterWasmController's
//! name). Each shard is a `coordination.k8s.io/v1` Lease in the runtime's namespace
//! (`PREFIX-shard-NNN`), and each replica also renews a member Lease of its own
//! (`PREFIX-member-IDENTITY`), so that a replica holding no shard yet is still counted. Every
//! round (a third of the Lease duration) a replica renews its member Lease and its shards,
//! lists the set's Leases, and from the live members works out its share — `⌈shards /
//! members⌉` — then takes free or expired shards while it has fewer, and gives up its
//! highest-numbered shards while it has more (a new replica has appeared).
//!
//! Each shard held has a [`Fence`] of its own, exactly as the leader's: open until the time
//! its last renewal covers (two thirds of the Lease), so a replica frozen past its Lease
//! writes nothing for that shard when it wakes, whoever runs first. A shard is given up in two
//! steps: its fence is left ([`Fence::leave`]: no runner of the shard starts anything again,
//! what the stopping runners left behind — a guest's saves — may still be written while the
//! Lease is renewed), then, once the owner of the holder has said the shard's runners are
//! stopped ([`ShardHolder::stopped`]), its Lease is released (the fence closed) and another
//! replica may take it. An expired shard is taken only
//! after its Lease duration.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Fence;
use crate::sync::Locks as _;

/// The label naming the shard set a Lease belongs to (its prefix).
pub const SHARD_SET_LABEL: &str = "kubewasm.dev/shard-set";
/// The label saying what a Lease of the set is: `shard` or `member`.
pub const ROLE_LABEL: &str = "kubewasm.dev/role";

/// Shards when `kubewasm run --shards` does not say: enough to spread over a few dozen
/// replicas, few enough that each round of a replica (one list, one write per shard held) stays
/// cheap.
pub const DEFAULT_SHARDS: u32 = 32;

/// How long a member Lease may have expired before any replica deletes it: its replica is
/// gone for good (a restarted replica has a new identity), and the list each round reads
/// should not grow with every restart the set ever had.
const STALE_MEMBER_LEASES: u32 = 20;

/// The tenant a controller belongs to, which decides its shard: its namespace, or a
/// ClusterWasmController's name.
pub fn tenant_of<'a>(namespace: Option<&'a str>, name: &'a str) -> &'a str {
    namespace.unwrap_or(name)
}

/// The shard of `tenant` among `shards`: the first 8 bytes of its SHA-256, modulo — stable
/// across processes, versions and platforms.
pub fn shard_of(tenant: &str, shards: u32) -> u32 {
    let digest = Sha256::digest(tenant.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    (u64::from_be_bytes(first) % u64::from(shards.max(1))) as u32
}

/// A replica's settings of the shard set.
#[derive(Debug, Clone)]
pub struct ShardSettings {
    /// The runtime's namespace, where the Leases are.
    pub namespace: String,
    /// The set's name, the prefix of its Leases (e.g. `kubewasm`).
    pub prefix: String,
    /// How many shards there are (the same for every replica).
    pub shards: u32,
    /// This replica's identity (unique per process).
    pub identity: String,
    /// How long a Lease holds without renewal.
    pub duration: Duration,
}

impl ShardSettings {
    /// The Lease name of shard `shard`.
    pub fn shard_lease(&self, shard: u32) -> String {
        format!("{}-shard-{shard:03}", self.prefix)
    }

    /// The name of this replica's member Lease (its identity made a valid name).
    fn member_lease(&self) -> String {
        let mut name: String = format!("{}-member-{}", self.prefix, self.identity)
            .to_ascii_lowercase()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        name.truncate(253);
        name.trim_end_matches('-').to_owned()
    }

    /// How long after the start of its last renewal a holder may still act: two thirds of a
    /// Lease, a third before another replica may take over.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }
}

/// What this replica holds now: the shards and the fence of each.
pub type Held = BTreeMap<u32, Fence>;

/// Holds this replica's share of the shards (see the module doc).
pub struct ShardHolder {
    api: Api<Lease>,
    settings: ShardSettings,
    held: Mutex<Held>,
    /// Shards whose fence was left to give them up, and whose runners are not stopped yet.
    leaving: Mutex<BTreeSet<u32>>,
    /// Shards whose runners the owner said are stopped: their Leases may go.
    stopped: Mutex<BTreeSet<u32>>,
    /// Sent after every round whose shards held or given up differ from the last one's.
    changes: watch::Sender<(Vec<u32>, BTreeSet<u32>)>,
    /// The live members the last round counted (said when it changes).
    members: std::sync::atomic::AtomicUsize,
}

impl ShardHolder {
    /// A holder of shards of `settings`' set, with `client` (the runtime's own identity).
    pub fn new(client: Client, settings: ShardSettings) -> ShardHolder {
        ShardHolder {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            held: Mutex::default(),
            leaving: Mutex::default(),
            stopped: Mutex::default(),
            changes: watch::Sender::new((Vec::new(), BTreeSet::new())),
            members: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    pub fn settings(&self) -> &ShardSettings {
        &self.settings
    }

    /// The shards held now (their fences may have closed since, by time).
    pub fn held(&self) -> Held {
        self.held.locked().clone()
    }

    /// The shards this replica is giving up: fences left, runners still to be stopped.
    pub fn leaving(&self) -> BTreeSet<u32> {
        self.leaving.locked().clone()
    }

    /// A receiver that sees every change of the shards held or being given up (read them
    /// with [`held`](Self::held) and [`leaving`](Self::leaving)).
    pub fn subscribe(&self) -> watch::Receiver<(Vec<u32>, BTreeSet<u32>)> {
        self.changes.subscribe()
    }

    /// Says what is held and leaving now, if it changed.
    fn publish(&self) {
        let now = (
            self.held.locked().keys().copied().collect::<Vec<u32>>(),
            self.leaving(),
        );
        self.changes.send_if_modified(|seen| {
            let changed = *seen != now;
            if changed {
                *seen = now.clone();
            }
            changed
        });
    }

    /// The owner says the runners of `shard` are stopped: its Lease may be released.
    pub fn stopped(&self, shard: u32) {
        self.stopped.locked().insert(shard);
    }

    /// Rounds until dropped: one starting every third of the Lease duration (a round that
    /// took longer is followed at once), so that a slow round does not push the next
    /// renewal past the fences' deadline. Errors are logged and the next round tries again (a
    /// holder that cannot renew loses its shards by time).
    pub async fn run(&self) {
        let mut every = tokio::time::interval(self.settings.duration / 3);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            if let Err(e) = self.round().await {
                tracing::warn!(identity = self.settings.identity, "shard round failed: {e}");
            }
            // A round that failed half-way may have lost or given up shards too.
            self.publish();
        }
    }

    /// Gives every shard up (closing its fence first) and the member Lease, for a clean stop:
    /// the others take the shards at once rather than after the Lease duration.
    pub async fn release_all(&self) {
        let held = std::mem::take(&mut *self.held.locked());
        for fence in held.values() {
            fence.close();
        }
        // From here on nothing of this replica acts: what another replica does next is its own.
        tracing::info!(
            identity = self.settings.identity,
            shards = held.len(),
            "giving up every shard: the controllers stopped, the fences closed"
        );
        self.leaving.locked().clear();
        self.publish();
        for shard in held.keys() {
            let _ = self.release(&self.settings.shard_lease(*shard)).await;
        }
        let _ = self.release(&self.settings.member_lease()).await;
    }

    /// One round (see the module doc).
    pub async fn round(&self) -> Result<(), kube::Error> {
        let started = Instant::now();
        let now = Timestamp::now();
        self.renew_member(now).await?;
        let leases = self
            .api
            .list(
                &ListParams::default()
                    .labels(&format!("{SHARD_SET_LABEL}={}", self.settings.prefix)),
            )
            .await?;
        let stale_after = self.settings.duration.as_secs() * u64::from(STALE_MEMBER_LEASES);
        let long_ago = now
            .checked_sub(SignedDuration::from_secs(
                i64::try_from(stale_after).unwrap_or(i64::MAX),
            ))
            .unwrap_or(now);
        let mut shards: BTreeMap<String, Lease> = BTreeMap::new();
        let mut members = BTreeSet::from([self.settings.identity.clone()]);
        for lease in leases.items {
            let role = lease
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(ROLE_LABEL))
                .cloned();
            let name = lease.metadata.name.clone().unwrap_or_default();
            match role.as_deref() {
                Some("member") => {
                    if let Some(holder) = live_holder(&lease, now, self.settings.duration) {
                        members.insert(holder);
                    } else if live_holder(&lease, long_ago, self.settings.duration).is_none() {
                        self.delete_stale(&lease).await;
                    }
                }
                Some("shard") => {
                    shards.insert(name, lease);
                }
                _ => {}
            }
        }
        let share = self.settings.shards.div_ceil(members.len() as u32);
        let counted = members.len();
        if self
            .members
            .swap(counted, std::sync::atomic::Ordering::Relaxed)
            != counted
        {
            tracing::info!(
                identity = self.settings.identity,
                "{counted} replicas share {} shards: this one's share is {share}",
                self.settings.shards
            );
        }
        let deadline = started + self.settings.renew_deadline();

        // Renew what is held, all at once (a round's length must not grow with the shards
        // held); what could not be renewed is lost (its fence closes by time, and at once here).
        let held: Vec<u32> = self.held.locked().keys().copied().collect();
        let renewals = held.iter().map(|shard| {
            let name = self.settings.shard_lease(*shard);
            let lease = shards
                .get(&name)
                .filter(|l| holder_of(l) == Some(self.settings.identity.as_str()))
                .cloned();
            async move {
                match lease {
                    Some(lease) => self.write(lease, now, false).await,
                    None => Ok(false),
                }
            }
        });
        let renewed = futures::future::join_all(renewals).await;
        for (shard, renewed) in held.into_iter().zip(renewed) {
            match renewed {
                Ok(true) => {
                    if let Some(fence) = self.held.locked().get(&shard) {
                        fence.extend(deadline);
                    }
                }
                Ok(false) => self.lose(shard),
                // Not known: kept, not extended (its fence shuts by time unless the next
                // round renews it).
                Err(e) => tracing::warn!(
                    identity = self.settings.identity,
                    shard,
                    "could not renew the shard's Lease: {e}"
                ),
            }
        }

        // Give up shards past the share: fence first (left: nothing new acts, what the runners
        // leave behind is still written while they stop), Lease once the runners are stopped.
        let over: Vec<u32> = {
            let held = self.held.locked();
            let keep = share as usize;
            held.keys()
                .rev()
                .take(held.len().saturating_sub(keep))
                .copied()
                .collect()
        };
        for shard in over {
            if let Some(fence) = self.held.locked().get(&shard) {
                fence.leave();
            }
            self.leaving.locked().insert(shard);
        }
        let leaving: Vec<u32> = self.leaving.locked().iter().copied().collect();
        for shard in leaving {
            if self.stopped.locked().remove(&shard) {
                if let Some(fence) = self.held.locked().remove(&shard) {
                    fence.close();
                }
                self.leaving.locked().remove(&shard);
                self.release(&self.settings.shard_lease(shard)).await?;
            }
        }

        // Take free or expired shards up to the share.
        for shard in 0..self.settings.shards {
            if self.held.locked().len() >= share as usize {
                break;
            }
            if self.held.locked().contains_key(&shard) {
                continue;
            }
            let name = self.settings.shard_lease(shard);
            let taken = match shards.get(&name) {
                None => self.create_shard(shard, now).await?,
                Some(lease) if live_holder(lease, now, self.settings.duration).is_none() => {
                    self.write(lease.clone(), now, true).await?
                }
                Some(_) => false,
            };
            if taken {
                self.held.locked().insert(shard, Fence::until(deadline));
            }
        }
        self.publish();
        Ok(())
    }

    /// Deletes the member Lease of a replica long gone (see [`STALE_MEMBER_LEASES`]), unless
    /// it was written since it was read; a failure is only said (the next round tries again).
    async fn delete_stale(&self, lease: &Lease) {
        let name = lease.metadata.name.clone().unwrap_or_default();
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: lease.metadata.uid.clone(),
            }),
            ..kube::api::DeleteParams::default()
        };
        match self.api.delete(&name, &params).await {
            Ok(_) => tracing::info!(
                lease = name,
                "deleted the member Lease of a replica long gone"
            ),
            Err(e) if conflict(&e) => {}
            Err(e) => tracing::warn!(lease = name, "could not delete a stale member Lease: {e}"),
        }
    }

    /// Drops `shard` after its Lease was lost: its fence closes now.
    fn lose(&self, shard: u32) {
        if let Some(fence) = self.held.locked().remove(&shard) {
            fence.close();
            tracing::warn!(identity = self.settings.identity, shard, "lost shard");
        }
        self.leaving.locked().remove(&shard);
        self.stopped.locked().remove(&shard);
    }

    fn labels(&self, role: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (SHARD_SET_LABEL.to_owned(), self.settings.prefix.clone()),
            (ROLE_LABEL.to_owned(), role.to_owned()),
        ])
    }

    fn fresh(&self, name: String, role: &str, now: Timestamp) -> Lease {
        let seconds = i32::try_from(self.settings.duration.as_secs().max(1)).unwrap_or(i32::MAX);
        Lease {
            metadata: ObjectMeta {
                name: Some(name),
                labels: Some(self.labels(role)),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.settings.identity.clone()),
                lease_duration_seconds: Some(seconds),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        }
    }

    async fn create_shard(&self, shard: u32, now: Timestamp) -> Result<bool, kube::Error> {
        let lease = self.fresh(self.settings.shard_lease(shard), "shard", now);
        match self.api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(e) if conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn renew_member(&self, now: Timestamp) -> Result<(), kube::Error> {
        let name = self.settings.member_lease();
        match self.api.get_opt(&name).await? {
            None => {
                let lease = self.fresh(name, "member", now);
                match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(()),
                    Err(e) if conflict(&e) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Some(lease) => self.write(lease, now, true).await.map(|_| ()),
        }
    }

    /// Renews `lease` as this replica's, or takes it (`take`: it is free or expired): a
    /// compare-and-swap on its resourceVersion. `false`: someone else wrote it first.
    async fn write(
        &self,
        mut lease: Lease,
        now: Timestamp,
        take: bool,
    ) -> Result<bool, kube::Error> {
        let seconds = i32::try_from(self.settings.duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if take && spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            spec.holder_identity = Some(self.settings.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.lease_duration_seconds = Some(seconds);
        spec.renew_time = Some(MicroTime(now));
        let name = lease.metadata.name.clone().unwrap_or_default();
        match self
            .api
            .replace(&name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if conflict(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives Lease `name` up if this replica holds it.
    async fn release(&self, name: &str) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        match self.api.replace(name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(e) if conflict(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn holder_of(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

/// The holder of `lease` if its last renewal still covers `now`.
fn live_holder(lease: &Lease, now: Timestamp, default: Duration) -> Option<String> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.clone()?;
    let MicroTime(renewed) = spec.renew_time.as_ref()?;
    let seconds = spec
        .lease_duration_seconds
        .map_or(default.as_secs() as i64, i64::from);
    let end = renewed
        .checked_add(SignedDuration::from_secs(seconds))
        .ok()?;
    (end >= now).then_some(holder)
}

#[cfg(test)]
mod lease_api;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_always_lands_in_the_same_shard_and_tenants_spread() {
        assert_eq!(shard_of("team-a", 32), shard_of("team-a", 32));
        // Stable across builds: the value is the SHA-256's, not a hasher's of the day.
        assert_eq!(shard_of("team-a", 1), 0);
        let mut counts = [0u32; 8];
        for i in 0..8000 {
            counts[shard_of(&format!("tenant-{i}"), 8) as usize] += 1;
        }
        for count in counts {
            assert!((800..=1200).contains(&count), "{counts:?}");
        }
    }

    #[test]
    fn lease_names_are_valid_names() {
        let settings = ShardSettings {
            namespace: "kubewasm-system".into(),
            prefix: "kubewasm".into(),
            shards: 32,
            identity: "Pod_1.example-0a1b2c3d-1".into(),
            duration: Duration::from_secs(15),
        };
        assert_eq!(settings.shard_lease(7), "kubewasm-shard-007");
        assert_eq!(
            settings.member_lease(),
            "kubewasm-member-pod-1-example-0a1b2c3d-1"
        );
    }
}
