//! Spins and Event floods damped per object (issue 38), on a replica with nothing else to
//! do: team-a's hostile guest writes a new status and asks to be requeued at once on every
//! reconcile (`requeue-write`), only asks to be requeued at once (`requeue-zero`), and
//! records 500 Events per reconcile, each with a reason of its own, and asks to be requeued
//! at once (`event-flood`). Over the first 10 s of each object the test counts what reached
//! the API server: the resourceVersions of the spinning object (its status writes), the
//! Event objects on the flooded one and the sum of their counts, and the controller's API
//! writes, reconciles, damped reconciles and dropped Events from `/metrics`; it prints them
//! and asserts them bounded (the backoff: 5 ms doubling, about 11 writes in 10 s; the spam
//! filter: a burst of 25). A change of the spinning object from outside is reconciled at
//! once all the same (its backoff is forgotten), and team-b's controller is served
//! throughout.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Event;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{apply, guest, module_config_map, prepare, wait_status};
use crate::isolation::{controller, install_probe_crd, install_tenant, probe, probes, wait_echo};
use crate::runtime::{RuntimeProcess, finish};
use crate::storm::{changes, echoes, report};
use crate::{StopOnDrop, merge};

/// How long each object's writes and Events are counted, from its creation.
const WINDOW: Duration = Duration::from_secs(10);

/// The backoff (5 ms doubling) allows 11 writes in 10 s; room for a reconcile the object's
/// creation and the controller's start bring.
const MAX_WRITES: usize = 15;

/// The spam filter's burst, and one more for a refill.
const MAX_EVENTS: usize = 26;

#[tokio::test]
async fn spins_and_event_floods_are_damped_per_object() {
    let control_plane = StopOnDrop::start("live-damping");
    let (client, team_a) = prepare(&control_plane.0, "team-a").await;
    let team_b = control_plane
        .0
        .namespace("team-b")
        .await
        .expect("creating team-b's namespace");
    // Default flags: nothing but the damping holds the spin back.
    let mut runtime = RuntimeProcess::start(&control_plane.0.runtime_kubeconfig(), "");
    let result = damping(&client, &team_a, &team_b, &runtime).await;
    finish(result, &mut [&mut runtime]);
}

