//! Local stand-ins for the model APIs the agent CLIs talk to: one TLS listener (hyper 1 + tokio-rustls, h2 and
//! http/1.1) whose certificate, minted at test time by a throwaway CA, covers `api.anthropic.com` and
//! `api.openai.com`. The sidecar's `[resolve]` table points both hosts here; requests are routed on the
//! `Host` / `:authority` the client sent.
//!
//! - `api.anthropic.com`: the Messages API (`POST /v1/messages`, streaming SSE or a JSON message) and
//!   `POST /v1/messages/count_tokens`; answers `401` unless `x-api-key` (or `Authorization: Bearer`) is the real key.
//! - `api.openai.com`: the Responses API, `POST /v1/responses` as SSE and `GET /v1/responses` as a WebSocket
//!   (`response.create` in, the same events out as JSON text frames); answers `401` unless
//!   `Authorization: Bearer` is the real key.
//!
//! Every request (and every WebSocket message the client sent) is recorded; anything unrouted is logged on stderr
//! and answered `404` so a new CLI version's extra calls show up in the test output.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use lap_test_support::{serve_tls, Server, TestPki};
use serde_json::{json, Value};

type Body = UnsyncBoxBody<Bytes, io::Error>;

pub(crate) const ANTHROPIC_HOST: &str = "api.anthropic.com";
pub(crate) const OPENAI_HOST: &str = "api.openai.com";

/// What the Anthropic stand-in answers.
pub(crate) const ANTHROPIC_REPLY: &str = "hello from the anthropic stand-in";
/// What the OpenAI stand-in answers.
pub(crate) const OPENAI_REPLY: &str = "hello from the openai stand-in";

/// One request (or WebSocket message) as the stand-in saw it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) host: String,
    /// HTTP method, or `WS` for a message the client sent over an upgraded connection.
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) version: String,
    pub(crate) headers: Vec<(String, String)>,
    /// Whole request body (or message text).
    pub(crate) body: Vec<u8>,
    pub(crate) status: u16,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Whether `needle` occurs in the path, any header value or the body.
    pub(crate) fn contains(&self, needle: &str) -> bool {
        self.path.contains(needle)
            || self.headers.iter().any(|(_, v)| v.contains(needle))
            || self.body.windows(needle.len().max(1)).any(|w| w == needle.as_bytes())
    }

    pub(crate) fn summary(&self) -> String {
        format!(
            "{} {} {} {} -> {}",
            self.version, self.method, self.host, self.path, self.status
        )
    }
}

struct Ctx {
    log: Mutex<Vec<Seen>>,
    anthropic_key: String,
    openai_key: String,
    /// Whether `GET /v1/responses` accepts the WebSocket upgrade (otherwise `426`, like an HTTP-only server).
    websocket: bool,
}

/// A running stand-in; dropping it stops the listener.
pub(crate) struct StandIn {
    pub(crate) addr: SocketAddr,
    /// PEM of the CA that signed the stand-in's certificate (give it to the sidecar's `upstream_ca_files`).
    pub(crate) ca_pem_path: PathBuf,
    _dir: tempfile::TempDir,
    ctx: Arc<Ctx>,
    _server: Server,
}

impl StandIn {
    /// Starts the stand-in; `anthropic_key` / `openai_key` are the only credentials it accepts.
    pub(crate) async fn start(anthropic_key: &str, openai_key: &str, websocket: bool) -> StandIn {
        let dir = tempfile::tempdir().expect("stand-in tempdir");
        let pki = TestPki::new("LAP Test Model API CA", &[ANTHROPIC_HOST, OPENAI_HOST, "127.0.0.1"]);
        let ca_pem_path = pki.write_ca(dir.path(), "standin-ca.pem");
        let ctx = Arc::new(Ctx {
            log: Mutex::new(Vec::new()),
            anthropic_key: anthropic_key.to_string(),
            openai_key: openai_key.to_string(),
            websocket,
        });
        let task_ctx = ctx.clone();
        let server = serve_tls(pki.server_config(&[b"h2", b"http/1.1"]), move |tls| {
            let ctx = task_ctx.clone();
            async move {
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let ctx = ctx.clone();
                    async move { Ok::<_, Infallible>(route(req, ctx).await) }
                });
                let io = TokioIo::new(tls);
                if h2 {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, svc)
                        .await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .with_upgrades()
                        .await;
                }
            }
        })
        .await;
        let addr = server.addr;
        StandIn {
            addr,
            ca_pem_path,
            _dir: dir,
            ctx,
            _server: server,
        }
    }

    /// Everything recorded so far.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.ctx.log.lock().expect("log").clone()
    }

    /// One line per recorded request, for failure messages.
    pub(crate) fn summary(&self) -> String {
        self.seen().iter().map(|s| s.summary() + "\n").collect()
    }
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|e| match e {}).boxed_unsync()
}

fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed_unsync()
}

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(full(v.to_string()))
        .expect("response")
}

fn sse_response(events: Vec<(String, Value)>) -> Response<Body> {
    let frames = events
        .into_iter()
        .map(|(name, data)| Ok::<_, io::Error>(Frame::data(Bytes::from(format!("event: {name}\ndata: {data}\n\n")))));
    Response::builder()
        .header("content-type", "text/event-stream; charset=utf-8")
        .header("cache-control", "no-cache")
        .body(StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync())
        .expect("response")
}

async fn route(req: Request<Incoming>, ctx: Arc<Ctx>) -> Response<Body> {
    let host = req
        .uri()
        .host()
        .map(str::to_string)
        .or_else(|| {
            req.headers()
                .get(hyper::header::HOST)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        })
        .unwrap_or_default();
    let host = host.split(':').next().unwrap_or_default().to_ascii_lowercase();
    let mut seen = Seen {
        host,
        method: req.method().to_string(),
        path: req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_default(),
        version: format!("{:?}", req.version()),
        headers: req
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).to_string(),
                )
            })
            .collect(),
        body: Vec::new(),
        status: 0,
    };
    let is_ws = req
        .headers()
        .get(hyper::header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let ws_req = if is_ws {
        Some(req)
    } else {
        match req.into_body().collect().await {
            Ok(b) => seen.body = b.to_bytes().to_vec(),
            Err(e) => eprintln!("stand-in: reading request body failed: {e}"),
        }
        None
    };
    let path = seen.path.split('?').next().unwrap_or_default().to_string();
    let resp = match seen.host.as_str() {
        ANTHROPIC_HOST => anthropic(&seen, &path, &ctx),
        OPENAI_HOST => match ws_req {
            Some(req) => openai_ws(req, &seen, &path, ctx.clone()),
            None => openai(&seen, &path, &ctx),
        },
        _ => None,
    };
    let resp = resp.unwrap_or_else(|| {
        eprintln!(
            "stand-in: unhandled {} {} {} (headers {:?})",
            seen.method, seen.host, seen.path, seen.headers
        );
        json_response(
            StatusCode::NOT_FOUND,
            &json!({"type": "error", "error": {"type": "not_found_error", "message": "no such route in the stand-in"}}),
        )
    });
    seen.status = resp.status().as_u16();
    eprintln!("stand-in: {}", seen.summary());
    ctx.log.lock().expect("log").push(seen);
    resp
}

fn bearer(seen: &Seen) -> Option<&str> {
    seen.header("authorization").and_then(|v| v.strip_prefix("Bearer "))
}

// ---------------------------------------------------------------------------------------------------------------
// Anthropic Messages API
// ---------------------------------------------------------------------------------------------------------------

