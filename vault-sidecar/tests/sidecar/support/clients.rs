//! Clients driven through the sidecar: raw sockets (CONNECT, TLS, HTTP/1.x framing), curl, git, python3, node,
//! openssl. Every call has a deadline.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::{within, RawResponse, Sidecar};

/// CA-bundle variables a developer machine may set globally; removed from every client's environment so
/// that only the CA a test names is trusted.
pub const CA_ENV_VARS: [&str; 7] = [
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "NODE_OPTIONS",
];

/// Default deadline for one client run.
pub const CLIENT_DEADLINE: Duration = Duration::from_secs(120);

fn parse_head(head: &str) -> (String, u16, Vec<(String, String)>) {
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("").to_string();
    let status = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    (version, status, headers)
}

/// Reads one response head (status line + headers + blank line) byte-exact, without consuming anything after it.
pub async fn read_head<R: AsyncBufRead + Unpin>(r: &mut R) -> std::io::Result<String> {
    let mut head = Vec::new();
    loop {
        let mut line = Vec::new();
        let n = r.read_until(b'\n', &mut line).await?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "connection closed inside a response head: {:?}",
                    String::from_utf8_lossy(&head)
                ),
            ));
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" || line == b"\n" {
            break;
        }
        if head.len() > 64 * 1024 {
            return Err(std::io::Error::other("response head over 64 KiB"));
        }
    }
    Ok(String::from_utf8_lossy(&head).to_string())
}

/// Reads one HTTP/1.x response with correct framing: no body for HEAD requests, 1xx, 204 and 304; chunked
/// decoding; Content-Length; otherwise to EOF. Interim 1xx responses are skipped.
pub async fn read_response<R: AsyncBufRead + Unpin>(r: &mut R, head_request: bool) -> std::io::Result<RawResponse> {
    loop {
        let head = read_head(r).await?;
        let (version, status, headers) = parse_head(&head);
        if status == 0 || !version.starts_with("HTTP/1.") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not an HTTP/1.x status line: {head:?}"),
            ));
        }
        if (100..200).contains(&status) && status != 101 {
            continue;
        }
        let mut resp = RawResponse {
            head,
            version,
            status,
            headers,
            body: Vec::new(),
            chunked: false,
        };
        if head_request || status == 204 || status == 304 || status == 101 {
            return Ok(resp);
        }
        let te = resp.header("transfer-encoding").map(|v| v.to_ascii_lowercase());
        if te.as_deref().is_some_and(|v| v.contains("chunked")) {
            resp.chunked = true;
            loop {
                let mut line = String::new();
                r.read_line(&mut line).await?;
                let size_hex = line.trim().split(';').next().unwrap_or("").trim();
                let size = usize::from_str_radix(size_hex, 16).map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad chunk size line {line:?}"))
                })?;
                if size == 0 {
                    // trailers until blank line
                    loop {
                        let mut t = String::new();
                        let n = r.read_line(&mut t).await?;
                        if n == 0 || t == "\r\n" || t == "\n" {
                            break;
                        }
                    }
                    break;
                }
                let mut chunk = vec![0u8; size];
                r.read_exact(&mut chunk).await?;
                resp.body.extend_from_slice(&chunk);
                let mut crlf = [0u8; 2];
                r.read_exact(&mut crlf).await?;
            }
        } else if let Some(cl) = resp.header("content-length") {
            let n: usize = cl
                .parse()
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad content-length"))?;
            resp.body = vec![0u8; n];
            r.read_exact(&mut resp.body).await?;
        } else {
            r.read_to_end(&mut resp.body).await?;
        }
        return Ok(resp);
    }
}

