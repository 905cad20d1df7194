//! What each namespace holds in the shared caches, against the operator's caps.
//!
//! The caches are shared (one watch per kind), so without accounts one tenant's objects would
//! size the runtime: a namespace full of large ConfigMaps is held in memory for every tenant
//! that watches ConfigMaps. Every object a watch brings is weighed (`Cached::weight`: the
//! memory it takes cached, estimated) and charged to its namespace, whether it is stored
//! or not. A namespace over `--max-cached-bytes-per-namespace`, or the largest one
//! while everything stored is over `--max-cached-bytes`, is **held back**: every watch drops
//! its objects from the cache and stores none of them, so the memory is given back, and no
//! controller is handed any of them (a WasmController of that namespace says so in its
//! status). Its objects keep being weighed as they change, so once it is under
//! [`READMIT_PERCENT`] of the cap again it is let back in: each watch that dropped some of its
//! objects lists again (at most once per [`RELIST_FLOOR`]), and only when all of them have are
//! its objects handed out again — never a partial view, which a guest would take for deletions.
//!
//! Cluster-scoped objects are charged to no namespace and never held back (only an admin
//! creates them); they count towards the total.
//!
//! **The books balance by construction.** Each watch keeps its own book ([`WatchBook`]): the
//! weight of every object it was brought, and their sum per namespace. The ledger holds, per
//! namespace, only each watch's sum, keyed by the watch ([`WatchId`]), and a namespace's
//! account *is* the sum of them: a watch reports its new sum (it replaces the old one, it is
//! never added to it), a relist reweighs each object in place and credits, when it is done,
//! those it did not see again, a deletion credits its object, and a book dropped — the watch
//! stopped, its task aborted or ended — takes its watch's entries out of every account, once
//! (`Drop`). So no sequence of starts, stops and relists can leave bytes charged that no
//! running watch holds, and a namespace charged by one watch of a kind is never charged twice
//! for it. (The other way, a running total that each watch adds to and takes from, leaked
//! every stopped watch's objects: a tenant that started and stopped controllers of a kind
//! charged another namespace's objects of that kind again on every start.)

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::sync::Locks as _;
use tokio::sync::{broadcast, watch};

/// A held-back namespace is let back in once its bytes (and the total with it) are under this
/// percentage of the cap: a namespace at the cap does not flap in and out with every change.
pub const READMIT_PERCENT: u64 = 90;

/// A watch lists again to take a namespace back in at most this often: a tenant that grows
/// and shrinks around its cap costs each watch one list per period, not one per change.
pub const RELIST_FLOOR: Duration = Duration::from_secs(30);

/// The operator's caps on cached bytes (`u64::MAX`: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheCaps {
    /// The most bytes of one namespace's objects held in the caches.
    pub per_namespace: u64,
    /// The most bytes held in the caches in all.
    pub total: u64,
}

impl CacheCaps {
    /// No caps at all.
    pub const NONE: CacheCaps = CacheCaps {
        per_namespace: u64::MAX,
        total: u64::MAX,
    };
}

impl Default for CacheCaps {
    /// The operator's defaults (`--max-cached-bytes-per-namespace`, `--max-cached-bytes`).
    fn default() -> Self {
        CacheCaps {
            per_namespace: 64 << 20,
            total: 1 << 30,
        }
    }
}

impl Default for CacheAccounts {
    /// No caps.
    fn default() -> Self {
        CacheAccounts::new(CacheCaps::NONE)
    }
}

/// Why a namespace's objects are not handed to controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Withheld {
    /// The namespace holds more than the cap per namespace.
    OverNamespaceCap {
        /// Bytes of its objects.
        bytes: u64,
        /// `--max-cached-bytes-per-namespace`.
        cap: u64,
    },
    /// Everything cached is over the total cap, and this namespace held the most.
    OverTotalCap {
        /// Bytes of its objects.
        bytes: u64,
        /// `--max-cached-bytes`.
        cap: u64,
    },
    /// Under the caps again; the watches that dropped its objects are listing them again.
    Relisting,
}

