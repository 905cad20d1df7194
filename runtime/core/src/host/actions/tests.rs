//! Actions against a mock API server (tower-test, as kube-rs's own controller examples do):
//! the update strategies, drift detection and Event counting, without a cluster. What the
//! executor sends is recorded and asserted request by request.

use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use crate::api::{UpdateStrategy, WasmControllerSpec};
use crate::controller::{Fence, Kind, WriteGate, WriteScheduler};
use crate::host::GuestState;
use crate::host::grants::Permissions;
use crate::host::kinds::DeclaredKinds;
use crate::sandbox::{Action, EventType, ObjectRef};

use super::{ChildKind, DESIRED_ANNOTATION, EventRecorder, Executor, HeldStatuses};

use crate::host::mock_api::{Sent, api_server};

/// Objects come back as sent; deletes say the object is gone; Event patches find nothing.
fn cooperative(method: &str, path: &str, _: &Value) -> (u16, Value) {
    match method {
        "DELETE" => (
            200,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}),
        ),
        "PATCH" if path.contains("/events/") => (
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
        ),
        "POST" if path.contains("/events") => (
            201,
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "web.1", "namespace": "ns"},
                "involvedObject": {}}),
        ),
        _ => (200, pod("web", "0.5")),
    }
}

/// Like [`cooperative`], but Event patches succeed.
fn events_kept(method: &str, path: &str, body: &Value) -> (u16, Value) {
    match (method, path.contains("/events/")) {
        ("PATCH", true) => (
            200,
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "web.1", "namespace": "ns"},
                "involvedObject": {}}),
        ),
        _ => cooperative(method, path, body),
    }
}

fn kind(group: &str, version: &str, kind: &str, plural: &str) -> Kind {
    Kind {
        resource: ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, kind),
            plural,
        ),
        namespaced: true,
        has_status: true,
    }
}

fn pod(name: &str, cpu: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox",
            "resources": {"requests": {"cpu": cpu}}}]}})
}

/// What a controller keeps from one reconcile to the next.
#[derive(Default)]
struct Kept {
    events: EventRecorder,
    held: HeldStatuses,
}

/// Runs `actions` for HelloWorld `ns/web` (uid `u-1`) owning Pods with `strategy`, with
/// `observed` children, and returns what was sent.
async fn run(
    strategy: UpdateStrategy,
    observed: Vec<Value>,
    actions: Vec<Action>,
    answer: crate::host::mock_api::Answer,
    kept: &Kept,
) -> Vec<Sent> {
    let (client, sent) = api_server(answer);
    let pods = kind("", "v1", "Pod", "pods");
    let parent_kind = kind("example.com", "v1", "HelloWorld", "helloworlds");
    let mut kinds = DeclaredKinds::default();
    kinds.insert(pods.clone());
    kinds.insert(parent_kind.clone());
    let spec: WasmControllerSpec = serde_yaml::from_str(
        "module: {configMap: {name: m, key: k}}\n\
         parent: {apiVersion: example.com/v1, kind: HelloWorld}\n\
         children: [{apiVersion: v1, kind: Pod}]",
    )
    .unwrap();
    let permissions = Permissions::from_spec("ns/hello", Some("ns"), &spec);
    let parent = json!({"apiVersion": "example.com/v1", "kind": "HelloWorld",
        "metadata": {"name": "web", "namespace": "ns", "uid": "u-1"}});
    let target = ObjectRef::new("example.com/v1", "HelloWorld", Some("ns"), "web");
    let writes = WriteGate::new(
        WriteScheduler::new(1000.0, 1000).lane("ns", "test", Default::default()),
        Fence::default(),
    );
    let child_kinds = [ChildKind {
        kind: pods,
        strategy,
    }];
    let executor = Executor {
        client,
        kinds: &kinds,
        writes: &writes,
        permissions: &permissions,
        field_manager: "kubewasm/ns/hello".into(),
        parent_kind: &parent_kind,
        parent: Some(&parent),
        target: &target,
        child_kinds: &child_kinds,
        children: &observed,
        existing: &super::NoExistingChildren,
        events: &kept.events,
        state: (&std::sync::Arc::new(GuestState::in_memory()), "ns/web"),
        held: &kept.held,
    };
    executor
        .execute(&actions)
        .await
        .expect("the actions succeed");
    drop(executor);
    // The mock server records a request before answering it, so all are in by now.
    sent.lock().unwrap().clone()
}

