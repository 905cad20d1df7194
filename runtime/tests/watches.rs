//! The shared watch cache against the local control plane: controllers started together on a
//! new watch all see it ready, a cache filled by a paginated first list still sees every
//! change after it, each cached version is serialized for guests once, a namespace over its
//! cache cap is dropped from every watch and taken back in once under it, and watches started
//! and stopped again and again leave the accounts where they were.

use kubewasm_test_support as support;

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::PostParams;
use kubewasm::controller::{
    CacheAccounts, CacheCaps, ObjectKey, Resolver, SharedWatches, Withheld,
};
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
    let watches = SharedWatches::new(client, Some(namespace.clone()), Default::default());
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
    // Listed in pages, then watched from that version on.
    let mut changes = watch.subscribe();
    create_config_map(&config_maps, "four").await?;
    eventually("ConfigMap four in the cache", WAIT, || async {
        Ok(watch.get(&key("four")).map(drop))
    })
    .await?;
    // The namespace's own objects may still arrive (kube-controller-manager publishes its
    // `kube-root-ca.crt` ConfigMap into every new namespace, sometimes after the first list):
    // four's change is the one looked for among them.
    let four = async {
        loop {
            let change = changes.recv().await?;
            if change.key == key("four") {
                return Ok::<_, anyhow::Error>(change);
            }
            ensure!(
                change.key == key("kube-root-ca.crt"),
                "announced {:?}",
                change.key
            );
        }
    };
    tokio::time::timeout(WAIT, four)
        .await
        .context("no change announced for four")??;

    // Each object is cached as the text a guest is handed: typed with its kind whether it
    // came in a list (whose items have no apiVersion and kind) or in a watch event, without
    // the API server's managedFields (which it does write for these creates).
    let stored = config_maps.get("four").await?;
    ensure!(
        stored.metadata.managed_fields.is_some(),
        "the API server keeps managedFields"
    );
    for name in ["one", "four"] {
        let cached = watch.get(&key(name)).context("cached")?;
        let text = cached.text();
        ensure!(
            text.starts_with(r#"{"apiVersion":"v1","kind":"ConfigMap","#),
            "text of {name}: {text}"
        );
        ensure!(!text.contains("managedFields"), "text of {name}: {text}");
        ensure!(
            text.contains(&format!(r#""k":"{name}""#)),
            "text of {name}: {text}"
        );
        ensure!(
            cached.metadata.uid.is_some() && cached.metadata.resource_version.is_some(),
            "{name}'s uid and resourceVersion are kept decoded"
        );
    }
    config_maps
        .patch(
            "four",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"data": {"k": "changed"}})),
        )
        .await?;
    eventually("the new version of four in the cache", WAIT, || async {
        let now = watch.get(&key("four")).context("four is cached")?;
        Ok((now.json()["data"]["k"] == "changed").then_some(()))
    })
    .await?;
    control_plane.delete_namespace(&namespace).await
}

/// Watches of a kind started and stopped again and again: each start charges the namespace's
/// objects once, each stop credits them all, and the account is back where it was.
#[tokio::test]
async fn a_stopped_watch_credits_everything_it_charged() -> Result<()> {
    let control_plane = ControlPlane::shared();
    let client = control_plane.client().await?;
    let namespace = control_plane.namespace("watch-churn").await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    for i in 0..5 {
        create_config_map(&config_maps, &format!("cm-{i}")).await?;
    }
    let kind = Resolver::new(client.clone())
        .resolve("v1", "ConfigMap")
        .await?;
    let watches = SharedWatches::new(client, Some(namespace.clone()), Default::default());
    let accounts = watches.accounts().clone();
    let mut charged = Vec::new();
    for cycle in 0..10 {
        let watch = watches.watch(&kind);
        tokio::time::timeout(WAIT, watch.ready())
            .await
            .with_context(|| format!("cycle {cycle}: the watch never listed"))?;
        // Charged once: the account is what the cache holds, to the byte.
        let held = eventually(
            &format!("cycle {cycle}: the account is the cache's weight"),
            WAIT,
            || async {
                let cached: u64 = watch.store().state().iter().map(|o| o.weight()).sum();
                let account = accounts.namespace_bytes(&namespace);
                Ok((account == cached).then_some(account))
            },
        )
        .await?;
        charged.push(held);
        drop(watch);
        eventually(
            &format!("cycle {cycle}: the stopped watch's charges credited"),
            WAIT,
            || async { Ok((accounts.namespace_bytes(&namespace) == 0).then_some(())) },
        )
        .await?;
        ensure!(
            accounts.watches_charged() == 0,
            "a stopped watch still holds charges"
        );
    }
    eprintln!("charged per start (bytes): {charged:?}");
    ensure!(
        charged.iter().all(|c| *c > 0),
        "a start charged nothing: {charged:?}"
    );
    control_plane.delete_namespace(&namespace).await
}

/// The cap per namespace of the cache test: two of its large ConfigMaps fit, three do not,
/// with room either way for what else the namespace holds (its `kube-root-ca.crt`, its
/// ServiceAccount's token Secret, the test's small Secret: about 25 KiB weighed).
const NAMESPACE_CAP: u64 = 160 << 10;
const LARGE_VALUE: usize = 50 << 10;

