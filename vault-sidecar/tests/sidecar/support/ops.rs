//! Support for the operating and limits modules (`operating.rs`, `limits.rs`).
//!
//! - [`Scripted`]: a second TLS upstream whose routes misbehave on purpose: it reflects the (real) value it
//!   received into a response header and body, splits a real value across SSE chunks and waits for the
//!   test before sending the next event, serves a stored (level 0) gzip body that literally contains a real
//!   value, and streams an endless download whose cancellation it reports.
//! - [`OwnSidecar`]: the sidecar binary started from a config with extra *root* keys (e.g.
//!   `admin_token_file`), which [`super::SidecarConfig::extra_toml`] cannot express (it lands after tables).
//! - [`metric`]: reads one series (summed over matching label sets) from the Prometheus text.
//! - [`eventually`]: polls a condition with a deadline.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use lap_test_support::{serve_tls, Server, TestPki};
use tokio::sync::Notify;

use super::{
    await_ready_file, Curl, SecretSpec, SidecarConfig, ANTHROPIC_REAL, ANTHROPIC_STUB, GITHUB_REAL, GITHUB_STUB,
    SIDECAR_BIN,
};

type Body = UnsyncBoxBody<Bytes, io::Error>;

/// Hosts the scripted upstream's certificate covers (plus IP 127.0.0.1).
pub const SCRIPTED_HOSTS: [&str; 3] = ["api.anthropic.com", "api.github.com", "attacker.example"];

pub use lap_test_support::eventually;

