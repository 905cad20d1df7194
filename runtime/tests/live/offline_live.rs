//! Offline is live (issue 40): the same objects, in the cluster and in files, give the guest
//! byte-identical requests. A controller with ConfigMaps for children reconciles a Probe (its
//! child made by the runtime); then the Probe's reconcile fails and the runtime keeps the
//! request as a capsule, again when a child made by hand and a ConfigMap owned but not
//! controlled by the Probe appear. The files also hold two ConfigMaps that name the Probe and
//! that the cluster's garbage collector would not keep (an earlier Probe's uid, another
//! namespace): the offline rule must leave them out as the runtime does. `kubewasm reconcile` on `kubectl get -o json` of the same objects writes its
//! request (`--request-out`), which must be the capsule's, document for document and byte
//! for byte: the parent, the children and their order, the previous parent.

use anyhow::{Context, Result, ensure};
use kube::Client;
use serde_json::{Value, json};
use tokio::process::Command;

use crate::cluster::apply_all;
use crate::isolation::{controller, probe, probes};
use crate::runtime::kubewasm_bin;
use crate::support::{ControlPlane, TeamUser, eventually};

/// How long the runtime may take for each step.
const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// The ConfigMap `name` in `ns`, naming Probe `p` (`uid`) as its owner.
fn owned(ns: &str, name: &str, uid: &str, controller: bool) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [{
            "apiVersion": "isolation.kubewasm.dev/v1", "kind": "Probe", "name": "p", "uid": uid,
            "controller": controller}]},
        "data": {"made": "by hand"}})
}

/// As the cluster admin, `kubectl get ARGS -o json`.
async fn get_json(cp: &ControlPlane, args: &[&str]) -> Result<String> {
    cp.kubectl()
        .run(&[&["get"], args, &["-o", "json"]].concat())
        .await
}

