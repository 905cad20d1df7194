//! A controller's life as one type ([`Life`]): whether it runs and why not ([`Run`]), its
//! module — the last good one and what became of the newest ([`Module`]) —, and its backoff.
//! Every change of them is one of the transitions below; the manager routes what happened
//! (a module read, a setup's end, a stop, an access lost) to them and carries out what they
//! answer (swap a runner's module, log, count), and the status reads [`Life::phase`].
//!
//! ```text
//!   declared ──read──▶ Compiling ──compiled──▶ (set up) ──started──▶ Running
//!      │                  │                        │                   │
//!      └─ ModuleFailed ◀──┘                        └──▶ Refused ◀──────┘ (access lost)
//! ```
//!
//! A running controller stays [`Phase::Running`] with its last good module when a new one
//! fails (the status says so); one refused is tried again on its backoff; one whose module
//! failed is read again when its source changes (or its poll comes round). A source that
//! stops answering shows why until it answers again, and then what was wrong before.

use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::api::Problem;
use crate::host::Runner;
use crate::sandbox::{Digest, GuestPre};
use crate::sources::Version;

use super::lifecycle::Retry;
use super::setup::ReadAccess;

/// A compiled module as a life holds it: what names it (a test's stand-in needs no engine).
pub(super) trait Guest: Clone {
    fn digest(&self) -> Digest;
}

impl Guest for Arc<GuestPre> {
    fn digest(&self) -> Digest {
        GuestPre::digest(self)
    }
}

/// A runner as a life holds it: it takes a new module, and a new candidate (a test's
/// stand-in records them).
pub(super) trait Runs<G> {
    /// Runs `guest` (pulled as `image`) from its next reconcile on.
    fn swap(&self, guest: G, image: Option<String>);
    /// Compares `candidate` (pulled as its image) from its next reconcile on (`None`: none).
    fn shadow(&self, candidate: Option<(G, Option<String>)>);
}

impl Runs<Arc<GuestPre>> for Arc<Runner> {
    fn swap(&self, guest: Arc<GuestPre>, image: Option<String>) {
        self.swap_guest(guest, image);
    }

    fn shadow(&self, candidate: Option<(Arc<GuestPre>, Option<String>)>) {
        self.set_candidate(candidate);
    }
}

/// See the module doc.
pub(super) struct Life<G = Arc<GuestPre>, R = Arc<Runner>> {
    run: Run<R>,
    module: Module<G>,
    /// The candidate module (`spec.candidate`), compared in shadow while it runs.
    candidate: Module<G>,
    /// Failed starts in a row, and when to try again.
    pub(super) retry: Retry,
}

impl<G, R> Default for Life<G, R> {
    fn default() -> Self {
        Life {
            run: Run::Idle,
            module: Module::default(),
            candidate: Module::default(),
            retry: Retry::default(),
        }
    }
}

impl<G> Default for Module<G> {
    fn default() -> Self {
        Module {
            guest: None,
            version: None,
            image: None,
            problem: None,
            unreachable_since: None,
            compiling: None,
        }
    }
}

/// Which of a controller's modules a read is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    /// `spec.module`: the one whose actions are carried out.
    Live,
    /// `spec.candidate`: compared in shadow.
    Candidate,
}

/// Whether a controller runs, and if not, why.
enum Run<R> {
    /// Not running, and nothing against it: declared and starting, or stopped to start again.
    Idle,
    /// It may not start, or could not be set up: why. Tried again on its backoff.
    Refused(Problem),
    /// Reconciling.
    Running {
        runner: R,
        task: JoinHandle<()>,
        /// What its ServiceAccount was found allowed to read when it started.
        access: ReadAccess,
    },
}

/// A controller's module: the last good one, and what became of the newest.
struct Module<G> {
    guest: Option<G>,
    /// The version of its source `guest` (or the bytes that failed) was read from.
    version: Option<Version>,
    /// The image (`registry/repository@sha256:…`) `guest` was pulled as, if it was.
    image: Option<String>,
    /// Why the newest module is not the one running (or why none runs).
    problem: Option<Problem>,
    /// Its source could not be read: the problem before that, shown again once the source
    /// answers that it is still at the version loaded.
    unreachable_since: Option<Option<Problem>>,
    /// The module its last read found being compiled: the compile's end applies to it only
    /// while this is still the module (a later read decides otherwise).
    compiling: Option<Digest>,
}