/// Sends `CONNECT target HTTP/1.1` to the proxy and reads the reply head byte-exact. For a non-2xx reply the
/// body (if framed by Content-Length) is read into the response too. The stream is positioned right after
/// the reply.
pub async fn connect_raw(proxy: SocketAddr, target: &str) -> (tokio::io::BufReader<TcpStream>, RawResponse) {
    let fut = async {
        let mut s = TcpStream::connect(proxy).await.expect("connect to proxy");
        s.set_nodelay(true).expect("nodelay");
        s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
            .await
            .expect("write CONNECT");
        let mut r = tokio::io::BufReader::with_capacity(1, s);
        let head = read_head(&mut r).await.expect("CONNECT reply head");
        let (version, status, headers) = parse_head(&head);
        let mut resp = RawResponse {
            head,
            version,
            status,
            headers,
            body: Vec::new(),
            chunked: false,
        };
        if !(200..300).contains(&status) {
            if let Some(n) = resp.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
                let mut body = vec![0u8; n];
                if r.read_exact(&mut body).await.is_ok() {
                    resp.body = body;
                }
            }
        }
        (r, resp)
    };
    within(Duration::from_secs(30), "CONNECT reply", fut).await
}

pub type ClientTls = tokio_rustls::client::TlsStream<tokio::io::BufReader<TcpStream>>;

/// A rustls client config trusting exactly the CA in `ca_pem_path`, offering `alpn`.
pub fn client_tls_config(ca_pem_path: &Path, alpn: &[&str]) -> rustls::ClientConfig {
    let pem = std::fs::read(ca_pem_path).expect("read CA pem");
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        roots.add(c.expect("CA pem parses")).expect("add root");
    }
    assert!(!roots.is_empty(), "no certificate in {ca_pem_path:?}");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("tls versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
    cfg
}

/// TLS handshake over an established tunnel.
pub async fn tls_over(
    stream: tokio::io::BufReader<TcpStream>,
    sni: &str,
    ca_pem_path: &Path,
    alpn: &[&str],
) -> std::io::Result<ClientTls> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_tls_config(ca_pem_path, alpn)));
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).expect("server name");
    within(
        Duration::from_secs(30),
        "TLS handshake through the tunnel",
        connector.connect(name, stream),
    )
    .await
}

/// CONNECT to `host:443` through the sidecar, expect 200, then TLS with the sidecar's CA.
pub async fn tunnel_tls(sidecar: &Sidecar, host: &str, alpn: &[&str]) -> ClientTls {
    let (s, reply) = connect_raw(sidecar.proxy, &format!("{host}:443")).await;
    assert_eq!(reply.status, 200, "CONNECT {host}:443 reply: {:?}", reply.head);
    tls_over(s, host, &sidecar.ca_path, alpn)
        .await
        .expect("TLS handshake with the sidecar's leaf")
}

/// A WebSocket client through the sidecar: CONNECT to `host:443`, TLS with the sidecar's CA, then
/// the handshake for `wss://{host}{path}` with `headers` (RFC 6455 §4.1), which must answer 101.
pub async fn ws_connect(
    sidecar: &Sidecar,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> tokio_tungstenite::WebSocketStream<ClientTls> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let tls = tunnel_tls(sidecar, host, &["http/1.1"]).await;
    let mut req = format!("wss://{host}{path}").into_client_request().expect("ws request");
    for (name, value) in headers {
        let name = http::HeaderName::from_bytes(name.as_bytes()).expect("header name");
        req.headers_mut().insert(name, value.parse().expect("header value"));
    }
    let (ws, resp) = within(
        Duration::from_secs(20),
        "WebSocket handshake through the sidecar",
        Box::pin(tokio_tungstenite::client_async(req, tls)),
    )
    .await
    .expect("WebSocket handshake");
    assert_eq!(resp.status(), 101);
    ws
}

/// Result of one curl run: the final response's status/headers/body plus the raw header dump (which also
/// holds any CONNECT reply and interim responses).
#[derive(Debug)]
pub struct CurlOut {
    pub exit: i32,
    /// `%{http_code}` (0 when no response).
    pub status: u16,
    /// `%{http_connect}`: status of the CONNECT reply (0 when none).
    pub connect_status: u16,
    /// `%{http_version}`: "1.0", "1.1", "2".
    pub http_version: String,
    /// Headers of the last response in the dump.
    pub headers: Vec<(String, String)>,
    pub header_dump: String,
    pub body: Vec<u8>,
    pub stderr: String,
}