async fn damping(client: &Client, a: &str, b: &str, runtime: &RuntimeProcess) -> Result<()> {
    install_probe_crd(client).await?;
    install_tenant(client, a, "a-secret", "a-config").await?;
    install_tenant(client, b, "b-secret", "b-config").await?;
    apply(
        client,
        &module_config_map(a, "hostile", "hostile.wasm", &guest("hostile")),
    )
    .await?;

    // team-b: one well-behaved controller echoing spec.echo into its status.
    apply(client, &controller(b, "steady", json!({}))).await?;
    apply(client, &probe(b, "steady", "steady", json!({"echo": "0"}))).await?;
    wait_echo(client, b, "steady", "0").await?;
    let mut echoes = echoes(client.clone(), b);

    // team-a: the hostile controller, running before its objects exist.
    let spec = json!({"module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}}});
    apply(client, &controller(a, "spin", spec)).await?;
    wait_status(client, a, "spin", "team-a's controller is ready", |s| {
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready");
        ensure!(
            ready.is_some_and(|c| c.status == "True"),
            "Ready is {ready:?}"
        );
        Ok(())
    })
    .await?;

    let versions = versions(client.clone(), a);
    // The watch lists (nothing yet) before the objects are created.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let created = Instant::now();
    for mode in ["requeue-write", "requeue-zero", "event-flood"] {
        apply(client, &probe(a, mode, "spin", json!({"mode": mode}))).await?;
    }
    // team-b changes its object once a second meanwhile.
    let served = changes(client, b, "damping", 7, &mut echoes).await?;
    tokio::time::sleep(WINDOW.saturating_sub(created.elapsed())).await;
    let seen = versions.stop();
    let window = created.elapsed();
    let metrics = metrics(runtime, &format!("{a}/spin")).await?;
    let flood = events_on(client, a, "event-flood").await?;
    let requeues = probes(client, a)
        .get("requeue-write")
        .await?
        .data
        .pointer("/status/requeues")
        .cloned();

    let writes = |name: &str| seen.get(name).map_or(0, |v| v.len().saturating_sub(1));
    println!(
        "in the first {:.1} s of each object (kubewasm run with default flags): requeue-write {} status writes (status.requeues {requeues:?}), requeue-zero {} writes, event-flood {} writes and {} Event objects with counts summing to {}; the controller's API writes {}, reconciles {}, reconciles damped {}, Events dropped {}",
        window.as_secs_f64(),
        writes("requeue-write"),
        writes("requeue-zero"),
        writes("event-flood"),
        flood.objects,
        flood.count,
        metrics.api_requests,
        metrics.reconciles,
        metrics.damped,
        metrics.events_dropped,
    );
    report("during team-a's spins", &served);

    ensure!(
        (3..=MAX_WRITES).contains(&writes("requeue-write")),
        "requeue-write's status was written {} times in {WINDOW:?}: not damped (more than {MAX_WRITES}), or not spinning at all",
        writes("requeue-write")
    );
    ensure!(
        writes("requeue-zero") <= 1,
        "requeue-zero's status (always the same) was written {} times",
        writes("requeue-zero")
    );
    ensure!(
        (1..=MAX_EVENTS).contains(&flood.objects) && flood.count <= MAX_EVENTS as i64,
        "event-flood has {} Event objects whose counts sum to {}: more than the spam filter's {MAX_EVENTS}",
        flood.objects,
        flood.count
    );
    ensure!(
        metrics.events_dropped >= 400,
        "only {} Events dropped: the flood was not counted",
        metrics.events_dropped
    );
    // Status writes, one status of requeue-zero, the Events: no more.
    let bound = MAX_WRITES + 1 + MAX_EVENTS;
    ensure!(
        metrics.api_requests <= bound as u64,
        "team-a's controller sent {} API writes in {WINDOW:?}, more than {bound}",
        metrics.api_requests
    );

    // A change from outside is reconciled at once, however far the backoff has grown.
    let before = requeues.and_then(|r| r.as_u64()).unwrap_or(0);
    let poked = Instant::now();
    probes(client, a)
        .patch(
            "requeue-write",
            &Default::default(),
            &merge(json!({"spec": {"poke": 1}})),
        )
        .await?;
    let api = probes(client, a);
    let after = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            let now = api.get("requeue-write").await?;
            let requeues = now.data.pointer("/status/requeues").and_then(|r| r.as_u64());
            if requeues.is_some_and(|r| r > before) {
                return anyhow::Ok(requeues);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .context("a change of requeue-write's spec was not reconciled within 3 s: its backoff was not forgotten")??;
    println!(
        "a change from outside reconciled {:.0} ms after it was written (status.requeues {before} -> {after:?})",
        poked.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// A watch of team-a's spinning Probes: every resourceVersion each was seen at.
struct Versions {
    task: tokio::task::JoinHandle<()>,
    seen: std::sync::Arc<std::sync::Mutex<BTreeMap<String, BTreeSet<String>>>>,
}

fn versions(client: Client, ns: &str) -> Versions {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(
        BTreeMap::<String, BTreeSet<String>>::new(),
    ));
    let api = probes(&client, ns);
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            let config = watcher::Config::default().labels("role=spin");
            let mut stream = watcher(api, config)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(object) = stream.next().await {
                if let Ok(object) = object
                    && let (Some(name), Some(rv)) = (
                        object.metadata.name.clone(),
                        object.metadata.resource_version.clone(),
                    )
                    && let Ok(mut seen) = seen.lock()
                {
                    seen.entry(name).or_default().insert(rv);
                }
            }
        }
    });
    Versions { task, seen }
}

impl Versions {
    fn stop(self) -> BTreeMap<String, BTreeSet<String>> {
        self.task.abort();
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// The Events on one object: how many, and the sum of their counts.
struct Events {
    objects: usize,
    count: i64,
}

async fn events_on(client: &Client, ns: &str, name: &str) -> Result<Events> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let list = api
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await?;
    Ok(Events {
        objects: list.items.len(),
        count: list
            .items
            .iter()
            .map(|e| i64::from(e.count.unwrap_or(1)))
            .sum(),
    })
}

/// What `/metrics` says of one controller.
struct Counts {
    api_requests: u64,
    reconciles: u64,
    damped: u64,
    events_dropped: u64,
}

async fn metrics(runtime: &RuntimeProcess, controller: &str) -> Result<Counts> {
    let (status, body) = runtime.http_get("/metrics").await?;
    if status != 200 {
        bail!("/metrics answered {status}");
    }
    let value = |name: &str, labels: &str| -> u64 {
        let prefix = format!("{name}{{{labels}}} ");
        body.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    let labels = format!("controller=\"{controller}\"");
    Ok(Counts {
        api_requests: value("kubewasm_api_requests_total", &labels),
        reconciles: value(
            "kubewasm_reconciles_total",
            &format!("{labels},result=\"success\""),
        ),
        damped: value("kubewasm_reconciles_damped_total", &labels),
        events_dropped: value("kubewasm_events_dropped_total", &labels),
    })
}
