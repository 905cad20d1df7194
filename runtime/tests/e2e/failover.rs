//! Step 5: the replica running tenant `hello` dies without a word; a change made right then is
//! acted on exactly once, by a replica that takes its shard's Lease once it expires.
//!
//! The replica is killed hard: its process is stopped (SIGSTOP) through containerd, its Pod
//! force-deleted (`kubectl delete pod --grace-period=0 --force`), then the process is killed
//! (SIGKILL). Stopped first, it never runs again, so it neither releases the Lease (as a
//! SIGTERM would have it do) nor comes back: a container the kubelet restarts in the same Pod
//! has a Lease identity of its own (`<HOSTNAME>-<nonce>-<pid>`), but (`<HOSTNAME>-<pid>`, pid 1 in every container) and would take
//! the unexpired Lease back at once as "its own", so the Pod is deleted before the kill.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};

use crate::cluster::{
    NodeCluster, QUIET, RUNTIME_SELECTOR, SYSTEM, WAIT, holder_pod, live_pods, patch_who,
    shard_holder, shard_lease, wait_greeting, wait_logs, wait_running,
};
use crate::install::RuntimePods;
use crate::support::eventually;
use crate::timings::{Timings, secs};
use crate::tutorials::{FRONTEND, TEST_SPACE, uids};

/// `--lease-duration-seconds` when the Deployment does not say (`kubewasm run`'s default).
const DEFAULT_LEASE_SECONDS: u64 = 15;

/// Uids of Pod hello/your-name in the order they were first seen, with when.
type Seen = Arc<Mutex<Vec<(Instant, String)>>>;

/// Kills the replica running tenant hello, changes HelloWorld your-name at once, and checks the takeover and that
/// the change was carried out once. Returns the runtime Pods afterwards (the Deployment
/// replaces the killed one).
pub async fn failover(
    cluster: &NodeCluster,
    pods: &RuntimePods,
    hello_uid: &str,
    timings: &mut Timings,
) -> Result<RuntimePods> {
    let (seen, recorder) = record_uids(cluster);
    let result = kill_and_change(cluster, pods, hello_uid, &seen, timings).await;
    recorder.abort();
    result
}

