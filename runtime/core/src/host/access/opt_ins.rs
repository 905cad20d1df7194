//! The ServiceAccounts that opted in to WasmControllers ([`SERVICE_ACCOUNT_OPT_IN`]), and the
//! Namespaces a cluster admin enabled ([`TENANT_LABEL`]), as watches of their metadata see
//! them: a controller's start then reads no ServiceAccount and no Namespace.
//!
//! Only a *yes* is taken from a watch, and only while it is up to date (its last list done,
//! no error since): anything else — an object not seen, not opted in, or a watch that is
//! listing again or failing (a runtime whose operator took away `list`/`watch`) — is asked of
//! the API server with a GET, as before. So a watch that lags can delay a controller, never
//! let it act as an account that did not opt in, nor in a namespace not enabled; a withdrawn
//! opt-in counts as soon as the watch delivers it.
//!
//! Memory: only the opted-in objects are kept, as `namespace/name` (`/name` for a Namespace;
//! a cluster's other ServiceAccounts — each namespace's `default`, every workload's — and
//! other Namespaces cost nothing once listed).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{
    Namespace as NamespaceObject, ServiceAccount as ServiceAccountObject,
};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube::{Api, Client};

use super::{SERVICE_ACCOUNT_OPT_IN, ServiceAccount, TENANT_LABEL, TENANT_LABEL_VALUE};
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

fn key_of<K>(meta: &PartialObjectMeta<K>) -> String {
    let m = &meta.metadata;
    format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default()
    )
}

impl Seen {
    fn on<K>(&mut self, event: watcher::Event<PartialObjectMeta<K>>, yes: Yes) {
        match event {
            watcher::Event::Init => {
                self.listing = Some(HashSet::new());
                if self.phase == Phase::Live {
                    self.phase = Phase::Stale;
                }
            }
            watcher::Event::InitApply(o) => {
                if yes(&o.metadata) {
                    self.listing.get_or_insert_default().insert(key_of(&o));
                }
            }
            watcher::Event::InitDone => {
                self.allowed = self.listing.take().unwrap_or_default();
                self.phase = Phase::Live;
            }
            watcher::Event::Apply(o) if yes(&o.metadata) => {
                self.allowed.insert(key_of(&o));
            }
            watcher::Event::Apply(o) | watcher::Event::Delete(o) => {
                self.allowed.remove(&key_of(&o));
            }
        }
    }

    fn failed(&mut self) {
        self.phase = Phase::Stale;
    }

    fn says_yes(&self, key: &str) -> bool {
        self.phase == Phase::Live && self.allowed.contains(key)
    }
}

/// Whether an object's metadata says yes.
type Yes = fn(&kube::api::ObjectMeta) -> bool;

/// A watch of opt-ins (see the module doc): of ServiceAccounts, or of Namespaces.
pub struct OptIns {
    seen: Arc<Mutex<Seen>>,
    /// Set once the first list is done or has failed.
    listed: tokio::sync::watch::Receiver<bool>,
}

impl OptIns {
    /// Watches the metadata of the ServiceAccounts of `namespace` (or all): listed whole from
    /// the API server's cache with `capped` (a [`crate::controller::capped_lists`] client),
    /// in pages with `client` past its cap.
    pub fn watch(client: Client, capped: Client, namespace: Option<&str>) -> OptIns {
        let api = |client: Client| -> Api<Meta> {
            match namespace {
                Some(ns) => Api::namespaced(client, ns),
                None => Api::all(client),
            }
        };
        Self::spawn(
            (api(capped), api(client)),
            crate::controller::watch_config(),
            "ServiceAccounts' opt-ins",
            opted_in,
        )
    }

    /// Watches the metadata of the Namespaces (only `namespace`, when given), as
    /// [`Self::watch`] does: which ones a cluster admin labelled [`TENANT_LABEL`].
    pub fn watch_namespaces(client: Client, capped: Client, namespace: Option<&str>) -> OptIns {
        let api = Api::<PartialObjectMeta<NamespaceObject>>::all;
        let mut config = crate::controller::watch_config();
        if let Some(ns) = namespace {
            config = config.fields(&format!("metadata.name={ns}"));
        }
        Self::spawn(
            (api(capped), api(client)),
            config,
            "Namespaces' tenant label",
            enabled,
        )
    }

