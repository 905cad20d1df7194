//! The error a reconcile returns when it cannot decide what to do.

use std::fmt;

/// Why a reconcile failed, and whether the host should retry it.
///
/// A *retryable* error makes the host back off and call `reconcile` again for the same
/// object; a *permanent* one is recorded in the controller's status and waits for the object
/// (or the controller) to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// What went wrong, for people reading the controller's status.
    pub message: String,
    /// Whether trying again later may succeed.
    pub retryable: bool,
}

impl Error {
    /// A failure that may go away by itself (a read that was refused or timed out, ...).
    pub fn retryable(message: impl Into<String>) -> Self {
        Error {
            message: message.into(),
            retryable: true,
        }
    }

    /// A failure that retrying with the same input cannot fix (an invalid spec, ...).
    pub fn permanent(message: impl Into<String>) -> Self {
        Error {
            message: message.into(),
            retryable: false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// An object that does not have the expected shape will not get better by retrying.
impl From<serde_json::Error> for Error {
    fn from(err: serde_json::Error) -> Self {
        Error::permanent(format!("invalid JSON: {err}"))
    }
}

/// An invalid label selector is a mistake in the input, not a passing failure.
impl From<crate::selector::ParseError> for Error {
    fn from(err: crate::selector::ParseError) -> Self {
        Error::permanent(err.to_string())
    }
}
