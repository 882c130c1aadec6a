//! The upstream stand-in: a hyper 1 server behind rustls (and a cleartext twin) that records every request.
//!
//! Routes:
//! - `/echo`: JSON of the method, path, version and headers it saw.
//! - `/sse?events=N&interval_ms=M&initial_delay_ms=D`: `text/event-stream`, ~40-byte events whose data is
//!   `{"n":i,"t":<ms since epoch when sent>}`.
//! - `/gzip`, `/encoded?enc=gzip|br|zstd`: precomputed encoded bytes with `Content-Encoding` and `Content-Length`.
//! - `/head` (a small body, for HEAD), `/204`, `/304`.
//! - `/big?bytes=N[&length=0]`: N pattern bytes streamed (`length=0`: no Content-Length).
//! - `/upload`: reads the body streaming, answers `{"len":..,"sha256":..}`.
//! - `/reject401`: answers 401 at once, never reading the body.
//! - `/ws`: WebSocket echo (HTTP/1.1 Upgrade).
//! - `/ws-reflect`: WebSocket that, once open, sends the request's `x-api-key` in a text message, then
//!   a binary message fragmented in two frames that split it in the middle, then closes.
//! - `/trailers`: a body, then a trailer `x-echo` holding the request's `x-api-key` (h2, or h1 chunked
//!   when the client sent `TE: trailers`).
//! - `/OWNER/REPO.git/...`: git smart HTTP via `git http-backend`, behind Basic auth `x-access-token:<git_token>`.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use lap_test_support::{serve_tls, Server, TestPki};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::{pattern_byte, Sha256, UPSTREAM_HOSTS};

type Body = UnsyncBoxBody<Bytes, io::Error>;

/// Which ALPN protocols the upstream's TLS listener offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    /// `h2` and `http/1.1` (h2 preferred by the client's order).
    Both,
    /// `http/1.1` only.
    Http1Only,
    /// `h2` only: a client offering only `http/1.1` fails the handshake.
    H2Only,
}

#[derive(Clone, Debug)]
pub struct UpstreamOptions {
    pub alpn: Alpn,
    /// When set, git routes require `Authorization: Basic base64(x-access-token:<git_token>)`.
    pub git_token: Option<String>,
}

/// One request as the upstream saw it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// "https" or "http".
    pub scheme: &'static str,
    /// Negotiated ALPN on the TLS listener.
    pub alpn: Option<String>,
    /// SNI the client sent.
    pub sni: Option<String>,
    pub method: String,
    /// Path and query, as received.
    pub path: String,
    /// `:authority` (h2) or `Host` (h1).
    pub authority: Option<String>,
    /// "HTTP/1.0", "HTTP/1.1" or "HTTP/2.0".
    pub version: String,
    pub headers: Vec<(String, String)>,
    /// Body length; `None` when the route never read the body.
    pub body_len: Option<u64>,
    pub body_sha256: Option<String>,
    /// First 64 KiB of the body.
    pub body_prefix: Vec<u8>,
}

impl Recorded {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of header `name`.
    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// Whether `needle` occurs anywhere the upstream can see it: path, header values (Basic credentials decoded
    /// too), or the recorded body prefix.
    pub fn contains(&self, needle: &str) -> bool {
        if self.path.contains(needle) {
            return true;
        }
        for (_, v) in &self.headers {
            if v.contains(needle) {
                return true;
            }
            if let Some(b64) = v.strip_prefix("Basic ").or_else(|| v.strip_prefix("basic ")) {
                if let Ok(dec) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) {
                    if String::from_utf8_lossy(&dec).contains(needle) {
                        return true;
                    }
                }
            }
        }
        self.body_prefix
            .windows(needle.len().max(1))
            .any(|w| w == needle.as_bytes())
    }
}

#[derive(Clone)]
struct ConnInfo {
    scheme: &'static str,
    alpn: Option<String>,
    sni: Option<String>,
}

struct Ctx {
    log: Arc<Mutex<Vec<Recorded>>>,
    git_root: PathBuf,
    git_token: Option<String>,
    gzip_body: Bytes,
    /// `/encoded?enc=br|zstd`: the same text as the gzip body, in that coding.
    br_body: Bytes,
    zstd_body: Bytes,
}

