//! Instances made ahead, and spent ones torn down, off the latency path.
//!
//! A reconcile needs a fresh instance (no call may see another's memory), and making one and
//! unmaking it are a third of a small call's time. Neither has to sit between the event and the
//! actions: a busy controller's next instance is made on the sandbox's own threads while the
//! caller carries out the actions of the last one, and a spent Store is dropped there too (its
//! touched pages reset). Each instance made ahead still serves exactly one call.
//!
//! Bounds: a controller holds at most one ([`Ready`]); all together hold at most
//! `SandboxConfig::max_ready_instances` pool slots, each charged to its tenant, who may hold no
//! more than an equal share among the tenants holding some; a controller counts as busy when
//! its call comes within [`READY_IDLE`] of its last, and what waits longer is dropped; a module
//! whose instantiation fails or outlasts [`MAKE_DEADLINE`] ahead is made on the call's path only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak, mpsc};
use std::time::{Duration, Instant};

use super::call::Instance;
use super::engine::{Digest, GuestPre, block_on};
use super::limits::Limits;
use super::output::SharedLines;
use super::slots::Slot;
use crate::sync::Locks as _;

/// An instance made ahead waits this long for its call before it is dropped; a controller whose
/// calls come closer than this counts as busy and gets one.
pub const READY_IDLE: Duration = Duration::from_secs(2);

/// The longest an instantiation ahead may take (a component's start function is guest code):
/// a module past it, or failing, is made on the call's path only, where its own deadline holds.
pub const MAKE_DEADLINE: Duration = Duration::from_millis(100);

/// Threads that make instances ahead and drop spent ones (at most; one per core).
const MAX_WORKERS: usize = 4;

/// One controller's instance made ahead: at most one, of one module with one set of limits.
/// Cloning shares it; dropped with the controller.
#[derive(Clone, Default)]
pub struct Ready {
    inner: Arc<ReadyInner>,
}

#[derive(Default)]
struct ReadyInner {
    made: Mutex<Option<Made>>,
    /// A make is on its way: one at a time per controller.
    making: AtomicBool,
    /// When the controller's last call started.
    last: Mutex<Option<Instant>>,
    /// In the makers' list of controllers holding one (listed once).
    listed: AtomicBool,
}

/// An instance made ahead with the pool slot it is charged to.
pub(crate) struct Made {
    digest: Digest,
    pub(crate) instance: Instance,
    pub(crate) slot: Slot,
    at: Instant,
}

impl Ready {
    pub fn new() -> Ready {
        Ready::default()
    }

    /// Whether an instance is ready now.
    pub fn holds(&self) -> bool {
        self.inner.made.locked().is_some()
    }

    /// Takes the instance made ahead; the caller uses it only for the same module and limits.
    pub(crate) fn take(&self) -> Option<Made> {
        self.inner.made.locked().take()
    }

    /// Records a call's start; true when the one before it came within [`READY_IDLE`].
    pub(crate) fn called(&self) -> bool {
        let now = Instant::now();
        let last = self.inner.last.locked().replace(now);
        last.is_some_and(|at| now.duration_since(at) < READY_IDLE)
    }
}

impl Made {
    /// Whether it was made of this module with these limits.
    pub(crate) fn serves(&self, digest: &Digest, limits: &Limits) -> bool {
        self.digest == *digest && self.instance.limits() == limits
    }
}

/// A job for the makers.
enum Job {
    /// Something to drop: a spent Store with the slots it held, last the slots.
    Drop(Box<dyn Send>),
    Make(Box<Make>),
}

struct Make {
    ready: Weak<ReadyInner>,
    guest: Arc<GuestPre>,
    limits: Limits,
    controller: String,
    slot: Slot,
    lines: SharedLines,
}

/// The sandbox's threads for instances made ahead and spent ones dropped.
pub(crate) struct Makers {
    jobs: mpsc::Sender<Job>,
}

/// Controllers holding an instance made ahead, for the sweep of idle ones.
#[derive(Default)]
struct Holding {
    swept: Option<Instant>,
    readies: Vec<Weak<ReadyInner>>,
}

