//! The sidecar's shared state and its start-up: CA, leaf cache, pooled upstreams, secrets
//! snapshot, audit log and metrics; then the listeners ([`crate::listener`], [`crate::admin`]).
//!
//! Start-up order (fail closed): validate config → CA → write `ca_cert_path` → bind every port →
//! mark ready. `/readyz` answers 200 only after all of that.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;

use crate::admission::{self, Destination, Policies};
use crate::audit::AuditLog;
use crate::config::EgressPolicy;
use crate::config::{CaSource, ConfigError, ConfigErrors, SecretSpec, Settings};
use crate::intercept::context::Mode;
use crate::metrics::Metrics;
use crate::refusal::Refusal;
use crate::secrets::SecretSet;
use crate::tls::{Ca, LeafCache, TlsError};
use crate::upstream::{root_store, Resolver, Upstreams};

/// How often `secrets_file` is checked for changes.
pub(crate) const SECRETS_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Why the sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigErrors),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("upstream_ca_files: {0}")]
    Roots(#[source] std::io::Error),
    #[error("cannot listen on {addr} ({key}): {source}")]
    Bind {
        key: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the inherited listening socket (LISTEN_FDS) cannot be used: {0}")]
    Inherited(#[source] std::io::Error),
    #[error("cannot write the generated admin token ({path}); set admin_token_file: {source}")]
    AdminToken {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write ready_file {path}: {source}")]
    ReadyFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the admin API's protected endpoints compare a bearer token against.
#[derive(Debug, Clone)]
pub(crate) enum AdminToken {
    /// `admin_token_file`, read on each request (so it can be rotated by rewriting the file).
    File(PathBuf),
    /// Generated at start because no `admin_token_file` was given; also written to `path`.
    Generated { token: String, path: PathBuf },
}

/// Why an admin change of the secrets was refused (the old set stays in force).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SecretsChangeError {
    #[error("{0}")]
    Invalid(#[from] ConfigErrors),
    #[error("no secret `{0}` was given to this sidecar over its admin API or standard input")]
    NotFound(String),
}

/// Everything a request handler needs.
/// One version of the secrets and the egress policy (its bound hosts are those secrets' hosts).
#[derive(Clone)]
pub(crate) struct Snapshot {
    pub(crate) secrets: Arc<SecretSet>,
    pub(crate) egress: Arc<EgressPolicy>,
}

pub(crate) struct Proxy {
    pub settings: Settings,
    /// The secrets the admin API manages (`secrets_stdin`'s at start), with their real values;
    /// the lock also serialises every change of the set.
    pushed: Mutex<Vec<SecretSpec>>,
    admin_token: RwLock<Option<AdminToken>>,
    /// The secrets and the egress policy they extend, swapped together on reload, so a request
    /// never sees one version's secrets with another's egress.
    snapshot: RwLock<Snapshot>,
    pub leaves: LeafCache,
    pub upstreams: Upstreams,
    pub audit: AuditLog,
    pub metrics: Arc<Metrics>,
    /// The addresses actually bound (for loop refusal).
    own_addrs: RwLock<Vec<SocketAddr>>,
    ready: AtomicBool,
    /// Bytes left for bodies buffered whole ([`crate::intercept::BODY_BUFFER_BUDGET`]), one
    /// permit per byte, shared by every connection.
    pub body_budget: Arc<tokio::sync::Semaphore>,
}

impl Proxy {
    /// Build the state (CA, roots, clients) from validated settings. Binds nothing. The
    /// settings' initial secrets move into the proxy's snapshot (a rotated-out value is then held
    /// nowhere once no request uses it).
    pub(crate) fn new(mut settings: Settings) -> Result<Arc<Self>, StartError> {
        let ca = match &settings.ca {
            CaSource::Generate => Ca::generate()?,
            CaSource::Files { cert, key } => Ca::load(cert, key)?,
        };
        let roots = Arc::new(root_store(&settings.upstream_ca_files).map_err(StartError::Roots)?);
        let metrics = Arc::new(Metrics::default());
        let upstreams = Upstreams::new(
            Resolver::new(settings.resolve.clone(), settings.addresses.clone()),
            roots,
            metrics.upstream_connects.clone(),
        );
        let secrets = SecretSet::new(std::mem::take(&mut settings.secrets));
        let egress = settings.egress.with_bound(secrets.bound_hosts().clone());
        let pushed = Mutex::new(std::mem::take(&mut settings.pushed_secrets));
        let admin_token = RwLock::new(settings.admin_token_file.clone().map(AdminToken::File));
        Ok(Arc::new(Self {
            pushed,
            admin_token,
            snapshot: RwLock::new(Snapshot {
                secrets: Arc::new(secrets),
                egress: Arc::new(egress),
            }),
            leaves: LeafCache::new(Arc::new(ca)),
            upstreams,
            audit: AuditLog::default(),
            metrics,
            own_addrs: RwLock::new(Vec::new()),
            ready: AtomicBool::new(false),
            body_budget: Arc::new(tokio::sync::Semaphore::new(crate::intercept::BODY_BUFFER_BUDGET)),
            settings,
        }))
    }

    /// The current secrets snapshot; a request keeps the one it started with.
    /// The current secrets and egress policy, of one version.
    pub(crate) fn snapshot(&self) -> Snapshot {
        self.snapshot.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn secrets(&self) -> Arc<SecretSet> {
        self.snapshot().secrets
    }

    /// The admission check ([`crate::admission::admit`]) against this sidecar's addresses and
    /// current policies; a refusal is logged, counted (`vault_blocked_total`, and
    /// `vault_requests_total{mode}`) and audited (`method` is the request's, `CONNECT` for a
    /// tunnel or a redirected connection).
    pub(crate) fn admit(
        &self,
        dest: Destination<'_>,
        egress: &EgressPolicy,
        mode: Mode,
        method: &str,
    ) -> Result<(), Refusal> {
        let own = self.own_addrs();
        let policies = Policies {
            own: &own,
            egress,
            addresses: self.upstreams.resolver.policy(),
        };
        admission::admit(dest, policies).map_err(|reason| {
            tracing::warn!(connect_target = %dest.target, original = ?dest.original, reason = reason.as_str(), "request refused");
            let refusal = Refusal::blocked(reason, &dest.target.host);
            self.metrics.count_refusal(&refusal);
            self.metrics.count_request(mode.as_str(), refusal.status().as_u16());
            self.audit_connection(method, dest.target, Err(&refusal), (0, 0), Duration::ZERO);
            refusal
        })
    }

    /// One audit event for what no request's own event covers: a tunnel the sidecar relays
    /// without reading (`Ok`, with the bytes each way), or a connection or request refused before
    /// it was read (`Err`). The path is empty; no secret is ever injected.
    pub(crate) fn audit_connection(
        &self,
        method: &str,
        target: &crate::connect::Target,
        outcome: Result<(), &Refusal>,
        (bytes_up, bytes_down): (u64, u64),
        duration: Duration,
    ) {
        let (status, blocked, error) = match outcome {
            Ok(()) => (200, None, None),
            Err(r) => (r.status().as_u16(), r.audit_blocked(), r.audit_error()),
        };
        self.audit.record(crate::audit::AuditEvent {
            run: Default::default(),
            seq: 0,
            time: crate::intercept::context::humantime_now(),
            method: method.to_owned(),
            host: target.host.to_string(),
            port: target.port,
            path: String::new(),
            status,
            injected: Vec::new(),
            blocked,
            blocked_secret: None,
            error,
            bytes_up,
            bytes_down,
            duration_us: u64::try_from(duration.as_micros()).unwrap_or(u64::MAX),
        });
    }

    pub(crate) fn own_addrs(&self) -> Vec<SocketAddr> {
        self.own_addrs.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The admin token the protected admin endpoints require (`None` before [`run`] sets one).
    pub(crate) fn admin_token(&self) -> Option<AdminToken> {
        self.admin_token.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Re-read inline secrets and `secrets_file`; on error the old secrets stay.
    pub(crate) fn reload(&self) -> Result<usize, ConfigErrors> {
        let pushed = self.pushed.lock().unwrap_or_else(|p| p.into_inner());
        self.install(&pushed)
    }

    /// Validate inline + `secrets_file` + `pushed` and swap the snapshot in; on error the old
    /// snapshot stays. Callers hold the `pushed` lock, so changes never interleave.
    fn install(&self, pushed: &[SecretSpec]) -> Result<usize, ConfigErrors> {
        match self.settings.reload_secrets(pushed) {
            Ok(list) => {
                let set = SecretSet::new(list);
                let n = set.len();
                let egress = self.settings.egress.with_bound(set.bound_hosts().clone());
                *self.snapshot.write().unwrap_or_else(|p| p.into_inner()) = Snapshot {
                    secrets: Arc::new(set),
                    egress: Arc::new(egress),
                };
                self.metrics.reloads.inc();
                tracing::info!(secrets = n, "secrets reloaded");
                Ok(n)
            }
            Err(e) => {
                self.metrics.reload_failures.inc();
                tracing::error!(error = %e, "secrets change rejected; keeping the previous secrets");
                Err(e)
            }
        }
    }

    /// `PUT /secrets`: replace every secret the admin API manages. All or nothing.
    pub(crate) fn replace_secrets(&self, specs: Vec<SecretSpec>) -> Result<usize, SecretsChangeError> {
        crate::config::validate_secret_specs("secrets", &specs)?;
        let mut pushed = self.pushed.lock().unwrap_or_else(|p| p.into_inner());
        self.install(&specs)?;
        *pushed = specs;
        Ok(pushed.len())
    }

    /// `PUT /secrets/{name}`: add or replace one managed secret. Without a `stub`, an existing
    /// secret keeps its stub (rotation of the real value).
    pub(crate) fn upsert_secret(&self, mut spec: SecretSpec) -> Result<usize, SecretsChangeError> {
        let mut pushed = self.pushed.lock().unwrap_or_else(|p| p.into_inner());
        let existing = pushed.iter().position(|s| s.name == spec.name);
        if spec.stub.is_empty() {
            match existing {
                Some(i) => spec.stub = pushed[i].stub.clone(),
                None => {
                    return Err(SecretsChangeError::Invalid(ConfigErrors(vec![ConfigError {
                        key: "stub".into(),
                        reason: format!("required: `{}` is a new secret", spec.name),
                    }])))
                }
            }
        }
        crate::config::validate_secret_specs("secret", std::slice::from_ref(&spec))?;
        let mut next = pushed.clone();
        match existing {
            Some(i) => next[i] = spec,
            None => next.push(spec),
        }
        self.install(&next)?;
        *pushed = next;
        Ok(pushed.len())
    }

    /// `DELETE /secrets/{name}`: revoke one managed secret; its stub is no longer swapped.
    pub(crate) fn remove_secret(&self, name: &str) -> Result<usize, SecretsChangeError> {
        let mut pushed = self.pushed.lock().unwrap_or_else(|p| p.into_inner());
        let Some(i) = pushed.iter().position(|s| s.name == name) else {
            return Err(SecretsChangeError::NotFound(name.to_owned()));
        };
        let mut next = pushed.clone();
        next.remove(i);
        self.install(&next)?;
        *pushed = next;
        Ok(pushed.len())
    }
}

/// The listening sockets a supervisor handed over instead of addresses to bind.
#[derive(Debug, Default)]
pub struct Inherited {
    /// The explicit proxy port (systemd socket activation: `LISTEN_FDS=1`, fd 3).
    pub listen: Option<std::net::TcpListener>,
}

/// A fresh random token (hex, 256 bits).
fn random_token() -> String {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Write `bytes` to `path` with mode 0600 through a temporary file in the same directory.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Without `admin_token_file`, a token is generated and written to a new private directory
/// (0700) under the temporary directory: whoever may read it may use the admin API.
fn generate_admin_token() -> Result<AdminToken, StartError> {
    use std::os::unix::fs::DirBuilderExt;
    let token = random_token();
    let dir = std::env::temp_dir().join(format!("vault-sidecar-{}-{}", std::process::id(), &token[..8]));
    let path = dir.join("admin_token");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .and_then(|()| write_private(&path, token.as_bytes()))
        .map_err(|source| StartError::AdminToken {
            path: path.clone(),
            source,
        })?;
    Ok(AdminToken::Generated { token, path })
}

/// Bind every listener, write the CA, mark ready, and serve until the process ends.
pub async fn run(settings: Settings) -> Result<(), StartError> {
    run_with(settings, Inherited::default()).await
}

/// [`run`], taking the listeners in `inherited` instead of binding their addresses.
pub async fn run_with(settings: Settings, inherited: Inherited) -> Result<(), StartError> {
    let proxy = Proxy::new(settings)?;
    if proxy.admin_token().is_none() {
        let generated = generate_admin_token()?;
        if let AdminToken::Generated { path, .. } = &generated {
            tracing::info!(path = %path.display(), "no admin_token_file: generated an admin token");
        }
        *proxy.admin_token.write().unwrap_or_else(|p| p.into_inner()) = Some(generated);
    }
    let s = &proxy.settings;
    let bind = |key: &'static str, addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { key, addr, source })
    };
    let listener = match inherited.listen {
        Some(l) => l
            .set_nonblocking(true)
            .and_then(|()| TcpListener::from_std(l))
            .map_err(StartError::Inherited)?,
        None => bind("listen", s.listen).await?,
    };
    let admin = bind("admin_listen", s.admin_listen).await?;
    let transparent = match s.transparent_listen {
        Some(addr) => Some(bind("transparent_listen", addr).await?),
        None => None,
    };
    let mut own = vec![listener.local_addr().map_err(|source| StartError::Bind {
        key: "listen",
        addr: s.listen,
        source,
    })?];
    own.push(admin.local_addr().map_err(|source| StartError::Bind {
        key: "admin_listen",
        addr: s.admin_listen,
        source,
    })?);
    if let Some(t) = &transparent {
        if let Ok(a) = t.local_addr() {
            own.push(a);
        }
    }
    *proxy.own_addrs.write().unwrap_or_else(|p| p.into_inner()) = own.clone();
    if let Some(path) = &s.ca_cert_path {
        proxy.leaves.ca().write_cert(path)?;
    }
    if let Some(path) = &s.ready_file {
        let ready = serde_json::json!({
            "listen": own[0].to_string(),
            "admin_listen": own[1].to_string(),
            "transparent_listen": own.get(2).map(ToString::to_string),
            "pid": std::process::id(),
        });
        write_private(path, ready.to_string().as_bytes()).map_err(|source| StartError::ReadyFile {
            path: path.clone(),
            source,
        })?;
    }
    tracing::info!(
        listen = %own[0],
        admin = %own[1],
        intercept = s.intercept.as_str(),
        secrets = proxy.secrets().len(),
        "vault sidecar ready"
    );
    for secret in proxy.secrets().secrets() {
        if secret
            .hosts
            .hosts()
            .any(|h| matches!(h, crate::config::HostPattern::Any))
        {
            tracing::warn!(secret = %secret.name, "secret is bound to every host (`*`)");
        }
    }
    proxy.ready.store(true, Ordering::Release);

    if proxy.settings.secrets_file.is_some() {
        tokio::spawn(watch_secrets_file(proxy.clone()));
    }
    tokio::spawn(reload_on_sighup(proxy.clone()));
    tokio::spawn(crate::admin::serve(proxy.clone(), admin));
    if let Some(t) = transparent {
        tokio::spawn(crate::transparent::serve(proxy.clone(), t));
    }
    crate::listener::serve(proxy, listener).await;
    Ok(())
}

async fn reload_on_sighup(proxy: Arc<Proxy>) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        return;
    };
    while hup.recv().await.is_some() {
        let _ = proxy.reload();
    }
}

fn modified(path: &std::path::Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

async fn watch_secrets_file(proxy: Arc<Proxy>) {
    let Some(path) = proxy.settings.secrets_file.clone() else {
        return;
    };
    let mut last = modified(&path);
    let mut tick = tokio::time::interval(SECRETS_POLL_INTERVAL);
    loop {
        tick.tick().await;
        let now = modified(&path);
        if now != last && now.is_some() {
            last = now;
            let _ = proxy.reload();
        }
    }
}
