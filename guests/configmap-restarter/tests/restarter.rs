//! The ConfigMap restarter's reconcile against fixtures, natively.

use configmap_restarter::{DIGEST_ANNOTATION, data_digest, reconcile};
use kubewasm_guest_sdk::selector::Selector;
use kubewasm_guest_sdk::testing::{FakeCluster, object_from_yaml, request_from_yaml};
use kubewasm_guest_sdk::{Action, EventType, ObjectRef, Request, Response, object};
use serde_json::{Value, json};

/// Digest of `app.conf: "color=blue\n"`, computed independently (Python's hashlib over the
/// same canonical JSON). Pinned: changing the digest would restart every user's Pods once.
const BLUE_DIGEST: &str = "sha256:91972207f1577170f617d6835b9add1d1d592d4cb6bc5468fd1abe92e5527d26";
/// Digest of the blue data plus `binaryData.logo.png`.
const BLUE_WITH_LOGO_DIGEST: &str =
    "sha256:f967b655df831e910459d8f963796ab987b39c9854a7cad0b36d1a0bf16a4584";

fn run(config_map: &Value) -> Response {
    let request = Request::for_object(config_map.clone()).unwrap();
    reconcile(&request, &FakeCluster::new()).expect("reconcile succeeds")
}

fn fixture(yaml: &str) -> Value {
    object_from_yaml(yaml)
}

fn record_of(digest: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "app-config",
            "namespace": "demo",
            "annotations": { DIGEST_ANNOTATION: digest },
        },
    })
}

/// What server-side apply does with the record: merge its annotation into the ConfigMap.
fn apply_record(config_map: &mut Value, record: &Value) {
    let digest = object::annotation(record, DIGEST_ANNOTATION).expect("record has a digest");
    config_map["metadata"]["annotations"][DIGEST_ANNOTATION] = json!(digest);
}

#[test]
fn first_sighting_records_the_digest_only() {
    let response = run(&fixture(include_str!("fixtures/first-sighting.yaml")));
    assert_eq!(response.actions, [Action::Apply(record_of(BLUE_DIGEST))]);
}

#[test]
fn changed_data_restarts_once_then_records() {
    let mut config_map = fixture(include_str!("fixtures/data-changed.yaml"));
    let response = run(&config_map);
    let green = data_digest(&config_map);
    assert_ne!(green, BLUE_DIGEST);
    assert_eq!(
        response.actions,
        [
            Action::delete_all_of("v1", "Pod", Some("demo"), "app=frontend"),
            Action::Apply(record_of(&green)),
            Action::Event {
                event_type: EventType::Normal,
                reason: "PodsRestarted".into(),
                message: "ConfigMap data changed: deleted the Pods in namespace demo \
                          matching \"app=frontend\""
                    .into(),
            },
        ]
    );

    // Once the host has applied the record, the same data restarts nothing.
    apply_record(&mut config_map, response.applied()[0]);
    assert!(run(&config_map).is_empty());
}

#[test]
fn the_selector_picks_the_pods_of_the_configmaps_namespace() {
    let response = run(&fixture(include_str!("fixtures/data-changed.yaml")));
    let Action::DeleteAllOf {
        namespace,
        label_selector,
        ..
    } = &response.actions[0]
    else {
        panic!("first action is not a DeleteAllOf: {response:?}");
    };
    let cluster = FakeCluster::from_yaml(include_str!("fixtures/pods.yaml"));
    let selector = Selector::parse(label_selector).unwrap();
    let doomed: Vec<_> = kubewasm_guest_sdk::Reads::list(
        &cluster,
        "v1",
        "Pod",
        namespace.as_deref(),
        Some(&selector.to_string()),
    )
    .unwrap();
    let names: Vec<_> = doomed.iter().filter_map(object::name).collect();
    assert_eq!(names, ["frontend-1", "frontend-2"]);
}

#[test]
fn same_digest_does_nothing() {
    let mut config_map = fixture(include_str!("fixtures/first-sighting.yaml"));
    apply_record(&mut config_map, &record_of(BLUE_DIGEST));
    assert!(run(&config_map).is_empty());
}

#[test]
fn metadata_only_change_restarts_nothing() {
    let response = run(&fixture(include_str!("fixtures/metadata-changed.yaml")));
    assert!(response.is_empty(), "{response:?}");
}

#[test]
fn unannotated_configmap_is_ignored() {
    assert!(run(&fixture(include_str!("fixtures/unannotated.yaml"))).is_empty());
}

#[test]
fn deleted_configmap_needs_nothing() {
    let request = Request::gone(ObjectRef::new(
        "v1",
        "ConfigMap",
        Some("demo"),
        "app-config",
    ));
    assert!(reconcile(&request, &FakeCluster::new()).unwrap().is_empty());

    let mut terminating = fixture(include_str!("fixtures/data-changed.yaml"));
    terminating["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
    assert!(run(&terminating).is_empty());
}

#[test]
fn invalid_selector_warns_and_does_nothing_else() {
    for (yaml, needle) in [
        (
            include_str!("fixtures/bad-selector.yaml"),
            "invalid label selector \"app in (frontend\"",
        ),
        (
            include_str!("fixtures/empty-selector.yaml"),
            "would select every Pod",
        ),
    ] {
        let response = run(&fixture(yaml));
        let events = response.events();
        assert_eq!(response.actions.len(), 1, "{response:?}");
        assert_eq!(events[0].0, EventType::Warning);
        assert_eq!(events[0].1, "InvalidSelector");
        assert!(events[0].2.contains(needle), "{}", events[0].2);
        assert!(events[0].2.contains("magalix.com/podDeleteMatch"));
    }
}

#[test]
fn digest_covers_binary_data_and_ignores_key_order() {
    let with_logo = fixture(include_str!("fixtures/with-binary-data.yaml"));
    assert_eq!(data_digest(&with_logo), BLUE_WITH_LOGO_DIGEST);

    let reordered = json!({
        "data": {"b": "2", "a": "1"},
        "binaryData": {"z": "AA=="},
    });
    let ordered = json!({
        "binaryData": {"z": "AA=="},
        "data": {"a": "1", "b": "2"},
    });
    assert_eq!(data_digest(&reordered), data_digest(&ordered));
    // A key moved between data and binaryData is a change.
    assert_ne!(
        data_digest(&json!({"data": {"k": "AA=="}})),
        data_digest(&json!({"binaryData": {"k": "AA=="}}))
    );
    // No data and empty data are the same thing.
    assert_eq!(data_digest(&json!({})), data_digest(&json!({"data": {}})));
}

#[test]
fn pinned_digest_of_the_blue_data() {
    let config_map = fixture(include_str!("fixtures/first-sighting.yaml"));
    assert_eq!(data_digest(&config_map), BLUE_DIGEST);
}

#[test]
fn reads_go_through_the_request_only() {
    // The restarter never reads the cluster: a cluster refusing every read changes nothing.
    let request = request_from_yaml(include_str!("fixtures/data-changed.yaml"));
    let refusing = FakeCluster::new().refusing_reads("no reads granted");
    let response = reconcile(&request, &refusing).unwrap();
    assert_eq!(response.actions.len(), 3);
}
