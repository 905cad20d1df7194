//! Shadow rollouts (`spec.candidate`), live, as the team: alice is only `admin` of her
//! namespace; she declares a candidate beside the live module, reads what comparing it found
//! (`status.rollout`, `kubewasm rollout status`, the Event on her WasmController) and promotes
//! it; the runtime's own identity stays `deploy/runtime/rbac.yaml`.
//!
//! - The HelloWorld with a candidate that greets `Howdy`: every reconcile differs, the status
//!   names the Pod's command, no Pod changes until `kubewasm rollout promote`, then the Pods
//!   are recreated by the new module.
//! - A candidate identical in behaviour (the same guest built without WASI: other bytes, another
//!   digest): over 100 reconciles, no difference, and `spec.rollout.promoteAfter` promotes it as
//!   the controller's ServiceAccount (which the team lets patch its WasmController).
//! - The restarter with a candidate that widens its selector: the candidate's extra deletions
//!   are shown and nothing of them is deleted; a candidate that traps, and one that would save
//!   a state, beside the live restarter: the trap is shown, the live controller fails nothing,
//!   its saved states are its own.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use kubewasm::api::{RolloutStatus, WasmController};
use serde_json::{Value, json};

use crate::cluster::{
    WAIT, apply, apply_all, controller_status, create_hello_world, example, guest,
    module_config_map, prepare, saved_state, sha256, wait_greeting_pod, wait_status,
};
use crate::logs::kubewasm_as;
use crate::runtime::{RuntimeProcess, finish};
use crate::support::{ControlPlane, TeamUser, eventually};

/// How long "nothing changes" is watched after the comparisons were seen.
const QUIET: Duration = Duration::from_secs(3);

fn controllers(client: &Client, ns: &str) -> Api<WasmController> {
    Api::namespaced(client.clone(), ns)
}

fn merge(patch: Value) -> Patch<Value> {
    Patch::Merge(patch)
}

/// The rollout the status shows, or why there is none.
fn rollout(status: &kubewasm::api::WasmControllerStatus) -> Result<&RolloutStatus> {
    status.rollout.as_ref().context("no status.rollout yet")
}

/// alice, only `admin` of `ns`, with a client.
async fn alice(control_plane: &ControlPlane, ns: &str) -> Result<(TeamUser, Client)> {
    let alice = control_plane.namespace_admin(ns, "alice").await?;
    let client = alice.client().await?;
    Ok((alice, client))
}

/// The HelloWorld tutorial in `ns`: its RBAC by the cluster admin, its module ConfigMap, the
/// candidates' ConfigMaps (`name` → guest) and its WasmController by the team.
async fn hello_world(
    admin: &Client,
    team: &Client,
    ns: &str,
    candidates: &[(&str, Vec<u8>)],
    edit: impl FnOnce(&mut Value),
) -> Result<()> {
    apply_all(admin, &example("hello-world/rbac.yaml", ns)?).await?;
    let module = guest("hello_world");
    apply(
        team,
        &module_config_map(ns, "hello-controller", "hello_world.wasm", &module),
    )
    .await?;
    for (name, wasm) in candidates {
        apply(team, &module_config_map(ns, name, "hello_world.wasm", wasm)).await?;
    }
    let mut controller = example("hello-world/controller.yaml", ns)?;
    edit(&mut controller[0]);
    apply_all(team, &controller).await
}

