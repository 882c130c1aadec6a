//! The harness's HTTP server: `GET /healthz`, `POST /message`, `POST /message_stream`, `POST
//! /abort`, `POST /restart`, `GET /tty` (WebSocket, see [`crate::tty`]), all but `/healthz`
//! behind `Authorization: Bearer <HARNESS_AUTH_TOKEN>`. Messages run one at a time.

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::convert::Infallible;

use futures_util::{stream, SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::agent::{self, AgentKind};
use crate::bringup::Phase;
use crate::tty::{self, Control, Output, Size, Terminal};

/// What the server needs.
#[derive(Debug)]
pub struct Harness {
    pub kind: AgentKind,
    pub harness_id: String,
    pub bin: PathBuf,
    pub token: String,
    pub model: Option<String>,
    pub prompt: Option<String>,
    /// The agent's `tools[]` (`None`: every tool).
    pub tools: Option<Vec<String>>,
    /// The agent's remote MCP servers.
    pub mcp: Vec<agent::McpServer>,
    /// `OPENAI_BASE_URL` (see [`agent::RunSettings::openai_base_url`]).
    pub openai_base_url: Option<String>,
    /// The conversation to resume; the lock also serialises messages.
    pub conversation: Mutex<Option<String>>,
    /// The agent's TUI; `None` for harnesses without one (claude-agent-sdk).
    pub terminal: Option<Terminal>,
    /// Bring-up progress, reported by `/healthz`.
    pub phase: std::sync::RwLock<Phase>,
    /// Every agent event (one JSON line of the CLI's own stream) of every message, for `/events`.
    pub events: tokio::sync::broadcast::Sender<String>,
    /// Bumped by `POST /abort`: the running turn's CLI (and what it started) is killed.
    pub abort: tokio::sync::watch::Sender<u64>,
    /// This process's id on `/healthz` (`boot`): a restarted harness has another.
    pub boot: String,
    /// Notified by `POST /restart`: `main` stops serving and replaces the process.
    pub restart: tokio::sync::Notify,
}

impl Harness {
    pub fn set_phase(&self, p: Phase) {
        if let Ok(mut g) = self.phase.write() {
            *g = p;
        }
        tracing::info!(phase = p.as_str(), "bring-up phase");
    }

    fn current_phase(&self) -> Phase {
        self.phase.read().map(|g| *g).unwrap_or(Phase::HarnessListening)
    }
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
        .route("/abort", post(abort))
        .route("/restart", post(restart))
        .route("/tty", get(tty_upgrade))
        .route("/events", get(events))
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
    if !ok {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong harness token");
    }
    let phase = h.current_phase();
    if phase != Phase::HarnessListening {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the harness is still starting ({})", phase.as_str()),
        );
    }
    next.run(req).await
}

/// `200 {"status":"ok",…}` once serving; `503 {"status":"starting","phase":…}` during bring-up.
async fn healthz(State(h): State<Arc<Harness>>) -> Response {
    let phase = h.current_phase();
    if phase == Phase::HarnessListening {
        Json(serde_json::json!({ "status": "ok", "phase": phase.as_str(), "harness_id": h.harness_id, "boot": h.boot }))
            .into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "status": "starting", "phase": phase.as_str(), "harness_id": h.harness_id, "boot": h.boot })),
        )
            .into_response()
    }
}

