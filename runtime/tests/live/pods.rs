//! The Chronos pod watcher from `deploy/examples/pod-watcher/`, as a read-only
//! ClusterWasmController: one line in the runtime's log per change of a Pod (added, updated
//! saying what changed, deleted), findable by the controller field, and no write at all.

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{WAIT, apply, apply_all, example, guest, module_config_map, take};
use crate::merge;
use crate::restarter::create_pod;
use crate::runtime::RuntimeProcess;
use crate::support::{ControlPlane, eventually};

/// Installs the example (module and ServiceAccount in `modules`) and changes a Pod in a
/// namespace of its own.
pub async fn pod_watcher(
    control_plane: &ControlPlane,
    client: &Client,
    modules: &str,
    runtime: &RuntimeProcess,
) -> Result<()> {
    apply_all(client, &example("pod-watcher/rbac.yaml", modules)?).await?;
    apply(
        client,
        &module_config_map(
            modules,
            "pod-watcher",
            "pod_watcher.wasm",
            &guest("pod_watcher"),
        ),
    )
    .await?;
    let mut controller = example("pod-watcher/controller.yaml", modules)?;
    let mut controller = take(&mut controller, "ClusterWasmController")?;
    controller["spec"]["module"]["configMap"]["namespace"] = json!(modules);
    apply(client, &controller).await?;

    let ns = control_plane.namespace("chronos-watched").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let offset = runtime.log_len();
    let logged = |text: String| async move {
        eventually(
            &format!("the runtime logs {text:?} for pod-watcher"),
            WAIT,
            || async {
                let log = runtime.log_since(offset);
                Ok(log
                    .lines()
                    .find(|l| l.contains(&text) && l.contains("controller=\"pod-watcher\""))
                    .map(str::to_owned))
            },
        )
        .await
    };
    create_pod(&pods, "watched", "web").await?;
    logged(format!(
        "pod {ns}/watched added: phase Pending, node -, labels {{app=web}}"
    ))
    .await?;
    pods.patch(
        "watched",
        &Default::default(),
        &merge(json!({"metadata": {"labels": {"tier": "front"}}})),
    )
    .await?;
    logged(format!(
        "pod {ns}/watched updated: labels {{app=web}} → {{app=web,tier=front}}"
    ))
    .await?;
    pods.delete("watched", &DeleteParams::default()).await?;
    logged(format!("pod {ns}/watched deleted")).await?;
    let log = runtime.log_since(offset);
    let added = log
        .lines()
        .filter(|l| l.contains(&format!("pod {ns}/watched added")))
        .count();
    ensure!(added == 1, "Pod {ns}/watched reported added {added} times");
    ensure!(
        !log.lines()
            .any(|l| l.contains("controller=\"pod-watcher\"") && l.contains("applied ")),
        "the pod watcher wrote something"
    );
    Ok(())
}
