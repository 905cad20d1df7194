//! Owned children against a real API server: a child whose stored form differs from what the
//! guest asked for (the server normalises `cpu: "0.5"` to `500m` and adds tolerations) is
//! created once and left alone under `Recreate` while the parent does not change, and
//! recreated exactly once when it does; and the same Event on every reconcile is one Event
//! object whose count grows.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::cluster::{WAIT, apply, apply_all, guest, module_config_map, prepare};
use crate::isolation::{install_probe_crd, probe, probes};
use crate::merge;
use crate::runtime::{RuntimeProcess, finish};
use crate::support::{ControlPlane, eventually};

/// How long the child must stay the same Pod while nothing changes.
const STEADY: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_child_the_server_normalises_is_not_recreated_and_events_are_counted() {
    let cp = ControlPlane::shared();
    let (client, ns) = prepare(cp, "children").await;
    let mut runtime = RuntimeProcess::start(&cp.runtime_kubeconfig(), &ns);
    let result = children(&client, &ns, &runtime).await;
    finish(result, &mut [&mut runtime]);
}

fn pod_spec(app: &str) -> Value {
    json!({"mode": "compose", "pod": {
        "labels": {"app": app},
        "spec": {
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": "0.5"}}}],
            "tolerations": [{"key": "example.com/special", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }})
}

async fn children(client: &Client, ns: &str, runtime: &RuntimeProcess) -> Result<()> {
    install_probe_crd(client).await?;
    let group = crate::isolation::GROUP;
    let rbac = |kind: &str, body: Value| {
        let mut o = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
            "metadata": {"name": "composer", "namespace": ns}});
        for (k, v) in body.as_object().into_iter().flatten() {
            o[k] = v.clone();
        }
        o
    };
    apply_all(
        client,
        &[
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "composer", "namespace": ns,
                "annotations": {"kubewasm.dev/wasm-controllers": "allowed"}}}),
            rbac("Role", json!({"rules": [
                {"apiGroups": [group], "resources": ["probes"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [group], "resources": ["probes/status"], "verbs": ["get", "patch", "update"]},
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]})),
            rbac("RoleBinding", json!({
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "composer"},
                "subjects": [{"kind": "ServiceAccount", "name": "composer", "namespace": ns}]})),
            module_config_map(ns, "hostile", "hostile.wasm", &guest("hostile")),
            json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "WasmController",
                "metadata": {"name": "composer", "namespace": ns},
                "spec": {
                    "module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
                    "parent": {"apiVersion": format!("{group}/v1"), "kind": "Probe", "labelSelector": "role=composer"},
                    "children": [{"apiVersion": "v1", "kind": "Pod", "updateStrategy": "Recreate"}],
                    "serviceAccountName": "composer",
                    "resyncPeriodSeconds": 1,
                }}),
        ],
    )
    .await?;
    apply(client, &probe(ns, "web", "composer", pod_spec("web"))).await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let first = wait_pod(&pods, "web").await?;
    let stored = serde_json::to_value(&first)?;
    ensure!(
        stored.pointer("/spec/containers/0/resources/requests/cpu") == Some(&json!("500m")),
        "the API server should store cpu 0.5 as 500m: {:?}",
        stored.pointer("/spec/containers/0/resources")
    );
    let tolerations = stored
        .pointer("/spec/tolerations")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    ensure!(
        tolerations > 1,
        "the API server should add tolerations: {tolerations}"
    );

    // Reconciled every second for STEADY: the same Pod throughout.
    let uid = first.uid().context("the Pod has a uid")?;
    let offset = runtime.log_len();
    let started = Instant::now();
    while started.elapsed() < STEADY {
        let now = pods.get("web").await?;
        ensure!(
            now.uid().as_deref() == Some(uid.as_str()),
            "Pod web was recreated although its parent did not change (uid {uid} → {:?}) after {:?}",
            now.uid(),
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let reconciles = runtime
        .log_since(offset)
        .lines()
        .filter(|l| l.contains(&format!("object={ns}/web}}")) && l.contains(" reconciled "))
        .count();
    ensure!(
        reconciles >= 10,
        "only {reconciles} reconciles in {STEADY:?}"
    );

    // The same Event each time: one object, counted.
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let composed: Vec<Event> = events
        .list(&ListParams::default().fields("involvedObject.name=web,reason=Composed"))
        .await?
        .items;
    ensure!(
        composed.len() == 1,
        "{} Composed Events, want one counted Event",
        composed.len()
    );
    let count = composed[0].count.unwrap_or(0);
    ensure!(
        count as usize >= reconciles.min(20) / 2,
        "the Composed Event counts {count} occurrences for {reconciles} reconciles"
    );

    // A real change: recreated once, then left alone again.
    probes(client, ns)
        .patch(
            "web",
            &Default::default(),
            &merge(json!({"spec": pod_spec("web-2")})),
        )
        .await?;
    let second = eventually("Pod web recreated with label app=web-2", WAIT, || async {
        match pods.get_opt("web").await? {
            Some(p)
                if p.uid().as_deref() != Some(uid.as_str())
                    && p.labels().get("app").map(String::as_str) == Some("web-2") =>
            {
                Ok(Some(p))
            }
            Some(p) => bail!("Pod web has labels {:?}", p.labels()),
            None => bail!("no Pod web"),
        }
    })
    .await?;
    let uid2 = second.uid().context("the new Pod has a uid")?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now = pods.get("web").await?;
    ensure!(
        now.uid().as_deref() == Some(uid2.as_str()),
        "Pod web was recreated a second time after one change"
    );
    Ok(())
}

async fn wait_pod(pods: &Api<Pod>, name: &str) -> Result<Pod> {
    eventually(&format!("Pod {name} created"), WAIT, || async {
        Ok(pods.get_opt(name).await?)
    })
    .await
}
