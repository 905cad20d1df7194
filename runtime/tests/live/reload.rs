//! Hot reload: the module ConfigMap of a running controller is replaced, first by another
//! guest, then by bytes that are no module, while the same `kubewasm run` process goes on.

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PatchParams;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::{
    WAIT, apply, apply_all, condition, controller_status, ensure_condition, fixture, guest,
    module_config_map, prepare, sha256, wait_status,
};
use crate::restarter::{Owner, wait_digest};
use crate::runtime::{RuntimeProcess, finish};
use crate::support::{ControlPlane, eventually};
use crate::{SELECTOR_ANNOTATION, merge};

#[tokio::test]
async fn hot_reload_swaps_the_module_and_keeps_the_last_good_one() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "reload").await;
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = hot_reload(&client, &ns, &mut runtime).await;
    finish(result, &mut [&mut runtime]);
    drop(runtime);
    let _ = control_plane.delete_namespace(&ns).await;
}

/// A ConfigMap the reload test's controller looks after.
fn probe(ns: &str, name: &str, value: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": name, "namespace": ns,
            "labels": {"kubewasm-test": "reload"},
            "annotations": {SELECTOR_ANNOTATION: "app=reload-none"},
        },
        "data": {"value": value},
    })
}

async fn hot_reload(client: &Client, ns: &str, runtime: &mut RuntimeProcess) -> Result<()> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let (hostile, restarter) = (guest("hostile"), guest("configmap_restarter"));
    let module = |wasm: &[u8]| module_config_map(ns, "reload-module", "controller.wasm", wasm);
    apply(client, &module(&hostile)).await?;
    apply_all(client, &fixture("reload.yaml", ns)?).await?;
    apply(client, &probe(ns, "probe-a", "1")).await?;

    // Module A, the hostile guest in mode `ok`: `data.mode: ok` on its parent.
    eventually("module A sets data.mode=ok on probe-a", WAIT, || async {
        let cm = config_maps.get("probe-a").await?;
        let data = cm.data.unwrap_or_default();
        Ok((data.get("mode").map(String::as_str) == Some("ok")).then_some(()))
    })
    .await?;
    let pid = runtime.pid();
    let what = "moduleDigest names module A and its reconciles succeed";
    wait_status(client, ns, "reloader", what, |s| {
        ensure!(
            s.module_digest == Some(sha256(&hostile)),
            "moduleDigest is {:?}",
            s.module_digest
        );
        ensure_condition(s, "Degraded", "False")?;
        Ok(())
    })
    .await?;

    // Module B, the ConfigMap restarter: its saved digest instead.
    apply(client, &module(&restarter)).await?;
    wait_status(
        client,
        ns,
        "reloader",
        "moduleDigest names module B after the swap",
        |s| {
            ensure!(
                s.module_digest == Some(sha256(&restarter)),
                "moduleDigest is {:?}",
                s.module_digest
            );
            ensure_condition(s, "ModuleReady", "True")?;
            Ok(())
        },
    )
    .await?;
    apply(client, &probe(ns, "probe-b", "1")).await?;
    let owner = Owner::Namespaced(ns, "reloader");
    let probe_b = format!("{ns}/probe-b");
    let recorded = wait_digest(client, owner, &probe_b, None).await?;
    let data = config_maps.get("probe-b").await?.data.unwrap_or_default();
    ensure!(
        !data.contains_key("mode"),
        "module A still ran for probe-b: {data:?}"
    );
    ensure!(runtime.pid() == pid, "the runtime was restarted");

    // Not a module: B keeps running, the status says why the new bytes were refused.
    apply(client, &module(b"this is not a WebAssembly module")).await?;
    let status = wait_status(
        client,
        ns,
        "reloader",
        "ModuleReady=False for bytes that are no module",
        |s| {
            ensure_condition(s, "ModuleReady", "False")?;
            Ok(())
        },
    )
    .await?;
    let module_ready = condition(&status, "ModuleReady")?;
    ensure!(
        module_ready.reason == "ModuleInvalid"
            && module_ready.message.contains("not a WebAssembly"),
        "ModuleReady is {}: {}",
        module_ready.reason,
        module_ready.message
    );
    ensure!(
        status.module_digest == Some(sha256(&restarter)),
        "moduleDigest is {:?}, want module B's",
        status.module_digest
    );
    config_maps
        .patch(
            "probe-b",
            &PatchParams::default(),
            &merge(json!({"data": {"value": "2"}})),
        )
        .await?;
    wait_digest(client, owner, &probe_b, Some(&recorded)).await?;
    let status = controller_status(client, ns, "reloader").await?;
    ensure_condition(&status, "Ready", "True")?;
    runtime.ensure_running()?;
    ensure!(runtime.pid() == pid, "the runtime was restarted");
    Ok(())
}
