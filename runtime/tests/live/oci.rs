//! Modules from a registry, live: a real `docker-registry` on loopback, `kubewasm push`, and
//! `kubewasm run --insecure-registry`. A tag is followed (moved → the new digest runs, no
//! restart), a digest is not; a broken module under the tag, a component of another world, a
//! module over the size cap and a blob the registry corrupts are each refused with a status
//! that says why, while the last good module keeps running; a private repository needs a pull
//! secret its controller's ServiceAccount may read; a restarted runtime reads a layer it
//! pulled before from `--module-cache-dir` instead of the registry.

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
/// a careless or hostile publisher could): what the runtime must still refuse.
async fn push_claiming_controller(
    registry: &Registry,
    repo_tag: &str,
    layer: Vec<u8>,
) -> Result<()> {
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
    Ok(())
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
    std::fs::read_to_string(registry.log())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("GET /v2/") && l.contains(&format!("/blobs/{digest}")))
        .count()
}

/// The layer digest of a pushed component file (`sha256:<hex>`, as the registry's log shows
/// it).
pub(crate) fn layer_digest(wasm: &[u8]) -> String {
    sha256(wasm)
}

#[tokio::test]
async fn a_moved_tag_rolls_forward_a_digest_stays_and_bad_modules_are_refused() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "oci").await;
    let registry = Registry::start().expect("starting docker-registry");
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &[
            "--insecure-registry",
            registry.addr(),
            "--module-poll-seconds",
            "1",
        ],
    );
    let result = roll_forward(&client, &ns, &registry, &mut runtime).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn roll_forward(
    client: &Client,
    ns: &str,
    registry: &Registry,
    runtime: &mut RuntimeProcess,
) -> Result<()> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let guests = crate::support::guests::guest_dir();
    let (hostile_file, restarter_file) = (
        guests.join("hostile.wasm"),
        guests.join("configmap_restarter.wasm"),
    );
    let (hostile, restarter) = (guest("hostile"), guest("configmap_restarter"));
    let tag = format!("{}/team/reload:v1", registry.addr());
    let repo = format!("{}/team/reload", registry.addr());
    install_account(client, ns).await?;

    // Push by tag, run by tag: the hostile guest (`data.mode: ok` on its parent).
    let digest_a = push(&hostile_file, &tag, None)?;
    apply(client, &controller(ns, "by-tag", &tag, None, "by-tag")).await?;
    // The same module pinned by digest, for parents of its own.
    let pinned = format!("{repo}@{digest_a}");
    apply(
        client,
        &controller(ns, "by-digest", &pinned, None, "by-digest"),
    )
    .await?;
    apply(client, &probe(ns, "probe-a", "by-tag")).await?;
    apply(client, &probe(ns, "pinned-a", "by-digest")).await?;
    for name in ["probe-a", "pinned-a"] {
        eventually(
            &format!("module A sets data.mode=ok on {name}"),
            WAIT,
            || async {
                let data = config_maps.get(name).await?.data.unwrap_or_default();
                Ok((data.get("mode").map(String::as_str) == Some("ok")).then_some(()))
            },
        )
        .await?;
    }
    let image_a = format!("image {repo}@{digest_a}");
    for name in ["by-tag", "by-digest"] {
        wait_module(
            client,
            ns,
            name,
            "module A from the image, its digest shown",
            |s, st, _, m| {
                ensure!(
                    s.module_digest == Some(sha256(&hostile)),
                    "moduleDigest {:?}",
                    s.module_digest
                );
                ensure!(st == "True" && m.contains(&image_a), "want {image_a}");
                Ok(())
            },
        )
        .await?;
    }
    // The access log shows the layers read (what the refusals below assert never happens).
    ensure!(
        blob_was_read(registry, &layer_digest(&hostile)),
        "the registry's log does not show module A's layer read"
    );
    let pid = runtime.pid();

    // Move the tag: the new digest runs within the poll period, no restart.
    let digest_b = push(&restarter_file, &tag, None)?;
    let moved = Instant::now();
    let image_b = format!("image {repo}@{digest_b}");
    wait_module(
        client,
        ns,
        "by-tag",
        "module B after the tag moved",
        |s, st, _, m| {
            ensure!(
                s.module_digest == Some(sha256(&restarter)),
                "moduleDigest {:?}",
                s.module_digest
            );
            ensure!(st == "True" && m.contains(&image_b), "want {image_b}");
            Ok(())
        },
    )
    .await?;
    eprintln!(
        "tag moved → new digest in the status: {:.2?}",
        moved.elapsed()
    );
    apply(client, &probe(ns, "probe-b", "by-tag")).await?;
    let owner = Owner::Namespaced(ns, "by-tag");
    wait_digest(client, owner, &format!("{ns}/probe-b"), None).await?;
    let data = config_maps.get("probe-b").await?.data.unwrap_or_default();
    ensure!(
        !data.contains_key("mode"),
        "module A still ran for probe-b: {data:?}"
    );
    ensure!(runtime.pid() == pid, "the runtime was restarted");

    // The digest reference did not follow the tag: module A still runs there.
    apply(client, &probe(ns, "pinned-b", "by-digest")).await?;
    eventually(
        "module A (by digest) sets data.mode=ok on pinned-b",
        WAIT,
        || async {
            let data = config_maps.get("pinned-b").await?.data.unwrap_or_default();
            Ok((data.get("mode").map(String::as_str) == Some("ok")).then_some(()))
        },
    )
    .await?;
    let status = crate::cluster::controller_status(client, ns, "by-digest").await?;
    ensure!(
        status.module_digest == Some(sha256(&hostile)),
        "by-digest moved: {:?}",
        status.module_digest
    );
    ensure!(
        condition(&status, "ModuleReady")?
            .message
            .contains(&image_a)
    );

    // A broken module under the tag (its config claims the controller world): module B keeps
    // running, and the status says why.
    let broken = wat::parse_str("(component)")?;
    push_claiming_controller(registry, "team/reload:v1", broken).await?;
    wait_module(
        client,
        ns,
        "by-tag",
        "ModuleInvalid, still running module B",
        |s, st, reason, m| {
            ensure!(
                st == "False" && reason == "ModuleInvalid",
                "not refused yet"
            );
            ensure!(
                m.contains("still running the last good module") && m.contains(&image_b),
                "{m}"
            );
            ensure!(
                s.module_digest == Some(sha256(&restarter)),
                "moduleDigest {:?}",
                s.module_digest
            );
            Ok(())
        },
    )
    .await?;
    let recorded = wait_digest(client, owner, &format!("{ns}/probe-b"), None).await?;
    config_maps
        .patch(
            "probe-b",
            &Default::default(),
            &crate::merge(json!({"data": {"value": "2"}})),
        )
        .await?;
    wait_digest(client, owner, &format!("{ns}/probe-b"), Some(&recorded)).await?;

    // A component of another world: refused from its config, its layer never asked for.
    let other = wat::parse_str("(component (core module $m) (core instance (instantiate $m)))")?;
    let other_file = registry.dir().join("other.wasm");
    std::fs::write(&other_file, &other)?;
    push(&other_file, &tag, None)?;
    wait_module(
        client,
        ns,
        "by-tag",
        "the other world refused",
        |s, st, reason, m| {
            ensure!(
                st == "False" && reason == "ModuleInvalid" && m.contains("targets no world"),
                "not refused yet"
            );
            ensure!(
                m.contains("kubewasm:controller/controller")
                    && m.contains("its layer was not pulled"),
                "{m}"
            );
            ensure!(
                s.module_digest == Some(sha256(&restarter)),
                "moduleDigest {:?}",
                s.module_digest
            );
            Ok(())
        },
    )
    .await?;
    ensure!(
        !blob_was_read(registry, &layer_digest(&other)),
        "the registry was asked for the other world's layer"
    );

    // A registry that lies: the stored blob of a module is changed under its digest.
    let digest_c = push(&hostile_file, &format!("{repo}:lying"), None)?;
    let blob = registry.blob_path(&layer_digest(&hostile));
    let mut corrupted = std::fs::read(&blob)?;
    let last = corrupted.len() - 1;
    corrupted[last] ^= 0xff;
    std::fs::write(&blob, &corrupted)?;
    apply(
        client,
        &controller(ns, "lied-to", &format!("{repo}:lying"), None, "lied-to"),
    )
    .await?;
    wait_module(
        client,
        ns,
        "lied-to",
        "a corrupted blob refused",
        |_, st, reason, m| {
            ensure!(
                st == "False"
                    && reason == "DigestMismatch"
                    && m.contains("differs from its manifest"),
                "not refused yet"
            );
            Ok(())
        },
    )
    .await?;
    let _ = digest_c;

    runtime.ensure_running()?;
    ensure!(runtime.pid() == pid, "the runtime was restarted");
    Ok(())
}

