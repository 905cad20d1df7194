//! Shards: which controllers this replica runs when replicas share the work
//! (`kubewasm run --leader-elect`, [`ShardHolder`]).
//!
//! Every replica watches every declaration and remembers it ([`Manager::declared`]), and
//! runs a controller only while it holds the shard of its tenant ([`shard_of`]`(`[`tenant_of`]`)`)
//! and is not giving that shard up. When the shards held change: the controllers of shards
//! lost or being given up stop at once (their fence is already shut, or left when given up, so
//! none of them acts again; a runner of a shard given up still writes the guest's saves left
//! behind as it stops, under the Lease it still holds); once the runners of a shard being given
//! up have stopped, the holder is told, and only then releases its Lease. The controllers of shards gained start, with the guest state
//! their status holds now (read again, not the watch's last word: the previous holder may have
//! written it a moment ago).

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt as _;
use kube::Api;

use crate::api::{ClusterWasmController, WasmController};
use crate::controller::{Fence, Held, ShardHolder, shard_of, tenant_of};

use super::status::Place;
use super::{ControllerId, Manager, PARALLEL_STARTS, lifecycle};

/// The shards this replica takes part in.
pub(super) struct Sharding {
    pub(super) holder: Arc<ShardHolder>,
    /// The shards held as last seen, with their fences.
    held: Held,
    /// The shards being given up as last seen.
    leaving: BTreeSet<u32>,
    /// Shards being given up whose runners are being waited for (the holder is told once
    /// they have stopped).
    acking: BTreeSet<u32>,
}

impl Sharding {
    pub(super) fn new(holder: Arc<ShardHolder>) -> Sharding {
        Sharding {
            holder,
            held: Held::new(),
            leaving: BTreeSet::new(),
            acking: BTreeSet::new(),
        }
    }

    /// The shard of a controller.
    pub(super) fn shard(&self, id: &ControllerId) -> u32 {
        shard_of(
            tenant_of(id.namespace.as_deref(), &id.name),
            self.holder.settings().shards,
        )
    }
}

/// A fence that never opens: for a controller of a shard not held.
fn shut() -> Fence {
    let fence = Fence::default();
    fence.close();
    fence
}

impl Manager {
    /// Whether this replica runs controller `id` now.
    pub(super) fn runs_here(&self, id: &ControllerId) -> bool {
        match &self.sharding {
            None => true,
            Some(s) => {
                let shard = s.shard(id);
                s.held.contains_key(&shard) && !s.leaving.contains(&shard)
            }
        }
    }

    /// The fence controller `id`'s writes pass: its shard's, or the process's.
    pub(super) fn fence_of(&self, id: &ControllerId) -> Fence {
        match &self.sharding {
            None => self.fence.clone(),
            Some(s) => s.held.get(&s.shard(id)).cloned().unwrap_or_else(shut),
        }
    }

    /// Where controller `id` runs, for its status.
    pub(super) fn place_of(&self, id: &ControllerId) -> Place {
        match &self.sharding {
            None => Place::default(),
            Some(s) => {
                let settings = s.holder.settings();
                Place {
                    replica: Some(settings.identity.clone()),
                    shard: Some(settings.shard_lease(s.shard(id))),
                }
            }
        }
    }

    /// Sets the per-shard metrics: controllers running in each shard held.
    pub(super) fn set_shard_metrics(&self) {
        let Some(s) = &self.sharding else { return };
        let settings = s.holder.settings();
        let mut running: std::collections::BTreeMap<String, usize> = s
            .held
            .keys()
            .map(|shard| (settings.shard_lease(*shard), 0))
            .collect();
        for (id, m) in &self.controllers {
            if m.life.running() {
                *running
                    .entry(settings.shard_lease(s.shard(id)))
                    .or_default() += 1;
            }
        }
        self.metrics.set_shards(&running);
    }

