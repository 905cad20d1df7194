//! Step 2: `kubectl apply -k deploy/`, the CRDs Established, `kubectl apply -k
//! deploy/overlays/tutorials`; both runtime Pods Running and Ready, one of them holding the
//! Lease, both running as ServiceAccount kubewasm-system/kubewasm and nothing else.

use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::{Api, ResourceExt};
use kubewasm::api::WasmController;

use crate::cluster::{
    NodeCluster, RUNTIME_SELECTOR, SYSTEM, WAIT, sha256, wait_running, workspace,
};
use crate::support::eventually;
use crate::timings::{Timings, secs};

/// The runtime's ServiceAccount, as `deploy/runtime/rbac.yaml` makes it.
const ACCOUNT: &str = "kubewasm";

/// The two runtime Pods, by what they run.
#[derive(Debug, Clone)]
pub struct RuntimePods {
    /// The Pod whose runtime holds the shard of tenant `hello` (and runs its HelloWorld).
    pub runs_hello: String,
    /// The other one.
    pub other: String,
}

/// Installs kubewasm with both tutorials and checks the runtime as installed.
pub async fn install(
    cluster: &NodeCluster,
    inputs: &crate::cluster::Inputs,
    timings: &mut Timings,
) -> Result<RuntimePods> {
    let kubectl = &cluster.kubectl;
    let deploy = workspace().join("deploy");
    let deploy = deploy.to_str().context("non-UTF-8 path")?;
    let started = Instant::now();
    apply_kustomization(kubectl, deploy, timings).await?;
    kubectl
        .run(&[
            "wait",
            "--for",
            "condition=established",
            "--timeout=60s",
            "crd/wasmcontrollers.kubewasm.dev",
            "crd/clusterwasmcontrollers.kubewasm.dev",
            "crd/wasmcontrollerstates.kubewasm.dev",
        ])
        .await?;
    let overlay = format!("{deploy}/overlays/tutorials");
    apply_kustomization(kubectl, &overlay, timings).await?;
    timings.note(format!(
        "apply -k deploy/, CRDs Established, apply -k deploy/overlays/tutorials: {}",
        secs(started.elapsed())
    ));

    let client = &cluster.client;
    let pods = wait_running(client, SYSTEM, RUNTIME_SELECTOR, 2, &[], WAIT).await?;
    timings.note(format!(
        "both runtime Pods Running and Ready {} after the first apply",
        secs(started.elapsed())
    ));

    let names: Vec<String> = pods.keys().cloned().collect();
    // Both replicas work: the shard Leases split evenly between them, each Lease held by one.
    let shares = crate::cluster::wait_shares(client, &names, WAIT).await?;
    timings.note(format!(
        "the {} shard Leases split {shares:?} {} after the first apply",
        kubewasm::controller::DEFAULT_SHARDS,
        secs(started.elapsed())
    ));
    let runs_hello = crate::cluster::runner_pod(client, "hello").await?;
    let other = names
        .iter()
        .find(|n| **n != runs_hello)
        .context("only one runtime Pod")?
        .clone();
    timings.note(format!(
        "{runs_hello} runs tenant hello ({}), {other} the other shards",
        crate::cluster::shard_lease("hello")
    ));

    for pod in pods.values() {
        runs_as_its_service_account(cluster, pod).await?;
    }
    only_what_deploy_grants(cluster).await?;

    // The overlay's controllers run, with the guests `make install-files` packed.
    let controllers = [
        ("hello", "hello-world", std::fs::read(&inputs.hello_wasm)?),
        (
            "test-space",
            "configmap-restarter",
            std::fs::read(&inputs.restarter_wasm)?,
        ),
    ];
    for (namespace, name, wasm) in controllers {
        let digest = sha256(&wasm);
        let api: Api<WasmController> = Api::namespaced(client.clone(), namespace);
        eventually(
            &format!("WasmController {namespace}/{name} is Ready with module {digest}"),
            WAIT,
            || async {
                let status = api.get(name).await?.status.unwrap_or_default();
                let ready = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "Ready")
                    .map(|c| format!("{} ({}: {})", c.status, c.reason, c.message));
                ensure!(
                    ready.as_deref().is_some_and(|r| r.starts_with("True")),
                    "Ready is {ready:?}"
                );
                ensure!(
                    status.module_digest.as_deref() == Some(digest.as_str()),
                    "moduleDigest is {:?}",
                    status.module_digest
                );
                Ok(Some(()))
            },
        )
        .await?;
    }
    timings.note(format!(
        "both tutorial WasmControllers Ready {} after the first apply",
        secs(started.elapsed())
    ));
    Ok(RuntimePods { runs_hello, other })
}

