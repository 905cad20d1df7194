//! The shared watch cache against the local control plane: controllers started together on a
//! new watch all see it ready, a cache filled from the API server's watch cache
//! (`resourceVersion=0`) still sees every change after its first list, and each cached
//! version is serialized for guests once.

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

    // Each version's text is made once; a new version gets a new one.
    let made = std::sync::atomic::AtomicUsize::new(0);
    let text_of = |object: &std::sync::Arc<kube::api::DynamicObject>| {
        watch.text(object, || {
            made.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            serde_json::to_string(object.as_ref()).expect("an object serializes")
        })
    };
    let four = watch.get(&key("four")).context("four is cached")?;
    let first = text_of(&four);
    let again = text_of(&watch.get(&key("four")).context("four is cached")?);
    ensure!(
        first == again && made.load(std::sync::atomic::Ordering::SeqCst) == 1,
        "four serialized twice"
    );
    ensure!(first.contains(r#""k":"four""#), "text of four: {first}");
    config_maps
        .patch(
            "four",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"data": {"k": "changed"}})),
        )
        .await?;
    eventually("the new version of four in the cache", WAIT, || async {
        let now = watch.get(&key("four")).context("four is cached")?;
        Ok((now.data["data"]["k"] == "changed").then_some(()))
    })
    .await?;
    let changed = text_of(&watch.get(&key("four")).context("four is cached")?);
    ensure!(
        changed.contains(r#""k":"changed""#),
        "the new version's text: {changed}"
    );
    ensure!(
        made.load(std::sync::atomic::Ordering::SeqCst) == 2,
        "not made again for the new version"
    );
    control_plane.delete_namespace(&namespace).await
}
