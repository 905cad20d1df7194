//! Module reads are bounded by construction (issue 38): team-a names one gzip bomb (64 KiB
//! that inflates to 64 MiB) from 32 WasmControllers while team-b's controller keeps
//! reconciling, and team-c, whose namespace is not opted in, names a module too. Read from
//! the runtime's `/metrics` (`kubewasm_module_config_map_reads`, `…_read_bytes_peak`) and its
//! VmHWM: the bomb's ConfigMap is read once for the 32 (not again while it is unchanged, once
//! more for its next version),
//! team-c's not at all, the runtime grows by a few MiB (before: each controller inflated its
//! own 64 MiB, 32 at once), each of team-a's controllers says `ModuleInvalid` with the ratio,
//! and team-b's controller still reconciles.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kube::Client;
use kube::api::DeleteParams;
use serde_json::json;

use crate::StopOnDrop;
use crate::cluster::{apply, ensure_condition, module_config_map, prepare, wait_status};
use crate::isolation::{controller, install_probe_crd, install_tenant, probe, wait_echo};
use crate::runtime::{RuntimeProcess, finish};
use kubewasm_test_support::runtime::memory_kib;

/// team-a's controllers naming the bomb.
const CONTROLLERS: usize = 32;
/// What the runtime may grow by meanwhile: one read of the bomb (3 MiB charged for the
/// response, 2 MiB inflated before the ratio stops it), 32 statuses, allocator slack. Before,
/// 32 controllers inflated 64 MiB each at once.
const GROWTH_MIB: u64 = 64;
/// How long the runtime retries team-a's controllers before the reads are counted again.
const RETRYING: Duration = Duration::from_secs(15);

#[tokio::test]
async fn a_gzip_bomb_named_by_32_controllers_is_read_once_and_costs_bounded_memory() {
    // Its own control plane: the runtime hosts every namespace, as an installed one does.
    let control_plane = StopOnDrop::start("live-module-reads");
    let (client, team_a) = prepare(&control_plane.0, "team-a").await;
    let namespace = |name| control_plane.0.namespace(name);
    let team_b = namespace("team-b").await.expect("creating team-b");
    let team_c = namespace("team-c").await.expect("creating team-c");
    let mut runtime =
        RuntimeProcess::start_with_args(&control_plane.0.runtime_kubeconfig(), "", &[]);
    let result = bomb(&client, [&team_a, &team_b, &team_c], &runtime).await;
    finish(result, &mut [&mut runtime]);
}

/// A gauge of the runtime's `/metrics`.
async fn gauge(runtime: &RuntimeProcess, series: &str) -> Result<u64> {
    let (code, metrics) = runtime.http_get("/metrics").await?;
    ensure!(code == 200, "/metrics answered {code}");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .with_context(|| format!("no `{series}` in /metrics"))?
        .trim()
        .parse()
        .with_context(|| format!("`{series}` in /metrics"))
}

/// `kubewasm_module_config_map_reads`, once `/metrics` has caught up with the statuses (it
/// is set with them).
async fn reads(runtime: &RuntimeProcess) -> Result<u64> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    gauge(runtime, "kubewasm_module_config_map_reads").await
}

