//! Signed modules, live: `kubewasm run --verify-key` against a real `docker-registry`, keys
//! made with `openssl` (as a user without cosign makes them) and one made by cosign itself,
//! signatures made with `kubewasm sign`. A signed digest runs; an unsigned one, one signed by
//! an untrusted key and one carrying another digest's signature are refused — their layers
//! are never read — while the last verified digest keeps running. The signature is checked
//! with `openssl` too, so it is a plain ECDSA signature of the payload cosign defines.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use kubewasm::sources::cosign;
use kubewasm::sources::oci::{MANIFEST_MEDIA_TYPE, RegistryConfig};
use kubewasm_test_support::registry::Registry;
use oci_client::manifest::OciImageManifest;
use oci_client::secrets::RegistryAuth;

use crate::cluster::{WAIT, apply, guest, prepare, sha256};
use crate::oci::{
    blob_was_read, controller, install_account, layer_digest, probe, push, wait_module,
};
use crate::runtime::{RuntimeProcess, finish, kubewasm_bin};
use crate::support::{ControlPlane, eventually, workspace};

/// A P-256 key pair made with openssl: `(private, public)`; `sec1` writes the private key as
/// `EC PRIVATE KEY`, else as PKCS#8 `PRIVATE KEY`.
fn openssl_key_pair(dir: &Path, name: &str, sec1: bool) -> Result<(PathBuf, PathBuf)> {
    let (private, public) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.pub")),
    );
    let sec1_file = dir.join(format!("{name}.sec1.key"));
    let mut generate = Command::new("openssl");
    generate.args([
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
    ]);
    run(generate.arg(&sec1_file))?;
    if sec1 {
        std::fs::rename(&sec1_file, &private)?;
    } else {
        let mut pkcs8 = Command::new("openssl");
        pkcs8
            .args(["pkcs8", "-topk8", "-nocrypt", "-in"])
            .arg(&sec1_file);
        run(pkcs8.arg("-out").arg(&private))?;
    }
    let mut export = Command::new("openssl");
    export.args(["ec", "-pubout", "-in"]).arg(&private);
    run(export.arg("-out").arg(&public))?;
    Ok((private, public))
}