/// The check, in namespace `ns` (opted in, with the `prober` ServiceAccount and the hostile
/// module), as `alice`, its admin, fetches the capsule.
pub(crate) async fn same_request(
    cp: &ControlPlane,
    client: &Client,
    ns: &str,
    alice: &TeamUser,
) -> Result<()> {
    let rbac = |kind: &str, body: Value| {
        let mut o = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind,
            "metadata": {"name": "prober-children", "namespace": ns}});
        for (k, v) in body.as_object().into_iter().flatten() {
            o[k] = v.clone();
        }
        o
    };
    apply_all(
        client,
        &[
            rbac("Role", json!({"rules": [{"apiGroups": [""], "resources": ["configmaps"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]})),
            rbac("RoleBinding", json!({
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "prober-children"},
                "subjects": [{"kind": "ServiceAccount", "name": "prober", "namespace": ns}]})),
            controller(
                ns,
                "twin",
                json!({"module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
                    "parent": {"apiVersion": "isolation.kubewasm.dev/v1", "kind": "Probe",
                        "labelSelector": "role=twin"},
                    "children": [{"apiVersion": "v1", "kind": "ConfigMap"}]}),
            ),
            probe(ns, "p", "twin", json!({"mode": "ok"})),
        ],
    )
    .await?;
    let configmaps =
        kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns);
    eventually("the runtime makes the Probe's child", WAIT, || async {
        let child = configmaps.get_opt("p").await?;
        let owned = child.is_some_and(|c| c.metadata.owner_references.is_some());
        let ok = probes(client, ns)
            .get("p")
            .await?
            .data
            .pointer("/status/ok")
            == Some(&json!(true));
        Ok((owned && ok).then_some(()))
    })
    .await?;
    let uid = probes(client, ns)
        .get("p")
        .await?
        .metadata
        .uid
        .context("the Probe's uid")?;
    // The reconciles settle: the Probe no longer changes.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let previous = get_json(cp, &["-n", ns, "probe", "p"]).await?;
    probes(client, ns)
        .patch(
            "p",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"spec": {"mode": "panic"}})),
        )
        .await?;
    // While it fails (a failing reconcile deletes no child; a panic is retried, and each retry
    // keeps its capsule), a child by hand, and an object it owns without controlling it.
    let by_hand = [
        owned(ns, "a-by-hand", &uid, true),
        owned(ns, "c-not-controller", &uid, false),
    ];
    apply_all(client, &by_hand).await?;

    let dir = tempfile::tempdir()?;
    let out = dir.path().join("capsules");
    let out_arg = out.to_string_lossy().into_owned();
    let capsule = eventually(
        "alice fetches twin's capsule with both children",
        WAIT,
        || async {
            let run = Command::new(kubewasm_bin())
                .args(["capsules", "-n", ns, "twin", "--out", &out_arg])
                .env("KUBECONFIG", &alice.kubeconfig)
                .output()
                .await?;
            ensure!(
                run.status.success(),
                "{}",
                String::from_utf8_lossy(&run.stderr)
            );
            let file = out.join("capsule-1.json");
            let capsule = match std::fs::read(&file) {
                Ok(bytes) => serde_json::from_slice::<Value>(&bytes)?,
                Err(_) => return Ok(None),
            };
            let children = capsule
                .pointer("/request/children")
                .and_then(Value::as_array);
            Ok((children.map(Vec::len) == Some(2)).then_some(capsule))
        },
    )
    .await?;
    let live = capsule["request"].clone();

    let write = |name: &str, text: &str| -> Result<String> {
        let path = dir.path().join(name);
        std::fs::write(&path, text)?;
        Ok(path.to_string_lossy().into_owned())
    };
    let parent = write(
        "parent.json",
        &get_json(cp, &["-n", ns, "probe", "p"]).await?,
    )?;
    let previous = write("previous.json", &previous)?;
    let wc = write(
        "twin.json",
        &get_json(cp, &["-n", ns, "wasmcontroller", "twin"]).await?,
    )?;
    let mut docs = Vec::new();
    for name in ["p", "a-by-hand", "c-not-controller"] {
        docs.push(get_json(cp, &["-n", ns, "configmap", name]).await?);
    }
    let earlier = owned(
        ns,
        "d-earlier-p",
        "00000000-0000-0000-0000-000000000000",
        true,
    );
    docs.push(earlier.to_string());
    docs.push(owned("default", "e-elsewhere", &uid, true).to_string());
    let state = write("state.yaml", &docs.join("\n---\n"))?;
    let request_out = dir.path().join("request.json");
    let module = crate::support::guests::guest("hostile");
    let run = Command::new(kubewasm_bin())
        .args([
            "reconcile",
            "--controller",
            &wc,
            "--object",
            &parent,
            "--state",
            &state,
        ])
        .args(["--previous", &previous, "--module"])
        .arg(&module)
        .arg("--request-out")
        .arg(&request_out)
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&run.stderr);
    ensure!(
        stderr.contains("hostile guest panicked on purpose"),
        "the offline reconcile fails as the live one did: {stderr}"
    );
    let offline: Value = serde_json::from_slice(&std::fs::read(&request_out)?)?;
    let children: Vec<String> = (live["children"].as_array().into_iter().flatten())
        .filter_map(|c| serde_json::from_str::<Value>(c.as_str()?).ok())
        .filter_map(|c| c.pointer("/metadata/name")?.as_str().map(str::to_owned))
        .collect();
    ensure!(
        children == ["a-by-hand", "p"],
        "the live children are the two the Probe controls, by name: {children:?}"
    );
    ensure!(live["previous"].is_string(), "a previous parent: {live}");
    ensure!(
        offline == live,
        "offline and live requests differ:\noffline: {offline:#}\nlive: {live:#}"
    );
    println!(
        "offline = live: the same request of {} bytes, children {children:?}",
        serde_json::to_string(&live)?.len()
    );
    Ok(())
}
