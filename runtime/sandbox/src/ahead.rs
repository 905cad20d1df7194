//! Instances made ahead, and spent ones torn down, off the latency path.
//!
//! A reconcile needs a fresh instance (no call may see another's memory), and making one and
//! unmaking it are a third of a small call's time. Neither has to sit between the event and the
//! actions: a call made with the controller's [`Ready`] uses the instance made for it ahead, and
//! hands back a [`Tidy`] — its spent Store to drop (the teardown: the slot's touched pages
//! reset) and, for a busy controller, the next instance to make — which the caller runs once
//! the answer is handed on, on its own task, while the actions' writes are on their way. No
//! other thread is woken per call (a thread hand-off cost more CPU than it saved: BENCHMARKS).
//! Each instance made ahead still serves exactly one call.
//!
//! Bounds: a controller holds at most one; each holds one of the sandbox's instance slots
//! (`--max-instances`, so that the memory budget is unchanged), charged to its tenant, who may
//! hold no more than an equal share among the tenants holding some and never more than half;
//! one is made only when a slot is free and no call waits, and a call that would wait drops
//! them all first; a controller counts as busy when its call comes within [`READY_IDLE`] of its
//! last, and an instance that waits longer is dropped by the sandbox's sweeper thread; a module
//! whose instantiation fails or outlasts [`MAKE_DEADLINE`] ahead is made on the call's path
//! only.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::call::{Instance, Prepare};
use super::digest::Digest;
use super::engine::GuestPre;
use super::limits::Limits;
use super::output::SharedLines;
use super::slots::{FairSlots, Slot};
use crate::sync::Locks as _;

/// An instance made ahead waits this long for its call before it is dropped; a controller whose
/// calls come closer than this counts as busy and gets one.
pub const READY_IDLE: Duration = Duration::from_secs(2);

/// The longest an instantiation ahead may take (a component's start function is guest code):
/// a module past it, or failing, is made on the call's path only, where its own deadline holds.
pub const MAKE_DEADLINE: Duration = Duration::from_millis(100);

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
    /// In the sweeper's list of controllers holding one (listed once).
    listed: AtomicBool,
}

/// An instance made ahead with the instance slot it is charged to.
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

/// An instance to make ahead for a controller, in a slot of `slots` charged to its tenant
/// (taken once the spent Store gave its slot back). Dropped unmade, its controller may have
/// another made.
pub(crate) struct Make {
    ready: Weak<ReadyInner>,
    guest: Arc<GuestPre>,
    limits: Limits,
    controller: String,
    slots: FairSlots,
    lines: SharedLines,
}

impl Make {
    /// `guest`'s next instance for `ready`, unless one is on its way (`None` then).
    pub(crate) fn next(
        ready: &Ready,
        guest: Arc<GuestPre>,
        limits: Limits,
        controller: String,
        slots: FairSlots,
        lines: SharedLines,
    ) -> Option<Make> {
        if ready.inner.making.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(Make {
            ready: Arc::downgrade(&ready.inner),
            guest,
            limits,
            controller,
            slots,
            lines,
        })
    }
}

impl Drop for Make {
    fn drop(&mut self) {
        if let Some(ready) = self.ready.upgrade() {
            ready.making.store(false, Ordering::Release);
        }
    }
}

/// What is left of a call made with a [`Ready`]: its spent Store with the slots it held, and
/// maybe the controller's next instance to make. [`Tidy::run`] does both; dropped unrun, the
/// Store is dropped where it is and nothing is made.
#[must_use = "run it once the answer is handed on, or the next instance is not made"]
pub struct Tidy {
    spent: Option<Box<dyn Send>>,
    make: Option<Make>,
    holding: Arc<Mutex<Holding>>,
}

impl Tidy {
    pub(crate) fn new(
        spent: impl Send + 'static,
        make: Option<Make>,
        holding: Arc<Mutex<Holding>>,
    ) -> Tidy {
        Tidy {
            spent: Some(Box::new(spent)),
            make,
            holding,
        }
    }

    /// Drops the spent Store (and then the slots it held), then makes the next instance ahead,
    /// on this task (its instantiation yields every epoch tick and ends at [`MAKE_DEADLINE`]).
    pub async fn run(mut self) {
        drop(self.spent.take());
        if let Some(make) = self.make.take() {
            made(make, &self.holding).await;
        }
    }
}

/// Controllers holding an instance made ahead, for the sweep of idle ones.
#[derive(Default)]
pub(crate) struct Holding {
    readies: Vec<Weak<ReadyInner>>,
}

/// Starts the thread that drops instances made ahead once they waited [`READY_IDLE`] (every
/// quarter of it); it ends with the sandbox (the list it sweeps).
pub(crate) fn start_sweeper() -> Arc<Mutex<Holding>> {
    let holding = Arc::new(Mutex::new(Holding::default()));
    let weak = Arc::downgrade(&holding);
    let spawned = std::thread::Builder::new()
        .name("kubewasm-ready-sweep".into())
        .spawn(move || {
            while let Some(holding) = weak.upgrade() {
                sweep(&holding);
                drop(holding);
                std::thread::sleep(READY_IDLE / 4);
            }
        });
    if let Err(e) = spawned {
        // Without it an idle controller keeps its one instance (still bounded by the pool).
        tracing::warn!("starting the sweeper of instances made ahead: {e}");
    }
    holding
}

/// Makes one instance ahead and leaves it with its controller (if it is still there and holds
/// none).
async fn made(make: Make, holding: &Mutex<Holding>) {
    let Some(ready) = make.ready.upgrade() else {
        return;
    };
    let Some(slot) = make.slots.try_share(&make.lines.tenant) else {
        return;
    };
    let lines = Some(make.lines.clone());
    let guest = &make.guest;
    let deadline = MAKE_DEADLINE.min(make.limits.timeout);
    match guest
        .instantiate(
            &make.controller,
            &make.limits,
            deadline,
            lines,
            Prepare::Ahead,
        )
        .await
    {
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
                    controller = make.controller,
                    module = %guest.digest(),
                    "instances of this module are made on the call's path from now on: making one ahead failed ({e})"
                );
            }
        }
    }
}

/// Drops every instance made ahead: a call is about to wait for a slot.
pub(crate) fn drop_ready(holding: &Mutex<Holding>) {
    sweep_older(holding, Duration::ZERO);
}

/// Drops the instances made ahead that waited past [`READY_IDLE`].
fn sweep(holding: &Mutex<Holding>) {
    sweep_older(holding, READY_IDLE);
}

fn sweep_older(holding: &Mutex<Holding>, idle: Duration) {
    let now = Instant::now();
    let mut dropped = Vec::new();
    let mut holding = holding.locked();
    holding.readies.retain(|weak| {
        let Some(ready) = weak.upgrade() else {
            return false;
        };
        let mut cell = ready.made.locked();
        if cell
            .as_ref()
            .is_some_and(|m| now.duration_since(m.at) >= idle)
        {
            dropped.extend(cell.take());
        }
        let keep = cell.is_some();
        if !keep {
            ready.listed.store(false, Ordering::Release);
        }
        keep
    });
    drop(holding);
    drop(dropped);
}
