//! The admin port. Open: `GET /healthz`, `GET /readyz`, `GET /ca.pem`, `GET /metrics`.
//! Behind `Authorization: Bearer <admin token>` (compared in constant time; the token is
//! `admin_token_file`'s, or one generated at start and written where the log says):
//! `GET /interceptions` (last 1000 audit events; `?after=<seq>` for those numbered above it),
//! `POST /reload`, and the secrets the sidecar
//! is given at run time, without a file holding real values:
//!
//! - `PUT /secrets` `{"secrets":[{name, stub, value, hosts, locations?}, …]}`: replace them all;
//! - `PUT /secrets/{name}` `{stub?, value, hosts, locations?}`: add or rotate one (an existing
//!   secret keeps its stub when none is given);
//! - `DELETE /secrets/{name}`: revoke one.
//!
//! Each answers `{"secrets": n}` (how many the admin API now manages), `422` with every problem
//! (`{"error", "problems": [...]}`) and the previous set still in force, or `404`. Requests in
//! flight finish with the snapshot they started with.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use tokio::net::TcpListener;

use crate::config::{SecretSpec, SecretsFile};
use crate::proxy::{AdminToken, Proxy, SecretsChangeError};

/// Serve the admin API on `listener` until the process ends.
pub(crate) async fn serve(proxy: Arc<Proxy>, listener: TcpListener) {
    if let Err(e) = axum::serve(listener, router(proxy)).await {
        tracing::error!(error = %e, "admin server stopped");
    }
}

/// The admin router (exposed for router tests).
pub(crate) fn router(proxy: Arc<Proxy>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/ca.pem", get(ca_pem))
        .route("/metrics", get(metrics))
        .route("/interceptions", get(interceptions))
        .route("/reload", post(reload))
        .route("/secrets", put(replace_secrets))
        .route("/secrets/{name}", put(upsert_secret).delete(remove_secret))
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

fn json_error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

/// `None` when authorised, else the `401` (or `503`) to send. Without any token configured or
/// generated (a library embedding that never ran [`crate::proxy::run`]) nothing is authorised.
fn check_token(proxy: &Proxy, headers: &HeaderMap) -> Option<Response> {
    let expected = match proxy.admin_token() {
        Some(AdminToken::Generated { token, .. }) => token,
        Some(AdminToken::File(path)) => match std::fs::read_to_string(&path) {
            Ok(t) => t.trim().to_owned(),
            Err(e) => {
                tracing::error!(error = %e, "cannot read admin_token_file");
                return Some(json_error(StatusCode::SERVICE_UNAVAILABLE, "admin token unavailable"));
            }
        },
        None => return Some(json_error(StatusCode::UNAUTHORIZED, "no admin token is configured")),
    };
    if expected.is_empty() {
        return Some(json_error(StatusCode::SERVICE_UNAVAILABLE, "admin token unavailable"));
    }
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

/// `?after=<seq>`: only the events numbered above it (the reader's cursor).
#[derive(Debug, Deserialize)]
struct After {
    #[serde(default)]
    after: u64,
}

async fn interceptions(
    State(proxy): State<Arc<Proxy>>,
    headers: HeaderMap,
    after: Result<axum::extract::Query<After>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if let Some(denied) = check_token(&proxy, &headers) {
        return denied;
    }
    let after = match after {
        Ok(q) => q.0.after,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, format!("after: {}", e.body_text())),
    };
    (
        [("x-audit-run", proxy.audit.run().to_owned())],
        axum::Json(proxy.audit.after(after)),
    )
        .into_response()
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

/// `PUT /secrets/{name}` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretBody {
    #[serde(default)]
    stub: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    locations: Option<Vec<String>>,
}

fn change_answer(result: Result<usize, SecretsChangeError>) -> Response {
    match result {
        Ok(n) => Json(serde_json::json!({ "secrets": n })).into_response(),
        Err(SecretsChangeError::NotFound(name)) => json_error(
            StatusCode::NOT_FOUND,
            format!("no secret `{name}` is managed by the admin API"),
        ),
        Err(SecretsChangeError::Invalid(e)) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(serde_json::json!({
                "error": "secrets change rejected; the previous secrets stay in force",
                "problems": e.0.iter().map(ToString::to_string).collect::<Vec<_>>(),
            })),
        )
            .into_response(),
    }
}

fn bad_body(e: &JsonRejection) -> Response {
    json_error(e.status(), format!("bad request body: {}", e.body_text()))
}

async fn replace_secrets(
    State(proxy): State<Arc<Proxy>>,
    headers: HeaderMap,
    body: Result<Json<SecretsFile>, JsonRejection>,
) -> Response {
    if let Some(denied) = check_token(&proxy, &headers) {
        return denied;
    }
    let Json(file) = match body {
        Ok(b) => b,
        Err(e) => return bad_body(&e),
    };
    change_answer(proxy.replace_secrets(file.secrets))
}

async fn upsert_secret(
    State(proxy): State<Arc<Proxy>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Json<SecretBody>, JsonRejection>,
) -> Response {
    if let Some(denied) = check_token(&proxy, &headers) {
        return denied;
    }
    let Json(b) = match body {
        Ok(b) => b,
        Err(e) => return bad_body(&e),
    };
    let spec = SecretSpec {
        name,
        stub: b.stub.unwrap_or_default(),
        value: b.value,
        hosts: b.hosts,
        locations: b.locations,
        ..SecretSpec::default()
    };
    change_answer(proxy.upsert_secret(spec))
}

async fn remove_secret(State(proxy): State<Arc<Proxy>>, Path(name): Path<String>, headers: HeaderMap) -> Response {
    if let Some(denied) = check_token(&proxy, &headers) {
        return denied;
    }
    change_answer(proxy.remove_secret(&name))
}