fn run(command: &mut Command) -> Result<String> {
    let out = command.output().with_context(|| format!("{command:?}"))?;
    ensure!(
        out.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `kubewasm sign --key KEY --insecure REF` (with `COSIGN_PASSWORD` when given): what it
/// printed, `REPO@DIGEST`.
fn sign(key: &Path, reference: &str, password: Option<&str>) -> Result<String> {
    let mut command = Command::new(kubewasm_bin());
    command
        .args(["sign", "--insecure", "--key"])
        .arg(key)
        .arg(reference)
        .env("DOCKER_CONFIG", "/nonexistent")
        .env_remove("COSIGN_PASSWORD");
    if let Some(password) = password {
        command.env("COSIGN_PASSWORD", password);
    }
    run(&mut command)
}

/// The registry's client (plain HTTP).
fn registry_client(registry: &Registry) -> Result<oci_client::Client> {
    Ok(RegistryConfig {
        insecure: vec![registry.addr().to_owned()],
        ..RegistryConfig::new(1 << 20)
    }
    .client()?)
}

/// The signature manifest of `digest` in `repo` (`team/x`), and its raw bytes.
async fn signatures(
    registry: &Registry,
    repo: &str,
    digest: &str,
) -> Result<(OciImageManifest, bytes::Bytes)> {
    let tag = cosign::signature_tag(digest).context("a sha256 digest")?;
    let reference: oci_client::Reference = format!("{}/{repo}:{tag}", registry.addr()).parse()?;
    let (raw, _) = registry_client(registry)?
        .pull_manifest_raw(&reference, &RegistryAuth::Anonymous, &[MANIFEST_MEDIA_TYPE])
        .await?;
    Ok((serde_json::from_slice(&raw)?, raw))
}

#[tokio::test]
async fn only_digests_signed_by_a_trusted_key_run() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "signed").await;
    let registry = Registry::start().expect("starting docker-registry");
    let keys = tempfile::tempdir().expect("a temporary directory");
    let (trusted, trusted_pub) =
        openssl_key_pair(keys.path(), "trusted", false).expect("openssl makes a key pair");
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &[
            "--insecure-registry",
            registry.addr(),
            "--module-poll-seconds",
            "1",
            "--verify-key",
            &trusted_pub.display().to_string(),
        ],
    );
    let result = signed_only(&client, &ns, &registry, keys.path(), &trusted, &trusted_pub).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn signed_only(
    client: &Client,
    ns: &str,
    registry: &Registry,
    keys: &Path,
    trusted: &Path,
    trusted_pub: &Path,
) -> Result<()> {
    let guests = crate::support::guests::guest_dir();
    let (hostile, restarter, hello) = (
        guest("hostile"),
        guest("configmap_restarter"),
        guest("hello_world"),
    );
    let repo = format!("{}/team/signed", registry.addr());
    let tag = format!("{repo}:v1");
    install_account(client, ns).await?;

    // A signed digest runs (the hostile guest: `data.mode: ok` on its parent).
    let digest_a = push(&guests.join("hostile.wasm"), &tag, None)?;
    ensure!(sign(trusted, &tag, None)? == format!("{repo}@{digest_a}"));
    // Signing again adds nothing (the signature is deterministic).
    sign(trusted, &tag, None)?;
    let (manifest, _) = signatures(registry, "team/signed", &digest_a).await?;
    ensure!(
        manifest.layers.len() == 1,
        "{} signatures",
        manifest.layers.len()
    );
    // The signature is a plain ECDSA P-256 signature of cosign's payload: openssl agrees.
    let layer = &manifest.layers[0];
    ensure!(layer.media_type == cosign::PAYLOAD_MEDIA_TYPE);
    let payload = std::fs::read(registry.blob_path(&layer.digest))?;
    ensure!(
        payload == cosign::payload(&repo, &digest_a),
        "payload {payload:?}"
    );
    let signature = layer
        .annotations
        .as_ref()
        .and_then(|a| a.get(cosign::SIGNATURE_ANNOTATION))
        .context("no signature annotation")?;
    use base64::Engine as _;
    let der = base64::engine::general_purpose::STANDARD.decode(signature)?;
    std::fs::write(keys.join("payload.json"), &payload)?;
    std::fs::write(keys.join("signature.der"), der)?;
    let mut verify = Command::new("openssl");
    verify
        .args(["dgst", "-sha256", "-verify"])
        .arg(trusted_pub)
        .arg("-signature")
        .arg(keys.join("signature.der"))
        .arg(keys.join("payload.json"));
    ensure!(run(&mut verify)? == "Verified OK");

    apply(client, &controller(ns, "signed", &tag, None, "signed")).await?;
    apply(client, &probe(ns, "probe", "signed")).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    eventually("module A sets data.mode=ok", WAIT, || async {
        let data = config_maps.get("probe").await?.data.unwrap_or_default();
        Ok((data.get("mode").map(String::as_str) == Some("ok")).then_some(()))
    })
    .await?;
    let image_a = format!("image {repo}@{digest_a}");
    wait_module(
        client,
        ns,
        "signed",
        "module A verified and loaded",
        |s, st, _, m| {
            ensure!(st == "True" && m.contains(&image_a), "want {image_a}");
            ensure!(s.module_digest == Some(sha256(&hostile)));
            Ok(())
        },
    )
    .await?;

    // The tag moves to an unsigned digest: refused, A keeps running, B's layer is not read.
    let digest_b = push(&guests.join("configmap_restarter.wasm"), &tag, None)?;
    let refused = |why: &'static str| {
        let image_a = image_a.clone();
        let digest_b = digest_b.clone();
        let hostile = sha256(&hostile);
        move |s: &kubewasm::api::WasmControllerStatus, st: &str, reason: &str, m: &str| {
            ensure!(
                st == "False" && reason == "SignatureInvalid" && m.contains(&digest_b),
                "not refused yet"
            );
            ensure!(m.contains(why), "{m}");
            ensure!(
                m.contains(&format!("still running the last good module {hostile}"))
                    && m.contains(&image_a),
                "{m}"
            );
            ensure!(s.module_digest == Some(hostile.clone()));
            Ok(())
        }
    };
    wait_module(
        client,
        ns,
        "signed",
        "an unsigned digest refused",
        refused("it has no signature"),
    )
    .await?;

    // Signed by a key the runtime does not trust (cosign's own key format): still refused.
    let cosign_key =
        workspace().join("runtime/tests/fixtures/cosign/cosign-generated-empty-password.key");
    sign(&cosign_key, &tag, Some(""))?;
    wait_module(
        client,
        ns,
        "signed",
        "a digest signed by an untrusted key refused",
        refused("signed by none of the trusted keys"),
    )
    .await?;
    ensure!(
        !blob_was_read(registry, &layer_digest(&restarter)),
        "the registry was asked for the layer of a digest no trusted key signed"
    );

    // Signed by the trusted key (a second signature beside the untrusted one): B runs.
    let (sec1, _) = openssl_key_pair(keys, "other", true)?;
    // (A SEC1 key signs too; this one is not trusted either.)
    sign(&sec1, &format!("{repo}@{digest_b}"), None)?;
    sign(trusted, &tag, None)?;
    let (manifest, _) = signatures(registry, "team/signed", &digest_b).await?;
    ensure!(
        manifest.layers.len() == 3,
        "{} signatures",
        manifest.layers.len()
    );
    let image_b = format!("image {repo}@{digest_b}");
    wait_module(
        client,
        ns,
        "signed",
        "module B verified and loaded",
        |s, st, _, m| {
            ensure!(st == "True" && m.contains(&image_b), "want {image_b}: {m}");
            ensure!(s.module_digest == Some(sha256(&restarter)));
            Ok(())
        },
    )
    .await?;
    ensure!(blob_was_read(registry, &layer_digest(&restarter)));

    // Another digest's signature copied under this digest's signature tag: refused, and a
    // controller with no verified module has nothing running.
    let swap = format!("{}/team/swap", registry.addr());
    let good = push(&guests.join("hostile.wasm"), &format!("{swap}:good"), None)?;
    sign(trusted, &format!("{swap}:good"), None)?;
    let evil = push(
        &guests.join("hello_world.wasm"),
        &format!("{swap}:evil"),
        None,
    )?;
    let (_, raw) = signatures(registry, "team/swap", &good).await?;
    let evil_signatures: oci_client::Reference =
        format!("{swap}:{}", cosign::signature_tag(&evil).context("sha256")?).parse()?;
    let client_oci = registry_client(registry)?;
    client_oci
        .auth(
            &evil_signatures,
            &RegistryAuth::Anonymous,
            oci_client::RegistryOperation::Push,
        )
        .await?;
    client_oci
        .push_manifest_raw(&evil_signatures, raw.to_vec(), MANIFEST_MEDIA_TYPE.parse()?)
        .await?;
    apply(
        client,
        &controller(ns, "swapped", &format!("{swap}:evil"), None, "swapped"),
    )
    .await?;
    wait_module(
        client,
        ns,
        "swapped",
        "a copied signature refused",
        |s, st, reason, m| {
            ensure!(
                st == "False" && reason == "SignatureInvalid",
                "not refused yet"
            );
            ensure!(
                m.contains(&format!("it signs {good}, not this digest")),
                "{m}"
            );
            ensure!(s.module_digest.is_none(), "{:?} runs", s.module_digest);
            Ok(())
        },
    )
    .await?;
    ensure!(
        !blob_was_read(registry, &layer_digest(&hello)),
        "the registry was asked for the layer of a digest with a copied signature"
    );

    // A candidate (spec.candidate) is verified as a module is: unsigned, it is refused (its
    // layer is not read) and compares nothing; signed, it is compared. The live module runs on.
    let howdy = guest("hello_world_howdy");
    let candidate_tag = format!("{repo}:candidate");
    let digest_c = push(&guests.join("hello_world_howdy.wasm"), &candidate_tag, None)?;
    let controllers: Api<kubewasm::api::WasmController> = Api::namespaced(client.clone(), ns);
    controllers
        .patch(
            "signed",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"spec": {"candidate": {"image": candidate_tag}}}),
            ),
        )
        .await?;
    let rollout = |want: &'static str| {
        let (digest_c, live) = (digest_c.clone(), sha256(&restarter));
        move |s: &kubewasm::api::WasmControllerStatus| -> Result<()> {
            let r = s.rollout.as_ref().context("no status.rollout")?;
            match want {
                "refused" => ensure!(
                        r.problem.as_deref().is_some_and(
                            |p| p.contains(&digest_c) && p.contains("it has no signature")
                        ),
                        "{r:?}"
                    ),
                _ => ensure!(
                    r.problem.is_none()
                        && r.candidate
                            .as_deref()
                            .is_some_and(|c| c.contains(&digest_c)),
                    "{r:?}"
                ),
            }
            ensure!(
                s.module_digest.as_deref() == Some(live.as_str()),
                "the live module changed"
            );
            Ok(())
        }
    };
    crate::cluster::wait_status(
        client,
        ns,
        "signed",
        "an unsigned candidate refused",
        rollout("refused"),
    )
    .await?;
    ensure!(
        !blob_was_read(registry, &layer_digest(&howdy)),
        "the registry was asked for the layer of an unsigned candidate"
    );
    sign(trusted, &candidate_tag, None)?;
    crate::cluster::wait_status(
        client,
        ns,
        "signed",
        "the signed candidate loaded",
        rollout("loaded"),
    )
    .await?;
    ensure!(blob_was_read(registry, &layer_digest(&howdy)));
    Ok(())
}
