//! Spawning the `vault-sidecar` binary with a TOML config (SPEC §2.1) and talking to its admin port.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{
    Upstream, ALL_REALS, ANTHROPIC_REAL, ANTHROPIC_STUB, BODY_REAL, BODY_STUB, GITHUB_REAL, GITHUB_STUB, QUERY_REAL,
    QUERY_STUB, UPSTREAM_HOSTS,
};

/// Path of the binary under test.
pub const SIDECAR_BIN: &str = env!("CARGO_BIN_EXE_vault-sidecar");

/// One `[[secrets]]` entry.
#[derive(Clone, Debug)]
pub struct SecretSpec {
    pub name: String,
    pub stub: String,
    pub value: String,
    pub hosts: Vec<String>,
    pub locations: Vec<String>,
}

impl SecretSpec {
    pub fn new(name: &str, stub: &str, value: &str, hosts: &[&str], locations: &[&str]) -> Self {
        Self {
            name: name.into(),
            stub: stub.into(),
            value: value.into(),
            hosts: hosts.iter().map(|s| s.to_string()).collect(),
            locations: locations.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// Quiet time after which the sidecar's stdout counts as settled: ten of its batching delays.
pub const LOG_SETTLE: Duration =
    Duration::from_millis(10 * lap_vault_sidecar::logwriter::FLUSH_DELAY.as_millis() as u64);

/// Everything the tests vary in the sidecar config; `listen`, `admin_listen` and `ca_cert_path` are filled in
/// by [`Sidecar::start`].
#[derive(Clone, Debug, Default)]
pub struct SidecarConfig {
    /// `None`: key omitted (default "bound-hosts").
    pub intercept: Option<String>,
    /// `host:port` -> `addr:port`.
    pub resolve: Vec<(String, String)>,
    pub upstream_ca_files: Vec<PathBuf>,
    pub egress_allow: Vec<String>,
    pub egress_deny: Vec<String>,
    /// `[egress] deny_local`.
    pub egress_deny_local: bool,
    pub secrets: Vec<SecretSpec>,
    /// `secrets_file = ...` when set.
    pub secrets_file: Option<PathBuf>,
    /// Top-level keys set in the rendered document (e.g. `body_tripwire`, `passthrough`).
    pub keys: toml::Table,
    /// Raw TOML appended after the rendered document (e.g. extra `[[secrets]]` with `value_file`).
    pub extra_toml: String,
    /// Pass the config path in `VAULT_CONFIG` instead of `--config`.
    pub config_via_env: bool,
    /// Extra environment for the sidecar process (e.g. for `value_env`).
    pub child_env: Vec<(String, String)>,
}

impl SidecarConfig {
    /// The standard test config: every upstream host mapped to `upstream` (443 → TLS, 80 → cleartext), the
    /// upstream CA trusted, and four secrets:
    /// ANTHROPIC_API_KEY (api.anthropic.com, header), GITHUB_TOKEN (github.com + api.github.com, header),
    /// QUERY_TOKEN (api.anthropic.com, query), BODY_TOKEN (api.anthropic.com, body).
    pub fn standard(upstream: &Upstream) -> Self {
        let mut resolve = Vec::new();
        for h in UPSTREAM_HOSTS {
            resolve.push((format!("{h}:443"), upstream.tls_addr.to_string()));
            resolve.push((format!("{h}:80"), upstream.plain_addr.to_string()));
        }
        Self {
            intercept: None,
            resolve,
            upstream_ca_files: vec![upstream.ca_pem_path.clone()],
            egress_allow: Vec::new(),
            egress_deny: Vec::new(),
            egress_deny_local: false,
            secrets_file: None,
            keys: toml::Table::new(),
            extra_toml: String::new(),
            config_via_env: false,
            child_env: Vec::new(),
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
                    &["github.com", "api.github.com"],
                    &["header"],
                ),
                SecretSpec::new(
                    "QUERY_TOKEN",
                    QUERY_STUB,
                    QUERY_REAL,
                    &["api.anthropic.com"],
                    &["query"],
                ),
                SecretSpec::new(
                    "BODY_TOKEN",
                    BODY_STUB,
                    BODY_REAL,
                    &["api.anthropic.com"],
                    &["body:POST /upload"],
                ),
            ],
        }
    }

    /// Renders the TOML file. Both ports are port 0: the sidecar binds them and reports the
    /// addresses in `ready_file` ([`await_ready_file`]), so no port is picked that another process
    /// could take first.
    pub fn to_toml(&self, ready_file: &Path, ca_path: &Path) -> String {
        let mut root = toml::Table::new();
        root.insert("listen".into(), "127.0.0.1:0".into());
        root.insert("admin_listen".into(), "127.0.0.1:0".into());
        root.insert("ready_file".into(), ready_file.to_string_lossy().to_string().into());
        root.insert("ca_cert_path".into(), ca_path.to_string_lossy().to_string().into());
        root.insert(
            "upstream_ca_files".into(),
            toml::Value::Array(
                self.upstream_ca_files
                    .iter()
                    .map(|p| p.to_string_lossy().to_string().into())
                    .collect(),
            ),
        );
        if let Some(i) = &self.intercept {
            root.insert("intercept".into(), i.clone().into());
        }
        root.extend(self.keys.clone());
        let mut resolve = toml::Table::new();
        for (k, v) in &self.resolve {
            resolve.insert(k.clone(), v.clone().into());
        }
        root.insert("resolve".into(), resolve.into());
        let mut egress = toml::Table::new();
        let arr = |v: &Vec<String>| toml::Value::Array(v.iter().map(|s| toml::Value::from(s.clone())).collect());
        egress.insert("allow".into(), arr(&self.egress_allow));
        egress.insert("deny".into(), arr(&self.egress_deny));
        if self.egress_deny_local {
            egress.insert("deny_local".into(), true.into());
        }
        root.insert("egress".into(), egress.into());
        let secrets: Vec<toml::Value> = self
            .secrets
            .iter()
            .map(|s| {
                let mut t = toml::Table::new();
                t.insert("name".into(), s.name.clone().into());
                t.insert("stub".into(), s.stub.clone().into());
                t.insert("value".into(), s.value.clone().into());
                t.insert("hosts".into(), arr(&s.hosts));
                t.insert("locations".into(), arr(&s.locations));
                toml::Value::Table(t)
            })
            .collect();
        root.insert("secrets".into(), toml::Value::Array(secrets));
        if let Some(f) = &self.secrets_file {
            root.insert("secrets_file".into(), f.to_string_lossy().to_string().into());
        }
        let mut text = toml::to_string(&root).expect("render sidecar toml");
        text.push('\n');
        text.push_str(&self.extra_toml);
        text
    }
}

/// A loopback address nothing listens on: bound to port 0, then closed (for "upstream refused"
/// cases; never a port to start a server on).
pub fn free_port() -> SocketAddr {
    let l = StdListener::bind("127.0.0.1:0").expect("bind port 0");
    l.local_addr().expect("local addr")
}

/// Wait until the sidecar `child` has written `ready_file` (after binding its ports and writing
/// its CA) and answers `/readyz`; returns its proxy and admin addresses. `logs` explains a
/// failure.
pub async fn await_ready_file(
    child: &mut Child,
    ready_file: &Path,
    logs: &dyn Fn() -> String,
) -> Result<(SocketAddr, SocketAddr), String> {
    #[derive(serde::Deserialize)]
    struct Ready {
        listen: SocketAddr,
        admin_listen: SocketAddr,
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ready = None;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "vault-sidecar exited before ready ({status}); output:\n{}",
                logs()
            ));
        }
        if ready.is_none() {
            // Written atomically (a temporary file renamed): present means complete.
            if let Ok(text) = std::fs::read(ready_file) {
                let r: Ready = serde_json::from_slice(&text)
                    .map_err(|e| format!("{}: not the ready file's JSON: {e}", ready_file.display()))?;
                ready = Some((r.listen, r.admin_listen));
            }
        }
        if let Some((proxy, admin)) = ready {
            if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(2), raw_get(admin, "/readyz", &[])).await {
                if r.status == 200 {
                    return Ok((proxy, admin));
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!("vault-sidecar not ready within 30 s; output:\n{}", logs()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running sidecar process; killed on drop.
pub struct Sidecar {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    /// Where the sidecar wrote its CA certificate.
    pub ca_path: PathBuf,
    pub config_path: PathBuf,
    pub dir: tempfile::TempDir,
    pub stdout_path: PathBuf,
    pub stderr_path: PathBuf,
    child: Child,
    /// The admin token: `admin_token_file`'s, or the one the sidecar generated (read from the
    /// file its start-up log names).
    admin_token: std::sync::OnceLock<String>,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw HTTP response read off a socket.
#[derive(Clone, Debug, Default)]
pub struct RawResponse {
    /// Status line and header lines exactly as received, up to and including the blank line.
    pub head: String,
    pub version: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Whether the body came with `Transfer-Encoding: chunked`.
    pub chunked: bool,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }
}

impl Sidecar {
    /// Writes the config into a fresh temp dir, starts the binary and waits until it is ready: its
    /// ready file names the ports it bound, and `/readyz` answers.
    pub async fn start(cfg: SidecarConfig) -> Sidecar {
        let dir = tempfile::tempdir().expect("sidecar tempdir");
        let ca_path = dir.path().join("ca.pem");
        let ready_path = dir.path().join("ready.json");
        let config_path = dir.path().join("sidecar.toml");
        std::fs::write(&config_path, cfg.to_toml(&ready_path, &ca_path)).expect("write config");
        let stdout_path = dir.path().join("stdout.log");
        let stderr_path = dir.path().join("stderr.log");
        let stdout = std::fs::File::create(&stdout_path).expect("stdout file");
        let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
        let mut cmd = Command::new(SIDECAR_BIN);
        if cfg.config_via_env {
            cmd.env("VAULT_CONFIG", &config_path);
        } else {
            cmd.arg("--config").arg(&config_path);
        }
        for (k, v) in &cfg.child_env {
            cmd.env(k, v);
        }
        let child = cmd
            .env("RUST_LOG", "info")
            .env("LAP_LOG", "info")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("spawn vault-sidecar");
        let mut sc = Sidecar {
            proxy: SocketAddr::from(([0, 0, 0, 0], 0)),
            admin: SocketAddr::from(([0, 0, 0, 0], 0)),
            ca_path,
            config_path,
            dir,
            stdout_path,
            stderr_path,
            child,
            admin_token: std::sync::OnceLock::new(),
        };
        let stdout_path = sc.stdout_path.clone();
        let stderr_path = sc.stderr_path.clone();
        let logs = move || {
            format!(
                "--- stdout ---\n{}\n--- stderr ---\n{}",
                std::fs::read_to_string(&stdout_path).unwrap_or_default(),
                std::fs::read_to_string(&stderr_path).unwrap_or_default()
            )
        };
        match await_ready_file(&mut sc.child, &ready_path, &logs).await {
            Ok((proxy, admin)) => {
                sc.proxy = proxy;
                sc.admin = admin;
                sc
            }
            Err(e) => panic!("{e}"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://127.0.0.1:PORT`, for HTTPS_PROXY / --proxy.
    pub fn proxy_url(&self) -> String {
        format!("http://{}", self.proxy)
    }

    /// Captured stdout (JSON log lines), once it has settled: the sidecar writes its log in batches
    /// (`logwriter::FLUSH_DELAY` after a batch's first line), so a read right after a request could
    /// miss that request's lines. Reads until two reads [`LOG_SETTLE`] apart agree.
    pub fn stdout(&self) -> String {
        let read = || std::fs::read_to_string(&self.stdout_path).unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = read();
        loop {
            std::thread::sleep(LOG_SETTLE);
            let now = read();
            if now == last || Instant::now() > deadline {
                return now;
            }
            last = now;
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// stdout and stderr, for failure messages.
    pub fn logs(&self) -> String {
        format!("--- stdout ---\n{}\n--- stderr ---\n{}", self.stdout(), self.stderr())
    }

    /// stdout lines that parse as JSON objects.
    pub fn log_json(&self) -> Vec<serde_json::Value> {
        self.stdout()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v.is_object())
            .collect()
    }

    /// Panics if any real value appears anywhere in the sidecar's output.
    pub fn assert_logs_clean(&self) {
        let logs = self.logs();
        for real in ALL_REALS {
            assert!(
                !logs.contains(real),
                "a real secret value appears in the sidecar's logs:\n{logs}"
            );
        }
    }

    /// The sidecar's peak resident set (VmHWM) in KiB.
    pub fn vm_hwm_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/PID/status")
    }

    /// The admin token: the configured `admin_token_file`'s, else the generated one, whose
    /// path the start-up log names.
    pub fn admin_token(&self) -> String {
        self.admin_token
            .get_or_init(|| {
                let config = std::fs::read_to_string(&self.config_path).unwrap_or_default();
                let configured = config
                    .parse::<toml::Table>()
                    .ok()
                    .and_then(|t| t.get("admin_token_file").and_then(|v| v.as_str()).map(PathBuf::from));
                let path = configured.unwrap_or_else(|| {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    loop {
                        let found = self.log_json().into_iter().find_map(|l| {
                            (l["message"] == "no admin_token_file: generated an admin token")
                                .then(|| l["path"].as_str().map(PathBuf::from))
                                .flatten()
                        });
                        if let Some(p) = found {
                            break p;
                        }
                        assert!(
                            Instant::now() < deadline,
                            "no generated admin token in the log:\n{}",
                            self.logs()
                        );
                    }
                });
                std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("read admin token {}: {e}", path.display()))
                    .trim()
                    .to_owned()
            })
            .clone()
    }

    /// `GET path` on the admin port, with the admin token.
    pub async fn admin_get(&self, path: &str) -> RawResponse {
        let auth = format!("Bearer {}", self.admin_token());
        super::within(
            Duration::from_secs(10),
            "admin GET",
            raw_get(self.admin, path, &[("Authorization", &auth)]),
        )
        .await
        .expect("admin GET")
    }

    /// `METHOD path` with a JSON body on the admin port, with the admin token.
    pub async fn admin_request(&self, method: &str, path: &str, body: &[u8]) -> RawResponse {
        let auth = format!("Bearer {}", self.admin_token());
        super::within(
            Duration::from_secs(10),
            "admin request",
            raw_request(
                self.admin,
                method,
                path,
                &[("Authorization", &auth), ("Content-Type", "application/json")],
                body,
            ),
        )
        .await
        .expect("admin request")
    }

    /// The sidecar's CA certificate PEM as written to `ca_cert_path`.
    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(&self.ca_path).expect("read sidecar CA")
    }
}

/// Any request over a fresh connection (`Connection: close`), e.g. `POST /reload` on the admin port.
pub async fn raw_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<RawResponse> {
    use tokio::io::AsyncWriteExt as _;
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await?;
    s.write_all(body).await?;
    let mut r = tokio::io::BufReader::new(s);
    super::read_response(&mut r, method == "HEAD").await
}

/// Plain `GET` over a fresh connection (`Connection: close`).
pub async fn raw_get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> std::io::Result<RawResponse> {
    use tokio::io::AsyncWriteExt as _;
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut r = tokio::io::BufReader::new(s);
    super::read_response(&mut r, false).await
}

/// Runs `vault-sidecar <args>` to completion (for `check`), with a deadline.
pub async fn run_sidecar_cmd(args: &[&str]) -> std::process::Output {
    let fut = tokio::process::Command::new(SIDECAR_BIN)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    super::within(Duration::from_secs(30), "vault-sidecar command", fut)
        .await
        .expect("run vault-sidecar")
}

/// Keeps real values and stubs visible in one place for failure messages.
pub fn secret_table() -> [(&'static str, &'static str); 4] {
    [
        (ANTHROPIC_STUB, ANTHROPIC_REAL),
        (GITHUB_STUB, GITHUB_REAL),
        (QUERY_STUB, QUERY_REAL),
        (BODY_STUB, BODY_REAL),
    ]
}