/// Where a controller is in its life, as the status and the loop read it.
#[derive(Clone, Copy)]
pub(super) enum Phase<'a, R = Arc<Runner>> {
    /// Its runner reconciles (with the last good module, whatever a newer one did).
    Running(&'a R),
    /// It could not be set up or may not start (its ServiceAccount, its kinds, the caps):
    /// why. Tried again on its backoff.
    Refused(&'a Problem),
    /// No module runs, and loading one failed: why (a source that does not answer, bytes
    /// that are no module, a quarantined module, the spec's source itself).
    ModuleFailed(&'a Problem),
    /// Its module is being compiled beside the loop.
    Compiling(Digest),
    /// Declared; its module is being read or pulled, or it is being set up.
    Starting,
}

/// What reading a controller's module found, as its life takes it (the caps applied).
pub(super) enum Found<G = Arc<GuestPre>> {
    /// Nothing new yet (a fetch or a pull under way).
    Pending,
    /// Its module is being compiled beside the loop.
    Compiling(Digest),
    /// Not read: the runtime may not act as its ServiceAccount (why).
    Refused(Problem),
    /// Its source is still at the version loaded.
    Unchanged,
    /// Its source did not answer (or its bytes could not be fetched): why.
    Unreachable(Problem),
    /// A version of its source, compiled (or why it may not run).
    Loaded {
        /// The version read.
        version: Version,
        /// The image it was pulled as, if it was.
        image: Option<String>,
        /// The module compiled, or why it may not run (no module, a cap, quarantined).
        guest: Result<G, Problem>,
    },
}

/// What a read changed, for the manager to carry out.
pub(super) enum Change<G = Arc<GuestPre>> {
    /// Nothing to do.
    Nothing,
    /// A new module: the runner (if any) takes it.
    Swapped(G),
    /// The same module again (its image may be newly known).
    Kept,
    /// The newest module may not run: why; the last good one (if any) keeps running.
    Failed(Problem),
    /// Not read, for this reason; `new`: the reason differs from the last one said.
    Refused {
        problem: Problem,
        /// Whether it is news (said once, not on every retry).
        new: bool,
    },
}

impl<G: Guest, R: Runs<G>> Life<G, R> {
    /// A new declaration of a controller that ran `before`: a fresh life that keeps the last
    /// good module (and its image) until the new spec's module is read.
    pub(super) fn after(before: Option<&Life<G, R>>) -> Life<G, R> {
        let mut life = Life::default();
        if let Some(before) = before {
            life.module.guest = before.module.guest.clone();
            life.module.image = before.module.image.clone();
        }
        life
    }

    /// The controller's [`Phase`].
    pub(super) fn phase(&self) -> Phase<'_, R> {
        match (&self.run, &self.module.problem, self.module.compiling) {
            (Run::Running { runner, .. }, ..) => Phase::Running(runner),
            (Run::Refused(problem), ..) => Phase::Refused(problem),
            (Run::Idle, Some(problem), _) => Phase::ModuleFailed(problem),
            (Run::Idle, None, Some(digest)) => Phase::Compiling(digest),
            (Run::Idle, None, None) => Phase::Starting,
        }
    }

    /// Takes what reading its module found.
    pub(super) fn read(&mut self, found: Found<G>) -> Change<G> {
        let m = &mut self.module;
        // The last read that found something decides: a compile it did not start applies no
        // more (a fetch under way found nothing yet).
        m.compiling = match &found {
            Found::Compiling(digest) => Some(*digest),
            Found::Pending => m.compiling,
            _ => None,
        };
        match found {
            Found::Pending | Found::Compiling(_) => Change::Nothing,
            // A running one is stopped by the access recheck; one not running says why.
            Found::Refused(problem) => match &self.run {
                Run::Running { .. } => Change::Nothing,
                _ => Change::Refused {
                    new: self.refuse(problem.clone()),
                    problem,
                },
            },
            Found::Unchanged => {
                // The source answers again, at the version loaded: what was wrong before it
                // stopped answering is what is wrong now.
                if let Some(before) = m.unreachable_since.take() {
                    m.problem = before;
                }
                Change::Nothing
            }
            Found::Unreachable(problem) => {
                if m.unreachable_since.is_none() {
                    m.unreachable_since = Some(m.problem.clone());
                }
                m.problem = Some(problem.clone());
                Change::Failed(problem)
            }
            Found::Loaded {
                version,
                image,
                guest,
            } => {
                // The same bytes would fail the same way: read again only once they change.
                m.version = Some(version);
                m.unreachable_since = None;
                let guest = match guest {
                    Ok(guest) => guest,
                    Err(problem) => {
                        m.problem = Some(problem.clone());
                        return Change::Failed(problem);
                    }
                };
                m.problem = None;
                let changed = m.guest.as_ref().map(|g| g.digest()) != Some(guest.digest());
                if image.is_some() || changed {
                    m.image = image;
                }
                if !changed {
                    return Change::Kept;
                }
                m.guest = Some(guest.clone());
                if let Run::Running { runner, .. } = &self.run {
                    runner.swap(guest.clone(), m.image.clone());
                }
                Change::Swapped(guest)
            }
        }
    }

    /// It may not start: why. Whether the reason is news (said once, not on every retry).
    /// A running one is stopped first ([`Life::stop`]): refusing it while it runs changes
    /// nothing (its runner is never dropped unstopped).
    pub(super) fn refuse(&mut self, problem: Problem) -> bool {
        match &self.run {
            Run::Running { .. } => false,
            Run::Refused(before) if *before == problem => false,
            Run::Idle | Run::Refused(_) => {
                self.run = Run::Refused(problem);
                true
            }
        }
    }

    /// It was set up and runs `runner` (its task `task`), allowed to read `access`.
    pub(super) fn start(&mut self, runner: R, task: JoinHandle<()>, access: ReadAccess) {
        self.run = Run::Running {
            runner,
            task,
            access,
        };
    }

    /// It stops running (idle, to be started again or forgotten): its runner and task, to
    /// stop and wait for.
    pub(super) fn stop(&mut self) -> Option<(R, JoinHandle<()>)> {
        match std::mem::replace(&mut self.run, Run::Idle) {
            Run::Running { runner, task, .. } => Some((runner, task)),
            other => {
                self.run = other;
                None
            }
        }
    }

    /// Its runner, while it runs.
    pub(super) fn runner(&self) -> Option<&R> {
        match &self.run {
            Run::Running { runner, .. } => Some(runner),
            _ => None,
        }
    }

    pub(super) fn running(&self) -> bool {
        matches!(self.run, Run::Running { .. })
    }

    /// What its ServiceAccount may read, while it runs.
    pub(super) fn access(&self) -> Option<&ReadAccess> {
        match &self.run {
            Run::Running { access, .. } => Some(access),
            _ => None,
        }
    }

    /// Why it may not start, while it is refused.
    pub(super) fn refused(&self) -> Option<&Problem> {
        match &self.run {
            Run::Refused(problem) => Some(problem),
            _ => None,
        }
    }

    /// The last good module.
    pub(super) fn guest(&self) -> Option<&G> {
        self.module.guest.as_ref()
    }

    /// The image the last good module was pulled as, if it was.
    pub(super) fn image(&self) -> Option<&str> {
        self.module.image.as_deref()
    }

    /// The version of its source last read.
    pub(super) fn version(&self) -> Option<&Version> {
        self.module.version.as_ref()
    }

    /// Why the newest module is not the one running (or why none runs).
    pub(super) fn module_problem(&self) -> Option<&Problem> {
        self.module.problem.as_ref()
    }

    /// The module of `slot` its last read found being compiled.
    pub(super) fn compiling_in(&self, slot: Slot) -> Option<Digest> {
        match slot {
            Slot::Live => self.module.compiling,
            Slot::Candidate => self.candidate.compiling,
        }
    }

    /// The version of `slot`'s source last read.
    pub(super) fn version_in(&self, slot: Slot) -> Option<&Version> {
        match slot {
            Slot::Live => self.module.version.as_ref(),
            Slot::Candidate => self.candidate.version.as_ref(),
        }
    }

    /// Takes what reading `slot`'s module found.
    pub(super) fn read_in(&mut self, slot: Slot, found: Found<G>) -> Change<G> {
        match slot {
            Slot::Live => self.read(found),
            Slot::Candidate => self.read_candidate(found),
        }
    }

    /// Takes what reading its candidate found: a new one is compared by its runner from its
    /// next reconcile on; one that may not run is compared no more (the status says why); a
    /// source that stops answering keeps the one loaded compared.
    pub(super) fn read_candidate(&mut self, found: Found<G>) -> Change<G> {
        let c = &mut self.candidate;
        c.compiling = match &found {
            Found::Compiling(digest) => Some(*digest),
            Found::Pending => c.compiling,
            _ => None,
        };
        match found {
            Found::Pending | Found::Compiling(_) | Found::Unchanged => Change::Nothing,
            Found::Refused(problem) | Found::Unreachable(problem) => {
                c.problem = Some(problem.clone());
                Change::Failed(problem)
            }
            Found::Loaded {
                version,
                image,
                guest,
            } => {
                c.version = Some(version);
                let guest = match guest {
                    Ok(guest) => guest,
                    Err(problem) => {
                        c.problem = Some(problem.clone());
                        c.guest = None;
                        if let Run::Running { runner, .. } = &self.run {
                            runner.shadow(None);
                        }
                        return Change::Failed(problem);
                    }
                };
                c.problem = None;
                if c.guest.as_ref().map(|g| g.digest()) == Some(guest.digest()) {
                    return Change::Kept;
                }
                c.guest = Some(guest.clone());
                c.image = image;
                if let Run::Running { runner, .. } = &self.run {
                    runner.shadow(Some((guest.clone(), c.image.clone())));
                }
                Change::Swapped(guest)
            }
        }
    }

    /// The candidate loaded, with the image it was pulled as.
    pub(super) fn candidate(&self) -> Option<(&G, Option<&str>)> {
        let c = &self.candidate;
        c.guest.as_ref().map(|g| (g, c.image.as_deref()))
    }

    /// Why no candidate (or not the newest) is compared.
    pub(super) fn candidate_problem(&self) -> Option<&Problem> {
        self.candidate.problem.as_ref()
    }
}

#[cfg(test)]
mod tests;