async fn bomb(client: &Client, [a, b, c]: [&str; 3], runtime: &RuntimeProcess) -> Result<()> {
    install_probe_crd(client).await?;
    for ns in [a, b, c] {
        install_tenant(client, ns, "secret", "config").await?;
    }
    // team-b: its own controller, reconciling.
    apply(client, &controller(b, "steady", json!({}))).await?;
    apply(client, &probe(b, "steady", "steady", json!({"echo": "0"}))).await?;
    wait_echo(client, b, "steady", "0").await?;

    // team-c: not opted in (its RoleBinding of the runtime withdrawn): its module is not read.
    let before_c = reads(runtime).await?;
    let bindings: kube::Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        kube::Api::namespaced(client.clone(), c);
    bindings
        .delete("kubewasm-runtime-tenant", &DeleteParams::default())
        .await
        .context("withdrawing team-c's opt-in")?;
    apply(client, &controller(c, "idle", json!({}))).await?;
    wait_status(client, c, "idle", "team-c refused: not opted in", |s| {
        let ready = ensure_condition(s, "Ready", "False")?;
        ensure!(
            ready.reason == "Forbidden"
                && ready.message.contains("has no RoleBinding of the runtime"),
            "Ready says {}: {}",
            ready.reason,
            ready.message
        );
        Ok(())
    })
    .await?;
    let after_c = reads(runtime).await?;
    eprintln!("module ConfigMaps read: {before_c} before team-c's controller, {after_c} after");
    ensure!(
        after_c == before_c,
        "team-c's module was read ({before_c} reads before, {after_c} after) though its namespace is not opted in"
    );

    // team-a: 32 controllers naming the bomb, the bomb last, so that one reload reads it.
    let spec = json!({"module": {"configMap": {"name": "bomb", "key": "bomb.wasm"}}});
    for i in 0..CONTROLLERS {
        apply(
            client,
            &controller(a, &format!("bomb-{i:02}"), spec.clone()),
        )
        .await?;
    }
    let bomb = gzipped_zeros(64 << 20)?;
    // Peaks are VmHWM: what the runtime reached before (its start, team-b's compile) is the
    // baseline, and the bomb would show above it.
    let (rss_before_kib, baseline_kib) = memory_kib(runtime.pid())?;
    let before = reads(runtime).await?;
    let started = Instant::now();
    apply(client, &module_config_map(a, "bomb", "bomb.wasm", &bomb)).await?;
    refused(client, a, &bomb).await?;
    let refused_in = started.elapsed();
    let after_bomb = reads(runtime).await?;
    // team-b's controller still reconciles.
    apply(client, &probe(b, "steady", "steady", json!({"echo": "1"}))).await?;
    wait_echo(client, b, "steady", "1").await?;
    // The 32 are retried meanwhile: an unchanged ConfigMap is not read again.
    tokio::time::sleep(RETRYING).await;
    let after_retries = reads(runtime).await?;
    let (rss_kib, peak_kib) = memory_kib(runtime.pid())?;
    let budget_peak = gauge(runtime, "kubewasm_module_read_bytes_peak").await?;
    let in_use = gauge(runtime, "kubewasm_module_read_bytes").await?;
    eprintln!(
        "bomb of {} KiB named by {CONTROLLERS} controllers: refused in {refused_in:.1?}; ConfigMap reads {} for the bomb, {} more in {RETRYING:?} of retries; read budget peak {} KiB, {} KiB in use now; the runtime {} MiB before (peak {} MiB), {} MiB now, peak {} MiB",
        bomb.len() >> 10,
        after_bomb - before,
        after_retries - after_bomb,
        budget_peak >> 10,
        in_use >> 10,
        rss_before_kib >> 10,
        baseline_kib >> 10,
        rss_kib >> 10,
        peak_kib >> 10
    );
    // One read; two when a retry of some of them raced the reload the ConfigMap's arrival
    // caused (those not in the first read find nothing held once it failed). Before: 32.
    ensure!(
        (1..=2).contains(&(after_bomb - before)),
        "the bomb's ConfigMap was read {} times for {CONTROLLERS} controllers",
        after_bomb - before
    );
    ensure!(
        after_retries == after_bomb,
        "an unchanged bomb was read again {} times while its controllers were retried",
        after_retries - after_bomb
    );
    ensure!(
        in_use == 0,
        "{in_use} bytes still charged to the read budget"
    );
    ensure!(
        peak_kib < baseline_kib + (GROWTH_MIB << 10),
        "the runtime's peak grew from {} MiB to {} MiB",
        baseline_kib >> 10,
        peak_kib >> 10
    );
    // A new version of the ConfigMap (another bomb) is read once more, for all 32.
    let second = gzipped_zeros(32 << 20)?;
    apply(client, &module_config_map(a, "bomb", "bomb.wasm", &second)).await?;
    refused(client, a, &second).await?;
    let after_second = reads(runtime).await?;
    eprintln!(
        "its next version: {} more reads",
        after_second - after_retries
    );
    ensure!(
        (1..=2).contains(&(after_second - after_retries)),
        "the bomb's next version was read {} times for {CONTROLLERS} controllers",
        after_second - after_retries
    );
    Ok(())
}

/// `size` zeros, gzipped: a bomb.
fn gzipped_zeros(size: usize) -> Result<Vec<u8>> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![0; size])?;
    Ok(gz.finish()?)
}

/// Waits until each of team-a's controllers says `bomb` (by its size) inflates past the ratio.
async fn refused(client: &Client, a: &str, bomb: &[u8]) -> Result<()> {
    let size = format!("({} bytes)", bomb.len());
    for i in 0..CONTROLLERS {
        let name = format!("bomb-{i:02}");
        let status = wait_status(client, a, &name, "the bomb refused with its ratio", |s| {
            let module = ensure_condition(s, "ModuleReady", "False")?;
            ensure!(
                module.reason == "ModuleInvalid"
                    && module
                        .message
                        .contains("inflates to more than 32× its size")
                    && module.message.contains(&size),
                "ModuleReady says {}: {}",
                module.reason,
                module.message
            );
            Ok(())
        })
        .await?;
        if i == 0 {
            let said = ensure_condition(&status, "ModuleReady", "False")?;
            eprintln!("{name}: {}", said.message);
        }
    }
    Ok(())
}
