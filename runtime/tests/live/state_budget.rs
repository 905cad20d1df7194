//! Guest state bounded per namespace (issue 38), live: team-a runs three WasmControllers of
//! the hostile guest in `hoard-state` mode over the same 50 Probes, each saving the most state
//! an object may have (512 bytes) for every Probe — 150 states, some 80 KB — under `kubewasm
//! run --max-state-bytes-per-namespace 64Ki`, well under the quota per controller. The test
//! reads team-a's WasmControllerState objects and asserts that what they hold (keys and
//! values, as the runtime counts them) stays within the cap, and that each controller that
//! could not save all its states says `StateBudgetExceeded`, naming the flag, in its status;
//! team-b's controller saves its states all the while. Then one of team-a's controllers is
//! deleted: the bytes it held are credited, and the other two save the rest (their 100
//! states fit).

use std::collections::BTreeMap;

use anyhow::{Result, bail, ensure};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client};
use kubewasm::api::WasmControllerState;
use serde_json::json;

use crate::cluster::{apply, apply_all, controller_status, guest, module_config_map, prepare};
use crate::isolation::{controller, install_probe_crd, install_tenant, probe, probes};
use crate::runtime::{RuntimeProcess, finish};
use crate::support::eventually;
use crate::{StopOnDrop, merge};

/// The operator's cap per namespace the runtime runs with.
const CAP: usize = 64 << 10;
/// team-a's Probes, each reconciled by all three of its controllers.
const PROBES: usize = 50;
/// team-a's controllers.
const HOARDERS: [&str; 3] = ["hoard-0", "hoard-1", "hoard-2"];
/// team-b's Probes.
const KEPT: usize = 5;

#[tokio::test]
async fn a_namespace_s_controllers_keep_no_more_state_than_its_cap() {
    let control_plane = StopOnDrop::start("live-state-budget");
    let (client, team_a) = prepare(&control_plane.0, "team-a").await;
    let team_b = control_plane
        .0
        .namespace("team-b")
        .await
        .expect("creating team-b's namespace");
    let cap = format!("{}Ki", CAP >> 10);
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.0.runtime_kubeconfig(),
        "",
        &["--max-state-bytes-per-namespace", &cap],
    );
    let collects = control_plane.0.has_controller_manager();
    let result = bounded(&client, &team_a, &team_b, collects, &runtime).await;
    finish(result, &mut [&mut runtime]);
}

/// What one namespace's WasmControllerState objects hold, per controller.
#[derive(Debug, Default)]
struct Stored {
    /// States and their bytes (key, value and 6 for the JSON around them, as the runtime
    /// counts them), by controller name.
    per_controller: BTreeMap<String, (usize, usize)>,
    /// The objects' `spec.entries` as JSON, all together.
    json_bytes: usize,
}

impl Stored {
    async fn read(client: &Client, ns: &str) -> Result<Stored> {
        let api: Api<WasmControllerState> = Api::namespaced(client.clone(), ns);
        let mut stored = Stored::default();
        for shard in api.list(&ListParams::default()).await?.items {
            let name = shard
                .spec
                .controller
                .trim_start_matches("WasmController/")
                .to_owned();
            stored.json_bytes += serde_json::to_vec(&shard.spec.entries)?.len();
            let (states, bytes) = stored.per_controller.entry(name).or_default();
            for (k, v) in &shard.spec.entries {
                *states += 1;
                *bytes += k.len() + v.len() + 6;
            }
        }
        Ok(stored)
    }

    fn states(&self, controller: &str) -> usize {
        self.per_controller.get(controller).map_or(0, |s| s.0)
    }

    fn bytes(&self) -> usize {
        self.per_controller.values().map(|s| s.1).sum()
    }

    fn print(&self, when: &str) {
        println!(
            "{when}: {} bytes of states ({} as JSON) in all, per controller (states, bytes): {:?}; the cap {CAP}",
            self.bytes(),
            self.json_bytes,
            self.per_controller
        );
    }
}

/// The reason and message of the controller's `Degraded` condition, when it is true.
async fn degraded(client: &Client, ns: &str, name: &str) -> Result<Option<(String, String)>> {
    let status = controller_status(client, ns, name).await?;
    Ok(status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded" && c.status == "True")
        .map(|c| (c.reason.clone(), c.message.clone())))
}

