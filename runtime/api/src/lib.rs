//! The `kubewasm.dev/v1alpha1` API: `WasmController`, `ClusterWasmController`, and the
//! runtime's own `WasmControllerState`.
//!
//! The CRD manifests in `deploy/crds/` are generated from these types
//! (`kubewasm crds > deploy/crds/kubewasm.dev.yaml`); a test fails when they drift.

#![warn(missing_docs)]

mod limits;
mod plan;
mod quantity;
mod reason;
pub mod rollout;
mod source;
mod state;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use limits::{
    CallLimits, LimitCaps, Resolved, SPEC_LIMITS, SpecLimit, Unit, limits_description, readme_rows,
};
pub use plan::{ControllerPlan, KindName, MAX_DECLARED_KINDS, Plan, Rollout};
pub use quantity::parse_bytes;
pub use reason::{Problem, Reason};
pub use source::{
    CLUSTER_ONLY_SOURCES, ImageRef, MAX_IMAGE_REFERENCE_BYTES, Source, source_fields,
};
pub use state::{STATE_OF_LABEL, WasmControllerState, WasmControllerStateSpec, state_prefix};

/// What the CRD schema lets through as an `apiVersion`: `VERSION` or `GROUP/VERSION`, the
/// group a DNS subdomain and the version a DNS label. The API server checks it before the
/// runtime sees a spec; the runtime parses it again with `GroupVersion::parse`, which also
/// bounds each label.
pub const API_VERSION_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// What the CRD schema lets through as a kind (`validate_kind`).
pub const KIND_PATTERN: &str = r"^[A-Za-z][A-Za-z0-9]*$";

/// A DNS subdomain: ServiceAccount and ConfigMap names.
pub const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// A DNS label: namespaces.
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// A ConfigMap key.
pub const CONFIG_MAP_KEY_PATTERN: &str = r"^[-._a-zA-Z0-9]+$";

/// A controller whose reconcile function is a WebAssembly component, in one namespace.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubewasm.dev",
    version = "v1alpha1",
    kind = "WasmController",
    namespaced,
    status = "WasmControllerStatus",
    shortname = "wc",
    printcolumn = r#"{"name":"Parent","type":"string","jsonPath":".spec.parent.kind"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Module","type":"string","jsonPath":".status.moduleDigest","priority":1}"#,
    printcolumn = r#"{"name":"Replica","type":"string","jsonPath":".status.replica","priority":1}"#,
    printcolumn = r#"{"name":"Reconciles","type":"integer","jsonPath":".status.reconciles"}"#,
    printcolumn = r#"{"name":"Failures","type":"integer","jsonPath":".status.failures"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Last Error","type":"string","jsonPath":".status.lastError"}"#
)]
#[kube(derive = "PartialEq")]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WasmControllerSpec {
    /// Where the guest's `.wasm` component comes from.
    pub module: ModuleSource,
    /// The kind this controller reconciles: one reconcile per object of this kind.
    pub parent: ParentResource,
    /// Kinds this controller creates and owns (composite controllers). Children get a
    /// controller ownerReference to their parent and are deleted when no longer desired.
    /// Parent, children and grants name at most 32 kinds together.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub children: Vec<ChildResource>,
    /// Other kinds the guest may read or act on, and how. Anything not granted here (or as
    /// parent/children) is denied before it reaches the API server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub grants: Vec<Grant>,
    /// The ServiceAccount (in this namespace) whose identity every write uses; Kubernetes
    /// RBAC for that account is the final judge. Defaults to `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253), pattern(DNS_SUBDOMAIN_PATTERN))]
    pub service_account_name: Option<String>,
    /// Only for ClusterWasmControllers: the namespace of the ServiceAccount it acts as.
    /// Defaults to its module ConfigMap's namespace; a ClusterWasmController whose module is a
    /// file must give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), pattern(DNS_LABEL_PATTERN))]
    pub service_account_namespace: Option<String>,
    /// Resource limits for each reconcile call.
    #[serde(default)]
    pub limits: ControllerLimits,
    /// Reconcile every parent at least this often, even without changes. Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_period_seconds: Option<u32>,
    /// Put this controller's finalizer on its parents: a parent being deleted waits until the
    /// guest, called with `finalizing`, answers `finalized`. The ServiceAccount needs `patch`
    /// on the parents. Deleting the controller (or turning this off) removes its finalizers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub finalize: bool,
    /// A module run in shadow beside `module`, from any source a module may come from: on
    /// the reconciles sampled (`rollout.sampleEvery`) it gets the same request as the live
    /// module, reads through the same grants, and its answer is compared with the live one's;
    /// nothing it answers is carried out (its state writes go nowhere: it is handed the live
    /// state). `status.rollout` counts what was compared and shows the last differences;
    /// `kubewasm rollout promote` makes it the module, `kubewasm rollout abort` removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<ModuleSource>,
    /// How the candidate is compared and promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutPolicy>,
}