/// A running upstream. Dropping it stops its listeners.
pub struct Upstream {
    /// TLS listener (certificate for [`UPSTREAM_HOSTS`] and IP 127.0.0.1).
    pub tls_addr: SocketAddr,
    /// Cleartext listener with the same routes.
    pub plain_addr: SocketAddr,
    /// PEM of the CA that signed the upstream certificate.
    pub ca_pem_path: PathBuf,
    pub ca_pem: String,
    /// Bare repositories served over git smart HTTP: `<git_root>/owner/repo.git`.
    pub git_root: PathBuf,
    pub dir: tempfile::TempDir,
    log: Arc<Mutex<Vec<Recorded>>>,
    gzip_body: Bytes,
    /// The TLS listener (stopped on drop).
    _tls_server: Server,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What `/gzip` and `/encoded` serve, decoded: JSON-ish lines (no secret in them).
pub fn encoded_text() -> String {
    let mut text = String::new();
    for i in 0..2000 {
        text.push_str(&format!("{{\"line\":{i},\"text\":\"the quick brown fox\"}}\n"));
    }
    text
}

/// The gzip body served by `/gzip`: compressed JSON-ish text, bytes fixed for the life of the upstream.
fn make_gzip_body() -> Bytes {
    use std::io::Write as _;
    let text = encoded_text();
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(text.as_bytes()).expect("gzip write");
    Bytes::from(enc.finish().expect("gzip finish"))
}

/// Opaque bytes labelled `br` / `zstd` (a request body no one in the path decodes).
pub fn opaque_encoded_body(enc: &str) -> Bytes {
    let mut v: Vec<u8> = match enc {
        "zstd" => vec![0x28, 0xb5, 0x2f, 0xfd],
        _ => vec![0x1b, 0x03, 0x00, 0xf8],
    };
    v.extend((0..30_000u64).map(|i| ((i * 31 + 7) % 256) as u8));
    Bytes::from(v)
}

/// Names the upstream certificate covers beyond [`UPSTREAM_HOSTS`] (not mapped by the standard config; a test
/// that uses one adds its own `[resolve]` entry).
pub const EXTRA_CERT_HOSTS: [&str; 1] = ["deep.sub.github.com"];

/// Test upstream PKI: a CA and a leaf for [`UPSTREAM_HOSTS`], [`EXTRA_CERT_HOSTS`] and loopback.
fn upstream_pki() -> TestPki {
    let names: Vec<&str> = UPSTREAM_HOSTS
        .iter()
        .chain(EXTRA_CERT_HOSTS.iter())
        .copied()
        .chain(["127.0.0.1", "::1"])
        .collect();
    TestPki::new("LAP Test Upstream CA", &names)
}

fn run_git_sync(args: &[&str], cwd: &Path) {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(cwd)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "lap test")
        .env("GIT_AUTHOR_EMAIL", "test@lap.invalid")
        .env("GIT_COMMITTER_NAME", "lap test")
        .env("GIT_COMMITTER_EMAIL", "test@lap.invalid")
        .output()
        .expect("spawn git");
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Creates `<root>/owner/repo.git` (bare, receive-pack enabled) with one commit on `main`.
fn make_git_repo(root: &Path) {
    let bare = root.join("owner").join("repo.git");
    std::fs::create_dir_all(&bare).expect("mkdir bare");
    run_git_sync(&["init", "--bare", "-q", "-b", "main", "."], &bare);
    run_git_sync(&["config", "http.receivepack", "true"], &bare);
    let work = root.join("seed-work");
    std::fs::create_dir_all(&work).expect("mkdir work");
    run_git_sync(&["init", "-q", "-b", "main", "."], &work);
    std::fs::write(work.join("README.md"), "seed commit from the upstream stand-in\n").expect("write readme");
    run_git_sync(&["add", "README.md"], &work);
    run_git_sync(&["commit", "-q", "-m", "seed"], &work);
    let bare_s = bare.to_string_lossy().to_string();
    run_git_sync(&["push", "-q", &bare_s, "main"], &work);
}

impl Upstream {
    pub async fn start(opts: UpstreamOptions) -> Upstream {
        let dir = tempfile::tempdir().expect("upstream tempdir");
        let pki = upstream_pki();
        let ca_pem_path = pki.write_ca(dir.path(), "upstream-ca.pem");
        let ca_pem = pki.ca_pem.clone();
        let git_root = dir.path().join("git");
        make_git_repo(&git_root);

        let server_cfg = pki.server_config(match opts.alpn {
            Alpn::Both => &[b"h2", b"http/1.1"],
            Alpn::Http1Only => &[b"http/1.1"],
            Alpn::H2Only => &[b"h2"],
        });

        let log = Arc::new(Mutex::new(Vec::new()));
        let gzip_body = make_gzip_body();
        let ctx = Arc::new(Ctx {
            log: log.clone(),
            git_root: git_root.clone(),
            git_token: opts.git_token.clone(),
            gzip_body: gzip_body.clone(),
            br_body: super::ops::encode("br", encoded_text().as_bytes()).await.into(),
            zstd_body: super::ops::encode("zstd", encoded_text().as_bytes()).await.into(),
        });

        let plain_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind plain");
        let plain_addr = plain_listener.local_addr().expect("plain addr");

        let alpn_mode = opts.alpn;
        let tls_ctx = ctx.clone();
        let tls_server = serve_tls(server_cfg, move |tls| {
            let ctx = tls_ctx.clone();
            async move {
                let (_, conn) = tls.get_ref();
                let alpn = conn.alpn_protocol().map(|p| String::from_utf8_lossy(p).to_string());
                let sni = conn.server_name().map(str::to_string);
                let h2 = alpn.as_deref() == Some("h2") || (alpn.is_none() && alpn_mode == Alpn::H2Only);
                let info = ConnInfo {
                    scheme: "https",
                    alpn,
                    sni,
                };
                serve_conn(TokioIo::new(tls), h2, ctx, info).await;
            }
        })
        .await;
        let tls_addr = tls_server.addr;
        let plain_ctx = ctx.clone();
        let plain_task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = plain_listener.accept().await else {
                    continue;
                };
                let ctx = plain_ctx.clone();
                tokio::spawn(async move {
                    let info = ConnInfo {
                        scheme: "http",
                        alpn: None,
                        sni: None,
                    };
                    serve_conn(TokioIo::new(tcp), false, ctx, info).await;
                });
            }
        });

        Upstream {
            tls_addr,
            plain_addr,
            ca_pem_path,
            ca_pem,
            git_root,
            dir,
            log,
            gzip_body,
            _tls_server: tls_server,
            tasks: vec![plain_task],
        }
    }

    /// Snapshot of every request recorded so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.log.lock().expect("log lock").clone()
    }

    /// Recorded requests whose path (without query) is `path`.
    pub fn requests_to(&self, path: &str) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.split('?').next() == Some(path))
            .collect()
    }

    /// The only request recorded for `path`; panics if there is not exactly one.
    pub fn only_request_to(&self, path: &str) -> Recorded {
        let mut v = self.requests_to(path);
        assert_eq!(
            v.len(),
            1,
            "expected exactly one upstream request to {path}, got {:#?}",
            self.requests()
        );
        v.remove(0)
    }

    /// Whether `needle` appears anywhere in any recorded request.
    pub fn saw(&self, needle: &str) -> bool {
        self.requests().iter().any(|r| r.contains(needle))
    }

    /// The bytes `/gzip` serves.
    pub fn gzip_body(&self) -> Bytes {
        self.gzip_body.clone()
    }

    /// `git log --format=%s -n 5 main` of the served bare repository.
    pub async fn git_log(&self) -> String {
        let out = tokio::process::Command::new("git")
            .args(["log", "--format=%s", "-n", "5", "main"])
            .current_dir(self.git_root.join("owner").join("repo.git"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .await
            .expect("git log");
        String::from_utf8_lossy(&out.stdout).to_string()
    }
}

async fn serve_conn<I>(io: TokioIo<I>, h2: bool, ctx: Arc<Ctx>, info: ConnInfo)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let ctx = ctx.clone();
        let info = info.clone();
        async move { Ok::<_, Infallible>(route(req, ctx, info).await) }
    });
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

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|e| match e {}).boxed_unsync()
}

fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed_unsync()
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then_some(v)
    })
}

fn query_u64(query: &str, key: &str, default: u64) -> u64 {
    query_param(query, key).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn version_str(v: hyper::Version) -> String {
    match v {
        hyper::Version::HTTP_09 => "HTTP/0.9",
        hyper::Version::HTTP_10 => "HTTP/1.0",
        hyper::Version::HTTP_11 => "HTTP/1.1",
        hyper::Version::HTTP_2 => "HTTP/2.0",
        hyper::Version::HTTP_3 => "HTTP/3.0",
        _ => "?",
    }
    .to_string()
}

fn record_head(req: &Request<Incoming>, info: &ConnInfo) -> Recorded {
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).to_string(),
            )
        })
        .collect();
    let authority = req.uri().authority().map(|a| a.to_string()).or_else(|| {
        req.headers()
            .get(hyper::header::HOST)
            .map(|h| String::from_utf8_lossy(h.as_bytes()).to_string())
    });
    Recorded {
        scheme: info.scheme,
        alpn: info.alpn.clone(),
        sni: info.sni.clone(),
        method: req.method().as_str().to_string(),
        path: req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into()),
        authority,
        version: version_str(req.version()),
        headers,
        body_len: None,
        body_sha256: None,
        body_prefix: Vec::new(),
    }
}