impl CurlOut {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.body_text()))
    }
    /// Panics with the full story unless curl exited 0.
    pub fn ok(self) -> Self {
        assert_eq!(
            self.exit,
            0,
            "curl failed (exit {}): {}\nheaders:\n{}\nbody: {}",
            self.exit,
            self.stderr,
            self.header_dump,
            self.body_text()
        );
        self
    }
}

static CURL_SEQ: AtomicU64 = AtomicU64::new(0);

/// A curl invocation preset with `--proxy` and `--cacert` for one sidecar.
pub struct Curl {
    args: Vec<String>,
    workdir: PathBuf,
}

impl Curl {
    /// curl with no proxy and no CA (for direct fetches and custom setups); output files under `workdir`.
    pub fn bare(workdir: &Path) -> Curl {
        Curl {
            args: vec![
                "-sS".into(),
                "--max-time".into(),
                "110".into(),
                "--noproxy".into(),
                "".into(),
            ],
            workdir: workdir.to_path_buf(),
        }
    }

    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }

    pub fn args<I, S>(mut self, it: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(it.into_iter().map(Into::into));
        self
    }

    pub async fn run(self) -> CurlOut {
        let seq = CURL_SEQ.fetch_add(1, Ordering::Relaxed);
        let hdr = self.workdir.join(format!("curl-{seq}.headers"));
        let body = self.workdir.join(format!("curl-{seq}.body"));
        let mut cmd = tokio::process::Command::new("curl");
        cmd.args(&self.args)
            .arg("-D")
            .arg(&hdr)
            .arg("-o")
            .arg(&body)
            .arg("-w")
            .arg("%{http_code} %{http_connect} %{http_version}")
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy")
            .env_remove("ALL_PROXY")
            .env_remove("all_proxy")
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        for v in CA_ENV_VARS {
            cmd.env_remove(v);
        }
        let out = within(CLIENT_DEADLINE, "curl", cmd.output()).await.expect("spawn curl");
        let w = String::from_utf8_lossy(&out.stdout).to_string();
        let mut it = w.split_whitespace();
        let status = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let connect_status = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let http_version = it.next().unwrap_or("").to_string();
        let header_dump = std::fs::read_to_string(&hdr).unwrap_or_default();
        let headers = last_header_block(&header_dump);
        let body_bytes = std::fs::read(&body).unwrap_or_default();
        CurlOut {
            exit: out.status.code().unwrap_or(-1),
            status,
            connect_status,
            http_version,
            headers,
            header_dump,
            body: body_bytes,
            stderr: String::from_utf8_lossy(&out.stderr).to_string(),
        }
    }
}