/// Sum of the samples of `name` whose labels include every `(key, value)` of `labels`; `None` when no
/// series matches. `name` is the full sample name (e.g. `vault_injections_total`).
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut sum = None;
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (sname, slabels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if sname != name {
            continue;
        }
        let all = labels
            .iter()
            .all(|(k, v)| slabels.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
        if !all {
            continue;
        }
        if let Ok(v) = value.trim().parse::<f64>() {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}

/// `(path and query, headers)` of one request.
pub type SeenRequest = (String, Vec<(String, String)>);

/// What the scripted upstream observed.
#[derive(Default)]
pub struct ScriptState {
    /// TLS connections accepted.
    pub accepts: AtomicU64,
    /// `(path and query, headers)` of every request.
    pub requests: Mutex<Vec<SeenRequest>>,
    /// `/sse-split` sends its second event only after this is notified.
    pub release_second_event: Notify,
    /// `/endless`: bytes handed to hyper so far.
    pub endless_sent: AtomicU64,
    /// `/endless`: the response body stream was dropped (client gone, stream cancelled).
    pub endless_dropped: AtomicBool,
    pub endless_started: AtomicBool,
    /// `/silent`: requests waiting now (a request whose client or stream went away is dropped).
    pub silent_open: AtomicU64,
}

/// Counts a `/silent` request in `silent_open` while its handler lives.
struct SilentGuard(Arc<ScriptState>);

impl Drop for SilentGuard {
    fn drop(&mut self) {
        self.0.silent_open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ScriptState {
    pub fn paths(&self) -> Vec<String> {
        self.requests
            .lock()
            .expect("lock")
            .iter()
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Whether `needle` appears in any recorded path or header value.
    pub fn saw(&self, needle: &str) -> bool {
        self.requests
            .lock()
            .expect("lock")
            .iter()
            .any(|(p, h)| p.contains(needle) || h.iter().any(|(_, v)| v.contains(needle)))
    }

    /// Header `name` of the first request whose header `x-tag` is `tag`.
    pub fn header_for_tag(&self, tag: &str, name: &str) -> Option<String> {
        let reqs = self.requests.lock().expect("lock");
        let (_, headers) = reqs
            .iter()
            .find(|(_, h)| h.iter().any(|(k, v)| k == "x-tag" && v == tag))?;
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    }
}

/// The misbehaving upstream. Routes:
/// - `/reflect`: response header `x-reflect` and JSON body `{"seen": ...}` carry the request's `x-api-key`.
/// - `/sse-split`: event 1 carries `real` split across two chunks (sent 100 ms apart); event 2 follows only
///   after [`ScriptState::release_second_event`].
/// - `/gzip-real`: `Content-Encoding: gzip`, stored (uncompressed) deflate blocks, so `real` is in the bytes.
/// - `/endless`: 64 KiB chunks without end, counting bytes and reporting when the stream is dropped.
/// - anything else: 200 `ok`.
pub struct Scripted {
    pub addr: SocketAddr,
    pub ca_pem_path: PathBuf,
    pub state: Arc<ScriptState>,
    gzip: Bytes,
    _dir: tempfile::TempDir,
    _server: Server,
}

/// What `/encoded-real` serves (before encoding): JSON lines that hold `real`.
pub fn reflected_text(real: &str) -> String {
    format!("{{\"key\":\"{real}\"}}\n").repeat(50)
}

/// `bytes` in the content coding `enc` (`gzip`, `deflate` (zlib), `br`, `zstd`; anything else is
/// served as is, labelled with that coding).
pub async fn encode(enc: &str, bytes: &[u8]) -> Vec<u8> {
    use async_compression::tokio::bufread::{BrotliEncoder, GzipEncoder, ZlibEncoder, ZstdEncoder};
    use tokio::io::AsyncReadExt as _;
    let mut out = Vec::new();
    let read = match enc {
        "gzip" => GzipEncoder::new(bytes).read_to_end(&mut out).await,
        "deflate" => ZlibEncoder::new(bytes).read_to_end(&mut out).await,
        "br" => BrotliEncoder::new(bytes).read_to_end(&mut out).await,
        "zstd" => ZstdEncoder::new(bytes).read_to_end(&mut out).await,
        _ => {
            out.extend_from_slice(bytes);
            Ok(bytes.len())
        }
    };
    read.expect("encode");
    out
}

/// Percent-encoding of every byte but the unreserved ones (RFC 3986 §2.1).
pub fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A gzip member of stored deflate blocks: `text` appears verbatim in the bytes.
pub fn stored_gzip(text: &[u8]) -> Bytes {
    use std::io::Write as _;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
    enc.write_all(text).expect("gzip");
    Bytes::from(enc.finish().expect("gzip finish"))
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|e| match e {}).boxed_unsync()
}

/// Sets `endless_dropped` when the endless body is dropped.
struct DropFlag(Arc<ScriptState>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.endless_dropped.store(true, Ordering::SeqCst);
    }
}

impl Scripted {
    /// Starts the upstream; `real` is the value `/sse-split` and `/gzip-real` carry.
    pub async fn start(real: &str) -> Scripted {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut names = SCRIPTED_HOSTS.to_vec();
        names.push("127.0.0.1");
        let pki = TestPki::new("LAP Scripted Upstream CA", &names);
        let ca_pem_path = pki.write_ca(dir.path(), "scripted-ca.pem");
        let state = Arc::new(ScriptState::default());
        let gzip = stored_gzip(format!("{{\"key\":\"{real}\"}}\n").repeat(50).as_bytes());
        let real: Arc<str> = Arc::from(real);
        let st = state.clone();
        let gz = gzip.clone();
        let server = serve_tls(pki.server_config(&[b"h2", b"http/1.1"]), move |tls| {
            st.accepts.fetch_add(1, Ordering::SeqCst);
            let (st, real, gz) = (st.clone(), real.clone(), gz.clone());
            async move {
                let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (st, real, gz) = (st.clone(), real.clone(), gz.clone());
                    async move { Ok::<_, Infallible>(route(req, st, real, gz).await) }
                });
                let io = TokioIo::new(tls);
                if h2 {
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, svc)
                        .await;
                } else {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await;
                }
            }
        })
        .await;
        let addr = server.addr;
        Scripted {
            addr,
            ca_pem_path,
            state,
            gzip,
            _dir: dir,
            _server: server,
        }
    }

    /// Every request seen so far: `(path and query, headers)`.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.state.requests.lock().expect("lock").clone()
    }

    /// The exact bytes `/gzip-real` serves.
    pub fn gzip_bytes(&self) -> Bytes {
        self.gzip.clone()
    }

    /// A sidecar config pointing [`SCRIPTED_HOSTS`] (port 443) here, trusting this CA, with the
    /// ANTHROPIC_API_KEY (api.anthropic.com) and GITHUB_TOKEN (api.github.com) header secrets.
    pub fn sidecar_config(&self) -> SidecarConfig {
        SidecarConfig {
            resolve: SCRIPTED_HOSTS
                .iter()
                .map(|h| (format!("{h}:443"), self.addr.to_string()))
                .collect(),
            upstream_ca_files: vec![self.ca_pem_path.clone()],
            secrets: vec![
                SecretSpec::new(
                    "ANTHROPIC_API_KEY",
                    ANTHROPIC_STUB,
                    ANTHROPIC_REAL,
                    &["api.anthropic.com"],
                    &["header"],
                ),
                SecretSpec::new(
                    "GITHUB_TOKEN",
                    GITHUB_STUB,
                    GITHUB_REAL,
                    &["api.github.com"],
                    &["header"],
                ),
            ],
            ..SidecarConfig::default()
        }
    }
}

