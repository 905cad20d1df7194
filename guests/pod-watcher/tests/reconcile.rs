//! The pod watcher's lines, natively.

use kubewasm_guest_sdk::testing::FakeCluster;
use kubewasm_guest_sdk::{LogLevel, ObjectRef, Request};
use pod_watcher::{change, reconcile};
use serde_json::{Value, json};

fn pod(phase: &str, node: Option<&str>, labels: Value, ready: bool) -> Value {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "labels": labels},
        "spec": {"containers": [{"name": "c"}]},
        "status": {"phase": phase, "containerStatuses": [
            {"name": "c", "ready": ready, "restartCount": 0, "state": {if ready {"running"} else {"waiting"}: {}}}]}});
    if let Some(node) = node {
        pod["spec"]["nodeName"] = json!(node);
    }
    pod
}

#[test]
fn added_updated_and_deleted_each_make_one_line() {
    let pending = pod("Pending", None, json!({"app": "web"}), false);
    let added = Request::for_object(pending.clone()).unwrap();
    assert_eq!(
        change(&added).as_deref(),
        Some("pod shop/web added: phase Pending, node -, labels {app=web}")
    );

    let running = pod(
        "Running",
        Some("node-1"),
        json!({"app": "web", "tier": "front"}),
        true,
    );
    let updated = Request::for_object(running.clone())
        .unwrap()
        .with_previous(pending);
    assert_eq!(
        change(&updated).as_deref(),
        Some(
            "pod shop/web updated: phase Pending → Running; node - → node-1; \
             labels {app=web} → {app=web,tier=front}; containers [c=waiting] → [c=running,ready]"
        )
    );

    let gone =
        Request::gone(ObjectRef::new("v1", "Pod", Some("shop"), "web")).with_previous(running);
    assert_eq!(change(&gone).as_deref(), Some("pod shop/web deleted"));
}

#[test]
fn nothing_reported_changed_means_no_line() {
    let mut before = pod("Running", Some("node-1"), json!({"app": "web"}), true);
    let mut after = before.clone();
    after["metadata"]["annotations"] = json!({"touched": "yes"});
    before["metadata"]["resourceVersion"] = json!("1");
    after["metadata"]["resourceVersion"] = json!("2");
    let request = Request::for_object(after).unwrap().with_previous(before);
    assert_eq!(change(&request), None);
    let never_seen = Request::gone(ObjectRef::new("v1", "Pod", Some("shop"), "web"));
    assert_eq!(change(&never_seen), None);
}

#[test]
fn the_line_goes_to_the_hosts_log_and_nothing_is_asked() {
    let cluster = FakeCluster::new();
    let added = Request::for_object(pod("Pending", None, json!({}), false)).unwrap();
    let response = reconcile(&added, &cluster).unwrap();
    assert!(response.is_empty());
    assert_eq!(
        cluster.logs(),
        [(
            LogLevel::Info,
            "pod shop/web added: phase Pending, node -, labels {}".to_owned()
        )]
    );
}