#[tokio::test]
async fn a_namespace_over_its_cache_cap_is_dropped_from_every_watch_and_taken_back_under_it()
-> Result<()> {
    let control_plane = ControlPlane::shared();
    let client = control_plane.client().await?;
    let (large, small) = (
        control_plane.namespace("cache-large").await?,
        control_plane.namespace("cache-small").await?,
    );
    let resolver = Resolver::new(client.clone());
    let (cm_kind, secret_kind) = (
        resolver.resolve("v1", "ConfigMap").await?,
        resolver.resolve("v1", "Secret").await?,
    );
    let accounts = CacheAccounts::new(CacheCaps {
        per_namespace: NAMESPACE_CAP,
        total: u64::MAX,
    })
    .with_relist_floor(Duration::from_secs(1));
    // Cluster-wide, as the runtime watches: other tests' namespaces come and go meanwhile.
    let watches = SharedWatches::new(client.clone(), None, std::sync::Arc::new(accounts));
    let (config_maps, secrets) = (watches.watch(&cm_kind), watches.watch(&secret_kind));
    let large_cms: Api<ConfigMap> = Api::namespaced(client.clone(), &large);
    let small_cms: Api<ConfigMap> = Api::namespaced(client.clone(), &small);
    let large_secrets: Api<Secret> = Api::namespaced(client.clone(), &large);
    let post = PostParams::default();
    large_secrets
        .create(
            &post,
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "small-secret"}, "stringData": {"k": "v"},
            }))?,
        )
        .await?;
    create_config_map(&small_cms, "neighbour").await?;
    let create_large = |name: &'static str| {
        let api = large_cms.clone();
        async move {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "data": {"blob": "x".repeat(LARGE_VALUE)},
            }))?;
            api.create(&PostParams::default(), &cm).await?;
            anyhow::Ok(())
        }
    };
    for name in ["large-1", "large-2"] {
        create_large(name).await?;
    }
    config_maps.ready().await;
    secrets.ready().await;
    let key = |ns: &str, name: &str| ObjectKey {
        namespace: Some(ns.to_owned()),
        name: name.to_owned(),
    };
    eventually(
        "both large ConfigMaps cached (under the cap)",
        WAIT,
        || async {
            Ok((config_maps.get(&key(&large, "large-2")).is_some()
                && secrets.get(&key(&large, "small-secret")).is_some())
            .then_some(()))
        },
    )
    .await?;
    ensure!(
        config_maps.withheld(&large).is_none(),
        "held back under the cap"
    );

    // A third: over the cap. Every watch drops the namespace's objects, the Secret included.
    create_large("large-3").await?;
    eventually("the namespace held back", WAIT, || async {
        Ok(matches!(
            config_maps.withheld(&large),
            Some(Withheld::OverNamespaceCap { bytes, cap }) if bytes > cap && cap == NAMESPACE_CAP
        )
        .then_some(()))
    })
    .await?;
    eventually(
        "the namespace's objects dropped from both caches",
        WAIT,
        || async {
            let left = ["large-1", "large-2", "large-3"]
                .iter()
                .filter(|n| config_maps.get(&key(&large, n)).is_some())
                .count()
                + usize::from(secrets.get(&key(&large, "small-secret")).is_some());
            Ok((left == 0).then_some(()))
        },
    )
    .await?;
    ensure!(
        config_maps.get(&key(&small, "neighbour")).is_some()
            && config_maps.withheld(&small).is_none(),
        "another namespace's objects were dropped too"
    );
    ensure!(
        watches.accounts().stored_bytes() < watches.accounts().namespace_bytes(&large),
        "the held-back namespace's bytes are still counted as stored"
    );
    // Changes while held back are weighed, never stored.
    large_secrets
        .patch(
            "small-secret",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"stringData": {"k": "changed"}})),
        )
        .await?;

    // Back under 90% of the cap: the watches list again and the namespace is served again,
    // with what changed meanwhile.
    let mut changes = secrets.subscribe();
    for name in ["large-2", "large-3"] {
        large_cms.delete(name, &Default::default()).await?;
    }
    eventually("the namespace served again", WAIT, || async {
        Ok(config_maps.withheld(&large).is_none().then_some(()))
    })
    .await?;
    let secret = secrets
        .get(&key(&large, "small-secret"))
        .context("the Secret is not back in the cache")?;
    ensure!(
        secret.json()["data"]["k"] == serde_json::json!("Y2hhbmdlZA=="),
        "the Secret's change while held back is missing: {}",
        secret.text()
    );
    ensure!(
        config_maps.get(&key(&large, "large-1")).is_some(),
        "large-1 is not back in the cache"
    );
    ensure!(
        config_maps.get(&key(&large, "large-2")).is_none(),
        "a deleted ConfigMap came back"
    );
    let announced = tokio::time::timeout(WAIT, async {
        loop {
            match changes.recv().await {
                Ok(change) if change.key == key(&large, "small-secret") => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .context("the Secret taken back in was not announced")?;
    announced?;
    control_plane.delete_namespace(&large).await?;
    control_plane.delete_namespace(&small).await
}
