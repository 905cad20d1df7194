//! Watching what the ConfigMap restarter does: the Pods it deletes (and their Deployment
//! replaces), the digest annotation it records, the Events it emits.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::cluster::{WAIT, live_pods};
use crate::support::eventually;

/// Where the restarter keeps the digest of the data the Pods were last restarted for.
pub const DIGEST_ANNOTATION: &str = "restarter.kubewasm.dev/data-digest";

/// Creates a Pod with label `app=<app>` (it stays Pending: there are no nodes).
pub async fn create_pod(pods: &Api<Pod>, name: &str, app: &str) -> Result<()> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
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

/// Waits until the restarter recorded a data digest on ConfigMap `name` other than `not`.
pub async fn wait_digest(
    config_maps: &Api<ConfigMap>,
    name: &str,
    not: Option<&str>,
) -> Result<String> {
    let what = match not {
        Some(old) => format!("the restarter records a new data digest on {name} (was {old})"),
        None => format!("the restarter records the data digest on {name}"),
    };
    eventually(&what, WAIT, || async {
        let cm = config_maps.get(name).await?;
        match cm.annotations().get(DIGEST_ANNOTATION) {
            Some(digest) if Some(digest.as_str()) != not => Ok(Some(digest.clone())),
            other => bail!("{DIGEST_ANNOTATION} is {other:?}"),
        }
    })
    .await
}

/// Waits for an Event with `reason` about ConfigMap `name`.
pub async fn wait_event(client: &Client, ns: &str, name: &str, reason: &str) -> Result<()> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    eventually(
        &format!("an Event {reason} on ConfigMap {name}"),
        WAIT,
        || async {
            let list = events
                .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
                .await?;
            let found = list.items.iter().any(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.involved_object.kind.as_deref() == Some("ConfigMap")
            });
            Ok(found.then_some(()))
        },
    )
    .await
}