/// How a candidate module is compared and promoted (`spec.rollout`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutPolicy {
    /// Compare one reconcile in this many (default 1: every reconcile); the others run the
    /// live module alone. A busy controller's candidate costs `1/sampleEvery` of its calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub sample_every: Option<u32>,
    /// Promote the candidate by itself once this many reconciles were compared with no
    /// difference: the runtime changes the spec as `kubewasm rollout promote` does, as the
    /// controller's ServiceAccount, which needs `patch` on this WasmController (the status
    /// says when it may not). Unset: only a person promotes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub promote_after: Option<u32>,
}

/// A cluster-wide controller, declared by an administrator. Same spec; parents in every
/// namespace are watched and the module's ConfigMap must name its namespace.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubewasm.dev",
    version = "v1alpha1",
    kind = "ClusterWasmController",
    status = "WasmControllerStatus",
    shortname = "cwc",
    printcolumn = r#"{"name":"Parent","type":"string","jsonPath":".spec.parent.kind"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Replica","type":"string","jsonPath":".status.replica","priority":1}"#,
    printcolumn = r#"{"name":"Reconciles","type":"integer","jsonPath":".status.reconciles"}"#,
    printcolumn = r#"{"name":"Failures","type":"integer","jsonPath":".status.failures"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Last Error","type":"string","jsonPath":".status.lastError"}"#
)]
#[kube(derive = "PartialEq")]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterWasmControllerSpec {
    /// The same fields as a WasmController's spec.
    #[serde(flatten)]
    pub controller: WasmControllerSpec,
}

/// Where a module comes from: exactly one of `configMap`, `path` or `image`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModuleSource {
    /// A key of a ConfigMap's `binaryData` (or `data`) holding the component, optionally gzipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKey>,
    /// A file inside the runtime's filesystem, e.g. a ConfigMap mounted as a volume; only for
    /// ClusterWasmControllers, and only under the operator's `kubewasm run --module-dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub path: Option<String>,
    /// An OCI artifact in a registry (the CNCF wasm layout, as `kubewasm push` makes it):
    /// `registry/repository:tag`, `registry/repository@sha256:<hex>` or both (the digest wins).
    /// A tag is resolved again every `--module-poll-seconds`, and a moved tag rolls the
    /// controller forward; a digest never changes. The registry must be named (no implicit
    /// `docker.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512), pattern(IMAGE_REFERENCE_PATTERN))]
    pub image: Option<String>,
    /// Only with `image`: a `kubernetes.io/dockerconfigjson` Secret of the controller's
    /// namespace (a ClusterWasmController: its ServiceAccount's namespace) with credentials
    /// for the image's registry. It is read as the controller's ServiceAccount, which needs
    /// `get` on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253), pattern(DNS_SUBDOMAIN_PATTERN))]
    pub image_pull_secret: Option<String>,
    /// If set, the module is only loaded when its sha256 (hex, after gunzip) matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 71))]
    pub sha256: Option<String>,
}

/// What the CRD schema lets through as `spec.module.image`: printable, no spaces (the runtime
/// parses it with its registry client's grammar).
pub const IMAGE_REFERENCE_PATTERN: &str = r"^[!-~]+$";

/// One key of one ConfigMap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigMapKey {
    /// ConfigMap name.
    #[schemars(length(max = 253), pattern(DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
    /// Key inside `binaryData` or `data`.
    #[schemars(length(max = 253), pattern(CONFIG_MAP_KEY_PATTERN))]
    pub key: String,
    /// Namespace of the ConfigMap; only for ClusterWasmControllers (a WasmController always
    /// reads from its own namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), pattern(DNS_LABEL_PATTERN))]
    pub namespace: Option<String>,
}

/// The watched kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ParentResource {
    /// e.g. `example.com/v1`.
    #[schemars(length(max = 317), pattern(API_VERSION_PATTERN))]
    pub api_version: String,
    /// e.g. `HelloWorld`.
    #[schemars(length(max = 63), pattern(KIND_PATTERN))]
    pub kind: String,
    /// Only parents whose labels match, e.g. `tier=web` (at most 4096 bytes and 64
    /// requirements).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub label_selector: Option<String>,
}

