//! Controllers naming one digest-pinned image without a pull secret share one pull and one
//! compile: the registry is asked for its manifest and layer once, however many run it — and
//! a module that does not compile is refused for each of them after one try. Controllers
//! following one tag have it resolved once per poll for all of them.

use super::*;

/// Controllers naming each image.
const CONTROLLERS: usize = 6;

/// `--module-poll-seconds`: how often a tag is resolved again.
const POLL: std::time::Duration = std::time::Duration::from_secs(1);

#[tokio::test]
async fn controllers_naming_one_pinned_image_share_one_pull() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "oci-shared").await;
    let registry = Registry::start().expect("starting docker-registry");
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &[
            "--insecure-registry",
            registry.addr(),
            "--module-poll-seconds",
            &POLL.as_secs().to_string(),
        ],
    );
    let result = shared(&client, &ns, &registry).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn shared(client: &Client, ns: &str, registry: &Registry) -> Result<()> {
    install_account(client, ns).await?;
    let hostile = guest("hostile");
    let file = crate::support::guests::guest_dir().join("hostile.wasm");
    let repo = format!("{}/pub/hello", registry.addr());
    let digest = push(&file, &format!("{repo}:v1"), None)?;
    let broken_digest =
        push_claiming_controller(registry, "pub/broken:v1", wat::parse_str("(component)")?).await?;
    let broken = format!("{}/pub/broken@{broken_digest}", registry.addr());
    let restarter = guest("configmap_restarter");
    let tagged = format!("{}/pub/tagged:v1", registry.addr());
    let restarter_file = crate::support::guests::guest_dir().join("configmap_restarter.wasm");
    push(&restarter_file, &tagged, None)?;
    for i in 0..CONTROLLERS {
        apply(
            client,
            &controller(ns, &format!("tagged-{i}"), &tagged, None, "none"),
        )
        .await?;
        let image = format!("{repo}@{digest}");
        apply(
            client,
            &controller(ns, &format!("hello-{i}"), &image, None, "shared"),
        )
        .await?;
        apply(
            client,
            &controller(ns, &format!("broken-{i}"), &broken, None, "none"),
        )
        .await?;
    }
    for i in 0..CONTROLLERS {
        runs(client, ns, &format!("tagged-{i}"), &restarter).await?;
        runs(client, ns, &format!("hello-{i}"), &hostile).await?;
        wait_module(
            client,
            ns,
            &format!("broken-{i}"),
            "refused",
            |_, st, reason, m| {
                ensure!(
                    st == "False" && reason == "ModuleInvalid",
                    "not refused yet: {m}"
                );
                Ok(())
            },
        )
        .await?;
    }
    // They run it: the probe gets the module's `data.mode`.
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    apply(client, &probe(ns, "probe", "shared")).await?;
    eventually("the module sets data.mode=ok", WAIT, || async {
        let data = config_maps.get("probe").await?.data.unwrap_or_default();
        Ok((data.get("mode").map(String::as_str) == Some("ok")).then_some(()))
    })
    .await?;
    let log = || {
        std::fs::read_to_string(registry.log())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("GET /v2/"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for (what, image_digest, layer) in [
        ("hello", &digest, layer_digest(&hostile)),
        (
            "broken",
            &broken_digest,
            layer_digest(&wat::parse_str("(component)")?),
        ),
    ] {
        ensure!(
            manifest_reads(registry, image_digest) == 1 && blob_reads(registry, &layer) == 1,
            "{CONTROLLERS} controllers naming {what}: manifest read {} times, layer {} times, want 1 and 1:\n{}",
            manifest_reads(registry, image_digest),
            blob_reads(registry, &layer),
            log()
        );
    }
    // The tag, resolved again every poll: once a poll for all six, not six times.
    let resolutions = || reads_or_heads(registry, "/pub/tagged/manifests/v1");
    let (before, since) = (resolutions(), std::time::Instant::now());
    tokio::time::sleep(5 * POLL).await;
    let polls = since.elapsed().as_secs_f64() / POLL.as_secs_f64();
    let made = resolutions() - before;
    ensure!(
        made >= 1 && made as f64 <= polls + 2.0,
        "{CONTROLLERS} controllers following one tag resolved it {made} times in {polls:.1} polls:\n{}",
        std::fs::read_to_string(registry.log())?
            .lines()
            .filter(|l| l.contains("/pub/tagged/manifests/"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}

/// Requests (GET or HEAD) in the registry's access log that name `path`.
fn reads_or_heads(registry: &Registry, path: &str) -> usize {
    std::fs::read_to_string(registry.log())
        .unwrap_or_default()
        .lines()
        .filter(|l| (l.contains("GET /v2/") || l.contains("HEAD /v2/")) && l.contains(path))
        .count()
}

/// Waits until controller `name` runs module `wasm`.
async fn runs(client: &Client, ns: &str, name: &str, wasm: &[u8]) -> Result<()> {
    let want = Some(sha256(wasm));
    wait_module(client, ns, name, "Ready", |s, st, _, _| {
        ensure!(st == "True", "not loaded yet");
        ensure!(s.module_digest == want, "{:?}", s.module_digest);
        Ok(())
    })
    .await
    .map(drop)
}
