//! The `capsules` subresource: a controller's last failed reconciles
//! ([`crate::host::capsules`]), as one JSON list, for its team to replay offline
//! (`kubewasm capsules`, then `kubewasm reconcile --capsule`). What a capsule holds its
//! ServiceAccount could read, Secrets included: RBAC gives `wasmcontrollers/capsules` to
//! `edit` and `admin` only (deploy/runtime/logs.yaml), not to `view`, which reads no Secret.

use std::sync::Arc;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;

use super::{Conn, Shared};
use crate::logs::ControllerKey;

/// The `kind` of the answer.
pub const LIST_KIND: &str = "ReconcileCapsuleList";

/// Answers the capsules of `key` (none: an empty list), oldest first.
pub fn handle(
    shared: Arc<Shared>,
    _conn: Conn,
    key: ControllerKey,
    _query: Option<String>,
) -> BoxFuture<'static, Response> {
    Box::pin(async move {
        let id = key.id();
        let capsules = shared.kept.capsules.of(&id);
        // Each capsule is a JSON document already (the runtime made it): joined, not re-parsed.
        let mut body =
            format!(r#"{{"apiVersion":"kubewasm.dev/v1alpha1","kind":"{LIST_KIND}","items":["#)
                .into_bytes();
        for (i, capsule) in capsules.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(capsule);
        }
        body.extend_from_slice(b"]}");
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    })
}
