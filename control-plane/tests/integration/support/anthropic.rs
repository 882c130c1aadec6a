//! A local TLS stand-in for the Anthropic Messages API (`POST /v1/messages`, streaming SSE or
//! JSON) and the OpenAI Responses API: `POST /v1/responses` (SSE) and its WebSocket form
//! (`GET /v1/responses` upgraded, RFC 6455: one `response.create` text message per response,
//! answered with the same events as SSE, one text message each). It answers only when
//! `x-api-key` or `Authorization: Bearer` carries the REAL key; anything else gets the API's 401
//! shape. What it answers is scripted ([`super::model_script`]): a plain reply, or one tool call
//! (`LAP-RUN:`, `LAP-WRITE:` in the prompt) and then text quoting the tool's result. Every
//! authorised request body is kept in [`StandIn::requests`]. Certificates come from
//! `lap_test_support::TestPki`.
//!
//! A prompt holding [`REFLECT_KEY`] is a hostile model's answer: the Responses API reply
//! quotes the credential the request carried (what a bound host reflecting the key would do),
//! so a test can check the vault hands the client its stub instead.
//!
//! It is also a remote MCP server (streamable HTTP, JSON answers) at
//! `https://mcp.example.com/mcp` ([`MCP_URL`]), with one tool, `lap_probe`; the JSON-RPC methods
//! it was called with are kept in [`StandIn::mcp_calls`].

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use lap_test_support::{serve_https, Server, TestPki};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::model_script;

/// Request bodies the stand-in answered (authorised ones), oldest first.
pub type Requests = Arc<std::sync::Mutex<Vec<serde_json::Value>>>;

/// The reply text the stand-in's model gives.
pub const REPLY: &str = "Hello from the local Anthropic stand-in";

/// The stand-in's MCP endpoint, as an agent's `mcp_servers[].url` names it.
pub const MCP_URL: &str = "https://mcp.example.com/mcp";

/// The JSON-RPC methods the MCP endpoint was called with, oldest first.
pub type McpCalls = Arc<std::sync::Mutex<Vec<String>>>;

/// In a prompt, makes the Responses API answer quote the credential it was sent.
pub const REFLECT_KEY: &str = "LAP-REFLECT-KEY";

/// What every connection's handler shares: the real key and what was seen.
#[derive(Clone)]
struct Seen {
    real: Arc<String>,
    authorized: Arc<AtomicUsize>,
    rejected: Arc<AtomicUsize>,
    requests: Requests,
    mcp_calls: McpCalls,
    websocket_responses: Arc<AtomicUsize>,
}

pub struct StandIn {
    pub port: u16,
    pub ca_path: PathBuf,
    pub authorized: Arc<AtomicUsize>,
    pub rejected: Arc<AtomicUsize>,
    pub requests: Requests,
    pub mcp_calls: McpCalls,
    /// Responses answered over the Responses API's WebSocket form.
    pub websocket_responses: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
    _server: Server,
}

