//! A team's day on the shared runtime, as the team: a user who is only `admin` of its
//! namespace (the built-in role, bound by a RoleBinding), with a kubeconfig of its own.
//!
//! - What the installation aggregates into `admin`/`edit`/`view` (deploy/runtime/rbac.yaml)
//!   lets it create, read, change and delete WasmControllers in its namespace — and nowhere
//!   else, and never a ClusterWasmController.
//! - It cannot let its namespace use the runtime: the label is the cluster admin's; until it
//!   is set, its controller says who sets it and how; then the controller runs.
//! - Its controller's Events: refused, the status says so and names the RoleBinding; the team
//!   makes it itself (bind of kubewasm-guest-events) and the Events appear on its object.
//! - `kubewasm wait` with its kubeconfig: exit 0 on a good module, non-zero with the reason on
//!   bytes that are no module (READY says the new module is refused), refused for another
//!   team's controller.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Event, Namespace};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::{WAIT, ensure_condition, guest, module_config_map, prepare, wait_status};
use crate::runtime::{RuntimeProcess, finish, kubewasm_bin};
use crate::support::{ControlPlane, Kubectl, TENANT_LABEL, TeamUser, eventually};

/// How long kube-controller-manager may take to aggregate the new rules into `admin`.
const AGGREGATED: Duration = Duration::from_secs(30);

const MODULE_KEY: &str = "configmap_restarter.wasm";

#[tokio::test]
async fn a_namespace_admin_runs_its_controllers_alone_within_its_namespace() {
    let control_plane = ControlPlane::shared();
    let (admin, ns) = prepare(control_plane, "team-x").await;
    let other = control_plane
        .namespace("team-y")
        .await
        .expect("the other team's namespace");
    // The runtime as installed (its own identity), asking RBAC again every 2 s.
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &["--access-review-seconds", "2"],
    );
    let result = async {
        let team = control_plane.namespace_admin(&ns, "alice").await?;
        rbac(&team, &other).await?;
        view_and_edit(control_plane, &admin, &ns).await?;
        enabled_by_the_cluster_admin(control_plane, &admin, &team).await?;
        events(&team).await?;
        unwatched_kind(control_plane, &admin, &team).await?;
        honest_updates(&admin, &team, &other).await
    }
    .await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
    let _ = control_plane.delete_namespace(&other).await;
}

/// What `user`'s SelfSubjectAccessReview answers for `verb resource` in `namespace`.
async fn may(
    client: &Client,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: &str,
    name: Option<&str>,
) -> Result<bool> {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_owned())),
        None => (resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                namespace: Some(namespace.to_owned()).filter(|n| !n.is_empty()),
                verb: Some(verb.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                name: name.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

fn controller(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "WasmController",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "module": {"configMap": {"name": "restarter-module", "key": MODULE_KEY}},
            "parent": {"apiVersion": "v1", "kind": "ConfigMap"},
            "grants": [{"apiVersion": "v1", "kind": "Pod", "verbs": ["list", "delete"]}],
            "serviceAccountName": "restarter"}})
}

fn is_forbidden<T: std::fmt::Debug>(what: &str, result: kube::Result<T>) -> Result<()> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
        other => anyhow::bail!("{what}: want 403 Forbidden, got {other:?}"),
    }
}

