//! Where capsules are kept: a ring per running controller ([`Capsules`], owned by its runner)
//! charged to its namespace's account, and the index by controller through which a team
//! fetches them ([`CapsuleStore`]).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::api::ModuleSource;
use crate::host::{StateAccounts, StateBook};
use crate::sandbox::{Limits, WireRequest};
use crate::sync::Locks as _;

use super::{
    CAPSULE_KIND, CAPSULES_PER_CONTROLLER, Capsule, CapsuleError, CapsuleModule, CapsuleRequest,
    RecordedRead,
};

/// The default of `--max-capsule-bytes-per-namespace`: eight capsules at their largest.
pub const DEFAULT_MAX_CAPSULE_BYTES_PER_NAMESPACE: usize = 8 << 20;

/// One controller's capsules, newest last, each serialized with what makes it the same
/// failure as another (its object and its error).
type Ring = Mutex<VecDeque<(String, Arc<[u8]>)>>;

/// Every running controller's capsules, by controller (`namespace/name`, or `name`).
pub struct CapsuleStore {
    accounts: Arc<StateAccounts>,
    rings: Mutex<HashMap<String, Weak<Ring>>>,
    dropped: AtomicU64,
}

impl CapsuleStore {
    /// A store charging each namespace at most `cap_per_namespace` bytes.
    pub fn new(cap_per_namespace: usize) -> Arc<CapsuleStore> {
        Arc::new(CapsuleStore {
            accounts: StateAccounts::new(cap_per_namespace),
            rings: Mutex::default(),
            dropped: AtomicU64::new(0),
        })
    }

    /// The capsules of a controller starting now (its earlier ones, if any, are dropped with
    /// its earlier runner).
    pub fn open(
        self: &Arc<Self>,
        id: &str,
        namespace: Option<&str>,
        source: ModuleSource,
        limits: Limits,
    ) -> Capsules {
        let ring: Arc<Ring> = Arc::default();
        let mut rings = self.rings.locked();
        rings.retain(|_, ring| ring.strong_count() > 0);
        rings.insert(id.to_owned(), Arc::downgrade(&ring));
        Capsules {
            store: Arc::clone(self),
            id: id.to_owned(),
            ring,
            book: self.accounts.open(namespace),
            source,
            limits,
            images: Mutex::default(),
        }
    }

    /// The capsules of controller `id`, oldest first, each a JSON document (none when it does
    /// not run here).
    pub fn of(&self, id: &str) -> Vec<Arc<[u8]>> {
        let ring = self.rings.locked().get(id).and_then(Weak::upgrade);
        ring.map(|r| r.locked().iter().map(|(_, c)| c.clone()).collect())
            .unwrap_or_default()
    }

    /// Bytes the capsules of `namespace` take (`None`: the ClusterWasmControllers).
    pub fn used(&self, namespace: Option<&str>) -> usize {
        self.accounts.used(namespace)
    }

    /// Bytes every capsule takes.
    pub fn total(&self) -> usize {
        self.accounts.total()
    }

    /// Capsules not kept for want of room in their namespace's account.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// One running controller's capsules; dropped with its runner, crediting what it was charged.
pub struct Capsules {
    store: Arc<CapsuleStore>,
    id: String,
    ring: Arc<Ring>,
    book: StateBook,
    source: ModuleSource,
    limits: Limits,
    /// The images the controller's latest modules were pulled as (`registry/repo@sha256:…`,
    /// the manifest's digest), by module digest: a capsule names the one it ran, so that a
    /// replay pulls that manifest whatever its tag points at since.
    images: Mutex<VecDeque<(String, String)>>,
}

/// How many modules' images a controller remembers: the one running and the one before it
/// (a reconcile that began before a swap ends after it).
const IMAGES_REMEMBERED: usize = 2;

impl Capsules {
    /// Says that the module of `digest` (`sha256:…`) was pulled as `image`.
    pub fn pulled_as(&self, digest: String, image: String) {
        let mut images = self.images.locked();
        images.retain(|(d, _)| *d != digest);
        if images.len() == IMAGES_REMEMBERED {
            images.pop_front();
        }
        images.push_back((digest, image));
    }

    /// Keeps a capsule of a failed reconcile of `object`: the request it was handed (`None`:
    /// failed before the call), its reads and whether they are all there, the module's digest
    /// and the failure. The same failure of the same object again replaces its capsule.
    pub fn record(
        &self,
        object: &str,
        request: Option<&WireRequest>,
        (reads, all_reads): (Vec<RecordedRead>, bool),
        digest: String,
        error: CapsuleError,
    ) {
        let complete = request.is_some() && all_reads;
        let incomplete = match (request.is_some(), all_reads) {
            (false, _) => Some("the reconcile failed before the guest was called".to_owned()),
            (true, false) => Some(
                "the guest read more objects than a capsule keeps: its reads are cut short"
                    .to_owned(),
            ),
            (true, true) => None,
        };
        let capsule = Capsule {
            api_version: "kubewasm.dev/v1alpha1".to_owned(),
            kind: CAPSULE_KIND.to_owned(),
            controller: self.id.clone(),
            object: object.to_owned(),
            failed_at: k8s_openapi::jiff::Timestamp::now().to_string(),
            module: CapsuleModule {
                image: (self.images.locked().iter())
                    .find(|(d, _)| *d == digest)
                    .map(|(_, image)| image.clone()),
                digest,
                source: self.source.clone(),
            },
            limits: self.limits.into(),
            error,
            request: request.map(CapsuleRequest::from),
            reads,
            complete,
            incomplete,
        };
        // A failure that repeats (a retried object) keeps its latest capsule only: the ring
        // is for different failures.
        let same = format!(
            "{object}\n{}\n{}",
            capsule.error.reason, capsule.error.message
        );
        let bytes: Arc<[u8]> = capsule.into_bounded_json().into();
        let mut ring = self.ring.locked();
        ring.retain(|(key, _)| *key != same);
        ring.push_back((same, bytes));
        while ring.len() > CAPSULES_PER_CONTROLLER {
            ring.pop_front();
        }
        // Within the namespace's account: this controller's oldest go first; none of its own
        // left and still too much, the new one is not kept either.
        loop {
            let held: usize = ring.iter().map(|(_, c)| c.len()).sum();
            if self.book.grow(held).is_ok() {
                break;
            }
            ring.pop_front();
            self.store.dropped.fetch_add(1, Ordering::Relaxed);
            if ring.is_empty() {
                self.book.set(0);
                break;
            }
        }
    }
}
