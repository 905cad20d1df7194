//! Shared watches: one watch and one cache per kind, for every controller that needs it.
//!
//! A hundred controllers of ConfigMaps cost one ConfigMap watch. Each watch relists on
//! disconnects and `410 Gone` (kube-runtime's watcher with backoff) and, after every
//! (re)list, announces every object it had or has, so subscribers catch up on whatever
//! happened while the connection was down.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use tokio::sync::broadcast;

use super::accounts::{CacheAccounts, Withheld};
use super::discovery::Kind;
use crate::sync::Locks as _;

mod cached;
mod capped;
mod task;
pub use cached::Cached;
pub use capped::{cached_then_paged, capped_lists, over_cap};
use task::WatchTask;

/// Namespace and name of an object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Namespace, `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectKey {
    /// The key of an object.
    pub fn of(object: &Cached) -> ObjectKey {
        object.key()
    }

    /// The key [`ObjectKey`]'s `Display` wrote: `namespace/name`, or `name` (names and
    /// namespaces have no `/`).
    pub fn parse(text: &str) -> ObjectKey {
        match text.split_once('/') {
            Some((ns, name)) => ObjectKey {
                namespace: Some(ns.to_owned()),
                name: name.to_owned(),
            },
            None => ObjectKey {
                namespace: None,
                name: text.to_owned(),
            },
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Something about an object may have changed.
#[derive(Debug, Clone)]
pub struct Change {
    /// Which object.
    pub key: ObjectKey,
    /// Its owners as last seen (to find the parent of a child).
    pub owners: Vec<OwnerReference>,
}

/// One running watch of one kind, with its cache. Dropping the last handle stops it.
pub struct Watch {
    kind: Kind,
    store: Store<Cached>,
    changes: broadcast::Sender<Arc<Change>>,
    owned: Arc<Mutex<OwnerIndex>>,
    task: tokio::task::AbortHandle,
    /// Set once the first list filled the cache (see [`Watch::ready`]).
    listed: tokio::sync::OnceCell<()>,
    /// What each namespace holds in the caches.
    accounts: Arc<CacheAccounts>,
}

/// Stops the watch's task; the task's [`WatchBook`](crate::controller::WatchBook) goes with it
/// and credits everything the watch charged.
impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
        let r = &self.kind.resource;
        tracing::info!(kind = %r.kind, api_version = %r.api_version, "stopped shared watch: no controller needs it");
    }
}

/// Which cached objects each owner (by uid) has, so finding a parent's children does not
/// scan the whole cache. Updated before a change is announced; a reconcile that races an
/// update sees the state of a moment ago and the announced change reconciles again.
#[derive(Default)]
struct OwnerIndex {
    by_owner: HashMap<String, HashSet<ObjectKey>>,
    by_object: HashMap<ObjectKey, Vec<String>>,
}

impl OwnerIndex {
    fn set(&mut self, key: ObjectKey, owners: Vec<String>) {
        self.remove(&key);
        for uid in &owners {
            self.by_owner
                .entry(uid.clone())
                .or_default()
                .insert(key.clone());
        }
        if !owners.is_empty() {
            self.by_object.insert(key, owners);
        }
    }

    fn remove(&mut self, key: &ObjectKey) {
        for uid in self.by_object.remove(key).unwrap_or_default() {
            if let Some(keys) = self.by_owner.get_mut(&uid) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_owner.remove(&uid);
                }
            }
        }
    }
}

fn owner_uids(object: &Cached) -> Vec<String> {
    object
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| o.uid.clone())
        .collect()
}

impl Watch {
    /// The cache. Empty until [`Watch::ready`].
    pub fn store(&self) -> &Store<Cached> {
        &self.store
    }

    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// Cached objects that list `owner_uid` among their ownerReferences.
    pub fn owned_by(&self, owner_uid: &str) -> Vec<Arc<Cached>> {
        let keys: Vec<ObjectKey> = {
            let index = self.owned.locked();
            index
                .by_owner
                .get(owner_uid)
                .map(|k| k.iter().cloned().collect())
                .unwrap_or_default()
        };
        keys.iter().filter_map(|key| self.get(key)).collect()
    }

