//! kubewasm's runtime: runs Kubernetes controllers as sandboxed WebAssembly components. The
//! `kubewasm` command (`runtime/`) runs it; this crate knows nothing of the command.
//!
//! - [`sandbox`] knows wasmtime only: compiles guests, runs one reconcile per fresh Store.
//! - [`api`] is the `kubewasm.dev/v1alpha1` API (`WasmController`, `ClusterWasmController`).
//! - [`host`] joins them: grants, guest reads, actions turned into API calls.
//! - [`logs`] keeps each controller's log lines and serves them to its team (RBAC).
//! - [`sources`] fetches modules from where a spec says they are (one seam for every source).
//! - [`controller`] is the plumbing beside kube: shared watches, the queue, fair writes, shards.
//! - [`manager`] keeps the declared controllers running (modules, setups, statuses).
//! - [`metrics`] is what `/metrics` says.

// Nothing a tenant writes (a spec, an object, a module, a guest's answer) may reach a panic:
// each remaining `expect` says in an `allow` why no input can reach it; tests may panic.
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub use kubewasm_api as api;
pub use kubewasm_sandbox as sandbox;
pub use kubewasm_sources as sources;
// Small helpers of the bottom floor that every floor uses.
pub use kubewasm_sandbox::{disk, sync};
pub mod controller;
pub mod host;
pub mod logs;
pub mod manager;
pub mod metrics;