impl ParentResource {
    /// `labelSelector`, parsed by the one parser guests' selectors use too; the error names
    /// the field and says what is wrong (the runtime's setup and `kubewasm reconcile` both
    /// read the selector here).
    pub fn selector(&self) -> Result<Option<kubewasm_guest_sdk::selector::Selector>, String> {
        let Some(text) = &self.label_selector else {
            return Ok(None);
        };
        kubewasm_guest_sdk::selector::Selector::parse(text)
            .map(Some)
            .map_err(|e| format!("spec.parent.labelSelector `{text}`: {e}"))
    }
}

/// An owned child kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ChildResource {
    /// e.g. `v1`.
    #[schemars(length(max = 317), pattern(API_VERSION_PATTERN))]
    pub api_version: String,
    /// e.g. `Pod`.
    #[schemars(length(max = 63), pattern(KIND_PATTERN))]
    pub kind: String,
    /// What to do when an existing child differs from the desired one.
    #[serde(default)]
    pub update_strategy: UpdateStrategy,
}

/// How a changed child is updated (as in Metacontroller).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum UpdateStrategy {
    /// Leave existing children alone; only create missing ones.
    OnDelete,
    /// Delete a changed child and create it anew (for immutable kinds such as Pods).
    Recreate,
    /// Update the child in place with server-side apply.
    #[default]
    InPlace,
}

/// Permission for the guest to use a kind beyond its parent and children.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Grant {
    /// e.g. `v1`.
    #[schemars(length(max = 317), pattern(API_VERSION_PATTERN))]
    pub api_version: String,
    /// e.g. `Pod`.
    #[schemars(length(max = 63), pattern(KIND_PATTERN))]
    pub kind: String,
    /// Any of `get`, `list`, `apply`, `delete`.
    #[schemars(length(max = 4))]
    pub verbs: Vec<Verb>,
}

/// What a grant allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Verb {
    /// Read one object.
    Get,
    /// List objects.
    List,
    /// Create or update with server-side apply.
    Apply,
    /// Delete one object or all matching a selector.
    Delete,
}

/// Per-call limits; their defaults, caps and clamps are one table, `limits::SPEC_LIMITS`
/// (the CRD's description of this field is made from it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ControllerLimits {
    /// Memory per reconcile, as a Kubernetes quantity (`64Mi`, `128M`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub memory: Option<String>,
    /// Time per reconcile in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3_600_000))]
    pub timeout_millis: Option<u32>,
    /// Reconciles of this controller that may run at once (different objects).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub concurrency: Option<u32>,
    /// Most actions in one response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub actions: Option<u32>,
    /// Largest response document per reconcile, as a quantity (`1Mi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub response_bytes: Option<String>,
    /// Bytes of host `log` lines kept per reconcile, as a quantity (`64Ki`); the rest is
    /// counted and dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub log_bytes: Option<String>,
}

/// What the runtime observed about a controller.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WasmControllerStatus {
    /// `ModuleReady`, `Ready` and `Degraded`, with reasons a person can act on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Digest of the module now running (`sha256:…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_digest: Option<String>,
    /// The spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The revision of the module's source that the runtime last judged, loaded or refused
    /// (`ModuleReady` says which): a ConfigMap's resourceVersion, an image's manifest digest, a
    /// file's module digest. `kubewasm wait` compares it with the source as it is now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub module_revision: Option<String>,
    /// The runtime replica running the controller (`kubewasm run --leader-elect`: its
    /// identity, the Pod's name and a suffix of the process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// The shard its tenant belongs to: the Lease in the runtime's namespace whose holder runs
    /// it (`kubectl get leases -n kubewasm-system`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
    /// Reconcile calls made since the runtime started.
    #[serde(default)]
    pub reconciles: u64,
    /// Reconcile calls that failed since the runtime started.
    #[serde(default)]
    pub failures: u64,
    /// The latest failure among the objects failing now (cleared once none is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// How many objects are failing now (their last reconcile failed).
    #[serde(default)]
    pub failing: u64,
    /// The objects failing now, the latest failure first, at most 5 (always written, so that
    /// an emptied list replaces the last one). Their capsules replay them offline
    /// (`kubewasm capsules`, `kubewasm reconcile --capsule`).
    #[serde(default)]
    #[schemars(length(max = 5))]
    pub failing_objects: Vec<String>,
    /// Parents being deleted that wait for this controller's clean-up (`spec.finalize`), at
    /// most 16 listed (always written, so that an emptied list replaces the last one).
    #[serde(default)]
    #[schemars(length(max = 17))]
    pub finalizing: Vec<String>,
    /// Where runtimes before WasmControllerState kept the guest's saved state: read once
    /// when the controller starts, moved into its WasmControllerState objects, and removed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 256, "additionalProperties" = {"type": "string", "maxLength": 512}))]
    pub guest_state: BTreeMap<String, String>,
    /// The candidate module's shadow run (`spec.candidate`), while one is declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
}