/// Headers of the last response block in a curl `-D` dump.
pub fn last_header_block(dump: &str) -> Vec<(String, String)> {
    let norm = dump.replace("\r\n", "\n");
    let block = norm
        .split("\n\n")
        .filter(|b| b.trim_start().starts_with("HTTP/"))
        .last()
        .unwrap_or("");
    block
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

impl Sidecar {
    /// curl preset: `--proxy http://PROXY --cacert CA`.
    pub fn curl(&self) -> Curl {
        Curl::bare(self.dir.path())
            .arg("--proxy")
            .arg(self.proxy_url())
            .arg("--cacert")
            .arg(self.ca_path.to_string_lossy().to_string())
    }

    /// Environment a harness gets (SPEC §2.3) for tools that read proxy variables.
    pub fn client_env(&self) -> Vec<(String, String)> {
        let url = self.proxy_url();
        let ca = self.ca_path.to_string_lossy().to_string();
        vec![
            ("HTTPS_PROXY".into(), url.clone()),
            ("https_proxy".into(), url.clone()),
            ("HTTP_PROXY".into(), url.clone()),
            ("http_proxy".into(), url),
            ("NO_PROXY".into(), "localhost,::1".into()),
            ("no_proxy".into(), "localhost,::1".into()),
            ("GIT_SSL_CAINFO".into(), ca.clone()),
            ("SSL_CERT_FILE".into(), ca.clone()),
            ("CURL_CA_BUNDLE".into(), ca.clone()),
            ("NODE_EXTRA_CA_CERTS".into(), ca),
        ]
    }
}

/// Output of a finished program.
#[derive(Debug)]
pub struct ProgOut {
    pub exit: i32,
    pub stdout: String,
    pub stderr: String,
}

impl ProgOut {
    pub fn ok(self, what: &str) -> Self {
        assert_eq!(
            self.exit, 0,
            "{what} failed (exit {}):\nstdout: {}\nstderr: {}",
            self.exit, self.stdout, self.stderr
        );
        self
    }
}

/// Runs `program args` with extra env, stdin closed, under a deadline.
pub async fn run_prog(program: &str, args: &[&str], env: &[(String, String)], cwd: Option<&Path>) -> ProgOut {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for v in CA_ENV_VARS {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let out = within(CLIENT_DEADLINE, program, cmd.output())
        .await
        .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
    ProgOut {
        exit: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

/// `python3 -c script args...`.
pub async fn run_python(script: &str, args: &[&str], env: &[(String, String)]) -> ProgOut {
    let mut a = vec!["-c", script];
    a.extend_from_slice(args);
    run_prog("python3", &a, env, None).await
}

/// `node -e script args...` (args are `process.argv[1..]`).
pub async fn run_node(script: &str, args: &[&str], env: &[(String, String)]) -> ProgOut {
    let mut a = vec!["-e", script, "--"];
    a.extend_from_slice(args);
    run_prog("node", &a, env, None).await
}

/// `git args...` with an isolated config (no system/global), a fixed identity, no prompts, plus `env`.
pub async fn run_git(args: &[&str], cwd: &Path, env: &[(String, String)]) -> ProgOut {
    let mut all: Vec<(String, String)> = vec![
        ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
        ("GIT_CONFIG_GLOBAL".into(), "/dev/null".into()),
        ("GIT_TERMINAL_PROMPT".into(), "0".into()),
        ("GIT_ASKPASS".into(), "/bin/false".into()),
        ("GIT_AUTHOR_NAME".into(), "lap test".into()),
        ("GIT_AUTHOR_EMAIL".into(), "test@lap.invalid".into()),
        ("GIT_COMMITTER_NAME".into(), "lap test".into()),
        ("GIT_COMMITTER_EMAIL".into(), "test@lap.invalid".into()),
        ("HOME".into(), cwd.to_string_lossy().to_string()),
    ];
    all.extend_from_slice(env);
    run_prog("git", args, &all, Some(cwd)).await
}

/// One SSE event as seen by the client.
#[derive(Clone, Debug)]
pub struct SseSeen {
    pub n: u64,
    /// Upstream's clock when it sent the event (ms since epoch).
    pub sent_ms: u64,
    /// Client's clock when the event's data line arrived.
    pub recv_ms: u64,
}

/// Runs `curl -N` through the sidecar for `url` and reads the SSE data lines as they arrive, timestamping each.
pub async fn curl_sse(sidecar: &Sidecar, url: &str, extra: &[&str], deadline: Duration) -> Vec<SseSeen> {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sS", "-N", "--no-buffer"])
        .args(["--max-time", &deadline.as_secs().to_string()])
        .args(["--noproxy", ""])
        .arg("--proxy")
        .arg(sidecar.proxy_url())
        .arg("--cacert")
        .arg(&sidecar.ca_path)
        .args(extra)
        .arg(url)
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env_remove("CURL_CA_BUNDLE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn curl");
    let stdout = child.stdout.take().expect("curl stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut seen = Vec::new();
    let read_all = async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(data) = line.strip_prefix("data: ") {
                let recv_ms = super::now_ms();
                let v: serde_json::Value = serde_json::from_str(data).expect("event data is JSON");
                seen.push(SseSeen {
                    n: v["n"].as_u64().expect("n"),
                    sent_ms: v["t"].as_u64().expect("t"),
                    recv_ms,
                });
            }
        }
    };
    within(deadline + Duration::from_secs(10), "SSE stream", read_all).await;
    let status = within(Duration::from_secs(10), "curl exit", child.wait())
        .await
        .expect("curl wait");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err).await;
    }
    assert!(status.success(), "curl SSE failed ({status}): {err}");
    seen
}

/// Writes `len` pattern bytes to `path` (1 MiB at a time).
pub fn write_pattern_file(path: &Path, len: u64) {
    use std::io::Write as _;
    let f = std::fs::File::create(path).expect("create pattern file");
    let mut w = std::io::BufWriter::new(f);
    let mut off = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while off < len {
        let n = ((len - off) as usize).min(buf.len());
        for (k, b) in buf[..n].iter_mut().enumerate() {
            *b = super::pattern_byte(off + k as u64);
        }
        w.write_all(&buf[..n]).expect("write pattern");
        off += n as u64;
    }
    w.flush().expect("flush pattern");
}

/// First PEM certificate in `text` (e.g. `openssl s_client -showcerts` output).
pub fn first_pem_cert(text: &str) -> Option<String> {
    let start = text.find("-----BEGIN CERTIFICATE-----")?;
    let end_marker = "-----END CERTIFICATE-----";
    let end = text[start..].find(end_marker)? + start + end_marker.len();
    Some(format!("{}\n", &text[start..end]))
}

/// Every PEM certificate in `text`.
pub fn all_pem_certs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(c) = first_pem_cert(rest) {
        let idx = rest.find("-----END CERTIFICATE-----").expect("end") + 25;
        out.push(c);
        rest = &rest[idx..];
    }
    out
}

