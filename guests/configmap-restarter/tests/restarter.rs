//! The ConfigMap restarter's reconcile against fixtures, natively.

use configmap_restarter::{
    data_changed_at, data_digest, next_second, pending_bound, pending_state, reconcile,
};
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

/// The Pods of the fixtures, with creation times: the two `app=frontend` Pods of namespace
/// `demo` made before the data changed (12:00:05), others that do not match.
fn pods() -> FakeCluster {
    let mut cluster = FakeCluster::new();
    for (name, namespace, app, created) in [
        ("frontend-1", "demo", "frontend", "2026-11-23T12:00:01Z"),
        ("frontend-2", "demo", "frontend", "2026-11-23T12:00:03Z"),
        ("backend-1", "demo", "backend", "2026-11-23T12:00:09Z"),
        (
            "frontend-elsewhere",
            "other",
            "frontend",
            "2026-11-23T12:00:09Z",
        ),
    ] {
        cluster.insert(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"app": app},
                "creationTimestamp": created}}));
    }
    cluster
}

/// Reconciles `config_map` with `saved` as the controller's state for it, `cluster` for reads.
fn run_in(cluster: &FakeCluster, config_map: &Value, saved: Option<&str>) -> Response {
    let mut request = Request::for_object(config_map.clone()).unwrap();
    if let Some(saved) = saved {
        request = request.with_state(saved);
    }
    reconcile(&request, cluster).expect("reconcile succeeds")
}

/// Reconciles `config_map` with `saved` as the controller's state for it, among [`pods`].
fn run_with(config_map: &Value, saved: Option<&str>) -> Response {
    run_in(&pods(), config_map, saved)
}

/// Reconciles `config_map` as last restarted for the blue data.
fn run(config_map: &Value) -> Response {
    run_with(config_map, Some(BLUE_DIGEST))
}

fn fixture(yaml: &str) -> Value {
    object_from_yaml(yaml)
}

#[test]
fn first_sighting_saves_the_digest_only() {
    let config_map = fixture(include_str!("fixtures/first-sighting.yaml"));
    let response = run_with(&config_map, None);
    assert_eq!(
        response.actions,
        [Action::SetState(Some(BLUE_DIGEST.into()))]
    );
}

fn restart_event(before: &str) -> Action {
    Action::Event {
        event_type: EventType::Normal,
        reason: "PodsRestarted".into(),
        message: format!(
            "ConfigMap data changed: deleted the Pods in namespace demo matching \
             \"app=frontend\", created before {before}"
        ),
    }
}

fn delete_created_before(before: &str) -> Action {
    Action::DeleteAllOf {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: Some("demo".into()),
        label_selector: "app=frontend".into(),
        created_before: Some(before.into()),
    }
}

#[test]
fn changed_data_restarts_the_pods_of_the_old_data_then_saves() {
    let config_map = fixture(include_str!("fixtures/data-changed.yaml"));
    let response = run(&config_map);
    let green = data_digest(&config_map);
    assert_ne!(green, BLUE_DIGEST);
    assert_eq!(
        response.actions,
        [
            // The data's last writer (kubectl-patch, 12:00:05) is later than both Pods.
            Action::SetState(Some(pending_state(&green, Some("2026-11-23T12:00:05Z")))),
            delete_created_before("2026-11-23T12:00:06Z"),
            Action::SetState(Some(green.clone())),
            restart_event("2026-11-23T12:00:06Z"),
        ]
    );
    // Once the host has saved the state, the same data restarts nothing.
    assert!(run_with(&config_map, Some(&green)).is_empty());
}

/// Kubernetes 1.20 keeps a manager's `managedFields` time when the same manager changes the
/// data again (two `kubectl patch`): the Pods made since the first change are newer than that
/// time, and must go too.
#[test]
fn a_second_change_by_the_same_manager_restarts_the_replacements_of_the_first() {
    let config_map = fixture(include_str!("fixtures/data-changed.yaml"));
    let green = data_digest(&config_map);
    let mut cluster = pods();
    cluster.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "frontend-3", "namespace": "demo", "labels": {"app": "frontend"},
            "creationTimestamp": "2026-11-23T12:10:00Z"}}));
    let response = run_in(&cluster, &config_map, Some(BLUE_DIGEST));
    assert_eq!(
        response.actions[..2],
        [
            Action::SetState(Some(pending_state(&green, Some("2026-11-23T12:10:00Z")))),
            delete_created_before("2026-11-23T12:10:01Z"),
        ]
    );
}

