//! What can go wrong loading a guest or running one reconcile, in words a user can act on.

use std::time::Duration;

/// A module could not be turned into a runnable guest.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The bytes do not start with the WebAssembly magic number.
    #[error(
        "not a WebAssembly file (it does not start with `\\0asm`); build the guest with `cargo build --target wasm32-wasip2`"
    )]
    NotWasm,
    /// A core module where a component was expected.
    #[error(
        "this is a core WebAssembly module, not a component; build the guest with `--target wasm32-wasip2` (WASI 0.2 components), not wasm32-wasip1 or wasm32-unknown-unknown"
    )]
    NotAComponent,
    /// The module is larger than allowed.
    #[error("module is {size} bytes, more than the limit of {limit} bytes")]
    TooLarge {
        /// Size of the module.
        size: usize,
        /// Largest accepted size.
        limit: usize,
    },
    /// The component passes strings in UTF-16 or Latin-1: the host would transcode every
    /// string into its own memory before it could check its length.
    #[error(
        "the component passes strings as {encoding} (a canonical option of one of its functions): kubewasm takes UTF-8 strings only, so that no string is copied before its length is checked; build it with a toolchain that uses UTF-8 (Rust, componentize-py and wit-bindgen do by default)"
    )]
    StringEncoding {
        /// The encoding found.
        encoding: &'static str,
    },
    /// wasmtime could not compile the component.
    #[error("the component does not compile: {0:#}")]
    Compile(#[source] wasmtime::Error),
    /// The compiler process crashed or met one of its limits on this module: the module's
    /// doing, every time it is compiled.
    #[error("compiling the module {why}")]
    CompileCrashed {
        /// How the compile ended, and the limit it met.
        why: String,
    },
    /// The component is valid but is not a kubewasm controller.
    #[error(
        "not a kubewasm controller (world `kubewasm:controller/controller@0.3.0`): {0:#}; build it against the current kubewasm-guest-sdk (a module built for an earlier contract, 0.1.0 or 0.2.0, must be rebuilt) and export a reconciler"
    )]
    WrongWorld(#[source] wasmtime::Error),
    /// The engine could not be set up.
    #[error("could not set up the WebAssembly engine: {0:#}")]
    Engine(#[source] wasmtime::Error),
}

/// One reconcile call failed. The runtime is unharmed by any of these.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The guest ran past its time limit and was interrupted.
    #[error("timed out: the guest ran longer than its limit of {limit:?} and was stopped")]
    Timeout {
        /// The time limit.
        limit: Duration,
    },
    /// The guest tried to grow its memory past the limit.
    #[error("memory limit exceeded: the guest tried to use more than {limit} bytes")]
    MemoryLimitExceeded {
        /// The memory limit in bytes.
        limit: usize,
    },
    /// The guest panicked.
    #[error("guest panicked{}", .message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Panicked {
        /// The panic message the guest printed, when it printed one.
        message: Option<String>,
    },
    /// The guest's call stack overflowed (usually unbounded recursion).
    #[error("stack overflow: the guest recursed too deeply")]
    StackOverflow,
    /// The guest made more host reads than allowed in one call.
    #[error(
        "host call limit exceeded: the guest made more than {limit} get/list calls in one reconcile"
    )]
    HostCallLimit {
        /// The number of reads allowed.
        limit: u32,
    },
    /// The guest returned something that is not a valid response.
    #[error("invalid response: {0}")]
    InvalidResponse(String),
    /// The guest trapped for another reason.
    #[error("guest trapped: {0}")]
    Trap(String),
    /// The guest returned an error of its own.
    #[error("reconcile failed: {message}")]
    Guest {
        /// What the guest said.
        message: String,
        /// Whether the guest thinks a retry may succeed.
        retryable: bool,
    },
    /// The runtime could not run the call at all.
    #[error("could not run the guest: {0}")]
    Internal(String),
}

impl CallError {
    /// Whether trying the same call again may succeed. Guest errors say so themselves;
    /// traps are retried with backoff since the observed state may change.
    pub fn retryable(&self) -> bool {
        match self {
            CallError::Guest { retryable, .. } => *retryable,
            _ => true,
        }
    }
}

/// Marker error a host import returns to stop a guest that read too much.
#[derive(Debug, thiserror::Error)]
#[error("host call limit of {0} exceeded")]
pub(crate) struct HostCallLimitHit(pub(crate) u32);
