//! Step 6: a guest from a file of the runtime: ConfigMap kubewasm-system/kubewasm-modules,
//! which the Deployment mounts (optional) at `--module-dir`, and a ClusterWasmController whose
//! `spec.module.path` names one of its keys. The ConfigMap is created only now, after the
//! runtime Pods started without it: the kubelet fills an optional ConfigMap volume that
//! appears later on its next sync of the Pod, without restarting it. Then the ConfigMap gets
//! another guest under the same key: the kubelet swaps the file (a symlink swap), the runtime
//! polls it (`--module-poll-seconds`, 5) and loads it, without restarting.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use kubewasm::api::ClusterWasmController;

use crate::cluster::{
    Inputs, NodeCluster, RUNTIME_SELECTOR, SYSTEM, WAIT, live_pods, sha256, shard_holder,
    wait_greeting, wait_logs,
};
use crate::install::RuntimePods;
use crate::support::eventually;
use crate::timings::{Timings, secs};

/// The module ConfigMap the Deployment mounts at `--module-dir`.
const MODULES: &str = "kubewasm-modules";

/// Its key, the file the ClusterWasmController names.
const KEY: &str = "hello_world.wasm";

/// The ClusterWasmController of `module-file.yaml`.
const CONTROLLER: &str = "e2e-module-file";

/// How long the kubelet may take to update a ConfigMap volume: its sync of the Pod
/// (`syncFrequency` 10 s in deploy/dev/local/node.sh, plus jitter), then the runtime's poll.
const FILE_WAIT: Duration = Duration::from_secs(150);

/// Runs the step.
pub async fn module_file(
    cluster: &NodeCluster,
    inputs: &Inputs,
    pods: &RuntimePods,
    timings: &mut Timings,
) -> Result<()> {
    let kubectl = &cluster.kubectl;
    let client = &cluster.client;
    let before = restarts(cluster).await?;
    let holder = shard_holder(client, CONTROLLER).await?;

    let hello = std::fs::read(&inputs.hello_wasm)?;
    let restarter = std::fs::read(&inputs.restarter_wasm)?;
    let (hello_digest, restarter_digest) = (sha256(&hello), sha256(&restarter));

    let created = Instant::now();
    let manifest = modules_config_map(cluster, inputs.hello_wasm.clone()).await?;
    kubectl
        .run_with_input(&["create", "-f", "-"], Some(manifest.as_bytes()))
        .await?;
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/module-file.yaml");
    kubectl.run(&["apply", "-f", fixture]).await?;
    let file_seen = wait_file_and_digest(cluster, pods, &hello, &hello_digest, created).await?;
    timings.note(format!(
        "ConfigMap {MODULES} created (after the Pods started) -> file in its runner's volume: {}, \
         ClusterWasmController Ready with its digest: {}",
        file_seen.map_or_else(|| "not looked at".to_owned(), secs),
        secs(created.elapsed())
    ));
    let greeting = wait_greeting(
        client,
        "e2e-module-file",
        "from-file",
        "Hello, Module File!",
        None,
        WAIT,
    )
    .await?;
    wait_logs(
        kubectl,
        "e2e-module-file",
        &greeting.name_any(),
        "Hello, Module File!",
    )
    .await?;
    timings.note(format!(
        "the file's guest made Pod from-file, Succeeded {} after the ConfigMap",
        secs(created.elapsed())
    ));

    let replaced = Instant::now();
    let manifest = modules_config_map(cluster, inputs.restarter_wasm.clone()).await?;
    kubectl
        .run_with_input(&["replace", "-f", "-"], Some(manifest.as_bytes()))
        .await?;
    let file_seen =
        wait_file_and_digest(cluster, pods, &restarter, &restarter_digest, replaced).await?;
    timings.note(format!(
        "ConfigMap replaced with configmap_restarter.wasm -> file swapped in its runner's volume: {}, \
         status.moduleDigest changed: {}",
        file_seen.map_or_else(|| "not looked at".to_owned(), secs),
        secs(replaced.elapsed())
    ));

    // Reloaded in place: the same Pods, never restarted, the same holder of its shard.
    let after = restarts(cluster).await?;
    ensure!(
        after == before,
        "the runtime Pods changed while the module file changed: {before:?} became {after:?}"
    );
    ensure!(
        after.values().all(|(_, restarts)| *restarts == 0),
        "runtime containers restarted: {after:?}"
    );
    ensure!(
        shard_holder(client, CONTROLLER).await? == holder,
        "the shard of {CONTROLLER} changed hands while the module file changed"
    );
    Ok(())
}