async fn route(req: Request<Incoming>, st: Arc<ScriptState>, real: Arc<str>, gz: Bytes) -> Response<Body> {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    st.requests.lock().expect("lock").push((path.clone(), headers));
    let seen = req
        .headers()
        .get("x-api-key")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default();
    let _ = req.into_body().collect().await;
    match path.split('?').next().unwrap_or("") {
        // Never answers: no response head, ever.
        "/silent" => {
            st.silent_open.fetch_add(1, Ordering::SeqCst);
            let _guard = SilentGuard(st.clone());
            std::future::pending().await
        }
        "/reflect" => {
            let body = serde_json::json!({ "seen": seen }).to_string();
            Response::builder()
                .header("content-type", "application/json")
                .header("x-reflect", format!("key={seen}; scope=all"))
                .header("content-length", body.len().to_string())
                .body(full(body))
                .expect("response")
        }
        "/sse-split" => {
            let half = real.len() / 2;
            let chunks = vec![
                Bytes::from(format!("data: {{\"n\":1,\"key\":\"{}", &real[..half])),
                Bytes::from(format!("{}\"}}\n\n", &real[half..])),
                Bytes::from_static(b"data: {\"n\":2}\n\n"),
            ];
            let stream = futures_util::stream::unfold((0usize, chunks, st), |(i, chunks, st)| async move {
                if i >= chunks.len() {
                    return None;
                }
                if i == 1 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                if i == 2 {
                    let _ = tokio::time::timeout(Duration::from_secs(60), st.release_second_event.notified()).await;
                }
                let c = chunks[i].clone();
                Some((Ok::<_, io::Error>(Frame::data(c)), (i + 1, chunks, st)))
            });
            Response::builder()
                .header("content-type", "text/event-stream")
                .header("cache-control", "no-cache")
                .body(StreamBody::new(stream).boxed_unsync())
                .expect("response")
        }
        "/encoded-real" => {
            let enc = path.split("enc=").nth(1).unwrap_or("gzip").to_owned();
            let body = encode(&enc, reflected_text(&real).as_bytes()).await;
            Response::builder()
                .header("content-type", "application/json")
                .header("content-encoding", enc)
                .header("content-length", body.len().to_string())
                .body(full(body))
                .expect("response")
        }
        "/forms-real" => {
            use base64::Engine as _;
            let body = serde_json::json!({
                "b64": base64::engine::general_purpose::STANDARD.encode(real.as_bytes()),
                "b64url": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(real.as_bytes()),
                // Inside a longer base64 token, at an unaligned offset.
                "b64_inner": base64::engine::general_purpose::STANDARD.encode(format!("user:{real}:x")),
            })
            .to_string();
            Response::builder()
                .header("content-type", "application/json")
                .header("location", format!("https://cb.example/done?k={}", percent(&real)))
                .body(full(body))
                .expect("response")
        }
        "/gzip-real" => Response::builder()
            .header("content-type", "application/json")
            .header("content-encoding", "gzip")
            .header("content-length", gz.len().to_string())
            .body(full(gz))
            .expect("response"),
        "/endless" => {
            st.endless_started.store(true, Ordering::SeqCst);
            let guard = DropFlag(st.clone());
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let stream = futures_util::stream::unfold(guard, move |guard| {
                let chunk = chunk.clone();
                async move {
                    guard.0.endless_sent.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                    Some((Ok::<_, io::Error>(Frame::data(chunk)), guard))
                }
            });
            Response::builder()
                .header("content-type", "application/octet-stream")
                .body(StreamBody::new(stream).boxed_unsync())
                .expect("response")
        }
        _ => Response::builder().body(full("ok\n")).expect("response"),
    }
}

