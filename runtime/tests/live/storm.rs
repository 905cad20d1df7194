//! Tenant fairness under attack: team-a's guest sleeps in WASI, loops, allocates, returns
//! 200,000 actions, a 60 MiB response and a 60 MiB error, reads with a 1 MiB selector, asks
//! to be requeued at once forever, floods its log and its stdout, logs a million empty lines
//! and text that tries to forge runtime log lines, with its limits raised as high as the CRD
//! allows; team-a also declares specs that name a discovery URL instead of an apiVersion.
//! Meanwhile team-b changes one object every second for a minute. Every change of team-b's
//! is reconciled, team-a's limits are clamped to the operator's maxima and said so, its
//! hostile specs are refused (by the CRD's patterns, or by the runtime with a status), every
//! runtime log line is one JSON object (no forged line), team-a's guest lines stay within its
//! log rate, and the runtime's memory stays under a bound derived from those maxima.
//!
//! The test prints team-b's latency (change to reconciled status, p50/p99/max) but asserts
//! nothing about time; `make bench-storm` runs the same scenario with a baseline without
//! team-a first and prints both.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use kube::Client;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::cluster::{WAIT, apply, guest, module_config_map, prepare, wait_status};
use crate::isolation::{
    controller, install_probe_crd, install_tenant, probe, probes, resident_bytes, wait_echo,
};
use crate::runtime::{RuntimeProcess, finish};
use crate::support::{LogLines, json_log_lines};
use crate::{StopOnDrop, merge};

/// The operator's maxima the runtime runs with: team-a asks for far more.
const MAX_MEMORY_MIB: u64 = 128;
const MAX_CONCURRENCY: u64 = 4;

/// team-a's sandboxes may hold `MAX_CONCURRENCY` × `MAX_MEMORY_MIB` of guest memory; the
/// runtime itself, team-b's calls and the host side of every attack must fit in this.
const HOST_ALLOWANCE: u64 = 192 << 20;

/// Each misbehaviour, four objects of each.
const MODES: [&str; 12] = [
    "sleep",
    "loop",
    "alloc",
    "many-actions",
    "raw-huge-response",
    "raw-huge-error",
    "raw-huge-selector",
    "requeue-zero",
    "huge-log",
    "flood",
    "log-lines",
    "forge-log",
];

/// The operator's caps per namespace the runtime runs with: team-a declares one controller
/// more than it may run, and one module more.
const MAX_CONTROLLERS_PER_NAMESPACE: usize = 4;
const MAX_MODULES_PER_NAMESPACE: usize = 2;

/// The operator's guest log rate per tenant the runtime runs with (`--max-log-lines-per-second`,
/// `--log-line-burst`).
const LOG_LINES_PER_SECOND: u64 = 50;
const LOG_LINE_BURST: u64 = 500;
const COPIES: usize = 4;

/// team-b's changes, one a second.
const CHANGES: usize = 60;

#[tokio::test]
async fn team_b_is_served_through_team_a_storm() {
    let control_plane = StopOnDrop::start("live-storm");
    let (client, team_a) = prepare(&control_plane.0, "team-a").await;
    let team_b = control_plane
        .0
        .namespace("team-b")
        .await
        .expect("creating team-b's namespace");
    let (memory, concurrency) = (format!("{MAX_MEMORY_MIB}Mi"), MAX_CONCURRENCY.to_string());
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.0.runtime_kubeconfig(),
        "",
        &[
            "--log-format",
            "json",
            "--max-memory",
            &memory,
            "--max-concurrency",
            &concurrency,
            "--max-timeout-millis",
            "2000",
            "--max-log-lines-per-second",
            &LOG_LINES_PER_SECOND.to_string(),
            "--log-line-burst",
            &LOG_LINE_BURST.to_string(),
            "--max-controllers-per-namespace",
            &MAX_CONTROLLERS_PER_NAMESPACE.to_string(),
            "--max-modules-per-namespace",
            &MAX_MODULES_PER_NAMESPACE.to_string(),
        ],
    );
    let started = Instant::now();
    let result = storm(&client, &team_a, &team_b, &runtime, started).await;
    finish(result, &mut [&mut runtime]);
}

