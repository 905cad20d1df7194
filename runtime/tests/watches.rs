//! The shared watch cache against the local control plane: controllers started together on a
//! new watch all see it ready, and a cache filled from the API server's watch cache
//! (`resourceVersion=0`) still sees every change after its first list.

mod support;

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;
use kubewasm::controller::{ObjectKey, Resolver, SharedWatches};
use support::{ControlPlane, eventually};

/// Long enough for a busy 2-core machine.
const WAIT: Duration = Duration::from_secs(60);

/// Controllers starting together on one new watch: each waits for its first list.
const WAITERS: usize = 16;

async fn create_config_map(api: &Api<ConfigMap>, name: &str) -> Result<()> {
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "data": { "k": name },
    }))?;
    api.create(&PostParams::default(), &cm).await?;
    Ok(())
}

#[tokio::test]
async fn every_waiter_sees_a_new_watch_ready_and_later_changes_arrive() -> Result<()> {
    let control_plane = ControlPlane::shared();
    let client = control_plane.client().await?;
    let namespace = control_plane.namespace("watches").await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    for name in ["one", "two", "three"] {
        create_config_map(&config_maps, name).await?;
    }

    let kind = Resolver::new(client.clone())
        .resolve("v1", "ConfigMap")
        .await?;
    let watches = SharedWatches::new(client, Some(namespace.clone()));
    let watch = watches.watch(&kind);
    // kube-runtime's `Store::wait_until_ready` wakes only the waiter that polled it last: before
    // `Watch::ready` handed the wait to a `OnceCell`, 2 of 3 controllers started together
    // stayed `WaitingForCaches` for ever.
    let waiters = (0..WAITERS).map(|_| {
        let watch = watch.clone();
        tokio::spawn(async move { watch.ready().await })
    });
    let all = tokio::time::timeout(WAIT, futures::future::join_all(waiters))
        .await
        .context("not every waiter saw the watch ready")?;
    ensure!(all.iter().all(Result::is_ok), "a waiter failed: {all:?}");

    let key = |name: &str| ObjectKey {
        namespace: Some(namespace.clone()),
        name: name.to_owned(),
    };
    for name in ["one", "two", "three"] {
        ensure!(
            watch.get(&key(name)).is_some(),
            "{name} is not in the first list"
        );
    }
    // Listed from the API server's watch cache, then watched from that version on.
    let mut changes = watch.subscribe();
    create_config_map(&config_maps, "four").await?;
    eventually("ConfigMap four in the cache", WAIT, || async {
        Ok(watch.get(&key("four")).map(drop))
    })
    .await?;
    let change = tokio::time::timeout(WAIT, changes.recv())
        .await
        .context("no change announced for four")??;
    ensure!(change.key == key("four"), "announced {:?}", change.key);
    control_plane.delete_namespace(&namespace).await
}
