//! The paths of `logs.kubewasm.dev/v1alpha1`: discovery, and the subresources of a
//! controller, each one entry of [`SUBRESOURCES`] (a name and a handler), checked the same
//! way before its handler runs: the front proxy, the user, RBAC, then the controller's
//! existence. A request that fails a check learns nothing of the controller.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::future::BoxFuture;
use serde_json::json;

use super::{Ask, Conn, GROUP, Shared};
use crate::api::{ClusterWasmController, WasmController};
use crate::logs::ControllerKey;

/// The version served.
pub const VERSION: &str = "v1alpha1";

/// What a subresource's handler is handed once the request is authorized: the server, the
/// connection, the controller (which exists) and the query string.
pub type Handler =
    fn(Arc<Shared>, Conn, ControllerKey, Option<String>) -> BoxFuture<'static, Response>;

/// A subresource of `wasmcontrollers` and `clusterwasmcontrollers`.
#[derive(Debug, Clone, Copy)]
pub struct Subresource {
    /// Its name in the path (`log`).
    pub name: &'static str,
    pub handle: Handler,
}

/// Every subresource served; discovery lists them, RBAC names them (`wasmcontrollers/log`).
pub const SUBRESOURCES: &[Subresource] = &[
    Subresource {
        name: "log",
        handle: super::log::handle,
    },
    Subresource {
        name: "capsules",
        handle: super::capsules::handle,
    },
    Subresource {
        name: "diffs",
        handle: super::diffs::handle,
    },
];

type Ctx = (Arc<Shared>, Conn);

pub(super) fn router(shared: Arc<Shared>, conn: Conn) -> Router {
    let base = format!("/apis/{GROUP}/{VERSION}");
    Router::new()
        .route("/apis", get(groups))
        .route(&format!("/apis/{GROUP}"), get(group))
        .route(&base, get(resources))
        .route(
            &format!("{base}/namespaces/{{namespace}}/wasmcontrollers/{{name}}/{{sub}}"),
            get(namespaced),
        )
        .route(
            &format!("{base}/clusterwasmcontrollers/{{name}}/{{sub}}"),
            get(cluster),
        )
        .fallback(not_found)
        .with_state((shared, conn))
}

/// A Kubernetes `Status` answer.
pub fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, json_response(body)).into_response()
}

fn json_response(value: serde_json::Value) -> Response {
    let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
    (json, value.to_string()).into_response()
}

fn unauthorized() -> Response {
    status(
        StatusCode::UNAUTHORIZED,
        "Unauthorized",
        "this server answers the Kubernetes API server's front proxy only: use `kubewasm logs` or kubectl, through the API server",
    )
}

async fn not_found(State((_, conn)): State<Ctx>) -> Response {
    if !conn.front_proxy {
        return unauthorized();
    }
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn group_json() -> serde_json::Value {
    let version = json!({"groupVersion": format!("{GROUP}/{VERSION}"), "version": VERSION});
    json!({"name": GROUP, "versions": [version], "preferredVersion": version})
}

async fn groups(State((_, conn)): State<Ctx>) -> Response {
    if !conn.front_proxy {
        return unauthorized();
    }
    let mut group = group_json();
    group["kind"] = json!("APIGroup");
    json_response(json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]}))
        .into_response()
}

async fn group(State((_, conn)): State<Ctx>) -> Response {
    if !conn.front_proxy {
        return unauthorized();
    }
    let mut group = group_json();
    group["kind"] = json!("APIGroup");
    group["apiVersion"] = json!("v1");
    json_response(group).into_response()
}

async fn resources(State((_, conn)): State<Ctx>) -> Response {
    if !conn.front_proxy {
        return unauthorized();
    }
    let mut list = Vec::new();
    for sub in SUBRESOURCES {
        for (resource, kind, namespaced) in [
            ("wasmcontrollers", "WasmController", true),
            ("clusterwasmcontrollers", "ClusterWasmController", false),
        ] {
            list.push(json!({
                "name": format!("{resource}/{}", sub.name), "singularName": "",
                "namespaced": namespaced, "kind": kind, "verbs": ["get"],
            }));
        }
    }
    json_response(json!({
        "kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": format!("{GROUP}/{VERSION}"), "resources": list,
    }))
    .into_response()
}

