//! Modules from a registry, live: a real `docker-registry` on loopback, `kubewasm push`, and
//! `kubewasm run --insecure-registry`. A tag is followed (moved → the new digest runs, no
//! restart), a digest is not; a broken module under the tag, a component of another world, a
//! module over the size cap and a blob the registry corrupts are each refused with a status
//! that says why, while the last good module keeps running; a private repository needs a pull
//! secret its controller's ServiceAccount may read; a restarted runtime reads a layer it
//! pulled before from `--module-cache-dir` instead of the registry; many controllers naming
//! one public digest cause one pull and one compile, and a digest pulled with a pull secret
//! is not given to a controller without one.

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use kubewasm::api::WasmControllerStatus;
use kubewasm::sources::oci::{
    CONFIG_MEDIA_TYPE, ComponentInfo, LAYER_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, RegistryConfig,
    WasmConfig,
};
use kubewasm_test_support::registry::Registry;
use serde_json::{Value, json};

use crate::cluster::{
    WAIT, apply, apply_all, condition, fixture, guest, prepare, sha256, wait_status,
};
use crate::restarter::{Owner, wait_digest};
use crate::runtime::{RuntimeProcess, finish, kubewasm_bin};
use crate::support::{ControlPlane, eventually};

mod hostile;
mod module_cache;
mod moving_tag;
mod private;
mod roll_forward;
mod shared;
mod silent;
mod size_cap;

/// The reload fixture's controller, its module an image.
pub(crate) fn controller(
    ns: &str,
    name: &str,
    image: &str,
    secret: Option<&str>,
    selector: &str,
) -> Value {
    let mut module = json!({"image": image});
    if let Some(secret) = secret {
        module["imagePullSecret"] = json!(secret);
    }
    json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "WasmController",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"module": module,
            "parent": {"apiVersion": "v1", "kind": "ConfigMap", "labelSelector": format!("kubewasm-test={selector}")},
            "grants": [{"apiVersion": "v1", "kind": "Pod", "verbs": ["list", "delete"]}],
            "serviceAccountName": "reloader"}})
}

/// A ConfigMap a controller of `selector` looks after.
pub(crate) fn probe(ns: &str, name: &str, selector: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": {"kubewasm-test": selector},
            "annotations": {"magalix.com/podDeleteMatch": "app=oci-none"}},
        "data": {"value": "1"}})
}

/// A controller whose module is in a ConfigMap (`local`), started now beside whatever else
/// the test does: waits until it reconciled its probe (`beside` says what it ran beside).
pub(crate) async fn local_controller_reconciles(
    client: &Client,
    ns: &str,
    beside: &str,
) -> Result<()> {
    apply(
        client,
        &crate::cluster::module_config_map(ns, "local", "controller.wasm", &guest("hostile")),
    )
    .await?;
    let mut local = controller(ns, "local", "unused", None, "local");
    local["spec"]["module"] = json!({"configMap": {"name": "local", "key": "controller.wasm"}});
    apply(client, &local).await?;
    apply(client, &probe(ns, "probe-local", "local")).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    eventually(
        &format!("the ConfigMap module reconciles beside {beside}"),
        WAIT,
        || async {
            let data = config_maps
                .get("probe-local")
                .await?
                .data
                .unwrap_or_default();
            Ok((data.get("mode").map(String::as_str) == Some("ok")).then_some(()))
        },
    )
    .await
}

/// The ServiceAccount `reloader` with its Role (the reload fixture, without its controller).
pub(crate) async fn install_account(client: &Client, ns: &str) -> Result<()> {
    let docs: Vec<Value> = fixture("reload.yaml", ns)?
        .into_iter()
        .filter(|d| d["kind"] != "WasmController")
        .collect();
    apply_all(client, &docs).await
}

