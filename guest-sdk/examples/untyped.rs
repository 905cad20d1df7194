//! The JSON twin of `typed.rs`: for each ConfigMap it keeps a Pod `<name>-echo` that echoes
//! `data.greeting` with every data entry in its environment, and it reports each failed
//! child Pod with a Warning Event — with `serde_json::Value` and the SDK's `object` helpers.

use kubewasm_guest_sdk::{Cluster, Error, EventType, Request, Response, object};
use serde_json::{Value, json};

/// The Pod for one ConfigMap, and a Warning for each of its Pods that failed.
pub fn reconcile(req: &Request, _cluster: &dyn Cluster) -> Result<Response, Error> {
    let Some(parent) = &req.parent else {
        return Ok(Response::new());
    };
    let data = parent.get("data").and_then(Value::as_object);
    let greeting = data
        .and_then(|d| d.get("greeting"))
        .and_then(Value::as_str)
        .unwrap_or("hello");
    let env: Vec<Value> = data
        .into_iter()
        .flatten()
        .filter_map(|(key, value)| {
            let name = key.to_uppercase().replace(['-', '.'], "_");
            Some(json!({ "name": name, "value": value.as_str()? }))
        })
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