/// WasmControllers by the team's own RBAC: allowed in its namespace, refused elsewhere.
async fn rbac(team: &TeamUser, other: &str) -> Result<()> {
    let client = team.client().await?;
    let ns = team.namespace.as_str();
    let wc = "kubewasm.dev";
    let allowed: &[(&str, &str, &str, &str, Option<&str>)] = &[
        ("get", wc, "wasmcontrollers", ns, None),
        ("list", wc, "wasmcontrollers", ns, None),
        ("watch", wc, "wasmcontrollers", ns, None),
        ("create", wc, "wasmcontrollers", ns, None),
        ("patch", wc, "wasmcontrollers", ns, None),
        ("update", wc, "wasmcontrollers", ns, None),
        ("delete", wc, "wasmcontrollers", ns, None),
        ("get", wc, "wasmcontrollers/status", ns, None),
        ("list", wc, "wasmcontrollerstates", ns, None),
        (
            "bind",
            "rbac.authorization.k8s.io",
            "clusterroles",
            ns,
            Some("kubewasm-guest-events"),
        ),
    ];
    let refused: &[(&str, &str, &str, &str, Option<&str>)] = &[
        ("create", wc, "wasmcontrollers", other, None),
        ("get", wc, "wasmcontrollers", other, None),
        ("list", wc, "wasmcontrollers", "", None),
        ("list", wc, "clusterwasmcontrollers", "", None),
        ("create", wc, "clusterwasmcontrollers", "", None),
        ("patch", wc, "wasmcontrollers/status", ns, None),
        ("delete", wc, "wasmcontrollerstates", ns, None),
        ("patch", "", "namespaces", "", Some(ns)),
        ("create", "", "events", ns, None),
        (
            "bind",
            "rbac.authorization.k8s.io",
            "clusterroles",
            ns,
            Some("cluster-admin"),
        ),
        (
            "bind",
            "rbac.authorization.k8s.io",
            "clusterroles",
            other,
            Some("kubewasm-guest-events"),
        ),
    ];
    // kube-controller-manager aggregates the rules into `admin` a moment after they apply.
    eventually(
        "the team's admin role has the aggregated kubewasm rules",
        AGGREGATED,
        || async {
            let mut wrong = Vec::new();
            for (want, requests) in [(true, allowed), (false, refused)] {
                for &(verb, group, resource, namespace, name) in requests {
                    if may(&client, verb, group, resource, namespace, name).await? != want {
                        wrong.push(format!(
                            "{} {verb} {group}/{resource} {name:?} in {namespace:?}",
                            if want { "refused" } else { "allowed" }
                        ));
                    }
                }
            }
            ensure!(wrong.is_empty(), "{}", wrong.join("; "));
            Ok(Some(()))
        },
    )
    .await?;

    // Real requests, as the team.
    let mine: Api<kubewasm::api::WasmController> = Api::namespaced(client.clone(), ns);
    let probe = controller(ns, "probe");
    let created = mine
        .create(&PostParams::default(), &serde_json::from_value(probe)?)
        .await
        .context("the team creates a WasmController in its namespace")?;
    ensure!(created.metadata.name.as_deref() == Some("probe"));
    mine.get("probe").await?;
    ensure!(
        mine.list(&ListParams::default()).await?.items.len() == 1,
        "the team lists its WasmControllers"
    );
    mine.patch(
        "probe",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"resyncPeriodSeconds": 60}})),
    )
    .await
    .context("the team patches its WasmController")?;
    is_forbidden(
        "the team writes its controller's status",
        mine.patch_status(
            "probe",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"reconciles": 7}})),
        )
        .await,
    )?;
    mine.delete("probe", &DeleteParams::default())
        .await
        .context("the team deletes its WasmController")?;

    let theirs: Api<kubewasm::api::WasmController> = Api::namespaced(client.clone(), other);
    is_forbidden(
        "the team creates a WasmController in another team's namespace",
        theirs
            .create(
                &PostParams::default(),
                &serde_json::from_value(controller(other, "intruder"))?,
            )
            .await,
    )?;
    is_forbidden(
        "the team lists another team's WasmControllers",
        theirs.list(&ListParams::default()).await,
    )?;
    let cluster: Api<kubewasm::api::ClusterWasmController> = Api::all(client.clone());
    let cwc = json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "ClusterWasmController",
        "metadata": {"name": format!("{ns}-cluster")},
        "spec": {"module": {"configMap": {"name": "m", "key": "k", "namespace": ns}},
            "parent": {"apiVersion": "v1", "kind": "ConfigMap"},
            "serviceAccountName": "restarter", "serviceAccountNamespace": ns}});
    is_forbidden(
        "the team creates a ClusterWasmController",
        cluster
            .create(&PostParams::default(), &serde_json::from_value(cwc)?)
            .await,
    )?;
    is_forbidden(
        "the team lists ClusterWasmControllers",
        cluster.list(&ListParams::default()).await,
    )?;
    Ok(())
}

