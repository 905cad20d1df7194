//! Module bytes in flight: every read, pull and gunzip charged to one byte budget, and each
//! module version read once, its bytes shared by every controller naming it.
//!
//! The budget ([`ReadBudget`], `kubewasm run --module-read-bytes`) is a semaphore of KiB
//! permits. A read charges what it may come to *before* it reads (a ConfigMap's response, a
//! layer's declared size, a gunzip's bound: [`super::bytes::inflate_bound`]) and settles to
//! what it holds after; the charge goes back when the last holder of the bytes drops them. A
//! read that does not fit waits at most [`BUDGET_WAIT`], then fails and is retried. Charging
//! the bound up front, never growing while reading, means no read holds part of the budget
//! while it waits for more.
//!
//! Sharing ([`ModuleReads::shared`]) is a single-flight map keyed by what names the bytes (a
//! ConfigMap's uid, resourceVersion and key; an image's manifest digest): concurrent readers
//! of one key wait for the first and get the same [`ModuleBytes`], and a later reader gets
//! them too while any holder still has them. The map holds weak references only: once the
//! last controller has compiled (or refused) them, nothing of them is kept. Bytes that are no
//! module are the exception: that version of that key never becomes one, so the failure is
//! remembered ([`FAILED_KEPT`], at most [`MAX_FAILED`] of them, the oldest forgotten first) and
//! every later reader of the key is told it without a read — a tenant's thirty-two controllers
//! naming one gzip bomb cause one read however their fetches are spread in time.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};

use super::{ModuleError, Version};
use kubewasm_sandbox::Digest;
use kubewasm_sandbox::sync::Locks as _;

/// The default of `kubewasm run --module-read-bytes`: two modules at the default
/// `--max-module-bytes` (64 MiB) at once, such as one gzipped layer at the cap and what it
/// inflates to. Two thirds of the 192 MiB the Deployment's 896 MiB limit leaves the runtime
/// beside its sandboxes and caches (`deploy/runtime/deployment.yaml`).
pub const DEFAULT_MODULE_READ_BYTES: u64 = 128 << 20;

/// How long a read waits for room in the budget before it fails (and is retried).
pub const BUDGET_WAIT: Duration = Duration::from_secs(20);

/// How long the failure of bytes that are no module is remembered by their key.
pub const FAILED_KEPT: Duration = Duration::from_secs(3600);

/// The most such failures remembered at once (each an error message: a few hundred bytes).
pub const MAX_FAILED: usize = 1024;

/// A read that found no room in the budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "reading this module needs {} of the runtime's module read budget of {} (`kubewasm run --module-read-bytes`), {}; retrying",
    kubewasm_api::Unit::Bytes.show(*.needed),
    kubewasm_api::Unit::Bytes.show(*.budget),
    if .needed > .budget { "more than all of it: its operator raises the budget or lowers --max-module-bytes" } else { "and other modules being read hold the rest" }
)]
pub struct BudgetExhausted {
    /// What the read asked for, in bytes.
    pub needed: u64,
    /// The whole budget, in bytes.
    pub budget: u64,
}

struct BudgetInner {
    permits: Arc<Semaphore>,
    /// The whole budget, in KiB.
    total_kib: u64,
    wait: Duration,
    /// The most KiB ever charged at once.
    peak_kib: AtomicU64,
}

/// The byte budget of every module read and pull in flight (see the module doc).
#[derive(Clone)]
pub struct ReadBudget(Arc<BudgetInner>);

impl std::fmt::Debug for ReadBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadBudget({} KiB)", self.0.total_kib)
    }
}

/// One budget is equal only to itself (a config holding it compares by identity).
impl PartialEq for ReadBudget {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ReadBudget {}

/// KiB, rounded up.
fn kib(bytes: u64) -> u64 {
    bytes.div_ceil(1024)
}

impl ReadBudget {
    /// A budget of `bytes`; a read waits at most `wait` for room.
    pub fn new(bytes: u64, wait: Duration) -> ReadBudget {
        let total_kib = kib(bytes).min(Semaphore::MAX_PERMITS as u64);
        ReadBudget(Arc::new(BudgetInner {
            permits: Arc::new(Semaphore::new(usize::try_from(total_kib).unwrap_or(0))),
            total_kib,
            wait,
            peak_kib: AtomicU64::new(0),
        }))
    }

    /// As much as the machine has: for the offline commands, which read one module.
    pub fn unbounded() -> ReadBudget {
        ReadBudget::new(u64::MAX, BUDGET_WAIT)
    }

    /// Bytes charged now.
    pub fn in_use(&self) -> u64 {
        let free = self.0.permits.available_permits() as u64;
        self.0.total_kib.saturating_sub(free) * 1024
    }

