//! Writes shared fairly, live: team-a's 20 controllers each run hot loops of status writes
//! on 10 objects (the hostile guest's `churn`: every write changes the parent, which calls for
//! the next), far more than the replica's write rate; team-b changes one object a second. The
//! replica's scheduler gives team-b its turn ahead of team-a's queue, and team-a the rest.
//! (One object's loop is damped by its backoff, about 11 writes in its first 10 s, 14 in a
//! minute: 200 objects keep the replica's 40 writes/s busy for the test's minute.)
//!
//! Printed, not asserted (the machine is shared): team-b's latency from change to reconciled
//! status idle and during the flood (p50/p99), and team-a's write rate alone against the
//! replica's. Asserted: every change of team-b is reconciled during the flood, team-a's writes
//! flow throughout, and team-a's rate alone stays within the replica's.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kube::Client;
use serde_json::json;

use crate::StopOnDrop;
use crate::cluster::{apply, guest, module_config_map, prepare};
use crate::isolation::{controller, install_probe_crd, install_tenant, probe, wait_echo};
use crate::runtime::{RuntimeProcess, finish};
use crate::storm::{changes, echoes, report};

/// The replica's write rate the runtime runs with (`--max-writes-per-second`, burst the same).
const RATE: u64 = 40;
/// team-a's controllers, each with [`PARENTS`] churning parents.
const FLOODERS: usize = 20;
/// Churning parents per controller of team-a.
const PARENTS: usize = 10;
/// team-b's changes per run, one a second.
const CHANGES: usize = 30;

#[tokio::test]
async fn team_b_keeps_its_turn_while_team_a_floods_the_writes() {
    let control_plane = StopOnDrop::start("live-fairness");
    let (client, team_a) = prepare(&control_plane.0, "team-a").await;
    let team_b = control_plane
        .0
        .namespace("team-b")
        .await
        .expect("creating team-b's namespace");
    let rate = RATE.to_string();
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.0.runtime_kubeconfig(),
        "",
        &[
            "--max-writes-per-second",
            &rate,
            "--write-burst",
            &rate,
            "--max-controllers-per-namespace",
            "32",
        ],
    );
    let result = fairness(&client, &team_a, &team_b, &runtime).await;
    finish(result, &mut [&mut runtime]);
}

/// team-a's writes granted so far (its controllers' `kubewasm_api_requests_total`).
async fn writes_of(runtime: &RuntimeProcess, ns: &str) -> Result<u64> {
    let (_, metrics) = runtime.http_get("/metrics").await?;
    let prefix = format!("kubewasm_api_requests_total{{controller=\"{ns}/");
    Ok(metrics
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

async fn fairness(client: &Client, a: &str, b: &str, runtime: &RuntimeProcess) -> Result<()> {
    install_probe_crd(client).await?;
    install_tenant(client, a, "a-secret", "a-config").await?;
    install_tenant(client, b, "b-secret", "b-config").await?;
    apply(
        client,
        &module_config_map(a, "hostile", "hostile.wasm", &guest("hostile")),
    )
    .await?;

    // team-b alone: its idle figures.
    apply(client, &controller(b, "steady", json!({}))).await?;
    apply(client, &probe(b, "steady", "steady", json!({"echo": "0"}))).await?;
    wait_echo(client, b, "steady", "0").await?;
    let mut echoes = echoes(client.clone(), b);
    let idle = changes(client, b, "idle", CHANGES, &mut echoes).await?;
    report("with team-a absent", &idle);

    // team-a: 20 controllers, each a hot loop of status writes.
    for i in 0..FLOODERS {
        let name = format!("churn-{i}");
        let module = json!({"module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}}});
        apply(client, &controller(a, &name, module)).await?;
        for j in 0..PARENTS {
            apply(
                client,
                &probe(a, &format!("p-{i}-{j}"), &name, json!({"mode": "churn"})),
            )
            .await?;
        }
    }
    let flowing = Instant::now();
    loop {
        if writes_of(runtime, a).await? >= 4 * RATE {
            break;
        }
        ensure!(
            flowing.elapsed() < crate::cluster::WAIT,
            "team-a's writes did not flow: {} so far",
            writes_of(runtime, a).await?
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // team-a with team-b idle: how much of the replica's rate it gets.
    let (before, since) = (writes_of(runtime, a).await?, Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let alone = (writes_of(runtime, a).await? - before) as f64 / since.elapsed().as_secs_f64();
    println!(
        "team-a alone: {alone:.1} writes/s of the replica's {RATE}/s ({FLOODERS} controllers churning {PARENTS} objects each)"
    );
    // The replica's rate bounds it (a burst's worth may fall in the window: 10 s × RATE + RATE).
    ensure!(
        alone <= RATE as f64 * 1.25,
        "team-a wrote {alone:.1}/s, past the replica's {RATE}/s"
    );

    // team-b's changes during the flood: each reconciled, and how long it took.
    let before = writes_of(runtime, a).await?;
    let flood = changes(client, b, "flood", CHANGES, &mut echoes).await?;
    report("during team-a's flood", &flood);
    let during = writes_of(runtime, a).await? - before;
    println!(
        "team-a meanwhile: {during} writes in {CHANGES} s ({:.1}/s)",
        during as f64 / CHANGES as f64
    );
    ensure!(
        during > 0,
        "team-a's writes stopped during team-b's changes"
    );
    Ok(())
}