/// Reads `body` to the end, streaming: length, SHA-256, first 64 KiB.
async fn drain(mut body: Incoming) -> (u64, String, Vec<u8>) {
    let mut len = 0u64;
    let mut h = Sha256::new();
    let mut prefix = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { break };
        if let Ok(data) = frame.into_data() {
            len += data.len() as u64;
            h.update(&data);
            if prefix.len() < 65536 {
                let take = (65536 - prefix.len()).min(data.len());
                prefix.extend_from_slice(&data[..take]);
            }
        }
    }
    (len, h.finish(), prefix)
}

async fn route(req: Request<Incoming>, ctx: Arc<Ctx>, info: ConnInfo) -> Response<Body> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let mut rec = record_head(&req, &info);

    if path == "/reject401" {
        ctx.log.lock().expect("log").push(rec);
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("content-type", "text/plain")
            .body(full("rejected before reading the body\n"))
            .expect("response");
    }
    if path == "/ws" || path == "/ws-reflect" {
        return websocket(req, rec, ctx);
    }
    if is_git_path(&path) {
        return git(req, rec, ctx, path, query).await;
    }

    let (parts, body) = req.into_parts();
    let (len, sha, prefix) = drain(body).await;
    rec.body_len = Some(len);
    rec.body_sha256 = Some(sha.clone());
    rec.body_prefix = prefix;
    let echo = serde_json::json!({
        "method": rec.method,
        "path": rec.path,
        "version": rec.version,
        "headers": rec.headers,
        "body_len": len,
    });
    ctx.log.lock().expect("log").push(rec);

    match path.as_str() {
        "/echo" => Response::builder()
            .header("content-type", "application/json")
            .body(full(echo.to_string()))
            .expect("response"),
        "/upload" => Response::builder()
            .header("content-type", "application/json")
            .body(full(serde_json::json!({"len": len, "sha256": sha}).to_string()))
            .expect("response"),
        "/head" => Response::builder()
            .header("content-type", "text/plain")
            .body(full("head route body\n"))
            .expect("response"),
        "/204" => Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(empty())
            .expect("response"),
        "/304" => Response::builder()
            .status(StatusCode::NOT_MODIFIED)
            .header("etag", "\"v1\"")
            .body(empty())
            .expect("response"),
        "/gzip" => encoded_response("gzip", ctx.gzip_body.clone()),
        "/encoded" => {
            let enc = query_param(&query, "enc").unwrap_or("gzip");
            let bytes = match enc {
                "gzip" => ctx.gzip_body.clone(),
                "br" => ctx.br_body.clone(),
                "zstd" => ctx.zstd_body.clone(),
                other => opaque_encoded_body(other),
            };
            encoded_response(enc, bytes)
        }
        "/big" => big(&query),
        "/sse" => sse(&query),
        "/trailers" => {
            let echo = parts
                .headers
                .get("x-api-key")
                .cloned()
                .unwrap_or(hyper::header::HeaderValue::from_static(""));
            let mut trailers = hyper::HeaderMap::new();
            trailers.insert("x-echo", echo);
            let frames: Vec<Result<Frame<Bytes>, io::Error>> = vec![
                Ok(Frame::data(Bytes::from_static(b"body before trailers\n"))),
                Ok(Frame::trailers(trailers)),
            ];
            Response::builder()
                .header("content-type", "text/plain")
                .header("trailer", "x-echo")
                .body(StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync())
                .expect("response")
        }
        _ => {
            let _ = parts;
            Response::builder()
                .status(StatusCode::NOT_FOUND)
                .body(full("no such route\n"))
                .expect("response")
        }
    }
}

