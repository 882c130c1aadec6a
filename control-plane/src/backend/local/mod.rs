//! The local backend (SPEC §3.4), the embedded default: per session, a `vault-sidecar` process
//! and a `lap-harness` process in its own Linux namespaces ([`bwrap`]: user, mount, pid,
//! network, ipc, uts), reaching nothing but the vault.
//!
//! Two directories per session:
//!
//! ```text
//! <data dir>/sandboxes/<id>/      0700, never visible in the sandbox
//!   sidecar.toml   0600  the sidecar's config: no real value (those arrive on its stdin)
//!   admin_token    0600  Bearer for the sidecar's admin API
//!   sidecar.ready        the sidecar's bound addresses, once it is ready
//!   sidecar.log harness.log pids.json
//! <sandbox root>/<id>/            the sandbox's own files (LAP_LOCAL_SANDBOX_ROOT)
//!   home/  tmp/  run/    its home (home/workspace: the working directory), /tmp, harness.sock
//!   ca/                  ca.pem (written by the sidecar) and ca-bundle.pem (system roots + it)
//! ```
//!
//! Bring-up with isolation ([`Isolation::Bubblewrap`]):
//! 1. bubblewrap starts `lap-harness` in new namespaces; the harness binds the vault's port
//!    (`127.0.0.1:14322`) in its own network namespace and hands the listening socket over its
//!    stdin ([`handoff`]), then waits. No agent code has run.
//! 2. The sidecar starts outside the sandbox, serving that socket (socket activation, fd 3) and
//!    reading its secrets from a pipe on stdin (real values never touch a disk); it writes the
//!    CA into `ca/` and its admin address into `sidecar.ready`; its `/readyz` is polled.
//! 3. `go`: the harness proceeds (clone, requirements, CLI auth) and serves on its Unix socket,
//!    polled on `/healthz`; the phases it reports become the session's `phase`.
//!
//! Without isolation (`LAP_LOCAL_ISOLATION=none`, development only) the server binds the vault's
//! port on host loopback itself and starts the harness directly, as the server's user.
//!
//! Each process leads its own process group and is identified by pid and start time
//! ([`process`]), so a restarted `lap-server` adopts running sessions, and health is probed
//! (`/readyz`, `/healthz`) so a stopped or wedged process is noticed, not just a dead one.

pub mod bwrap;
pub mod handoff;
pub mod process;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use command_fds::{CommandFdExt, FdMapping};
use lap_vault_config::{EgressConfig, SecretsFile, SidecarConfig};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use self::process::{ProcState, ProcessId};
use super::{BackendError, Liveness, LogSource, SandboxBackend, SandboxHandle, SandboxSpec};

/// How long the sidecar may take to become ready.
const SIDECAR_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long bubblewrap and the harness may take to hand over the vault's socket.
const HANDOFF_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the harness may take to answer `/healthz` (it may clone a repository first).
const HARNESS_READY_TIMEOUT: Duration = Duration::from_secs(300);
/// A health probe (`/readyz`, `/healthz`) that takes longer has failed.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// A sandbox directory younger than this is never swept as an orphan.
const ORPHAN_GRACE: Duration = Duration::from_secs(10);
/// Grace between SIGTERM and SIGKILL on stop.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// The harness's socket, in the session's `run/` directory.
const HARNESS_SOCKET: &str = "harness.sock";

/// Where system roots are found, first match wins.
const SYSTEM_ROOTS: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
    "/etc/ssl/ca-bundle.pem",
];

/// How a local session's harness is isolated (`LAP_LOCAL_ISOLATION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// Its own namespaces, through bubblewrap: the default, and the only safe choice.
    Bubblewrap,
    /// None: the harness runs as the server's user on the host (development only).
    None,
}

impl Isolation {
    /// As shown on each session (`isolation`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bubblewrap => "bubblewrap",
            Self::None => "none",
        }
    }
}

/// Settings of the local backend.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// `<data dir>/sandboxes`: per-session files the sandbox never sees.
    pub root: PathBuf,
    /// The sandboxes' own directories (`LAP_LOCAL_SANDBOX_ROOT`).
    pub sandbox_root: PathBuf,
    pub sidecar_bin: PathBuf,
    pub harness_bin: PathBuf,
    /// From `LAP_SIDECAR_BASE_CONFIG`: resolve, upstream_ca_files, egress, intercept.
    pub base: SidecarConfig,
    pub isolation: Isolation,
    /// `LAP_LOCAL_RO_PATHS`: more host paths visible read-only inside the sandbox.
    pub ro_paths: Vec<PathBuf>,
    /// When the server runs as root, bubblewrap runs as this uid (and gid): the sandbox then
    /// owns nothing of the platform (`LAP_LOCAL_SANDBOX_UID`).
    pub sandbox_uid: u32,
}

/// What the local backend keeps in [`SandboxHandle::detail`].
#[derive(Debug, Clone, Serialize, Deserialize)]
struct LocalDetail {
    dir: PathBuf,
    sandbox_dir: PathBuf,
    sidecar: ProcessId,
    /// bubblewrap (isolated) or `lap-harness` itself (none).
    harness: ProcessId,
    /// The sandbox's init (pid 1 of its pid namespace), with isolation.
    sandbox_init: Option<ProcessId>,
    isolation: String,
}

/// Runs sandboxes as local processes.
#[derive(Debug)]
pub struct LocalBackend {
    config: LocalConfig,
    http: reqwest::Client,
    /// HTTP clients over each harness's Unix socket.
    harness_clients: crate::harness::HarnessClients,
    /// Children this process started and reaped in the background, by pid, with how they ended.
    reaped: std::sync::Arc<Mutex<HashMap<i32, std::process::ExitStatus>>>,
}

