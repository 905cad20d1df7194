//! A guest written with k8s-openapi's types: for each ConfigMap it keeps a Pod `<name>-echo`
//! that echoes `data.greeting` with every data entry in its environment, and it reports each
//! failed child Pod with a Warning Event. `untyped.rs` does the same with JSON; the two are
//! built side by side by `make guest-size-typed` and compared in `tests/typed.rs`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kubewasm_guest_sdk::{Cluster, Error, EventType, Request, Response, object};

/// The Pod for one ConfigMap, and a Warning for each of its Pods that failed.
pub fn reconcile(req: &Request, _cluster: &dyn Cluster) -> Result<Response, Error> {
    let Some(parent) = &req.parent else {
        return Ok(Response::new());
    };
    let config: ConfigMap = object::typed(parent)?;
    let data = config.data.unwrap_or_default();
    let greeting = data.get("greeting").map_or("hello", String::as_str);
    let env = data
        .iter()
        .map(|(key, value)| EnvVar {
            name: key.to_uppercase().replace(['-', '.'], "_"),
            value: Some(value.clone()),
            ..EnvVar::default()
        })
        .collect();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(format!("{}-echo", req.target.name)),
            namespace: config.metadata.namespace,
            labels: Some(BTreeMap::from([("app".to_string(), "echo".to_string())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".to_string()),
            containers: vec![Container {
                name: "echo".to_string(),
                image: Some("busybox".to_string()),
                command: Some(vec!["echo".to_string(), greeting.to_string()]),
                env: Some(env),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let mut response = Response::new().apply(object::to_value(&pod)?);
    for child in req.children_of("v1", "Pod") {
        let child: Pod = object::typed(child)?;
        let Some(status) = child.status else { continue };
        if status.phase.as_deref() != Some("Failed") {
            continue;
        }
        let reason = status
            .container_statuses
            .unwrap_or_default()
            .into_iter()
            .find_map(|c| c.state?.terminated?.reason)
            .unwrap_or_else(|| "unknown".to_string());
        let name = child.metadata.name.unwrap_or_default();
        response = response.event(
            EventType::Warning,
            "PodFailed",
            format!("Pod {name} failed: {reason}"),
        );
    }
    Ok(response)
}

kubewasm_guest_sdk::export_reconciler!(reconcile);
