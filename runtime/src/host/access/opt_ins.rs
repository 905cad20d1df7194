//! The ServiceAccounts that opted in to WasmControllers ([`SERVICE_ACCOUNT_OPT_IN`]), as a
//! watch of their metadata sees them: a controller's start then reads no ServiceAccount.
//!
//! Only a *yes* is taken from the watch, and only while it is up to date (its last list done,
//! no error since): anything else — an account not seen, not opted in, or a watch that is
//! listing again or failing (a runtime whose operator took away `list`/`watch` on
//! ServiceAccounts) — is asked of the API server with a GET, as before. So a watch that lags
//! can delay a controller, never let it act as an account that did not opt in; an owner's
//! withdrawn opt-in counts as soon as the watch delivers it.
//!
//! Memory: only the opted-in accounts are kept, as `namespace/name` (a cluster's other
//! ServiceAccounts — each namespace's `default`, every workload's — cost nothing once listed).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ServiceAccount as ServiceAccountObject;
use kube::ResourceExt as _;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};

use super::{SERVICE_ACCOUNT_OPT_IN, ServiceAccount};
use crate::sync::Locks as _;

/// Where the watch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    /// Its first list is not done.
    #[default]
    Listing,
    /// Up to date: its last list is done, and no error since.
    Live,
    /// Failed, or listing again: what it holds may be stale.
    Stale,
}

/// The opted-in accounts the watch has seen, and where it is.
#[derive(Debug, Default)]
struct Seen {
    /// `namespace/name` of every account seen opted in.
    allowed: HashSet<String>,
    /// The list under way (from `Init` to `InitDone`), which replaces `allowed` when done.
    listing: Option<HashSet<String>>,
    phase: Phase,
}

type Meta = PartialObjectMeta<ServiceAccountObject>;

fn key_of(meta: &Meta) -> String {
    format!(
        "{}/{}",
        meta.namespace().unwrap_or_default(),
        meta.name_any()
    )
}

impl Seen {
    fn on(&mut self, event: watcher::Event<Meta>) {
        match event {
            watcher::Event::Init => {
                self.listing = Some(HashSet::new());
                if self.phase == Phase::Live {
                    self.phase = Phase::Stale;
                }
            }
            watcher::Event::InitApply(sa) => {
                if opted_in(&sa.metadata) {
                    self.listing.get_or_insert_default().insert(key_of(&sa));
                }
            }
            watcher::Event::InitDone => {
                self.allowed = self.listing.take().unwrap_or_default();
                self.phase = Phase::Live;
            }
            watcher::Event::Apply(sa) if opted_in(&sa.metadata) => {
                self.allowed.insert(key_of(&sa));
            }
            watcher::Event::Apply(sa) | watcher::Event::Delete(sa) => {
                self.allowed.remove(&key_of(&sa));
            }
        }
    }

    fn failed(&mut self) {
        self.phase = Phase::Stale;
    }

    fn says_yes(&self, account: &ServiceAccount) -> bool {
        self.phase == Phase::Live
            && self
                .allowed
                .contains(&format!("{}/{}", account.namespace, account.name))
    }
}

/// The watch of ServiceAccounts' opt-ins (see the module doc).
pub struct OptIns {
    seen: Arc<Mutex<Seen>>,
    /// Set once the first list is done or has failed.
    listed: tokio::sync::watch::Receiver<bool>,
}

impl OptIns {
    /// Watches the metadata of the ServiceAccounts of `namespace` (or all) with `client`.
    pub fn watch(client: Client, namespace: Option<&str>) -> OptIns {
        let api: Api<Meta> = match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (listed_tx, listed) = tokio::sync::watch::channel(false);
        let writer = seen.clone();
        tokio::spawn(async move {
            let events = watcher(api, crate::controller::watch_config()).default_backoff();
            let mut events = std::pin::pin!(events);
            let mut warned = false;
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        let done = matches!(event, watcher::Event::InitDone);
                        writer.locked().on(event);
                        if done {
                            warned = false;
                            listed_tx.send_replace(true);
                        }
                    }
                    Err(err) => {
                        writer.locked().failed();
                        listed_tx.send_replace(true);
                        if warned {
                            tracing::debug!("the watch of ServiceAccounts failed again: {err}");
                        } else {
                            tracing::warn!(
                                "the watch of ServiceAccounts' opt-ins failed, retrying with backoff; until it lists again, each controller's start reads its ServiceAccount: {err}"
                            );
                            warned = true;
                        }
                    }
                }
            }
        });
        OptIns { seen, listed }
    }

    /// Waits until the first list is done or has failed, at most `within` (starts that do
    /// not wait read their ServiceAccounts).
    pub async fn first_list(&self, within: Duration) {
        let mut listed = self.listed.clone();
        let _ = tokio::time::timeout(within, listed.wait_for(|done| *done)).await;
    }

    /// Whether the watch, up to date, says `account` opted in; `false` says nothing.
    pub fn opted_in(&self, account: &ServiceAccount) -> bool {
        self.seen.locked().says_yes(account)
    }
}

/// Whether these annotations let WasmControllers act as the account.
pub(super) fn opted_in(meta: &kube::api::ObjectMeta) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(SERVICE_ACCOUNT_OPT_IN))
        .is_some_and(|v| v == "allowed")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(namespace: &str, name: &str, opt_in: Option<&str>) -> Meta {
        let mut meta = serde_json::json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": { "name": name, "namespace": namespace, "annotations": {"other": "x"} },
        });
        if let Some(value) = opt_in {
            meta["metadata"]["annotations"][SERVICE_ACCOUNT_OPT_IN] = value.into();
        }
        serde_json::from_value(meta).unwrap()
    }

    fn account(namespace: &str, name: &str) -> ServiceAccount {
        ServiceAccount {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn only_a_yes_seen_by_a_watch_up_to_date_counts() {
        use watcher::Event::*;
        let mut seen = Seen::default();
        let (lender, keeper) = (account("a", "lender"), account("a", "keeper"));
        seen.on(Init);
        seen.on(InitApply(sa("a", "lender", Some("allowed"))));
        seen.on(InitApply(sa("a", "keeper", Some("yes"))));
        seen.on(InitApply(sa("a", "default", None)));
        assert!(!seen.says_yes(&lender), "not before the list is done");
        seen.on(InitDone);
        assert!(seen.says_yes(&lender));
        assert!(!seen.says_yes(&keeper), "only `allowed` opts in");
        assert_eq!(seen.allowed.len(), 1, "only opted-in accounts are kept");
        assert!(!seen.says_yes(&account("b", "lender")), "namespaces apart");

        // Withdrawn, then deleted and made again.
        seen.on(Apply(sa("a", "lender", None)));
        assert!(!seen.says_yes(&lender));
        seen.on(Apply(sa("a", "lender", Some("allowed"))));
        assert!(seen.says_yes(&lender));
        seen.on(Delete(sa("a", "lender", Some("allowed"))));
        assert!(!seen.says_yes(&lender));
        seen.on(Apply(sa("a", "lender", Some("allowed"))));

        // A failed watch is not trusted until it has listed again; the new list replaces
        // what was seen (an opt-in withdrawn while the watch was down is gone).
        seen.failed();
        assert!(!seen.says_yes(&lender));
        seen.on(Init);
        seen.on(InitApply(sa("a", "keeper", Some("allowed"))));
        assert!(!seen.says_yes(&keeper));
        seen.on(InitDone);
        assert!(seen.says_yes(&keeper));
        assert!(!seen.says_yes(&lender));
    }
}