/// `kubewasm push FILE REF --insecure [--username U --password-stdin]`: the pushed digest.
pub(crate) fn push(
    file: &std::path::Path,
    reference: &str,
    login: Option<(&str, &str)>,
) -> Result<String> {
    let mut command = Command::new(kubewasm_bin());
    command
        .arg("push")
        .arg(file)
        .arg(reference)
        .arg("--insecure");
    if let Some((user, _)) = login {
        command.args(["--username", user, "--password-stdin"]);
    }
    let mut child = command
        .env("DOCKER_CONFIG", "/nonexistent")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let (Some((_, password)), Some(mut stdin)) = (login, child.stdin.take()) {
        use std::io::Write as _;
        stdin.write_all(password.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "kubewasm push failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout)?.trim().to_owned();
    let digest = line
        .strip_prefix(&format!("{reference}@"))
        .with_context(|| format!("kubewasm push printed {line:?}"))?;
    ensure!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{line}"
    );
    Ok(digest.to_owned())
}

/// Pushes `layer` with a config that claims the controller world, whatever the layer is (as
/// a careless or hostile publisher could): what the runtime must still refuse. The manifest's
/// digest.
async fn push_claiming_controller(
    registry: &Registry,
    repo_tag: &str,
    layer: Vec<u8>,
) -> Result<String> {
    let info = ComponentInfo {
        exports: vec!["reconcile".into()],
        imports: vec!["kubewasm:controller/host@0.3.0".into()],
        target: Some("kubewasm:controller/controller@0.3.0".into()),
    };
    let config = WasmConfig::for_component(info, format!("sha256:{}", sha256(&layer)));
    let config = oci_client::client::Config::new(
        serde_json::to_vec(&config)?,
        CONFIG_MEDIA_TYPE.into(),
        None,
    );
    let layers = vec![oci_client::client::ImageLayer::new(
        layer,
        LAYER_MEDIA_TYPE.into(),
        None,
    )];
    let mut manifest = oci_client::manifest::OciImageManifest::build(&layers, &config, None);
    manifest.media_type = Some(MANIFEST_MEDIA_TYPE.into());
    let client = RegistryConfig {
        insecure: vec![registry.addr().to_owned()],
        ..RegistryConfig::new(1 << 30)
    }
    .client()?;
    let reference: oci_client::Reference = format!("{}/{repo_tag}", registry.addr()).parse()?;
    client
        .push(
            &reference,
            &layers,
            config,
            &oci_client::secrets::RegistryAuth::Anonymous,
            Some(manifest),
        )
        .await?;
    let digest = client
        .fetch_manifest_digest(&reference, &oci_client::secrets::RegistryAuth::Anonymous)
        .await?;
    Ok(digest)
}

/// Waits until the controller's `ModuleReady` passes `check`.
pub(crate) async fn wait_module(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    check: impl Fn(&WasmControllerStatus, &str, &str, &str) -> Result<()>,
) -> Result<WasmControllerStatus> {
    wait_status(client, ns, name, what, |s| {
        let c = condition(s, "ModuleReady")?;
        check(s, &c.status, &c.reason, &c.message)
            .with_context(|| format!("ModuleReady {} {}: {}", c.status, c.reason, c.message))
    })
    .await
}

/// Whether the registry was asked for blob `digest` (its access log).
pub(crate) fn blob_was_read(registry: &Registry, digest: &str) -> bool {
    blob_reads(registry, digest) > 0
}

/// How often the registry was asked for blob `digest` (its access log).
fn blob_reads(registry: &Registry, digest: &str) -> usize {
    reads(registry, &format!("/blobs/{digest}"))
}

/// How often the registry was asked for manifest `digest` (its access log).
fn manifest_reads(registry: &Registry, digest: &str) -> usize {
    reads(registry, &format!("/manifests/{digest}"))
}

/// How many GETs of the registry's access log name `path`.
fn reads(registry: &Registry, path: &str) -> usize {
    std::fs::read_to_string(registry.log())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("GET /v2/") && l.contains(path))
        .count()
}

/// The layer digest of a pushed component file (`sha256:<hex>`, as the registry's log shows
/// it).
pub(crate) fn layer_digest(wasm: &[u8]) -> String {
    sha256(wasm)
}
