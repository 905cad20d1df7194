//! Steps 3 and 4: both tutorials as their READMEs tell them, with Pods that really run on the
//! node: HelloWorld's Pod prints its greeting, and the ConfigMap restarter replaces the
//! frontend's running Pods when their ConfigMap changes.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use kube::ResourceExt;

use crate::cluster::{
    NodeCluster, QUIET, WAIT, live_pods, patch_who, running_and_ready, wait_greeting, wait_logs,
    wait_running, workspace,
};
use crate::support::eventually;
use crate::timings::{Timings, secs};

/// The frontend's Pods.
pub const FRONTEND: &str = "app=frontend";

/// The restarter's namespace.
pub const TEST_SPACE: &str = "test-space";

/// The key of the frontend ConfigMap's state among the restarter's saved states.
const STATE_KEY: &str = "test-space/frontend-config";

/// Step 3: `hello.yaml`; Pod your-name prints `Hello, Your Name!`; `who` patched; a new Pod
/// prints `Hello, My Name!`. Returns the last Pod's uid.
pub async fn hello_world(cluster: &NodeCluster, timings: &mut Timings) -> Result<String> {
    let kubectl = &cluster.kubectl;
    let hello = workspace().join("deploy/examples/hello-world/hello.yaml");
    let started = Instant::now();
    kubectl
        .run(&["apply", "-f", hello.to_str().context("non-UTF-8 path")?])
        .await?;
    let first = wait_greeting(
        &cluster.client,
        "hello",
        "your-name",
        "Hello, Your Name!",
        None,
        WAIT,
    )
    .await?;
    timings.note(format!(
        "HelloWorld applied -> Pod your-name Succeeded: {}",
        secs(started.elapsed())
    ));
    wait_logs(kubectl, "hello", "your-name", "Hello, Your Name!").await?;

    let patched = Instant::now();
    patch_who(kubectl, "My Name").await?;
    let first_uid = first.uid().unwrap_or_default();
    let second = wait_greeting(
        &cluster.client,
        "hello",
        "your-name",
        "Hello, My Name!",
        Some(&first_uid),
        WAIT,
    )
    .await?;
    timings.note(format!(
        "who patched -> new Pod your-name Succeeded: {}",
        secs(patched.elapsed())
    ));
    wait_logs(kubectl, "hello", "your-name", "Hello, My Name!").await?;
    Ok(second.uid().unwrap_or_default())
}

/// Step 4: `frontend.yaml`; both frontend Pods run; the restarter saves the data's digest; the
/// data changes; both Pods are replaced by new running ones, once. Returns the frontend Pods
/// (name -> uid) in the end.
pub async fn restarter(
    cluster: &NodeCluster,
    timings: &mut Timings,
) -> Result<BTreeMap<String, String>> {
    let kubectl = &cluster.kubectl;
    let client = &cluster.client;
    let frontend = workspace().join("deploy/examples/configmap-restarter/frontend.yaml");
    let started = Instant::now();
    kubectl
        .run(&["apply", "-f", frontend.to_str().context("non-UTF-8 path")?])
        .await?;
    let before = uids(&wait_running(client, TEST_SPACE, FRONTEND, 2, &[], WAIT).await?);
    timings.note(format!(
        "frontend applied -> both Pods Running: {}",
        secs(started.elapsed())
    ));
    let first_digest = wait_saved(cluster, None).await?;
    timings.note(format!(
        "frontend applied -> the restarter saved its digest: {}",
        secs(started.elapsed())
    ));

    let patched = Instant::now();
    kubectl
        .run(&[
            "-n",
            TEST_SPACE,
            "patch",
            "configmap",
            "frontend-config",
            "--type=merge",
            "-p",
            r#"{"data":{"TEXT3":"Hello again from the frontend"}}"#,
        ])
        .await?;
    let old: Vec<String> = before.keys().cloned().collect();
    let after = uids(&wait_running(client, TEST_SPACE, FRONTEND, 2, &old, WAIT).await?);
    timings.note(format!(
        "ConfigMap patched -> both Pods replaced by Running ones: {}",
        secs(patched.elapsed())
    ));
    wait_saved(cluster, Some(&first_digest)).await?;

    // Once: the same two Pods for a while, and each started with the new data.
    let quiet = Instant::now();
    while quiet.elapsed() < QUIET {
        let now = live_pods(client, TEST_SPACE, FRONTEND).await?;
        let running = now.values().all(running_and_ready);
        ensure!(
            uids(&now) == after && running,
            "the frontend Pods changed again after the restart: {after:?} became {:?}",
            uids(&now)
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    for pod in after.keys() {
        eventually(
            &format!("Pod {pod} printed the new TEXT3"),
            WAIT,
            || async {
                let logs = kubectl.run(&["-n", TEST_SPACE, "logs", pod]).await?;
                ensure!(
                    logs.contains("Hello again from the frontend"),
                    "it printed {logs:?}"
                );
                Ok(Some(()))
            },
        )
        .await?;
    }
    Ok(after)
}

/// Name -> uid.
pub fn uids(pods: &BTreeMap<String, k8s_openapi::api::core::v1::Pod>) -> BTreeMap<String, String> {
    pods.iter()
        .map(|(name, pod)| (name.clone(), pod.uid().unwrap_or_default()))
        .collect()
}

/// Waits until the restarter's saved state (its WasmControllerState) has a digest for
/// frontend-config other than `not`.
async fn wait_saved(cluster: &NodeCluster, not: Option<&str>) -> Result<String> {
    eventually(
        &format!("WasmController {TEST_SPACE}/configmap-restarter saves a digest for {STATE_KEY} (not {not:?})"),
        WAIT,
        || async {
            let saved = crate::support::cluster::saved_state(
                &cluster.client,
                TEST_SPACE,
                "WasmController",
                "configmap-restarter",
                STATE_KEY,
            )
            .await?;
            match saved {
                Some(digest) if Some(digest.as_str()) != not => Ok(Some(digest)),
                other => bail!("the saved state of {STATE_KEY} is {other:?}"),
            }
        },
    )
    .await
}