impl fmt::Display for Withheld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Withheld::OverNamespaceCap { bytes, cap } => write!(
                f,
                "the namespace's objects of the kinds this runtime watches take {} in its caches, over the operator's cap of {} per namespace (--max-cached-bytes-per-namespace): none of them is handed to any controller until they take less than {}; delete or shrink objects of the watched kinds in this namespace, or ask the operator to raise the cap",
                mib(bytes),
                mib(cap),
                mib(readmit_at(cap)),
            ),
            Withheld::OverTotalCap { bytes, cap } => write!(
                f,
                "the runtime's caches are over the operator's total cap of {} (--max-cached-bytes) and this namespace holds the most of them ({}): none of its objects is handed to any controller until the caches are under {} with them; delete or shrink objects of the watched kinds in this namespace, or ask the operator to raise the cap",
                mib(cap),
                mib(bytes),
                mib(readmit_at(cap)),
            ),
            Withheld::Relisting => f.write_str(
                "the namespace is under the cache caps again; its objects are handed out once the runtime has listed them again (within a minute)",
            ),
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

fn readmit_at(cap: u64) -> u64 {
    cap.saturating_mul(READMIT_PERCENT) / 100
}

/// Which watch, for the accounts (a number given by [`CacheAccounts::register`]).
pub type WatchId = u64;

/// The bytes every namespace holds in the caches, and which namespaces are held back.
pub struct CacheAccounts {
    caps: CacheCaps,
    relist_floor: Duration,
    ledger: Mutex<Ledger>,
    /// Namespaces just held back: every watch drops their objects.
    held: broadcast::Sender<String>,
    /// Bumped when a namespace is let back in: watches that dropped its objects list again.
    readmitted: watch::Sender<u64>,
    next_watch: AtomicU64,
}

#[derive(Default)]
struct Ledger {
    namespaces: HashMap<String, Account>,
    /// Namespaces held back.
    held: BTreeSet<String>,
    /// Bytes of the objects stored: those of every namespace not held back, and the
    /// cluster-scoped ones.
    stored: u64,
    /// Bytes of cluster-scoped objects, by the watch that holds them.
    cluster: Shares,
}

/// Bytes by the watch that holds them; the sum is kept beside them and follows every change.
#[derive(Default)]
struct Shares {
    by_watch: HashMap<WatchId, u64>,
    sum: u64,
}

impl Shares {
    /// Watch `by` now holds `bytes` (0: nothing); the sum before and after.
    fn set(&mut self, by: WatchId, bytes: u64) -> (u64, u64) {
        let before = self.sum;
        if bytes == 0 {
            self.by_watch.remove(&by);
        } else {
            self.by_watch.insert(by, bytes);
        }
        self.sum = self.by_watch.values().fold(0, |a, b| a.saturating_add(*b));
        (before, self.sum)
    }
}

#[derive(Default)]
struct Account {
    /// Bytes of the namespace's objects, by the watch that holds them, and their sum.
    shares: Shares,
    /// Why held back, if it is.
    hold: Option<Hold>,
    /// Watches that dropped some of its objects and have not listed them again since.
    dropped_by: HashSet<WatchId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    Namespace,
    Total,
}

/// Whether a watch stores an object it was brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Store it.
    Store,
    /// Its namespace is held back: drop it (and any older version stored).
    Drop,
}

impl CacheAccounts {
    /// Accounts under `caps`.
    pub fn new(caps: CacheCaps) -> Self {
        CacheAccounts {
            caps,
            relist_floor: RELIST_FLOOR,
            ledger: Mutex::default(),
            held: broadcast::channel(256).0,
            readmitted: watch::channel(0).0,
            next_watch: AtomicU64::new(0),
        }
    }

