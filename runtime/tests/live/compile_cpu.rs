//! A tenant's compiles are charged the compiler's CPU time: past its
//! `--compile-cpu-seconds-per-hour`, its next new module waits, and the status says why.
//!
//! The runtime runs with two CPU seconds of compiling an hour per namespace. The tenant's
//! bystander module (about half a CPU second) and its `heavy` module — one function of 500,000
//! "ring" operations, which takes the compiler about 3.5 s of CPU and exports no reconciler —
//! are compiled (the second overdraws the budget: a compile is charged when it ends). A third,
//! new module is then refused: `ModuleReady=False`, `CompileBudgetExceeded`, naming the flag;
//! the bystander keeps reconciling, and the runtime compiled exactly two modules.

use std::io::Write as _;

use anyhow::{Result, ensure};
use kube::Client;
use serde_json::json;

use crate::cluster::{WAIT, apply, condition, module_config_map, prepare, wait_status};
use crate::isolation::{controller, install_probe_crd, install_tenant, probe, probes};
use crate::runtime::{RuntimeProcess, finish};
use crate::support::guests::{Operands, heavy_component};
use crate::support::{ControlPlane, eventually};

#[tokio::test]
async fn compiles_past_the_tenants_cpu_seconds_wait() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "compile-cpu").await;
    let mut runtime = RuntimeProcess::start_with_args(
        &control_plane.runtime_kubeconfig(),
        &ns,
        &["--compile-cpu-seconds-per-hour=2"],
    );
    let result = charged(&client, &ns, &runtime).await;
    finish(result, &mut [&mut runtime]);
    let _ = control_plane.delete_namespace(&ns).await;
}

/// `wasm` gzipped, in ConfigMap `name` of `ns`, run by a controller `name` on Probes of role
/// `name`.
async fn declare(client: &Client, ns: &str, name: &str, wasm: &[u8]) -> Result<()> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(wasm)?;
    let key = format!("{name}.wasm");
    apply(client, &module_config_map(ns, name, &key, &gz.finish()?)).await?;
    let spec = json!({"module": {"configMap": {"name": name, "key": key}}});
    apply(client, &controller(ns, name, spec)).await?;
    Ok(())
}

async fn charged(client: &Client, ns: &str, runtime: &RuntimeProcess) -> Result<()> {
    install_probe_crd(client).await?;
    install_tenant(client, ns, "secret", "config").await?;
    apply(client, &controller(ns, "steady", json!({}))).await?;
    apply(client, &probe(ns, "steady", "steady", json!({"echo": "1"}))).await?;
    eventually("the bystander reconciles", WAIT, || async {
        let p = probes(client, ns).get("steady").await?;
        ensure!(
            p.data.pointer("/status/echo") == Some(&json!("1")),
            "status: {:?}",
            p.data.get("status")
        );
        Ok(Some(()))
    })
    .await?;
    // Compiled with the CPU seconds left (the bucket is above zero), whatever it takes; the
    // compiler accepts it, the runtime does not (no reconciler): compiled, and charged.
    declare(
        client,
        ns,
        "heavy",
        &heavy_component(500_000, 127, Operands::Ring),
    )
    .await?;
    wait_status(client, ns, "heavy", "the heavy module compiled", |s| {
        let module = condition(s, "ModuleReady")?;
        ensure!(
            module.status == "False"
                && module.reason == "ModuleInvalid"
                && module.message.contains("no export `reconcile`"),
            "ModuleReady is {}: {}",
            module.reason,
            module.message
        );
        Ok(())
    })
    .await?;
    // The next new module waits for the tenant's CPU seconds.
    declare(
        client,
        ns,
        "late",
        &heavy_component(1_000, 10, Operands::Random),
    )
    .await?;
    wait_status(client, ns, "late", "the compile refused", |s| {
        let module = condition(s, "ModuleReady")?;
        ensure!(
            module.status == "False"
                && module.reason == "CompileBudgetExceeded"
                && module.message.contains("--compile-cpu-seconds-per-hour")
                && module.message.contains("2 CPU seconds an hour"),
            "ModuleReady is {} {}: {}",
            module.status,
            module.reason,
            module.message
        );
        Ok(())
    })
    .await?;
    let (_, metrics) = runtime.http_get("/metrics").await?;
    ensure!(
        metrics.lines().any(|l| l == "kubewasm_modules_compiled 2"),
        "two modules compiled: {}",
        metrics
            .lines()
            .filter(|l| l.contains("modules_compiled"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let p = probes(client, ns).get("steady").await?;
    ensure!(
        p.data.pointer("/status/echo") == Some(&json!("1")),
        "the bystander still reconciled"
    );
    Ok(())
}