async fn kill_and_change(
    cluster: &NodeCluster,
    pods: &RuntimePods,
    hello_uid: &str,
    seen: &Seen,
    timings: &mut Timings,
) -> Result<RuntimePods> {
    let client = &cluster.client;
    let kubectl = &cluster.kubectl;
    let lease = lease_duration(cluster).await?;
    // A replica rounds every third of a lease: it takes an expired Lease within that.
    let takeover_bound = lease + lease / 3 + Duration::from_secs(10);

    let runtime = live_pods(client, SYSTEM, RUNTIME_SELECTOR).await?;
    let names: Vec<String> = runtime.keys().cloned().collect();
    let shard = shard_lease("hello");
    let holder = shard_holder(client, "hello")
        .await?
        .with_context(|| format!("nobody holds {shard}"))?;
    let leader = holder_pod(&holder, &names)
        .with_context(|| format!("the holder {holder:?} of {shard} is none of {names:?}"))?;
    ensure!(
        leader == pods.runs_hello,
        "tenant hello moved since the install: {leader} runs it, was {}",
        pods.runs_hello
    );
    let frontend_before = uids(&live_pods(client, TEST_SPACE, FRONTEND).await?);

    let until_seen = Instant::now();
    while !seen.lock().unwrap().iter().any(|(_, uid)| uid == hello_uid) {
        ensure!(
            until_seen.elapsed() < WAIT,
            "the watch of Pod hello/your-name never saw uid {hello_uid}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let container = runtime[&leader]
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .and_then(|c| c.container_id.clone())
        .with_context(|| format!("Pod {leader} has no container id"))?;
    let container = container
        .strip_prefix("containerd://")
        .with_context(|| format!("container {container} is not containerd's"))?
        .to_owned();

    let killed = Instant::now();
    cluster
        .ctr(&["task", "kill", "-s", "SIGSTOP", &container])
        .await?;
    kubectl
        .run(&[
            "-n",
            SYSTEM,
            "delete",
            "pod",
            &leader,
            "--grace-period=0",
            "--force",
            "--wait=false",
        ])
        .await?;
    // The kubelet may have killed it already.
    if let Err(error) = cluster
        .ctr(&["task", "kill", "-s", "SIGKILL", &container])
        .await
    {
        timings.note(format!("SIGKILL: {error:#}"));
    }
    let changed = Instant::now();
    patch_who(kubectl, "Failover").await?;
    timings.note(format!(
        "{leader} (runs hello) stopped, force-deleted and killed; who patched {} after the stop",
        secs(changed.duration_since(killed))
    ));

    let (new_leader, took) = eventually(
        &format!("another runtime Pod than {leader} holds {shard} (lease duration {lease:?})"),
        takeover_bound,
        || async {
            let holder = shard_holder(client, "hello")
                .await?
                .with_context(|| format!("nobody holds {shard}"))?;
            ensure!(
                !holder.starts_with(&format!("{leader}-")),
                "still held by the killed replica ({holder})"
            );
            let now = live_pods(client, SYSTEM, RUNTIME_SELECTOR).await?;
            let names: Vec<String> = now.keys().cloned().collect();
            let pod = holder_pod(&holder, &names)
                .with_context(|| format!("holder {holder:?} is none of {names:?}"))?;
            Ok(Some((pod, killed.elapsed())))
        },
    )
    .await?;
    // Taken over because the Lease expired, not because it was handed over: the last renewal
    // was at most a third of a lease (+ its request) before the stop, so the Lease expired at
    // least about two thirds of a lease after it, while a released Lease is taken within one
    // retry period (a third of a lease).
    ensure!(
        took >= lease / 2,
        "{shard} was taken over {} after the stop, sooner than an unreleased Lease of {} allows: \
         the killed replica released it (was it stopped before its SIGTERM?)",
        secs(took),
        secs(lease)
    );
    let which = if new_leader == pods.other {
        "the other replica"
    } else {
        "the Deployment's replacement Pod"
    };
    timings.note(format!(
        "{shard} taken by {new_leader} ({which}) {} after the stop (lease duration {}, bound {})",
        secs(took),
        secs(lease),
        secs(takeover_bound)
    ));

    let greeting = wait_greeting(
        client,
        "hello",
        "your-name",
        "Hello, Failover!",
        Some(hello_uid),
        takeover_bound + WAIT,
    )
    .await?;
    let new_uid = greeting.uid().unwrap_or_default();
    timings.note(format!(
        "who patched -> Pod your-name recreated and Succeeded: {}",
        secs(changed.elapsed())
    ));
    wait_logs(kubectl, "hello", "your-name", "Hello, Failover!").await?;

    // Exactly once: one new Pod since the change, and it stays.
    tokio::time::sleep(QUIET).await;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), "hello");
    let now = pods_api.get("your-name").await?.uid().unwrap_or_default();
    let (new, created): (Vec<String>, Vec<Duration>) = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, uid)| uid != hello_uid)
        .map(|(at, uid)| (uid.clone(), at.saturating_duration_since(changed)))
        .unzip();
    ensure!(
        new == [new_uid.clone()] && now == new_uid,
        "Pod your-name was recreated {} times after the change (uids {new:?}, now {now})",
        new.len()
    );
    timings.note(format!(
        "Pod your-name recreated exactly once ({} after the change; uid {hello_uid} -> {new_uid}), \
         the same {} later",
        created
            .first()
            .copied()
            .map_or_else(|| "?".to_owned(), secs),
        secs(QUIET)
    ));

    // The restarter kept its state, wherever it runs now: no restart of the frontend.
    let frontend_after = uids(&live_pods(client, TEST_SPACE, FRONTEND).await?);
    ensure!(
        frontend_after == frontend_before,
        "the frontend Pods changed across the failover: {frontend_before:?} became {frontend_after:?}"
    );
    timings
        .note("the frontend Pods untouched across the failover (the restarter's state went over)");

    let settled = wait_running(
        client,
        SYSTEM,
        RUNTIME_SELECTOR,
        2,
        std::slice::from_ref(&leader),
        WAIT,
    )
    .await?;
    timings.note(format!(
        "the Deployment back at 2 Running and Ready Pods {} after the stop",
        secs(killed.elapsed())
    ));
    let other = settled
        .keys()
        .find(|n| **n != new_leader)
        .context("one runtime Pod")?
        .clone();
    // The replacement Pod gets its share: the two split the shards evenly again.
    let names: Vec<String> = settled.keys().cloned().collect();
    let shares = crate::cluster::wait_shares(client, &names, WAIT).await?;
    timings.note(format!(
        "the shard Leases split {shares:?} again {} after the stop",
        secs(killed.elapsed())
    ));
    Ok(RuntimePods {
        runs_hello: crate::cluster::runner_pod(client, "hello").await?,
        other,
    })
}

/// The Deployment's `--lease-duration-seconds`, or the default.
async fn lease_duration(cluster: &NodeCluster) -> Result<Duration> {
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), SYSTEM);
    let deployment = deployments.get("kubewasm").await?;
    let args: Vec<String> = deployment
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().find(|c| c.name == "runtime"))
        .and_then(|c| c.args)
        .unwrap_or_default();
    let mut seconds = DEFAULT_LEASE_SECONDS;
    for (i, arg) in args.iter().enumerate() {
        let value = match arg.strip_prefix("--lease-duration-seconds") {
            Some(rest) if rest.starts_with('=') => Some(rest[1..].to_owned()),
            Some("") => args.get(i + 1).cloned(),
            _ => None,
        };
        if let Some(value) = value {
            seconds = value
                .parse()
                .with_context(|| format!("--lease-duration-seconds {value}"))?;
        }
    }
    Ok(Duration::from_secs(seconds))
}

/// Watches Pod hello/your-name and records each uid it has the first time it is seen.
fn record_uids(cluster: &NodeCluster) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Arc::default();
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), "hello");
    let config = watcher::Config::default().fields("metadata.name=your-name");
    let recorded = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher(api, config).boxed();
        while let Some(event) = events.next().await {
            let pod = match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
                Ok(_) => continue,
                Err(error) => {
                    eprintln!("e2e: watching Pod hello/your-name: {error}");
                    continue;
                }
            };
            let uid = pod.uid().unwrap_or_default();
            let mut seen = recorded.lock().unwrap();
            if !seen.iter().any(|(_, u)| *u == uid) {
                seen.push((Instant::now(), uid));
            }
        }
    });
    (seen, task)
}
