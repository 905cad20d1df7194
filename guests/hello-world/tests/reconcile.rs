//! HelloWorld's reconcile against fixtures, natively.

use hello_world::reconcile;
use kubewasm_guest_sdk::testing::{FakeCluster, request_from_yaml};
use kubewasm_guest_sdk::{Action, ObjectRef, Request, Response};
use serde_json::{Value, json};

fn run(fixture: &str) -> Response {
    reconcile(&request_from_yaml(fixture), &FakeCluster::new()).expect("reconcile succeeds")
}

fn command(pod: &Value) -> &Value {
    &pod["spec"]["containers"][0]["command"]
}

#[test]
fn seed_input_gives_a_pod_greeting_your_name() {
    let response = run(include_str!("fixtures/your-name.yaml"));
    let expected: Value =
        serde_json::from_str(include_str!("fixtures/your-name-pod.json")).unwrap();
    assert_eq!(
        response.actions,
        [
            Action::Apply(expected),
            Action::SetStatus(json!({ "pods": 0 })),
        ]
    );
}

#[test]
fn who_defaults_to_world() {
    for fixture in [
        include_str!("fixtures/no-who.yaml"),
        include_str!("fixtures/empty-who.yaml"),
    ] {
        let response = run(fixture);
        let pod = response.applied()[0];
        assert_eq!(command(pod), &json!(["echo", "Hello, World!"]));
        assert_eq!(pod["metadata"]["namespace"], "demo");
    }
}

#[test]
fn status_counts_observed_child_pods() {
    let response = run(include_str!("fixtures/with-children.yaml"));
    assert_eq!(response.status(), Some(&json!({ "pods": 1 })));
    let pod = response.applied()[0];
    assert_eq!(pod["metadata"]["name"], "greeter");
    assert_eq!(command(pod), &json!(["echo", "Hello, Ada!"]));
}

#[test]
fn gone_parent_needs_nothing() {
    let request = Request::gone(ObjectRef::new(
        "example.com/v1",
        "HelloWorld",
        Some("demo"),
        "greeter",
    ));
    let response = reconcile(&request, &FakeCluster::new()).unwrap();
    assert!(response.is_empty(), "{response:?}");
}

#[test]
fn same_input_same_actions() {
    let fixture = include_str!("fixtures/with-children.yaml");
    assert_eq!(run(fixture), run(fixture));
}
