//! Where a controller is in its life, as one value ([`Phase`]), read from what the manager
//! holds of it: which of its problems wins, and what "starting" means, are decided here once
//! for the status and the loop.
//!
//! ```text
//!   declared ──read module──▶ Compiling ──compiled──▶ (set up) ──▶ Running
//!      │                         │                        │           │
//!      └──── ModuleFailed ◀──────┘                        └─▶ Refused ◀┘ (access lost)
//! ```
//!
//! A running controller stays [`Phase::Running`] with its last good module when a new one
//! fails (the status says so); one refused is tried again on its backoff; one whose module
//! failed is read again when its source changes (or its poll comes round).

use crate::api::Problem;
use crate::host::Runner;
use crate::sandbox::Digest;

use super::Managed;

/// See the module doc.
#[derive(Clone, Copy)]
pub(super) enum Phase<'a> {
    /// Its runner reconciles (with the last good module, whatever a newer one did).
    Running(&'a Runner),
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

impl Managed {
    /// The controller's [`Phase`].
    pub(super) fn phase(&self) -> Phase<'_> {
        match (
            &self.runner,
            &self.setup_problem,
            &self.module_problem,
            self.compiling,
        ) {
            (Some((runner, _)), ..) => Phase::Running(runner),
            (None, Some(problem), ..) => Phase::Refused(problem),
            (None, None, Some(problem), _) => Phase::ModuleFailed(problem),
            (None, None, None, Some(digest)) => Phase::Compiling(digest),
            (None, None, None, None) => Phase::Starting,
        }
    }
}
