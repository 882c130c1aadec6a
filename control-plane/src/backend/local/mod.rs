//! The local backend (SPEC §3.4): per session, a `vault-sidecar` and a `lap-harness` process on
//! loopback, in a private directory (0700) under `<data dir>/sandboxes/<session id>/`:
//!
//! ```text
//! sidecar.toml   0600  the sidecar's config (toml::to_string of SidecarConfig)
//! secrets.json   0600  {"secrets":[...]}: real values; rewritten on rotation, then POST /reload
//! admin_token    0600  Bearer for the sidecar's /interceptions and /reload
//! ca.pem               written by the sidecar at start (NODE_EXTRA_CA_CERTS)
//! ca-bundle.pem        system roots + ca.pem (SSL_CERT_FILE and friends)
//! home/ tmp/           the harness's HOME and TMPDIR; home/workspace is its working directory
//! sidecar.log harness.log
//! ```
//!
//! Bring-up: write the files, start the sidecar, poll its `/readyz`, then start the harness with
//! the SPEC §2.3 environment and poll its `/healthz`. Each process leads its own process group,
//! so a restarted `lap-server` finds them still running and adopts them (by pid and URL).

use std::collections::HashSet;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lap_vault_sidecar::config::{EgressConfig, SecretSpec, SecretsFile, SidecarConfig};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use super::{BackendError, Liveness, SandboxBackend, SandboxHandle, SandboxSpec};

/// How long the sidecar may take to answer `/readyz`.
const SIDECAR_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the harness may take to answer `/healthz` (it may clone a repository first).
const HARNESS_READY_TIMEOUT: Duration = Duration::from_secs(300);
/// A sandbox directory younger than this is never swept as an orphan.
const ORPHAN_GRACE: Duration = Duration::from_secs(10);
/// Grace between SIGTERM and SIGKILL on stop.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Where system roots are found, first match wins.
const SYSTEM_ROOTS: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

/// Settings of the local backend.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// `<data dir>/sandboxes`.
    pub root: PathBuf,
    pub sidecar_bin: PathBuf,
    pub harness_bin: PathBuf,
    /// From `LAP_SIDECAR_BASE_CONFIG`: resolve, upstream_ca_files, egress, intercept.
    pub base: SidecarConfig,
}

/// What the local backend keeps in [`SandboxHandle::detail`].
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LocalDetail {
    dir: PathBuf,
    sidecar_pid: i32,
    harness_pid: i32,
    admin_token: String,
}

/// Runs sandboxes as local processes.
#[derive(Debug)]
pub struct LocalBackend {
    config: LocalConfig,
    http: reqwest::Client,
    /// Children this process started, by pid, reaped in the background.
    exited: std::sync::Arc<Mutex<HashSet<i32>>>,
}

