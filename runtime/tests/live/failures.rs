//! The SDK's contract for errors, live: a guest's permanent error is recorded in the status
//! and not retried — not by backoff, not by a resync — until the object (or the module)
//! changes; a change then calls the guest again, and a success clears `lastError`. While an
//! object fails, `Ready` is False (what `kubectl get wc` shows) and `Degraded` True, however
//! many other objects succeed after it, and the failure is posted once on the object itself
//! (a Warning Event, reason `ReconcileFailed`).

use std::time::Duration;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{
    apply, controller_status, ensure_condition, guest, module_config_map, prepare, wait_status,
};
use crate::isolation::{controller, install_probe_crd, install_tenant, probe, probes};
use crate::merge;
use crate::runtime::{RuntimeProcess, finish};

#[tokio::test]
async fn a_permanent_error_is_not_retried_until_the_object_changes() {
    let control_plane = crate::support::ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "permanent").await;
    // A resync every 2 s: a permanent error must not be retried by it either.
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = permanent(&client, &ns).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn permanent(client: &Client, ns: &str) -> Result<()> {
    install_probe_crd(client).await?;
    install_tenant(client, ns, "secret", "config").await?;
    apply(
        client,
        &module_config_map(ns, "hostile", "hostile.wasm", &guest("hostile")),
    )
    .await?;
    let spec = json!({"module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
        "resyncPeriodSeconds": 2});
    apply(client, &controller(ns, "refuser", spec)).await?;
    apply(
        client,
        &probe(ns, "refused", "refuser", json!({"mode": "error"})),
    )
    .await?;
    // Another object that succeeds, reconciled after the failure: it must not hide it.
    apply(
        client,
        &probe(
            ns,
            "fine",
            "refuser",
            json!({"mode": "compute", "rounds": 1}),
        ),
    )
    .await?;
    let failed = wait_status(
        client,
        ns,
        "refuser",
        "the permanent error in the status, Ready=False and Degraded=True",
        |s| {
            ensure!(
                s.failures >= 1
                    && s.reconciles > s.failures
                    && s.last_error
                        .as_deref()
                        .is_some_and(|e| e.contains("hostile guest refuses")),
                "reconciles {}, failures {}, lastError {:?}",
                s.reconciles,
                s.failures,
                s.last_error
            );
            for type_ in ["Ready", "Degraded"] {
                let want = if type_ == "Ready" { "False" } else { "True" };
                let c = ensure_condition(s, type_, want)?;
                ensure!(
                    c.reason == "ReconcileFailed" && c.message.contains("hostile guest refuses"),
                    "{type_} says {}: {}",
                    c.reason,
                    c.message
                );
            }
            Ok(())
        },
    )
    .await?;
    // Backoff would have called it again at 0.5, 1, 2 and 4 s; the resync every 2 s.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let later = controller_status(client, ns, "refuser").await?;
    // (The other object is resynced meanwhile: a retry shows as a failure, not a reconcile.)
    ensure!(
        later.failures == failed.failures && later.reconciles > failed.reconciles,
        "a permanent error was retried, or the resync stopped: {} reconciles, {} failures, then {} and {}",
        failed.reconciles,
        failed.failures,
        later.reconciles,
        later.failures
    );
    // Where the author looks first: one Warning Event on the Probe, counted once.
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let on_probe = ListParams::default().fields("involvedObject.name=refused");
    let failures: Vec<Event> = events
        .list(&on_probe)
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ReconcileFailed"))
        .collect();
    let shown: Vec<_> = failures
        .iter()
        .map(|e| (&e.type_, e.count, &e.message))
        .collect();
    ensure!(
        failures.len() == 1
            && failures[0].type_.as_deref() == Some("Warning")
            && failures[0].count == Some(1)
            && failures[0]
                .message
                .as_deref()
                .is_some_and(|m| m.contains("hostile guest refuses") && m.contains("refuser")),
        "want one Warning Event ReconcileFailed counted once on the Probe, got {shown:?}"
    );
    // The object changes: called again, succeeds, and the last error is gone.
    probes(client, ns)
        .patch(
            "refused",
            &Default::default(),
            &merge(json!({"spec": {"mode": "compute", "rounds": 1}})),
        )
        .await?;
    wait_status(client, ns, "refuser", "a success after the change", |s| {
        ensure!(
            s.reconciles > later.reconciles && s.last_error.is_none(),
            "reconciles {}, lastError {:?}",
            s.reconciles,
            s.last_error
        );
        ensure_condition(s, "Ready", "True")?;
        ensure_condition(s, "Degraded", "False")?;
        Ok(())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn set_status_on_a_kind_without_status_is_an_error() {
    let control_plane = crate::support::ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "statusless").await;
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = statusless(&client, &ns).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

/// A guest that sets the status of a ConfigMap parent: the API server accepts the patch and
/// drops the field, and the runtime says so instead of logging success.
async fn statusless(client: &Client, ns: &str) -> Result<()> {
    install_probe_crd(client).await?;
    install_tenant(client, ns, "secret", "config").await?;
    grant_config_maps(client, ns).await?;
    apply(
        client,
        &module_config_map(ns, "hostile", "hostile.wasm", &guest("hostile")),
    )
    .await?;
    // `read` mode: lists ConfigMaps, then sets the status `{"seen": n}`.
    apply(
        client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "plain", "namespace": ns, "labels": {"role": "statusless"},
                "annotations": {"kubewasm.dev/hostile-mode": "read"}}}),
    )
    .await?;
    let spec = json!({"module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
        "parent": {"apiVersion": "v1", "kind": "ConfigMap", "labelSelector": "role=statusless"}});
    apply(client, &controller(ns, "statusless", spec)).await?;
    wait_status(
        client,
        ns,
        "statusless",
        "Degraded saying a ConfigMap has no status, with what to do instead",
        |s| {
            let degraded = ensure_condition(s, "Degraded", "True")?;
            for word in ["has no status", "set_state"] {
                ensure!(
                    degraded.message.contains(word),
                    "Degraded says {}: {}",
                    degraded.reason,
                    degraded.message
                );
            }
            Ok(())
        },
    )
    .await?;
    Ok(())
}

