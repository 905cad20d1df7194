//! What the live tests do to the cluster: the CRDs, the examples' manifests moved into a test
//! namespace, modules in ConfigMaps, and reading a WasmController's status.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Api, Client, ResourceExt};
use kubewasm::api::{WasmController, WasmControllerStatus};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::{ControlPlane, FIELD_MANAGER, ensure_greeting_pod, eventually};
pub use crate::{apply, apply_all, documents};

/// How long anything the runtime or kube-controller-manager does may take on a busy
/// 2-core machine.
pub const WAIT: Duration = Duration::from_secs(60);

pub use crate::workspace;

/// The bytes of a built guest (`make guests`).
pub fn guest(name: &str) -> Vec<u8> {
    let path = crate::guests::guest(name);
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e}: run `make guests` first", path.display()))
}

/// `sha256:<hex>` of some bytes, as `status.moduleDigest` names modules.
pub fn sha256(bytes: &[u8]) -> String {
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// A manifest of `deploy/examples/` (e.g. `hello-world/rbac.yaml`) moved into `namespace`:
/// its Namespace object left out, every object and RoleBinding subject put into `namespace`.
pub fn example(path: &str, namespace: &str) -> Result<Vec<Value>> {
    let file = workspace().join("deploy/examples").join(path);
    manifest(&file, namespace)
}

/// A fixture of `runtime/tests/fixtures/live/`, moved into `namespace` like [`example`].
pub fn fixture(path: &str, namespace: &str) -> Result<Vec<Value>> {
    let file = workspace().join("runtime/tests/fixtures/live").join(path);
    manifest(&file, namespace)
}

fn manifest(file: &Path, namespace: &str) -> Result<Vec<Value>> {
    let yaml = std::fs::read_to_string(file).with_context(|| format!("{}", file.display()))?;
    Ok(documents(&yaml)?
        .into_iter()
        .filter(|doc| doc["kind"] != "Namespace")
        .map(|doc| in_namespace(doc, namespace))
        .collect())
}

/// The object in `namespace`, and so are the subjects of a RoleBinding.
pub fn in_namespace(mut doc: Value, namespace: &str) -> Value {
    doc["metadata"]["namespace"] = json!(namespace);
    if let Some(subjects) = doc.get_mut("subjects").and_then(Value::as_array_mut) {
        for subject in subjects {
            if subject.get("namespace").is_some() {
                subject["namespace"] = json!(namespace);
            }
        }
    }
    doc
}

/// The one document of `kind` among `docs`.
pub fn take(docs: &mut Vec<Value>, kind: &str) -> Result<Value> {
    let at = docs
        .iter()
        .position(|d| d["kind"] == kind)
        .with_context(|| format!("no {kind} in the manifest"))?;
    Ok(docs.remove(at))
}

/// The module ConfigMap the tutorial makes with
/// `kubectl create configmap <name> --from-file=<key>=<guest>.wasm` (binaryData).
pub fn module_config_map(namespace: &str, name: &str, key: &str, wasm: &[u8]) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "binaryData": {key: base64::engine::general_purpose::STANDARD.encode(wasm)},
    })
}

/// Applies the kubewasm.dev CRDs (generated) and the HelloWorld CRD of the example, and waits
/// until they are served. Once per control plane and test binary.
pub async fn ensure_crds(control_plane: &ControlPlane, client: &Client) -> Result<()> {
    static DONE: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let key = control_plane.kubeconfig().to_owned();
    if DONE.lock().unwrap().get_or_insert_default().contains(&key) {
        return Ok(());
    }
    let mut crds = Vec::new();
    for file in [
        workspace().join("deploy/crds/kubewasm.dev.yaml"),
        workspace().join("deploy/examples/hello-world/crd.yaml"),
    ] {
        let yaml = std::fs::read_to_string(&file).with_context(|| format!("{}", file.display()))?;
        crds.extend(documents(&yaml)?);
    }
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in &crds {
        let name = crd["metadata"]["name"]
            .as_str()
            .context("CRD without name")?;
        api.patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(crd),
        )
        .await
        .with_context(|| format!("applying CRD {name}"))?;
    }
    for crd in &crds {
        wait_established(client, crd["metadata"]["name"].as_str().unwrap_or_default()).await?;
    }
    DONE.lock().unwrap().get_or_insert_default().insert(key);
    Ok(())
}

/// Waits until CustomResourceDefinition `name` is Established (its kind is served).
pub async fn wait_established(client: &Client, name: &str) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    eventually(&format!("CRD {name} is Established"), WAIT, || async {
        let crd = api.get(name).await?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        Ok(established.then_some(()))
    })
    .await
}

/// A fresh namespace with the CRDs in place, and an admin client.
pub async fn prepare(control_plane: &ControlPlane, prefix: &str) -> (Client, String) {
    let prepared = async {
        let client = control_plane.client().await?;
        ensure_crds(control_plane, &client).await?;
        let namespace = control_plane.namespace(prefix).await?;
        anyhow::Ok((client, namespace))
    };
    prepared.await.expect("preparing the test namespace")
}