    /// The most bytes charged at once since the start.
    pub fn peak(&self) -> u64 {
        self.0.peak_kib.load(Ordering::Relaxed) * 1024
    }

    /// The whole budget, in bytes.
    pub fn total(&self) -> u64 {
        self.0.total_kib.saturating_mul(1024)
    }

    /// Nothing charged yet: [`Charge::resize`] it before reading.
    pub fn empty(&self) -> Charge {
        Charge {
            budget: self.clone(),
            permit: None,
        }
    }

    /// A charge of `bytes`, waiting for room at most [`BUDGET_WAIT`].
    pub async fn charge(&self, bytes: u64) -> Result<Charge, BudgetExhausted> {
        let mut charge = self.empty();
        charge.resize(bytes).await?;
        Ok(charge)
    }

    fn note_peak(&self) {
        let used = kib(self.in_use());
        self.0.peak_kib.fetch_max(used, Ordering::Relaxed);
    }
}

/// Bytes charged to a [`ReadBudget`], given back when dropped.
pub struct Charge {
    budget: ReadBudget,
    permit: Option<OwnedSemaphorePermit>,
}

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Charge({} KiB)", self.kib())
    }
}

impl Charge {
    fn kib(&self) -> u64 {
        self.permit.as_ref().map_or(0, |p| p.num_permits() as u64)
    }

    /// Makes the charge `bytes`: gives back what is over, or waits (at most the budget's
    /// wait) for what is missing. Failing, the charge is unchanged.
    pub async fn resize(&mut self, bytes: u64) -> Result<(), BudgetExhausted> {
        let want = kib(bytes);
        let have = self.kib();
        let refused = BudgetExhausted {
            needed: bytes,
            budget: self.budget.total(),
        };
        if want <= have {
            let over = usize::try_from(have - want).unwrap_or(usize::MAX);
            if let Some(permit) = &mut self.permit {
                drop(permit.split(over));
            }
            return Ok(());
        }
        if want > self.budget.0.total_kib {
            return Err(refused);
        }
        let more = u32::try_from(want - have).map_err(|_| refused.clone())?;
        let inner = &self.budget.0;
        let permit = match inner.permits.clone().try_acquire_many_owned(more) {
            Ok(permit) => permit,
            Err(_) => {
                let acquire = inner.permits.clone().acquire_many_owned(more);
                match tokio::time::timeout(inner.wait, acquire).await {
                    Ok(Ok(permit)) => permit,
                    _ => return Err(refused),
                }
            }
        };
        match &mut self.permit {
            Some(held) => held.merge(permit),
            None => self.permit = Some(permit),
        }
        self.budget.note_peak();
        Ok(())
    }
}

/// A module's bytes (gunzipped), shared by every holder and charged to the read budget until
/// the last one drops them. Clones are one allocation.
#[derive(Clone)]
pub struct ModuleBytes(Arc<Held>);

struct Held {
    bytes: Box<[u8]>,
    digest: Digest,
    _charge: Charge,
}

impl std::fmt::Debug for ModuleBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ModuleBytes({}, {} bytes)",
            self.0.digest,
            self.0.bytes.len()
        )
    }
}

impl PartialEq for ModuleBytes {
    fn eq(&self, other: &Self) -> bool {
        self.0.digest == other.0.digest
    }
}

impl Eq for ModuleBytes {}

impl std::ops::Deref for ModuleBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0.bytes
    }
}

impl AsRef<[u8]> for ModuleBytes {
    fn as_ref(&self) -> &[u8] {
        &self.0.bytes
    }
}

impl ModuleBytes {
    /// `bytes`, held under `charge` (settled to their size here). Hashes them: call it off
    /// the async workers for large ones.
    pub fn new(bytes: Vec<u8>, mut charge: Charge) -> ModuleBytes {
        // Giving back never waits: `resize` down is immediate.
        let size = bytes.len() as u64;
        let want = kib(size);
        if let Some(permit) = &mut charge.permit {
            let over = (permit.num_permits() as u64).saturating_sub(want);
            drop(permit.split(usize::try_from(over).unwrap_or(0)));
        }
        let digest = Digest::of(&bytes);
        ModuleBytes(Arc::new(Held {
            bytes: bytes.into_boxed_slice(),
            digest,
            _charge: charge,
        }))
    }

    /// Bytes charged to no budget (a test's, a user's file in an offline command).
    pub fn uncharged(bytes: Vec<u8>) -> ModuleBytes {
        ModuleBytes::new(bytes, ReadBudget::unbounded().empty())
    }

    /// Their sha256.
    pub fn digest(&self) -> Digest {
        self.0.digest
    }
}

/// What names a version of a module's bytes, for sharing their read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ReadKey {
    /// A key of a ConfigMap at a version (as the runtime's metadata watch saw it).
    ConfigMap {
        /// `namespace/name`.
        config_map: String,
        key: String,
        /// Its uid and resourceVersion.
        version: String,
    },
    /// The module of an image's manifest digest, gunzipped.
    Image(String),
}