/// The prober may read and patch the ConfigMaps of its namespace.
async fn grant_config_maps(client: &Client, ns: &str) -> Result<()> {
    apply(
        client,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "prober-configmaps", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                "verbs": ["get", "list", "watch", "create", "patch", "delete"]}]}),
    )
    .await?;
    apply(
        client,
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "prober-configmaps", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "prober-configmaps"},
            "subjects": [{"kind": "ServiceAccount", "name": "prober", "namespace": ns}]}),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_child_name_held_by_nobody_is_not_adopted() {
    let control_plane = crate::support::ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "adopt").await;
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = not_adopted(&client, &ns).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

/// The surprise: a guest whose child ConfigMap has the name of its own module
/// ConfigMap adopted it, and deleting the parent garbage-collected the module. Now the apply
/// is refused, the module keeps no owner, and the controller keeps running.
async fn not_adopted(client: &Client, ns: &str) -> Result<()> {
    install_probe_crd(client).await?;
    install_tenant(client, ns, "secret", "config").await?;
    grant_config_maps(client, ns).await?;
    apply(
        client,
        &module_config_map(ns, "hostile", "hostile.wasm", &guest("hostile")),
    )
    .await?;
    let spec = json!({"module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
        "children": [{"apiVersion": "v1", "kind": "ConfigMap"}]});
    apply(client, &controller(ns, "adopter", spec)).await?;
    // `ok` mode applies ConfigMap `<its name>`: here, the module's.
    apply(
        client,
        &probe(ns, "hostile", "adopter", json!({"mode": "ok"})),
    )
    .await?;
    wait_status(
        client,
        ns,
        "adopter",
        "Degraded saying the module ConfigMap is not adopted",
        |s| {
            let degraded = ensure_condition(s, "Degraded", "True")?;
            ensure!(
                degraded.message.contains("ConfigMap")
                    && degraded.message.contains("no controller owns it")
                    && degraded.message.contains("does not adopt"),
                "Degraded says {}: {}",
                degraded.reason,
                degraded.message
            );
            Ok(())
        },
    )
    .await?;
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), ns);
    let module = config_maps.get("hostile").await?;
    ensure!(
        module
            .metadata
            .owner_references
            .as_deref()
            .unwrap_or_default()
            .is_empty()
            && module.data.as_ref().is_none_or(|d| !d.contains_key("mode")),
        "the module ConfigMap was taken over: {:?} {:?}",
        module.metadata.owner_references,
        module.data
    );
    Ok(())
}

#[tokio::test]
async fn an_apply_without_a_declared_child_kind_is_said_in_the_status() {
    let control_plane = crate::support::ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "unowned").await;
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = unowned(&client, &ns).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

/// ConfigMaps granted (`apply`), not declared children: applied without an ownerReference,
/// and the status says that nothing will collect them.
async fn unowned(client: &Client, ns: &str) -> Result<()> {
    install_probe_crd(client).await?;
    install_tenant(client, ns, "secret", "config").await?;
    grant_config_maps(client, ns).await?;
    apply(
        client,
        &module_config_map(ns, "hostile", "hostile.wasm", &guest("hostile")),
    )
    .await?;
    let spec = json!({"module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
        "grants": [{"apiVersion": "v1", "kind": "ConfigMap", "verbs": ["apply"]}]});
    apply(client, &controller(ns, "granter", spec)).await?;
    apply(
        client,
        &probe(ns, "loose", "granter", json!({"mode": "ok"})),
    )
    .await?;
    wait_status(
        client,
        ns,
        "granter",
        "Ready saying ConfigMaps are applied without an owner",
        |s| {
            let ready = ensure_condition(s, "Ready", "True")?;
            ensure!(
                ready
                    .message
                    .contains("applies ConfigMap (v1) without an owner")
                    && ready.message.contains("spec.children"),
                "Ready says {}",
                ready.message
            );
            Ok(())
        },
    )
    .await?;
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), ns);
    let loose = config_maps.get("loose").await?;
    ensure!(
        loose.metadata.owner_references.is_none(),
        "the granted ConfigMap got an owner: {:?}",
        loose.metadata.owner_references
    );
    Ok(())
}