async fn bounded(
    client: &Client,
    a: &str,
    b: &str,
    collects: bool,
    runtime: &RuntimeProcess,
) -> Result<()> {
    install_probe_crd(client).await?;
    let hostile = json!({"module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}}});
    for ns in [a, b] {
        install_tenant(client, ns, "secret", "config").await?;
        apply(
            client,
            &module_config_map(ns, "hostile", "hostile.wasm", &guest("hostile")),
        )
        .await?;
    }
    let over = |role: &str| {
        let mut spec = hostile.clone();
        spec["parent"] = json!({"apiVersion": "isolation.kubewasm.dev/v1", "kind": "Probe",
            "labelSelector": format!("role={role}")});
        spec
    };
    // team-b: one controller saving the most state there is for each of its Probes.
    apply(client, &controller(b, "keeper", over("keep"))).await?;
    let kept: Vec<_> = (0..KEPT)
        .map(|i| {
            probe(
                b,
                &format!("p-{i:02}"),
                "keep",
                json!({"mode": "hoard-state"}),
            )
        })
        .collect();
    apply_all(client, &kept).await?;
    // team-a: three controllers over the same Probes.
    let hoarders: Vec<_> = HOARDERS
        .iter()
        .map(|name| controller(a, name, over("hoard")))
        .collect();
    apply_all(client, &hoarders).await?;
    let hoarded: Vec<_> = (0..PROBES)
        .map(|i| {
            probe(
                a,
                &format!("p-{i:02}"),
                "hoard",
                json!({"mode": "hoard-state"}),
            )
        })
        .collect();
    apply_all(client, &hoarded).await?;

    // Each of team-a's controllers saved every state, or says why not.
    let said = eventually(
        "each of team-a's controllers saved all its states or says StateBudgetExceeded",
        crate::cluster::WAIT,
        || async {
            let stored = Stored::read(client, a).await?;
            let mut said = Vec::new();
            for name in HOARDERS {
                if stored.states(name) == PROBES {
                    continue;
                }
                match degraded(client, a, name).await? {
                    Some((reason, message)) if reason == "StateBudgetExceeded" => {
                        said.push((name, message));
                    }
                    other => bail!(
                        "{name} saved {} of {PROBES} states and its Degraded condition is {other:?}",
                        stored.states(name)
                    ),
                }
            }
            Ok(Some(said))
        },
    )
    .await?;
    let full = Stored::read(client, a).await?;
    full.print("team-a with three controllers");
    for (name, message) in &said {
        println!("{name}: Degraded, StateBudgetExceeded: {message}");
    }
    ensure!(
        full.bytes() <= CAP,
        "team-a's states take {} bytes, over the cap of {CAP}",
        full.bytes()
    );
    ensure!(
        full.bytes() >= CAP / 2,
        "team-a's states take only {} bytes: its controllers did not save as the cap allows",
        full.bytes()
    );
    ensure!(
        !said.is_empty(),
        "no controller of team-a was refused, yet {} states of {} cannot fit",
        HOARDERS.len() * PROBES,
        full.bytes()
    );
    for (name, message) in &said {
        ensure!(
            message.contains("--max-state-bytes-per-namespace")
                && message.contains(&format!("namespace {a}'s controllers")),
            "{name}'s status does not name the cap: {message}"
        );
    }

    // team-b saves all the while.
    eventually(
        "team-b's controller saved the state of each of its Probes",
        crate::cluster::WAIT,
        || async {
            let stored = Stored::read(client, b).await?;
            ensure!(
                stored.states("keeper") == KEPT,
                "{} states",
                stored.states("keeper")
            );
            Ok(Some(()))
        },
    )
    .await?;
    ensure!(
        degraded(client, b, "keeper").await?.is_none(),
        "team-b's controller is degraded"
    );
    let kept = Stored::read(client, b).await?;
    kept.print("team-b");
    // What the replica holds of them, on /metrics: the two namespaces' states, no more. Read
    // again at each check: a state the runtime charged may still be on its way to its object
    // when the first snapshot above was taken.
    eventually(
        "kubewasm_state_bytes counts the states both namespaces saved",
        crate::cluster::WAIT,
        || async {
            let held =
                Stored::read(client, a).await?.bytes() + Stored::read(client, b).await?.bytes();
            let (_, metrics) = runtime.http_get("/metrics").await?;
            let line = metrics
                .lines()
                .find(|l| l.starts_with("kubewasm_state_bytes "))
                .unwrap_or("kubewasm_state_bytes missing");
            ensure!(
                line == format!("kubewasm_state_bytes {held}"),
                "{line}, want {held}"
            );
            Ok(Some(()))
        },
    )
    .await?;

    // One of team-a's controllers deleted: its bytes are given back, and the other two, their
    // Probes changed so that each is reconciled at once, save all their states.
    let controllers: Api<kubewasm::api::WasmController> = Api::namespaced(client.clone(), a);
    controllers
        .delete(HOARDERS[0], &DeleteParams::default())
        .await?;
    let api = probes(client, a);
    for i in 0..PROBES {
        let patch = merge(json!({"spec": {"round": 2}}));
        api.patch(&format!("p-{i:02}"), &Default::default(), &patch)
            .await?;
    }
    eventually(
        "team-a's two remaining controllers saved all their states",
        crate::cluster::WAIT,
        || async {
            let stored = Stored::read(client, a).await?;
            for name in &HOARDERS[1..] {
                ensure!(
                    stored.states(name) == PROBES,
                    "{name} saved {} of {PROBES}",
                    stored.states(name)
                );
                ensure!(
                    degraded(client, a, name).await?.is_none(),
                    "{name} is still degraded"
                );
            }
            if collects {
                ensure!(
                    stored.states(HOARDERS[0]) == 0,
                    "{} states of the deleted controller not collected yet",
                    stored.states(HOARDERS[0])
                );
            }
            Ok(Some(()))
        },
    )
    .await?;
    let after = Stored::read(client, a).await?;
    after.print("team-a after one controller was deleted");
    ensure!(
        after.bytes() <= CAP || !collects,
        "team-a's states take {} bytes, over the cap of {CAP}",
        after.bytes()
    );
    Ok(())
}