/// The sidecar started from `cfg` plus raw TOML `root_keys` placed before every table (e.g.
/// `admin_token_file = "..."`). Killed on drop.
pub struct OwnSidecar {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    pub ca_path: PathBuf,
    pub dir: tempfile::TempDir,
    pub stdout_path: PathBuf,
    child: Child,
}

impl Drop for OwnSidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl OwnSidecar {
    pub async fn start(cfg: &SidecarConfig, root_keys: &str) -> OwnSidecar {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_path = dir.path().join("ca.pem");
        let ready_path = dir.path().join("ready.json");
        let config_path = dir.path().join("sidecar.toml");
        let text = format!("{root_keys}\n{}", cfg.to_toml(&ready_path, &ca_path));
        std::fs::write(&config_path, text).expect("write config");
        let stdout_path = dir.path().join("stdout.log");
        let child = Command::new(SIDECAR_BIN)
            .arg("--config")
            .arg(&config_path)
            .env("LAP_LOG", "info")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout_path).expect("stdout"))
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sidecar");
        let mut s = OwnSidecar {
            proxy: SocketAddr::from(([0, 0, 0, 0], 0)),
            admin: SocketAddr::from(([0, 0, 0, 0], 0)),
            ca_path,
            dir,
            stdout_path,
            child,
        };
        let stdout_path = s.stdout_path.clone();
        let logs = move || std::fs::read_to_string(&stdout_path).unwrap_or_default();
        let (proxy, admin) = await_ready_file(&mut s.child, &ready_path, &logs)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        s.proxy = proxy;
        s.admin = admin;
        s
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout_path).unwrap_or_default()
    }

    /// curl with `--proxy` and `--cacert` for this sidecar.
    pub fn curl(&self) -> Curl {
        Curl::bare(self.dir.path())
            .arg("--proxy")
            .arg(format!("http://{}", self.proxy))
            .arg("--cacert")
            .arg(self.ca_path.to_string_lossy().to_string())
    }
}

/// `VmRSS` of process `pid` in KiB.
pub fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Open file descriptors of process `pid`.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Writes `{"secrets":[{name,stub,value,hosts,locations}]}` atomically (write + rename).
pub fn write_secrets_json(path: &Path, secrets: &[SecretSpec]) {
    let doc = serde_json::json!({
        "secrets": secrets.iter().map(|s| serde_json::json!({
            "name": s.name,
            "stub": s.stub,
            "value": s.value,
            "hosts": s.hosts,
            "locations": s.locations,
        })).collect::<Vec<_>>()
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, doc.to_string()).expect("write secrets tmp");
    std::fs::rename(&tmp, path).expect("rename secrets file");
}
