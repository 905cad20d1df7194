//! The Guitar reviewer of the classic tutorial, with its own CRD and manifests from
//! `deploy/examples/guitar-reviewer/`, as a ClusterWasmController over every namespace: each
//! Guitar without a review is reviewed once by brand, a reviewed one is never rewritten (no
//! write loop), and editing the brand after the review does not re-review it.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::cluster::{
    WAIT, apply, apply_all, example, guest, module_config_map, take, wait_established,
};
use crate::merge;
use crate::runtime::RuntimeProcess;
use crate::support::{ControlPlane, eventually};

fn guitars(client: &Client, ns: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kool.karmalabs.local",
        "v1",
        "Guitar",
    ));
    Api::namespaced_with(client.clone(), ns, &resource)
}

/// Installs the example in `modules` (module, ServiceAccount) and reviews Guitars in two
/// other namespaces.
pub async fn guitar_reviews(
    control_plane: &ControlPlane,
    client: &Client,
    modules: &str,
    runtime: &RuntimeProcess,
) -> Result<()> {
    apply_all(client, &example("guitar-reviewer/crd.yaml", modules)?).await?;
    wait_established(client, "guitars.kool.karmalabs.local").await?;
    apply_all(client, &example("guitar-reviewer/rbac.yaml", modules)?).await?;
    apply(
        client,
        &module_config_map(
            modules,
            "guitar-reviewer",
            "guitar_reviewer.wasm",
            &guest("guitar_reviewer"),
        ),
    )
    .await?;
    let mut controller = example("guitar-reviewer/controller.yaml", modules)?;
    let mut controller = take(&mut controller, "ClusterWasmController")?;
    controller["spec"]["module"]["configMap"]["namespace"] = json!(modules);
    apply(client, &controller).await?;

    let mut shops = Vec::new();
    for prefix in ["shop-a", "shop-b"] {
        let ns = control_plane.namespace(prefix).await?;
        apply_all(client, &example("guitar-reviewer/guitars.yaml", &ns)?).await?;
        let reviewed = json!({"apiVersion": "kool.karmalabs.local/v1", "kind": "Guitar",
            "metadata": {"name": "reviewed", "namespace": ns},
            "spec": {"brand": "fender", "review": true, "comment": "mine"}});
        apply(client, &reviewed).await?;
        shops.push(ns);
    }
    let expected = [
        ("strato", "fender makes great guitars: a fine choice"),
        (
            "les-paul-copy",
            "epiphone is not a brand this reviewer would pick: worth a second look",
        ),
        (
            "mystery",
            "harley benton is an unknown brand to this reviewer: no opinion, sorry",
        ),
        ("reviewed", "mine"),
    ];
    for ns in &shops {
        let api = guitars(client, ns);
        eventually(&format!("every Guitar in {ns} reviewed"), WAIT, || async {
            for (name, comment) in expected {
                let guitar = api.get(name).await?;
                let spec = &guitar.data["spec"];
                if spec["review"] != json!(true) || spec["comment"] != json!(comment) {
                    bail!("Guitar {name}: {spec}");
                }
            }
            Ok(Some(()))
        })
        .await?;
    }

    // No write loop: with every Guitar reviewed, nothing is written any more.
    let versions = |ns: String| async move {
        let list = guitars(client, &ns).list(&ListParams::default()).await?;
        anyhow::Ok(
            list.items
                .iter()
                .map(|g| (g.name_any(), g.resource_version().unwrap_or_default()))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    let before = versions(shops[0].clone()).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    ensure!(
        versions(shops[0].clone()).await? == before,
        "reviewed Guitars were written again"
    );

    // The brand edited after the review: reconciled, and left as reviewed.
    let offset = runtime.log_len();
    guitars(client, &shops[0])
        .patch(
            "strato",
            &Default::default(),
            &merge(json!({"spec": {"brand": "yamaha"}})),
        )
        .await?;
    runtime
        .wait_reconciled(offset, &format!("{}/strato", shops[0]), "actions=0")
        .await
        .context("the edited Guitar was reconciled with nothing to do")?;
    let strato = guitars(client, &shops[0]).get("strato").await?;
    ensure!(
        strato.data["spec"]["comment"] == json!("fender makes great guitars: a fine choice"),
        "re-reviewed after the brand changed: {}",
        strato.data["spec"]
    );
    Ok(())
}
