//! Declarations: the WasmControllers and ClusterWasmControllers the watches bring, turned
//! into controllers to start, restart or remove.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

use crate::api::WasmControllerSpec;
use crate::host::{GuestState, Runner, StateOwner};

use super::life::Life;
use super::{ControllerId, Managed, Manager};

/// A declared controller as its object says.
#[derive(Clone)]
pub(super) struct Seen {
    pub(super) id: ControllerId,
    /// Its uid: the owner of its saved states' objects.
    pub(super) uid: Option<String>,
    pub(super) generation: Option<i64>,
    pub(super) spec: WasmControllerSpec,
    /// `status.guestState`, where runtimes before WasmControllerState kept the guest's saved
    /// state: moved into its WasmControllerState objects when the controller first starts.
    pub(super) guest_state: BTreeMap<String, String>,
}

pub(super) enum Declared {
    Upsert(Box<Seen>),
    Delete(ControllerId),
    Relisted(HashSet<ControllerId>, bool),
}

impl Manager {
    /// Applies what the watches saw, in order; the controllers to (re)start are started
    /// together, before any removal that follows them. Whether any was (re)started.
    pub(super) async fn on_declared(&mut self, mut events: Vec<Declared>) -> bool {
        // Every declaration is remembered; only those this replica runs go further.
        for event in &events {
            match event {
                Declared::Upsert(seen) => {
                    self.declared.insert(seen.id.clone(), (**seen).clone());
                }
                Declared::Delete(id) => {
                    self.declared.remove(id);
                }
                Declared::Relisted(seen, cluster) => self
                    .declared
                    .retain(|id, _| id.namespace.is_none() != *cluster || seen.contains(id)),
            }
        }
        events.retain(|event| match event {
            Declared::Upsert(seen) => self.runs_here(&seen.id),
            Declared::Delete(_) | Declared::Relisted(..) => true,
        });
        // Every controller these events stop (changed or deleted) is told to stop first; none
        // is waited for (see `stop_all`), and a deleted one's finalizers are released after
        // its runner has stopped.
        let mut releasing = HashMap::new();
        let stopping: Vec<ControllerId> = events
            .iter()
            .filter_map(|event| match event {
                Declared::Upsert(seen) => self.changed(seen).then(|| seen.id.clone()),
                Declared::Delete(id) => {
                    if let Some(runner) = self.finalizing_runner(id) {
                        releasing.insert(id.clone(), runner);
                    }
                    Some(id.clone())
                }
                Declared::Relisted(..) => None,
            })
            .collect();
        self.stop_all(&stopping, releasing);
        let mut any = false;
        let mut starting = Vec::new();
        for event in events {
            match event {
                Declared::Upsert(seen) => {
                    if let Some(id) = self.upsert(*seen).await {
                        starting.push(id);
                        any = true;
                    }
                }
                Declared::Delete(id) => {
                    self.start_all(&std::mem::take(&mut starting)).await;
                    self.remove(&id).await;
                }
                Declared::Relisted(seen, cluster) => {
                    self.start_all(&std::mem::take(&mut starting)).await;
                    self.relisted(&seen, cluster).await;
                }
            }
        }
        self.start_all(&starting).await;
        any
    }

    /// Whether a declaration is new or changed (its controller is then started anew).
    fn changed(&self, seen: &Seen) -> bool {
        self.controllers
            .get(&seen.id)
            .is_none_or(|m| m.generation != seen.generation || m.spec != seen.spec)
    }