/// The Pod as the executor applies it, and as the API server would store it: normalised
/// quantity, an added toleration and default fields.
async fn applied_and_stored() -> (Value, Value) {
    let sent = run(
        UpdateStrategy::Recreate,
        vec![],
        vec![Action::Apply(pod("web", "0.5"))],
        cooperative,
        &Kept::default(),
    )
    .await;
    assert_eq!(sent.len(), 1, "{sent:#?}");
    let (method, path, applied) = sent[0].clone();
    assert_eq!(method, "PATCH");
    assert!(
        path.starts_with("/api/v1/namespaces/ns/pods/web?")
            && path.contains("fieldManager=kubewasm%2Fns%2Fhello")
            && path.contains("force=true"),
        "{path}"
    );
    assert_eq!(applied["metadata"]["ownerReferences"][0]["uid"], "u-1");
    let mut stored = applied.clone();
    stored["metadata"]["uid"] = json!("pod-1");
    stored["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("500m");
    stored["spec"]["containers"][0]["imagePullPolicy"] = json!("Always");
    stored["spec"]["tolerations"] = json!([{"key": "node.kubernetes.io/not-ready",
        "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]);
    (applied, stored)
}

#[tokio::test]
async fn a_child_the_server_normalised_is_left_alone_under_every_strategy() {
    let (applied, stored) = applied_and_stored().await;
    assert!(applied["metadata"]["annotations"][DESIRED_ANNOTATION].is_string());
    for strategy in [
        UpdateStrategy::Recreate,
        UpdateStrategy::InPlace,
        UpdateStrategy::OnDelete,
    ] {
        let sent = run(
            strategy,
            vec![stored.clone()],
            vec![Action::Apply(pod("web", "0.5"))],
            cooperative,
            &Kept::default(),
        )
        .await;
        assert!(sent.is_empty(), "{strategy:?}: {sent:#?}");
    }
}

#[tokio::test]
async fn a_changed_child_is_updated_as_its_strategy_says() {
    let (_, stored) = applied_and_stored().await;
    let changed = || vec![Action::Apply(pod("web", "1"))];
    let sent = run(
        UpdateStrategy::Recreate,
        vec![stored.clone()],
        changed(),
        cooperative,
        &Kept::default(),
    )
    .await;
    let calls: Vec<(&str, &str)> = sent
        .iter()
        .map(|(m, p, _)| (m.as_str(), p.as_str()))
        .collect();
    assert_eq!(calls.len(), 2, "{sent:#?}");
    assert_eq!(calls[0], ("DELETE", "/api/v1/namespaces/ns/pods/web?"));
    assert_eq!(
        sent[0].2["preconditions"]["uid"], "pod-1",
        "the delete is uid-guarded"
    );
    assert_eq!(calls[1].0, "PATCH");
    assert_eq!(
        sent[1].2["spec"]["containers"][0]["resources"]["requests"]["cpu"],
        "1"
    );

    let sent = run(
        UpdateStrategy::InPlace,
        vec![stored.clone()],
        changed(),
        cooperative,
        &Kept::default(),
    )
    .await;
    assert_eq!(sent.len(), 1, "{sent:#?}");
    assert_eq!(sent[0].0, "PATCH");

    let sent = run(
        UpdateStrategy::OnDelete,
        vec![stored],
        changed(),
        cooperative,
        &Kept::default(),
    )
    .await;
    assert!(sent.is_empty(), "{sent:#?}");
}

#[tokio::test]
async fn a_child_no_longer_asked_for_is_deleted() {
    let (_, stored) = applied_and_stored().await;
    let sent = run(
        UpdateStrategy::InPlace,
        vec![stored],
        vec![],
        cooperative,
        &Kept::default(),
    )
    .await;
    assert_eq!(sent.len(), 1, "{sent:#?}");
    assert_eq!(sent[0].0, "DELETE");
    assert_eq!(sent[0].2["preconditions"]["uid"], "pod-1");
}

#[tokio::test]
async fn the_same_event_is_counted_on_one_object() {
    let events = Kept::default();
    let event = || {
        vec![Action::Event {
            event_type: EventType::Normal,
            reason: "Composed".into(),
            message: "composed Pod web".into(),
        }]
    };
    let first = run(
        UpdateStrategy::InPlace,
        vec![],
        event(),
        events_kept,
        &events,
    )
    .await;
    assert_eq!(first.len(), 1, "{first:#?}");
    assert_eq!(
        (first[0].0.as_str(), first[0].1.as_str()),
        ("POST", "/api/v1/namespaces/ns/events?")
    );
    assert_eq!(first[0].2["count"], 1);
    assert_eq!(first[0].2["involvedObject"]["uid"], "u-1");
    for count in 2..=3 {
        let again = run(
            UpdateStrategy::InPlace,
            vec![],
            event(),
            events_kept,
            &events,
        )
        .await;
        assert_eq!(again.len(), 1, "{again:#?}");
        assert_eq!(
            (again[0].0.as_str(), again[0].1.as_str()),
            ("PATCH", "/api/v1/namespaces/ns/events/web.1?")
        );
        assert_eq!(again[0].2["count"], count);
    }
    // The Event is gone (the API server's TTL): a new one is created.
    let gone = run(
        UpdateStrategy::InPlace,
        vec![],
        event(),
        cooperative,
        &events,
    )
    .await;
    let calls: Vec<&str> = gone.iter().map(|(m, _, _)| m.as_str()).collect();
    assert_eq!(calls, ["PATCH", "POST"], "{gone:#?}");
    assert_eq!(gone[1].2["count"], 1);
}

#[tokio::test]
async fn a_status_computed_before_a_child_write_is_left_to_the_next_reconcile_once() {
    let kept = Kept::default();
    let status = |pods: u32| Action::SetStatus(json!({"pods": pods}));
    let methods = |sent: &[Sent]| -> Vec<String> {
        sent.iter()
            .map(|(m, p, _)| format!("{m} {}", p.split('?').next().unwrap_or_default()))
            .collect()
    };
    let pod_path = "PATCH /api/v1/namespaces/ns/pods/web";
    let status_path = "PATCH /apis/example.com/v1/namespaces/ns/helloworlds/web/status";
    // HelloWorld's first reconcile: the Pod is created, and `pods: 0` is stale at once; the
    // Pod's watch event brings the parent back.
    let first = run(
        UpdateStrategy::Recreate,
        vec![],
        vec![Action::Apply(pod("web", "0.5")), status(0)],
        cooperative,
        &kept,
    )
    .await;
    assert_eq!(methods(&first), [pod_path], "{first:#?}");
    // A reconcile that writes a child again still writes its status: never held twice in a
    // row, so a guest that writes a child every time still has its statuses written.
    let second = run(
        UpdateStrategy::Recreate,
        vec![],
        vec![Action::Apply(pod("web", "1")), status(1)],
        cooperative,
        &kept,
    )
    .await;
    assert_eq!(methods(&second), [pod_path, status_path], "{second:#?}");
    assert_eq!(second[1].2["status"], json!({"pods": 1}));
    // The next child write may be held again.
    let third = run(
        UpdateStrategy::Recreate,
        vec![],
        vec![Action::Apply(pod("web", "2")), status(2)],
        cooperative,
        &kept,
    )
    .await;
    assert_eq!(methods(&third), [pod_path], "{third:#?}");
    // No child written: the status is written, and nothing stays held.
    let fourth = run(
        UpdateStrategy::Recreate,
        vec![],
        vec![status(3)],
        cooperative,
        &kept,
    )
    .await;
    assert_eq!(methods(&fourth), [status_path], "{fourth:#?}");
    let fifth = run(
        UpdateStrategy::Recreate,
        vec![],
        vec![Action::Apply(pod("web", "4")), status(4)],
        cooperative,
        &kept,
    )
    .await;
    assert_eq!(
        methods(&fifth),
        [pod_path],
        "held again after a written one: {fifth:#?}"
    );
    // A status set before the child write is written as asked.
    let before = Kept::default();
    let sent = run(
        UpdateStrategy::Recreate,
        vec![],
        vec![status(0), Action::Apply(pod("web", "0.5"))],
        cooperative,
        &before,
    )
    .await;
    assert_eq!(methods(&sent), [status_path, pod_path], "{sent:#?}");
}

/// Twenty Pods match `app=web`; every other request as [`cooperative`].
fn twenty_listed(method: &str, path: &str, body: &Value) -> (u16, Value) {
    if method == "GET" && path.contains("labelSelector") {
        let items: Vec<Value> = (0..20)
            .map(|i| {
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("web-{i}"),
                    "namespace": "ns", "uid": format!("uid-{i}")}})
            })
            .collect();
        return (
            200,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}),
        );
    }
    cooperative(method, path, body)
}

#[tokio::test]
async fn delete_all_of_deletes_every_match_once_each_guarded_by_its_uid() {
    let sent = run(
        UpdateStrategy::InPlace,
        vec![],
        vec![Action::DeleteAllOf {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: None,
            label_selector: "app=web".into(),
            created_before: None,
        }],
        twenty_listed,
        &Kept::default(),
    )
    .await;
    assert_eq!(sent[0].0, "GET", "listed first: {sent:#?}");
    let mut deleted: Vec<(String, String)> = sent[1..]
        .iter()
        .map(|(m, p, body)| {
            assert_eq!(m, "DELETE", "{sent:#?}");
            let name = p.split('?').next().unwrap_or_default().rsplit('/').next();
            (
                name.unwrap_or_default().to_owned(),
                body["preconditions"]["uid"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    deleted.sort();
    let mut expected: Vec<(String, String)> = (0..20)
        .map(|i| (format!("web-{i}"), format!("uid-{i}")))
        .collect();
    expected.sort();
    assert_eq!(deleted, expected);
}
