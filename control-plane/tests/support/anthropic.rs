//! A local TLS stand-in for the Anthropic Messages API (`POST /v1/messages`, streaming SSE or
//! JSON). It answers only when `x-api-key` or `Authorization: Bearer` carries the REAL key;
//! anything else gets Anthropic's 401 shape. Certificates come from a test CA made with rcgen.

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The reply text the stand-in's model gives.
pub const REPLY: &str = "Hello from the local Anthropic stand-in";

pub struct StandIn {
    pub port: u16,
    pub ca_path: PathBuf,
    pub authorized: Arc<AtomicUsize>,
    pub rejected: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn pki() -> (String, Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.distinguished_name.push(DnType::CommonName, "LAP e2e test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let mut leaf_params =
        CertificateParams::new(vec!["api.anthropic.com".to_owned(), "api.openai.com".to_owned()]).unwrap();
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "api.anthropic.com");
    leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf_params.use_authority_key_identifier_extension = true;
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    (ca.pem(), vec![leaf.der().clone(), ca.der().clone()], key)
}

fn sse(model: &str) -> String {
    let events = [
        (
            "message_start",
            serde_json::json!({"type":"message_start","message":{"id":"msg_standin","type":"message","role":"assistant","model":model,"content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}),
        ),
        (
            "content_block_start",
            serde_json::json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
        ),
        ("ping", serde_json::json!({"type":"ping"})),
        (
            "content_block_delta",
            serde_json::json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":REPLY}}),
        ),
        (
            "content_block_stop",
            serde_json::json!({"type":"content_block_stop","index":0}),
        ),
        (
            "message_delta",
            serde_json::json!({"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9}}),
        ),
        ("message_stop", serde_json::json!({"type":"message_stop"})),
    ];
    events
        .iter()
        .map(|(e, d)| format!("event: {e}\ndata: {d}\n\n"))
        .collect()
}

fn json_message(model: &str) -> String {
    serde_json::json!({"id":"msg_standin","type":"message","role":"assistant","model":model,
        "content":[{"type":"text","text":REPLY}],"stop_reason":"end_turn","stop_sequence":null,
        "usage":{"input_tokens":10,"output_tokens":9}})
    .to_string()
}

async fn handle(
    req: Request<Incoming>,
    real: Arc<String>,
    ok: Arc<AtomicUsize>,
    bad: Arc<AtomicUsize>,
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
    if host.as_deref() == Some("api.openai.com") {
        return openai(&method, &path, &body, key_ok, &ok, &bad);
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
    let model = v
        .get("model")
        .and_then(|m| m.as_str())
        .unwrap_or("claude-standin")
        .to_owned();
    if path.ends_with("/count_tokens") {
        return resp(200, "application/json", r#"{"input_tokens":10}"#.into());
    }
    if path.starts_with("/v1/messages") {
        if v.get("stream").and_then(|s| s.as_bool()) == Some(true) {
            return resp(200, "text/event-stream", sse(&model));
        }
        return resp(200, "application/json", json_message(&model));
    }
    resp(
        404,
        "application/json",
        r#"{"type":"error","error":{"type":"not_found_error","message":"not here"}}"#.into(),
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
    let (resp_id, msg_id) = ("resp_standin01", "msg_standin01");
    let base = serde_json::json!({"id": resp_id, "object": "response", "created_at": 1_700_000_000, "model": model,
        "status": "in_progress", "output": [], "usage": null});
    let item = serde_json::json!({"type": "message", "id": msg_id, "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": OPENAI_REPLY, "annotations": []}]});
    let mut completed = base.clone();
    completed["status"] = "completed".into();
    completed["output"] = serde_json::json!([item.clone()]);
    completed["usage"] = serde_json::json!({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 19});
    let events = [
        (
            "response.created",
            serde_json::json!({"sequence_number": 0, "response": base.clone()}),
        ),
        (
            "response.in_progress",
            serde_json::json!({"sequence_number": 1, "response": base}),
        ),
        (
            "response.output_item.added",
            serde_json::json!({"sequence_number": 2, "output_index": 0,
            "item": {"type": "message", "id": msg_id, "status": "in_progress", "role": "assistant", "content": []}}),
        ),
        (
            "response.content_part.added",
            serde_json::json!({"sequence_number": 3, "item_id": msg_id,
            "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
        ),
        (
            "response.output_text.delta",
            serde_json::json!({"sequence_number": 4, "item_id": msg_id,
            "output_index": 0, "content_index": 0, "delta": OPENAI_REPLY}),
        ),
        (
            "response.output_text.done",
            serde_json::json!({"sequence_number": 5, "item_id": msg_id,
            "output_index": 0, "content_index": 0, "text": OPENAI_REPLY}),
        ),
        (
            "response.content_part.done",
            serde_json::json!({"sequence_number": 6, "item_id": msg_id,
            "output_index": 0, "content_index": 0,
            "part": {"type": "output_text", "text": OPENAI_REPLY, "annotations": []}}),
        ),
        (
            "response.output_item.done",
            serde_json::json!({"sequence_number": 7, "output_index": 0, "item": item}),
        ),
        (
            "response.completed",
            serde_json::json!({"sequence_number": 8, "response": completed}),
        ),
    ];
    let sse: String = events
        .into_iter()
        .map(|(t, mut v)| {
            v["type"] = t.into();
            format!("event: {t}\ndata: {v}\n\n")
        })
        .collect();
    resp(200, "text/event-stream", sse)
}

impl StandIn {
    pub async fn start(real_key: &str) -> StandIn {
        let dir = tempfile::tempdir().unwrap();
        let (ca_pem, chain, key) = pki();
        let ca_path = dir.path().join("test-ca.pem");
        std::fs::write(&ca_path, ca_pem).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let authorized = Arc::new(AtomicUsize::new(0));
        let rejected = Arc::new(AtomicUsize::new(0));
        let (ok, bad, real) = (authorized.clone(), rejected.clone(), Arc::new(real_key.to_owned()));
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, ok, bad, real) = (acceptor.clone(), ok.clone(), bad.clone(), real.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let svc = hyper::service::service_fn(move |req| handle(req, real.clone(), ok.clone(), bad.clone()));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        StandIn {
            port,
            ca_path,
            authorized,
            rejected,
            _dir: dir,
            task,
        }
    }
}