fn encoded_response(enc: &str, bytes: Bytes) -> Response<Body> {
    Response::builder()
        .header("content-type", "application/json")
        .header("content-encoding", enc)
        .header("content-length", bytes.len().to_string())
        .body(full(bytes))
        .expect("response")
}

fn big(query: &str) -> Response<Body> {
    let total = query_u64(query, "bytes", 1 << 20);
    let with_length = query_param(query, "length") != Some("0");
    const CHUNK: u64 = 64 * 1024;
    let stream = futures_util::stream::unfold(0u64, move |off| async move {
        if off >= total {
            return None;
        }
        let n = (total - off).min(CHUNK);
        let chunk: Vec<u8> = (off..off + n).map(pattern_byte).collect();
        Some((Ok::<_, io::Error>(Frame::data(Bytes::from(chunk))), off + n))
    });
    let mut b = Response::builder().header("content-type", "application/octet-stream");
    if with_length {
        b = b.header("content-length", total.to_string());
    }
    b.body(StreamBody::new(stream).boxed_unsync()).expect("response")
}

/// One SSE event, padded so the whole event is about 40 bytes.
fn sse_event(n: u64) -> Bytes {
    let data = format!("{{\"n\":{n},\"t\":{}}}", super::now_ms());
    let mut ev = format!("data: {data}\n\n");
    if ev.len() < 40 {
        let pad = 40 - ev.len();
        ev = format!(":{}\n{ev}", "p".repeat(pad.saturating_sub(2)));
    }
    Bytes::from(ev)
}

