//! The finalizing HelloWorld against fixtures, natively.

use hello_finalizer::{HOLD_ANNOTATION, reconcile, record_name};
use kubewasm_guest_sdk::testing::FakeCluster;
use kubewasm_guest_sdk::{Action, ObjectRef, Request};
use serde_json::{Value, json};

fn hello(annotations: Value, deleting: bool) -> Value {
    let mut parent = json!({
        "apiVersion": "example.com/v1", "kind": "HelloWorld",
        "metadata": {"name": "your-name", "namespace": "hello", "uid": "u-1",
                     "annotations": annotations},
        "spec": {"who": "Your Name"},
    });
    if deleting {
        parent["metadata"]["deletionTimestamp"] = json!("2026-11-23T12:00:00Z");
    }
    parent
}

fn record() -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": record_name("your-name"), "namespace": "hello"}})
}

#[test]
fn a_living_hello_world_keeps_its_record() {
    let request = Request::for_object(hello(json!({}), false)).unwrap();
    let response = reconcile(&request, &FakeCluster::new()).unwrap();
    let applied = response.applied();
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0]["metadata"]["name"], "greeting-your-name");
    assert_eq!(applied[0]["data"]["greeting"], "Hello, Your Name!");
    assert!(!response.is_finalized());
}

#[test]
fn finalizing_deletes_the_record_first_then_releases() {
    let request = Request::for_object(hello(json!({}), true))
        .unwrap()
        .finalizing();
    let mut cluster = FakeCluster::new();
    cluster.insert(record());
    let response = reconcile(&request, &cluster).unwrap();
    assert_eq!(
        response.actions[0],
        Action::Delete(ObjectRef::new(
            "v1",
            "ConfigMap",
            Some("hello"),
            "greeting-your-name"
        ))
    );
    assert!(
        !response.is_finalized(),
        "released before the record was gone"
    );

    let response = reconcile(&request, &FakeCluster::new()).unwrap();
    assert_eq!(response.actions, [Action::Finalized(true)]);
}

#[test]
fn a_held_hello_world_is_never_released() {
    let request = Request::for_object(hello(json!({HOLD_ANNOTATION: "true"}), true))
        .unwrap()
        .finalizing();
    let response = reconcile(&request, &FakeCluster::new()).unwrap();
    assert!(!response.is_finalized());
    assert!(response.applied().is_empty());
}

#[test]
fn deleted_without_the_finalizer_needs_nothing() {
    let request = Request::for_object(hello(json!({}), true)).unwrap();
    assert!(reconcile(&request, &FakeCluster::new()).unwrap().is_empty());
}
