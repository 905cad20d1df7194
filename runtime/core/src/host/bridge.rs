//! The API's words and the sandbox's, joined here because neither crate knows the other: a
//! spec's call limits become the sandbox's [`Limits`], a failed call's [`CallError`] the
//! status [`Reason`] conditions, metrics and logs give.

use crate::api::{CallLimits, Reason};
use crate::sandbox::{CallError, Limits};

/// The sandbox's limits for a call of a controller whose spec resolved to `spec` (the limits
/// no spec sets keep the sandbox's defaults).
pub fn call_limits(spec: &CallLimits) -> Limits {
    // Every field named: a limit added to `CallLimits` does not compile until it is passed on.
    let CallLimits {
        memory_bytes,
        timeout,
        actions,
        response_bytes,
        log_bytes,
    } = *spec;
    Limits {
        memory_bytes,
        timeout,
        actions,
        response_bytes,
        log_bytes,
        ..Limits::default()
    }
}

/// The reason a failed reconcile call gives.
pub fn reason_of(error: &CallError) -> Reason {
    match error {
        CallError::Timeout { .. } => Reason::Timeout,
        CallError::MemoryLimitExceeded { .. } => Reason::MemoryLimitExceeded,
        CallError::Panicked { .. } => Reason::Panicked,
        CallError::StackOverflow => Reason::StackOverflow,
        CallError::HostCallLimit { .. } => Reason::HostCallLimitExceeded,
        CallError::InvalidResponse(_) => Reason::InvalidResponse,
        CallError::Trap(_) => Reason::Trapped,
        CallError::Guest { .. } => Reason::ReconcileFailed,
        CallError::Internal(_) => Reason::InternalError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_asking_nothing_runs_with_the_sandboxs_defaults() {
        assert_eq!(call_limits(&CallLimits::default()), Limits::default());
    }
}