    /// The same with another floor between two lists of a watch to take namespaces back in
    /// (tests: [`RELIST_FLOOR`] is for production).
    #[must_use]
    pub fn with_relist_floor(mut self, floor: Duration) -> Self {
        self.relist_floor = floor;
        self
    }

    pub fn caps(&self) -> CacheCaps {
        self.caps
    }

    /// The shortest time between two lists of a watch to take namespaces back in.
    pub fn relist_floor(&self) -> Duration {
        self.relist_floor
    }

    /// The book of a new watch (whose drop credits all it charged), and what the watch listens
    /// to: namespaces held back (drop their objects) and namespaces let back in (list again if
    /// [`CacheAccounts::wants_relist`]).
    pub fn register(
        self: &Arc<Self>,
    ) -> (WatchBook, broadcast::Receiver<String>, watch::Receiver<u64>) {
        let id = self.next_watch.fetch_add(1, Ordering::Relaxed);
        (
            WatchBook::new(self.clone(), id),
            self.held.subscribe(),
            self.readmitted.subscribe(),
        )
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.locked()
    }

    /// Watch `by` now holds `bytes` of `namespace`'s objects (`None`: cluster-scoped ones),
    /// replacing what it held before. Says whether `by` may store the object that changed
    /// it; when not, and `adds` (the object is there, not deleted), `by` is noted as having
    /// dropped some of the namespace's objects.
    fn set(&self, by: WatchId, namespace: Option<&str>, bytes: u64, adds: bool) -> Admit {
        let mut ledger = self.ledger();
        let Some(ns) = namespace else {
            let (before, after) = ledger.cluster.set(by, bytes);
            ledger.stored = ledger.stored.saturating_sub(before).saturating_add(after);
            drop(ledger);
            self.balance(None);
            return Admit::Store;
        };
        let account = ledger.namespaces.entry(ns.to_owned()).or_default();
        let (before, after) = account.shares.set(by, bytes);
        let held = account.hold.is_some();
        if !held {
            ledger.stored = ledger.stored.saturating_sub(before).saturating_add(after);
        }
        drop(ledger);
        self.balance(Some(ns));
        let mut ledger = self.ledger();
        let admit = match ledger.namespaces.get_mut(ns) {
            Some(a) if a.hold.is_some() => {
                if adds {
                    a.dropped_by.insert(by);
                }
                Admit::Drop
            }
            _ => Admit::Store,
        };
        ledger.forget_if_empty(ns);
        admit
    }

    /// Watch `by` stopped: everything it held is credited, and it has nothing to list again.
    fn release(&self, by: WatchId) {
        {
            let mut ledger = self.ledger();
            let (before, after) = ledger.cluster.set(by, 0);
            ledger.stored = ledger.stored.saturating_sub(before).saturating_add(after);
            let mut freed = 0u64;
            let mut touched = Vec::new();
            for (ns, a) in ledger.namespaces.iter_mut() {
                let had = a.shares.by_watch.contains_key(&by) || a.dropped_by.contains(&by);
                if !had {
                    continue;
                }
                let (before, after) = a.shares.set(by, 0);
                a.dropped_by.remove(&by);
                if a.hold.is_none() {
                    freed = freed.saturating_add(before.saturating_sub(after));
                }
                touched.push(ns.clone());
            }
            ledger.stored = ledger.stored.saturating_sub(freed);
            for ns in touched {
                ledger.forget_if_empty(&ns);
            }
        }
        self.balance(None);
    }

