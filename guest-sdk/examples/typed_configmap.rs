//! `untyped.rs` with one typed read: the parent as k8s-openapi's `ConfigMap`, the Pods (built
//! and read) as JSON — to show that the size cost follows the types a guest touches.

use k8s_openapi::api::core::v1::ConfigMap;
use kubewasm_guest_sdk::{Cluster, Error, EventType, Request, Response, object};
use serde_json::{Value, json};

/// The Pod for one ConfigMap, and a Warning for each of its Pods that failed.
pub fn reconcile(req: &Request, _cluster: &dyn Cluster) -> Result<Response, Error> {
    let Some(parent) = &req.parent else {
        return Ok(Response::new());
    };
    let config: ConfigMap = object::typed(parent)?;
    let data = config.data.unwrap_or_default();
    let greeting = data.get("greeting").map_or("hello", String::as_str);
    let env: Vec<Value> = data
        .iter()
        .map(|(key, value)| json!({ "name": key.to_uppercase().replace(['-', '.'], "_"), "value": value }))
        .collect();
    let pod = object::child_of(parent, "v1", "Pod", &format!("{}-echo", req.target.name))
        .label("app", "echo")
        .spec(json!({
            "restartPolicy": "Never",
            "containers": [{
                "name": "echo",
                "image": "busybox",
                "command": ["echo", greeting],
                "env": env,
            }],
        }));
    let mut response = Response::new().apply(pod);
    for child in req.children_of("v1", "Pod") {
        if child.pointer("/status/phase").and_then(Value::as_str) != Some("Failed") {
            continue;
        }
        let reason = child
            .pointer("/status/containerStatuses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find_map(|c| c.pointer("/state/terminated/reason")?.as_str())
            .unwrap_or("unknown");
        let name = object::name(child).unwrap_or_default();
        response = response.event(
            EventType::Warning,
            "PodFailed",
            format!("Pod {name} failed: {reason}"),
        );
    }
    Ok(response)
}

kubewasm_guest_sdk::export_reconciler!(reconcile);