async fn handle(req: Request<Incoming>, seen: Seen) -> Result<Response<Full<Bytes>>, Infallible> {
    let Seen {
        real,
        authorized: ok,
        rejected: bad,
        requests,
        mcp_calls,
        ..
    } = seen.clone();
    let host = req.uri().host().map(str::to_owned).or_else(|| {
        req.headers()
            .get("host")
            .and_then(|v| v.to_str().ok())
            .map(|h| h.split(':').next().unwrap_or(h).to_owned())
    });
    let key_ok = req.headers().get("x-api-key").and_then(|v| v.to_str().ok()) == Some(real.as_str())
        || req.headers().get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bearer {real}"));
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let websocket = req
        .headers()
        .get(hyper::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if websocket && path == "/v1/responses" && method == hyper::Method::GET {
        return Ok(openai_websocket(req, key_ok, seen));
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let resp = |status: u16, ct: &str, body: String| {
        Ok(Response::builder()
            .status(status)
            .header("content-type", ct)
            .header("request-id", "req_standin")
            .body(Full::new(Bytes::from(body)))
            .unwrap())
    };
    // The Responses API by host, or by path for a caller that names no OpenAI host (a model
    // gateway calling `https://127.0.0.1:PORT/v1/responses`).
    if host.as_deref() == Some("api.openai.com") || path == "/v1/responses" {
        return openai(&method, &path, &body, key_ok, &seen);
    }
    if host.as_deref() == Some("mcp.example.com") {
        return Ok(mcp(&method, &body, &mcp_calls));
    }
    if !key_ok {
        bad.fetch_add(1, Ordering::SeqCst);
        return resp(
            401,
            "application/json",
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#.into(),
        );
    }
    ok.fetch_add(1, Ordering::SeqCst);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    requests.lock().unwrap().push(v.clone());
    let model = v
        .get("model")
        .and_then(|m| m.as_str())
        .unwrap_or("claude-standin")
        .to_owned();
    if path.ends_with("/count_tokens") {
        return resp(200, "application/json", r#"{"input_tokens":10}"#.into());
    }
    if path.starts_with("/v1/messages") {
        let turn = model_script::anthropic_turn(&v, REPLY);
        if v.get("stream").and_then(|s| s.as_bool()) == Some(true) {
            return resp(200, "text/event-stream", model_script::anthropic_sse(&turn, &model));
        }
        return resp(200, "application/json", model_script::anthropic_json(&turn, &model));
    }
    resp(
        404,
        "application/json",
        r#"{"type":"error","error":{"type":"not_found_error","message":"not here"}}"#.into(),
    )
}

/// The MCP endpoint (streamable HTTP transport, MCP 2025-06-18 §"Transports"): `initialize`,
/// `tools/list` (one tool, `lap_probe`), `tools/call`; notifications get `202`; `GET` (the
/// server-initiated stream) is `405`, which the transport allows.
fn mcp(method: &hyper::Method, body: &[u8], calls: &McpCalls) -> Response<Full<Bytes>> {
    let reply = |status: u16, body: String| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };
    if method != hyper::Method::POST {
        return reply(405, String::new());
    }
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let name = v["method"].as_str().unwrap_or_default().to_owned();
    calls.lock().unwrap().push(name.clone());
    let Some(id) = v.get("id").cloned() else {
        return reply(202, String::new());
    };
    let result = match name.as_str() {
        "initialize" => serde_json::json!({
            "protocolVersion": v["params"]["protocolVersion"].as_str().unwrap_or("2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "lap-probe", "version": "1.0.0"}
        }),
        "tools/list" => serde_json::json!({"tools": [{
            "name": "lap_probe",
            "description": "Answers that the MCP server was reached",
            "inputSchema": {"type": "object", "properties": {}}
        }]}),
        "tools/call" => serde_json::json!({"content": [{"type": "text", "text": "the MCP probe answered"}]}),
        _ => {
            let e = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}});
            return reply(200, e.to_string());
        }
    };
    reply(
        200,
        serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string(),
    )
}

/// The reply text the stand-in's OpenAI model gives.
pub const OPENAI_REPLY: &str = "Hello from the local OpenAI stand-in";