    /// One cached object. A key whose scope is not the kind's (a namespace on a key of a
    /// cluster-scoped kind, none on a namespaced one) finds nothing: keys come from what
    /// tenants write, and `team-a/kube-system` must not find Namespace `kube-system`.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<Cached>> {
        self.store.get(&object_ref(&self.kind, key)?)
    }

    /// Whether the objects of `namespace` are held back from controllers (see
    /// [`CacheAccounts`]), and why.
    pub fn withheld(&self, namespace: &str) -> Option<Withheld> {
        self.accounts.withheld(namespace)
    }

    /// Changes from now on. A receiver that lags must treat everything as changed.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// Whether a waiter saw the first list fill the cache ([`Watch::ready`]).
    pub fn listed(&self) -> bool {
        self.listed.initialized()
    }

    /// Waits until the first list has filled the cache.
    ///
    /// One waiter at a time polls the store: kube-runtime's `Store::wait_until_ready` wakes
    /// only the waiter that polled it last, so controllers started together on a new watch
    /// would otherwise wait for ever. The others wait on the `OnceCell`, which wakes them all
    /// (and hands the polling to another waiter if the one polling is dropped).
    pub async fn ready(&self) {
        self.listed
            .get_or_init(|| async {
                // The writer lives as long as the watch task, which lives as long as the process.
                let _ = self.store.wait_until_ready().await;
            })
            .await;
    }
}

#[cfg(test)]
impl Watch {
    /// A watch of `kind` whose cache holds `objects`, listed, with no API server behind it: a
    /// unit test's cache (the reconcile pipeline's tests hand the guest what it holds).
    pub(crate) fn holding(kind: Kind, objects: Vec<Cached>) -> Arc<Watch> {
        let mut writer = reflector::store::Writer::<Cached>::new(kind.resource.clone());
        let owned: Arc<Mutex<OwnerIndex>> = Arc::default();
        for object in objects {
            owned
                .locked()
                .set(ObjectKey::of(&object), owner_uids(&object));
            writer.apply_watcher_event(&watcher::Event::Apply(object));
        }
        let store = writer.as_reader();
        let listed = tokio::sync::OnceCell::new();
        let _ = listed.set(());
        // The writer lives as long as the watch, as the watch task's does.
        let task = tokio::spawn(async move {
            let _writer = writer;
            std::future::pending::<()>().await;
        });
        Arc::new(Watch {
            kind,
            store,
            changes: broadcast::channel(16).0,
            owned,
            task: task.abort_handle(),
            listed,
            accounts: Arc::new(CacheAccounts::new(Default::default())),
        })
    }
}

/// Where a key is in a cache of `kind`, if it is a key of that kind's scope.
fn object_ref(kind: &Kind, key: &ObjectKey) -> Option<reflector::ObjectRef<Cached>> {
    let r = reflector::ObjectRef::new_with(&key.name, kind.resource.clone());
    match (&key.namespace, kind.namespaced) {
        (Some(ns), true) => Some(r.within(ns)),
        (None, false) => Some(r),
        _ => None,
    }
}

/// Watches by (apiVersion, kind). Users hold the watches; this map only finds them, so a
/// watch nobody needs any more stops.
type WatchMap = HashMap<(String, String), Weak<Watch>>;

/// All watches of the process, by kind.
///
/// One cluster-wide watch per kind, shared by every controller of every namespace that needs
/// it: a watch per namespace would multiply connections and relists by the number of
/// tenants. A runtime started for one namespace (`kubewasm run --namespace`) watches only
/// that namespace, so it needs no cluster-wide read rights.
#[derive(Clone)]
pub struct SharedWatches {
    client: Client,
    namespace: Option<String>,
    watches: Arc<Mutex<WatchMap>>,
    accounts: Arc<CacheAccounts>,
}

impl SharedWatches {
    /// No watches yet; they start on first use, in `namespace` only if given, and store
    /// what `accounts` admit.
    pub fn new(client: Client, namespace: Option<String>, accounts: Arc<CacheAccounts>) -> Self {
        SharedWatches {
            client,
            namespace,
            watches: Arc::default(),
            accounts,
        }
    }

    /// What each namespace holds in the caches.
    pub fn accounts(&self) -> &Arc<CacheAccounts> {
        &self.accounts
    }

    /// The watch of a kind, started on first request and shared while anyone holds it.
    pub fn watch(&self, kind: &Kind) -> Arc<Watch> {
        let key = (
            kind.resource.api_version.clone(),
            kind.resource.kind.clone(),
        );
        let mut watches = self.watches.locked();
        if let Some(w) = watches.get(&key).and_then(Weak::upgrade) {
            return w;
        }
        let watch = start(
            self.client.clone(),
            kind.clone(),
            self.namespace.as_deref(),
            self.accounts.clone(),
        );
        watches.insert(key, Arc::downgrade(&watch));
        watch
    }

    /// Forgets watches nobody holds any more (each stopped when its last holder let go).
    pub fn release_unused(&self) {
        let mut watches = self.watches.locked();
        watches.retain(|_, w| w.strong_count() > 0);
    }

