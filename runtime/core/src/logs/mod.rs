//! Each controller's log lines, kept in memory and read by its team through the Kubernetes
//! API with the team's own credentials: the guest's `log` lines, its output, its panics and
//! the runtime's lines about it ([`RingLayer`] copies them into a [`LogStore`]), served as the
//! `wasmcontrollers/log` subresource of the API group `logs.kubewasm.dev` ([`serve`]),
//! authorized by RBAC like `pods/log`.

mod layer;
mod ring;
pub mod serve;

pub use layer::RingLayer;
pub use ring::{
    ControllerKey, DEFAULT_NAMESPACE_BYTES, DEFAULT_RING_BYTES, LINE_OVERHEAD, Line, LogStore,
    MAX_LINE_BYTES, Read, Selection,
};