/// What the candidate's shadow run found (`status.rollout`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// Digest of the candidate module compared (`sha256:…`), with the image it was pulled as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub candidate: Option<String>,
    /// Why no candidate runs (its source, its bytes, its compile), while none does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub problem: Option<String>,
    /// Reconciles whose answers were compared since this candidate ran.
    #[serde(default)]
    pub compared: u64,
    /// Of those, the ones where the candidate's answer differed (or it failed where the live
    /// module did not, or the other way round).
    #[serde(default)]
    pub differing: u64,
    /// The last differences, the latest first, at most 3 (always written, so that an emptied
    /// list replaces the last one); all of the last reconciles' with `kubewasm rollout diff`.
    #[serde(default)]
    #[schemars(length(max = 3))]
    pub last_differences: Vec<ShadowDifference>,
}

/// How one compared reconcile differed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShadowDifference {
    /// The object reconciled (`namespace/name`).
    #[schemars(length(max = 512))]
    pub object: String,
    /// Each difference, one line each: what the live module does and what the candidate
    /// would, by object and field (at most 8 lines, each bounded).
    #[schemars(length(max = 9))]
    pub changes: Vec<String>,
}

impl WasmControllerSpec {
    /// Resync period, default five minutes.
    pub fn resync_period(&self) -> Duration {
        Duration::from_secs(self.resync_period_seconds.unwrap_or(300).max(1).into())
    }
}

/// Why a `WasmController` may not name a module file, in its CRD and in its status.
pub const NO_MODULE_FILES: &str = "a WasmController may not load a module from a file of the runtime (spec.module.path): put the module in a ConfigMap of its namespace (spec.module.configMap); only a ClusterWasmController may name a file, under the operator's --module-dir";