async fn storm(
    client: &Client,
    a: &str,
    b: &str,
    runtime: &RuntimeProcess,
    started: Instant,
) -> Result<()> {
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

    if std::env::var_os("KUBEWASM_STORM_BASELINE").is_some() {
        let baseline = changes(client, b, "baseline", CHANGES, &mut echoes).await?;
        report("without team-a", &baseline);
    }

    // team-a: every misbehaviour at once, with limits as high as the CRD allows.
    apply(
        client,
        &controller(
            a,
            "storm",
            json!({
                "module": {"configMap": {"name": "hostile", "key": "hostile.wasm"}},
                "limits": {"memory": "1Ti", "timeoutMillis": 3_600_000, "concurrency": 1024,
                    "actions": 1_000_000, "responseBytes": "1Ti", "logBytes": "1Ti"},
            }),
        ),
    )
    .await?;
    for mode in MODES {
        for copy in 0..COPIES {
            let name = format!("{mode}-{copy}");
            apply(client, &probe(a, &name, "storm", json!({"mode": mode}))).await?;
        }
    }
    hostile_specs(client, a).await?;
    wait_status(
        client,
        a,
        "storm",
        "team-a's controller runs with its limits clamped and its failures counted",
        |s| {
            let ready = s.conditions.iter().find(|c| c.type_ == "Ready");
            let message = ready.map(|c| c.message.as_str()).unwrap_or_default();
            ensure!(
                message.contains(&format!(
                    "spec.limits.concurrency 1024 clamped to the operator's maximum of {MAX_CONCURRENCY}"
                )) && message.contains("spec.limits.responseBytes"),
                "Ready says {message:?}"
            );
            let failures = s.failures;
            ensure!(failures >= 10, "{failures} failures so far");
            Ok(())
        },
    )
    .await?;

    // The runtime's memory, sampled throughout team-b's minute.
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = tokio::spawn({
        let (peak, pid) = (peak.clone(), runtime.pid());
        async move {
            loop {
                if let Ok(rss) = resident_bytes(pid) {
                    peak.fetch_max(rss, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    let during = changes(client, b, "storm", CHANGES, &mut echoes).await;
    sampler.abort();
    let during = during?;
    report("during team-a's storm", &during);

    let peak = peak.load(Ordering::Relaxed);
    let bound = HOST_ALLOWANCE + MAX_CONCURRENCY * (MAX_MEMORY_MIB << 20);
    println!(
        "runtime peak RSS during the storm: {} MiB (bound {} MiB)",
        peak >> 20,
        bound >> 20
    );
    ensure!(
        peak <= bound,
        "the runtime grew to {} MiB, past the bound of {} MiB",
        peak >> 20,
        bound >> 20
    );

    // team-a's objects got what their guest earned, each visibly.
    let storm = probes(client, a).get("requeue-zero-0").await?;
    ensure!(
        storm.data.pointer("/status/requeued") == Some(&json!(true)),
        "requeue-zero's status: {:?}",
        storm.data.get("status")
    );
    let log = runtime.log();
    guest_log_lines(&log, &format!("{a}/storm"), started.elapsed())?;
    for reason in [
        "Timeout",
        "MemoryLimitExceeded",
        "InvalidResponse",
        "ReconcileFailed",
    ] {
        ensure!(
            log.contains(reason),
            "the runtime log names no {reason} failure of team-a's"
        );
    }
    Ok(())
}

/// Specs that name a URL instead of an apiVersion (the two a hostile tenant tried: a watch of
/// another namespace's Deployments with a day-long timeout, and a query string) are refused
/// by the API server; one that gets past the CRD's pattern (a group label of 64 characters)
/// is refused by the runtime with a status saying why. team-b is being served meanwhile.
async fn hostile_specs(client: &Client, a: &str) -> Result<()> {
    for api_version in [
        "apps/v1/namespaces/team-b/deployments?watch=1&timeoutSeconds=86400",
        "apps/v1?a=b",
    ] {
        let spec = json!({"parent": {"apiVersion": api_version, "kind": "Deployment"}});
        match apply(client, &controller(a, "url-as-api-version", spec)).await {
            Ok(_) => bail!("the API server took apiVersion {api_version:?}"),
            Err(e) => ensure!(
                format!("{e:#}").contains("spec.parent.apiVersion"),
                "refused for another reason: {e:#}"
            ),
        }
    }
    let long_group = format!("{}.example.com/v1", "a".repeat(64));
    let spec = json!({"parent": {"apiVersion": long_group, "kind": "Probe"}});
    apply(client, &controller(a, "long-group", spec)).await?;
    wait_status(
        client,
        a,
        "long-group",
        "the runtime refuses an apiVersion whose group has a 64-character label",
        |s| {
            let ready = s.conditions.iter().find(|c| c.type_ == "Ready");
            ensure!(
                ready.is_some_and(|c| c.status == "False"
                    && c.reason == "InvalidSpec"
                    && c.message.contains("invalid apiVersion")),
                "Ready is {ready:?}"
            );
            Ok(())
        },
    )
    .await?;

    // Controllers past the namespace's caps: `storm` (hostile) and `long-group` (intruder)
    // run two modules and count two controllers; `zz-1` (intruder again) fits both caps,
    // `zz-2` would be a third module, `zz-3` a fifth controller.
    apply(
        client,
        &module_config_map(a, "hello", "hello_world.wasm", &guest("hello_world")),
    )
    .await?;
    apply(client, &controller(a, "zz-1", json!({}))).await?;
    let hello = json!({"module": {"configMap": {"name": "hello", "key": "hello_world.wasm"}}});
    apply(client, &controller(a, "zz-2", hello)).await?;
    apply(client, &controller(a, "zz-3", json!({}))).await?;
    refused(client, a, "zz-2", "ModuleReady", "TooManyModules").await?;
    refused(client, a, "zz-3", "Ready", "TooManyControllers").await?;
    wait_status(client, a, "zz-1", "zz-1 runs, within both caps", |s| {
        let ready = s.conditions.iter().find(|c| c.type_ == "Ready");
        ensure!(
            ready.is_some_and(|c| c.status == "True"),
            "Ready is {ready:?}"
        );
        Ok(())
    })
    .await?;
    Ok(())
}

/// Waits until condition `type_` of controller `name` is `False` for `reason`.
async fn refused(client: &Client, ns: &str, name: &str, type_: &str, reason: &str) -> Result<()> {
    let what = format!("{name} refused: {type_} {reason}");
    wait_status(client, ns, name, &what, |s| {
        let c = s.conditions.iter().find(|c| c.type_ == type_);
        ensure!(
            c.is_some_and(|c| c.status == "False" && c.reason == reason),
            "{type_} is {c:?}"
        );
        Ok(())
    })
    .await
    .map(drop)
}

/// Every line of the runtime's log (JSON) is one object, none forged by a guest; the lines
/// team-a's guests made (host `log`, stdout, stderr) are within its log rate.
fn guest_log_lines(log: &str, controller: &str, running: Duration) -> Result<()> {
    let LogLines { lines, guest } = json_log_lines(log, controller)?;
    ensure!(
        log.contains("FORGED by a guest"),
        "forge-log's lines are not in the log at all (escaped, they should be)"
    );
    let bound = LOG_LINE_BURST + LOG_LINES_PER_SECOND * (running.as_secs() + 1);
    println!(
        "runtime log: {lines} lines in {:.0} s ({:.0} lines/s); team-a's guest lines {guest} (its rate allows {bound})",
        running.as_secs_f64(),
        lines as f64 / running.as_secs_f64()
    );
    ensure!(
        guest <= bound,
        "team-a's guests logged {guest} lines in {running:?}, more than its rate allows ({bound})"
    );
    Ok(())
}

/// team-b's Probe `steady` as its status changes: each `status.echo` and when it was seen.
pub(crate) fn echoes(client: Client, ns: &str) -> mpsc::UnboundedReceiver<(String, Instant)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let api = probes(&client, ns);
    tokio::spawn(async move {
        let config = watcher::Config::default().fields("metadata.name=steady");
        let mut stream = watcher(api, config)
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(object) = stream.next().await {
            if let Ok(object) = object
                && let Some(Value::String(echo)) = object.data.pointer("/status/echo")
                && tx.send((echo.clone(), Instant::now())).is_err()
            {
                return;
            }
        }
    });
    rx
}

/// Changes team-b's Probe `count` times, once a second, and waits for each change to be
/// reconciled; returns how long each took, from the write to the status change seen by a
/// watch.
pub(crate) async fn changes(
    client: &Client,
    ns: &str,
    run: &str,
    count: usize,
    echoes: &mut mpsc::UnboundedReceiver<(String, Instant)>,
) -> Result<Vec<Duration>> {
    let api = probes(client, ns);
    let mut latencies = Vec::with_capacity(count);
    for i in 1..=count {
        let echo = format!("{run}-{i}");
        let started = Instant::now();
        api.patch(
            "steady",
            &Default::default(),
            &merge(json!({"spec": {"echo": echo}})),
        )
        .await?;
        let seen = tokio::time::timeout(WAIT, async {
            while let Some((seen, at)) = echoes.recv().await {
                if seen == echo {
                    return Ok(at);
                }
            }
            bail!("the watch of team-b's Probe ended")
        })
        .await
        .with_context(|| format!("team-b's change {echo} was not reconciled within {WAIT:?}"))??;
        latencies.push(seen.saturating_duration_since(started));
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(started.elapsed())).await;
    }
    Ok(latencies)
}

pub(crate) fn report(what: &str, latencies: &[Duration]) {
    let slowest = (0..latencies.len())
        .max_by_key(|&i| latencies[i])
        .unwrap_or(0);
    let mut sorted = latencies.to_vec();
    sorted.sort();
    let at =
        |q: f64| sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1];
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "team-b reconcile latency {what}: {} changes, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (change {})",
        sorted.len(),
        ms(at(0.5)),
        ms(at(0.99)),
        ms(sorted[sorted.len() - 1]),
        slowest + 1
    );
}
