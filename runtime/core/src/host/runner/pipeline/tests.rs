//! The reconcile pipeline against a mock API server (tower-test, as the actions' tests) and
//! caches filled without one ([`Watch::holding`]), with the real HelloWorld guest in the real
//! sandbox: which requests one reconcile sends, in which order, and what it remembers.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

use super::*;
use crate::api::{UpdateStrategy, WasmControllerSpec};
use crate::controller::{Fence, Kind, Watch, WriteGate, WriteScheduler};
use crate::host::capsules::CapsuleStore;
use crate::host::mock_api::{Sent, api_server};
use crate::host::{
    CacheSource, ChildKind, ControllerSetup, DeclaredKinds, GuestState, Permissions,
};
use crate::sandbox::{Limits, Sandbox, SandboxConfig};

/// Writes are answered with the object sent (Events: created; an Event's patch finds none).
fn answer(method: &str, path: &str, body: &Value) -> (u16, Value) {
    match method {
        "PATCH" if path.contains("/events/") => (
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}),
        ),
        "POST" => (201, body.clone()),
        _ => (200, body.clone()),
    }
}

fn kind(group: &str, kind: &str, plural: &str) -> Kind {
    Kind {
        resource: ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, "v1", kind),
            plural,
        ),
        namespaced: true,
        has_status: true,
    }
}

fn hello_world(labels: Value, finalizers: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "HelloWorld",
        "metadata": {"name": "web", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
            "labels": labels, "finalizers": finalizers},
        "spec": {"who": "pipeline"}})
}

/// What a test changes of the controller.
struct Declared {
    parent: Value,
    selector: Option<&'static str>,
    finalize: bool,
    limits: Limits,
}

impl Default for Declared {
    fn default() -> Self {
        Declared {
            parent: hello_world(json!({}), json!([])),
            selector: None,
            finalize: false,
            limits: Limits::default(),
        }
    }
}

/// A HelloWorld controller `ns/hello` owning Pods, running the HelloWorld guest, its caches
/// holding `declared.parent` and no Pod; its API server a mock. With its capsules' store.
async fn controller(declared: Declared) -> (Arc<Runner>, Arc<Mutex<Vec<Sent>>>, Arc<CapsuleStore>) {
    let (client, sent) = api_server(answer);
    let parents = kind("example.com", "HelloWorld", "helloworlds");
    let pods = kind("", "Pod", "pods");
    let mut kinds = DeclaredKinds::default();
    kinds.insert(parents.clone());
    kinds.insert(pods.clone());
    let parent = Watch::holding(
        parents.clone(),
        vec![Cached::new(declared.parent, &parents.resource)],
    );
    let children = Watch::holding(pods.clone(), vec![]);
    let spec: WasmControllerSpec = serde_yaml::from_str(
        "module: {configMap: {name: m, key: k}}\n\
         parent: {apiVersion: example.com/v1, kind: HelloWorld}\n\
         children: [{apiVersion: v1, kind: Pod}]",
    )
    .unwrap();
    let module_source = spec.module.clone();
    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    let module = std::fs::read(kubewasm_test_support::guests::guest("hello_world")).unwrap();
    let guest = sandbox.load(&module).unwrap();
    let capsules = CapsuleStore::new(1 << 20);
    let setup = ControllerSetup {
        id: "ns/hello".into(),
        namespace: Some("ns".into()),
        reads: CacheSource::new([parent.clone(), children.clone()]),
        parent,
        parent_selector: declared
            .selector
            .map(|s| kubewasm_guest_sdk::selector::Selector::parse(s).unwrap()),
        children: vec![(
            ChildKind {
                kind: pods,
                strategy: UpdateStrategy::InPlace,
            },
            children,
        )],
        permissions: Arc::new(Permissions::from_spec("ns/hello", Some("ns"), &spec)),
        limits: declared.limits,
        concurrency: 1,
        resync: std::time::Duration::from_secs(300),
        requeue_floor: std::time::Duration::from_secs(1),
        writes: WriteGate::new(
            WriteScheduler::new(1000.0, 1000).lane("ns", "ns/hello", Default::default()),
            Fence::default(),
        ),
        client,
        kinds,
        sandbox,
        metrics: Arc::default(),
        state: Arc::new(GuestState::in_memory()),
        finalizer: Finalizer::for_controller(true, "hello").ok(),
        finalize: declared.finalize,
        capsules: capsules.open("ns/hello", Some("ns"), module_source, declared.limits),
        shadow: crate::host::shadow::ShadowStore::new(1 << 20).open("ns/hello", Some("ns"), 1),
        controller_ref: None,
    };
    (Runner::new(setup, guest, None), sent, capsules)
}

