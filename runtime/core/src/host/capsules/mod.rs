//! Capsules: the last few failed reconciles of each controller, kept so that its team can
//! replay one offline, bit for bit (`kubewasm reconcile --capsule FILE`).
//!
//! A capsule holds what the guest was handed and what it read — the request exactly as the
//! sandbox passed it (each object as the JSON text of the cache), the answer to every read the
//! guest made (recorded by [`Recording`] on the way to it, past the grants: nothing the
//! controller's ServiceAccount could not read), the module's digest and declared source, the
//! limits of the call — and the error. Replaying it runs the same module on the same request
//! with the same answers, so a deterministic guest fails the same way.
//!
//! Bounded three ways: a capsule is at most [`MAX_CAPSULE_BYTES`] serialized (past it the
//! reads are left out, then the request: what is left still names the object and the error,
//! and says it cannot be replayed), a controller keeps its last [`CAPSULES_PER_CONTROLLER`],
//! and every capsule is charged to its namespace's account (`--max-capsule-bytes-per-namespace`,
//! the ledger the saved states use): past it the oldest of the controller's own go first, and
//! a capsule that still does not fit is not kept (counted). A controller's capsules go with it.

mod recording;
mod store;

pub use recording::{Recording, Replayed};
pub use store::{CapsuleStore, Capsules, DEFAULT_MAX_CAPSULE_BYTES_PER_NAMESPACE};

use serde::{Deserialize, Serialize};

use crate::api::ModuleSource;
use crate::sandbox::{Limits, ObjectRef, WireRequest};

/// Most bytes of one capsule, serialized.
pub const MAX_CAPSULE_BYTES: usize = 1 << 20;

/// Capsules kept per controller (its latest failures).
pub const CAPSULES_PER_CONTROLLER: usize = 5;

/// The `kind` of a capsule document.
pub const CAPSULE_KIND: &str = "ReconcileCapsule";

/// One failed reconcile, as a document (`kubewasm capsules` writes each to a file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capsule {
    /// `kubewasm.dev/v1alpha1`.
    pub api_version: String,
    /// [`CAPSULE_KIND`].
    pub kind: String,
    /// The controller: `namespace/name` of a WasmController, `name` of a ClusterWasmController.
    pub controller: String,
    /// The reconciled object's key (`namespace/name`).
    pub object: String,
    /// When the reconcile failed (RFC 3339).
    pub failed_at: String,
    /// The module that ran.
    pub module: CapsuleModule,
    /// The limits of the call (`spec.limits` resolved).
    pub limits: CapsuleLimits,
    /// What went wrong.
    pub error: CapsuleError,
    /// The request the guest was handed (`None`: too large to keep).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<CapsuleRequest>,
    /// Every read the guest made, in order, with its answer.
    #[serde(default)]
    pub reads: Vec<RecordedRead>,
    /// Whether the request and every read are in the capsule: only then can it be replayed
    /// bit for bit.
    pub complete: bool,
    /// Why it is not complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
}

/// The limits of a capsule's call ([`Limits`], field for field; durations in milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapsuleLimits {
    /// [`Limits::memory_bytes`].
    pub memory_bytes: usize,
    /// [`Limits::timeout`], in milliseconds.
    pub timeout_ms: u64,
    /// [`Limits::host_calls`].
    pub host_calls: u32,
    /// [`Limits::output_bytes`].
    pub output_bytes: usize,
    /// [`Limits::log_bytes`].
    pub log_bytes: usize,
    /// [`Limits::log_lines`].
    pub log_lines: usize,
    /// [`Limits::response_bytes`].
    pub response_bytes: usize,
    /// [`Limits::actions`].
    pub actions: usize,
}

impl From<Limits> for CapsuleLimits {
    fn from(l: Limits) -> Self {
        CapsuleLimits {
            memory_bytes: l.memory_bytes,
            timeout_ms: u64::try_from(l.timeout.as_millis()).unwrap_or(u64::MAX),
            host_calls: l.host_calls,
            output_bytes: l.output_bytes,
            log_bytes: l.log_bytes,
            log_lines: l.log_lines,
            response_bytes: l.response_bytes,
            actions: l.actions,
        }
    }
}

