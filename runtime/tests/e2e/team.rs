//! Step 8: a team runs its controller on the installed runtime by itself (issue 39), as alice,
//! who is only `admin` of team-x. The cluster admin's part is one label per namespace
//! (`kubewasm.dev/tenant=enabled`); everything else alice does with her own kubeconfig:
//! her controller's ServiceAccount (opted in), the tenant RoleBinding, the RoleBinding that
//! lets her guest record Events (`kubewasm-guest-events`), the module's ConfigMap and the
//! WasmController; `kubewasm wait` says its module runs; her object whose reconcile panics
//! shows in `kubewasm logs` (served by the Deployment's replicas through the aggregation
//! layer: `deploy/runtime/logs.yaml`) and as a capsule (`kubewasm capsules`) that `kubewasm
//! reconcile --capsule` replays offline to the same failure. bob, admin of team-y, is refused
//! her log and capsules and sees nothing of them.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use serde_json::json;

use crate::cluster::{NodeCluster, WAIT};
use crate::support::{Kubectl, TeamUser, eventually};
use crate::timings::{Timings, secs};

const TEAM_X: &str = "e2e-team-x";
const TEAM_Y: &str = "e2e-team-y";

/// `kubewasm ARGS` as `user`: exit success, stdout, stderr.
async fn kubewasm_as(user: &TeamUser, args: &[&str]) -> Result<(bool, String, String)> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubewasm"))
        .args(args)
        .env("KUBECONFIG", &user.kubeconfig)
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

pub async fn team_alone(
    cluster: &NodeCluster,
    hostile_wasm: &Path,
    timings: &mut Timings,
) -> Result<()> {
    let started = Instant::now();
    let cp = cluster.control_plane()?;
    // The cluster admin: two namespaces, each enabled, each with its admin.
    for ns in [TEAM_X, TEAM_Y] {
        cluster.kubectl.run(&["create", "namespace", ns]).await?;
        cp.enable_tenant(ns).await?;
    }
    let alice = cp.namespace_admin(TEAM_X, "alice").await?;
    let bob = cp.namespace_admin(TEAM_Y, "bob").await?;

    // alice, alone.
    let as_alice = Kubectl::new(&alice.kubeconfig);
    let tenant = crate::support::workspace().join("deploy/runtime/tenant.yaml");
    let tenant = tenant.to_string_lossy();
    as_alice
        .run(&["-n", TEAM_X, "apply", "-f", &tenant])
        .await?;
    let wasm = format!("hostile.wasm={}", hostile_wasm.display());
    as_alice
        .run(&[
            "-n",
            TEAM_X,
            "create",
            "configmap",
            "hostile",
            "--from-file",
            &wasm,
        ])
        .await?;
    let objects = [
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "app", "namespace": TEAM_X,
                "annotations": {"kubewasm.dev/wasm-controllers": "allowed"}}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "app", "namespace": TEAM_X},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                "verbs": ["get", "list", "watch", "create", "patch", "update"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "app", "namespace": TEAM_X},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "app"},
            "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": TEAM_X}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "app-events", "namespace": TEAM_X},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "kubewasm-guest-events"},
            "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": TEAM_X}]}),
        json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "WasmController",
            "metadata": {"name": "app", "namespace": TEAM_X},
            "spec": {"module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
                "parent": {"apiVersion": "v1", "kind": "ConfigMap", "labelSelector": "role=app"},
                "serviceAccountName": "app"}}),
    ];
    let yaml: Vec<String> = objects
        .iter()
        .map(serde_yaml::to_string)
        .collect::<Result<_, _>>()?;
    as_alice
        .run_with_input(&["apply", "-f", "-"], Some(yaml.join("---\n").as_bytes()))
        .await?;
    let (ok, out, err) = kubewasm_as(&alice, &["wait", "-n", TEAM_X, "app"]).await?;
    ensure!(ok, "kubewasm wait as alice: {out}{err}");
    timings.note(format!(
        "alice (admin of {TEAM_X} only) set up her controller alone, kubewasm wait: module runs: {}",
        secs(started.elapsed())
    ));
    // An object whose reconcile panics.
    let crash = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "crash", "namespace": TEAM_X, "labels": {"role": "app"},
            "annotations": {"kubewasm.dev/hostile-mode": "panic"}}});
    as_alice
        .run_with_input(
            &["apply", "-f", "-"],
            Some(serde_yaml::to_string(&crash)?.as_bytes()),
        )
        .await?;

    // Her log, through the aggregation layer to the replica running her controller.
    let reading = Instant::now();
    let log = eventually(
        "alice reads her controller's panic with kubewasm logs",
        WAIT,
        || async {
            let (ok, out, err) = kubewasm_as(&alice, &["logs", "-n", TEAM_X, "app"]).await?;
            ensure!(ok, "kubewasm logs: {err}");
            Ok(out.contains("panicked on purpose").then_some(out))
        },
    )
    .await?;
    ensure!(log.contains(&format!("object={TEAM_X}/crash")), "{log}");
    // Her capsule, replayed offline.
    let dir = tempfile::tempdir()?;
    let out_dir = dir.path().to_string_lossy().into_owned();
    let fetched = eventually("alice fetches her capsules", WAIT, || async {
        let args = ["capsules", "-n", TEAM_X, "app", "--out", &out_dir];
        let (ok, out, err) = kubewasm_as(&alice, &args).await?;
        ensure!(ok, "kubewasm capsules: {err}");
        Ok(dir.path().join("capsule-1.json").exists().then_some(out))
    })
    .await?;
    ensure!(fetched.contains("(replayable)"), "{fetched}");
    let capsule = dir.path().join("capsule-1.json");
    let (capsule, module) = (capsule.to_string_lossy(), hostile_wasm.to_string_lossy());
    let replay = ["reconcile", "--capsule", &capsule, "--module", &module];
    let (ok, out, err) = kubewasm_as(&alice, &replay).await?;
    ensure!(
        ok && out.contains("the same failure") && out.contains("panicked on purpose"),
        "the replay: {out}{err}"
    );
    timings.note(format!(
        "kubewasm logs showed her guest's panic, kubewasm capsules fetched it, replayed offline to the same failure: {}",
        secs(reading.elapsed())
    ));

    // bob, of team-y: nothing of hers.
    for sub in ["logs", "capsules"] {
        let (ok, out, err) = kubewasm_as(&bob, &[sub, "-n", TEAM_X, "app"]).await?;
        ensure!(
            !ok && out.is_empty() && err.contains("forbidden") && !err.contains("panicked"),
            "bob's kubewasm {sub} of alice's controller: {out} {err}"
        );
    }
    timings.note(
        "bob (admin of e2e-team-y) refused her log and capsules, shown none of them".to_owned(),
    );
    cluster
        .kubectl
        .run(&["delete", "namespace", TEAM_X, TEAM_Y, "--wait=false"])
        .await
        .context("deleting the teams' namespaces")?;
    Ok(())
}