#[test]
fn an_unfinished_restart_deletes_up_to_its_saved_bound_only() {
    // Killed (or a delete refused) after `pending:` was saved, before the digest was: the
    // replacements made since are newer than the saved bound, and spared. No read is needed.
    let config_map = fixture(include_str!("fixtures/data-changed.yaml"));
    let green = data_digest(&config_map);
    let saved = pending_state(&green, Some("2026-11-23T12:00:03Z"));
    let mut cluster = pods();
    cluster.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "frontend-new", "namespace": "demo", "labels": {"app": "frontend"},
            "creationTimestamp": "2026-11-23T12:00:30Z"}}));
    for cluster in [
        cluster,
        FakeCluster::new().refusing_reads("no reads granted"),
    ] {
        let response = run_in(&cluster, &config_map, Some(&saved));
        assert_eq!(
            response.actions,
            [
                delete_created_before("2026-11-23T12:00:04Z"),
                Action::SetState(Some(green.clone())),
                restart_event("2026-11-23T12:00:04Z"),
            ]
        );
    }
    // A pending restart for other data is a new change.
    let response = run_with(
        &config_map,
        Some(&pending_state(BLUE_DIGEST, Some("2026-11-23T11:00:00Z"))),
    );
    assert_eq!(
        response.actions[1],
        delete_created_before("2026-11-23T12:00:06Z")
    );
}

#[test]
fn pending_states_parse_back() {
    let bound = Some("2026-11-23T12:00:05Z");
    assert_eq!(
        pending_bound(&pending_state("sha256:ab", bound), "sha256:ab"),
        Some(bound)
    );
    assert_eq!(
        pending_bound(&pending_state("sha256:ab", None), "sha256:ab"),
        Some(None)
    );
    assert_eq!(
        pending_bound(&pending_state("sha256:ab", bound), "sha256:cd"),
        None
    );
    assert_eq!(pending_bound("sha256:ab", "sha256:ab"), None);
}

#[test]
fn the_second_after_a_time() {
    for (time, next) in [
        ("2026-11-23T12:00:05Z", "2026-11-23T12:00:06Z"),
        ("2026-12-31T23:59:59Z", "2027-01-01T00:00:00Z"),
        ("2024-02-28T23:59:59Z", "2024-02-29T00:00:00Z"),
        ("2023-02-28T23:59:59Z", "2023-03-01T00:00:00Z"),
        ("1970-01-01T00:00:00Z", "1970-01-01T00:00:01Z"),
    ] {
        assert_eq!(next_second(time).as_deref(), Some(next), "{time}");
    }
    for bad in [
        "",
        "2026-11-23T12:00:05",
        "2026-11-23 12:00:05Z",
        "2026-13-23T12:00:05Z",
        "2026-11-23T12:00:05.5Z",
    ] {
        assert_eq!(next_second(bad), None, "{bad:?}");
    }
}

#[test]
fn without_managed_fields_the_newest_pod_bounds_the_restart() {
    let mut config_map = fixture(include_str!("fixtures/data-changed.yaml"));
    config_map["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("managedFields");
    assert_eq!(data_changed_at(&config_map), None);
    let response = run(&config_map);
    assert_eq!(
        response.actions[1],
        delete_created_before("2026-11-23T12:00:04Z")
    );
    // With no Pod and no time of the change, or a Pod without a creation time: not bounded.
    let green = data_digest(&config_map);
    let mut undated = FakeCluster::new();
    undated.insert(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "frontend-1", "namespace": "demo", "labels": {"app": "frontend"}}}));
    for cluster in [FakeCluster::new(), undated] {
        let response = run_in(&cluster, &config_map, Some(BLUE_DIGEST));
        assert_eq!(
            response.actions[..2],
            [
                Action::SetState(Some(pending_state(&green, None))),
                Action::delete_all_of("v1", "Pod", Some("demo"), "app=frontend"),
            ]
        );
    }
}

#[test]
fn the_selector_picks_the_pods_of_the_configmaps_namespace() {
    let response = run(&fixture(include_str!("fixtures/data-changed.yaml")));
    let Action::DeleteAllOf {
        namespace,
        label_selector,
        ..
    } = &response.actions[1]
    else {
        panic!("second action is not a DeleteAllOf: {response:?}");
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
    let config_map = fixture(include_str!("fixtures/first-sighting.yaml"));
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
    // Its saved state is forgotten by the runtime once the object is gone.
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
fn a_refused_read_of_the_pods_fails_the_reconcile_saying_why() {
    let request =
        request_from_yaml(include_str!("fixtures/data-changed.yaml")).with_state(BLUE_DIGEST);
    let refusing = FakeCluster::new().refusing_reads("no reads granted");
    let err = reconcile(&request, &refusing).unwrap_err();
    assert!(err.message.contains("no reads granted"), "{}", err.message);
}