impl From<CapsuleLimits> for Limits {
    fn from(l: CapsuleLimits) -> Self {
        Limits {
            memory_bytes: l.memory_bytes,
            timeout: std::time::Duration::from_millis(l.timeout_ms),
            host_calls: l.host_calls,
            output_bytes: l.output_bytes,
            log_bytes: l.log_bytes,
            log_lines: l.log_lines,
            response_bytes: l.response_bytes,
            actions: l.actions,
        }
    }
}

/// The module of a capsule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapsuleModule {
    /// `sha256:<hex>` of the component.
    pub digest: String,
    /// The image the module was pulled as, by its manifest's digest
    /// (`registry/repository@sha256:…`), when it came from a registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Where the controller's spec said it comes from.
    pub source: ModuleSource,
}

/// The failure of a capsule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapsuleError {
    /// The status reason (`ReconcileFailed`, `Trapped`, `Timeout`, …).
    pub reason: String,
    /// The message, as the status and the Event said it.
    pub message: String,
    /// `call` (the guest failed) or `apply` (the API server refused an action of its answer:
    /// the replay shows the answer, not the refusal).
    pub stage: Stage,
}

/// Where a reconcile failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Stage {
    /// In the guest (an error it returned, a trap, a timeout, an answer refused).
    Call,
    /// Carrying out the guest's answer.
    Apply,
}

/// The request of a capsule: [`WireRequest`] field for field, each object the exact text the
/// guest was handed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapsuleRequest {
    /// `controller` of the request.
    pub controller: String,
    /// The object the call was about.
    pub target: ObjectRef,
    /// The parent's JSON text (`None`: gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The children's JSON texts.
    #[serde(default)]
    pub children: Vec<String>,
    /// The parent as last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// The saved state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Whether the parent was being finalized.
    #[serde(default)]
    pub finalizing: bool,
}

impl From<&WireRequest> for CapsuleRequest {
    fn from(r: &WireRequest) -> Self {
        CapsuleRequest {
            controller: r.controller.clone(),
            target: r.target.clone(),
            parent: r.parent.clone(),
            children: r.children.clone(),
            previous: r.previous.clone(),
            state: r.state.clone(),
            finalizing: r.finalizing,
        }
    }
}

impl From<CapsuleRequest> for WireRequest {
    fn from(r: CapsuleRequest) -> Self {
        WireRequest {
            controller: r.controller,
            target: r.target,
            parent: r.parent,
            children: r.children,
            previous: r.previous,
            state: r.state,
            finalizing: r.finalizing,
        }
    }
}

/// One read of the guest and its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedRead {
    /// `get` or `list`.
    pub op: ReadOp,
    /// The kind's apiVersion.
    pub api_version: String,
    pub kind: String,
    /// The namespace asked for (`None`: the target's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The name (`get`) or the label selector (`list`) asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The label selector of a `list`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// The objects answered (a `get`: none or one).
    #[serde(default)]
    pub objects: Vec<serde_json::Value>,
    /// The error answered instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ReadError>,
}

/// A read's error, as the guest got it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadError {
    pub message: String,
    /// Whether it was retryable.
    pub retryable: bool,
}

/// A read's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReadOp {
    /// One object by name.
    Get,
    /// Objects by label selector.
    List,
}

impl Capsule {
    /// The capsule serialized, within [`MAX_CAPSULE_BYTES`]: past it the reads are left out,
    /// then the request (saying so in `incomplete`).
    pub fn into_bounded_json(mut self) -> Vec<u8> {
        for step in 0..3 {
            match serde_json::to_vec(&self) {
                Ok(bytes) if bytes.len() <= MAX_CAPSULE_BYTES => return bytes,
                _ => {}
            }
            self.complete = false;
            match step {
                0 => {
                    self.reads.clear();
                    self.incomplete = Some(format!(
                        "its reads' answers took more than the {} KiB a capsule keeps: left out",
                        MAX_CAPSULE_BYTES >> 10
                    ));
                }
                _ => {
                    self.request = None;
                    self.incomplete = Some(format!(
                        "its request took more than the {} KiB a capsule keeps: left out",
                        MAX_CAPSULE_BYTES >> 10
                    ));
                }
            }
        }
        // A capsule without request or reads is a few KiB (the error is bounded).
        serde_json::to_vec(&self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
