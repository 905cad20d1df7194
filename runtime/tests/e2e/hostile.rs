//! Step 7: a hostile tenant against the runtime as installed (two replicas, its own RBAC from
//! `deploy/`, JSON logs, the real node). Namespace `e2e-hostile`, opted in, declares specs that
//! name a URL instead of an apiVersion (the API server refuses them) and a controller whose
//! guest logs a million empty lines, tries to forge runtime log lines, floods stdout, loops and
//! allocates. Meanwhile the HelloWorld tutorial keeps being served: `who` patched, its new Pod
//! prints the new greeting. No runtime Pod restarts (no crash, no OOM kill), every line the
//! leader logged is one JSON object, none forged, and the tenant's guest lines stay within its
//! log rate (the Deployment's defaults: 100 lines/s, burst 1000).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use crate::cluster::{
    NodeCluster, SYSTEM, WAIT, lease_holder, live_pods, patch_who, wait_greeting,
};
use crate::module_file::restarts;
use crate::support::{LogLines, apply, apply_all, eventually, json_log_lines, tenant_binding};
use crate::timings::{Timings, secs};

const NS: &str = "e2e-hostile";
const GROUP: &str = "e2e.kubewasm.dev";

/// The Deployment's `--max-log-lines-per-second` and `--log-line-burst` (the defaults).
const LOG_LINES_PER_SECOND: u64 = 100;
const LOG_LINE_BURST: u64 = 1000;

/// How long the storm runs before the checks.
const STORM: Duration = Duration::from_secs(30);

pub async fn hostile_tenant(
    cluster: &NodeCluster,
    hostile_wasm: &std::path::Path,
    timings: &mut Timings,
) -> Result<()> {
    let client = &cluster.client;
    let before = restarts(cluster).await?;
    let started = Instant::now();
    install(cluster, hostile_wasm).await?;

    // Specs that name a URL as their parent's apiVersion: refused by the CRD's schema.
    for api_version in [
        "apps/v1/namespaces/hello/deployments?watch=1&timeoutSeconds=86400",
        "apps/v1?a=b",
    ] {
        let mut spec = controller("url");
        spec["spec"]["parent"] = json!({"apiVersion": api_version, "kind": "Deployment"});
        if apply(client, &spec).await.is_ok() {
            bail!("the API server took apiVersion {api_version:?}");
        }
    }

    apply(client, &controller("storm")).await?;
    let modes = ["log-lines", "forge-log", "flood", "loop", "alloc"];
    for mode in modes {
        for copy in 0..2 {
            let probe = json!({"apiVersion": format!("{GROUP}/v1"), "kind": "Probe",
                "metadata": {"name": format!("{mode}-{copy}"), "namespace": NS,
                    "labels": {"role": "storm"}},
                "spec": {"mode": mode}});
            eventually("the Probe CRD served", WAIT, || async {
                apply(client, &probe).await.map(Some)
            })
            .await?;
        }
    }
    timings.note(format!(
        "hostile tenant installed, specs refused, storm started: {}",
        secs(started.elapsed())
    ));

    // The tutorial is served during the storm.
    tokio::time::sleep(STORM / 2).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "hello");
    let old = pods.get("your-name").await?.uid().unwrap_or_default();
    let patched = Instant::now();
    patch_who(&cluster.kubectl, "Storm").await?;
    wait_greeting(
        client,
        "hello",
        "your-name",
        "Hello, Storm!",
        Some(&old),
        WAIT,
    )
    .await?;
    timings.note(format!(
        "during the storm, who patched -> new Pod your-name Succeeded: {}",
        secs(patched.elapsed())
    ));
    tokio::time::sleep(STORM.saturating_sub(started.elapsed())).await;

    // Nothing restarted (no crash, no OOM kill), on either replica.
    let after = restarts(cluster).await?;
    ensure!(
        after == before,
        "runtime Pods restarted during the storm: before {before:?}, after {after:?}"
    );
    let holder = lease_holder(client)
        .await?
        .context("nobody holds the Lease")?;
    let names: Vec<String> = live_pods(client, SYSTEM, crate::cluster::RUNTIME_SELECTOR)
        .await?
        .into_keys()
        .collect();
    let leader = crate::cluster::holder_pod(&holder, &names).context("no leader Pod")?;
    let log = cluster
        .kubectl
        .run(&["-n", SYSTEM, "logs", &leader])
        .await?;
    let LogLines { lines, guest } = json_log_lines(&log, &format!("{NS}/storm"))?;
    let running = started.elapsed();
    let bound = LOG_LINE_BURST + LOG_LINES_PER_SECOND * (running.as_secs() + 1);
    timings.note(format!(
        "leader {leader}: {lines} log lines in all, {guest} of them the hostile tenant's guests' in {} (its rate allows {bound}); no restart",
        secs(running)
    ));
    ensure!(
        guest <= bound,
        "the hostile tenant's guests logged {guest} lines, more than its rate allows ({bound})"
    );
    ensure!(
        guest > 0,
        "no line of the hostile tenant's guests at all: is it running?"
    );
    cluster
        .kubectl
        .run(&["delete", "namespace", NS, "--wait=false"])
        .await?;
    Ok(())
}

fn controller(name: &str) -> Value {
    json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "WasmController",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
            "parent": {"apiVersion": format!("{GROUP}/v1"), "kind": "Probe", "labelSelector": "role=storm"},
            "serviceAccountName": "attacker",
            "limits": {"memory": "1Ti", "timeoutMillis": 3_600_000, "concurrency": 1024,
                "logBytes": "1Ti"}}})
}

/// The tenant: its namespace opted in, an opted-in ServiceAccount with a Role on Probes, the
/// Probe CRD (with the labelled ClusterRole that lets the runtime watch Probes), the module.
async fn install(cluster: &NodeCluster, hostile_wasm: &std::path::Path) -> Result<()> {
    let client = &cluster.client;
    let rbac = |kind: &str, body: Value| {
        let mut o = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
            "metadata": {"name": "attacker", "namespace": NS}});
        for (k, v) in body.as_object().into_iter().flatten() {
            o[k] = v.clone();
        }
        o
    };
    let wasm = std::fs::read(hostile_wasm)
        .with_context(|| format!("reading {}", hostile_wasm.display()))?;
    use base64::Engine as _;
    let module = base64::engine::general_purpose::STANDARD.encode(&wasm);
    apply_all(
        client,
        &[
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
            tenant_binding(NS)?,
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("probes.{GROUP}")},
                "spec": {"group": GROUP, "scope": "Namespaced",
                    "names": {"plural": "probes", "singular": "probe", "kind": "Probe"},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                        "subresources": {"status": {}},
                        "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "kubewasm-runtime-watch-e2e-probes",
                    "labels": {"kubewasm.dev/aggregate-to-runtime": "true"}},
                "rules": [{"apiGroups": [GROUP], "resources": ["probes"], "verbs": ["list", "watch"]}]}),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "attacker", "namespace": NS,
                "annotations": {"kubewasm.dev/wasm-controllers": "allowed"}}}),
            rbac("Role", json!({"rules": [
                {"apiGroups": [GROUP], "resources": ["probes"], "verbs": ["get", "list", "watch", "patch"]},
                {"apiGroups": [GROUP], "resources": ["probes/status"], "verbs": ["get", "patch"]},
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "patch"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]})),
            rbac("RoleBinding", json!({
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "attacker"},
                "subjects": [{"kind": "ServiceAccount", "name": "attacker", "namespace": NS}]})),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hostile", "namespace": NS},
                "binaryData": {"hostile.wasm": module}}),
        ],
    )
    .await
}
