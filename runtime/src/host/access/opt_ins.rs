//! The ServiceAccounts that opted in to WasmControllers ([`SERVICE_ACCOUNT_OPT_IN`]), as a
//! watch of their metadata sees them: a controller's start then reads no ServiceAccount.
//!
//! Only a *yes* is taken from the watch, and only while it is up to date (its last list done,
//! no error since): anything else — an account not seen, not opted in, or a watch that is
//! listing again or failing (a runtime whose operator took away `list`/`watch` on
//! ServiceAccounts) — is asked of the API server with a GET, as before. So a watch that lags
//! can delay a controller never, and refuse it never; an owner's withdrawn opt-in is seen as
//! soon as the watch delivers it (before the TTL of the answer, as with a GET).

use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ServiceAccount as ServiceAccountObject;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};

use super::{SERVICE_ACCOUNT_OPT_IN, ServiceAccount};

/// Where the watch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Its first list is not done.
    Listing,
    /// Up to date: its last list is done, and no error since.
    Live,
    /// Failed, or listing again: its store may be stale.
    Stale,
}

/// The watch of ServiceAccounts' opt-ins (see the module doc).
pub struct OptIns {
    store: reflector::Store<PartialObjectMeta<ServiceAccountObject>>,
    phase: tokio::sync::watch::Receiver<Phase>,
}

impl OptIns {
    /// Watches the metadata of the ServiceAccounts of `namespace` (or all) with `client`,
    /// keeping of each its name, its namespace and its opt-in alone.
    pub fn watch(client: Client, namespace: Option<&str>) -> OptIns {
        let api: Api<PartialObjectMeta<ServiceAccountObject>> = match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let (store, writer) = reflector::store();
        let (phase_tx, phase) = tokio::sync::watch::channel(Phase::Listing);
        tokio::spawn(async move {
            let events = watcher(api, crate::controller::watch_config())
                .default_backoff()
                .modify(keep_opt_in)
                .reflect(writer);
            let mut events = std::pin::pin!(events);
            let mut warned = false;
            while let Some(event) = events.next().await {
                let now = match event {
                    Ok(watcher::Event::InitDone) => Phase::Live,
                    Ok(watcher::Event::Init) => Phase::Stale,
                    Ok(_) => continue,
                    Err(err) => {
                        if warned {
                            tracing::debug!("the ServiceAccount watch failed again: {err}");
                        } else {
                            tracing::warn!(
                                "the watch of ServiceAccounts' opt-ins failed, retrying with backoff; until it lists, each controller's start reads its ServiceAccount: {err}"
                            );
                            warned = true;
                        }
                        Phase::Stale
                    }
                };
                if now == Phase::Live {
                    warned = false;
                }
                phase_tx.send_replace(now);
            }
        });
        OptIns { store, phase }
    }

    /// Waits until the first list is done or has failed, at most `within`: a start that
    /// waits that long reads ServiceAccounts instead.
    pub async fn first_list(&self, within: Duration) {
        let mut phase = self.phase.clone();
        let _ = tokio::time::timeout(within, phase.wait_for(|p| *p != Phase::Listing)).await;
    }

    /// Whether the watch, up to date, says `account` opted in; `false` says nothing.
    pub fn opted_in(&self, account: &ServiceAccount) -> bool {
        if *self.phase.borrow() != Phase::Live {
            return false;
        }
        let key = ObjectRef::new(&account.name).within(&account.namespace);
        self.store
            .get(&key)
            .is_some_and(|sa| opted_in(&sa.metadata))
    }
}

/// Whether these annotations let WasmControllers act as the account.
pub(super) fn opted_in(meta: &kube::api::ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(SERVICE_ACCOUNT_OPT_IN))
        .is_some_and(|v| v == "allowed")
}

/// Keeps of a ServiceAccount's metadata its name, namespace and opt-in: not its other
/// annotations (up to 256 KiB each, their owners' to size), labels or managed fields.
fn keep_opt_in(meta: &mut PartialObjectMeta<ServiceAccountObject>) {
    let kept = std::mem::take(&mut meta.metadata);
    let allowed = opted_in(&kept);
    meta.metadata = kube::api::ObjectMeta {
        name: kept.name,
        namespace: kept.namespace,
        annotations: allowed.then(|| {
            [(SERVICE_ACCOUNT_OPT_IN.to_owned(), "allowed".to_owned())]
                .into_iter()
                .collect()
        }),
        ..Default::default()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_name_namespace_and_opt_in_are_kept() {
        let mut meta: PartialObjectMeta<ServiceAccountObject> =
            serde_json::from_value(serde_json::json!({
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": {
                    "name": "lender", "namespace": "team-a", "uid": "u", "resourceVersion": "7",
                    "labels": {"a": "b"},
                    "annotations": {SERVICE_ACCOUNT_OPT_IN: "allowed", "big": "x".repeat(1000)},
                }
            }))
            .unwrap();
        keep_opt_in(&mut meta);
        assert_eq!(
            serde_json::to_value(&meta.metadata).unwrap(),
            serde_json::json!({"name": "lender", "namespace": "team-a",
                "annotations": {SERVICE_ACCOUNT_OPT_IN: "allowed"}})
        );
        let mut other = meta.clone();
        other.metadata.annotations = Some(
            [(SERVICE_ACCOUNT_OPT_IN.to_owned(), "yes".to_owned())]
                .into_iter()
                .collect(),
        );
        keep_opt_in(&mut other);
        assert!(other.metadata.annotations.is_none());
        assert!(!opted_in(&other.metadata));
    }
}