#[tokio::test]
async fn a_candidate_that_greets_differently_changes_no_pod_until_promoted() {
    let control_plane = ControlPlane::shared();
    let (admin, ns) = prepare(control_plane, "shadow-hello").await;
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = async {
        let (alice, team) = alice(control_plane, &ns).await?;
        let howdy = guest("hello_world_howdy");
        let howdy_digest = sha256(&howdy);
        hello_world(&admin, &team, &ns, &[("hello-v2", howdy)], |_| {}).await?;
        let pods: Api<Pod> = Api::namespaced(team.clone(), &ns);
        // The HelloWorlds are the tutorial's users' (the CRD's objects are not aggregated into
        // `admin`): made by the cluster admin.
        create_hello_world(&admin, &ns, "a", "A").await?;
        create_hello_world(&admin, &ns, "b", "B").await?;
        let a = wait_greeting_pod(&pods, "a", "Hello, A!", None).await?;
        let b = wait_greeting_pod(&pods, "b", "Hello, B!", None).await?;

        // The team declares the candidate, as a person edits the spec.
        controllers(&team, &ns)
            .patch(
                "hello-world",
                &PatchParams::default(),
                &merge(json!({"spec": {"candidate": {"configMap": {"name": "hello-v2", "key": "hello_world.wasm"}}}})),
            )
            .await
            .context("alice declares a candidate")?;
        let status = wait_status(&team, &ns, "hello-world", "both HelloWorlds compared, every reconcile differing", |s| {
            let r = rollout(s)?;
            ensure!(r.candidate.as_deref().is_some_and(|c| c.starts_with(&howdy_digest)), "{r:?}");
            ensure!(r.problem.is_none(), "{r:?}");
            let objects: BTreeSet<&str> = r.last_differences.iter().map(|d| d.object.as_str()).collect();
            ensure!(objects.len() == 2, "differences on {objects:?}");
            ensure!(r.compared >= 2 && r.differing == r.compared, "{r:?}");
            Ok(())
        })
        .await?;
        let r = rollout(&status)?;
        let a_line = format!(
            r#"apply Pod (v1) {ns}/a: spec.containers[0].command[1]: "Hello, A!" → "Howdy, A!""#
        );
        let a_difference = r.last_differences.iter().find(|d| d.object == format!("{ns}/a"));
        ensure!(
            a_difference.is_some_and(|d| d.changes.contains(&a_line)),
            "the Pod's command difference is not shown: {:?}",
            r.last_differences
        );
        // No Pod changed: the same Pods, still greeting `Hello`.
        tokio::time::sleep(QUIET).await;
        for (before, greeting) in [(&a, "Hello, A!"), (&b, "Hello, B!")] {
            let name = before.metadata.name.as_deref().unwrap_or_default();
            let now = pods.get(name).await?;
            ensure!(now.metadata.uid == before.metadata.uid, "Pod {name} was replaced");
            crate::support::ensure_greeting_pod(&now, greeting, None)?;
        }
        ensure!(controller_status(&team, &ns, "hello-world").await?.failures == 0);
        // The first difference is an Event on the WasmController.
        let events: Api<Event> = Api::namespaced(team.clone(), &ns);
        eventually("a CandidateDiffers Event on the WasmController", WAIT, || async {
            let list = events
                .list(&ListParams::default().fields("involvedObject.kind=WasmController,involvedObject.name=hello-world"))
                .await?;
            Ok(list.items.into_iter().find(|e| e.reason.as_deref() == Some("CandidateDiffers")))
        })
        .await?;
        // What alice reads with her own kubeconfig.
        let (ok, out, err) = kubewasm_as(&alice, &["rollout", "status", "-n", &ns, "hello-world"]).await?;
        ensure!(ok, "kubewasm rollout status failed: {err}");
        ensure!(out.contains(&format!("compared module: {howdy_digest}")) && out.contains("differing: ") && out.contains("Howdy, A!"), "{out}");

        // Promoted: the spec names the candidate, pinned to what was compared; the Pods are
        // recreated by the new module.
        let (ok, out, err) = kubewasm_as(&alice, &["rollout", "promote", "-n", &ns, "hello-world"]).await?;
        ensure!(ok, "kubewasm rollout promote failed: {out}{err}");
        let spec = controllers(&team, &ns).get("hello-world").await?.spec;
        ensure!(spec.candidate.is_none(), "{spec:?}");
        ensure!(spec.module.config_map.as_ref().is_some_and(|c| c.name == "hello-v2"), "{spec:?}");
        ensure!(spec.module.sha256.as_deref().map(|h| format!("sha256:{h}")) == Some(howdy_digest.clone()), "{spec:?}");
        wait_greeting_pod(&pods, "a", "Howdy, A!", a.metadata.uid.as_deref()).await?;
        wait_greeting_pod(&pods, "b", "Howdy, B!", b.metadata.uid.as_deref()).await?;
        wait_status(&team, &ns, "hello-world", "the promoted module runs, no rollout shown", |s| {
            ensure!(s.module_digest.as_deref() == Some(howdy_digest.as_str()), "{:?}", s.module_digest);
            ensure!(s.rollout.is_none(), "{:?}", s.rollout);
            Ok(())
        })
        .await?;
        Ok(())
    }
    .await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_candidate_identical_in_behaviour_differs_nowhere_and_is_promoted_by_policy() {
    let control_plane = ControlPlane::shared();
    let (admin, ns) = prepare(control_plane, "shadow-same").await;
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = async {
        let (_alice, team) = alice(control_plane, &ns).await?;
        // Other bytes, another digest, the same behaviour.
        let same = crate::support::guests::guest_without_wasi("hello_world");
        let same = std::fs::read(&same).with_context(|| format!("{}", same.display()))?;
        let same_digest = sha256(&same);
        ensure!(same_digest != sha256(&guest("hello_world")));
        // The team lets the controller's ServiceAccount promote it (patch its WasmController).
        apply(
            &team,
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "promote", "namespace": ns},
            "rules": [{"apiGroups": ["kubewasm.dev"], "resources": ["wasmcontrollers"],
                "resourceNames": ["hello-world"], "verbs": ["get", "patch"]}]}),
        )
        .await?;
        apply(
            &team,
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "promote", "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "promote"},
            "subjects": [{"kind": "ServiceAccount", "name": "hello-controller", "namespace": ns}]}),
        )
        .await?;
        hello_world(&admin, &team, &ns, &[("hello-same", same)], |c| {
            c["spec"]["resyncPeriodSeconds"] = json!(1);
            c["spec"]["candidate"] =
                json!({"configMap": {"name": "hello-same", "key": "hello_world.wasm"}});
            c["spec"]["rollout"] = json!({"promoteAfter": 100});
        })
        .await?;
        let pods: Api<Pod> = Api::namespaced(team.clone(), &ns);
        let mut before = Vec::new();
        for i in 0..10 {
            create_hello_world(&admin, &ns, &format!("h{i}"), &format!("H{i}")).await?;
        }
        for i in 0..10 {
            before.push(
                wait_greeting_pod(&pods, &format!("h{i}"), &format!("Hello, H{i}!"), None).await?,
            );
        }
        // Promoted by the policy, as the ServiceAccount: only after 100 compared, none differing.
        let spec = eventually(
            "the candidate promoted by spec.rollout.promoteAfter",
            Duration::from_secs(120),
            || async {
                let spec = controllers(&team, &ns).get("hello-world").await?.spec;
                Ok(spec.candidate.is_none().then_some(spec))
            },
        )
        .await?;
        ensure!(
            spec.module
                .config_map
                .as_ref()
                .is_some_and(|c| c.name == "hello-same"),
            "{spec:?}"
        );
        ensure!(
            spec.module.sha256.as_deref().map(|h| format!("sha256:{h}"))
                == Some(same_digest.clone())
        );
        ensure!(
            spec.rollout.and_then(|r| r.promote_after) == Some(100),
            "the policy stays"
        );
        // The runtime logs the promotion once the API server has answered its patch: a moment
        // after the spec is seen changed.
        let promoted = eventually("the runtime logs the promotion", WAIT, || async {
            Ok(runtime
                .log()
                .lines()
                .find(|l| l.contains("candidate promoted"))
                .map(str::to_owned))
        })
        .await?;
        let log = runtime.log();
        let compared: u64 = promoted
            .split("compared=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no count in {promoted:?}"))?;
        ensure!(
            compared >= 100,
            "promoted after {compared} compared: {promoted}"
        );
        ensure!(
            !log.contains("the candidate module's answer differs"),
            "a difference was logged"
        );
        wait_status(&team, &ns, "hello-world", "the promoted module runs", |s| {
            ensure!(
                s.module_digest.as_deref() == Some(same_digest.as_str()),
                "{:?}",
                s.module_digest
            );
            Ok(())
        })
        .await?;
        // The same behaviour: no Pod was replaced.
        tokio::time::sleep(QUIET).await;
        for pod in &before {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            ensure!(
                pods.get(name).await?.metadata.uid == pod.metadata.uid,
                "Pod {name} was replaced"
            );
        }
        Ok(())
    }
    .await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