fn sse(query: &str) -> Response<Body> {
    let events = query_u64(query, "events", 5);
    let interval = Duration::from_millis(query_u64(query, "interval_ms", 100));
    let initial = Duration::from_millis(query_u64(query, "initial_delay_ms", 0));
    let stream = futures_util::stream::unfold(0u64, move |n| async move {
        if n >= events {
            return None;
        }
        tokio::time::sleep(if n == 0 { initial } else { interval }).await;
        Some((Ok::<_, io::Error>(Frame::data(sse_event(n + 1))), n + 1))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(StreamBody::new(stream).boxed_unsync())
        .expect("response")
}

fn websocket(mut req: Request<Incoming>, rec: Recorded, ctx: Arc<Ctx>) -> Response<Body> {
    use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
    use tokio_tungstenite::tungstenite::protocol::Role;
    ctx.log.lock().expect("log").push(rec);
    let is_upgrade = req
        .headers()
        .get(hyper::header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        return Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(full("missing sec-websocket-key\n"))
            .expect("response");
    };
    if !is_upgrade {
        return Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(full("missing upgrade: websocket\n"))
            .expect("response");
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    let reflect = (req.uri().path() == "/ws-reflect").then(|| {
        req.headers()
            .get("x-api-key")
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default()
    });
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut ws =
            tokio_tungstenite::WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        if let Some(value) = reflect {
            use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
            use tokio_tungstenite::tungstenite::protocol::frame::Frame as WsFrame;
            use tokio_tungstenite::tungstenite::Message;
            let text = format!("{{\"echo\":\"{}\"}}", String::from_utf8_lossy(&value));
            let (a, b) = value.split_at(value.len() / 2);
            let first = [b"bin:".as_slice(), a].concat();
            let second = [b, b":end".as_slice()].concat();
            let _ = ws.send(Message::text(text)).await;
            let _ = ws
                .send(Message::Frame(WsFrame::message(
                    first,
                    OpCode::Data(Data::Binary),
                    false,
                )))
                .await;
            let _ = ws
                .send(Message::Frame(WsFrame::message(
                    second,
                    OpCode::Data(Data::Continue),
                    true,
                )))
                .await;
            let _ = ws.close(None).await;
            while let Some(Ok(_)) = ws.next().await {}
            return;
        }
        while let Some(Ok(msg)) = ws.next().await {
            if msg.is_text() || msg.is_binary() {
                if ws.send(msg).await.is_err() {
                    break;
                }
            } else if msg.is_close() {
                let _ = ws.close(None).await;
                break;
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", derive_accept_key(key.as_bytes()))
        .body(empty())
        .expect("response")
}

fn is_git_path(path: &str) -> bool {
    let mut it = path.trim_start_matches('/').splitn(3, '/');
    let (Some(owner), Some(repo)) = (it.next(), it.next()) else {
        return false;
    };
    !owner.is_empty() && repo.ends_with(".git") && repo.len() > 4
}

async fn git(req: Request<Incoming>, mut rec: Recorded, ctx: Arc<Ctx>, path: String, query: String) -> Response<Body> {
    if let Some(token) = &ctx.git_token {
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{token}"))
        );
        match req.headers().get(hyper::header::AUTHORIZATION) {
            None => {
                ctx.log.lock().expect("log").push(rec);
                return Response::builder()
                    .status(StatusCode::UNAUTHORIZED)
                    .header("www-authenticate", "Basic realm=\"git\"")
                    .body(full("authentication required\n"))
                    .expect("response");
            }
            Some(v) if v.as_bytes() != expected.as_bytes() => {
                ctx.log.lock().expect("log").push(rec);
                return Response::builder()
                    .status(StatusCode::FORBIDDEN)
                    .body(full("wrong credentials\n"))
                    .expect("response");
            }
            Some(_) => {}
        }
    }
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            ctx.log.lock().expect("log").push(rec);
            return Response::builder()
                .status(StatusCode::BAD_REQUEST)
                .body(full(format!("body error: {e}\n")))
                .expect("response");
        }
    };
    rec.body_len = Some(body.len() as u64);
    rec.body_sha256 = Some(super::sha256_hex(&body));
    rec.body_prefix = body[..body.len().min(65536)].to_vec();
    ctx.log.lock().expect("log").push(rec);

    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &ctx.git_root)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_PROJECT_ROOT", &ctx.git_root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("PATH_INFO", &path)
        .env("QUERY_STRING", &query)
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("REMOTE_USER", "x-access-token")
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in &parts.headers {
        let name = k.as_str();
        if name == "content-type" {
            cmd.env("CONTENT_TYPE", String::from_utf8_lossy(v.as_bytes()).to_string());
        } else if name != "content-length" && name != "authorization" {
            cmd.env(
                format!("HTTP_{}", name.to_ascii_uppercase().replace('-', "_")),
                String::from_utf8_lossy(v.as_bytes()).to_string(),
            );
        }
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .body(full(format!("spawn git http-backend: {e}\n")))
                .expect("response")
        }
    };
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(&body).await;
        let _ = stdin.shutdown().await;
    });
    let out = match child.wait_with_output().await {
        Ok(o) => o,
        Err(e) => {
            return Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .body(full(format!("git http-backend: {e}\n")))
                .expect("response")
        }
    };
    let _ = writer.await;
    cgi_response(&out.stdout, &out.stderr)
}

/// Turns CGI output (headers, blank line, body) into a response.
fn cgi_response(stdout: &[u8], stderr: &[u8]) -> Response<Body> {
    let split = stdout
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| (p, p + 4))
        .or_else(|| stdout.windows(2).position(|w| w == b"\n\n").map(|p| (p, p + 2)));
    let Some((head_end, body_start)) = split else {
        return Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .body(full(format!("bad CGI output: {}\n", String::from_utf8_lossy(stderr))))
            .expect("response");
    };
    let head = String::from_utf8_lossy(&stdout[..head_end]).to_string();
    let mut b = Response::builder();
    let mut status = 200u16;
    for line in head.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        if k.eq_ignore_ascii_case("status") {
            status = v.split_whitespace().next().and_then(|s| s.parse().ok()).unwrap_or(500);
        } else if !k.trim().eq_ignore_ascii_case("content-length") {
            b = b.header(k.trim(), v);
        }
    }
    let body = Bytes::copy_from_slice(&stdout[body_start..]);
    b.status(status)
        .header("content-length", body.len().to_string())
        .body(full(body))
        .expect("response")
}
