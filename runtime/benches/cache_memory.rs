//! Cache memory: bytes the runtime holds per byte charged to a namespace's cache account.
//!
//! `--max-cached-bytes-per-namespace` and `--max-cached-bytes` count each object's weight
//! (`Cached::weight`: its text, its decoded metadata and the cache entry, estimated); the process
//! holds the object as a watch caches it (`controller::Cached`: a few metadata fields decoded, the
//! whole object as the JSON text a guest is handed, without managedFields). For object shapes a
//! tenant controls this bench decodes `N` objects as the watch does and prints the bytes allocated
//! (a counting global allocator) per byte weighed, so that the memory budget of
//! docs/06-security-model.md is a product of measured factors — and, beside it, what the same
//! objects took as they were cached before (kube's `DynamicObject` and, once handed to a guest, its
//! text).
//!
//! `make bench-cache` (`cargo test -p kubewasm --bench cache_memory -- N`, default 1000). No
//! cluster and no timing: allocations are counted, the same in any profile.

use std::alloc::System;
use std::sync::Arc;

use kube::api::{ApiResource, DynamicObject};
use kubewasm::controller::Cached;
use serde_json::{Value, json};

#[global_allocator]
static ALLOCATOR: cap::Cap<System> = cap::Cap::new(System, usize::MAX);

/// managedFields as the API server writes them for an object applied by kubectl.
fn managed_fields(fields: Value) -> Value {
    json!([{"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "v1",
        "time": "2026-11-25T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": fields}])
}

fn metadata(name: &str, i: usize, annotations: Value, fields: Value) -> Value {
    json!({"name": format!("{name}-{i}"), "namespace": "tenant",
        "uid": format!("7d0c1a2e-5b7e-4c55-9a7f-{i:012}"), "resourceVersion": format!("{}", 100_000 + i),
        "creationTimestamp": "2026-11-25T10:00:00Z", "labels": {"app": name, "tier": "backend"},
        "annotations": annotations, "managedFields": managed_fields(fields)})
}

/// The shapes: what the e2e hoarder stores, a ConfigMap of many small keys, and a Pod.
fn shapes(i: usize) -> Vec<(&'static str, Value)> {
    let annotation = "x".repeat(200 << 10);
    let data: serde_json::Map<String, Value> = (0..100)
        .map(|k| (format!("key-{k}"), Value::String("v".repeat(1000))))
        .collect();
    let conditions: Vec<Value> = ["Initialized", "Ready", "ContainersReady", "PodScheduled"]
        .iter()
        .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": "2026-11-25T10:00:02Z"}))
        .collect();
    let env: Vec<Value> = (0..20)
        .map(|e| json!({"name": format!("ENV_{e}"), "value": format!("value-{e}")}))
        .collect();
    let pod_spec = json!({"containers": [{"name": "app", "image": "registry.example/app:1.2.3",
        "args": ["--port=8080", "--log-format=json"],
        "env": env,
        "ports": [{"containerPort": 8080, "protocol": "TCP", "name": "http"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"}],
        "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default", "nodeName": "node-1", "schedulerName": "default-scheduler",
        "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}],
        "volumes": [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}]});
    let pod_status = json!({"phase": "Running", "podIP": "10.0.0.12", "hostIP": "192.168.1.10",
        "startTime": "2026-11-25T10:00:01Z", "qosClass": "Burstable",
        "conditions": conditions,
        "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "started": true,
            "image": "registry.example/app:1.2.3", "imageID": "registry.example/app@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "containerID": "containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "state": {"running": {"startedAt": "2026-11-25T10:00:02Z"}}}]});
    vec![
        (
            "ConfigMap, one 200 KiB annotation",
            json!({"metadata": metadata("hoard", i, json!({"hoard": annotation}), json!({"f:metadata": {"f:annotations": {".": {}, "f:hoard": {}}}})),
                "data": {}}),
        ),
        (
            "ConfigMap, 100 keys of 1,000 B",
            json!({"metadata": metadata("settings", i, json!({}), json!({"f:data": {}})), "data": data}),
        ),
        (
            "Pod, kubelet-reported, ~3 KB",
            json!({"metadata": metadata("app", i, json!({"kubectl.kubernetes.io/restartedAt": "2026-11-25T09:59:00Z"}),
                json!({"f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:image": {}, "f:name": {}}}}})),
                "spec": pod_spec, "status": pod_status}),
        ),
    ]
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(1000);
    let kinds = shapes(0).len();
    println!("cache memory per byte weighed (N = {n} objects per shape)");
    for k in 0..kinds {
        let texts: Vec<(String, String)> = (0..n)
            .map(|i| {
                let (name, v) = shapes(i).swap_remove(k);
                (name.to_owned(), v.to_string())
            })
            .collect();
        let name = texts[0].0.clone();
        let json: usize = texts.iter().map(|(_, t)| t.len()).sum();
        let before = ALLOCATOR.allocated();
        let objects: Vec<Arc<DynamicObject>> = texts
            .iter()
            .map(|(_, t)| Arc::new(serde_json::from_str(t).expect("a valid object")))
            .collect();
        let made: Vec<Arc<str>> = objects
            .iter()
            .map(|o| Arc::from(serde_json::to_string(o.as_ref()).expect("serializes")))
            .collect();
        let old = ALLOCATOR.allocated() - before;
        drop((objects, made));
        let resource = kind_of(&name);
        let before = ALLOCATOR.allocated();
        let cached: Vec<Arc<Cached>> = texts
            .iter()
            .map(|(_, t)| {
                let mut c: Cached = serde_json::from_str(t).expect("a valid object");
                c.set_type(&resource);
                Arc::new(c)
            })
            .collect();
        let now = ALLOCATOR.allocated() - before;
        let weight: u64 = cached.iter().map(|o| o.weight()).sum();
        println!(
            "  {name:<36} JSON {:>7.1} KiB, weighed {:>7.1} KiB each: cached {:.2} B per byte weighed, {:.2} per byte of JSON (before: DynamicObject and its text, {:.2} per byte of JSON, {:.1} KiB each)",
            json as f64 / n as f64 / 1024.0,
            weight as f64 / n as f64 / 1024.0,
            now as f64 / weight as f64,
            now as f64 / json as f64,
            old as f64 / json as f64,
            old as f64 / n as f64 / 1024.0,
        );
        drop(cached);
    }
}

/// The API resource of a shape (only its names are used).
fn kind_of(shape: &str) -> ApiResource {
    let (kind, plural) = if shape.starts_with("Pod") {
        ("Pod", "pods")
    } else {
        ("ConfigMap", "configmaps")
    };
    ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}