    /// The shards held or being given up changed: stops what is no longer this replica's,
    /// tells the holder once a shard's runners have stopped, and starts what it gained.
    pub(super) async fn on_shards(&mut self) {
        let Some(s) = self.sharding.as_mut() else {
            return;
        };
        s.held = s.holder.held();
        s.leaving = s.holder.leaving();
        s.acking.retain(|shard| s.leaving.contains(shard));
        let (held, leaving) = (s.held.len(), s.leaving.clone());
        tracing::info!(
            identity = s.holder.settings().identity,
            shards = ?s.held.keys().filter(|k| !s.leaving.contains(k)).collect::<Vec<_>>(),
            leaving = ?leaving,
            "holding {held} shards"
        );

        // Out: stopped at once, and forgotten here (another replica runs them next).
        let out: Vec<ControllerId> = self
            .controllers
            .keys()
            .filter(|id| !self.runs_here(id))
            .cloned()
            .collect();
        let mut stopping: std::collections::BTreeMap<u32, Vec<_>> = Default::default();
        for id in &out {
            let Some(mut m) = self.controllers.remove(id) else {
                continue;
            };
            self.metrics.forget(&id.to_string());
            let shard = self.sharding.as_ref().map_or(0, |s| s.shard(id));
            self.fetches.forget(&id.to_string());
            self.fetches.forget(&super::fetching::candidate_key(id));
            self.fetches.forget(&super::fetching::candidate_key(id));
            if let Some((runner, task)) = m.life.stop() {
                runner.stop();
                stopping.entry(shard).or_default().push((id.clone(), task));
            }
            tracing::info!(controller = %id, shard, "controller handed over: its shard is no longer this replica's");
        }
        self.watches.release_unused();
        if let Some(s) = self.sharding.as_mut() {
            for shard in leaving {
                if !s.acking.insert(shard) {
                    continue;
                }
                let runners = stopping.remove(&shard).unwrap_or_default();
                let holder = s.holder.clone();
                tokio::spawn(async move {
                    futures::future::join_all(
                        runners
                            .into_iter()
                            .map(|(id, task)| async move { lifecycle::finish(&id, task).await }),
                    )
                    .await;
                    holder.stopped(shard);
                });
            }
        }
        // Shards lost (not given up): their runners are aborted when they do not finish.
        for (_, runners) in stopping {
            for (id, task) in runners {
                tokio::spawn(async move { lifecycle::finish(&id, task).await });
            }
        }

        // In: the controllers of shards gained, with what an older runtime left in their
        // status read again (their saved states are read from their objects at setup).
        let gained: Vec<ControllerId> = self
            .declared
            .keys()
            .filter(|id| !self.controllers.contains_key(*id) && self.runs_here(id))
            .cloned()
            .collect();
        if gained.is_empty() {
            return;
        }
        self.reread_guest_states(&gained).await;
        let mut starting = Vec::new();
        for id in gained {
            if let Some(seen) = self.declared.get(&id).cloned()
                && let Some(id) = self.upsert(seen).await
            {
                starting.push(id);
            }
        }
        self.start_all(&starting).await;
    }

    /// Reads the guest state an older runtime left in these controllers' statuses again (to
    /// be moved into their WasmControllerState objects at setup), [`PARALLEL_STARTS`] at
    /// once; a controller whose read fails keeps what the watch said.
    async fn reread_guest_states(&mut self, ids: &[ControllerId]) {
        let client = self.client.clone();
        let read: Vec<_> = futures::stream::iter(ids.iter().cloned())
            .map(|id| {
                let client = client.clone();
                async move {
                    let status = match &id.namespace {
                        Some(ns) => Api::<WasmController>::namespaced(client, ns)
                            .get_opt(&id.name)
                            .await
                            .map(|o| o.and_then(|o| o.status)),
                        None => Api::<ClusterWasmController>::all(client)
                            .get_opt(&id.name)
                            .await
                            .map(|o| o.and_then(|o| o.status)),
                    };
                    (id, status)
                }
            })
            .buffer_unordered(PARALLEL_STARTS)
            .collect()
            .await;
        for (id, status) in read {
            match status {
                Ok(status) => {
                    if let Some(seen) = self.declared.get_mut(&id) {
                        seen.guest_state = status.map(|s| s.guest_state).unwrap_or_default();
                    }
                }
                Err(e) => {
                    tracing::warn!(controller = %id, "could not read the guest state again before taking the controller over (using the watch's): {e}")
                }
            }
        }
    }
}

/// Waits for the next change of the shards held (forever without shards, or once the holder
/// is gone).
pub(super) async fn shards_changed(
    changes: &mut Option<tokio::sync::watch::Receiver<(Vec<u32>, BTreeSet<u32>)>>,
) {
    if let Some(rx) = changes
        && rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}