fn anthropic(seen: &Seen, path: &str, ctx: &Ctx) -> Option<Response<Body>> {
    let authed = seen.header("x-api-key") == Some(ctx.anthropic_key.as_str())
        || bearer(seen) == Some(ctx.anthropic_key.as_str());
    match (seen.method.as_str(), path) {
        ("POST", "/v1/messages")
        | ("POST", "/v1/messages/count_tokens")
        | ("GET", "/api/claude_code/settings")
        | ("GET", "/api/claude_code/policy_limits")
            if !authed =>
        {
            let mut r = json_response(
                StatusCode::UNAUTHORIZED,
                &json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}),
            );
            // As the real API does: a bad key is not worth retrying.
            r.headers_mut()
                .insert("x-should-retry", hyper::header::HeaderValue::from_static("false"));
            Some(r)
        }
        ("POST", "/v1/messages/count_tokens") => Some(json_response(StatusCode::OK, &json!({"input_tokens": 12}))),
        // Claude Code asks for remotely managed settings and policy limits at start; an API-key account has none.
        ("GET", "/api/claude_code/settings") | ("GET", "/api/claude_code/policy_limits") => Some(json_response(
            StatusCode::NOT_FOUND,
            &json!({"type": "error", "error": {"type": "not_found_error", "message": "none configured"}}),
        )),
        ("POST", "/v1/messages") => {
            let body: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
            let model = body["model"].as_str().unwrap_or("claude-stand-in").to_string();
            let usage = json!({"input_tokens": 12, "output_tokens": 7, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0});
            if body["stream"].as_bool() == Some(true) {
                let mut start_usage = usage.clone();
                start_usage["output_tokens"] = json!(1);
                Some(sse_response(vec![
                    (
                        "message_start".into(),
                        json!({"type": "message_start", "message": {"id": "msg_standin01", "type": "message",
                            "role": "assistant", "model": model, "content": [], "stop_reason": null,
                            "stop_sequence": null, "usage": start_usage}}),
                    ),
                    (
                        "content_block_start".into(),
                        json!({"type": "content_block_start", "index": 0,
                            "content_block": {"type": "text", "text": ""}}),
                    ),
                    ("ping".into(), json!({"type": "ping"})),
                    (
                        "content_block_delta".into(),
                        json!({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": ANTHROPIC_REPLY}}),
                    ),
                    (
                        "content_block_stop".into(),
                        json!({"type": "content_block_stop", "index": 0}),
                    ),
                    (
                        "message_delta".into(),
                        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                            "usage": {"output_tokens": 7}}),
                    ),
                    ("message_stop".into(), json!({"type": "message_stop"})),
                ]))
            } else {
                Some(json_response(
                    StatusCode::OK,
                    &json!({"id": "msg_standin02", "type": "message", "role": "assistant", "model": model,
                        "content": [{"type": "text", "text": ANTHROPIC_REPLY}], "stop_reason": "end_turn",
                        "stop_sequence": null, "usage": usage}),
                ))
            }
        }
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// OpenAI Responses API
// ---------------------------------------------------------------------------------------------------------------

fn openai_unauthorized() -> Response<Body> {
    json_response(
        StatusCode::UNAUTHORIZED,
        &json!({"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error",
            "param": null, "code": "invalid_api_key"}}),
    )
}

/// The Responses API event sequence for one reply, as `(event type, payload)`.
fn responses_events(model: &str) -> Vec<(String, Value)> {
    let created_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let resp_id = "resp_standin01";
    let msg_id = "msg_standin01";
    let base = json!({"id": resp_id, "object": "response", "created_at": created_at, "model": model,
        "status": "in_progress", "output": [], "usage": null});
    let item_done = json!({"type": "message", "id": msg_id, "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": OPENAI_REPLY, "annotations": []}]});
    let mut completed = base.clone();
    completed["status"] = json!("completed");
    completed["output"] = json!([item_done.clone()]);
    completed["usage"] = json!({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 19});
    let ev = |t: &str, mut v: Value| {
        v["type"] = json!(t);
        (t.to_string(), v)
    };
    vec![
        ev(
            "response.created",
            json!({"sequence_number": 0, "response": base.clone()}),
        ),
        ev("response.in_progress", json!({"sequence_number": 1, "response": base})),
        ev(
            "response.output_item.added",
            json!({"sequence_number": 2, "output_index": 0, "item": {"type": "message", "id": msg_id,
                "status": "in_progress", "role": "assistant", "content": []}}),
        ),
        ev(
            "response.content_part.added",
            json!({"sequence_number": 3, "item_id": msg_id, "output_index": 0, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}}),
        ),
        ev(
            "response.output_text.delta",
            json!({"sequence_number": 4, "item_id": msg_id, "output_index": 0, "content_index": 0,
                "delta": OPENAI_REPLY}),
        ),
        ev(
            "response.output_text.done",
            json!({"sequence_number": 5, "item_id": msg_id, "output_index": 0, "content_index": 0,
                "text": OPENAI_REPLY}),
        ),
        ev(
            "response.content_part.done",
            json!({"sequence_number": 6, "item_id": msg_id, "output_index": 0, "content_index": 0,
                "part": {"type": "output_text", "text": OPENAI_REPLY, "annotations": []}}),
        ),
        ev(
            "response.output_item.done",
            json!({"sequence_number": 7, "output_index": 0, "item": item_done}),
        ),
        ev(
            "response.completed",
            json!({"sequence_number": 8, "response": completed}),
        ),
    ]
}

