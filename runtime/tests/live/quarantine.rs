//! A module whose compile ends the compiler is quarantined, alone, and the runtime goes on.
//!
//! The runtime (`--compile-memory=64Mi`, `--quarantine-namespace`) compiles each new module in
//! a child process. A tenant's module `heavy` — one function of 100,000 multiplications, gzipped
//! in a ConfigMap — needs about 90 MiB to compile, so its child ends at the limit; it is
//! declared together with a bystander's controller (another module, compiled beside it). The
//! heavy controller is `ModuleReady=False`, `Quarantined`, naming its digest and the limit; the
//! quarantine ConfigMap holds its digest and no other; the bystander reconciles; the runtime is
//! the same process throughout. A restarted runtime reads the quarantine and compiles nothing
//! for it (its compile counter stays at the bystander's one module, and it counts one module
//! quarantined).

use std::io::Write as _;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::DeleteParams;
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{WAIT, apply, condition, module_config_map, prepare, sha256, wait_status};
use crate::isolation::{controller, install_probe_crd, install_tenant, probe, probes};
use crate::runtime::{RuntimeProcess, finish};
use crate::support::guests::{Operands, heavy_component};
use crate::support::{ControlPlane, RUNTIME_NAMESPACE, eventually};

const QUARANTINE: &str = "kubewasm-quarantine";

#[tokio::test]
async fn a_module_whose_compile_ends_the_compiler_is_quarantined_alone() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "quarantine").await;
    let kubeconfig = control_plane.runtime_kubeconfig();
    let quarantine: Api<ConfigMap> = Api::namespaced(client.clone(), RUNTIME_NAMESPACE);
    let _ = quarantine
        .delete(QUARANTINE, &DeleteParams::default())
        .await;
    let mut runtime = RuntimeProcess::start_with_args(
        &kubeconfig,
        &ns,
        &[
            "--quarantine-namespace",
            RUNTIME_NAMESPACE,
            "--compile-memory=64Mi",
        ],
    );
    let result = quarantined(&client, &ns, &quarantine, &mut runtime).await;
    finish(result, &mut [&mut runtime]);
    let _ = quarantine
        .delete(QUARANTINE, &DeleteParams::default())
        .await;
    let _ = control_plane.delete_namespace(&ns).await;
}

async fn quarantined(
    client: &Client,
    ns: &str,
    quarantine: &Api<ConfigMap>,
    runtime: &mut RuntimeProcess,
) -> Result<()> {
    install_probe_crd(client).await?;
    install_tenant(client, ns, "secret", "config").await?;
    let heavy = heavy_component(100_000, 500, Operands::Random);
    let hex = sha256(&heavy).trim_start_matches("sha256:").to_owned();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&heavy)?;
    let gzipped = gz.finish()?;
    println!(
        "heavy module: {} bytes, {} gzipped",
        heavy.len(),
        gzipped.len()
    );
    apply(
        client,
        &module_config_map(ns, "heavy", "heavy.wasm", &gzipped),
    )
    .await?;
    let heavy_spec = json!({"module": {"configMap": {"name": "heavy", "key": "heavy.wasm"}}});
    apply(client, &controller(ns, "heavy", heavy_spec)).await?;
    apply(client, &controller(ns, "steady", json!({}))).await?;
    apply(client, &probe(ns, "steady", "steady", json!({"echo": "1"}))).await?;

    let is_quarantined = |s: &kubewasm::api::WasmControllerStatus| {
        let module = condition(s, "ModuleReady")?;
        ensure!(
            module.status == "False"
                && module.reason == "Quarantined"
                && module.message.contains(&hex)
                && module.message.contains("64 MiB")
                && module.message.contains("--compile-memory")
                && module.message.contains("change the module"),
            "ModuleReady is {}: {}",
            module.reason,
            module.message
        );
        Ok(())
    };
    wait_status(
        client,
        ns,
        "heavy",
        "the module quarantined",
        is_quarantined,
    )
    .await?;
    // The bystander's module, compiled in the same runtime, runs.
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
    runtime.ensure_running()?;
    let kept = quarantine.get(QUARANTINE).await?.data.unwrap_or_default();
    let bystander = sha256(&crate::cluster::guest("intruder"));
    ensure!(
        kept.len() == 1
            && kept.contains_key(&format!("quarantined.{hex}"))
            && !kept
                .keys()
                .any(|k| k.contains(bystander.trim_start_matches("sha256:"))),
        "the quarantine names the heavy module and no other: {kept:?}"
    );

    // A restart reads the quarantine: the heavy module is not compiled again.
    runtime.stop()?;
    runtime.start_again();
    wait_status(client, ns, "heavy", "still quarantined", is_quarantined).await?;
    eventually(
        "the restarted runtime compiled the bystander only",
        WAIT,
        || async {
            let (_, metrics) = runtime.http_get("/metrics").await?;
            ensure!(
                metrics.lines().any(|l| l == "kubewasm_modules_compiled 1")
                    && metrics
                        .lines()
                        .any(|l| l == "kubewasm_modules_quarantined 1"),
                "{}",
                metrics
                    .lines()
                    .filter(|l| l.contains("compiled") || l.contains("quarantined"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            Ok(Some(()))
        },
    )
    .await
}
