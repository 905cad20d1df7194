//! A tenant cannot size the runtime by what it stores: its namespace's objects of the kinds
//! the runtime caches are weighed, and once they are over `--max-cached-bytes-per-namespace`
//! they are dropped from the caches and handed to no controller, its WasmController's
//! `Ready` condition says why (`CacheBudgetExceeded`) and what to do, and its guest is not
//! called; back under the cap, the namespace is listed again and a change made meanwhile is
//! reconciled. (That another namespace is untouched, and that every watch drops the objects,
//! is proven against the control plane in `tests/watches.rs`.)

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{apply, apply_all, ensure_condition, prepare, wait_status};
use crate::isolation::{controller, install_probe_crd, install_tenant, probe, probes, wait_echo};
use crate::merge;
use crate::runtime::{RuntimeProcess, finish};

/// The operator's cap the runtime runs with; the namespace holds the guest's module
/// (~0.25 MiB) and a small ConfigMap besides the large ones.
const CAP: &str = "1Mi";
const LARGE: usize = 200 << 10;
const LARGE_CONFIG_MAPS: usize = 5;

#[tokio::test]
async fn a_namespace_over_its_cache_cap_is_held_back_with_a_status_and_served_again_under_it() {
    let control_plane = crate::support::ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "cache-cap").await;
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &["--max-cached-bytes-per-namespace", CAP],
    );
    let result = held_back(&client, &ns).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn held_back(client: &Client, ns: &str) -> Result<()> {
    install_probe_crd(client).await?;
    install_tenant(client, ns, "secret", "config").await?;
    // The guest may read ConfigMaps: the runtime caches them, and weighs the namespace's.
    let rbac = |kind: &str, body: serde_json::Value| {
        let mut o = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
            "metadata": {"name": "prober-config-maps", "namespace": ns}});
        for (k, v) in body.as_object().into_iter().flatten() {
            o[k] = v.clone();
        }
        o
    };
    apply_all(
        client,
        &[
            rbac("Role", json!({"rules": [{"apiGroups": [""], "resources": ["configmaps"],
                "verbs": ["get", "list", "watch"]}]})),
            rbac("RoleBinding", json!({
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "prober-config-maps"},
                "subjects": [{"kind": "ServiceAccount", "name": "prober", "namespace": ns}]})),
        ],
    )
    .await?;
    let grants =
        json!({"grants": [{"apiVersion": "v1", "kind": "ConfigMap", "verbs": ["get", "list"]}]});
    apply(client, &controller(ns, "steady", grants)).await?;
    apply(client, &probe(ns, "steady", "steady", json!({"echo": "1"}))).await?;
    wait_echo(client, ns, "steady", "1").await?;

    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    for i in 0..LARGE_CONFIG_MAPS {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("large-{i}")},
            "data": {"blob": "x".repeat(LARGE)},
        }))?;
        config_maps.create(&PostParams::default(), &cm).await?;
    }
    wait_status(
        client,
        ns,
        "steady",
        "Ready=False, CacheBudgetExceeded, naming the cap and the fix",
        |s| {
            let ready = ensure_condition(s, "Ready", "False")?;
            ensure!(
                ready.reason == "CacheBudgetExceeded"
                    && ready.message.contains("--max-cached-bytes-per-namespace")
                    && ready.message.contains("1.0 MiB")
                    && ready.message.contains("delete or shrink objects"),
                "Ready says {}: {}",
                ready.reason,
                ready.message
            );
            Ok(())
        },
    )
    .await?;
    // Held back: a change to the namespace's Probe is not handed to the guest.
    let reconciles = crate::cluster::controller_status(client, ns, "steady")
        .await?
        .reconciles;
    probes(client, ns)
        .patch(
            "steady",
            &Default::default(),
            &merge(json!({"spec": {"echo": "2"}})),
        )
        .await?;
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let p = probes(client, ns).get("steady").await?;
    ensure!(
        p.data.pointer("/status/echo") == Some(&json!("1")),
        "the guest was handed the held-back namespace's Probe: {:?}",
        p.data.get("status")
    );
    let now = crate::cluster::controller_status(client, ns, "steady").await?;
    ensure!(
        now.reconciles == reconciles,
        "the guest was called while its namespace was held back ({reconciles} → {})",
        now.reconciles
    );

    // Under 90% of the cap again: listed again, Running, and the change made meanwhile done.
    for i in 1..LARGE_CONFIG_MAPS {
        config_maps
            .delete(&format!("large-{i}"), &DeleteParams::default())
            .await?;
    }
    wait_status(client, ns, "steady", "Ready again under the cap", |s| {
        let ready = ensure_condition(s, "Ready", "True")?;
        ensure!(ready.reason == "Running", "Ready says {}", ready.reason);
        Ok(())
    })
    .await?;
    wait_echo(client, ns, "steady", "2").await
}
