//! Many controllers starting together read their saved states from one list of every states
//! object, not one list each — and lose nothing by it: 40 pod watchers of one namespace start
//! with the runtime; `pod-watcher` saved a state for Pod `kept` (its shard object as a
//! runtime before wrote it), so it reports nothing for it; the 39 others saved none and each
//! reports it added once. Two objects labelled as `pw-01`'s shards but not (another
//! controller's name inside, a name that is not a shard's) make the list say `pw-01` has
//! some: it then reads its own, passes them over as before, and reports the Pod too.

use std::collections::BTreeMap;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, Client};
use kubewasm::api::{STATE_OF_LABEL, WasmControllerState, state_prefix};
use kubewasm::host::shard_of_key;
use serde_json::json;

use crate::cluster::{WAIT, apply_all, guest, prepare};
use crate::restarter::create_pod;
use crate::runtime::{RuntimeProcess, finish};
use crate::state::manifests;
use crate::support::{ControlPlane, eventually};

/// Controllers starting together: `pod-watcher` and `pw-01` … `pw-39` (at least the runtime's
/// 32 from which one list is made).
const CONTROLLERS: usize = 40;

/// Pod `kept` as the pod watcher summarizes it (Pending, no node, `app=kept`, no containers
/// started): the state `pod-watcher` saved for it.
const KEPT: &str = r#"{"p":"Pending","n":"-","l":{"v":{"app":"kept"}},"c":{"v":[]}}"#;

#[tokio::test]
async fn controllers_starting_together_read_only_the_states_they_saved_from_one_list() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "state-together").await;
    set_up(&client, &ns)
        .await
        .expect("setting up the controllers");
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = checked(&ns, &runtime).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

/// The pod watchers' names.
fn names() -> Vec<String> {
    std::iter::once("pod-watcher".to_owned())
        .chain((1..CONTROLLERS).map(|i| format!("pw-{i:02}")))
        .collect()
}

async fn set_up(client: &Client, ns: &str) -> Result<()> {
    let mut objects = manifests(ns, &guest("pod_watcher"));
    let controller = objects.pop().expect("the pod watcher's WasmController");
    for name in names() {
        let mut wc = controller.clone();
        wc["metadata"]["name"] = json!(name);
        objects.push(wc);
    }
    apply_all(client, &objects).await?;
    create_pod(&Api::<Pod>::namespaced(client.clone(), ns), "kept", "kept").await?;
    let key = format!("{ns}/kept");
    let shard = shard_of_key(&key);
    let entries = BTreeMap::from([(key, KEPT.to_owned())]);
    let pod_watcher = state_prefix("WasmController", "pod-watcher");
    let pw_01 = state_prefix("WasmController", "pw-01");
    let states: Api<WasmControllerState> = Api::namespaced(client.clone(), ns);
    for (name, prefix, of) in [
        // What a runtime before wrote.
        (
            format!("{pod_watcher}-{shard:02}"),
            &pod_watcher,
            "pod-watcher",
        ),
        // Labelled as pw-01's, holding another controller's states.
        (format!("{pw_01}-{shard:02}"), &pw_01, "pod-watcher"),
        // Labelled as pw-01's, with a name no shard of it has.
        (format!("{pw_01}-x"), &pw_01, "pw-01"),
    ] {
        let object: WasmControllerState = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {STATE_OF_LABEL: prefix}},
            "spec": {"controller": format!("WasmController/{of}"), "shard": shard,
                "entries": entries},
        }))?;
        states.create(&PostParams::default(), &object).await?;
    }
    Ok(())
}

async fn checked(ns: &str, runtime: &RuntimeProcess) -> Result<()> {
    let names = names();
    let said = format!("2 of {CONTROLLERS} controllers starting have states objects");
    eventually(
        "every pod watcher but pod-watcher reporting Pod kept added",
        WAIT,
        || async {
            let log = runtime.log_since(0);
            ensure!(log.contains(&said), "the runtime did not say `{said}`");
            let added = added(&log, ns);
            let missing: Vec<&String> = names[1..]
                .iter()
                .filter(|n| !added.contains_key(*n))
                .collect();
            ensure!(missing.is_empty(), "not reported by {missing:?}");
            Ok(Some(()))
        },
    )
    .await?;
    // Long enough for pod-watcher's first reconcile too.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let added = added(&runtime.log_since(0), ns);
    ensure!(
        !added.contains_key("pod-watcher"),
        "pod-watcher reported Pod kept added: its saved state was not loaded"
    );
    let twice: Vec<(&String, &usize)> = added.iter().filter(|(_, n)| **n > 1).collect();
    ensure!(twice.is_empty(), "reported more than once: {twice:?}");
    Ok(())
}

/// How many times each pod watcher of `ns` logged Pod `kept` added, by controller name.
fn added(log: &str, ns: &str) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    let (controller, pod) = (
        format!("controller=\"{ns}/"),
        format!("pod {ns}/kept added"),
    );
    for line in log.lines().filter(|l| l.contains(&pod)) {
        let Some(at) = line.find(&controller) else {
            continue;
        };
        let rest = &line[at + controller.len()..];
        if let Some(name) = rest.split('"').next() {
            *seen.entry(name.to_owned()).or_default() += 1;
        }
    }
    seen
}