/// The Pod runs as ServiceAccount kubewasm-system/kubewasm, and its only credential is that
/// account's own token: no kubeconfig, no other Secret mounted, no admin token anywhere (its
/// other volumes: the module files' ConfigMap and the module caches' emptyDirs).
async fn runs_as_its_service_account(cluster: &NodeCluster, pod: &Pod) -> Result<()> {
    let name = pod.name_any();
    let spec = pod.spec.as_ref().context("a Pod without spec")?;
    ensure!(
        pod.namespace().as_deref() == Some(SYSTEM)
            && spec.service_account_name.as_deref() == Some(ACCOUNT),
        "Pod {name} runs as {:?}/{:?}, want {SYSTEM}/{ACCOUNT}",
        pod.namespace(),
        spec.service_account_name
    );
    ensure!(
        spec.automount_service_account_token != Some(false),
        "Pod {name} does not mount its ServiceAccount token"
    );
    for container in &spec.containers {
        let env: Vec<&str> = container
            .env
            .iter()
            .flatten()
            .map(|e| e.name.as_str())
            .collect();
        ensure!(
            !env.contains(&"KUBECONFIG") && container.env_from.is_none(),
            "container {} of {name} gets a kubeconfig or other environment: {env:?}",
            container.name
        );
        let args = container.args.clone().unwrap_or_default();
        ensure!(
            !args.iter().any(|a| a.starts_with("--kubeconfig")),
            "container {} of {name} is given a kubeconfig: {args:?}",
            container.name
        );
    }
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), SYSTEM);
    for volume in spec.volumes.iter().flatten() {
        if let Some(cm) = &volume.config_map {
            ensure!(
                cm.name == "kubewasm-modules",
                "Pod {name} mounts ConfigMap {}",
                cm.name
            );
        } else if let Some(secret) = &volume.secret {
            // 1.20: the token controller's Secret of the ServiceAccount.
            let secret_name = secret.secret_name.clone().unwrap_or_default();
            let found = secrets.get(&secret_name).await?;
            let account = found
                .annotations()
                .get("kubernetes.io/service-account.name")
                .cloned();
            ensure!(
                found.type_.as_deref() == Some("kubernetes.io/service-account-token")
                    && account.as_deref() == Some(ACCOUNT),
                "Pod {name} mounts Secret {secret_name} ({:?} of {account:?}), not its ServiceAccount token",
                found.type_
            );
        } else if let Some(projected) = &volume.projected {
            // Bound tokens (newer clusters): a token, kube-root-ca.crt and the namespace.
            for source in projected.sources.iter().flatten() {
                let config_map = source.config_map.as_ref().map(|c| c.name.as_str());
                ensure!(
                    source.service_account_token.is_some()
                        || source.downward_api.is_some()
                        || config_map == Some("kube-root-ca.crt"),
                    "Pod {name} mounts a projected volume {} with {source:?}",
                    volume.name
                );
            }
        } else if let Some(dir) = &volume.empty_dir {
            // The compiled- and pulled-module caches: the runtime's own scratch space, bounded.
            ensure!(
                ["compiled", "pulled"].contains(&volume.name.as_str()) && dir.size_limit.is_some(),
                "Pod {name} mounts an emptyDir {} without a size limit: {dir:?}",
                volume.name
            );
        } else {
            bail!("Pod {name} mounts an unexpected volume: {volume:?}");
        }
    }
    Ok(())
}

