//! The sidecar's shared state and its start-up: CA, leaf cache, pooled upstreams, secrets
//! snapshot, audit log and metrics; then the listeners ([`crate::listener`], [`crate::admin`]).
//!
//! Start-up order (fail closed): validate config → CA → write `ca_cert_path` → bind every port →
//! mark ready. `/readyz` answers 200 only after all of that.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use tokio::net::TcpListener;

use crate::audit::AuditLog;
use crate::config::{CaSource, ConfigErrors, Settings};
use crate::egress::EgressPolicy;
use crate::metrics::Metrics;
use crate::secrets::SecretSet;
use crate::tls::{Ca, LeafCache, TlsError};
use crate::upstream::{root_store, Resolver, Upstreams};

/// How often `secrets_file` is checked for changes.
pub const SECRETS_POLL_INTERVAL: Duration = Duration::from_secs(1);

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
}

/// Everything a request handler needs.
pub struct Proxy {
    pub settings: Settings,
    secrets: RwLock<Arc<SecretSet>>,
    egress: RwLock<Arc<EgressPolicy>>,
    pub leaves: LeafCache,
    pub upstreams: Upstreams,
    pub audit: AuditLog,
    pub metrics: Arc<Metrics>,
    /// The addresses actually bound (for loop refusal).
    own_addrs: RwLock<Vec<SocketAddr>>,
    ready: AtomicBool,
}

impl Proxy {
    /// Build the state (CA, roots, clients) from validated settings. Binds nothing.
    pub fn new(settings: Settings) -> Result<Arc<Self>, StartError> {
        let ca = match &settings.ca {
            CaSource::Generate => Ca::generate()?,
            CaSource::Files { cert, key } => Ca::load(cert, key)?,
        };
        let roots = Arc::new(root_store(&settings.upstream_ca_files).map_err(StartError::Roots)?);
        let metrics = Arc::new(Metrics::default());
        let upstreams = Upstreams::new(
            Resolver::new(settings.resolve.clone()),
            roots,
            metrics.upstream_connects.clone(),
        );
        let secrets = SecretSet::new(settings.secrets.clone());
        let egress = settings.egress.with_bound(secrets.bound_hosts().clone());
        Ok(Arc::new(Self {
            secrets: RwLock::new(Arc::new(secrets)),
            egress: RwLock::new(Arc::new(egress)),
            leaves: LeafCache::new(Arc::new(ca)),
            upstreams,
            audit: AuditLog::default(),
            metrics,
            own_addrs: RwLock::new(Vec::new()),
            ready: AtomicBool::new(false),
            settings,
        }))
    }

    /// The current secrets snapshot; a request keeps the one it started with.
    pub fn secrets(&self) -> Arc<SecretSet> {
        self.secrets.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn egress(&self) -> Arc<EgressPolicy> {
        self.egress.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn own_addrs(&self) -> Vec<SocketAddr> {
        self.own_addrs.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Re-read inline secrets and `secrets_file`; on error the old secrets stay.
    pub fn reload(&self) -> Result<usize, ConfigErrors> {
        match self.settings.reload_secrets() {
            Ok(list) => {
                let set = SecretSet::new(list);
                let n = set.len();
                let egress = self.settings.egress.with_bound(set.bound_hosts().clone());
                *self.secrets.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(set);
                *self.egress.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(egress);
                self.metrics.reloads.inc();
                tracing::info!(secrets = n, "secrets reloaded");
                Ok(n)
            }
            Err(e) => {
                self.metrics.reload_failures.inc();
                tracing::error!(error = %e, "secrets reload rejected; keeping the previous secrets");
                Err(e)
            }
        }
    }
}

/// Bind every listener, write the CA, mark ready, and serve until the process ends.
pub async fn run(settings: Settings) -> Result<(), StartError> {
    let proxy = Proxy::new(settings)?;
    let s = &proxy.settings;
    let bind = |key: &'static str, addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { key, addr, source })
    };
    let listener = bind("listen", s.listen).await?;
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
            .0
            .iter()
            .any(|h| matches!(h, crate::hosts::HostPattern::Any))
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