    /// Takes a new or changed declaration; returns the controller to start, unless unchanged.
    pub(super) async fn upsert(&mut self, seen: Seen) -> Option<ControllerId> {
        let Seen {
            id,
            uid,
            generation,
            spec,
            guest_state,
        } = seen;
        let known = self.controllers.get(&id);
        if known.is_some_and(|m| m.generation == generation && m.spec == spec) {
            return None;
        }
        self.stop(&id).await; // already stopped by `on_declared`: returns at once
        let old = self.controllers.remove(&id);
        let life = Life::after(old.as_ref().map(|m| &m.life));
        // The state in memory is at least as new as what is stored (this process wrote it);
        // it is read from its objects only the first time ([`GuestState::load`], at setup).
        let state = match old {
            Some(m) => m.state,
            None => Arc::new(GuestState::new(
                StateOwner::of(
                    self.client.clone(),
                    id.namespace.as_deref(),
                    &id.name,
                    uid.as_deref(),
                    &self.config.runtime_namespace,
                ),
                self.config.max_state_bytes_per_controller,
                self.state_accounts.open(id.namespace.as_deref()),
                guest_state,
            )),
        };
        let managed = Managed {
            plan: Arc::new(crate::api::Plan::of(&spec, id.namespace.as_deref())),
            spec,
            state,
            generation,
            uid,
            promotion: None,
            life,
            written: None,
            since: std::time::Instant::now(),
        };
        self.controllers.insert(id.clone(), managed);
        Some(id)
    }

    /// A controller's declaration was deleted (its runner was told to stop by `on_declared`,
    /// which also releases its finalizers once it has).
    async fn remove(&mut self, id: &ControllerId) {
        self.stop(id).await; // already stopped by `on_declared`: returns at once
        self.forget(id);
    }

    /// Forgets a stopped controller whose declaration is gone, with its metrics' series and
    /// its log lines.
    fn forget(&mut self, id: &ControllerId) {
        self.controllers.remove(id);
        self.fetches.forget(&id.to_string());
        self.fetches.forget(&super::fetching::candidate_key(id));
        self.metrics.forget(&id.to_string());
        tracing::info!(controller = %id, "controller removed");
        self.config.logs.forget(&crate::logs::ControllerKey {
            namespace: id.namespace.clone(),
            name: id.name.clone(),
        });
    }

    /// After a (re)list of one kind (`cluster`: ClusterWasmControllers): the controllers of
    /// that kind it no longer has are removed.
    async fn relisted(&mut self, seen: &HashSet<ControllerId>, cluster: bool) {
        let gone: Vec<ControllerId> = self
            .controllers
            .keys()
            .filter(|id| id.namespace.is_none() == cluster && !seen.contains(id))
            .cloned()
            .collect();
        let releasing: HashMap<ControllerId, Arc<Runner>> = gone
            .iter()
            .filter_map(|id| Some((id.clone(), self.finalizing_runner(id)?)))
            .collect();
        self.stop_all(&gone, releasing);
        for id in gone {
            self.forget(&id);
        }
    }
}

#[cfg(test)]
mod tests;

pub(super) async fn watch_declared<K, F>(
    api: Api<K>,
    tx: tokio::sync::mpsc::Sender<Declared>,
    split: F,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
    F: Fn(K) -> Seen,
{
    let cluster = K::kind(&()) == "ClusterWasmController";
    let mut stream =
        std::pin::pin!(watcher(api, crate::controller::watch_config()).default_backoff());
    let mut seen = HashSet::new();
    while let Some(event) = stream.next().await {
        let msg = match event {
            Ok(watcher::Event::Apply(o)) => Declared::Upsert(Box::new(split(o))),
            Ok(watcher::Event::InitApply(o)) => {
                let declared = split(o);
                seen.insert(declared.id.clone());
                Declared::Upsert(Box::new(declared))
            }
            Ok(watcher::Event::Delete(o)) => Declared::Delete(split(o).id),
            Ok(watcher::Event::Init) => {
                seen.clear();
                continue;
            }
            Ok(watcher::Event::InitDone) => Declared::Relisted(std::mem::take(&mut seen), cluster),
            Err(err) => {
                let kind = K::kind(&());
                if err.to_string().contains("404") {
                    tracing::warn!(
                        kind = kind.as_ref(),
                        "the {kind} CustomResourceDefinition is not installed: `kubectl apply -f deploy/crds/kubewasm.dev.yaml`; retrying"
                    );
                } else {
                    tracing::warn!(
                        kind = kind.as_ref(),
                        "watch failed, retrying with backoff: {err}"
                    );
                }
                continue;
            }
        };
        if tx.send(msg).await.is_err() {
            return;
        }
    }
}
