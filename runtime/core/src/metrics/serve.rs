//! `/metrics`, `/healthz` and `/readyz` over HTTP (axum).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::{MANAGER_STALL_LIMIT, Metrics};

async fn metrics_text(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.encode(),
    )
}

async fn healthz(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    match m.unhealthy(MANAGER_STALL_LIMIT) {
        None => (StatusCode::OK, "ok\n".to_owned()),
        Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

async fn readyz(State(m): State<Arc<Metrics>>) -> impl IntoResponse {
    if m.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet\n")
    }
}

/// Binds `addr` and serves `/metrics`, `/healthz` and `/readyz` in the background.
/// Returns the bound address (useful with port 0).
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(metrics);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("metrics server stopped: {e}");
        }
    });
    Ok(bound)
}