fn web() -> ObjectKey {
    ObjectKey {
        namespace: Some("ns".into()),
        name: "web".into(),
    }
}

fn sent(log: &Mutex<Vec<Sent>>) -> Vec<(String, String)> {
    log.lock()
        .unwrap()
        .iter()
        .map(|(method, path, _)| (method.clone(), path.split('?').next().unwrap().to_owned()))
        .collect()
}

#[tokio::test]
async fn a_parent_is_reconciled_its_child_applied_its_status_written_and_remembered() {
    let (runner, log, _) = controller(Declared::default()).await;
    let again = runner
        .pipeline(&web())
        .await
        .map_err(|f| f.problem)
        .unwrap();
    let pod = (
        "PATCH".to_owned(),
        "/api/v1/namespaces/ns/pods/web".to_owned(),
    );
    // The status computed before the Pod existed is held back: the Pod's watch event brings
    // the parent back, and that reconcile writes the status that holds (`HeldStatuses`).
    assert_eq!(sent(&log), std::slice::from_ref(&pod));
    let applied = log.lock().unwrap()[0].2.clone();
    assert_eq!(
        applied["spec"]["containers"][0]["command"][1],
        "Hello, pipeline!"
    );
    assert_eq!(applied["metadata"]["ownerReferences"][0]["uid"], "u-1");
    assert_eq!(runner.stats().reconciles.load(Ordering::Relaxed), 1);
    assert!(again.is_none_or(|d| d >= std::time::Duration::from_secs(1)));
    // Never twice in a row: the next reconcile writes its status whatever it did.
    runner
        .pipeline(&web())
        .await
        .map_err(|f| f.problem)
        .unwrap();
    let status = (
        "PATCH".to_owned(),
        "/apis/example.com/v1/namespaces/ns/helloworlds/web/status".to_owned(),
    );
    assert_eq!(sent(&log), [pod.clone(), pod, status]);
    let written = log.lock().unwrap()[2].2.clone();
    assert_eq!(written["status"]["pods"], 0, "{written}");
    // The next reconcile of the key is handed the parent as this one saw it (`previous`).
    let Prepare::Call(prepared, _) = runner.prepare(&web()) else {
        panic!("the parent is called again");
    };
    assert!(prepared.sent.previous.is_some());
}

#[tokio::test]
async fn a_parent_the_selector_leaves_out_is_neither_called_nor_written() {
    let (runner, log, _) = controller(Declared {
        selector: Some("tier=web"),
        ..Declared::default()
    })
    .await;
    assert!(
        runner
            .pipeline(&web())
            .await
            .map_err(|f| f.problem)
            .unwrap()
            .is_none()
    );
    assert!(sent(&log).is_empty());
    assert_eq!(runner.stats().reconciles.load(Ordering::Relaxed), 0);
    // Matched, it is reconciled.
    let (runner, log, _) = runner_matching().await;
    runner
        .pipeline(&web())
        .await
        .map_err(|f| f.problem)
        .unwrap();
    assert_eq!(sent(&log).len(), 1, "its Pod");
}

async fn runner_matching() -> (Arc<Runner>, Arc<Mutex<Vec<Sent>>>, Arc<CapsuleStore>) {
    controller(Declared {
        parent: hello_world(json!({"tier": "web"}), json!([])),
        selector: Some("tier=web"),
        ..Declared::default()
    })
    .await
}