fn failed(msg: impl Into<String>) -> BackendError {
    BackendError::Failed(msg.into())
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackendError {
    let what = what.into();
    move |source| BackendError::Io { what, source }
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

fn mkdir(path: &Path, mode: u32) -> Result<(), BackendError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(io(format!("cannot create {}", path.display())))?;
    // `mode` is masked by the umask on creation; a directory that existed keeps its own.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("cannot set the mode of {}", path.display())))
}

fn random_token() -> String {
    let mut b = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The last lines of a log file, for a failure reason.
fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The last `n` lines of a file, read backwards from its end in 64 KiB blocks, so that a
/// long-lived session's log costs what the answer holds, not the file's size. Bytes that are
/// not UTF-8 are replaced (U+FFFD); a last line without its newline counts as a line.
fn last_lines(path: &Path, n: usize) -> std::io::Result<Vec<String>> {
    use std::io::{Read, Seek, SeekFrom};
    const BLOCK: u64 = 64 * 1024;
    let mut file = std::fs::File::open(path)?;
    let len = file.seek(SeekFrom::End(0))?;
    let mut start = len;
    let mut tail: Vec<u8> = Vec::new();
    // Stop once the bytes read hold more than `n` line ends (one more for the partial line
    // before them), or at the start of the file.
    while start > 0 {
        let step = BLOCK.min(start);
        start -= step;
        let mut block = vec![0; step as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut block)?;
        block.extend_from_slice(&tail);
        tail = block;
        let body = tail.strip_suffix(b"\n").unwrap_or(&tail);
        if body.iter().filter(|&&b| b == b'\n').count() >= n {
            break;
        }
    }
    let text = String::from_utf8_lossy(&tail);
    let mut lines: Vec<&str> = text.lines().collect();
    if start > 0 {
        lines.remove(0); // begins mid-line
    }
    let from = lines.len().saturating_sub(n);
    Ok(lines[from..].iter().map(|l| (*l).to_owned()).collect())
}

/// Why the harness (or bubblewrap around it) stopped during start-up, from its log: the
/// harness's own `lap-harness: fatal: …`, bubblewrap's `bwrap: …`, else the log's last lines;
/// `ended` is how the process ended (` (exit status: 3)`), when known.
fn harness_failure(path: &Path, ended: &str) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    if let Some(line) = text
        .lines()
        .rev()
        .find_map(|l| l.split_once("lap-harness: fatal: ").map(|(_, r)| r))
    {
        return line.trim().to_owned();
    }
    if text.lines().any(|l| l.starts_with("bwrap:")) {
        return bwrap::failure_reason(&text);
    }
    format!(
        "the harness exited during start-up{ended}; its log ends:\n{}",
        log_tail(path, 5)
    )
}

/// The last request the vault refused, from the audit lines of its log (`GET
/// git.example.com/r.git/info/refs → 502 dns`); never a value: audit events hold none.
fn last_vault_refusal(sidecar_log: &Path) -> Option<String> {
    let text = std::fs::read_to_string(sidecar_log).ok()?;
    text.lines().rev().find_map(|line| {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        if v["target"] != "audit" {
            return None;
        }
        let kind = v["error"].as_str().or_else(|| v["blocked"].as_str())?;
        Some(format!(
            "{} {}{} → {} {kind}",
            v["method"].as_str().unwrap_or(""),
            v["host"].as_str().unwrap_or(""),
            v["path"].as_str().unwrap_or(""),
            v["status"]
        ))
    })
}

/// `bwrap` on `PATH`.
fn find_bwrap() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("bwrap"))
        .find(|p| p.is_file())
}

/// The sidecar config for one session: the base settings plus this session's admin address
/// (port 0: it reports what it bound in `ready_file`), files and egress lists. Its proxy port
/// is always the socket handed over on fd 3, its secrets arrive on stdin, and it refuses every
/// address of the host it runs on (`deny_local`), so the vault is no way into the host.
pub fn sidecar_config(
    base: &SidecarConfig,
    dir: &Path,
    ca_dir: &Path,
    allow_out: &[String],
    deny_out: &[String],
) -> SidecarConfig {
    let mut egress = EgressConfig {
        allow: base.egress.allow.clone(),
        deny: base.egress.deny.clone(),
        deny_local: true,
    };
    egress.allow.extend(allow_out.iter().cloned());
    egress.deny.extend(deny_out.iter().cloned());
    SidecarConfig {
        admin_listen: Some("127.0.0.1:0".into()),
        ca_cert_path: Some(ca_dir.join("ca.pem")),
        upstream_ca_files: base.upstream_ca_files.clone(),
        intercept: Some(crate::backend::session_intercept(base)),
        passthrough: base.passthrough.clone(),
        body_tripwire: base.body_tripwire.clone(),
        admin_token_file: Some(dir.join("admin_token")),
        secrets_stdin: Some(true),
        ready_file: Some(dir.join("sidecar.ready")),
        resolve: base.resolve.clone(),
        egress,
        ..SidecarConfig::default()
    }
}

/// Where the harness finds its files, as paths it can open (inside the sandbox, or on the host
/// without isolation).
#[derive(Debug, Clone)]
pub struct HarnessPaths {
    pub home: PathBuf,
    pub tmp: PathBuf,
    pub ca_dir: PathBuf,
    pub socket: PathBuf,
}