fn failed(msg: impl Into<String>) -> BackendError {
    BackendError::Failed(msg.into())
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackendError {
    let what = what.into();
    move |source| BackendError::Io { what, source }
}

/// Three distinct free loopback ports (all bound at once, then released).
fn free_ports() -> Result<(u16, u16, u16), BackendError> {
    let bind = || TcpListener::bind("127.0.0.1:0").map_err(io("cannot bind a loopback port"));
    let (a, b, c) = (bind()?, bind()?, bind()?);
    let port = |l: &TcpListener| {
        l.local_addr()
            .map(|a| a.port())
            .map_err(io("cannot read a loopback port"))
    };
    Ok((port(&a)?, port(&b)?, port(&c)?))
}

/// Write `bytes` to `path` with mode 0600, atomically (temp file + rename).
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), BackendError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io(format!("cannot write {}", tmp.display())))?;
    f.write_all(bytes)
        .map_err(io(format!("cannot write {}", tmp.display())))?;
    f.sync_all().map_err(io(format!("cannot write {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(io(format!("cannot write {}", path.display())))
}

fn mkdir_private(path: &Path) -> Result<(), BackendError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(io(format!("cannot create {}", path.display())))
}

fn random_token() -> String {
    let mut b = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn pid_alive(pid: i32) -> bool {
    nix::sys::signal::kill(Pid::from_raw(pid), None).is_ok()
}

/// The last lines of a log file, for a failure reason.
fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The harness's own explanation of why it stopped (`lap-harness: fatal: …`), else the log tail.
fn harness_failure(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    if let Some(line) = text
        .lines()
        .rev()
        .find_map(|l| l.split_once("lap-harness: fatal: ").map(|(_, r)| r))
    {
        return line.trim().to_owned();
    }
    format!("the harness exited during start-up: {}", log_tail(path, 5))
}

/// The sidecar config for one session: the base settings plus this session's ports, files and
/// egress lists.
pub fn sidecar_config(
    base: &SidecarConfig,
    dir: &Path,
    proxy_port: u16,
    admin_port: u16,
    allow_out: &[String],
    deny_out: &[String],
) -> SidecarConfig {
    let mut egress = EgressConfig {
        allow: base.egress.allow.clone(),
        deny: base.egress.deny.clone(),
    };
    egress.allow.extend(allow_out.iter().cloned());
    egress.deny.extend(deny_out.iter().cloned());
    SidecarConfig {
        listen: Some(format!("127.0.0.1:{proxy_port}")),
        admin_listen: Some(format!("127.0.0.1:{admin_port}")),
        ca_cert_path: Some(dir.join("ca.pem")),
        upstream_ca_files: base.upstream_ca_files.clone(),
        intercept: base.intercept.clone(),
        secrets_file: Some(dir.join("secrets.json")),
        admin_token_file: Some(dir.join("admin_token")),
        resolve: base.resolve.clone(),
        egress,
        ..SidecarConfig::default()
    }
}

/// The harness's environment (SPEC §2.3 plus its own settings), without the inherited PATH.
pub fn harness_env(spec: &SandboxSpec, dir: &Path, proxy_port: u16, harness_port: u16) -> Vec<(String, String)> {
    let proxy = format!("http://127.0.0.1:{proxy_port}");
    let no_proxy = "localhost,127.0.0.1,::1".to_owned();
    let ca = dir.join("ca.pem").display().to_string();
    let bundle = dir.join("ca-bundle.pem").display().to_string();
    let mut env: Vec<(String, String)> = Vec::new();
    for k in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
        env.push((k.to_owned(), proxy.clone()));
    }
    env.push(("NO_PROXY".to_owned(), no_proxy.clone()));
    env.push(("no_proxy".to_owned(), no_proxy));
    env.push(("NODE_EXTRA_CA_CERTS".to_owned(), ca));
    // SPEC §2.3's bundle variables, plus codex's own (it does not read SSL_CERT_FILE).
    for k in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "CARGO_HTTP_CAINFO",
        "CODEX_CA_CERTIFICATE",
    ] {
        env.push((k.to_owned(), bundle.clone()));
    }
    env.push(("HOME".to_owned(), dir.join("home").display().to_string()));
    env.push(("TMPDIR".to_owned(), dir.join("tmp").display().to_string()));
    env.push(("PORT".to_owned(), harness_port.to_string()));
    env.push(("HARNESS_AUTH_TOKEN".to_owned(), spec.harness_token.clone()));
    env.push(("LAP_HARNESS_ID".to_owned(), spec.harness_id.clone()));
    env.push(("LAP_SESSION_ID".to_owned(), spec.session_id.clone()));
    let optional = [
        ("LAP_MODEL", &spec.model),
        ("AGENT_PROMPT", &spec.prompt),
        ("REPO_URL", &spec.repo_url),
        ("BRANCH", &spec.branch),
    ];
    for (k, v) in optional {
        if let Some(v) = v {
            env.push((k.to_owned(), v.clone()));
        }
    }
    for (name, stub) in spec.stub_env() {
        env.push((name, stub));
    }
    env
}

