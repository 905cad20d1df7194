//! The pod watcher's lines, natively.

use kubewasm_guest_sdk::testing::FakeCluster;
use kubewasm_guest_sdk::{LogLevel, ObjectRef, Request};
use pod_watcher::{MAX_STATE_BYTES, change, reconcile, report, seen};
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
fn the_line_goes_to_the_hosts_log_and_the_state_is_all_it_asks() {
    let cluster = FakeCluster::new();
    let pending = pod("Pending", None, json!({}), false);
    let added = Request::for_object(pending.clone()).unwrap();
    let response = reconcile(&added, &cluster).unwrap();
    assert_eq!(
        cluster.logs(),
        [(
            LogLevel::Info,
            "pod shop/web added: phase Pending, node -, labels {}".to_owned()
        )]
    );
    let state = response
        .state()
        .flatten()
        .expect("the pod watcher saves what it reported");
    assert_eq!(response.actions.len(), 1, "{:?}", response.actions);
    assert!(state.len() <= MAX_STATE_BYTES);

    // The same Pod again (a relist, a resync): no line, nothing to save.
    let again = Request::for_object(pending).unwrap().with_state(state);
    let response = reconcile(&again, &cluster).unwrap();
    assert!(response.is_empty(), "{:?}", response.actions);
    assert_eq!(cluster.logs().len(), 1);
}

/// After a runtime restart there is no `previous`, only the saved state: a Pod found as it was
/// makes no line, one changed while the runtime was down is *updated* (not added again), one
/// deleted meanwhile is *deleted*.
#[test]
fn the_saved_state_carries_what_was_reported_across_a_restart() {
    let pending = pod("Pending", None, json!({"app": "web"}), false);
    let state = report(&Request::for_object(pending.clone()).unwrap())
        .state
        .unwrap();

    let unchanged = Request::for_object(pending).unwrap().with_state(&state);
    assert_eq!(report(&unchanged), Default::default());

    let relabelled = pod("Pending", None, json!({"app": "shop"}), false);
    let changed = report(&Request::for_object(relabelled).unwrap().with_state(&state));
    assert_eq!(
        changed.line.as_deref(),
        Some("pod shop/web updated: labels {app=web} → {app=shop}")
    );
    assert_ne!(changed.state.as_deref(), Some(state.as_str()));

    let gone = Request::gone(ObjectRef::new("v1", "Pod", Some("shop"), "web")).with_state(&state);
    assert_eq!(
        report(&gone),
        pod_watcher::Report {
            line: Some("pod shop/web deleted".into()),
            state: None
        }
    );
}

/// Labels too long for the state are kept as a digest: a change is still seen, reported with
/// the new labels.
#[test]
fn labels_too_long_to_keep_are_compared_by_digest() {
    let long: serde_json::Map<String, Value> = (0..40)
        .map(|i| (format!("label-{i}"), json!("a-rather-long-value")))
        .collect();
    let before = pod("Running", Some("node-1"), Value::Object(long.clone()), true);
    let state = seen(&before).to_state();
    assert!(state.len() <= MAX_STATE_BYTES, "{} bytes", state.len());
    let same = Request::for_object(before).unwrap().with_state(&state);
    assert_eq!(change(&same), None);

    let mut more = long;
    more.insert("tier".into(), json!("front"));
    let after = pod("Running", Some("node-1"), Value::Object(more), true);
    let line = change(&Request::for_object(after).unwrap().with_state(&state)).unwrap();
    assert!(
        line.starts_with("pod shop/web updated: labels {…} → {label-0=a-rather-long-value,"),
        "{line}"
    );
    assert!(line.ends_with("tier=front}"), "{line}");
}

#[test]
fn an_unreadable_state_counts_as_none() {
    let pending = pod("Pending", None, json!({}), false);
    let request = Request::for_object(pending).unwrap().with_state("not ours");
    let report = report(&request);
    assert!(report.line.unwrap().contains("added"));
    assert!(report.state.is_some());
}