/// The Responses API over `POST /v1/responses` (SSE).
fn openai(
    method: &hyper::Method,
    path: &str,
    body: &[u8],
    key_ok: bool,
    seen: &Seen,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let resp = |status: u16, ct: &str, body: String| {
        Ok(Response::builder()
            .status(status)
            .header("content-type", ct)
            .body(Full::new(Bytes::from(body)))
            .unwrap())
    };
    let known = matches!(
        (method.as_str(), path),
        ("POST", "/v1/responses") | ("GET", "/v1/models")
    );
    if !known {
        return resp(404, "application/json", r#"{"error":{"message":"not here"}}"#.into());
    }
    if !key_ok {
        seen.rejected.fetch_add(1, Ordering::SeqCst);
        return resp(401, "application/json", OPENAI_UNAUTHORIZED.into());
    }
    seen.authorized.fetch_add(1, Ordering::SeqCst);
    if path == "/v1/models" {
        return resp(
            200,
            "application/json",
            r#"{"object":"list","data":[],"models":[]}"#.into(),
        );
    }
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    seen.requests.lock().unwrap().push(v.clone());
    let turn = openai_turn(&v, seen);
    resp(200, "text/event-stream", model_script::openai_sse(&turn, &model_of(&v)))
}

/// The Responses API's 401 body.
const OPENAI_UNAUTHORIZED: &str =
    r#"{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","code":"invalid_api_key"}}"#;

fn model_of(body: &serde_json::Value) -> String {
    body["model"].as_str().unwrap_or("gpt-standin").to_owned()
}

/// The scripted answer to one Responses request, or the credential it carried when the latest
/// user text asks for it ([`REFLECT_KEY`]).
fn openai_turn(body: &serde_json::Value, seen: &Seen) -> Result<model_script::OpenAiCall, String> {
    let latest_user = body["input"]
        .as_array()
        .and_then(|items| items.iter().rev().find(|i| i["role"] == "user"))
        .map(|i| i["content"].to_string())
        .unwrap_or_default();
    if latest_user.contains(REFLECT_KEY) {
        return Err(format!("{OPENAI_REPLY}. The key you sent me: {}", seen.real));
    }
    model_script::openai_turn(body, OPENAI_REPLY)
}

/// The Responses API's WebSocket form: `GET /v1/responses` with `Upgrade: websocket`, the
/// credential on the upgrade request. Answered `101` (RFC 6455 §4.2.2), then per connection:
/// each `response.create` message is one response, streamed as one text message per event; one
/// with `previous_response_id` carries only the new input items, continuing that response's
/// input and output (kept per connection); `generate: false` (a warm-up) is answered with an
/// empty response; any other message type (`response.processed`) is ignored.
fn openai_websocket(mut req: Request<Incoming>, key_ok: bool, seen: Seen) -> Response<Full<Bytes>> {
    let reply = |status: u16, body: &str| {
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap()
    };
    if !key_ok {
        seen.rejected.fetch_add(1, Ordering::SeqCst);
        return reply(401, OPENAI_UNAUTHORIZED);
    }
    let Some(key) = req.headers().get("sec-websocket-key") else {
        return reply(
            400,
            r#"{"error":{"message":"a WebSocket upgrade needs Sec-WebSocket-Key"}}"#,
        );
    };
    let accept = derive_accept_key(key.as_bytes());
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = upgrade.await else {
            return;
        };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        responses_over_websocket(ws, seen).await;
    });
    Response::builder()
        .status(101)
        .header(hyper::header::UPGRADE, "websocket")
        .header(hyper::header::CONNECTION, "upgrade")
        .header("sec-websocket-accept", accept)
        .body(Full::default())
        .unwrap()
}

