//! The one vocabulary of reasons: status conditions, the `Degraded` reason of a failed
//! reconcile, the `outcome` label of the reconcile metric and the `reason` field of logs; and
//! [`Problem`], a reason with its sentence, the one failure type of setups and reconciles.

use std::fmt;

/// Why a condition is what it is, or why a reconcile failed. Shown as its CamelCase name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    // `ModuleReady`
    /// The module is loaded and running.
    ModuleLoaded,
    /// No module has been loaded yet.
    ModuleNotLoaded,
    /// The module's ConfigMap, key or file is missing or unreadable.
    ModuleNotFound,
    /// The module is not a valid kubewasm component.
    ModuleInvalid,
    /// The module's sha256 is not the pinned one.
    DigestMismatch,
    /// The namespace already runs as many distinct modules as the operator allows.
    TooManyModules,
    /// A runtime stopped while compiling this module: it is not compiled again.
    Quarantined,
    /// The namespace compiled as many new modules as the operator allows per hour.
    CompileBudgetExceeded,
    /// The image's digest is not signed by a key the runtime trusts (`--verify-key`).
    SignatureInvalid,
    // `Ready`
    /// Reconciling.
    Running,
    /// Not started yet.
    Starting,
    /// Waiting for the first list of a watched kind.
    WaitingForCaches,
    /// A declared kind is not served by the API server.
    KindNotFound,
    /// The spec asks for something not allowed.
    InvalidSpec,
    /// The operator does not allow watching a declared kind.
    NotWatchable,
    /// The ServiceAccount may not read a kind it would be handed.
    Forbidden,
    /// The API server could not answer a SubjectAccessReview.
    AccessReviewFailed,
    /// No client could be made for the ServiceAccount.
    ClientError,
    /// The module is not ready (see `ModuleReady`).
    ModuleNotReady,
    /// Setting the controller up (discovery, access reviews) took longer than its deadline.
    SetupTimedOut,
    /// The namespace already has as many controllers as the operator allows.
    TooManyControllers,
    /// The namespace's objects take more of the runtime's caches than the operator allows:
    /// they are held back from every controller.
    CacheBudgetExceeded,
    /// The controller's saved states (WasmControllerState) could not be read.
    StateUnavailable,
    /// A save of state would take the controller's states past its quota
    /// (`--max-state-bytes-per-controller`) or its namespace's past the operator's cap
    /// (`--max-state-bytes-per-namespace`).
    StateBudgetExceeded,
    // `Degraded`
    /// The last reconciles succeeded.
    ReconcilesSucceeding,
    /// A reconcile ran past its time limit.
    Timeout,
    /// A reconcile tried to use more memory than its limit.
    MemoryLimitExceeded,
    /// The guest panicked.
    Panicked,
    /// The guest overflowed its call stack.
    StackOverflow,
    /// The guest made more host calls than allowed.
    HostCallLimitExceeded,
    /// The guest's response was malformed or past a limit.
    InvalidResponse,
    /// The guest trapped for another reason.
    Trapped,
    /// The guest returned an error of its own.
    ReconcileFailed,
    /// The runtime failed (a bug, or the host ran out of something).
    InternalError,
    /// An action was refused by the declaration or failed at the API server.
    ActionFailed,
}

impl Reason {
    /// The CamelCase name, as conditions show it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::ModuleLoaded => "ModuleLoaded",
            Reason::ModuleNotLoaded => "ModuleNotLoaded",
            Reason::ModuleNotFound => "ModuleNotFound",
            Reason::ModuleInvalid => "ModuleInvalid",
            Reason::DigestMismatch => "DigestMismatch",
            Reason::TooManyModules => "TooManyModules",
            Reason::Quarantined => "Quarantined",
            Reason::CompileBudgetExceeded => "CompileBudgetExceeded",
            Reason::SignatureInvalid => "SignatureInvalid",
            Reason::Running => "Running",
            Reason::Starting => "Starting",
            Reason::WaitingForCaches => "WaitingForCaches",
            Reason::KindNotFound => "KindNotFound",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::NotWatchable => "NotWatchable",
            Reason::Forbidden => "Forbidden",
            Reason::AccessReviewFailed => "AccessReviewFailed",
            Reason::ClientError => "ClientError",
            Reason::ModuleNotReady => "ModuleNotReady",
            Reason::SetupTimedOut => "SetupTimedOut",
            Reason::TooManyControllers => "TooManyControllers",
            Reason::CacheBudgetExceeded => "CacheBudgetExceeded",
            Reason::StateUnavailable => "StateUnavailable",
            Reason::StateBudgetExceeded => "StateBudgetExceeded",
            Reason::ReconcilesSucceeding => "ReconcilesSucceeding",
            Reason::Timeout => "Timeout",
            Reason::MemoryLimitExceeded => "MemoryLimitExceeded",
            Reason::Panicked => "Panicked",
            Reason::StackOverflow => "StackOverflow",
            Reason::HostCallLimitExceeded => "HostCallLimitExceeded",
            Reason::InvalidResponse => "InvalidResponse",
            Reason::Trapped => "Trapped",
            Reason::ReconcileFailed => "ReconcileFailed",
            Reason::InternalError => "InternalError",
            Reason::ActionFailed => "ActionFailed",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why something is not working or failed: a reason and a sentence that says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Why, for conditions, metrics and logs.
    pub reason: Reason,
    /// What is wrong and what to do.
    pub message: String,
}

impl Problem {
    /// A problem.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        Problem {
            reason,
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}