/// A client acting as `user` (impersonated with the admin's credentials, group
/// `system:authenticated` alone).
async fn as_user(control_plane: &ControlPlane, user: &str) -> Result<Client> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let mut kubeconfig = Kubeconfig::read_from(control_plane.kubeconfig())?;
    for named in &mut kubeconfig.auth_infos {
        if let Some(auth) = named.auth_info.as_mut() {
            auth.impersonate = Some(user.to_owned());
        }
    }
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// The built-in `view` reads WasmControllers and writes none; `edit` writes them but cannot
/// bind kubewasm-guest-events (it makes no RoleBindings at all: that is `admin`'s).
async fn view_and_edit(control_plane: &ControlPlane, admin: &Client, ns: &str) -> Result<()> {
    let binding = |user: &str, role: &str| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": format!("team-{role}-{user}"), "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
    };
    crate::support::apply_all(admin, &[binding("vera", "view"), binding("eddie", "edit")]).await?;
    let vera = as_user(control_plane, "vera").await?;
    let eddie = as_user(control_plane, "eddie").await?;
    let wc = "kubewasm.dev";
    let bind = "rbac.authorization.k8s.io";
    // (who, verb, group, resource, name, allowed)
    type Case<'a> = (&'a Client, &'a str, &'a str, &'a str, Option<&'a str>, bool);
    let cases: &[Case] = &[
        (&vera, "list", wc, "wasmcontrollers", None, true),
        (&vera, "get", wc, "wasmcontrollers/status", None, true),
        (&vera, "list", wc, "wasmcontrollerstates", None, true),
        (&vera, "create", wc, "wasmcontrollers", None, false),
        (&vera, "delete", wc, "wasmcontrollers", None, false),
        (&eddie, "create", wc, "wasmcontrollers", None, true),
        (&eddie, "delete", wc, "wasmcontrollers", None, true),
        (&eddie, "patch", wc, "wasmcontrollers/status", None, false),
        (
            &eddie,
            "bind",
            bind,
            "clusterroles",
            Some("kubewasm-guest-events"),
            false,
        ),
        (&eddie, "create", bind, "rolebindings", None, false),
    ];
    eventually(
        "view reads WasmControllers, edit writes them, neither binds",
        AGGREGATED,
        || async {
            let mut wrong = Vec::new();
            for &(client, verb, group, resource, name, want) in cases {
                if may(client, verb, group, resource, ns, name).await? != want {
                    wrong.push(format!("{verb} {resource} {name:?}: want {want}"));
                }
            }
            ensure!(wrong.is_empty(), "{}", wrong.join("; "));
            Ok(Some(()))
        },
    )
    .await
}

/// The team's own manifests (the restarter tutorial's, as the team writes them): its
/// ServiceAccount opted in, its Role, the namespace's consent (deploy/runtime/tenant.yaml) —
/// no Events yet.
fn team_manifests(ns: &str) -> Result<Vec<Value>> {
    let rbac = "rbac.authorization.k8s.io/v1";
    let mut docs = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "restarter", "namespace": ns,
                "annotations": {"kubewasm.dev/wasm-controllers": "allowed"}}}),
        json!({"apiVersion": rbac, "kind": "Role",
            "metadata": {"name": "restarter", "namespace": ns},
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "delete"]}]}),
        json!({"apiVersion": rbac, "kind": "RoleBinding",
            "metadata": {"name": "restarter", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "restarter"},
            "subjects": [{"kind": "ServiceAccount", "name": "restarter", "namespace": ns}]}),
    ];
    docs.push(crate::support::tenant_binding(ns)?);
    docs.push(module_config_map(
        ns,
        "restarter-module",
        MODULE_KEY,
        &guest("configmap_restarter"),
    ));
    docs.push(controller(ns, "restarter"));
    Ok(docs)
}

