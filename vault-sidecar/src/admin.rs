//! The admin port: `GET /healthz`, `GET /readyz`, `GET /ca.pem`, `GET /metrics`,
//! `GET /interceptions` (last 1000 audit events) and `POST /reload`.
//!
//! With `admin_token_file` set, `/interceptions` and `/reload` need `Authorization: Bearer <token>`
//! (compared in constant time).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;

use crate::proxy::Proxy;

/// Serve the admin API on `listener` until the process ends.
pub async fn serve(proxy: Arc<Proxy>, listener: TcpListener) {
    if let Err(e) = axum::serve(listener, router(proxy)).await {
        tracing::error!(error = %e, "admin server stopped");
    }
}

/// The admin router (exposed for router tests).
pub fn router(proxy: Arc<Proxy>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/ca.pem", get(ca_pem))
        .route("/metrics", get(metrics))
        .route("/interceptions", get(interceptions))
        .route("/reload", post(reload))
        .with_state(proxy)
}

async fn readyz(State(proxy): State<Arc<Proxy>>) -> Response {
    if proxy.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}

async fn ca_pem(State(proxy): State<Arc<Proxy>>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/x-pem-file")],
        proxy.leaves.ca().pem().to_owned(),
    )
        .into_response()
}

async fn metrics(State(proxy): State<Arc<Proxy>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        proxy.metrics.encode(),
    )
        .into_response()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `None` when authorised, else the `401` to send.
fn check_token(proxy: &Proxy, headers: &HeaderMap) -> Option<Response> {
    let path = proxy.settings.admin_token_file.as_ref()?;
    let expected = match std::fs::read_to_string(path) {
        Ok(t) => t.trim().to_owned(),
        Err(e) => {
            tracing::error!(error = %e, "cannot read admin_token_file");
            return Some(
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    axum::Json(serde_json::json!({"error": "admin token unavailable"})),
                )
                    .into_response(),
            );
        }
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(given.trim().as_bytes(), expected.as_bytes()) {
        None
    } else {
        Some(
            (
                StatusCode::UNAUTHORIZED,
                axum::Json(serde_json::json!({"error": "missing or wrong bearer token"})),
            )
                .into_response(),
        )
    }
}

async fn interceptions(State(proxy): State<Arc<Proxy>>, headers: HeaderMap) -> Response {
    if let Some(denied) = check_token(&proxy, &headers) {
        return denied;
    }
    axum::Json(proxy.audit.snapshot()).into_response()
}

async fn reload(State(proxy): State<Arc<Proxy>>, headers: HeaderMap) -> Response {
    if let Some(denied) = check_token(&proxy, &headers) {
        return denied;
    }
    match proxy.reload() {
        Ok(n) => axum::Json(serde_json::json!({"reloaded": true, "secrets": n})).into_response(),
        Err(e) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(serde_json::json!({
                "error": "secrets reload rejected; the previous secrets stay in force",
                "problems": e.0.iter().map(ToString::to_string).collect::<Vec<_>>(),
            })),
        )
            .into_response(),
    }
}