    /// How many watches run (one per kind).
    pub fn len(&self) -> usize {
        self.watches
            .locked()
            .values()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    /// Whether no watch runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn start(
    client: Client,
    kind: Kind,
    namespace: Option<&str>,
    accounts: Arc<CacheAccounts>,
) -> Arc<Watch> {
    let writer = reflector::store::Writer::<Cached>::new(kind.resource.clone());
    let store = writer.as_reader();
    let (book, held, readmitted) = accounts.register();
    let (changes, _) = broadcast::channel(4096);
    let owned: Arc<Mutex<OwnerIndex>> = Arc::default();
    let api = kind.api_of::<Cached>(client, namespace);
    let what = format!("{} ({})", kind.resource.kind, kind.resource.api_version);
    let task = WatchTask {
        what,
        api,
        resource: kind.resource.clone(),
        writer,
        store: store.clone(),
        changes: changes.clone(),
        index: owned.clone(),
        accounts: accounts.clone(),
        book,
    };
    let task = tokio::spawn(task.run(held, readmitted));
    Arc::new(Watch {
        kind,
        store,
        changes,
        owned,
        task: task.abort_handle(),
        listed: tokio::sync::OnceCell::new(),
        accounts,
    })
}

/// Most objects one page of a (re)list brings: what is decoded at once. A page is charged
/// object by object before the next is asked for, so a namespace over its cap is dropped as
/// its objects come, and a tenant naming `parent: Pod` costs the runtime a page of Pods at a
/// time, not every Pod of the cluster at once. At 100, a page of objects at etcd's limit
/// (1.5 MiB each) is 150 MiB; of typical Pods (5 KB), half a MiB.
pub const LIST_PAGE_SIZE: u32 = 100;

/// How every watch of the runtime lists: in pages of [`LIST_PAGE_SIZE`], a consistent read
/// (kube-runtime's `MostRecent`). Not from the API server's watch cache (`resourceVersion=0`,
/// what client-go's informers do): the watch cache ignores `limit` (it does in the 1.20 API
/// server of the tests, and in releases long after) and answers with every object at once,
/// which the runtime would read and decode whole before weighing any of it. Pages cost etcd reads instead (the metadata of 1,772
/// ConfigMaps took 1.37 s in four pages of 500 from etcd, `make bench-density`); the runtime
/// lists once per watch start and relist, not per controller. (The runtime's watch of the
/// ConfigMaps' metadata is the exception: see [`cached_then_paged`].)
pub fn watch_config() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            namespace: Some("ns".into()),
            name: name.into(),
        }
    }

    #[test]
    fn a_key_parses_back_from_its_display() {
        for k in [
            key("a"),
            ObjectKey {
                namespace: None,
                name: "cluster-wide".into(),
            },
        ] {
            assert_eq!(ObjectKey::parse(&k.to_string()), k);
        }
    }

    #[test]
    fn a_key_finds_an_object_only_in_its_kinds_scope() {
        let kind = |namespaced| Kind {
            resource: kube::api::ApiResource {
                group: String::new(),
                version: "v1".into(),
                api_version: "v1".into(),
                kind: "Namespace".into(),
                plural: "namespaces".into(),
            },
            namespaced,
            has_status: true,
        };
        let forged = key("kube-system");
        let plain = ObjectKey {
            namespace: None,
            name: "kube-system".into(),
        };
        // Cluster-scoped: `ns/kube-system` is no key of Namespace `kube-system`.
        assert!(object_ref(&kind(false), &forged).is_none());
        assert_eq!(
            object_ref(&kind(false), &plain).map(|r| r.namespace),
            Some(None)
        );
        // Namespaced: a key needs its namespace.
        assert!(object_ref(&kind(true), &plain).is_none());
        assert_eq!(
            object_ref(&kind(true), &forged).and_then(|r| r.namespace),
            Some("ns".to_owned())
        );
    }

    #[test]
    fn owner_index_follows_changed_and_removed_owners() {
        let mut index = OwnerIndex::default();
        index.set(key("a"), vec!["p1".into()]);
        index.set(key("b"), vec!["p1".into(), "p2".into()]);
        assert_eq!(index.by_owner["p1"], HashSet::from([key("a"), key("b")]));
        index.set(key("a"), vec!["p2".into()]); // re-owned
        assert_eq!(index.by_owner["p1"], HashSet::from([key("b")]));
        assert_eq!(index.by_owner["p2"], HashSet::from([key("a"), key("b")]));
        index.remove(&key("b"));
        index.set(key("a"), vec![]); // owner reference dropped
        assert!(index.by_owner.is_empty() && index.by_object.is_empty());
    }
}