/// `kubectl apply -f -` of `docs` as the team.
async fn apply_as(kubectl: &Kubectl, docs: &[Value]) -> Result<String> {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": docs});
    kubectl
        .run_with_input(
            &["apply", "--server-side", "-f", "-"],
            Some(list.to_string().as_bytes()),
        )
        .await
}

/// The namespace's use of the runtime is the cluster admin's label: the team applies all of
/// its own manifests (the tenant RoleBinding included) but cannot label its Namespace; its
/// controller says who acts and how; once the cluster admin labels it, the controller runs.
async fn enabled_by_the_cluster_admin(
    control_plane: &ControlPlane,
    admin: &Client,
    team: &TeamUser,
) -> Result<()> {
    let ns = team.namespace.as_str();
    let (key, value) = TENANT_LABEL;
    // The namespace as a cluster admin made it for the team, not yet enabled, and without the
    // tenant RoleBinding (the team makes it).
    Api::<Namespace>::all(admin.clone())
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {key: null}}})),
        )
        .await?;
    Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(admin.clone(), ns)
        .delete("kubewasm-runtime-tenant", &DeleteParams::default())
        .await?;
    let kubectl = Kubectl::new(&team.kubeconfig);
    apply_as(&kubectl, &team_manifests(ns)?)
        .await
        .context("the team applies its manifests, the tenant RoleBinding included")?;
    let label = format!("{key}={value}");
    let refused = kubectl
        .run(&["label", "namespace", ns, &label])
        .await
        .err()
        .map(|e| format!("{e:#}"));
    ensure!(
        refused.as_deref().is_some_and(|e| e.contains("forbidden")),
        "the namespace admin labelled its own Namespace: {refused:?}"
    );
    let client = team.client().await?;
    wait_status(
        &client,
        ns,
        "restarter",
        "the controller refused: the cluster admin has not enabled the namespace",
        |s| {
            let ready = ensure_condition(s, "Ready", "False")?;
            ensure!(
                ready.reason == "Forbidden"
                    && ready.message.contains(&format!(
                        "a cluster admin enables it with `kubectl label namespace {ns} kubewasm.dev/tenant=enabled`"
                    )),
                "Ready says {}: {}",
                ready.reason,
                ready.message
            );
            Ok(())
        },
    )
    .await?;
    // The cluster admin's step, exactly as the message says.
    control_plane
        .kubectl()
        .run(&["label", "namespace", ns, &label])
        .await?;
    wait_status(
        &client,
        ns,
        "restarter",
        "the controller Ready once the cluster admin enabled the namespace",
        |s| ensure_condition(s, "Ready", "True").map(drop),
    )
    .await?;
    Ok(())
}

/// The team's controller's Events: refused at first (said in the status, with the command),
/// then the team binds kubewasm-guest-events itself and the Events are on its ConfigMap.
async fn events(team: &TeamUser) -> Result<()> {
    let ns = team.namespace.as_str();
    let client = team.client().await?;
    let kubectl = Kubectl::new(&team.kubeconfig);
    // A selector the restarter cannot parse: a Warning Event `InvalidSelector` on it.
    let config_map = |selector: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app-config", "namespace": ns,
                "annotations": {"magalix.com/podDeleteMatch": selector}},
            "data": {"k": "v"}})
    };
    apply_as(&kubectl, &[config_map("app in (")]).await?;
    let fix = format!(
        "kubectl -n {ns} create rolebinding restarter-events --clusterrole=kubewasm-guest-events --serviceaccount={ns}:restarter"
    );
    wait_status(
        &client,
        ns,
        "restarter",
        "the status says the controller's Events are not recorded, and the RoleBinding",
        |s| {
            let ready = ensure_condition(s, "Ready", "True")?;
            ensure!(
                ready.message.contains("its Events are not recorded")
                    && ready.message.contains(&fix),
                "Ready says: {}",
                ready.message
            );
            Ok(())
        },
    )
    .await?;
    // The team runs the command the status gives, as itself.
    let args: Vec<&str> = fix.split(' ').skip(1).collect();
    kubectl
        .run(&args)
        .await
        .context("the team binds kubewasm-guest-events")?;
    // Another unparsable selector: another reconcile, another Event.
    apply_as(&kubectl, &[config_map("app notin (")]).await?;
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    eventually(
        "the restarter's InvalidSelector Event on app-config, read by the team",
        WAIT,
        || async {
            let on = ListParams::default().fields("involvedObject.name=app-config");
            let found = events
                .list(&on)
                .await?
                .items
                .into_iter()
                .any(|e| e.reason.as_deref() == Some("InvalidSelector"));
            Ok(found.then_some(()))
        },
    )
    .await?;
    wait_status(
        &client,
        ns,
        "restarter",
        "the status no longer says Events are refused",
        |s| {
            let ready = ensure_condition(s, "Ready", "True")?;
            ensure!(
                !ready.message.contains("not recorded"),
                "Ready says: {}",
                ready.message
            );
            Ok(())
        },
    )
    .await?;
    Ok(())
}

