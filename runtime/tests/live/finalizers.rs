//! Finalizers (`spec.finalize`, Metacontroller's finalize hook) with the example in
//! `deploy/examples/hello-finalizer/`: the runtime puts the controller's finalizer on each
//! HelloWorld; deleting one calls the guest with `finalizing`, which deletes its greeting
//! record (a ConfigMap nothing owns) and only then says `finalized`; a clean-up that never
//! finishes blocks the deletion visibly; deleting the WasmController releases its finalizers.

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Event};
use kube::api::{DeleteParams, ListParams, PatchParams};
use kube::{Api, Client, ResourceExt};
use kubewasm::api::WasmController;
use serde_json::json;

use crate::cluster::{
    WAIT, apply, apply_all, controller_status, create_hello_world, example, guest, hello_worlds,
    module_config_map, prepare,
};
use crate::runtime::{RuntimeProcess, finish};
use crate::support::{ControlPlane, eventually};
use crate::{QUIET, merge};

const FINALIZER: &str = "wasmcontroller.kubewasm.dev/hello-finalizer";

#[tokio::test]
async fn a_finalizing_guest_cleans_up_before_its_parent_goes() {
    let control_plane = ControlPlane::shared();
    let (client, ns) = prepare(control_plane, "finalize").await;
    let mut runtime = RuntimeProcess::start(&control_plane.runtime_kubeconfig(), &ns);
    let result = finalizers(&client, &ns).await;
    finish(result, &mut [&mut runtime]);
    drop(runtime);
    let _ = control_plane.delete_namespace(&ns).await;
}

/// Waits until HelloWorld `name` carries the controller's finalizer.
async fn wait_finalizer(client: &Client, ns: &str, name: &str) -> Result<()> {
    let hellos = hello_worlds(client, ns);
    eventually(
        &format!("HelloWorld {name} gets {FINALIZER}"),
        WAIT,
        || async {
            let hello = hellos.get(name).await?;
            Ok(hello
                .finalizers()
                .iter()
                .any(|f| f == FINALIZER)
                .then_some(()))
        },
    )
    .await
}

async fn finalizers(client: &Client, ns: &str) -> Result<()> {
    apply_all(client, &example("hello-finalizer/rbac.yaml", ns)?).await?;
    let wasm = guest("hello_finalizer");
    apply(
        client,
        &module_config_map(ns, "hello-finalizer", "hello_finalizer.wasm", &wasm),
    )
    .await?;
    apply_all(client, &example("hello-finalizer/controller.yaml", ns)?).await?;
    let hellos = hello_worlds(client, ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);

    // The finalizer comes first, then the record.
    create_hello_world(client, ns, "your-name", "Your Name").await?;
    wait_finalizer(client, ns, "your-name").await?;
    eventually("the greeting record of your-name", WAIT, || async {
        let record = config_maps.get_opt("greeting-your-name").await?;
        Ok(record
            .and_then(|r| r.data)
            .filter(|d| d.get("greeting").map(String::as_str) == Some("Hello, Your Name!"))
            .map(drop))
    })
    .await?;

    // Deleted: the record goes first, then the HelloWorld. Never the other way round.
    hellos.delete("your-name", &DeleteParams::default()).await?;
    eventually(
        "HelloWorld your-name gone, after its record",
        WAIT,
        || async {
            let parent = hellos.get_opt("your-name").await?;
            let record = config_maps.get_opt("greeting-your-name").await?;
            match (parent, record) {
                (None, None) => Ok(Some(())),
                (None, Some(_)) => bail!("the HelloWorld went before its record was cleaned up"),
                _ => Ok(None),
            }
        },
    )
    .await
    .context("the clean-up did not finish")?;

    // A clean-up that never finishes blocks the deletion, visibly.
    let held: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "HelloWorld",
        "metadata": {"name": "held", "namespace": ns,
                     "annotations": {"example.com/hold-deletion": "true"}},
        "spec": {"who": "Held"},
    }))?;
    hellos.create(&Default::default(), &held).await?;
    wait_finalizer(client, ns, "held").await?;
    hellos.delete("held", &DeleteParams::default()).await?;
    let key = format!("{ns}/held");
    eventually(
        "status.finalizing lists the held HelloWorld",
        WAIT,
        || async {
            let status = controller_status(client, ns, "hello-finalizer").await?;
            Ok(status.finalizing.contains(&key).then_some(()))
        },
    )
    .await?;
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    eventually(
        "a FinalizationPending Event on the held HelloWorld",
        WAIT,
        || async {
            let list = events
                .list(&ListParams::default().fields("involvedObject.name=held"))
                .await?;
            Ok(list
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("FinalizationPending")
                        && e.type_.as_deref() == Some("Warning")
                        && e.message.as_deref().is_some_and(|m| m.contains(FINALIZER))
                })
                .then_some(()))
        },
    )
    .await?;
    tokio::time::sleep(QUIET).await;
    let still = hellos.get("held").await?;
    ensure!(
        still.metadata.deletion_timestamp.is_some(),
        "the held HelloWorld is not being deleted"
    );

    // Turning `spec.finalize` off releases the finalizers the controller holds.
    let controllers: Api<WasmController> = Api::namespaced(client.clone(), ns);
    create_hello_world(client, ns, "kept", "Kept").await?;
    wait_finalizer(client, ns, "kept").await?;
    controllers
        .patch(
            "hello-finalizer",
            &PatchParams::default(),
            &merge(json!({"spec": {"finalize": false}})),
        )
        .await?;
    eventually(
        "turning finalize off removes the finalizer, and the held HelloWorld goes",
        WAIT,
        || async {
            let kept = hellos.get("kept").await?;
            let released = !kept.finalizers().iter().any(|f| f == FINALIZER);
            let held_gone = hellos.get_opt("held").await?.is_none();
            Ok((released && held_gone).then_some(()))
        },
    )
    .await?;

    // On again, then the controller itself deleted: its finalizers are released without
    // clean-up (there is no controller left to do it).
    controllers
        .patch(
            "hello-finalizer",
            &PatchParams::default(),
            &merge(json!({"spec": {"finalize": true}})),
        )
        .await?;
    wait_finalizer(client, ns, "kept").await?;
    controllers
        .delete("hello-finalizer", &DeleteParams::default())
        .await?;
    eventually(
        "deleting the controller releases its finalizers",
        WAIT,
        || async {
            let kept = hellos.get("kept").await?;
            Ok((!kept.finalizers().iter().any(|f| f == FINALIZER)).then_some(()))
        },
    )
    .await?;
    Ok(())
}