async fn responses_over_websocket<S>(mut ws: WebSocketStream<S>, seen: Seen)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // The last response's id, and its whole input followed by its output.
    let mut last: Option<(String, Vec<serde_json::Value>)> = None;
    let mut answered = 0usize;
    while let Some(Ok(message)) = ws.next().await {
        let text = match message {
            Message::Text(text) => text,
            Message::Close(_) => break,
            _ => continue,
        };
        let mut body: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        if body["type"] != "response.create" {
            continue;
        }
        let mut input = match (body["previous_response_id"].as_str(), &last) {
            (None, _) => Vec::new(),
            (Some(id), Some((last_id, history))) if id == last_id => history.clone(),
            (Some(id), _) => {
                let error = serde_json::json!({"type": "error", "status": 400, "error": {
                    "type": "invalid_request_error", "code": "previous_response_not_found",
                    "message": format!("Previous response with id '{id}' not found.")}});
                if ws.send(Message::Text(error.to_string().into())).await.is_err() {
                    break;
                }
                continue;
            }
        };
        input.extend(body["input"].as_array().cloned().unwrap_or_default());
        let object = body.as_object_mut().expect("a response.create message is an object");
        object.remove("type");
        object.remove("previous_response_id");
        object.insert("input".into(), input.clone().into());
        answered += 1;
        let resp_id = format!("resp_standin_ws{answered}");
        let warm_up = body["generate"] == false;
        let events = if warm_up {
            warm_up_events(&model_of(&body), &resp_id)
        } else {
            seen.authorized.fetch_add(1, Ordering::SeqCst);
            seen.websocket_responses.fetch_add(1, Ordering::SeqCst);
            seen.requests.lock().unwrap().push(body.clone());
            model_script::openai_events(&openai_turn(&body, &seen), &model_of(&body), &resp_id)
        };
        if let Some(output) = events.last().and_then(|done| done["response"]["output"].as_array()) {
            input.extend(output.iter().cloned());
        }
        last = Some((resp_id, input));
        for event in events {
            if ws.send(Message::Text(event.to_string().into())).await.is_err() {
                return;
            }
        }
    }
}

/// The answer to a `generate: false` request: created, then completed with no output.
fn warm_up_events(model: &str, resp_id: &str) -> Vec<serde_json::Value> {
    let response = serde_json::json!({"id": resp_id, "object": "response", "created_at": 1_700_000_000,
        "model": model, "status": "completed", "output": [], "usage": {"input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 0}});
    vec![
        serde_json::json!({"type": "response.created", "sequence_number": 0, "response": response}),
        serde_json::json!({"type": "response.completed", "sequence_number": 1, "response": response}),
    ]
}

impl StandIn {
    /// A `LAP_SIDECAR_BASE_CONFIG` file in `dir` (`base.toml`) sending api.anthropic.com and
    /// api.openai.com to this stand-in, trusting its CA toward upstreams.
    pub fn base_config(&self, dir: &std::path::Path) -> PathBuf {
        let p = dir.join("base.toml");
        let text = format!(
            "upstream_ca_files = [{:?}]\n\n[resolve]\n\"api.anthropic.com:443\" = \"127.0.0.1:{port}\"\n\
             \"api.openai.com:443\" = \"127.0.0.1:{port}\"\n\"mcp.example.com:443\" = \"127.0.0.1:{port}\"\n",
            self.ca_path.display().to_string(),
            port = self.port
        );
        std::fs::write(&p, text).unwrap();
        p
    }

    pub async fn start(real_key: &str) -> StandIn {
        let dir = tempfile::tempdir().unwrap();
        let pki = TestPki::new(
            "LAP e2e test CA",
            &["api.anthropic.com", "api.openai.com", "mcp.example.com"],
        );
        let ca_path = pki.write_ca(dir.path(), "test-ca.pem");
        let authorized = Arc::new(AtomicUsize::new(0));
        let rejected = Arc::new(AtomicUsize::new(0));
        let requests: Requests = Arc::default();
        let mcp_calls: McpCalls = Arc::default();
        let websocket_responses = Arc::new(AtomicUsize::new(0));
        let seen = Seen {
            real: Arc::new(real_key.to_owned()),
            authorized: authorized.clone(),
            rejected: rejected.clone(),
            requests: requests.clone(),
            mcp_calls: mcp_calls.clone(),
            websocket_responses: websocket_responses.clone(),
        };
        let server = serve_https(pki.server_config(&[b"h2", b"http/1.1"]), move |req| {
            handle(req, seen.clone())
        })
        .await;
        let port = server.addr.port();
        StandIn {
            port,
            ca_path,
            authorized,
            rejected,
            requests,
            mcp_calls,
            websocket_responses,
            _dir: dir,
            _server: server,
        }
    }
}