/// The harness's environment (SPEC §2.3 plus its own settings), without the inherited PATH.
/// `proxy` is the vault's address as the harness reaches it.
pub fn harness_env(spec: &SandboxSpec, paths: &HarnessPaths, proxy: &str) -> Vec<(String, String)> {
    let proxy = format!("http://{proxy}");
    let no_proxy = "localhost,127.0.0.1,::1".to_owned();
    let ca = paths.ca_dir.join("ca.pem").display().to_string();
    let bundle = paths.ca_dir.join("ca-bundle.pem").display().to_string();
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
    env.push(("HOME".to_owned(), paths.home.display().to_string()));
    env.push(("TMPDIR".to_owned(), paths.tmp.display().to_string()));
    env.push(("LAP_HARNESS_SOCKET".to_owned(), paths.socket.display().to_string()));
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
    // The agent's plain variables first: a session's stub of the same name comes after and wins.
    env.extend(spec.agent_env());
    for (name, stub) in spec.stub_env() {
        env.push((name, stub));
    }
    env
}

/// The CA bundle: the system roots, then the sandbox's CA.
fn ca_bundle(ca: &[u8]) -> Vec<u8> {
    let mut bundle = SYSTEM_ROOTS
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(ca);
    bundle
}

/// The sidecar's `ready_file`: its admin address.
#[derive(Debug, Deserialize)]
struct SidecarReady {
    admin_listen: String,
}

/// One session's directories.
struct Dirs {
    private: PathBuf,
    sandbox: PathBuf,
}

impl Dirs {
    fn home(&self) -> PathBuf {
        self.sandbox.join("home")
    }
    fn tmp(&self) -> PathBuf {
        self.sandbox.join("tmp")
    }
    fn run(&self) -> PathBuf {
        self.sandbox.join("run")
    }
    fn ca(&self) -> PathBuf {
        self.sandbox.join("ca")
    }
    fn socket(&self) -> PathBuf {
        self.run().join(HARNESS_SOCKET)
    }
}

/// What a bring-up has started so far (stopped again when it fails).
#[derive(Default)]
struct Started {
    procs: Vec<ProcessId>,
}