    /// Holds back what is over a cap and lets back in what is under again; `changed` is the
    /// namespace just charged.
    fn balance(&self, changed: Option<&str>) {
        let caps = self.caps;
        let mut newly_held = Vec::new();
        let mut readmitted = false;
        {
            let mut ledger = self.ledger();
            if let Some(ns) = changed
                && let Some(a) = ledger.namespaces.get(ns)
                && a.hold.is_none()
                && a.shares.sum > caps.per_namespace
            {
                ledger.hold(ns, Hold::Namespace);
                newly_held.push(ns.to_owned());
            }
            while ledger.stored > caps.total {
                // The largest namespace not held back yet; cluster-scoped objects never are.
                let Some(largest) = ledger
                    .namespaces
                    .iter()
                    .filter(|(_, a)| a.hold.is_none() && a.shares.sum > 0)
                    .max_by_key(|(_, a)| a.shares.sum)
                    .map(|(ns, _)| ns.clone())
                else {
                    break;
                };
                ledger.hold(&largest, Hold::Total);
                newly_held.push(largest);
            }
            let held: Vec<String> = ledger.held.iter().cloned().collect();
            for ns in held {
                let Some(a) = ledger.namespaces.get(&ns) else {
                    continue;
                };
                let fits = a.shares.sum <= readmit_at(caps.per_namespace)
                    && ledger.stored.saturating_add(a.shares.sum) <= readmit_at(caps.total);
                if fits && !newly_held.contains(&ns) {
                    ledger.readmit(&ns);
                    readmitted = true;
                }
            }
        }
        for ns in newly_held {
            tracing::warn!(
                namespace = ns.as_str(),
                "holding back the namespace's objects: {}",
                self.withheld(&ns)
                    .map(|w| w.to_string())
                    .unwrap_or_default()
            );
            let _ = self.held.send(ns);
        }
        if readmitted {
            self.readmitted.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Watch `by` dropped objects of `namespace` it had stored (the namespace was held back).
    pub fn dropped(&self, by: WatchId, namespace: &str) {
        if let Some(a) = self.ledger().namespaces.get_mut(namespace) {
            a.dropped_by.insert(by);
        }
    }

    /// Whether watch `by` dropped objects of a namespace that has been let back in since, and
    /// so must list again.
    pub fn wants_relist(&self, by: WatchId) -> bool {
        self.ledger()
            .namespaces
            .values()
            .any(|a| a.hold.is_none() && a.dropped_by.contains(&by))
    }

    /// Watch `by` has listed again: it now holds every object of every namespace not held
    /// back, except the ones in `dropped` (held back while it listed).
    pub fn relisted(&self, by: WatchId, dropped: &HashSet<String>) {
        let mut ledger = self.ledger();
        let mut empty = Vec::new();
        for (ns, a) in ledger.namespaces.iter_mut() {
            if a.hold.is_none() && !dropped.contains(ns) {
                a.dropped_by.remove(&by);
                if a.shares.sum == 0 && a.dropped_by.is_empty() {
                    empty.push(ns.clone());
                }
            }
        }
        for ns in empty {
            ledger.forget_if_empty(&ns);
        }
    }

    /// The namespaces held back now.
    pub fn held_namespaces(&self) -> Vec<String> {
        self.ledger().held.iter().cloned().collect()
    }

    /// Whether the namespace's objects are handed to controllers, and if not, why.
    pub fn withheld(&self, namespace: &str) -> Option<Withheld> {
        let ledger = self.ledger();
        let a = ledger.namespaces.get(namespace)?;
        match a.hold {
            Some(Hold::Namespace) => Some(Withheld::OverNamespaceCap {
                bytes: a.shares.sum,
                cap: self.caps.per_namespace,
            }),
            Some(Hold::Total) => Some(Withheld::OverTotalCap {
                bytes: a.shares.sum,
                cap: self.caps.total,
            }),
            None if !a.dropped_by.is_empty() => Some(Withheld::Relisting),
            None => None,
        }
    }

    /// Bytes stored in the caches now (objects of namespaces not held back, and
    /// cluster-scoped ones).
    pub fn stored_bytes(&self) -> u64 {
        self.ledger().stored
    }

    /// Bytes of one namespace's objects, stored or not.
    pub fn namespace_bytes(&self, namespace: &str) -> u64 {
        self.ledger()
            .namespaces
            .get(namespace)
            .map_or(0, |a| a.shares.sum)
    }

    /// Bytes of every namespace with objects in the caches (stored or not), for `/metrics`.
    pub fn namespaces(&self) -> Vec<(String, u64)> {
        self.ledger()
            .namespaces
            .iter()
            .filter(|(_, a)| a.shares.sum > 0)
            .map(|(ns, a)| (ns.clone(), a.shares.sum))
            .collect()
    }

    /// How many watches hold anything in the accounts (a stopped one holds nothing).
    pub fn watches_charged(&self) -> usize {
        let ledger = self.ledger();
        let mut ids: HashSet<WatchId> = ledger.cluster.by_watch.keys().copied().collect();
        for a in ledger.namespaces.values() {
            ids.extend(a.shares.by_watch.keys());
        }
        ids.len()
    }
}

impl Ledger {
    fn hold(&mut self, ns: &str, why: Hold) {
        if let Some(a) = self.namespaces.get_mut(ns)
            && a.hold.is_none()
        {
            a.hold = Some(why);
            self.stored = self.stored.saturating_sub(a.shares.sum);
            self.held.insert(ns.to_owned());
        }
    }

    fn readmit(&mut self, ns: &str) {
        if let Some(a) = self.namespaces.get_mut(ns)
            && a.hold.take().is_some()
        {
            self.stored = self.stored.saturating_add(a.shares.sum);
            self.held.remove(ns);
            tracing::info!(
                namespace = ns,
                bytes = a.shares.sum,
                "letting the namespace's objects back into the caches"
            );
        }
        self.forget_if_empty(ns);
    }

    /// Drops the account of a namespace with nothing cached and nothing pending.
    fn forget_if_empty(&mut self, ns: &str) {
        if self
            .namespaces
            .get(ns)
            .is_some_and(|a| a.shares.sum == 0 && a.hold.is_none() && a.dropped_by.is_empty())
        {
            self.namespaces.remove(ns);
        }
    }
}

/// What a JSON object (a map) costs in memory beyond its text, decoded: one B-tree node of
/// eleven key and value slots (`serde_json::Map`), at least.
const MAP_COST: u64 = 640;
/// What a string costs beyond its bytes: its header in the slot that holds it, and the
/// allocator's rounding.
const STRING_COST: u64 = 32;
/// What each further element of a map or an array costs: its slot.
const ELEMENT_COST: u64 = 32;

/// The weight of a value decoded: an estimate of the memory it takes as Rust values, from its
/// JSON — the text's length, plus the overhead of each map, string and element, which is most
/// of it for values of many small fields (a Pod decoded as a `serde_json::Value` takes about
/// six times its JSON). A cached object's metadata is weighed so (`Cached::weight`); the rest
/// of it is kept as text.
pub fn weigh(object: &impl serde::Serialize) -> u64 {
    /// Reads the JSON as it is written, counting bytes, maps, strings and separators
    /// outside strings.
    #[derive(Default)]
    struct Count {
        bytes: u64,
        maps: u64,
        strings: u64,
        elements: u64,
        in_string: bool,
        escaped: bool,
    }
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.bytes = self.bytes.saturating_add(buf.len() as u64);
            for &b in buf {
                if self.in_string {
                    match (self.escaped, b) {
                        (true, _) => self.escaped = false,
                        (false, b'\\') => self.escaped = true,
                        (false, b'"') => self.in_string = false,
                        _ => {}
                    }
                    continue;
                }
                match b {
                    b'"' => {
                        self.in_string = true;
                        self.strings += 1;
                    }
                    b'{' => self.maps += 1,
                    b',' => self.elements += 1,
                    _ => {}
                }
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count::default();
    // Serializing into a counter cannot fail for a value that was just deserialized.
    let _ = serde_json::to_writer(&mut count, object);
    count
        .bytes
        .saturating_add(count.maps.saturating_mul(MAP_COST))
        .saturating_add(count.strings.saturating_mul(STRING_COST))
        .saturating_add(count.elements.saturating_mul(ELEMENT_COST))
}

mod book;
pub use book::WatchBook;

#[cfg(test)]
mod tests;
