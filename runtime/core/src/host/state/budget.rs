//! What each namespace's controllers' saved states take, against the operator's cap
//! (`--max-state-bytes-per-namespace`).
//!
//! The quota per controller bounds one controller; without a cap per namespace, a namespace
//! running `--max-controllers-per-namespace` controllers (64) could keep 64 times that (512 MiB
//! at the defaults) in etcd, and in this replica's memory. The tenants are those of the
//! compile budget: a namespace, whose WasmControllers all run on the replica that holds its
//! shard (the shards are cut by namespace), and the ClusterWasmControllers together (`None`:
//! their states are all kept in the runtime's namespace, and no namespace can be named like
//! them). A replica accounts only the controllers it runs: a namespace's are all on one
//! replica, the ClusterWasmControllers are spread over the replicas by name, so theirs are
//! bounded per replica.
//!
//! **The books balance by construction**, as the cache accounts' do: each controller's states
//! hold a [`StateBook`], and the ledger holds, per tenant, only each book's last sum — what the
//! controller's states take at worst, its saves being written included. A book reports a new
//! sum in place of the old one, never adds to it, and dropping it (the controller deleted, or
//! handed over to another replica, once its last save is answered) takes its sum out, once. So
//! no sequence of starts, stops, reloads and hand-overs can leave bytes charged that no
//! controller of this replica holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::Locks as _;

/// The cap per namespace when the operator does not say: 32 MiB, four controllers at the quota
/// per controller (8 MiB), or some 55,000 objects' states at the most a state may be (512
/// bytes), while 64 namespaces at it take 2 GiB, etcd's default backend quota: an operator
/// hosting many tenants lowers it (or raises etcd's quota).
pub const DEFAULT_MAX_STATE_BYTES_PER_NAMESPACE: usize = 32 << 20;

/// The saved states of every tenant of this replica, against the cap.
#[derive(Debug)]
pub struct StateAccounts {
    cap: usize,
    tenants: Mutex<HashMap<Option<String>, Tenant>>,
    next: AtomicU64,
}

/// One tenant's books: each one's last sum, and their total.
#[derive(Debug, Default)]
struct Tenant {
    books: HashMap<u64, usize>,
    total: usize,
}

impl StateAccounts {
    /// Accounts capping each tenant at `cap` bytes (`usize::MAX`: no cap).
    pub fn new(cap: usize) -> Arc<StateAccounts> {
        Arc::new(StateAccounts {
            cap,
            tenants: Mutex::default(),
            next: AtomicU64::new(0),
        })
    }

    /// A book for a controller of `namespace` (`None`: a ClusterWasmController), charged
    /// nothing yet.
    pub fn open(self: &Arc<Self>, namespace: Option<&str>) -> StateBook {
        StateBook {
            accounts: Arc::clone(self),
            id: self.next.fetch_add(1, Ordering::Relaxed),
            tenant: namespace.map(str::to_owned),
        }
    }

    /// The cap per tenant.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Bytes charged to `namespace` (`None`: the ClusterWasmControllers).
    pub fn used(&self, namespace: Option<&str>) -> usize {
        self.tenants
            .locked()
            .get(&namespace.map(str::to_owned))
            .map_or(0, |t| t.total)
    }

    /// Bytes charged to every tenant together: what the saved states of this replica's
    /// controllers take.
    pub fn total(&self) -> usize {
        self.tenants.locked().values().map(|t| t.total).sum()
    }

    /// Tenants charged anything.
    pub fn tenants(&self) -> usize {
        self.tenants.locked().len()
    }

    /// Book `book` now holds `bytes`, in place of what it held; refused (nothing changes, the
    /// tenant's total is the error) when `checked` and it would take a tenant that grows past
    /// the cap.
    fn report(&self, book: &StateBook, bytes: usize, checked: bool) -> Result<(), usize> {
        let mut tenants = self.tenants.locked();
        let tenant = tenants.entry(book.tenant.clone()).or_default();
        let old = tenant.books.get(&book.id).copied().unwrap_or(0);
        let total = tenant.total.saturating_sub(old).saturating_add(bytes);
        if checked && bytes > old && total > self.cap {
            return Err(tenant.total);
        }
        tenant.total = total;
        if bytes == 0 {
            tenant.books.remove(&book.id);
        } else {
            tenant.books.insert(book.id, bytes);
        }
        if tenant.books.is_empty() {
            tenants.remove(&book.tenant);
        }
        Ok(())
    }
}

/// What one controller's saved states take, as last told to the ledger. Owned by its states:
/// dropped with them, it credits all it was charged, exactly once.
#[derive(Debug)]
pub struct StateBook {
    accounts: Arc<StateAccounts>,
    id: u64,
    tenant: Option<String>,
}

impl StateBook {
    /// The controller's states take `bytes` now, however many that is: what was stored
    /// before a cap applied (loaded at start) and what a save gave back.
    pub fn set(&self, bytes: usize) {
        let _ = self.accounts.report(self, bytes, false);
    }

    /// The controller's states would take `bytes`: charged if its tenant stays within the cap
    /// (or `bytes` is no more than before); otherwise nothing changes, and the error is what
    /// the tenant's states take.
    pub fn grow(&self, bytes: usize) -> Result<(), usize> {
        self.accounts.report(self, bytes, true)
    }

    /// Whose states these are, as an error says it.
    pub fn whose(&self) -> String {
        match &self.tenant {
            Some(ns) => format!("namespace {ns}'s controllers"),
            None => "the ClusterWasmControllers this replica runs".to_owned(),
        }
    }

    /// The cap of its tenant.
    pub fn cap(&self) -> usize {
        self.accounts.cap
    }

    /// What its tenant's states take.
    pub fn tenant_used(&self) -> usize {
        self.accounts.used(self.tenant.as_deref())
    }
}

impl Drop for StateBook {
    fn drop(&mut self) {
        self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_book_s_sum_replaces_the_last_and_a_dropped_book_credits_it() {
        let accounts = StateAccounts::new(100);
        let (a, b) = (accounts.open(Some("ns")), accounts.open(Some("ns")));
        let cluster = accounts.open(None);
        a.grow(60).unwrap();
        a.grow(70).unwrap();
        assert_eq!(accounts.used(Some("ns")), 70, "replaced, not added");
        assert_eq!(b.grow(31), Err(70), "refused past the cap");
        assert_eq!(accounts.used(Some("ns")), 70, "a refusal changes nothing");
        b.grow(30).unwrap();
        // Told what is stored (a load), past the cap: only shrinking passes then.
        a.set(200);
        assert_eq!(a.grow(201), Err(230));
        a.grow(150).unwrap();
        assert_eq!(accounts.used(Some("ns")), 180);
        // The ClusterWasmControllers are a tenant of their own, capped alike.
        cluster.grow(100).unwrap();
        assert_eq!(cluster.grow(101), Err(100));
        assert!(cluster.whose().contains("ClusterWasmControllers"));
        assert_eq!(a.whose(), "namespace ns's controllers");
        assert_eq!(accounts.total(), 280, "every tenant's states together");
        drop(a);
        assert_eq!(accounts.used(Some("ns")), 30);
        drop((b, cluster));
        assert_eq!(accounts.tenants(), 0, "every book credited, no tenant left");
        assert_eq!(accounts.total(), 0);
    }
}