/// Waits until HelloWorld `ns/name` has `status.pods` = `pods`.
pub async fn wait_status_pods(client: &Client, ns: &str, name: &str, pods: i64) -> Result<()> {
    let hellos = hello_worlds(client, ns);
    eventually(
        &format!("HelloWorld {name} gets status.pods = {pods}"),
        WAIT,
        || async {
            let parent = hellos.get(name).await?;
            match parent.data.pointer("/status/pods").and_then(Value::as_i64) {
                Some(n) if n == pods => Ok(Some(())),
                other => bail!("status.pods is {other:?}"),
            }
        },
    )
    .await
}

/// `HelloWorld`s (`example.com/v1`) of a namespace.
pub fn hello_worlds(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("example.com", "v1", "HelloWorld");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "helloworlds");
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// Creates a HelloWorld greeting `who`.
pub async fn create_hello_world(
    client: &Client,
    namespace: &str,
    name: &str,
    who: &str,
) -> Result<()> {
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1",
        "kind": "HelloWorld",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"who": who},
    }))?;
    hello_worlds(client, namespace)
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating HelloWorld {name}"))?;
    Ok(())
}

/// Waits until Pod `name` runs `echo <greeting>` and, when `replaces` is given, is not that
/// Pod (uid) any more. Returns the Pod.
pub async fn wait_greeting_pod(
    pods: &Api<Pod>,
    name: &str,
    greeting: &str,
    replaces: Option<&str>,
) -> Result<Pod> {
    let what = match replaces {
        Some(uid) => format!("Pod {name} (uid {uid}) is replaced by one that echoes {greeting:?}"),
        None => format!("Pod {name} echoes {greeting:?}"),
    };
    eventually(&what, WAIT, || async {
        let Some(pod) = pods.get_opt(name).await? else {
            bail!("no Pod {name}");
        };
        ensure_greeting_pod(&pod, greeting, replaces)?;
        Ok(Some(pod))
    })
    .await
}

/// Names and uids of the Pods matching `selector` that are not being deleted.
pub async fn live_pods(pods: &Api<Pod>, selector: &str) -> Result<BTreeMap<String, String>> {
    let list = pods.list(&ListParams::default().labels(selector)).await?;
    Ok(list
        .into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .map(|pod| (pod.name_any(), pod.uid().unwrap_or_default()))
        .collect())
}

/// The status of a WasmController (empty before the runtime first wrote it).
pub async fn controller_status(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<WasmControllerStatus> {
    let api: Api<WasmController> = Api::namespaced(client.clone(), namespace);
    Ok(api.get(name).await?.status.unwrap_or_default())
}

/// The condition of `type_` in a status.
pub fn condition<'s>(status: &'s WasmControllerStatus, type_: &str) -> Result<&'s Condition> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .with_context(|| format!("no {type_} condition in {:?}", status.conditions))
}

/// Fails unless condition `type_` has `status` (`True`/`False`).
pub fn ensure_condition<'s>(
    status: &'s WasmControllerStatus,
    type_: &str,
    want: &str,
) -> Result<&'s Condition> {
    let c = condition(status, type_)?;
    ensure!(
        c.status == want,
        "{type_} is {} ({}: {}), want {want}",
        c.status,
        c.reason,
        c.message
    );
    Ok(c)
}

/// Waits until the WasmController's status passes `check` (which says what it saw when not).
pub async fn wait_status<F>(
    client: &Client,
    namespace: &str,
    name: &str,
    what: &str,
    check: F,
) -> Result<WasmControllerStatus>
where
    F: Fn(&WasmControllerStatus) -> Result<()>,
{
    eventually(what, WAIT, || async {
        let status = controller_status(client, namespace, name).await?;
        check(&status)?;
        Ok(Some(status))
    })
    .await
}

/// Where the saved states of controller `kind` (`WasmController` or `ClusterWasmController`)
/// `name` are: the shard object of `key` in `namespace` (the controller's, or the runtime's
/// for a ClusterWasmController), as its name.
pub fn state_shard(kind: &str, name: &str, key: &str) -> String {
    format!(
        "{}-{:02}",
        kubewasm::api::state_prefix(kind, name),
        kubewasm::host::shard_of_key(key)
    )
}

/// What controller `kind`/`name` saved for `key` (`None`: nothing), read from its
/// WasmControllerState objects in `namespace` as the admin.
pub async fn saved_state(
    client: &Client,
    namespace: &str,
    kind: &str,
    name: &str,
    key: &str,
) -> Result<Option<String>> {
    let api: Api<kubewasm::api::WasmControllerState> = Api::namespaced(client.clone(), namespace);
    Ok(api
        .get_opt(&state_shard(kind, name, key))
        .await?
        .and_then(|s| s.spec.entries.get(key).cloned()))
}

/// Sets what controller `kind`/`name` saved for `key` to `value`, as the admin (what a
/// runtime killed before its next save leaves); its shard object must exist.
pub async fn set_saved_state(
    client: &Client,
    namespace: &str,
    kind: &str,
    name: &str,
    key: &str,
    value: &str,
) -> Result<()> {
    let api: Api<kubewasm::api::WasmControllerState> = Api::namespaced(client.clone(), namespace);
    api.patch(
        &state_shard(kind, name, key),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({"spec": {"entries": {key: value}}})),
    )
    .await?;
    Ok(())
}