impl LocalBackend {
    pub fn new(config: LocalConfig) -> Result<Self, BackendError> {
        mkdir_private(&config.root)?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| failed(format!("http client: {e}")))?;
        Ok(Self {
            config,
            http,
            exited: Default::default(),
        })
    }

    /// Spawn `cmd` in its own process group, logging to `log`; reaped in the background.
    fn spawn(&self, mut cmd: Command, log: &Path, what: &str) -> Result<i32, BackendError> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(log)
            .map_err(io(format!("cannot open {}", log.display())))?;
        let err = out.try_clone().map_err(io("cannot open log"))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(false);
        let mut child: Child = cmd.spawn().map_err(io(format!("cannot start {what}")))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| failed(format!("{what} has no pid")))?;
        let exited = self.exited.clone();
        tokio::spawn(async move {
            let _ = child.wait().await;
            if let Ok(mut e) = exited.lock() {
                e.insert(pid);
            }
        });
        Ok(pid)
    }

    fn has_exited(&self, pid: i32) -> bool {
        self.exited.lock().map(|e| e.contains(&pid)).unwrap_or(false) || !pid_alive(pid)
    }

    /// Poll `url` until it answers 2xx, the process `pid` exits, or the deadline passes. With
    /// `phases`, each `{"phase": …}` the answers carry (the harness's bring-up) is reported.
    async fn wait_ready(
        &self,
        url: &str,
        pid: i32,
        timeout: Duration,
        phases: Option<&SandboxSpec>,
    ) -> Result<(), &'static str> {
        let deadline = Instant::now() + timeout;
        let mut last_phase = None;
        loop {
            if let Ok(r) = self.http.get(url).timeout(Duration::from_secs(2)).send().await {
                let ok = r.status().is_success();
                if let Some(spec) = phases {
                    let body: serde_json::Value = r.json().await.unwrap_or_default();
                    let phase = body
                        .get("phase")
                        .and_then(|p| p.as_str())
                        .and_then(super::harness_phase);
                    if let Some(p) = phase.filter(|p| last_phase != Some(*p)) {
                        spec.phase(p);
                        last_phase = Some(p);
                    }
                }
                if ok {
                    return Ok(());
                }
            }
            if self.has_exited(pid) {
                return Err("exited");
            }
            if Instant::now() >= deadline {
                return Err("timeout");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn bring_up(
        &self,
        spec: &SandboxSpec,
        dir: &Path,
        pids: &mut Vec<i32>,
    ) -> Result<SandboxHandle, BackendError> {
        mkdir_private(dir)?;
        mkdir_private(&dir.join("home").join("workspace"))?;
        mkdir_private(&dir.join("tmp"))?;
        let (proxy_port, admin_port, harness_port) = free_ports()?;

        let admin_token = random_token();
        write_private(&dir.join("admin_token"), admin_token.as_bytes())?;
        let secrets = SecretsFile {
            secrets: spec.secrets.clone(),
        };
        let json = serde_json::to_vec(&secrets).map_err(|e| failed(format!("secrets file: {e}")))?;
        write_private(&dir.join("secrets.json"), &json)?;
        let cfg = sidecar_config(
            &self.config.base,
            dir,
            proxy_port,
            admin_port,
            &spec.allow_out,
            &spec.deny_out,
        );
        let toml = toml::to_string(&cfg).map_err(|e| failed(format!("sidecar config: {e}")))?;
        write_private(&dir.join("sidecar.toml"), toml.as_bytes())?;

        // The vault first.
        spec.phase("starting-vault");
        let mut cmd = Command::new(&self.config.sidecar_bin);
        cmd.arg("--config")
            .arg(dir.join("sidecar.toml"))
            .env_clear()
            .current_dir(dir);
        pass_env(&mut cmd, &["PATH", "LAP_LOG", "RUST_LOG"]);
        let sidecar_pid = self.spawn(cmd, &dir.join("sidecar.log"), "vault-sidecar")?;
        pids.push(sidecar_pid);
        record_pids(dir, pids);
        let admin_url = format!("http://127.0.0.1:{admin_port}");
        if let Err(why) = self
            .wait_ready(&format!("{admin_url}/readyz"), sidecar_pid, SIDECAR_READY_TIMEOUT, None)
            .await
        {
            return Err(failed(format!(
                "the vault sidecar did not become ready ({why}): {}",
                log_tail(&dir.join("sidecar.log"), 5)
            )));
        }

        // The CA bundle: system roots + this sandbox's CA.
        let ca = std::fs::read(dir.join("ca.pem")).map_err(io("the sidecar wrote no CA certificate"))?;
        let mut bundle = SYSTEM_ROOTS
            .iter()
            .find_map(|p| std::fs::read(p).ok())
            .unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(&ca);
        std::fs::write(dir.join("ca-bundle.pem"), bundle).map_err(io("cannot write the CA bundle"))?;

        // Then the harness, holding only stubs.
        spec.phase("starting-harness");
        let mut cmd = Command::new(&self.config.harness_bin);
        cmd.env_clear().current_dir(dir.join("home").join("workspace"));
        pass_env(&mut cmd, &["PATH", "LANG", "LAP_LOG", "RUST_LOG", "USER", "LOGNAME"]);
        for (k, v) in harness_env(spec, dir, proxy_port, harness_port) {
            cmd.env(k, v);
        }
        let harness_pid = self.spawn(cmd, &dir.join("harness.log"), "lap-harness")?;
        pids.push(harness_pid);
        record_pids(dir, pids);
        let harness_url = format!("http://127.0.0.1:{harness_port}");
        match self
            .wait_ready(
                &format!("{harness_url}/healthz"),
                harness_pid,
                HARNESS_READY_TIMEOUT,
                Some(spec),
            )
            .await
        {
            Ok(()) => {}
            Err("exited") => return Err(failed(harness_failure(&dir.join("harness.log")))),
            Err(why) => {
                return Err(failed(format!(
                    "the harness did not become healthy ({why}): {}",
                    log_tail(&dir.join("harness.log"), 5)
                )))
            }
        }
        let detail = LocalDetail {
            dir: dir.to_owned(),
            sidecar_pid,
            harness_pid,
            admin_token,
        };
        let detail_json = serde_json::to_value(&detail).map_err(|e| failed(e.to_string()))?;
        Ok(SandboxHandle {
            harness_url,
            harness_token: spec.harness_token.clone(),
            sidecar_admin_url: admin_url,
            sidecar_admin_token: detail.admin_token.clone(),
            detail: detail_json,
        })
    }

    async fn stop_pids(&self, pids: &[i32]) {
        for &pid in pids {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + STOP_GRACE;
        while pids.iter().any(|&p| !self.has_exited(p)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for &pid in pids {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }

    fn detail(handle: &SandboxHandle) -> Option<LocalDetail> {
        serde_json::from_value(handle.detail.clone()).ok()
    }
}

/// Keep the pids started so far in `pids.json`, so an interrupted bring-up (create timeout,
/// server crash) can still be swept as an orphan.
fn record_pids(dir: &Path, pids: &[i32]) {
    let _ = std::fs::write(dir.join("pids.json"), serde_json::to_vec(pids).unwrap_or_default());
}

fn pass_env(cmd: &mut Command, keys: &[&str]) {
    for k in keys {
        if let Ok(v) = std::env::var(k) {
            cmd.env(k, v);
        }
    }
}

#[async_trait]
impl SandboxBackend for LocalBackend {
    async fn create(&self, spec: SandboxSpec) -> Result<SandboxHandle, BackendError> {
        let dir = self.config.root.join(&spec.session_id);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut pids = Vec::new();
            let result = self.bring_up(&spec, &dir, &mut pids).await;
            if result.is_ok() {
                return result;
            }
            self.stop_pids(&pids).await;
            let _ = std::fs::remove_dir_all(&dir);
            // Free ports are picked then released; another process may take one first.
            let port_race = matches!(&result, Err(BackendError::Failed(m)) if m.contains("in use"));
            if !port_race || attempt >= 3 {
                return result;
            }
            tracing::info!(session = %spec.session_id, "a loopback port was taken meanwhile; retrying");
        }
    }

    async fn liveness(&self, handle: &SandboxHandle) -> Liveness {
        match Self::detail(handle) {
            Some(d) if d.dir.exists() && !self.has_exited(d.sidecar_pid) && !self.has_exited(d.harness_pid) => {
                Liveness::Running
            }
            _ => Liveness::Gone,
        }
    }

    async fn destroy(&self, handle: &SandboxHandle) {
        if let Some(d) = Self::detail(handle) {
            self.stop_pids(&[d.harness_pid, d.sidecar_pid]).await;
            if d.dir.starts_with(&self.config.root) {
                let _ = std::fs::remove_dir_all(&d.dir);
            }
        }
    }

    async fn rotate_secret(
        &self,
        handle: &SandboxHandle,
        name: &str,
        value: &str,
        hosts: &[String],
        locations: &[String],
    ) -> Result<(), BackendError> {
        let d = Self::detail(handle).ok_or_else(|| failed("not a local sandbox"))?;
        let path = d.dir.join("secrets.json");
        let text = std::fs::read_to_string(&path).map_err(io("cannot read the secrets file"))?;
        let mut file: SecretsFile = serde_json::from_str(&text).map_err(|e| failed(format!("secrets file: {e}")))?;
        for s in file.secrets.iter_mut().filter(|s| s.name == name) {
            *s = SecretSpec {
                name: s.name.clone(),
                stub: s.stub.clone(),
                value: Some(value.to_owned()),
                hosts: hosts.to_vec(),
                locations: (!locations.is_empty()).then(|| locations.to_vec()),
                ..SecretSpec::default()
            };
        }
        let json = serde_json::to_vec(&file).map_err(|e| failed(format!("secrets file: {e}")))?;
        write_private(&path, &json)?;
        let r = self
            .http
            .post(format!("{}/reload", handle.sidecar_admin_url))
            .bearer_auth(&handle.sidecar_admin_token)
            .send()
            .await
            .map_err(|e| failed(format!("sidecar reload: {e}")))?;
        if !r.status().is_success() {
            return Err(failed(format!("sidecar reload answered {}", r.status())));
        }
        Ok(())
    }

    async fn remove_orphans(&self, keep: &HashSet<String>) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.config.root) else {
            return 0;
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if keep.contains(&name) {
                continue;
            }
            let dir = entry.path();
            // A bring-up that started after `keep` was read may have just created its directory.
            let fresh = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_none_or(|age| age < ORPHAN_GRACE);
            if fresh {
                continue;
            }
            if let Some(pids) = std::fs::read(dir.join("pids.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<Vec<i32>>(&b).ok())
            {
                self.stop_pids(&pids).await;
            }
            let _ = std::fs::remove_dir_all(&dir);
            removed += 1;
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::HashMap;

    fn spec() -> SandboxSpec {
        SandboxSpec {
            session_id: "s1".into(),
            harness_id: "claude-code".into(),
            model: Some("m".into()),
            prompt: None,
            repo_url: None,
            branch: None,
            allow_out: vec![],
            deny_out: vec!["evil.example".into()],
            secrets: vec![SecretSpec {
                name: "ANTHROPIC_API_KEY".into(),
                stub: "sk-ant-lapstubX".into(),
                value: Some("sk-ant-REAL".into()),
                hosts: vec!["api.anthropic.com".into()],
                ..SecretSpec::default()
            }],
            harness_token: "tok".into(),
            phases: None,
        }
    }

    #[test]
    fn harness_env_holds_stubs_proxies_and_cas_only() {
        let env: HashMap<String, String> = harness_env(&spec(), Path::new("/d"), 1, 2).into_iter().collect();
        assert_eq!(env["ANTHROPIC_API_KEY"], "sk-ant-lapstubX");
        assert!(!env.values().any(|v| v.contains("REAL")));
        for k in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            assert_eq!(env[k], "http://127.0.0.1:1");
        }
        assert_eq!(env["NO_PROXY"], "localhost,127.0.0.1,::1");
        assert_eq!(env["NODE_EXTRA_CA_CERTS"], "/d/ca.pem");
        for k in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
            "CARGO_HTTP_CAINFO",
        ] {
            assert_eq!(env[k], "/d/ca-bundle.pem");
        }
        assert_eq!(env["HOME"], "/d/home");
        assert_eq!(env["PORT"], "2");
        assert_eq!(env["HARNESS_AUTH_TOKEN"], "tok");
        assert_eq!(env["LAP_MODEL"], "m");
        assert!(!env.contains_key("REPO_URL"));
    }

    #[test]
    fn sidecar_config_merges_base() {
        let mut base = SidecarConfig::default();
        base.resolve
            .insert("api.anthropic.com:443".into(), "127.0.0.1:9".into());
        base.egress.deny.push("base.example".into());
        base.intercept = Some("all".into());
        let c = sidecar_config(&base, Path::new("/d"), 1, 2, &[], &["evil.example".into()]);
        assert_eq!(c.listen.as_deref(), Some("127.0.0.1:1"));
        assert_eq!(c.admin_listen.as_deref(), Some("127.0.0.1:2"));
        assert_eq!(c.resolve["api.anthropic.com:443"], "127.0.0.1:9");
        assert_eq!(c.egress.deny, vec!["base.example", "evil.example"]);
        assert_eq!(c.intercept.as_deref(), Some("all"));
        assert!(c.secrets.is_empty(), "values go in secrets_file, not the config");
        let text = toml::to_string(&c).unwrap();
        assert_eq!(lap_vault_sidecar::config::parse_config(&text).unwrap(), c);
    }

    #[test]
    fn harness_failure_prefers_the_fatal_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.log");
        std::fs::write(
            &p,
            "noise\nlap-harness: fatal: the `claude` CLI is not installed\nmore\n",
        )
        .unwrap();
        assert_eq!(harness_failure(&p), "the `claude` CLI is not installed");
    }
}