/// A read's outcome, as every reader of its key gets it.
type Outcome = Result<(ModuleBytes, Version), Arc<ModuleError>>;

/// Reads of one key: in flight (readers wait on the cell), or done (the bytes, while held;
/// or why they are no module, for [`FAILED_KEPT`]).
#[derive(Default)]
struct Entry {
    flight: Weak<OnceCell<Outcome>>,
    done: Option<(Weak<Held>, Version)>,
    failed: Option<(Arc<ModuleError>, std::time::Instant)>,
}

/// The runtime's module reads: the budget, and one read per module version (see the module
/// doc).
pub struct ModuleReads {
    budget: ReadBudget,
    entries: Mutex<HashMap<ReadKey, Entry>>,
    /// ConfigMaps read (listed) for their module, since the start.
    config_map_reads: AtomicU64,
}

impl ModuleReads {
    /// Reads charged to `budget`.
    pub fn new(budget: ReadBudget) -> ModuleReads {
        ModuleReads {
            budget,
            entries: Mutex::default(),
            config_map_reads: AtomicU64::new(0),
        }
    }

    pub fn budget(&self) -> &ReadBudget {
        &self.budget
    }

    /// Counts a ConfigMap read for its module.
    pub fn count_config_map_read(&self) {
        self.config_map_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// ConfigMaps read for their module since the start.
    pub fn config_map_reads(&self) -> u64 {
        self.config_map_reads.load(Ordering::Relaxed)
    }

    /// Keys with bytes or a read in flight (a test's view of what is kept).
    pub fn kept(&self) -> usize {
        let mut entries = self.entries.locked();
        prune(&mut entries);
        entries.len()
    }

    /// The bytes of `key`: those another holder has, or the outcome of the read in flight,
    /// or of `read`, run here when no other reader runs one.
    pub async fn shared<F>(
        &self,
        key: ReadKey,
        read: impl FnOnce() -> F,
    ) -> Result<(ModuleBytes, Version), ModuleError>
    where
        F: Future<Output = Result<(ModuleBytes, Version), ModuleError>>,
    {
        let cell = {
            let mut entries = self.entries.locked();
            prune(&mut entries);
            let entry = entries.entry(key.clone()).or_default();
            if let Some((held, version)) = &entry.done
                && let Some(held) = held.upgrade()
            {
                return Ok((ModuleBytes(held), version.clone()));
            }
            if let Some((failed, _)) = &entry.failed {
                return Err(ModuleError::Shared(failed.clone()));
            }
            match entry.flight.upgrade() {
                Some(cell) => cell,
                None => {
                    let cell = Arc::new(OnceCell::new());
                    entry.flight = Arc::downgrade(&cell);
                    cell
                }
            }
        };
        let outcome = cell
            .get_or_init(|| async { read().await.map_err(Arc::new) })
            .await
            .clone();
        match &outcome {
            Ok((bytes, version)) => {
                let mut entries = self.entries.locked();
                let entry = entries.entry(key).or_default();
                entry.done = Some((Arc::downgrade(&bytes.0), version.clone()));
            }
            Err(e) if e.invalid_at().is_some() => {
                let mut entries = self.entries.locked();
                let entry = entries.entry(key).or_default();
                entry.failed = Some((e.clone(), std::time::Instant::now()));
            }
            Err(_) => {}
        }
        outcome.map_err(ModuleError::Shared)
    }
}

/// Forgets the keys nobody holds or reads any more, and failures older than [`FAILED_KEPT`]
/// or past the [`MAX_FAILED`] newest.
fn prune(entries: &mut HashMap<ReadKey, Entry>) {
    let now = std::time::Instant::now();
    for entry in entries.values_mut() {
        if entry
            .failed
            .as_ref()
            .is_some_and(|(_, at)| now.duration_since(*at) >= FAILED_KEPT)
        {
            entry.failed = None;
        }
    }
    let mut failed: Vec<std::time::Instant> = entries
        .values()
        .filter_map(|e| Some(e.failed.as_ref()?.1))
        .collect();
    if failed.len() > MAX_FAILED {
        failed.sort_unstable();
        let oldest_kept = failed[failed.len() - MAX_FAILED];
        for entry in entries.values_mut() {
            if entry
                .failed
                .as_ref()
                .is_some_and(|(_, at)| *at < oldest_kept)
            {
                entry.failed = None;
            }
        }
    }
    entries.retain(|_, e| {
        e.flight.strong_count() > 0
            || e.done.as_ref().is_some_and(|(h, _)| h.strong_count() > 0)
            || e.failed.is_some()
    });
}

#[cfg(test)]
mod tests;