    /// `apis`: the capped one, and the one for pages.
    fn spawn<K>(
        (capped, paged): (Api<PartialObjectMeta<K>>, Api<PartialObjectMeta<K>>),
        config: watcher::Config,
        what: &'static str,
        yes: Yes,
    ) -> OptIns
    where
        K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
        PartialObjectMeta<K>: serde::de::DeserializeOwned,
    {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (listed_tx, listed) = tokio::sync::watch::channel(false);
        let writer = seen.clone();
        tokio::spawn(async move {
            // Each list in one piece from the cache, not in pages from etcd: 20,000
            // ServiceAccounts were 200 pages read one after the other before any controller
            // could start.
            let events = crate::controller::cached_then_paged(capped, paged, config, what);
            let mut events = std::pin::pin!(events);
            let mut warned = false;
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        let done = matches!(event, watcher::Event::InitDone);
                        writer.locked().on(event, yes);
                        if done {
                            warned = false;
                            listed_tx.send_replace(true);
                        }
                    }
                    Err(err) => {
                        writer.locked().failed();
                        listed_tx.send_replace(true);
                        if warned {
                            tracing::debug!("the watch of {what} failed again: {err}");
                        } else {
                            tracing::warn!(
                                "the watch of {what} failed, retrying with backoff; until it lists again, each controller's start reads them one by one: {err}"
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
    /// not wait read their objects).
    pub async fn first_list(&self, within: Duration) {
        let mut listed = self.listed.clone();
        let _ = tokio::time::timeout(within, listed.wait_for(|done| *done)).await;
    }

    /// Whether the watch, up to date, says `account` opted in; `false` says nothing.
    pub fn opted_in(&self, account: &ServiceAccount) -> bool {
        self.seen
            .locked()
            .says_yes(&format!("{}/{}", account.namespace, account.name))
    }

    /// Whether the watch of Namespaces, up to date, says `namespace` is enabled; `false`
    /// says nothing.
    pub fn enabled(&self, namespace: &str) -> bool {
        self.seen.locked().says_yes(&format!("/{namespace}"))
    }
}

/// Whether these labels let the namespace use the runtime (a cluster admin set them).
pub(super) fn enabled(meta: &kube::api::ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(TENANT_LABEL))
        .is_some_and(|v| v == TENANT_LABEL_VALUE)
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

    fn account(namespace: &str, name: &str) -> String {
        format!("{namespace}/{name}")
    }

    impl Seen {
        fn on_sa(&mut self, event: watcher::Event<Meta>) {
            self.on(event, opted_in);
        }
    }

    #[test]
    fn only_a_yes_seen_by_a_watch_up_to_date_counts() {
        use watcher::Event::*;
        let mut seen = Seen::default();
        let (lender, keeper) = (account("a", "lender"), account("a", "keeper"));
        seen.on_sa(Init);
        seen.on_sa(InitApply(sa("a", "lender", Some("allowed"))));
        seen.on_sa(InitApply(sa("a", "keeper", Some("yes"))));
        seen.on_sa(InitApply(sa("a", "default", None)));
        assert!(!seen.says_yes(&lender), "not before the list is done");
        seen.on_sa(InitDone);
        assert!(seen.says_yes(&lender));
        assert!(!seen.says_yes(&keeper), "only `allowed` opts in");
        assert_eq!(seen.allowed.len(), 1, "only opted-in accounts are kept");
        assert!(!seen.says_yes(&account("b", "lender")), "namespaces apart");

        // Withdrawn, then deleted and made again.
        seen.on_sa(Apply(sa("a", "lender", None)));
        assert!(!seen.says_yes(&lender));
        seen.on_sa(Apply(sa("a", "lender", Some("allowed"))));
        assert!(seen.says_yes(&lender));
        seen.on_sa(Delete(sa("a", "lender", Some("allowed"))));
        assert!(!seen.says_yes(&lender));
        seen.on_sa(Apply(sa("a", "lender", Some("allowed"))));

        // A failed watch is not trusted until it has listed again; the new list replaces
        // what was seen (an opt-in withdrawn while the watch was down is gone).
        seen.failed();
        assert!(!seen.says_yes(&lender));
        seen.on_sa(Init);
        seen.on_sa(InitApply(sa("a", "keeper", Some("allowed"))));
        assert!(!seen.says_yes(&keeper));
        seen.on_sa(InitDone);
        assert!(seen.says_yes(&keeper));
        assert!(!seen.says_yes(&lender));
    }

    #[test]
    fn only_the_exact_tenant_label_enables_a_namespace() {
        use watcher::Event::*;
        let ns = |name: &str, label: Option<&str>| -> PartialObjectMeta<NamespaceObject> {
            let mut meta = serde_json::json!({
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": { "name": name, "labels": {"other": "x"} },
            });
            if let Some(value) = label {
                meta["metadata"]["labels"][TENANT_LABEL] = value.into();
            }
            serde_json::from_value(meta).unwrap()
        };
        let mut seen = Seen::default();
        seen.on::<NamespaceObject>(Init, enabled);
        seen.on(InitApply(ns("team-a", Some("enabled"))), enabled);
        seen.on(InitApply(ns("team-b", Some("true"))), enabled);
        seen.on(InitApply(ns("team-c", None)), enabled);
        seen.on::<NamespaceObject>(InitDone, enabled);
        assert!(seen.says_yes("/team-a"));
        assert!(!seen.says_yes("/team-b"), "only `enabled` enables");
        assert!(!seen.says_yes("/team-c"));
        // A ServiceAccount named like a namespace is another key.
        assert!(!seen.says_yes("team-a/team-a"));
        seen.on(Apply(ns("team-a", None)), enabled);
        assert!(!seen.says_yes("/team-a"), "the label removed");
    }
}