#[tokio::test]
async fn a_controller_that_finalizes_puts_its_finalizer_on_first_and_calls_the_guest_after() {
    let (runner, log, _) = controller(Declared {
        finalize: true,
        ..Declared::default()
    })
    .await;
    runner
        .pipeline(&web())
        .await
        .map_err(|f| f.problem)
        .unwrap();
    assert_eq!(
        sent(&log),
        [(
            "PATCH".into(),
            "/apis/example.com/v1/namespaces/ns/helloworlds/web".into()
        )],
        "the finalizer only"
    );
    let patch = log.lock().unwrap()[0].2.clone();
    assert!(patch.to_string().contains("kubewasm.dev/"), "{patch}");
    assert_eq!(
        runner.stats().reconciles.load(Ordering::Relaxed),
        0,
        "the guest waits for the finalizer's write to come back"
    );
    // With its finalizer on, the parent is reconciled.
    let finalizer = runner.setup.finalizer.as_ref().unwrap().name().to_owned();
    let (runner, log, _) = controller(Declared {
        parent: hello_world(json!({}), json!([finalizer])),
        finalize: true,
        ..Declared::default()
    })
    .await;
    runner
        .pipeline(&web())
        .await
        .map_err(|f| f.problem)
        .unwrap();
    assert_eq!(runner.stats().reconciles.load(Ordering::Relaxed), 1);
    assert_eq!(sent(&log).len(), 1, "its Pod");
}

#[tokio::test]
async fn a_reconcile_that_fails_writes_nothing_of_the_guest_posts_a_warning_and_keeps_a_capsule() {
    // The guest's answer is larger than its limit: the call fails after the guest ran.
    let (runner, log, capsules) = controller(Declared {
        limits: Limits {
            response_bytes: 64,
            ..Limits::default()
        },
        ..Declared::default()
    })
    .await;
    let failure = runner
        .pipeline(&web())
        .await
        .expect_err("the reconcile fails");
    assert!(!failure.problem.message.is_empty());
    let requests = sent(&log);
    assert!(
        requests.iter().all(|(_, path)| path.contains("/events")),
        "only the failure's Event: {requests:?}"
    );
    assert!(!requests.is_empty(), "a Warning Event on the parent");
    let event = log.lock().unwrap()[0].2.clone();
    assert_eq!(event["type"], "Warning");
    assert_eq!(
        capsules.of("ns/hello").len(),
        1,
        "its capsule, for its team"
    );
}

/// A candidate is called on the same request, beside the live module: what it answers is
/// compared and kept for the team, and nothing of it is written.
#[tokio::test]
async fn a_candidate_is_compared_and_nothing_it_answers_is_written() {
    let (runner, log, _) = controller(Declared::default()).await;
    let hostile = std::fs::read(kubewasm_test_support::guests::guest("hostile")).unwrap();
    let candidate = runner.setup.sandbox.load(&hostile).unwrap();
    let digest = candidate.digest();
    runner.set_candidate(Some((
        candidate,
        Some("registry.example/hostile@sha256:ab".into()),
    )));
    runner
        .pipeline(&web())
        .await
        .map_err(|f| f.problem)
        .unwrap();
    // Exactly what the live module's answer writes: its Pod.
    assert_eq!(
        sent(&log),
        [(
            "PATCH".to_owned(),
            "/api/v1/namespaces/ns/pods/web".to_owned()
        )]
    );
    assert_eq!(runner.shadow().counts(), (1, 1));
    assert_eq!(
        runner.stats().reconciles.load(Ordering::Relaxed),
        1,
        "the candidate's call is not the controller's"
    );
    let status = runner.shadow().status().unwrap();
    assert_eq!(
        status.candidate.as_deref(),
        Some(format!("{digest} (image registry.example/hostile@sha256:ab)").as_str())
    );
    let changes = &status.last_differences[0].changes;
    assert_eq!(status.last_differences[0].object, "ns/web");
    assert!(
        changes.contains(&"apply ConfigMap (v1) ns/web: only the candidate would do it".to_owned()),
        "{changes:?}"
    );
    assert!(
        changes.contains(&"apply Pod (v1) ns/web: only the live module does it".to_owned()),
        "{changes:?}"
    );
    assert!(
        changes.contains(&"set the status: ok: (none) → true; pods: 0 → (none)".to_owned()),
        "{changes:?}"
    );
    // The live module itself as the candidate: a new count, and no difference.
    runner.set_candidate(Some((runner.guest(), None)));
    runner
        .pipeline(&web())
        .await
        .map_err(|f| f.problem)
        .unwrap();
    assert_eq!(runner.shadow().counts(), (1, 0));
    assert!(
        runner
            .shadow()
            .status()
            .unwrap()
            .last_differences
            .is_empty()
    );
    // No candidate: nothing compared, nothing shown.
    runner.set_candidate(None);
    assert!(runner.shadow().status().is_none());
}
