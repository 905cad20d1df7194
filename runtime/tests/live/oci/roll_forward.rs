//! A moved tag rolls forward to its new digest without a restart, a digest stays, and broken
//! modules, components of another world and corrupted blobs under the tag are refused while the
//! last good module keeps running.

use super::*;

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
