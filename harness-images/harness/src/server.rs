//! The harness's HTTP server: `GET /healthz`, `POST /message`, `POST /message_stream`, all but
//! `/healthz` behind `Authorization: Bearer <HARNESS_AUTH_TOKEN>`. Messages run one at a time.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::convert::Infallible;

use futures_util::stream;
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::agent::{self, AgentKind};

/// What the server needs.
#[derive(Debug)]
pub struct Harness {
    pub kind: AgentKind,
    pub harness_id: String,
    pub bin: PathBuf,
    pub token: String,
    pub model: Option<String>,
    pub prompt: Option<String>,
    /// The conversation to resume; the lock also serialises messages.
    pub conversation: Mutex<Option<String>>,
}

#[derive(Debug, Deserialize)]
struct MessageIn {
    text: String,
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

/// The router.
pub fn router(h: Arc<Harness>) -> Router {
    let authed = Router::new()
        .route("/message", post(message))
        .route("/message_stream", post(message_stream))
        .route_layer(middleware::from_fn_with_state(h.clone(), require_token));
    Router::new()
        .route("/healthz", get(healthz))
        .merge(authed)
        .with_state(h)
}

async fn require_token(State(h): State<Arc<Harness>>, req: Request, next: Next) -> Response {
    use subtle::ConstantTimeEq;
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let ok = presented.len() == h.token.len() && bool::from(presented.as_bytes().ct_eq(h.token.as_bytes()));
    if ok {
        next.run(req).await
    } else {
        error(StatusCode::UNAUTHORIZED, "missing or wrong harness token")
    }
}

async fn healthz(State(h): State<Arc<Harness>>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "status": "ok", "harness_id": h.harness_id }))
}

async fn run(
    h: &Harness,
    text: &str,
    events: Option<tokio::sync::mpsc::UnboundedSender<String>>,
) -> Result<String, agent::AgentError> {
    let mut conv = h.conversation.lock().await;
    let (model, prompt) = (h.model.as_deref(), h.prompt.as_deref());
    let reply = agent::run_once(h.kind, &h.bin, text, conv.as_deref(), model, prompt, events).await?;
    if reply.conversation.is_some() {
        *conv = reply.conversation.clone();
    }
    Ok(reply.text)
}

async fn message(State(h): State<Arc<Harness>>, Json(m): Json<MessageIn>) -> Response {
    match run(&h, &m.text, None).await {
        Ok(text) => Json(serde_json::json!({ "parts": [{ "type": "text", "text": text }] })).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "message failed");
            error(StatusCode::BAD_GATEWAY, e.to_string())
        }
    }
}

/// SSE: an `agent` event per line the CLI prints (its own JSON events), then a `message`
/// event with the parts, or an `error` event.
async fn message_stream(State(h): State<Arc<Harness>>, Json(m): Json<MessageIn>) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
    tokio::spawn(async move {
        let (line_tx, mut line_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let forward_tx = tx.clone();
        let forward = tokio::spawn(async move {
            while let Some(line) = line_rx.recv().await {
                let _ = forward_tx.send(Event::default().event("agent").data(line));
            }
        });
        let result = run(&h, &m.text, Some(line_tx)).await;
        let _ = forward.await;
        let ev = match result {
            Ok(t) => Event::default()
                .event("message")
                .json_data(serde_json::json!({ "parts": [{ "type": "text", "text": t }] })),
            Err(e) => Event::default()
                .event("error")
                .json_data(serde_json::json!({ "error": e.to_string() })),
        };
        let _ = tx.send(ev.unwrap_or_else(|_| Event::default().event("error")));
    });
    let stream = stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}
