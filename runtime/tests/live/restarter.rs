//! Watching what the ConfigMap restarter does: the Pods it deletes (and their Deployment
//! replaces) and the data digest it saves as its state (in the WasmController's status).

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::cluster::{WAIT, live_pods, saved_state};
use crate::support::eventually;

/// Creates a Pod with label `app=<app>` (it stays Pending: there are no nodes).
pub async fn create_pod(pods: &Api<Pod>, name: &str, app: &str) -> Result<()> {
    create_labelled_pod(pods, name, json!({"app": app})).await
}

/// Creates Pod `name` (busybox sleeping) with these labels.
pub async fn create_labelled_pod(pods: &Api<Pod>, name: &str, labels: Value) -> Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}]},
    }))?;
    pods.create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating Pod {name}"))?;
    Ok(())
}

/// Waits for two live `app=frontend` Pods, none of them among `replacing`.
pub async fn wait_pods(
    pods: &Api<Pod>,
    what: &str,
    replacing: Option<&BTreeMap<String, String>>,
) -> Result<BTreeMap<String, String>> {
    eventually(what, WAIT, || async {
        let now = live_pods(pods, "app=frontend").await?;
        if let Some(old) = replacing {
            let kept: Vec<&String> = now.keys().filter(|n| old.contains_key(*n)).collect();
            ensure!(kept.is_empty(), "still there: {kept:?}");
        }
        ensure!(now.len() == 2, "{} Pods: {:?}", now.len(), now.keys());
        Ok(Some(now))
    })
    .await
}

/// Fails unless the live Pods matching `selector` are exactly `expected` (names and uids).
pub async fn ensure_pods(
    pods: &Api<Pod>,
    selector: &str,
    expected: &BTreeMap<String, String>,
    when: &str,
) -> Result<()> {
    let now = live_pods(pods, selector).await?;
    ensure!(
        &now == expected,
        "the {selector} Pods changed {when}: {:?} became {:?}",
        expected.keys(),
        now.keys()
    );
    Ok(())
}

/// The controller whose status holds a restarter's state: a WasmController (namespace,
/// name) or a ClusterWasmController (name).
#[derive(Debug, Clone, Copy)]
pub enum Owner<'a> {
    /// A WasmController.
    Namespaced(&'a str, &'a str),
    /// A ClusterWasmController.
    Cluster(&'a str),
}

impl Owner<'_> {
    /// The state it saved for `key` (`namespace/name` of the ConfigMap), from its
    /// WasmControllerState objects (a ClusterWasmController's are in the runtime's namespace,
    /// `default` for a `kubewasm run` without `POD_NAMESPACE`).
    pub async fn saved(&self, client: &Client, key: &str) -> Result<Option<String>> {
        match *self {
            Owner::Namespaced(ns, name) => {
                saved_state(client, ns, "WasmController", name, key).await
            }
            Owner::Cluster(name) => {
                saved_state(client, "default", "ClusterWasmController", name, key).await
            }
        }
    }
}

/// Waits until the restarter `owner` saved a data digest for ConfigMap `key`
/// (`namespace/name`) other than `not`.
pub async fn wait_digest(
    client: &Client,
    owner: Owner<'_>,
    key: &str,
    not: Option<&str>,
) -> Result<String> {
    let what = match not {
        Some(old) => format!("the restarter saves a new data digest for {key} (was {old})"),
        None => format!("the restarter saves the data digest for {key}"),
    };
    eventually(&what, WAIT, || async {
        match owner.saved(client, key).await? {
            Some(digest) if Some(digest.as_str()) != not => Ok(Some(digest)),
            other => bail!("the saved state of {key} is {other:?}"),
        }
    })
    .await
}