async fn namespaced(
    State((shared, conn)): State<Ctx>,
    Path((namespace, name, sub)): Path<(String, String, String)>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let ask = Ask {
        resource: "wasmcontrollers",
        subresource: sub,
        namespace: Some(namespace),
        name,
    };
    serve(shared, conn, ask, &headers, uri.query()).await
}

async fn cluster(
    State((shared, conn)): State<Ctx>,
    Path((name, sub)): Path<(String, String)>,
    headers: HeaderMap,
    uri: Uri,
) -> Response {
    let ask = Ask {
        resource: "clusterwasmcontrollers",
        subresource: sub,
        namespace: None,
        name,
    };
    serve(shared, conn, ask, &headers, uri.query()).await
}

/// The front proxy, the user, RBAC, the controller's existence; then the handler.
async fn serve(
    shared: Arc<Shared>,
    conn: Conn,
    ask: Ask,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Response {
    if !conn.front_proxy {
        return unauthorized();
    }
    let Some(user) = shared.proxy.user(headers) else {
        return unauthorized();
    };
    let what = format!("{}.{GROUP} {:?}", ask.resource, ask.name);
    let Some(sub) = SUBRESOURCES.iter().find(|s| s.name == ask.subresource) else {
        let served: Vec<&str> = SUBRESOURCES.iter().map(|s| s.name).collect();
        let message = format!(
            "{what} has no subresource {:?}: served are {}",
            ask.subresource,
            served.join(", ")
        );
        return status(StatusCode::NOT_FOUND, "NotFound", &message);
    };
    match shared.reviews.allowed(&user, &ask).await {
        Ok(true) => {}
        Ok(false) => {
            let place = match &ask.namespace {
                Some(ns) => format!("in the namespace {ns:?}"),
                None => "at the cluster scope".to_owned(),
            };
            let message = format!(
                "{what} is forbidden: User {:?} cannot get resource \"{}/{}\" in API group {GROUP:?} {place}: an admin of that namespace grants it (the built-in view, edit and admin roles include it once deploy/runtime/logs.yaml is installed)",
                user.name, ask.resource, ask.subresource
            );
            return status(StatusCode::FORBIDDEN, "Forbidden", &message);
        }
        Err(e) => {
            tracing::warn!("log server: a SubjectAccessReview failed: {e}");
            let message = "could not ask the API server whether the user may read this (SubjectAccessReview failed): try again";
            return status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                message,
            );
        }
    }
    match exists(&shared.client, &ask).await {
        Ok(true) => {}
        Ok(false) => {
            let message = format!("{what} not found");
            return status(StatusCode::NOT_FOUND, "NotFound", &message);
        }
        Err(e) => {
            tracing::warn!("log server: reading a controller failed: {e}");
            let message = "could not read the controller from the API server: try again";
            return status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                message,
            );
        }
    }
    let key = ControllerKey {
        namespace: ask.namespace,
        name: ask.name,
    };
    if !shared.runs_here(&key) {
        // Another replica runs it: the API server picks a replica per request (and the
        // connection is closed, so that a Service's next connection may reach another).
        let message = format!(
            "{what} runs on another replica of the runtime, not on the one this request reached: try again (kubewasm logs does by itself)"
        );
        let mut response = status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            &message,
        );
        let headers = response.headers_mut();
        headers.insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        headers.insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("1"),
        );
        return response;
    }
    (sub.handle)(shared, conn, key, query.map(str::to_owned)).await
}

async fn exists(client: &kube::Client, ask: &Ask) -> Result<bool, kube::Error> {
    let get = async {
        match &ask.namespace {
            Some(ns) => kube::Api::<WasmController>::namespaced(client.clone(), ns)
                .get_metadata_opt(&ask.name)
                .await
                .map(|o| o.is_some()),
            None => kube::Api::<ClusterWasmController>::all(client.clone())
                .get_metadata_opt(&ask.name)
                .await
                .map(|o| o.is_some()),
        }
    };
    match tokio::time::timeout(std::time::Duration::from_secs(10), get).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service("timed out after 10s".into())),
    }
}