/// `kubectl create configmap kubewasm-modules --from-file=hello_world.wasm=<wasm>
/// --dry-run=client -o yaml`, to be created or replaced.
async fn modules_config_map(cluster: &NodeCluster, wasm: PathBuf) -> Result<String> {
    let from = format!(
        "--from-file={KEY}={}",
        wasm.to_str().context("non-UTF-8 path")?
    );
    cluster
        .kubectl
        .run(&[
            "-n",
            SYSTEM,
            "create",
            "configmap",
            MODULES,
            &from,
            "--dry-run=client",
            "-o",
            "yaml",
        ])
        .await
}

/// Runtime Pods: name -> (uid, restarts of its containers).
pub(crate) async fn restarts(cluster: &NodeCluster) -> Result<BTreeMap<String, (String, i32)>> {
    let pods = live_pods(&cluster.client, SYSTEM, RUNTIME_SELECTOR).await?;
    Ok(pods
        .iter()
        .map(|(name, pod)| {
            let restarts = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .map_or(0, |cs| cs.iter().map(|c| c.restart_count).sum());
            (name.clone(), (pod.uid().unwrap_or_default(), restarts))
        })
        .collect())
}

/// Waits until the ClusterWasmController is Ready and runs `digest`; meanwhile notes when the
/// volume of the Pod running it has the file on the node with `bytes` (the kubelet's part), if it can be
/// seen (the test runs on the node).
async fn wait_file_and_digest(
    cluster: &NodeCluster,
    pods: &RuntimePods,
    bytes: &[u8],
    digest: &str,
    since: Instant,
) -> Result<Option<Duration>> {
    let runtime: Api<Pod> = Api::namespaced(cluster.client.clone(), SYSTEM);
    let runner = crate::cluster::runner_pod(&cluster.client, CONTROLLER)
        .await
        .unwrap_or_else(|_| pods.runs_hello.clone());
    let uid = runtime.get(&runner).await?.uid().unwrap_or_default();
    let node_root = std::env::var_os("KUBEWASM_NODE_ROOT")
        .map_or_else(|| PathBuf::from("/var/lib/kubewasm-node"), PathBuf::from);
    let volume = node_root.join(format!(
        "kubelet/pods/{uid}/volumes/kubernetes.io~configmap/modules"
    ));
    let file = volume.join(KEY);
    let visible = volume.is_dir();
    let mut file_seen = None;
    let controllers: Api<ClusterWasmController> = Api::all(cluster.client.clone());
    let file_seen_ref = &mut file_seen;
    eventually(
        &format!("ClusterWasmController {CONTROLLER} is Ready with module {digest}"),
        FILE_WAIT,
        || {
            if visible
                && file_seen_ref.is_none()
                && std::fs::read(&file).is_ok_and(|now| now == bytes)
            {
                *file_seen_ref = Some(since.elapsed());
            }
            let controllers = controllers.clone();
            async move {
                let status = controllers
                    .get(CONTROLLER)
                    .await?
                    .status
                    .unwrap_or_default();
                let condition = |type_: &str| {
                    status
                        .conditions
                        .iter()
                        .find(|c| c.type_ == type_)
                        .map(|c| format!("{} ({}: {})", c.status, c.reason, c.message))
                };
                let (ready, module) = (condition("Ready"), condition("ModuleReady"));
                ensure!(
                    status.module_digest.as_deref() == Some(digest),
                    "moduleDigest is {:?}; ModuleReady {module:?}",
                    status.module_digest
                );
                for (name, c) in [("Ready", &ready), ("ModuleReady", &module)] {
                    ensure!(
                        c.as_deref().is_some_and(|c| c.starts_with("True")),
                        "{name} is {c:?}"
                    );
                }
                Ok(Some(()))
            }
        },
    )
    .await?;
    if visible && file_seen.is_none() && std::fs::read(&file).is_ok_and(|now| now == bytes) {
        file_seen = Some(since.elapsed());
    }
    Ok(file_seen)
}