impl LocalBackend {
    pub fn new(config: LocalConfig) -> Result<Self, BackendError> {
        mkdir(&config.root, 0o700)?;
        // When bubblewrap runs as another uid, it must reach each sandbox's directories (but
        // list nothing): traverse-only above them.
        let root_mode = if Self::switches_uid(&config) { 0o711 } else { 0o700 };
        mkdir(&config.sandbox_root, root_mode)?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| failed(format!("http client: {e}")))?;
        if config.isolation == Isolation::Bubblewrap && find_bwrap().is_none() {
            tracing::warn!("{}", bwrap::missing_reason());
        }
        Ok(Self {
            config,
            http,
            harness_clients: crate::harness::HarnessClients::default(),
            reaped: Default::default(),
        })
    }

    /// Whether bubblewrap runs as [`LocalConfig::sandbox_uid`] (the server runs as root).
    fn switches_uid(config: &LocalConfig) -> bool {
        config.isolation == Isolation::Bubblewrap && nix::unistd::geteuid().is_root()
    }

    fn dirs(&self, session_id: &str) -> Dirs {
        Dirs {
            private: self.config.root.join(session_id),
            sandbox: self.config.sandbox_root.join(session_id),
        }
    }

    /// Spawn `cmd` in its own process group, logging to `log`; reaped in the background.
    fn spawn(
        &self,
        mut cmd: Command,
        log: &Path,
        what: &str,
        started: &mut Started,
    ) -> Result<ProcessId, BackendError> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(log)
            .map_err(io(format!("cannot open {}", log.display())))?;
        let err = out.try_clone().map_err(io("cannot open log"))?;
        cmd.stdout(out).stderr(err).process_group(0).kill_on_drop(false);
        let mut child: Child = cmd.spawn().map_err(io(format!("cannot start {what}")))?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| failed(format!("{what} has no pid")))?;
        let reaped = self.reaped.clone();
        tokio::spawn(async move {
            if let Ok(status) = child.wait().await {
                if let Ok(mut e) = reaped.lock() {
                    e.insert(pid, status);
                }
            }
        });
        // A child that exited at once has no start time left to read: it is gone.
        let id = ProcessId::of(pid).unwrap_or(ProcessId { pid, start: 0 });
        started.procs.push(id);
        Ok(id)
    }

    fn gone(&self, p: &ProcessId) -> bool {
        self.reaped.lock().map(|e| e.contains_key(&p.pid)).unwrap_or(false) || p.state() == ProcState::Gone
    }

    /// How a child of this process ended, once reaped (` (exit status 3)`), for reasons.
    fn how_it_ended(&self, p: &ProcessId) -> String {
        match self.reaped.lock().ok().and_then(|e| e.get(&p.pid).copied()) {
            Some(status) => format!(" ({status})"),
            None => String::new(),
        }
    }

    /// Poll `url` (through `client`) until it answers 2xx, `proc` exits, or the deadline
    /// passes. With `phases`, each `{"phase": …}` the answers carry (the harness's bring-up) is
    /// reported.
    async fn wait_ready(
        &self,
        client: &reqwest::Client,
        url: &str,
        proc: &ProcessId,
        timeout: Duration,
        phases: Option<&SandboxSpec>,
    ) -> Result<(), &'static str> {
        let deadline = Instant::now() + timeout;
        let mut last_phase = None;
        loop {
            if let Ok(r) = client.get(url).timeout(PROBE_TIMEOUT).send().await {
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
            if self.gone(proc) {
                return Err("exited");
            }
            if Instant::now() >= deadline {
                return Err("timeout");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Create the session's directories; the sandbox's own ones belong to its uid.
    fn make_dirs(&self, d: &Dirs) -> Result<(), BackendError> {
        let switch = Self::switches_uid(&self.config);
        mkdir(&d.private, 0o700)?;
        mkdir(&d.sandbox, if switch { 0o711 } else { 0o700 })?;
        for p in [d.home(), d.home().join("workspace"), d.tmp(), d.run()] {
            mkdir(&p, 0o700)?;
            if switch {
                let id = self.config.sandbox_uid;
                nix::unistd::chown(&p, Some(id.into()), Some(id.into()))
                    .map_err(|e| failed(format!("cannot give {} to uid {id}: {e}", p.display())))?;
            }
        }
        mkdir(&d.ca(), 0o755)
    }

    /// Start bubblewrap with the harness inside; returns it and the vault's listening socket,
    /// bound inside the sandbox's network namespace.
    async fn start_sandbox(
        &self,
        spec: &SandboxSpec,
        d: &Dirs,
        started: &mut Started,
    ) -> Result<(ProcessId, ProcessId, UnixStream, OwnedFd), BackendError> {
        let bwrap = find_bwrap().ok_or_else(|| failed(bwrap::missing_reason()))?;
        let binds = bwrap::Binds {
            home: d.home(),
            tmp: d.tmp(),
            ca: d.ca(),
            run: d.run(),
            harness_bin: self.config.harness_bin.clone(),
            ro_paths: self.config.ro_paths.clone(),
        };
        let short: String = spec
            .session_id
            .chars()
            .rev()
            .take(8)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let mut cmd = Command::new(bwrap);
        cmd.args(bwrap::args(&bwrap::system_paths(), &binds, &format!("lap-{short}")))
            .env_clear()
            .current_dir("/");
        pass_env(&mut cmd, &["PATH", "LANG", "LAP_LOG", "RUST_LOG"]);
        let paths = HarnessPaths {
            home: bwrap::HOME.into(),
            tmp: "/tmp".into(),
            ca_dir: bwrap::CA_DIR.into(),
            socket: Path::new(bwrap::RUN_DIR).join(HARNESS_SOCKET),
        };
        for (k, v) in harness_env(spec, &paths, bwrap::VAULT_LISTEN) {
            cmd.env(k, v);
        }
        cmd.env("USER", "agent")
            .env("LOGNAME", "agent")
            .env("LAP_VAULT_HANDOFF", "stdin")
            .env("LAP_VAULT_LISTEN", bwrap::VAULT_LISTEN);
        let (control, theirs) = UnixStream::pair().map_err(io("cannot create the control socket"))?;
        cmd.stdin(Stdio::from(OwnedFd::from(theirs)));
        let (mut info, info_w) = std::io::pipe().map_err(io("cannot create the info pipe"))?;
        cmd.fd_mappings(vec![FdMapping {
            parent_fd: OwnedFd::from(info_w),
            child_fd: bwrap::INFO_FD,
        }])
        .map_err(|_| failed("fd 3 is taken"))?;
        if Self::switches_uid(&self.config) {
            cmd.uid(self.config.sandbox_uid).gid(self.config.sandbox_uid);
        }
        let log = d.private.join("harness.log");
        // `cmd` (and with it our end of the info pipe's writer) is gone once spawned.
        let harness = self.spawn(cmd, &log, "bubblewrap", started)?;
        record_pids(&d.private, &started.procs);
        let (control, init, got) = tokio::task::spawn_blocking(move || {
            // One JSON document, written at once; read until it parses (or the pipe closes).
            use std::io::Read;
            let mut text = Vec::new();
            let mut buf = [0u8; 512];
            let pid = loop {
                match info.read(&mut buf) {
                    Ok(0) | Err(_) => break bwrap::info_child_pid(&text),
                    Ok(n) => {
                        text.extend_from_slice(&buf[..n]);
                        if let Some(pid) = bwrap::info_child_pid(&text) {
                            break Some(pid);
                        }
                    }
                }
            };
            let init = pid.and_then(ProcessId::of);
            let got = handoff::receive_listener(&control, HANDOFF_TIMEOUT);
            (control, init, got)
        })
        .await
        .map_err(|e| failed(format!("hand-off task: {e}")))?;
        if let Some(init) = init {
            started.procs.push(init);
            record_pids(&d.private, &started.procs);
        }
        match (got, init) {
            (Ok(listener), Some(init)) => Ok((harness, init, control, listener)),
            (Ok(_), None) => Err(failed("bubblewrap did not report the sandbox's init process")),
            (Err(e), _) => {
                // bubblewrap says why on stderr as it exits; give it a moment to.
                let deadline = Instant::now() + Duration::from_secs(2);
                while !self.gone(&harness) && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let reason = harness_failure(&log, &self.how_it_ended(&harness));
                tracing::warn!(session = %spec.session_id, error = %e, reason = %reason, "sandbox start failed");
                Err(failed(reason))
            }
        }
    }

    /// Start the sidecar serving `listener`, hand it the secrets, wait until it is ready.
    /// Returns it and its admin URL.
    async fn start_sidecar(
        &self,
        spec: &SandboxSpec,
        d: &Dirs,
        listener: OwnedFd,
        admin_token: &str,
        started: &mut Started,
    ) -> Result<(ProcessId, String), BackendError> {
        write_private(&d.private.join("admin_token"), admin_token.as_bytes())?;
        let cfg = sidecar_config(&self.config.base, &d.private, &d.ca(), &spec.allow_out, &spec.deny_out);
        let toml = toml::to_string(&cfg).map_err(|e| failed(format!("sidecar config: {e}")))?;
        write_private(&d.private.join("sidecar.toml"), toml.as_bytes())?;
        let secrets = serde_json::to_vec(&SecretsFile {
            secrets: spec.secrets.clone(),
        })
        .map_err(|e| failed(format!("secrets: {e}")))?;

        let (reader, mut writer) = std::io::pipe().map_err(io("cannot create the secrets pipe"))?;
        let mut cmd = Command::new(&self.config.sidecar_bin);
        cmd.arg("--config")
            .arg(d.private.join("sidecar.toml"))
            .env_clear()
            .current_dir(&d.private)
            .env("LISTEN_FDS", "1")
            .stdin(Stdio::from(OwnedFd::from(reader)));
        pass_env(&mut cmd, &["PATH", "LAP_LOG", "RUST_LOG"]);
        cmd.fd_mappings(vec![FdMapping {
            parent_fd: listener,
            child_fd: 3,
        }])
        .map_err(|_| failed("fd 3 is taken"))?;
        let sidecar = self.spawn(cmd, &d.private.join("sidecar.log"), "vault-sidecar", started)?;
        record_pids(&d.private, &started.procs);
        // The pipe holds 64 KiB; a larger set is written while the sidecar reads it.
        tokio::task::spawn_blocking(move || writer.write_all(&secrets))
            .await
            .map_err(|e| failed(format!("secrets task: {e}")))?
            .map_err(io("cannot hand the secrets to the vault sidecar"))?;

        let ready_file = d.private.join("sidecar.ready");
        let deadline = Instant::now() + SIDECAR_READY_TIMEOUT;
        let admin_url = loop {
            if let Some(r) = std::fs::read(&ready_file)
                .ok()
                .and_then(|b| serde_json::from_slice::<SidecarReady>(&b).ok())
            {
                break format!("http://{}", r.admin_listen);
            }
            let why = if self.gone(&sidecar) {
                "exited"
            } else if Instant::now() >= deadline {
                "timeout"
            } else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            return Err(failed(format!(
                "the vault sidecar did not become ready ({why}{}); its log ends:\n{}",
                self.how_it_ended(&sidecar),
                log_tail(&d.private.join("sidecar.log"), 5)
            )));
        };
        if let Err(why) = self
            .wait_ready(
                &self.http,
                &format!("{admin_url}/readyz"),
                &sidecar,
                SIDECAR_READY_TIMEOUT,
                None,
            )
            .await
        {
            return Err(failed(format!(
                "the vault sidecar did not become ready ({why}): {}",
                log_tail(&d.private.join("sidecar.log"), 5)
            )));
        }
        let ca = std::fs::read(d.ca().join("ca.pem")).map_err(io("the sidecar wrote no CA certificate"))?;
        let bundle = d.ca().join("ca-bundle.pem");
        std::fs::write(&bundle, ca_bundle(&ca)).map_err(io("cannot write the CA bundle"))?;
        std::fs::set_permissions(&bundle, std::fs::Permissions::from_mode(0o644))
            .map_err(io("cannot write the CA bundle"))?;
        Ok((sidecar, admin_url))
    }

    /// Without isolation: the harness on the host, as the server's user.
    fn start_harness_unisolated(
        &self,
        spec: &SandboxSpec,
        d: &Dirs,
        proxy: &str,
        started: &mut Started,
    ) -> Result<ProcessId, BackendError> {
        let mut cmd = Command::new(&self.config.harness_bin);
        cmd.env_clear()
            .current_dir(d.home().join("workspace"))
            .stdin(Stdio::null());
        pass_env(&mut cmd, &["PATH", "LANG", "LAP_LOG", "RUST_LOG", "USER", "LOGNAME"]);
        let paths = HarnessPaths {
            home: d.home(),
            tmp: d.tmp(),
            ca_dir: d.ca(),
            socket: d.socket(),
        };
        for (k, v) in harness_env(spec, &paths, proxy) {
            cmd.env(k, v);
        }
        let p = self.spawn(cmd, &d.private.join("harness.log"), "lap-harness", started)?;
        record_pids(&d.private, &started.procs);
        Ok(p)
    }

    async fn bring_up(
        &self,
        spec: &SandboxSpec,
        d: &Dirs,
        started: &mut Started,
    ) -> Result<SandboxHandle, BackendError> {
        for (what, bin) in [
            ("vault-sidecar", &self.config.sidecar_bin),
            ("lap-harness", &self.config.harness_bin),
        ] {
            if !bin.is_file() {
                return Err(failed(format!(
                    "cannot start {what}: {} does not exist (LAP_SIDECAR_BIN / LAP_HARNESS_BIN)",
                    bin.display()
                )));
            }
        }
        self.make_dirs(d)?;
        let admin_token = random_token();
        let isolation = self.config.isolation;
        let (harness, sandbox_init, admin_url, sidecar) = match isolation {
            Isolation::Bubblewrap => {
                spec.phase("starting-sandbox");
                let (harness, init, control, listener) = self.start_sandbox(spec, d, started).await?;
                spec.phase("starting-vault");
                let (sidecar, admin_url) = self.start_sidecar(spec, d, listener, &admin_token, started).await?;
                handoff::go(&control).map_err(|e| {
                    failed(format!(
                        "the sandbox went away before the vault was ready ({e}): {}",
                        harness_failure(&d.private.join("harness.log"), &self.how_it_ended(&harness))
                    ))
                })?;
                spec.phase("starting-harness");
                (harness, Some(init), admin_url, sidecar)
            }
            Isolation::None => {
                let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("cannot bind a loopback port"))?;
                let proxy = listener
                    .local_addr()
                    .map_err(io("cannot read a loopback port"))?
                    .to_string();
                spec.phase("starting-vault");
                let (sidecar, admin_url) = self
                    .start_sidecar(spec, d, OwnedFd::from(listener), &admin_token, started)
                    .await?;
                spec.phase("starting-harness");
                let harness = self.start_harness_unisolated(spec, d, &proxy, started)?;
                (harness, None, admin_url, sidecar)
            }
        };

        let socket = d.socket();
        let client = self.harness_clients.for_socket(&socket);
        match self
            .wait_ready(
                &client,
                "http://localhost/healthz",
                &harness,
                HARNESS_READY_TIMEOUT,
                Some(spec),
            )
            .await
        {
            Ok(()) => {}
            Err("exited") => {
                let reason = harness_failure(&d.private.join("harness.log"), &self.how_it_ended(&harness));
                // What the harness saw fail (a clone's `error: 502`) often has its cause in the
                // vault: the refusal it answered last.
                return Err(failed(match last_vault_refusal(&d.private.join("sidecar.log")) {
                    Some(refusal) => format!("{reason} (the vault's last refusal: {refusal})"),
                    None => reason,
                }));
            }
            Err(why) => {
                return Err(failed(format!(
                    "the harness did not become healthy ({why}): {}",
                    log_tail(&d.private.join("harness.log"), 5)
                )))
            }
        }
        let detail = LocalDetail {
            dir: d.private.clone(),
            sandbox_dir: d.sandbox.clone(),
            sidecar,
            harness,
            sandbox_init,
            isolation: isolation.as_str().to_owned(),
        };
        let detail_json = serde_json::to_value(&detail).map_err(|e| failed(e.to_string()))?;
        Ok(SandboxHandle {
            harness_url: "http://localhost".into(),
            harness_socket: Some(socket),
            harness_token: spec.harness_token.clone(),
            sidecar_admin_url: admin_url,
            sidecar_admin_token: admin_token,
            detail: detail_json,
        })
    }

    fn detail(handle: &SandboxHandle) -> Option<LocalDetail> {
        serde_json::from_value(handle.detail.clone()).ok()
    }

    /// Where a stopped session's logs are kept: `<data dir>/logs/<id>/`.
    fn logs_dir(&self, session_id: &str) -> PathBuf {
        self.config.root.with_file_name("logs").join(session_id)
    }

    /// Remove a session's directories (only below this backend's roots), keeping its two logs
    /// in [`LocalBackend::logs_dir`] for the audit retention.
    fn remove_dirs(&self, private: &Path, sandbox: &Path) {
        if private.starts_with(&self.config.root) {
            if let Some(id) = private.file_name().and_then(|n| n.to_str()) {
                let keep = self.logs_dir(id);
                if mkdir(&keep, 0o700).is_ok() {
                    for log in ["sidecar.log", "harness.log"] {
                        let _ = std::fs::rename(private.join(log), keep.join(log));
                    }
                }
            }
            let _ = std::fs::remove_dir_all(private);
        }
        if sandbox.starts_with(&self.config.sandbox_root) {
            let _ = std::fs::remove_dir_all(sandbox);
        }
    }

    /// Probe one HTTP health endpoint: `Err(reason)` unless it answers 2xx within
    /// [`PROBE_TIMEOUT`].
    async fn probe(client: &reqwest::Client, url: &str, bearer: Option<&str>) -> Result<(), String> {
        let mut req = client.get(url).timeout(PROBE_TIMEOUT);
        if let Some(t) = bearer {
            req = req.bearer_auth(t);
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => Ok(()),
            Ok(r) => Err(format!("answered {}", r.status())),
            Err(e) if e.is_timeout() => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
            Err(e) => Err(format!("unreachable: {e}")),
        }
    }
}

/// Keep the processes started so far in `pids.json`, so an interrupted bring-up (create
/// timeout, server crash) can still be swept as an orphan.
fn record_pids(dir: &Path, procs: &[ProcessId]) {
    let _ = std::fs::write(dir.join("pids.json"), serde_json::to_vec(procs).unwrap_or_default());
}

fn read_pids(dir: &Path) -> Vec<ProcessId> {
    std::fs::read(dir.join("pids.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
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
    fn isolation(&self) -> &'static str {
        self.config.isolation.as_str()
    }

    async fn create(&self, spec: SandboxSpec) -> Result<SandboxHandle, BackendError> {
        let d = self.dirs(&spec.session_id);
        let mut started = Started::default();
        let result = self.bring_up(&spec, &d, &mut started).await;
        if result.is_err() {
            process::stop_all(&started.procs, STOP_GRACE).await;
            self.harness_clients.forget(&d.socket());
            self.remove_dirs(&d.private, &d.sandbox);
        }
        result
    }

    async fn liveness(&self, handle: &SandboxHandle) -> Liveness {
        let Some(d) = Self::detail(handle) else {
            return Liveness::Gone("the sandbox's record is from an older lap-server".into());
        };
        if self.gone(&d.sidecar) {
            return Liveness::Gone("the vault sidecar exited".into());
        }
        if self.gone(&d.harness) || d.sandbox_init.is_some_and(|p| self.gone(&p)) {
            return Liveness::Gone("the sandbox's harness exited".into());
        }
        let readyz = format!("{}/readyz", handle.sidecar_admin_url);
        let sidecar = Self::probe(&self.http, &readyz, None);
        let harness = async {
            match &handle.harness_socket {
                Some(sock) => {
                    let client = self.harness_clients.for_socket(sock);
                    Self::probe(&client, "http://localhost/healthz", None).await
                }
                None => Ok(()),
            }
        };
        let (sidecar, harness) = tokio::join!(sidecar, harness);
        let stopped = |p: &ProcessId| {
            if p.state() == ProcState::Stopped {
                " (the process is stopped, e.g. by SIGSTOP)"
            } else {
                ""
            }
        };
        if let Err(why) = sidecar {
            return Liveness::Unhealthy(format!(
                "the vault sidecar stopped answering: /readyz {why}{}",
                stopped(&d.sidecar)
            ));
        }
        if let Err(why) = harness {
            return Liveness::Unhealthy(format!(
                "the harness stopped answering: /healthz {why}{}",
                stopped(&d.harness)
            ));
        }
        Liveness::Running
    }

    async fn destroy(&self, handle: &SandboxHandle) {
        if let Some(sock) = &handle.harness_socket {
            self.harness_clients.forget(sock);
        }
        if let Some(d) = Self::detail(handle) {
            let procs: Vec<ProcessId> = [Some(d.harness), d.sandbox_init, Some(d.sidecar)]
                .into_iter()
                .flatten()
                .collect();
            process::stop_all(&procs, STOP_GRACE).await;
            self.remove_dirs(&d.dir, &d.sandbox_dir);
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
        let mut body = serde_json::json!({ "value": value, "hosts": hosts });
        if !locations.is_empty() {
            body["locations"] = serde_json::json!(locations);
        }
        let r = self
            .http
            .put(format!("{}/secrets/{name}", handle.sidecar_admin_url))
            .bearer_auth(&handle.sidecar_admin_token)
            .json(&body)
            .send()
            .await
            .map_err(|e| failed(format!("the vault sidecar is unreachable: {e}")))?;
        if !r.status().is_success() {
            let status = r.status();
            let text = r.text().await.unwrap_or_default();
            return Err(failed(format!(
                "the vault sidecar refused the new value ({status}): {text}"
            )));
        }
        Ok(())
    }

    async fn revoke_secret(&self, handle: &SandboxHandle, name: &str) -> Result<(), BackendError> {
        let r = self
            .http
            .delete(format!("{}/secrets/{name}", handle.sidecar_admin_url))
            .bearer_auth(&handle.sidecar_admin_token)
            .send()
            .await
            .map_err(|e| failed(format!("the vault sidecar is unreachable: {e}")))?;
        // 404: it does not hold it (any more).
        if !r.status().is_success() && r.status() != reqwest::StatusCode::NOT_FOUND {
            let status = r.status();
            let text = r.text().await.unwrap_or_default();
            return Err(failed(format!(
                "the vault sidecar refused to revoke ({status}): {text}"
            )));
        }
        Ok(())
    }

    async fn remove(&self, session_id: &str) {
        let d = self.dirs(session_id);
        process::stop_all(&read_pids(&d.private), STOP_GRACE).await;
        self.harness_clients.forget(&d.socket());
        self.remove_dirs(&d.private, &d.sandbox);
    }

    async fn logs(
        &self,
        session_id: &str,
        source: LogSource,
        tail: usize,
    ) -> Result<Option<Vec<String>>, BackendError> {
        let file = match source {
            LogSource::Harness => "harness.log",
            LogSource::Vault => "sidecar.log",
        };
        // A running (or starting) sandbox's own file, else the copy kept when it stopped.
        let live = self.dirs(session_id).private.join(file);
        let path = if live.exists() {
            live
        } else {
            self.logs_dir(session_id).join(file)
        };
        let read = path.clone();
        match tokio::task::spawn_blocking(move || last_lines(&read, tail)).await {
            Ok(Ok(lines)) => Ok(Some(lines)),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Ok(Err(e)) => Err(BackendError::Io {
                what: format!("cannot read {}", path.display()),
                source: e,
            }),
            Err(e) => Err(BackendError::Io {
                what: format!("cannot read {}", path.display()),
                source: std::io::Error::other(e),
            }),
        }
    }

    async fn prune_logs(&self, retention: Duration) {
        let Ok(entries) = std::fs::read_dir(self.config.root.with_file_name("logs")) else {
            return;
        };
        for e in entries.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > retention);
            if old {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }

    async fn remove_orphans(&self, keep: &HashSet<String>) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.config.root) else {
            return 0;
        };
        let mut orphans = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if keep.contains(&name) {
                continue;
            }
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
            orphans.push(name);
        }
        // All at once: each may wait out its processes' grace.
        futures_util::future::join_all(orphans.iter().map(|id| self.remove(id))).await;
        orphans.len()
    }
}

