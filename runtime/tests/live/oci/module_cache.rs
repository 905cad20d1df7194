//! A restarted runtime reads a layer it pulled before from `--module-cache-dir`, not from the
//! registry.

use super::*;

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