/// What the runtime's identity may do is what `deploy/runtime/rbac.yaml` grants, checked the
/// way an admin would (`kubectl auth can-i --as`).
async fn only_what_deploy_grants(cluster: &NodeCluster) -> Result<()> {
    let me = format!("--as=system:serviceaccount:{SYSTEM}:{ACCOUNT}");
    let checks: &[(&[&str], bool)] = &[
        (&["list", "configmaps", "-A"], true),
        (&["watch", "wasmcontrollers.kubewasm.dev", "-A"], true),
        (
            &[
                "patch",
                "wasmcontrollers.kubewasm.dev",
                "--subresource=status",
                "-A",
            ],
            true,
        ),
        // Only in the namespaces the tutorials overlay opts in (deploy/runtime/tenant.yaml).
        (&["impersonate", "serviceaccounts", "-n", "hello"], true),
        (
            &["impersonate", "serviceaccounts", "-n", "test-space"],
            true,
        ),
        (
            &["impersonate", "serviceaccounts", "-n", "kube-system"],
            false,
        ),
        (&["get", "serviceaccounts", "-n", "hello"], true),
        (&["get", "serviceaccounts", "-n", "kube-system"], false),
        (&["impersonate", "serviceaccounts", "-A"], false),
        (
            &["update", "leases.coordination.k8s.io", "-n", SYSTEM],
            true,
        ),
        (&["patch", "wasmcontrollers.kubewasm.dev", "-A"], false),
        (&["patch", "wasmcontrollerstates.kubewasm.dev", "-A"], true),
        (
            &["delete", "wasmcontrollerstates.kubewasm.dev", "-A"],
            false,
        ),
        (&["get", "secrets", "-A"], false),
        (&["create", "pods", "-A"], false),
        (&["impersonate", "users", "-A"], false),
        (&["impersonate", "groups", "-A"], false),
        (
            &["update", "leases.coordination.k8s.io", "-n", "default"],
            false,
        ),
        (&["*", "*", "-A"], false),
    ];
    let mut wrong = Vec::new();
    for (args, want) in checks {
        let mut all = args.to_vec();
        all.push(&me);
        if cluster.kubectl.can_i(&all).await? != *want {
            wrong.push(if *want {
                format!("may not {}, which deploy/ grants", args.join(" "))
            } else {
                format!("may {}, which deploy/ does not grant", args.join(" "))
            });
        }
    }
    ensure!(
        wrong.is_empty(),
        "ServiceAccount {SYSTEM}/{ACCOUNT}: {}",
        wrong.join("; ")
    );
    Ok(())
}

/// `kubectl apply -k dir`, as a user does, on a server that serves `policy/v1`. The local
/// cluster is Kubernetes 1.20 (what builds here from Debian's source), which serves the
/// PodDisruptionBudget only as `policy/v1beta1` (the same fields; `policy/v1` came in 1.21, and
/// 1.25 removed `v1beta1`): there the rendered manifests' one PodDisruptionBudget is applied as
/// `policy/v1beta1`, and the timings say so.
pub async fn apply_kustomization(
    kubectl: &crate::support::Kubectl,
    dir: &str,
    timings: &mut Timings,
) -> Result<()> {
    let versions = kubectl.run(&["api-versions"]).await?;
    if versions.lines().any(|v| v.trim() == "policy/v1") {
        kubectl.run(&["apply", "-k", dir]).await?;
        return Ok(());
    }
    let rendered = kubectl.run(&["kustomize", dir]).await?;
    const V1: &str = "apiVersion: policy/v1\nkind: PodDisruptionBudget";
    ensure!(
        rendered.matches(V1).count() == 1,
        "kubectl kustomize {dir} has no single policy/v1 PodDisruptionBudget"
    );
    let rendered = rendered.replace(V1, "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget");
    kubectl
        .run_with_input(&["apply", "-f", "-"], Some(rendered.as_bytes()))
        .await?;
    timings.note(format!(
        "{dir}: the server has no policy/v1 (Kubernetes < 1.21): its PodDisruptionBudget applied as policy/v1beta1"
    ));
    Ok(())
}