#[tokio::test]
async fn a_restarted_runtime_reads_a_pulled_layer_from_the_module_cache() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "oci-cache").await;
    let registry = Registry::start().expect("starting docker-registry");
    let cache = tempfile::tempdir().expect("a directory for the module cache");
    let cache_dir = cache.path().display().to_string();
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &[
            "--insecure-registry",
            registry.addr(),
            "--module-cache-dir",
            &cache_dir,
        ],
    );
    let result = from_module_cache(&client, &ns, &registry, cache.path(), &mut runtime).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn from_module_cache(
    client: &Client,
    ns: &str,
    registry: &Registry,
    cache: &std::path::Path,
    runtime: &mut RuntimeProcess,
) -> Result<()> {
    install_account(client, ns).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let file = crate::support::guests::guest_dir().join("hostile.wasm");
    let layer = layer_digest(&guest("hostile"));
    let repo = format!("{}/team/cached", registry.addr());
    let digest = push(&file, &format!("{repo}:v1"), None)?;
    apply(
        client,
        &controller(ns, "cached", &format!("{repo}@{digest}"), None, "cached"),
    )
    .await?;
    let mode_ok = |name: &'static str| {
        let config_maps = config_maps.clone();
        async move {
            eventually(
                &format!("the module sets data.mode=ok on {name}"),
                WAIT,
                || async {
                    let data = config_maps.get(name).await?.data.unwrap_or_default();
                    Ok((data.get("mode").map(String::as_str) == Some("ok")).then_some(()))
                },
            )
            .await
        }
    };
    apply(client, &probe(ns, "first", "cached")).await?;
    mode_ok("first").await?;
    ensure!(
        blob_reads(registry, &layer) == 1,
        "the first runtime read the layer {} times: {}",
        blob_reads(registry, &layer),
        std::fs::read_to_string(registry.log())?
            .lines()
            .filter(|l| l.contains("GET /v2/"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let entry = cache.join(layer.replace(':', "-"));
    ensure!(entry.is_file(), "no cache entry {}", entry.display());
    runtime.stop()?;

    // The second runtime, on the same cache: the manifest and config from the registry, the
    // layer from the disk.
    runtime.start_again();
    apply(client, &probe(ns, "second", "cached")).await?;
    mode_ok("second").await?;
    ensure!(
        blob_reads(registry, &layer) == 1,
        "the second runtime asked the registry for the layer"
    );
    let (_, metrics) = runtime.http_get("/metrics").await?;
    ensure!(
        metrics.contains("kubewasm_modules_from_module_cache 1")
            && metrics.contains("kubewasm_modules_pulled 0"),
        "metrics: {}",
        metrics
            .lines()
            .filter(|l| l.contains("modules_"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    runtime.stop()?;

    // A corrupted entry is refused, removed and pulled again: the module still runs.
    std::fs::write(&entry, b"not the module")?;
    runtime.start_again();
    apply(client, &probe(ns, "third", "cached")).await?;
    mode_ok("third").await?;
    ensure!(
        blob_reads(registry, &layer) == 2,
        "after the corrupted entry, the layer was read {} times in all, want 2",
        blob_reads(registry, &layer)
    );
    ensure!(
        std::fs::read(&entry)? == guest("hostile"),
        "the entry was not written again"
    );
    Ok(())
}

#[tokio::test]
async fn a_module_over_the_size_cap_is_refused_unread() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "oci-cap").await;
    let registry = Registry::start().expect("starting docker-registry");
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &[
            "--insecure-registry",
            registry.addr(),
            "--max-module-bytes",
            "64Ki",
        ],
    );
    let result = over_cap(&client, &ns, &registry).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn over_cap(client: &Client, ns: &str, registry: &Registry) -> Result<()> {
    install_account(client, ns).await?;
    let file = crate::support::guests::guest_dir().join("hostile.wasm");
    let wasm = guest("hostile");
    ensure!(
        wasm.len() > 64 << 10,
        "the hostile guest is only {} bytes",
        wasm.len()
    );
    let tag = format!("{}/team/big:v1", registry.addr());
    push(&file, &tag, None)?;
    apply(client, &controller(ns, "big", &tag, None, "big")).await?;
    wait_module(
        client,
        ns,
        "big",
        "the module over 64Ki refused",
        |s, st, reason, m| {
            ensure!(
                st == "False" && reason == "ModuleInvalid",
                "not refused yet"
            );
            ensure!(
                m.contains("larger than 64Ki") && m.contains("--max-module-bytes"),
                "{m}"
            );
            ensure!(
                s.module_digest.is_none(),
                "a module runs: {:?}",
                s.module_digest
            );
            Ok(())
        },
    )
    .await?;
    ensure!(
        !blob_was_read(registry, &layer_digest(&wasm)),
        "the registry was asked for the layer over the cap"
    );
    Ok(())
}

#[tokio::test]
async fn a_private_repository_needs_a_pull_secret_the_service_account_may_read() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "oci-auth").await;
    let registry =
        Registry::with_basic_auth("pusher", "s3cret-pw").expect("starting docker-registry");
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &[
            "--insecure-registry",
            registry.addr(),
            "--access-review-seconds",
            "2",
        ],
    );
    let result = private(&client, &ns, &registry).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn private(client: &Client, ns: &str, registry: &Registry) -> Result<()> {
    install_account(client, ns).await?;
    let file = crate::support::guests::guest_dir().join("hostile.wasm");
    let tag = format!("{}/team/private:v1", registry.addr());
    ensure!(
        push(&file, &tag, None).is_err(),
        "an anonymous push was let through"
    );
    push(&file, &tag, Some(("pusher", "s3cret-pw")))?;

    // No pull secret: the registry says no.
    apply(
        client,
        &controller(ns, "anonymous", &tag, None, "anonymous"),
    )
    .await?;
    wait_module(
        client,
        ns,
        "anonymous",
        "the anonymous pull refused",
        |_, st, reason, m| {
            ensure!(
                st == "False" && reason == "ModuleNotFound" && m.contains(registry.addr()),
                "not refused yet"
            );
            Ok(())
        },
    )
    .await?;

    // A pull secret the ServiceAccount may not read: the status names the fix.
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode("pusher:s3cret-pw");
    let dockerconfig = json!({"auths": {registry.addr(): {"auth": auth}}}).to_string();
    apply(
        client,
        &json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": "regcred", "namespace": ns},
            "stringData": {".dockerconfigjson": dockerconfig}}),
    )
    .await?;
    apply(
        client,
        &controller(ns, "private", &tag, Some("regcred"), "private"),
    )
    .await?;
    let fix = format!(
        "kubectl -n {ns} create role regcred-reader --verb=get --resource=secrets --resource-name=regcred"
    );
    wait_module(
        client,
        ns,
        "private",
        "Forbidden with the kubectl fix",
        |_, st, reason, m| {
            ensure!(st == "False" && reason == "Forbidden", "not refused yet");
            ensure!(
                m.contains(&fix) && m.contains(&format!("--serviceaccount={ns}:reloader")),
                "{m}"
            );
            Ok(())
        },
    )
    .await?;

    // The fix the status names: the module loads.
    apply_all(
        client,
        &[
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "regcred-reader", "namespace": ns},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["regcred"], "verbs": ["get"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "regcred-reader", "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "regcred-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "reloader", "namespace": ns}]}),
        ],
    )
    .await?;
    let hostile = guest("hostile");
    wait_module(
        client,
        ns,
        "private",
        "the private module loaded",
        |s, st, _, _| {
            ensure!(st == "True", "not loaded yet");
            ensure!(
                s.module_digest == Some(sha256(&hostile)),
                "moduleDigest {:?}",
                s.module_digest
            );
            Ok(())
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_registry_that_never_answers_stalls_nothing_else() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "oci-silent").await;
    // Accepts connections and never says a byte.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &["--insecure-registry", &addr, "--module-poll-seconds", "1"],
    );
    let result = silent_registry(&client, &ns, &addr).await;
    finish(result, &mut [&mut runtime]);
    held.abort();
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn silent_registry(client: &Client, ns: &str, addr: &str) -> Result<()> {
    install_account(client, ns).await?;
    for i in 0..6 {
        let image = format!("{addr}/team/silent-{i}:v1");
        apply(
            client,
            &controller(ns, &format!("silent-{i}"), &image, None, "silent"),
        )
        .await?;
    }
    wait_module(
        client,
        ns,
        "silent-0",
        "pulling, said in the status",
        |_, st, reason, m| {
            ensure!(
                st == "False" && reason == "ModuleNotLoaded" && m.contains("pulling"),
                "not yet"
            );
            Ok(())
        },
    )
    .await?;
    // Meanwhile a controller whose module is in a ConfigMap starts and works at once.
    let started = Instant::now();
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
        "the ConfigMap module reconciles beside the silent pulls",
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
    .await?;
    eprintln!(
        "a ConfigMap controller beside 6 silent pulls reconciled in {:.2?}",
        started.elapsed()
    );
    ensure!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the ConfigMap controller waited {:?} for the silent registry",
        started.elapsed()
    );
    Ok(())
}