/// The restarter's WasmController `name` of parents labelled `shadow=<name>`, with `candidate`.
fn restarter(ns: &str, name: &str, candidate: &str) -> Value {
    json!({"apiVersion": "kubewasm.dev/v1alpha1", "kind": "WasmController",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "module": {"configMap": {"name": "restarter", "key": "module.wasm"}},
            "candidate": {"configMap": {"name": candidate, "key": "module.wasm"}},
            "parent": {"apiVersion": "v1", "kind": "ConfigMap", "labelSelector": format!("shadow={name}")},
            "grants": [{"apiVersion": "v1", "kind": "Pod", "verbs": ["list", "delete"]}],
            "serviceAccountName": "joe"}})
}

fn config_map(ns: &str, name: &str, labels: Value, annotations: Value, data: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations},
        "data": {"setting": data}})
}

#[tokio::test]
async fn a_risky_candidate_shows_what_it_would_delete_and_deletes_nothing() {
    let control_plane = ControlPlane::shared();
    let (admin, ns) = prepare(control_plane, "shadow-restart").await;
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = async {
        let (_alice, team) = alice(control_plane, &ns).await?;
        apply_all(&admin, &example("configmap-restarter/rbac.yaml", &ns)?).await?;
        for (name, wasm) in [
            ("restarter", guest("configmap_restarter")),
            ("restarter-wide", guest("configmap_restarter_wide")),
            ("hostile", guest("hostile")),
        ] {
            apply(&team, &module_config_map(&ns, name, "module.wasm", &wasm)).await?;
        }
        let pods: Api<Pod> = Api::namespaced(team.clone(), &ns);
        for (pod, tier) in [
            ("front-1", "front"),
            ("front-2", "front"),
            ("back-1", "back"),
            ("back-2", "back"),
        ] {
            crate::restarter::create_labelled_pod(&pods, pod, json!({"app": "web", "tier": tier}))
                .await?;
        }
        apply(&team, &restarter(&ns, "wide", "restarter-wide")).await?;
        apply(&team, &restarter(&ns, "hostile", "hostile")).await?;
        let restart = json!({"magalix.com/podDeleteMatch": "app=web,tier=front"});
        apply(
            &team,
            &config_map(
                &ns,
                "frontend",
                json!({"shadow": "wide"}),
                restart.clone(),
                "v1",
            ),
        )
        .await?;
        // First sighting: both save the data's digest, nothing to restart, nothing differs.
        let first = wait_status(&team, &ns, "wide", "the first sighting compared", |s| {
            let r = rollout(s)?;
            ensure!(r.compared >= 1, "{r:?}");
            Ok(())
        })
        .await?;
        ensure!(rollout(&first)?.differing == 0, "{:?}", first.rollout);
        let saved = eventually(
            "the live restarter saved the data's digest",
            WAIT,
            || async {
                saved_state(
                    &team,
                    &ns,
                    "WasmController",
                    "wide",
                    &format!("{ns}/frontend"),
                )
                .await
            },
        )
        .await?;
        // The data changes: the live module deletes the front Pods; the candidate would delete
        // the back Pods too.
        apply(
            &team,
            &config_map(&ns, "frontend", json!({"shadow": "wide"}), restart, "v2"),
        )
        .await?;
        let status = wait_status(&team, &ns, "wide", "the change compared, differing", |s| {
            let r = rollout(s)?;
            ensure!(r.differing >= 1, "{r:?}");
            Ok(())
        })
        .await?;
        let changes = &rollout(&status)?.last_differences[0].changes;
        for back in ["back-1", "back-2"] {
            let line = format!("delete Pod (v1) {ns}/{back}: only the candidate would do it");
            ensure!(changes.contains(&line), "{line:?} not in {changes:?}");
        }
        ensure!(
            !changes.iter().any(|c| c.contains("front-")),
            "the front Pods are deleted by both: {changes:?}"
        );
        eventually(
            "the live restarter deleted the front Pods",
            WAIT,
            || async {
                let left = crate::cluster::live_pods(&pods, "app=web").await?;
                Ok(
                    (left.keys().map(String::as_str).collect::<Vec<_>>() == ["back-1", "back-2"])
                        .then_some(()),
                )
            },
        )
        .await?;
        tokio::time::sleep(QUIET).await;
        let left = crate::cluster::live_pods(&pods, "tier=back").await?;
        ensure!(left.len() == 2, "the candidate deleted {left:?}");
        let now = saved_state(
            &team,
            &ns,
            "WasmController",
            "wide",
            &format!("{ns}/frontend"),
        )
        .await?;
        ensure!(
            now.is_some() && now != Some(saved),
            "the live restarter saved the new digest: {now:?}"
        );

        // A candidate that traps, and one that would save a state, beside the live restarter.
        for (name, mode) in [("trap", "panic"), ("hoard", "hoard-state")] {
            apply(
                &team,
                &config_map(
                    &ns,
                    name,
                    json!({"shadow": "hostile"}),
                    json!({"kubewasm.dev/hostile-mode": mode}),
                    "x",
                ),
            )
            .await?;
        }
        let status = wait_status(
            &team,
            &ns,
            "hostile",
            "both ConfigMaps compared with the hostile candidate",
            |s| {
                let r = rollout(s)?;
                let objects: BTreeSet<&str> = r
                    .last_differences
                    .iter()
                    .map(|d| d.object.as_str())
                    .collect();
                ensure!(objects.len() == 2, "{r:?}");
                Ok(())
            },
        )
        .await?;
        let r = rollout(&status)?;
        let of = |name: &str| {
            r.last_differences
                .iter()
                .find(|d| d.object == format!("{ns}/{name}"))
                .map(|d| d.changes.clone())
                .unwrap_or_default()
        };
        ensure!(
            of("trap")
                .iter()
                .any(|c| c.starts_with("the candidate failed (Trapped")
                    || c.starts_with("the candidate failed (Panicked")),
            "{:?}",
            of("trap")
        );
        ensure!(
            of("hoard").contains(&"save the state: only the candidate would do it".to_owned()),
            "{:?}",
            of("hoard")
        );
        ensure!(
            status.failures == 0 && status.failing == 0,
            "the live controller failed: {status:?}"
        );
        for name in ["trap", "hoard"] {
            let saved = saved_state(
                &team,
                &ns,
                "WasmController",
                "hostile",
                &format!("{ns}/{name}"),
            )
            .await?;
            ensure!(saved.is_none(), "a state was saved for {name}: {saved:?}");
        }
        // What the candidate's `ok` answer would have applied (the ConfigMap itself) is untouched.
        let cms: Api<ConfigMap> = Api::namespaced(team.clone(), &ns);
        let hoard = cms.get("hoard").await?;
        ensure!(
            hoard
                .data
                .unwrap_or_default()
                .get("setting")
                .map(String::as_str)
                == Some("x")
        );
        Ok(())
    }
    .await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}
