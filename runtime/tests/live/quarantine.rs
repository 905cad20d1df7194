//! A module whose compile ended a runtime is quarantined by the next start: the journal a
//! replica that died compiling leaves (ConfigMap `kubewasm-quarantine`,
//! `compiling.<replica>: <digest> <since>`, the replica long gone) is written here as it would
//! be left, beside the entry of a replica compiling another module right now, the runtime
//! started with `--quarantine-namespace`, and the controller of that module is
//! `ModuleReady=False`, `Quarantined`, without its guest ever running, while the other
//! replica's compile is left alone (a replica started beside another one that compiles — a
//! scale-up — once quarantined that healthy module); another module (a spec change) runs, and
//! its compile leaves the journal clean.

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{apply, condition, guest, module_config_map, prepare, sha256, wait_status};
use crate::isolation::{controller, install_probe_crd, install_tenant, probe, probes};
use crate::runtime::{RuntimeProcess, finish};
use crate::support::{ControlPlane, RUNTIME_NAMESPACE};

const JOURNAL: &str = "kubewasm-quarantine";

#[tokio::test]
async fn a_module_that_ended_a_runtime_is_not_compiled_again() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "quarantine").await;
    let kubeconfig = control_plane.runtime_kubeconfig();
    let journals: Api<ConfigMap> = Api::namespaced(client.clone(), RUNTIME_NAMESPACE);
    let result = async {
        install_probe_crd(&client).await?;
        install_tenant(&client, &ns, "secret", "config").await?;
        // What a runtime that died compiling the intruder guest leaves behind.
        let digest = sha256(&guest("intruder"));
        let hex = digest.trim_start_matches("sha256:").to_owned();
        let _ = journals.delete(JOURNAL, &DeleteParams::default()).await;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs();
        let left: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": JOURNAL}, "data": {
                "compiling.kubewasm-gone": format!("{hex} {}", now - 3600),
                BUSY_KEY: format!("{BUSY_HEX} {now}")}}))?;
        journals.create(&PostParams::default(), &left).await?;
        let mut runtime = RuntimeProcess::start_with_args(
            &kubeconfig,
            &ns,
            &["--quarantine-namespace", RUNTIME_NAMESPACE],
        );
        let checked = quarantined(&client, &ns, &journals, &hex).await;
        finish(checked, &mut [&mut runtime]);
        anyhow::Ok(())
    }
    .await;
    let _ = journals.delete(JOURNAL, &DeleteParams::default()).await;
    let _ = control_plane.delete_namespace(&ns).await;
    result.expect("the quarantine");
}

/// Another replica's compile going on while the runtime starts.
const BUSY_KEY: &str = "compiling.kubewasm-busy";
const BUSY_HEX: &str = "abababababababababababababababababababababababababababababababab";

async fn quarantined(
    client: &Client,
    ns: &str,
    journals: &Api<ConfigMap>,
    hex: &str,
) -> Result<()> {
    apply(client, &controller(ns, "steady", json!({}))).await?;
    apply(client, &probe(ns, "steady", "steady", json!({"echo": "1"}))).await?;
    wait_status(client, ns, "steady", "the module quarantined", |s| {
        let module = condition(s, "ModuleReady")?;
        ensure!(
            module.status == "False"
                && module.reason == "Quarantined"
                && module.message.contains(hex)
                && module.message.contains("change the module"),
            "ModuleReady is {}: {}",
            module.reason,
            module.message
        );
        Ok(())
    })
    .await?;
    let journal = journals.get(JOURNAL).await?.data.unwrap_or_default();
    ensure!(
        !journal.contains_key("compiling.kubewasm-gone")
            && journal.contains_key(&format!("quarantined.{hex}"))
            && journal.contains_key(BUSY_KEY)
            && !journal.contains_key(&format!("quarantined.{BUSY_HEX}")),
        "the journal after the start: {journal:?}"
    );
    let probe_now = probes(client, ns).get("steady").await?;
    ensure!(
        probe_now.data.pointer("/status/echo").is_none(),
        "the quarantined module ran: {:?}",
        probe_now.data.get("status")
    );

    // A spec naming another module lifts it: that one is compiled (journaled, then cleared).
    apply(
        client,
        &module_config_map(ns, "hello", "hello_world.wasm", &guest("hello_world")),
    )
    .await?;
    let hello = json!({"module": {"configMap": {"name": "hello", "key": "hello_world.wasm"}}});
    apply(client, &controller(ns, "steady", hello)).await?;
    wait_status(client, ns, "steady", "another module loaded", |s| {
        let module = condition(s, "ModuleReady")?;
        ensure!(
            module.status == "True",
            "ModuleReady is {}: {}",
            module.reason,
            module.message
        );
        Ok(())
    })
    .await?;
    let journal = journals.get(JOURNAL).await?.data.unwrap_or_default();
    ensure!(
        !journal
            .keys()
            .any(|k| k.starts_with("compiling") && k != BUSY_KEY),
        "a finished compile left the journal saying `compiling`: {journal:?}"
    );
    Ok(())
}
