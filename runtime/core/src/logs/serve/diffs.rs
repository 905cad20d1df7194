//! The `diffs` subresource: how a controller's candidate module (`spec.candidate`) answered
//! differently from its live module on the last reconciles compared
//! ([`crate::host::shadow`]), for its team (`kubewasm rollout diff`). What a candidate would
//! have written can hold what it read, Secrets included: RBAC gives
//! `wasmcontrollers/diffs` to `edit` and `admin`, as it gives capsules (deploy/runtime/logs.yaml).

use std::sync::Arc;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;

use super::{Conn, Shared};
use crate::logs::ControllerKey;

/// Answers the differences kept of `key` (an empty list when it compares nothing here).
pub fn handle(
    shared: Arc<Shared>,
    _conn: Conn,
    key: ControllerKey,
    _query: Option<String>,
) -> BoxFuture<'static, Response> {
    Box::pin(async move {
        let id = key.id();
        let body = shared.kept.shadows.of(&id).unwrap_or_else(|| {
            serde_json::json!({
                "apiVersion": "kubewasm.dev/v1alpha1",
                "kind": crate::host::shadow::DIFF_LIST_KIND,
                "controller": id,
                "compared": 0,
                "differing": 0,
                "items": [],
            })
        });
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    })
}