impl Makers {
    /// Starts the threads (one per core, at most [`MAX_WORKERS`]); they end with the sender.
    pub(crate) fn start() -> Makers {
        let (jobs, rx) = mpsc::channel();
        let rx = Arc::new(Mutex::new(rx));
        let holding = Arc::new(Mutex::new(Holding::default()));
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WORKERS));
        for n in 0..workers {
            let (rx, holding) = (rx.clone(), holding.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("kubewasm-ahead-{n}"))
                .spawn(move || work(&rx, &holding));
            if let Err(e) = spawned {
                // Fewer threads: what is sent is still done, by the others; with none at all
                // the caller drops its Stores itself (see `drop_later`).
                tracing::warn!("starting a thread for instances made ahead: {e}");
            }
        }
        Makers { jobs }
    }

    /// Drops `value` on a maker thread; here, when there is none.
    pub(crate) fn drop_later(&self, value: impl Send + 'static) {
        if let Err(mpsc::SendError(job)) = self.jobs.send(Job::Drop(Box::new(value))) {
            drop(job);
        }
    }

    /// Makes `guest`'s next instance for `ready`, charged to `slot`, unless one is on its way.
    pub(crate) fn make(
        &self,
        ready: &Ready,
        guest: Arc<GuestPre>,
        limits: Limits,
        controller: String,
        slot: Slot,
        lines: SharedLines,
    ) {
        if ready.inner.making.swap(true, Ordering::AcqRel) {
            return;
        }
        let job = Make {
            ready: Arc::downgrade(&ready.inner),
            guest,
            limits,
            controller,
            slot,
            lines,
        };
        if self.jobs.send(Job::Make(Box::new(job))).is_err() {
            ready.inner.making.store(false, Ordering::Release);
        }
    }
}

fn work(rx: &Mutex<mpsc::Receiver<Job>>, holding: &Mutex<Holding>) {
    loop {
        let job = rx.locked().recv_timeout(READY_IDLE / 4);
        match job {
            Ok(Job::Drop(value)) => drop(value),
            Ok(Job::Make(make)) => made(*make, holding),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        }
        sweep(holding);
    }
}

/// Makes one instance ahead and leaves it with its controller (if it is still there and holds
/// none).
fn made(make: Make, holding: &Mutex<Holding>) {
    let Make {
        ready,
        guest,
        limits,
        controller,
        slot,
        lines,
    } = make;
    let Some(ready) = ready.upgrade() else {
        return;
    };
    let deadline = MAKE_DEADLINE.min(limits.timeout);
    match block_on(guest.instantiate(&controller, &limits, deadline, Some(lines))) {
        Ok(instance) => {
            let made = Made {
                digest: guest.digest(),
                instance: instance.made_ahead(),
                slot,
                at: Instant::now(),
            };
            let left = {
                let mut cell = ready.made.locked();
                match cell.is_none() {
                    true => cell.replace(made),
                    false => Some(made),
                }
            };
            drop(left);
            if !ready.listed.swap(true, Ordering::AcqRel) {
                holding.locked().readies.push(Arc::downgrade(&ready));
            }
        }
        Err(e) => {
            if !guest.refuse_ahead() {
                tracing::warn!(
                    controller,
                    module = %guest.digest(),
                    "instances of this module are made on the call's path from now on: making one ahead failed ({e})"
                );
            }
        }
    }
    ready.making.store(false, Ordering::Release);
}

/// Drops the instances made ahead that waited past [`READY_IDLE`] (at most every quarter of it).
fn sweep(holding: &Mutex<Holding>) {
    let mut holding = holding.locked();
    let now = Instant::now();
    if holding
        .swept
        .is_some_and(|at| now.duration_since(at) < READY_IDLE / 4)
    {
        return;
    }
    holding.swept = Some(now);
    let mut idle = Vec::new();
    holding.readies.retain(|weak| {
        let Some(ready) = weak.upgrade() else {
            return false;
        };
        let mut cell = ready.made.locked();
        if cell
            .as_ref()
            .is_some_and(|m| now.duration_since(m.at) >= READY_IDLE)
        {
            idle.extend(cell.take());
        }
        let keep = cell.is_some();
        if !keep {
            ready.listed.store(false, Ordering::Release);
        }
        keep
    });
    drop(holding);
    drop(idle);
}
