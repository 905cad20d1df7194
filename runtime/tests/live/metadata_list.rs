//! The ConfigMaps' metadata is listed whole from the API server's watch cache (the list's
//! request, in the runtime's log, says so), each list cut off past `--metadata-list-bytes`. A
//! team whose ConfigMaps carry large annotations (a tenant's to size: up to 256 KiB each)
//! pushes that list past the cap: the runtime must then list them in pages instead, say so
//! once, and lose nothing — the team's controller starts with its module, and a change of that
//! module is still seen.

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{
    WAIT, apply, apply_all, ensure_condition, fixture, guest, module_config_map, prepare, sha256,
    wait_status,
};
use crate::runtime::{RuntimeProcess, TEST_LOG_FILTER, finish};
use crate::support::{ControlPlane, eventually};

/// The cap the second runtime runs with; the team's padded ConfigMaps hold four times as much.
const CAP: &str = "256Ki";

/// Bytes of annotations on each of the team's [`PADDED`] ConfigMaps.
const PADDING: usize = 200 * 1024;
const PADDED: usize = 5;

/// What the runtime says when a list is over the cap.
const OVER: &str = "is over --metadata-list-bytes";

/// What it says once the ConfigMaps' metadata is listed.
const STARTED: &str = "then the ConfigMaps' metadata listed";

#[tokio::test]
async fn configmaps_past_the_metadata_list_cap_are_listed_in_pages_and_lose_nothing() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "metadata-cap").await;
    // With kube's requests in its log: the list's own request is what shows where it came from.
    let mut first = RuntimeProcess::start_with_log_filter(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &[],
        &format!("{TEST_LOG_FILTER},kube_client=debug"),
    );
    let mut second = None;
    let result = async {
        let team = control_plane.namespace_admin(&ns, "alice").await?;
        set_up(&client, &team.client().await?, &ns).await?;
        // Under the default cap: listed from the cache, nothing said (its controller starts
        // only once they are listed).
        module_is(&client, &ns, &guest("configmap_restarter")).await?;
        ensure!(first.log().contains(STARTED), "no start in the log");
        ensure!(
            !first.log().contains(OVER),
            "the default cap was reached by {PADDED} ConfigMaps"
        );
        from_the_cache(&first.log(), &ns)?;
        first.stop()?;
        let runtime = second.insert(RuntimeProcess::start_with_args(
            &control_plane.runtime_kubeconfig(),
            &ns,
            &["--metadata-list-bytes", CAP],
        ));
        checked(&client, &ns, runtime).await
    }
    .await;
    match second.as_mut() {
        Some(second) => finish(result, &mut [&mut first, second]),
        None => finish(result, &mut [&mut first]),
    }
    let _ = control_plane.delete_namespace(&ns).await;
}

/// The runtime's first list of the ConfigMaps (their metadata) asked the API server's cache
/// for all of them at once: `resourceVersion=0` and no `limit` (with a limit, the API server
/// pages from etcd, each page reading whole ConfigMaps).
fn from_the_cache(log: &str, ns: &str) -> Result<()> {
    let lists: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("requesting") && l.contains("otel.name=\"list\""))
        .filter_map(|l| l.split("http.url=").nth(1)?.split_whitespace().next())
        .filter(|url| url.contains(&format!("/namespaces/{ns}/configmaps?")))
        .collect();
    let first = lists
        .first()
        .ok_or_else(|| anyhow::anyhow!("no list of the ConfigMaps in the runtime's log"))?;
    ensure!(
        first.contains("resourceVersion=0") && !first.contains("limit="),
        "the first list of the ConfigMaps was not asked of the cache whole: {first}"
    );
    Ok(())
}

/// The team's padded ConfigMaps (as the team: a namespace admin), then the controller.
async fn set_up(admin: &Client, team: &Client, ns: &str) -> Result<()> {
    let config_maps: Api<ConfigMap> = Api::namespaced(team.clone(), ns);
    for i in 0..PADDED {
        let padded: ConfigMap = serde_json::from_value(json!({
            "metadata": {
                "name": format!("padded-{i}"),
                "annotations": {"example.com/padding": "x".repeat(PADDING)},
            },
            "data": {"a": "b"},
        }))?;
        config_maps.create(&PostParams::default(), &padded).await?;
    }
    let module = |wasm: &[u8]| module_config_map(ns, "reload-module", "controller.wasm", wasm);
    apply(admin, &module(&guest("configmap_restarter"))).await?;
    apply_all(admin, &fixture("reload.yaml", ns)?).await?;
    Ok(())
}

async fn checked(client: &Client, ns: &str, runtime: &RuntimeProcess) -> Result<()> {
    // Over the cap: in pages, said once; the runtime starts its controllers once they are
    // listed (its status is the first runtime's until the new module below).
    eventually(
        "the runtime lists the ConfigMaps' metadata and starts",
        WAIT,
        || async { Ok(runtime.log().contains(STARTED).then_some(())) },
    )
    .await?;
    let said = runtime.log().matches(OVER).count();
    ensure!(
        said == 1,
        "the runtime said {said} times that the list is over the cap, not once"
    );
    // The watch goes on after the pages: a new module is seen.
    let hostile = guest("hostile");
    apply(
        client,
        &module_config_map(ns, "reload-module", "controller.wasm", &hostile),
    )
    .await?;
    module_is(client, ns, &hostile).await
}

/// Waits until the controller runs `wasm`.
async fn module_is(client: &Client, ns: &str, wasm: &[u8]) -> Result<()> {
    let digest = sha256(wasm);
    wait_status(
        client,
        ns,
        "reloader",
        "the controller runs its module",
        |s| {
            ensure!(
                s.module_digest.as_deref() == Some(digest.as_str()),
                "moduleDigest is {:?}",
                s.module_digest
            );
            ensure_condition(s, "ModuleReady", "True")?;
            Ok(())
        },
    )
    .await?;
    Ok(())
}
