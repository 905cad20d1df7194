//! `WasmControllerState`: where the runtime keeps what a controller's guest saved per object
//! (`setState`), in shards, so that a controller may keep state for tens of thousands of
//! objects.
//!
//! Why a kind of the runtime's own, and not the controller's status or ConfigMaps: the status
//! of one object holds at most what etcd takes (1.5 MiB), and every change rewrote all of it;
//! ConfigMaps would need the runtime to write ConfigMaps in every namespace, which is far more
//! than it needs (a tenant's ConfigMaps are its own). With this kind the runtime writes only
//! objects of this kind; a tenant reads its controllers' state with `kubectl get
//! wasmcontrollerstates -o yaml` wherever it may read its namespace (the `view` role is
//! extended to it in `deploy/runtime/rbac.yaml`).

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One shard of one controller's saved states. Named `<prefix>-<NN>` (the prefix from the
/// controller's kind and name, [`state_prefix`]), labelled [`STATE_OF_LABEL`], owned by the
/// controller (deleted with it), in the controller's namespace (a ClusterWasmController's: the
/// runtime's namespace).
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubewasm.dev",
    version = "v1alpha1",
    kind = "WasmControllerState",
    namespaced,
    shortname = "wcstate",
    printcolumn = r#"{"name":"Controller","type":"string","jsonPath":".spec.controller"}"#,
    printcolumn = r#"{"name":"Shard","type":"integer","jsonPath":".spec.shard"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[kube(derive = "PartialEq")]
#[serde(rename_all = "camelCase")]
pub struct WasmControllerStateSpec {
    /// The controller whose guest saved these: `WasmController/<name>` or
    /// `ClusterWasmController/<name>`.
    #[schemars(length(max = 300))]
    pub controller: String,
    /// Which of the controller's shards this is: an object's key belongs to shard
    /// `sha256(key) mod 32`.
    pub shard: u32,
    /// The saved state per object key (`namespace/name`, or `name` when cluster-scoped):
    /// written by the runtime, many keys per write, never by hand.
    #[serde(default)]
    #[schemars(extend("additionalProperties" = {"type": "string", "maxLength": 512}))]
    pub entries: BTreeMap<String, String>,
}

/// The label on every shard of a controller's state: its value is [`state_prefix`]'s hash.
pub const STATE_OF_LABEL: &str = "kubewasm.dev/state-of";

/// The name prefix and label value of the shards of controller `kind`/`name` (kind
/// `WasmController` or `ClusterWasmController`): `state-` and 20 hex digits of the sha256 of
/// `kind/name`, so that every name fits, whatever the controller's.
pub fn state_prefix(kind: &str, name: &str) -> String {
    use sha2::{Digest as _, Sha256};
    let hash = Sha256::digest(format!("{kind}/{name}").as_bytes());
    let hex: String = hash[..10].iter().map(|b| format!("{b:02x}")).collect();
    format!("state-{hex}")
}