/// `response.created` + `response.completed` with no output, the answer to `generate: false`.
fn prewarm_events(model: &str) -> Vec<(String, Value)> {
    let all = responses_events(model);
    let mut completed = all.last().expect("events").clone();
    completed.1["response"]["output"] = json!([]);
    completed.1["response"]["usage"]["output_tokens"] = json!(0);
    completed.1["response"]["usage"]["total_tokens"] = json!(12);
    vec![all[0].clone(), completed]
}

fn openai(seen: &Seen, path: &str, ctx: &Ctx) -> Option<Response<Body>> {
    let authed = bearer(seen) == Some(ctx.openai_key.as_str());
    match (seen.method.as_str(), path) {
        ("POST", "/v1/responses") if !authed => Some(openai_unauthorized()),
        ("POST", "/v1/responses") => {
            let body: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
            let model = body["model"].as_str().unwrap_or("gpt-stand-in");
            Some(sse_response(responses_events(model)))
        }
        ("GET", "/v1/models") if !authed => Some(openai_unauthorized()),
        ("GET", "/v1/models") => Some(json_response(
            StatusCode::OK,
            &json!({"object": "list", "data": [], "models": []}),
        )),
        _ => None,
    }
}

fn openai_ws(mut req: Request<Incoming>, seen: &Seen, path: &str, ctx: Arc<Ctx>) -> Option<Response<Body>> {
    use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
    use tokio_tungstenite::tungstenite::protocol::Role;
    use tokio_tungstenite::tungstenite::Message;
    if path != "/v1/responses" {
        return None;
    }
    if bearer(seen) != Some(ctx.openai_key.as_str()) {
        return Some(openai_unauthorized());
    }
    if !ctx.websocket {
        return Some(json_response(
            StatusCode::UPGRADE_REQUIRED,
            &json!({"error": {"message": "websockets disabled in this stand-in", "type": "invalid_request_error"}}),
        ));
    }
    let key = seen.header("sec-websocket-key")?.to_string();
    let on_upgrade = hyper::upgrade::on(&mut req);
    let host = seen.host.clone();
    let path = seen.path.clone();
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                eprintln!("stand-in: websocket upgrade failed: {e}");
                return;
            }
        };
        let mut ws =
            tokio_tungstenite::WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        while let Some(msg) = ws.next().await {
            let msg = match msg {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("stand-in: websocket read error: {e}");
                    break;
                }
            };
            match msg {
                Message::Text(t) => {
                    let text = t.to_string();
                    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                    let kind = v["type"].as_str().unwrap_or_default().to_string();
                    let seen = Seen {
                        host: host.clone(),
                        method: "WS".into(),
                        path: path.clone(),
                        version: "websocket".into(),
                        headers: Vec::new(),
                        body: text.into_bytes(),
                        status: 0,
                    };
                    eprintln!("stand-in: websocket message {kind:?}");
                    ctx.log.lock().expect("log").push(seen);
                    if kind == "response.create" {
                        let model = v["model"].as_str().unwrap_or("gpt-stand-in").to_string();
                        // `generate: false` (codex's prewarm) opens a response without producing output.
                        let events = if v["generate"] == false {
                            prewarm_events(&model)
                        } else {
                            responses_events(&model)
                        };
                        for (_, ev) in events {
                            if ws.send(Message::text(ev.to_string())).await.is_err() {
                                return;
                            }
                        }
                    } else {
                        eprintln!("stand-in: unhandled websocket message: {v}");
                    }
                }
                Message::Close(_) => {
                    let _ = ws.close(None).await;
                    break;
                }
                _ => {}
            }
        }
    });
    Some(
        Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("upgrade", "websocket")
            .header("connection", "Upgrade")
            .header("sec-websocket-accept", derive_accept_key(key.as_bytes()))
            .body(empty())
            .expect("response"),
    )
}
