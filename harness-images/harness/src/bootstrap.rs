//! Warm-pool bootstrap (Kubernetes `SandboxWarmPool`): a pod started before any session exists
//! holds no session settings, no stubs and no `HARNESS_AUTH_TOKEN`. With
//! `LAP_HARNESS_BOOTSTRAP_TOKEN` set (and no `HARNESS_AUTH_TOKEN`), the harness first serves only:
//!
//! - `GET /healthz` → `200 {"status":"ok","phase":"waiting_for_session"}` (the warm pod is Ready,
//!   so a `SandboxClaim` can adopt it);
//! - `PUT /session` `{"env": {NAME: value, …}}` behind `Authorization: Bearer <bootstrap token>`
//!   (the pool's, compared in constant time) → `202`, once.
//!
//! The control plane sends `/session` only after the vault has its session's secrets
//! (`PUT /secrets` on the vault's admin port answered), so nothing that runs after it can reach
//! the vault before the secrets are in. The harness then replaces itself (`exec`) with the same
//! binary and this environment plus the session's, without `LAP_HARNESS_BOOTSTRAP_TOKEN`: the
//! agent never sees the pool's token, and the rest of start-up is the ordinary one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use subtle::ConstantTimeEq;
use tokio::sync::oneshot;

/// The variable holding the pool's bootstrap token.
pub const TOKEN_VAR: &str = "LAP_HARNESS_BOOTSTRAP_TOKEN";
/// The phase `/healthz` reports while waiting.
pub const WAITING: &str = "waiting_for_session";

/// `PUT /session` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionIn {
    pub env: BTreeMap<String, String>,
}

/// Why a session's environment is refused (answered as `422`).
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), String> {
    if !env.contains_key("HARNESS_AUTH_TOKEN") {
        return Err("env.HARNESS_AUTH_TOKEN is required".into());
    }
    for k in env.keys() {
        let ok_name = !k.is_empty()
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !k.as_bytes()[0].is_ascii_digit();
        if !ok_name {
            return Err(format!("env.{k}: not a variable name"));
        }
        // What the pod spec fixes (proxies, CA bundles, ports, the pool token) or what would
        // change how programs load: never from a session.
        let upper = k.to_ascii_uppercase();
        let reserved = upper.ends_with("_PROXY")
            || upper.starts_with("LD_")
            || matches!(
                upper.as_str(),
                "PATH"
                    | "HOME"
                    | "PORT"
                    | "NODE_EXTRA_CA_CERTS"
                    | "SSL_CERT_FILE"
                    | "SSL_CERT_DIR"
                    | "REQUESTS_CA_BUNDLE"
                    | "CURL_CA_BUNDLE"
                    | "GIT_SSL_CAINFO"
                    | "CARGO_HTTP_CAINFO"
                    | "CODEX_CA_CERTIFICATE"
                    | "NODE_OPTIONS"
                    | "LAP_HARNESS_HOST"
                    | "LAP_HARNESS_SOCKET"
            )
            || upper == TOKEN_VAR;
        if reserved {
            return Err(format!("env.{k}: set by the pod, not by a session"));
        }
    }
    Ok(())
}

struct Waiting {
    token: String,
    done: Mutex<Option<oneshot::Sender<BTreeMap<String, String>>>>,
}

fn json_error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

async fn put_session(State(w): State<Arc<Waiting>>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if !bool::from(given.as_bytes().ct_eq(w.token.as_bytes())) {
        return json_error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
    }
    let req: SessionIn = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, format!("body: {e}")),
    };
    if let Err(e) = check_env(&req.env) {
        return json_error(StatusCode::UNPROCESSABLE_ENTITY, e);
    }
    let Some(tx) = w.done.lock().ok().and_then(|mut d| d.take()) else {
        return json_error(StatusCode::CONFLICT, "this harness already has its session");
    };
    let _ = tx.send(req.env);
    (
        StatusCode::ACCEPTED,
        [(header::CONNECTION, "close")],
        Json(serde_json::json!({ "status": "starting" })),
    )
        .into_response()
}

/// The bootstrap router and the receiver of the session's environment.
pub fn router(token: String) -> (Router, oneshot::Receiver<BTreeMap<String, String>>) {
    let (tx, rx) = oneshot::channel();
    let w = Arc::new(Waiting {
        token,
        done: Mutex::new(Some(tx)),
    });
    let r = Router::new()
        .route(
            "/healthz",
            get(|| async { Json(serde_json::json!({ "status": "ok", "phase": WAITING })) }),
        )
        .route("/session", put(put_session))
        .with_state(w);
    (r, rx)
}

/// Serve `/healthz` and `/session` on `listener` until a session arrives; its environment.
pub async fn wait(listener: tokio::net::TcpListener, token: String) -> std::io::Result<BTreeMap<String, String>> {
    let (app, rx) = router(token);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let got = Arc::new(Mutex::new(None));
    let keep = Arc::clone(&got);
    let waiter = tokio::spawn(async move {
        if let Ok(env) = rx.await {
            if let Ok(mut g) = keep.lock() {
                *g = Some(env);
            }
        }
        let _ = stop_tx.send(());
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop_rx.await;
        })
        .await?;
    let _ = waiter.await;
    let env = got.lock().ok().and_then(|mut g| g.take());
    env.ok_or_else(|| std::io::Error::other("the bootstrap server stopped without a session"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn session_env_is_checked() {
        check_env(&env(&[
            ("HARNESS_AUTH_TOKEN", "t"),
            ("ANTHROPIC_API_KEY", "sk-ant-stub"),
            ("REPO_URL", "x"),
        ]))
        .unwrap();
        assert!(check_env(&env(&[("REPO_URL", "x")]))
            .unwrap_err()
            .contains("HARNESS_AUTH_TOKEN"));
        for bad in [
            "HTTPS_PROXY",
            "https_proxy",
            "LD_PRELOAD",
            "PATH",
            TOKEN_VAR,
            "NODE_OPTIONS",
            "1X",
            "A-B",
        ] {
            assert!(
                check_env(&env(&[("HARNESS_AUTH_TOKEN", "t"), (bad, "x")])).is_err(),
                "{bad}"
            );
        }
    }
}