/// Run one message. Each agent event goes to `/events` subscribers, and to `events` if given.
async fn run(
    h: &Harness,
    text: &str,
    events: Option<tokio::sync::mpsc::UnboundedSender<String>>,
) -> Result<String, agent::AgentError> {
    let mut conv = h.conversation.lock().await;
    // Only an abort sent from now on ends this turn.
    let abort = h.abort.subscribe();
    let settings = agent::RunSettings {
        model: h.model.as_deref(),
        prompt: h.prompt.as_deref(),
        tools: h.tools.as_deref(),
        mcp: &h.mcp,
        openai_base_url: h.openai_base_url.as_deref(),
    };
    let (tee_tx, mut tee_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let all = h.events.clone();
    let tee = tokio::spawn(async move {
        while let Some(line) = tee_rx.recv().await {
            if serde_json::from_str::<serde_json::Value>(&line).is_ok() {
                let _ = all.send(line.clone());
            }
            if let Some(tx) = &events {
                let _ = tx.send(line);
            }
        }
    });
    let reply = agent::run_once(
        h.kind,
        &h.bin,
        text,
        conv.as_deref(),
        &settings,
        Some(tee_tx),
        Some(abort),
    )
    .await;
    let _ = tee.await;
    let reply = reply?;
    if reply.conversation.is_some() {
        *conv = reply.conversation.clone();
    }
    Ok(reply.text)
}

async fn message(State(h): State<Arc<Harness>>, Json(m): Json<MessageIn>) -> Response {
    match run(&h, &m.text, None).await {
        Ok(text) => Json(serde_json::json!({ "parts": [{ "type": "text", "text": text }] })).into_response(),
        Err(e @ agent::AgentError::Aborted) => error(StatusCode::CONFLICT, e.to_string()),
        Err(e) => {
            tracing::warn!(error = %e, "message failed");
            error(StatusCode::BAD_GATEWAY, e.to_string())
        }
    }
}

/// `POST /abort`: end the running turn (its CLI and every command it started are killed; its
/// `/message` answers `409 {"error":"the turn was aborted"}`). `200 {"aborted": true}`, or
/// `{"aborted": false}` when no turn was running. The conversation so far is kept.
async fn abort(State(h): State<Arc<Harness>>) -> Response {
    let running = h.conversation.try_lock().is_err();
    if running {
        h.abort.send_modify(|g| *g = g.wrapping_add(1));
        tracing::info!("turn aborted");
    }
    Json(serde_json::json!({ "aborted": running })).into_response()
}

/// `POST /restart`: `202 {"status":"restarting"}`, then the running turn is aborted, the
/// terminal's agent stopped, and the harness replaced by a fresh one in the same sandbox (same
/// workspace, files kept; the conversation starts over). `/healthz` answers again once it serves.
async fn restart(State(h): State<Arc<Harness>>) -> Response {
    h.restart.notify_one();
    (
        StatusCode::ACCEPTED,
        Json(serde_json::json!({ "status": "restarting" })),
    )
        .into_response()
}

/// SSE, LAP's frames: `ready` (`{}`, the turn has started), a `harness_event` per line the CLI
/// prints (its own JSON events, as they are), then `done` with `{"parts": [...]}`, or `error`
/// with `{"error": "..."}`.
async fn message_stream(State(h): State<Arc<Harness>>, Json(m): Json<MessageIn>) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
    let _ = tx.send(Event::default().event("ready").data("{}"));
    tokio::spawn(async move {
        let (line_tx, mut line_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let forward_tx = tx.clone();
        let forward = tokio::spawn(async move {
            while let Some(line) = line_rx.recv().await {
                let _ = forward_tx.send(Event::default().event("harness_event").data(line));
            }
        });
        let result = run(&h, &m.text, Some(line_tx)).await;
        let _ = forward.await;
        let ev = match result {
            Ok(t) => Event::default()
                .event("done")
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

/// `GET /events` (SSE): an `agent` event per JSON event any message's CLI prints from now on
/// (claude `stream-json`, codex `--json`), whoever sent the message.
async fn events(State(h): State<Arc<Harness>>) -> Response {
    let rx = h.events.subscribe();
    let stream = stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(line) => return Some((Ok::<_, Infallible>(Event::default().event("agent").data(line)), rx)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// `GET /tty` query: the size to start the agent at if it is not running yet.
#[derive(Debug, Deserialize)]
struct TtyQuery {
    cols: Option<u16>,
    rows: Option<u16>,
}

async fn tty_upgrade(
    State(h): State<Arc<Harness>>,
    q: Result<Query<TtyQuery>, axum::extract::rejection::QueryRejection>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return error(StatusCode::BAD_REQUEST, "cols and rows must be numbers");
    };
    let size = match (q.cols, q.rows) {
        (None, None) => None,
        (Some(c), Some(r)) => match Size::checked(c, r) {
            Ok(s) => Some(s),
            Err(e) => return error(StatusCode::BAD_REQUEST, e),
        },
        _ => return error(StatusCode::BAD_REQUEST, "give both cols and rows, or neither"),
    };
    if h.terminal.is_none() {
        return error(
            StatusCode::CONFLICT,
            format!("the {} harness has no terminal UI; use /message", h.harness_id),
        );
    }
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("/tty is a WebSocket: {e}")),
    };
    ws.on_upgrade(move |socket| viewer(socket, h, size))
}

fn control_reply(v: serde_json::Value) -> Message {
    Message::Text(v.to_string().into())
}

/// One viewer: the current screen, then output out and input in until either side leaves.
async fn viewer(socket: WebSocket, h: Arc<Harness>, size: Option<Size>) {
    let Some(terminal) = h.terminal.as_ref() else { return };
    let (mut out, mut inp) = socket.split();
    let mut attached = match terminal.attach(size) {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, "terminal attach failed");
            let _ = out
                .send(control_reply(
                    serde_json::json!({"type": "error", "error": e.to_string()}),
                ))
                .await;
            let _ = out.close().await;
            return;
        }
    };
    let pty = Arc::clone(&attached.pty);
    tracing::info!(pid = pty.pid(), "viewer attached");
    if out.send(Message::Binary(attached.repaint.clone())).await.is_err() {
        return;
    }
    loop {
        tokio::select! {
            o = attached.output.recv() => match o {
                Ok(Output::Bytes(b)) => {
                    if out.send(Message::Binary(b)).await.is_err() {
                        break;
                    }
                }
                Ok(Output::Stopped) => {
                    let _ = out
                        .send(Message::Close(Some(axum::extract::ws::CloseFrame {
                            code: axum::extract::ws::close_code::AWAY,
                            reason: "the session is stopping".into(),
                        })))
                        .await;
                    break;
                }
                Ok(Output::Exit(code)) => {
                    let _ = out.send(control_reply(serde_json::json!({"type": "exit", "code": code}))).await;
                    let _ = out.close().await;
                    break;
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    // Fell behind: repaint the current screen instead of the missed bytes.
                    attached = pty.resync();
                    if out.send(Message::Binary(attached.repaint.clone())).await.is_err() {
                        break;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            },
            m = inp.next() => match m {
                Some(Ok(Message::Binary(b))) => pty.write(b.to_vec()),
                Some(Ok(Message::Text(t))) => match tty::parse_control(t.as_str()) {
                    Ok(Control::Input(text)) => pty.write(text.into_bytes()),
                    Ok(Control::Resize(size)) => pty.resize(size),
                    Ok(Control::Ping) => {
                        if out.send(control_reply(serde_json::json!({"type": "pong"}))).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        if out.send(control_reply(serde_json::json!({"type": "error", "error": e}))).await.is_err() {
                            break;
                        }
                    }
                },
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
            },
        }
    }
    tracing::info!(pid = pty.pid(), "viewer detached; the agent keeps running");
}
