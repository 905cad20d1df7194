//! Applying manifests the way `kubectl apply --server-side --force-conflicts` does.

use anyhow::{Context, Result};
use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::Scope;
use kube::{Api, Client};
use serde::Deserialize as _;
use serde_json::Value;

/// Field manager of what the tests apply.
pub const FIELD_MANAGER: &str = "kubewasm-live-test";

/// The documents of a YAML stream (empty documents left out).
pub fn documents(yaml: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = Value::deserialize(doc)?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// Server-side applies any object. The kind's scope comes from discovery: a cluster-scoped
/// object (a ClusterRole among a namespace's manifests) is applied without a namespace.
pub async fn apply(client: &Client, object: &Value) -> Result<DynamicObject> {
    let api_version = object["apiVersion"].as_str().context("no apiVersion")?;
    let kind = object["kind"].as_str().context("no kind")?;
    let name = object["metadata"]["name"].as_str().context("no name")?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {kind} ({api_version})"))?;
    let mut object = object.clone();
    let api: Api<DynamicObject> = match (&caps.scope, object["metadata"]["namespace"].as_str()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        (Scope::Namespaced, None) => Api::all_with(client.clone(), &resource),
        (Scope::Cluster, _) => {
            if let Some(metadata) = object["metadata"].as_object_mut() {
                metadata.remove("namespace");
            }
            Api::all_with(client.clone(), &resource)
        }
    };
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await
    .with_context(|| format!("applying {kind} {name}"))
}

/// Applies every object, in order.
pub async fn apply_all(client: &Client, objects: &[Value]) -> Result<()> {
    for object in objects {
        apply(client, object).await?;
    }
    Ok(())
}