/// All CRDs of the API as one multi-document YAML stream (for `kubewasm crds`: built from
/// the Rust types alone, so its `expect`s are about this code, never about a tenant's input).
///
/// The two kinds share one spec type; their schemas differ where the API server itself
/// must refuse: a `WasmController` takes no `spec.module.path` (the 1.20 API server has no
/// CEL, so `maxLength: 0` does it) and needs exactly one of `configMap` and `image`; a
/// `ClusterWasmController` needs exactly one of the three (`oneOf` of `required`, which a
/// structural schema allows). Both `oneOf` lists are made from [`source_fields`], the
/// fields of [`ModuleSource`] the parse reads too.
#[allow(clippy::expect_used)]
pub fn crds_yaml() -> String {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
    use kube::CustomResourceExt;
    let required = |field: &str| JSONSchemaProps {
        required: Some(vec![field.to_owned()]),
        ..JSONSchemaProps::default()
    };
    let mut namespaced = WasmController::crd();
    with_module_schema(&mut namespaced, |module| {
        for field in CLUSTER_ONLY_SOURCES {
            if let Some(path) = module.properties.as_mut().and_then(|p| p.get_mut(field)) {
                path.max_length = Some(0);
                path.description = Some(format!("Must be empty: {NO_MODULE_FILES}."));
            }
        }
        let allowed = source_fields().iter();
        let allowed = allowed.filter(|f| !CLUSTER_ONLY_SOURCES.contains(&f.as_str()));
        module.one_of = Some(allowed.map(|f| required(f)).collect());
    });
    let mut cluster = ClusterWasmController::crd();
    with_module_schema(&mut cluster, |module| {
        module.one_of = Some(source_fields().iter().map(|f| required(f)).collect());
    });
    // The candidate is a module source like `module`, with the same union.
    for crd in [&mut namespaced, &mut cluster] {
        let module = module_schema(crd);
        with_spec_field(crd, "candidate", |candidate| {
            let description = candidate.description.take();
            *candidate = module.clone();
            candidate.description = description;
        });
    }
    for crd in [&mut namespaced, &mut cluster] {
        with_spec_field(crd, "limits", |limits| {
            limits.description = Some(limits_description());
        });
    }
    [namespaced, cluster, WasmControllerState::crd()]
        .iter()
        .map(|crd| serde_yaml::to_string(crd).expect("CRDs serialise"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The schema of `spec.module`, as edited.
#[allow(clippy::expect_used)]
fn module_schema(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps {
    crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|root| root.properties.as_ref()?.get("spec"))
        .and_then(|spec| spec.properties.as_ref()?.get("module"))
        .cloned()
        .expect("the generated CRD has spec.module")
}

fn with_module_schema(
    crd: &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    edit: impl Fn(
        &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps,
    ),
) {
    with_spec_field(crd, "module", edit);
}

#[allow(clippy::expect_used)]
fn with_spec_field(
    crd: &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    field: &str,
    edit: impl Fn(
        &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps,
    ),
) {
    for version in &mut crd.spec.versions {
        let schema = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|root| root.properties.as_mut()?.get_mut("spec"))
            .and_then(|spec| spec.properties.as_mut()?.get_mut(field))
            .expect("the generated CRD has the spec field");
        edit(schema);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crds_union_is_every_source_field_of_the_spec() {
        assert_eq!(source_fields(), ["configMap", "image", "path"]);
        let one_of_field = |crd: &str, field: &str| -> Vec<String> {
            let yaml = crds_yaml();
            let doc = yaml
                .split("---\n")
                .find(|d| d.contains(&format!("kind: {crd}\n")))
                .unwrap();
            let crd: serde_json::Value = serde_yaml::from_str(doc).unwrap();
            let module = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                ["properties"][field];
            let one_of = module["oneOf"].as_array().unwrap();
            one_of
                .iter()
                .map(|r| r["required"][0].as_str().unwrap().to_owned())
                .collect()
        };
        let one_of = |crd: &str| one_of_field(crd, "module");
        assert_eq!(one_of("ClusterWasmController"), source_fields());
        assert_eq!(one_of("WasmController"), ["configMap", "image"]);
        // A candidate is a module source with the same union.
        assert_eq!(
            one_of_field("WasmController", "candidate"),
            ["configMap", "image"]
        );
        assert_eq!(
            one_of_field("ClusterWasmController", "candidate"),
            source_fields()
        );
        let none = ModuleSource {
            config_map: None,
            path: None,
            image: None,
            image_pull_secret: None,
            sha256: Some("0".repeat(64)),
        };
        assert_eq!(
            none.source(None).unwrap_err(),
            "spec.module names none of configMap, image, path; name exactly one"
        );
    }

    #[test]
    fn a_parents_selector_is_parsed_once_and_its_error_names_the_field() {
        let parent = |selector: Option<&str>| ParentResource {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            label_selector: selector.map(str::to_owned),
        };
        assert!(parent(None).selector().unwrap().is_none());
        assert!(
            parent(Some("tier=web,app!=x"))
                .selector()
                .unwrap()
                .is_some()
        );
        let err = parent(Some("tier in (web")).selector().unwrap_err();
        assert!(
            err.starts_with("spec.parent.labelSelector `tier in (web`: "),
            "{err}"
        );
    }

    #[test]
    fn deploy_crds_match_the_rust_types() {
        let committed = include_str!("../../../deploy/crds/kubewasm.dev.yaml");
        assert!(
            committed == crds_yaml(),
            "deploy/crds/kubewasm.dev.yaml is out of date with runtime/src/api: run `make crds` and commit it"
        );
    }

    #[test]
    fn spec_rejects_unknown_fields_and_resolves_limits() {
        let err = serde_yaml::from_str::<WasmControllerSpec>(
            "module: {path: /m.wasm}\nparent: {apiVersion: v1, kind: ConfigMap}\nparnet: {}",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("unknown field `parnet`"), "{err}");
        let spec: WasmControllerSpec = serde_yaml::from_str(
            "module: {path: /m.wasm}\nparent: {apiVersion: v1, kind: ConfigMap}\nlimits: {memory: 32Mi, timeoutMillis: 250}",
        )
        .unwrap();
        let limits = spec.limits.resolve().unwrap().limits;
        assert_eq!(limits.memory_bytes, 32 << 20);
        assert_eq!(limits.timeout, Duration::from_millis(250));
        assert_eq!(spec.resync_period(), Duration::from_secs(300));
    }
}