/// A kind the runtime may not watch (a CRD no ClusterRole aggregates into its watch role):
/// the team's controller waits for its caches, and the status says that only a cluster admin
/// can allow it, with the exact commands; the team cannot run them, the cluster admin does, and
/// the controller becomes Ready by itself.
async fn unwatched_kind(
    control_plane: &ControlPlane,
    admin: &Client,
    team: &TeamUser,
) -> Result<()> {
    let ns = team.namespace.as_str();
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.team.example.com"},
        "spec": {"group": "team.example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]}});
    // As a CRD's installer does: its kind aggregated into the namespace roles, so that a
    // namespace admin may use it and grant it — but not into the runtime's watch role.
    let to_admin = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "widgets-admin",
            "labels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}},
        "rules": [{"apiGroups": ["team.example.com"], "resources": ["widgets"], "verbs": ["*"]}]});
    crate::support::apply_all(admin, &[crd, to_admin]).await?;
    crate::cluster::wait_established(admin, "widgets.team.example.com").await?;
    let rbac = "rbac.authorization.k8s.io/v1";
    let docs = [
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "widgeteer", "namespace": ns,
                "annotations": {"kubewasm.dev/wasm-controllers": "allowed"}}}),
        json!({"apiVersion": rbac, "kind": "Role",
            "metadata": {"name": "widgeteer", "namespace": ns},
            "rules": [{"apiGroups": ["team.example.com"], "resources": ["widgets"],
                "verbs": ["get", "list", "watch", "patch"]}]}),
        json!({"apiVersion": rbac, "kind": "RoleBinding",
            "metadata": {"name": "widgeteer", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "widgeteer"},
            "subjects": [{"kind": "ServiceAccount", "name": "widgeteer", "namespace": ns}]}),
        json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "WasmController",
            "metadata": {"name": "widgets", "namespace": ns},
            "spec": {
                "module": {"configMap": {"name": "restarter-module", "key": MODULE_KEY}},
                "parent": {"apiVersion": "team.example.com/v1", "kind": "Widget"},
                "serviceAccountName": "widgeteer"}}),
    ];
    let kubectl = Kubectl::new(&team.kubeconfig);
    // Once kube-controller-manager has aggregated Widgets into `admin`.
    eventually(
        "the team grants Widgets to its ServiceAccount",
        AGGREGATED,
        || async { Ok(apply_as(&kubectl, &docs).await.ok().map(drop)) },
    )
    .await?;
    let fix = "kubectl create clusterrole kubewasm-runtime-watch-widgets --verb=list,watch --resource=widgets.team.example.com && kubectl label clusterrole kubewasm-runtime-watch-widgets kubewasm.dev/aggregate-to-runtime=true";
    let client = team.client().await?;
    wait_status(
        &client,
        ns,
        "widgets",
        "the controller waits for Widgets, naming the cluster admin and the commands",
        |s| {
            let ready = ensure_condition(s, "Ready", "False")?;
            ensure!(
                ready.reason == "WaitingForCaches"
                    && ready.message.contains("only a cluster admin can allow")
                    && ready.message.contains(fix),
                "Ready says {}: {}",
                ready.reason,
                ready.message
            );
            Ok(())
        },
    )
    .await?;
    let commands: Vec<Vec<&str>> = fix
        .split(" && ")
        .map(|c| c.split(' ').skip(1).collect())
        .collect();
    let refused = kubectl
        .run(&commands[0])
        .await
        .err()
        .map(|e| format!("{e:#}"));
    ensure!(
        refused.as_deref().is_some_and(|e| e.contains("forbidden")),
        "the team made a ClusterRole: {refused:?}"
    );
    for command in &commands {
        control_plane.kubectl().run(command).await?;
    }
    // Aggregated by kube-controller-manager, then listed at the watch's next try (its backoff
    // reaches 30 s).
    eventually(
        "the Widget controller Ready once the cluster admin let the runtime watch Widgets",
        Duration::from_secs(120),
        || async {
            let s = crate::cluster::controller_status(&client, ns, "widgets").await?;
            Ok(ensure_condition(&s, "Ready", "True").is_ok().then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// `kubewasm wait -n NS NAME` with the team's kubeconfig: its exit status and output.
async fn kubewasm_wait(team: &TeamUser, ns: &str, name: &str) -> Result<(bool, String)> {
    let mut command = tokio::process::Command::new(kubewasm_bin());
    command
        .args(["wait", "-n", ns, name, "--timeout", "60"])
        .env("KUBECONFIG", &team.kubeconfig)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(90), command.output())
        .await
        .context("kubewasm wait did not end within 90 s")??;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

/// A good module: `kubewasm wait` exits 0; bytes that are no module: it fails with the reason,
/// and READY says the module now declared is refused; another team's controller: refused.
async fn honest_updates(admin: &Client, team: &TeamUser, other: &str) -> Result<()> {
    let ns = team.namespace.as_str();
    let kubectl = Kubectl::new(&team.kubeconfig);
    let (ok, said) = kubewasm_wait(team, ns, "restarter").await?;
    ensure!(
        ok && said.contains("runs module sha256:"),
        "kubewasm wait on a running controller: {said}"
    );
    apply_as(
        &kubectl,
        &[module_config_map(
            ns,
            "restarter-module",
            MODULE_KEY,
            b"not wasm at all",
        )],
    )
    .await?;
    let (ok, said) = kubewasm_wait(team, ns, "restarter").await?;
    ensure!(
        !ok && said.contains("refused") && said.contains("ModuleInvalid"),
        "kubewasm wait on a module that is no wasm: {said}"
    );
    let client = team.client().await?;
    wait_status(
        &client,
        ns,
        "restarter",
        "READY says the module now declared is refused",
        |s| {
            let ready = ensure_condition(s, "Ready", "True")?;
            ensure!(
                ready
                    .message
                    .contains("the module now declared is refused (ModuleInvalid)"),
                "Ready says: {}",
                ready.message
            );
            Ok(())
        },
    )
    .await?;
    // The good module again: the verdict is for the ConfigMap as it is now.
    apply_as(
        &kubectl,
        &[module_config_map(
            ns,
            "restarter-module",
            MODULE_KEY,
            &guest("configmap_restarter"),
        )],
    )
    .await?;
    let (ok, said) = kubewasm_wait(team, ns, "restarter").await?;
    ensure!(ok, "kubewasm wait after the good module again: {said}");

    // Another team's controller, made by the cluster admin: the team may not even wait on it.
    crate::support::apply_all(admin, &[controller(other, "theirs")]).await?;
    let (ok, said) = kubewasm_wait(team, other, "theirs").await?;
    ensure!(
        !ok && said.contains("forbidden"),
        "kubewasm wait on another team's controller: {said}"
    );
    Ok(())
}