/// `LAP_LOCAL_RO_PATHS`: colon-separated absolute paths.
pub fn parse_ro_paths(raw: &str) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let mut seen = HashMap::new();
    for (i, p) in raw.split(':').filter(|p| !p.is_empty()).enumerate() {
        let path = PathBuf::from(p);
        if !path.is_absolute() {
            return Err(format!("LAP_LOCAL_RO_PATHS[{i}]: `{p}` is not an absolute path"));
        }
        if seen.insert(path.clone(), i).is_none() {
            out.push(path);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use lap_vault_config::SecretSpec;

    /// `last_lines` reads from the end and agrees with reading the whole file, across block
    /// boundaries, with and without a final newline, and with bytes that are not UTF-8.
    #[test]
    fn last_lines_agrees_with_reading_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut text = Vec::new();
        for i in 0..20_000 {
            text.extend_from_slice(format!("line {i} {}\n", "x".repeat(i % 37)).as_bytes());
        }
        text.extend_from_slice(b"bad \xff byte\n\nlast without newline");
        std::fs::write(&path, &text).unwrap();
        let whole = String::from_utf8_lossy(&text)
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        for n in [1, 2, 3, 100, 2_000, 5_000, 19_999, 20_003, 30_000] {
            let want = &whole[whole.len().saturating_sub(n)..];
            assert_eq!(last_lines(&path, n).unwrap(), want, "n = {n}");
        }
        std::fs::write(&path, b"").unwrap();
        assert!(last_lines(&path, 5).unwrap().is_empty());
        let e = last_lines(&dir.path().join("absent"), 5).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }

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
            tools: None,
            mcp_servers: Vec::new(),
            env: Default::default(),
            placement: Default::default(),
            phases: None,
        }
    }

    fn paths() -> HarnessPaths {
        HarnessPaths {
            home: "/home/agent".into(),
            tmp: "/tmp".into(),
            ca_dir: "/run/lap/ca".into(),
            socket: "/run/lap/harness/harness.sock".into(),
        }
    }

    #[test]
    fn harness_env_holds_stubs_proxies_and_cas_only() {
        let env: HashMap<String, String> = harness_env(&spec(), &paths(), "127.0.0.1:14322").into_iter().collect();
        assert_eq!(env["ANTHROPIC_API_KEY"], "sk-ant-lapstubX");
        assert!(!env.values().any(|v| v.contains("REAL")));
        for k in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] {
            assert_eq!(env[k], "http://127.0.0.1:14322");
        }
        assert_eq!(env["NO_PROXY"], "localhost,127.0.0.1,::1");
        assert_eq!(env["NODE_EXTRA_CA_CERTS"], "/run/lap/ca/ca.pem");
        for k in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
            "CARGO_HTTP_CAINFO",
        ] {
            assert_eq!(env[k], "/run/lap/ca/ca-bundle.pem");
        }
        assert_eq!(env["HOME"], "/home/agent");
        assert_eq!(env["LAP_HARNESS_SOCKET"], "/run/lap/harness/harness.sock");
        assert!(!env.contains_key("PORT"), "no harness port: a Unix socket");
        assert_eq!(env["HARNESS_AUTH_TOKEN"], "tok");
        assert_eq!(env["LAP_MODEL"], "m");
        assert!(!env.contains_key("REPO_URL"));
    }

    #[test]
    fn sidecar_config_merges_base_and_never_holds_a_value() {
        let mut base = SidecarConfig::default();
        base.resolve
            .insert("api.anthropic.com:443".into(), "127.0.0.1:9".into());
        base.egress.deny.push("base.example".into());
        base.intercept = Some("all".into());
        let c = sidecar_config(
            &base,
            Path::new("/d"),
            Path::new("/s/ca"),
            &[],
            &["evil.example".into()],
        );
        assert_eq!(c.listen, None, "the proxy port is the socket handed over on fd 3");
        assert_eq!(c.admin_listen.as_deref(), Some("127.0.0.1:0"));
        assert_eq!(c.ready_file.as_deref(), Some(Path::new("/d/sidecar.ready")));
        assert_eq!(c.ca_cert_path.as_deref(), Some(Path::new("/s/ca/ca.pem")));
        assert_eq!(c.secrets_stdin, Some(true));
        assert_eq!(c.secrets_file, None);
        assert_eq!(c.resolve["api.anthropic.com:443"], "127.0.0.1:9");
        assert_eq!(c.egress.deny, vec!["base.example", "evil.example"]);
        assert!(c.egress.deny_local, "the vault is no way into the host");
        assert_eq!(c.intercept.as_deref(), Some("all"));
        assert!(c.secrets.is_empty(), "values go over stdin, not into the config");
        // Without a base setting, sessions intercept every host; a base's choice is kept.
        let plain = sidecar_config(&SidecarConfig::default(), Path::new("/d"), Path::new("/s/ca"), &[], &[]);
        assert_eq!(plain.intercept.as_deref(), Some("all"));
        base.intercept = None;
        base.passthrough = vec!["pinned.example".into()];
        let c2 = sidecar_config(&base, Path::new("/d"), Path::new("/s/ca"), &[], &[]);
        assert_eq!(c2.intercept.as_deref(), Some("all"));
        assert_eq!(c2.passthrough, vec!["pinned.example"]);
        base.intercept = Some("bound-hosts".into());
        base.passthrough.clear();
        let c3 = sidecar_config(&base, Path::new("/d"), Path::new("/s/ca"), &[], &[]);
        assert_eq!(c3.intercept.as_deref(), Some("bound-hosts"));
        let text = toml::to_string(&c).unwrap();
        assert_eq!(lap_vault_config::parse_config(&text).unwrap(), c);
    }

    #[test]
    fn the_vaults_last_refusal_is_read_from_its_audit_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sidecar.log");
        std::fs::write(
            &p,
            concat!(
                r#"{"level":"INFO","target":"audit","method":"GET","host":"a.example","path":"/x","status":403,"blocked":"egress-policy"}"#,
                "\n",
                r#"{"level":"INFO","target":"audit","method":"GET","host":"git.example","path":"/r.git/info/refs","status":502,"error":"dns"}"#,
                "\n",
                r#"{"level":"INFO","target":"audit","method":"GET","host":"ok.example","path":"/","status":200,"error":null,"blocked":null}"#,
                "\n",
                r#"{"level":"INFO","target":"vault_sidecar","message":"listening"}"#,
                "\nnot json\n"
            ),
        )
        .unwrap();
        assert_eq!(
            last_vault_refusal(&p).as_deref(),
            Some("GET git.example/r.git/info/refs → 502 dns")
        );
        std::fs::write(&p, "").unwrap();
        assert_eq!(last_vault_refusal(&p), None);
        assert_eq!(last_vault_refusal(&dir.path().join("absent")), None);
    }

    #[test]
    fn harness_failure_prefers_the_fatal_line_then_bubblewrap() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.log");
        std::fs::write(
            &p,
            "noise\nlap-harness: fatal: the `claude` CLI is not installed\nmore\n",
        )
        .unwrap();
        assert_eq!(
            harness_failure(&p, " (exit status: 3)"),
            "the `claude` CLI is not installed"
        );
        std::fs::write(&p, "bwrap: No permissions to creating new namespace\n").unwrap();
        assert!(harness_failure(&p, "").contains("user namespaces"));
        std::fs::write(&p, "one\ntwo\npanicked at x\n").unwrap();
        assert_eq!(
            harness_failure(&p, " (exit status: 101)"),
            "the harness exited during start-up (exit status: 101); its log ends:\none\ntwo\npanicked at x"
        );
    }

    #[test]
    fn ro_paths_are_absolute() {
        assert_eq!(
            parse_ro_paths("/a:/b::/a").unwrap(),
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert!(parse_ro_paths("/a:rel").unwrap_err().contains("LAP_LOCAL_RO_PATHS[1]"));
        assert!(parse_ro_paths("").unwrap().is_empty());
    }
}
