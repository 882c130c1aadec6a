//! A local TLS stand-in for the Anthropic Messages API (`POST /v1/messages`, streaming SSE or
//! JSON) and the OpenAI Responses API (`POST /v1/responses`, SSE). It answers only when
//! `x-api-key` or `Authorization: Bearer` carries the REAL key; anything else gets the API's 401
//! shape. What it answers is scripted ([`super::model_script`]): a plain reply, or one tool call
//! (`LAP-RUN:`, `LAP-WRITE:` in the prompt) and then text quoting the tool's result. Every
//! authorised request body is kept in [`StandIn::requests`]. Certificates come from
//! `lap_test_support::TestPki`.
//!
//! It is also a remote MCP server (streamable HTTP, JSON answers) at
//! `https://mcp.example.com/mcp` ([`MCP_URL`]), with one tool, `lap_probe`; the JSON-RPC methods
//! it was called with are kept in [`StandIn::mcp_calls`].

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use lap_test_support::{serve_https, Server, TestPki};

use super::model_script;

/// Request bodies the stand-in answered (authorised ones), oldest first.
pub type Requests = Arc<std::sync::Mutex<Vec<serde_json::Value>>>;

/// The reply text the stand-in's model gives.
pub const REPLY: &str = "Hello from the local Anthropic stand-in";

/// The stand-in's MCP endpoint, as an agent's `mcp_servers[].url` names it.
pub const MCP_URL: &str = "https://mcp.example.com/mcp";

/// The JSON-RPC methods the MCP endpoint was called with, oldest first.
pub type McpCalls = Arc<std::sync::Mutex<Vec<String>>>;

pub struct StandIn {
    pub port: u16,
    pub ca_path: PathBuf,
    pub authorized: Arc<AtomicUsize>,
    pub rejected: Arc<AtomicUsize>,
    pub requests: Requests,
    pub mcp_calls: McpCalls,
    _dir: tempfile::TempDir,
    _server: Server,
}

async fn handle(
    req: Request<Incoming>,
    real: Arc<String>,
    ok: Arc<AtomicUsize>,
    bad: Arc<AtomicUsize>,
    requests: Requests,
    mcp_calls: McpCalls,
) -> Result<Response<Full<Bytes>>, Infallible> {
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
        return openai(&method, &path, &body, key_ok, &ok, &bad, &requests);
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

/// The Responses API (`POST /v1/responses`, SSE). The WebSocket form is refused (404), so codex
/// falls back to `POST` + SSE.
fn openai(
    method: &hyper::Method,
    path: &str,
    body: &[u8],
    key_ok: bool,
    ok: &AtomicUsize,
    bad: &AtomicUsize,
    requests: &Requests,
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
        bad.fetch_add(1, Ordering::SeqCst);
        return resp(
            401,
            "application/json",
            r#"{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","code":"invalid_api_key"}}"#
                .into(),
        );
    }
    ok.fetch_add(1, Ordering::SeqCst);
    if path == "/v1/models" {
        return resp(
            200,
            "application/json",
            r#"{"object":"list","data":[],"models":[]}"#.into(),
        );
    }
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let model = v
        .get("model")
        .and_then(|m| m.as_str())
        .unwrap_or("gpt-standin")
        .to_owned();
    requests.lock().unwrap().push(v.clone());
    let turn = model_script::openai_turn(&v, OPENAI_REPLY);
    let sse = model_script::openai_sse(&turn, &model);
    resp(200, "text/event-stream", sse)
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
        let (ok, bad, real, reqs, calls) = (
            authorized.clone(),
            rejected.clone(),
            Arc::new(real_key.to_owned()),
            requests.clone(),
            mcp_calls.clone(),
        );
        let server = serve_https(pki.server_config(&[b"h2", b"http/1.1"]), move |req| {
            handle(req, real.clone(), ok.clone(), bad.clone(), reqs.clone(), calls.clone())
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
            _dir: dir,
            _server: server,
        }
    }
}
