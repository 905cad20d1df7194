//! HelloWorld with the tutorial's own CRD (`apiextensions.k8s.io/v1beta1`, no schema, no
//! status subresource): the status is written into the object. Without `patch` on
//! helloworlds the WasmController's status names the missing verb and resource; with the
//! example's RBAC the status is written.

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::DeleteParams;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::{
    WAIT, apply, apply_all, condition, example, guest, module_config_map, wait_established,
    wait_greeting_pod, wait_status, wait_status_pods,
};
use crate::support::{ControlPlane, eventually};

const CRD: &str = "helloworlds.example.com";

/// On a control plane of the test's own (the CRD is replaced by the tutorial's).
pub async fn hello_world_with_the_tutorials_crd(
    control_plane: &ControlPlane,
    client: &Client,
) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if crds.get_opt(CRD).await?.is_some() {
        crds.delete(CRD, &DeleteParams::default()).await?;
    }
    eventually("the v1 HelloWorld CRD is gone", WAIT, || async {
        Ok(crds.get_opt(CRD).await?.is_none().then_some(()))
    })
    .await?;
    apply_all(client, &example("hello-world/crd-v1beta1.yaml", "default")?).await?;
    wait_established(client, CRD).await?;
    let served = crds.get(CRD).await?;
    let subresources = served.spec.versions[0].subresources.clone();
    if subresources.is_some_and(|s| s.status.is_some()) {
        bail!("the tutorial's CRD has no status subresource");
    }

    let ns = control_plane.namespace("hello-v1beta1").await?;
    // First without `patch` on helloworlds, as the tutorial's RBAC had it.
    let rbac = example("hello-world/rbac.yaml", &ns)?;
    let without_patch: Vec<Value> = rbac
        .iter()
        .cloned()
        .map(|mut doc| {
            if doc["kind"] == "Role" {
                for rule in doc["rules"].as_array_mut().into_iter().flatten() {
                    if rule["resources"] == json!(["helloworlds"]) {
                        rule["verbs"] = json!(["get", "list", "watch"]);
                    }
                }
            }
            doc
        })
        .collect();
    apply_all(client, &without_patch).await?;
    apply(
        client,
        &module_config_map(
            &ns,
            "hello-controller",
            "hello_world.wasm",
            &guest("hello_world"),
        ),
    )
    .await?;
    apply_all(client, &example("hello-world/controller.yaml", &ns)?).await?;
    apply_all(client, &example("hello-world/hello.yaml", &ns)?).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait_greeting_pod(&pods, "your-name", "Hello, Your Name!", None).await?;
    wait_status(
        client,
        &ns,
        "hello-world",
        "Degraded names the missing verb and resource",
        |s| {
            let degraded = condition(s, "Degraded")?;
            if degraded.status != "True"
                || !degraded
                    .message
                    .contains("cannot patch resource \"helloworlds\"")
            {
                bail!("Degraded: {} {}", degraded.status, degraded.message);
            }
            Ok(())
        },
    )
    .await?;

    // The example's RBAC: the status is written into the HelloWorld.
    apply_all(client, &rbac).await?;
    wait_status_pods(client, &ns, "your-name", 1)
        .await
        .context("status written without a status subresource")
}