/// A request body of `len` pattern bytes, streamed in 64 KiB chunks.
pub fn pattern_body(len: u64) -> http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, std::io::Error> {
    use http_body_util::BodyExt as _;
    let stream = futures_util::stream::unfold(0u64, move |off| async move {
        if off >= len {
            return None;
        }
        let n = (len - off).min(64 * 1024);
        let chunk: Vec<u8> = (off..off + n).map(super::pattern_byte).collect();
        Some((
            Ok::<_, std::io::Error>(hyper::body::Frame::data(bytes::Bytes::from(chunk))),
            off + n,
        ))
    });
    http_body_util::StreamBody::new(stream).boxed_unsync()
}

/// One h2 request through a CONNECT tunnel to `host:443` (ALPN h2 only, sidecar CA), using hyper's client.
/// The response is complete when returned; a reset of the request stream after the response does not fail it.
pub async fn h2_request(
    sidecar: &Sidecar,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: http_body_util::combinators::UnsyncBoxBody<bytes::Bytes, std::io::Error>,
) -> RawResponse {
    use http_body_util::BodyExt as _;
    let tls = tunnel_tls(sidecar, host, &["h2"]).await;
    assert_eq!(
        tls.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "the sidecar must accept the client's h2 offer"
    );
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    let conn_task = tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("https://{host}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(body).expect("request");
    let fut = async {
        let resp = sender.send_request(req).await.expect("h2 response head");
        let status = resp.status().as_u16();
        let hdrs = resp
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).to_string(),
                )
            })
            .collect();
        let body = resp
            .into_body()
            .collect()
            .await
            .expect("h2 response body")
            .to_bytes()
            .to_vec();
        RawResponse {
            head: String::new(),
            version: "HTTP/2".into(),
            status,
            headers: hdrs,
            body,
            chunked: false,
        }
    };
    let resp = within(Duration::from_secs(30), "h2 request through the sidecar", fut).await;
    conn_task.abort();
    resp
}

/// Accepts any server certificate: for tests that must get past the client-side name check to observe what
/// the sidecar itself does (e.g. with an SNI that differs from the CONNECT target).
#[derive(Debug)]
struct AcceptAnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// TLS over an established tunnel sending SNI `sni`, without verifying the server's certificate.
pub async fn tls_over_unverified(
    stream: tokio::io::BufReader<TcpStream>,
    sni: &str,
    alpn: &[&str],
) -> std::io::Result<ClientTls> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("tls versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).expect("server name");
    within(
        Duration::from_secs(30),
        "unverified TLS handshake through the tunnel",
        connector.connect(name, stream),
    )
    .await
}
