//! The WebAssembly sandbox: compiles guests, runs one reconcile per fresh Store, maps traps.
//!
//! Knows wasmtime and serde only; Kubernetes reaches it as JSON through [`Reads`].

// Nothing a tenant writes (a module, a guest's answer) may reach a panic: each remaining
// `expect` says in an `allow` why no input can reach it; tests may panic.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod accept;
mod ahead;
mod bindings;
mod call;
mod compiled;
mod compiler;
mod digest;
pub mod disk;
mod engine;
mod error;
mod limits;
mod output;
mod pool;
mod rate;
mod slots;
pub mod sync;
mod text;
mod types;

pub use ahead::{MAKE_DEADLINE, READY_IDLE, Ready, Tidy};
pub use call::{CallOutcome, Phases};
pub use compiled::{Compilations, CompiledCache};
pub use compiler::{ChildCompiler, child_main, compilers_cpu};
pub use digest::Digest;
pub use engine::{GuestPre, Sandbox, SandboxConfig};
pub use error::{CallError, LoadError};
pub use limits::{Limits, MAX_GUEST_STATE_BYTES};
pub use output::Captured;
pub use output::MIN_LOG_LINE_COST;
pub use pool::PageReset;
pub use rate::TenantRate;
pub use text::{
    MAX_EVENT_REASON_BYTES, MAX_GUEST_LOG_LINE_BYTES, MAX_GUEST_MESSAGE_BYTES, bounded, guest_text,
};
pub use types::{
    Action, Error, EventType, IntoWire, NoReads, ObjectRef, Reads, Request, Response, SharedReads,
    WireRequest, decode_response, parse_time, request_to_wire, requeue_delay,
};
