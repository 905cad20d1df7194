//! k8s-openapi types in a guest, natively: the typed example reconciles ConfigMaps and Pods
//! exactly as its JSON twin does, and an object that does not fit its type fails with a
//! message naming the object and the field.

#[path = "../examples/typed.rs"]
mod typed;
#[path = "../examples/typed_configmap.rs"]
mod typed_configmap;
#[path = "../examples/untyped.rs"]
mod untyped;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kubewasm_guest_sdk::testing::{FakeCluster, request_from_yaml};
use kubewasm_guest_sdk::{EventType, Request, Response, object};
use serde_json::json;

const CONFIG: &str = "
apiVersion: v1
kind: ConfigMap
metadata: {name: site, namespace: demo}
data: {greeting: hi there, log-level: debug}
";

const FAILED_CHILD: &str = "
---
apiVersion: v1
kind: Pod
metadata: {name: site-echo, namespace: demo}
spec: {containers: [{name: echo, image: busybox}]}
status:
  phase: Failed
  containerStatuses:
  - name: echo
    image: busybox
    imageID: ''
    ready: false
    restartCount: 0
    state: {terminated: {exitCode: 137, reason: OOMKilled}}
";

fn both(request: &Request) -> Response {
    let cluster = FakeCluster::new();
    let typed = typed::reconcile(request, &cluster).expect("typed reconcile");
    let untyped = untyped::reconcile(request, &cluster).expect("untyped reconcile");
    assert_eq!(typed, untyped, "typed and untyped disagree");
    let half = typed_configmap::reconcile(request, &cluster).expect("typed_configmap reconcile");
    assert_eq!(half, untyped, "typed_configmap and untyped disagree");
    typed
}

#[test]
fn typed_and_json_guests_make_the_same_pod() {
    let response = both(&request_from_yaml(CONFIG));
    assert_eq!(
        response.applied(),
        [&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "site-echo", "namespace": "demo", "labels": {"app": "echo"}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "echo", "image": "busybox", "command": ["echo", "hi there"],
                "env": [{"name": "GREETING", "value": "hi there"},
                        {"name": "LOG_LEVEL", "value": "debug"}],
            }]},
        })]
    );
    assert!(response.events().is_empty());
}

#[test]
fn typed_and_json_guests_report_a_failed_pod() {
    let response = both(&request_from_yaml(&format!("{CONFIG}{FAILED_CHILD}")));
    assert_eq!(
        response.events(),
        [(
            EventType::Warning,
            "PodFailed",
            "Pod site-echo failed: OOMKilled"
        )]
    );
}

#[test]
fn typed_round_trip_keeps_a_k8s_openapi_object() {
    let request = request_from_yaml(&format!("{CONFIG}{FAILED_CHILD}"));
    let pod: Pod = object::typed(&request.children[0]).unwrap();
    assert_eq!(pod.metadata.name.as_deref(), Some("site-echo"));
    assert_eq!(object::to_value(&pod).unwrap(), request.children[0]);
    let config: ConfigMap = object::typed(request.parent.as_ref().unwrap()).unwrap();
    assert_eq!(config.data.unwrap()["log-level"], "debug");
}

#[test]
fn a_misfit_names_the_object_type_and_field() {
    let request = request_from_yaml(&format!(
        "{CONFIG}{}",
        FAILED_CHILD.replace("restartCount: 0", "restartCount: lots")
    ));
    let err = typed::reconcile(&request, &FakeCluster::new()).unwrap_err();
    assert!(!err.retryable, "{err}");
    assert_eq!(
        err.message,
        "cannot read Pod demo/site-echo: \
         at `status.containerStatuses[0].restartCount`: \
         invalid type: string \"lots\", expected i32"
    );

    // k8s-openapi's types check the kind too.
    let parent = request.parent.as_ref().unwrap();
    let err = object::typed::<Pod>(parent).unwrap_err();
    assert_eq!(
        err.message,
        "cannot read ConfigMap demo/site as Pod: at the top level: \
         invalid value: string \"ConfigMap\", expected Pod"
    );
}
