//! Connections to upstreams: resolution (`[resolve]` first, then DNS), TCP with `TCP_NODELAY`,
//! verified TLS with its own ALPN negotiation, and pooling.
//!
//! Pooling is hyper-util's legacy client, keyed by scheme and authority; one client per ALPN offer:
//! [`Upstreams::h2_or_h1`] for an h2 client's requests and any request with a body,
//! [`Upstreams::h1_first`] for an HTTP/1.x client's requests without a body (the upstream is
//! offered what the client speaks, `http/1.1`, and `h2` only when it refuses that with a
//! `no_application_protocol` alert, RFC 7301 §3.2, as an h2-only server does),
//! [`Upstreams::h1_only`] for WebSocket upgrades and `http://` forwarding. SNI is the CONNECT
//! target's name (none for IP targets).
//!
//! Failures are [`UpstreamError`]s with a stable [`UpstreamError::kind`] that becomes the
//! `X-Vault-Error` header of the `502`/`504` the client gets.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::combinators::UnsyncBoxBody;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::config::TargetHost;
use crate::config::{AddressDenial, AddressPolicy};
use crate::refusal::ErrorKind;

/// TCP connect deadline (per address tried).
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// TLS handshake deadline toward the upstream.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle pooled connections are closed after this long.
pub(crate) const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The error type of boxed bodies in the proxy.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Request and response bodies as they travel through the proxy.
pub(crate) type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// Why an upstream could not be reached.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    #[error("DNS lookup of {host} failed: {source}")]
    Dns {
        host: String,
        #[source]
        source: io::Error,
    },
    #[error("DNS lookup of {host} returned no address")]
    NoAddress { host: String },
    #[error("TCP connect to {addr} failed: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("TCP connect to {addr} timed out after {:?}", CONNECT_TIMEOUT)]
    ConnectTimeout { addr: SocketAddr },
    #[error("the certificate of {host} is not trusted: {reason}")]
    Untrusted { host: String, reason: String },
    #[error("TLS handshake with {host} failed: {source}")]
    Handshake {
        host: String,
        #[source]
        source: io::Error,
    },
    #[error("TLS handshake with {host} timed out after {:?}", HANDSHAKE_TIMEOUT)]
    HandshakeTimeout { host: String },
    #[error("`{0}` cannot be used as a TLS server name")]
    BadName(String),
    #[error("the request URI has no host")]
    NoHost,
    #[error("{host} resolves to {addr}: {}", why.describe())]
    Denied {
        host: String,
        addr: SocketAddr,
        why: AddressDenial,
    },
}

impl UpstreamError {
    /// The upstream refused the handshake's ALPN offer (a `no_application_protocol` alert, RFC
    /// 7301 §3.2).
    fn refused_alpn(&self) -> bool {
        let Self::Handshake { source, .. } = self else {
            return false;
        };
        matches!(
            source.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>()),
            Some(rustls::Error::AlertReceived(
                rustls::AlertDescription::NoApplicationProtocol
            ))
        )
    }

    /// The `X-Vault-Error` kind; `None` for an address the egress policy refuses, which is a block
    /// (`X-Vault-Blocked: egress-policy`), not an error: see [`crate::refusal::Refusal::upstream`].
    pub(crate) fn kind(&self) -> Option<ErrorKind> {
        Some(match self {
            Self::Dns { .. } | Self::NoAddress { .. } => ErrorKind::Dns,
            Self::Connect { .. } => ErrorKind::Connect,
            Self::ConnectTimeout { .. } => ErrorKind::ConnectTimeout,
            Self::Untrusted { .. } => ErrorKind::UpstreamCertUntrusted,
            Self::Handshake { .. } => ErrorKind::TlsHandshake,
            Self::HandshakeTimeout { .. } => ErrorKind::TlsHandshakeTimeout,
            Self::BadName(_) | Self::NoHost => ErrorKind::BadTarget,
            Self::Denied { .. } => return None,
        })
    }
}

/// Find an [`UpstreamError`] in an error's source chain (the legacy client boxes connector errors).
pub(crate) fn find_upstream_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a UpstreamError> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(u) = e.downcast_ref::<UpstreamError>() {
            return Some(u);
        }
        cur = e.source();
    }
    None
}

/// How names are turned into addresses: the `[resolve]` table, then the system resolver; and
/// which of those addresses may be connected to ([`AddressPolicy`], checked on every address a
/// target resolves to, at connect time).
#[derive(Debug, Clone, Default)]
pub(crate) struct Resolver {
    table: Arc<HashMap<(String, u16), SocketAddr>>,
    policy: Arc<AddressPolicy>,
}

impl Resolver {
    pub(crate) fn new(table: HashMap<(String, u16), SocketAddr>, policy: AddressPolicy) -> Self {
        Self {
            table: Arc::new(table),
            policy: Arc::new(policy),
        }
    }

    /// The address rules (also applied by the transparent listener to original destinations).
    pub(crate) fn policy(&self) -> &AddressPolicy {
        &self.policy
    }

    /// The [`AddressPolicy`] over every address `host` resolved to: the first refused one
    /// refuses them all (DNS rebinding cannot pick a good one).
    pub(crate) fn check(&self, host: &TargetHost, addrs: &[SocketAddr]) -> Result<(), UpstreamError> {
        for addr in addrs {
            if let Err(why) = self.policy.check(*addr) {
                return Err(UpstreamError::Denied {
                    host: host.to_string(),
                    addr: *addr,
                    why,
                });
            }
        }
        Ok(())
    }

    pub(crate) async fn resolve(&self, host: &TargetHost, port: u16) -> Result<Vec<SocketAddr>, UpstreamError> {
        let key = (host.to_string(), port);
        if let Some(addr) = self.table.get(&key) {
            return Ok(vec![*addr]);
        }
        match host {
            TargetHost::Ip(ip) => Ok(vec![SocketAddr::new(*ip, port)]),
            TargetHost::Name(name) => {
                let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), port))
                    .await
                    .map_err(|source| UpstreamError::Dns {
                        host: name.clone(),
                        source,
                    })?
                    .collect();
                if addrs.is_empty() {
                    return Err(UpstreamError::NoAddress { host: name.clone() });
                }
                Ok(addrs)
            }
        }
    }

    /// Connect TCP (first address that answers), `TCP_NODELAY` set. When any resolved address is
    /// refused by the [`AddressPolicy`], none is tried: a name that resolves into a denied block
    /// is denied, whatever else it resolves to.
    pub(crate) async fn connect(&self, host: &TargetHost, port: u16) -> Result<TcpStream, UpstreamError> {
        let addrs = self.resolve(host, port).await?;
        self.check(host, &addrs)?;
        let mut last = None;
        for addr in addrs {
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Ok(Err(source)) => last = Some(UpstreamError::Connect { addr, source }),
                Err(_) => last = Some(UpstreamError::ConnectTimeout { addr }),
            }
        }
        Err(last.unwrap_or(UpstreamError::NoAddress { host: host.to_string() }))
    }
}

/// Root certificates for upstream verification: webpki roots, the OS store, `upstream_ca_files`.
pub(crate) fn root_store(extra_files: &[PathBuf]) -> Result<rustls::RootCertStore, io::Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    for path in extra_files {
        let pem = std::fs::read(path)?;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<_, _>>()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
        if certs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: no certificate", path.display()),
            ));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
        }
    }
    Ok(roots)
}

/// The connector given to the pooled client: `http://` → TCP, `https://` → TCP + TLS.
#[derive(Clone)]
pub(crate) struct Connector {
    resolver: Resolver,
    tls: TlsConnector,
    /// Offered on a new connection when the upstream refused `tls`'s ALPN offer.
    fallback: Option<TlsConnector>,
    connects: Counter,
}

/// A TLS client configuration trusting `roots`, offering `alpn`.
fn tls_connector(roots: &Arc<rustls::RootCertStore>, alpn: &[&[u8]]) -> TlsConnector {
    let mut config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

impl Connector {
    /// Offers `alpn`; when the upstream answers that offer with a `no_application_protocol`
    /// alert, connects again offering `fallback` (if any).
    pub(crate) fn new(
        resolver: Resolver,
        roots: Arc<rustls::RootCertStore>,
        alpn: &[&[u8]],
        fallback: Option<&[&[u8]]>,
        connects: Counter,
    ) -> Self {
        Self {
            resolver,
            tls: tls_connector(&roots, alpn),
            fallback: fallback.map(|alpn| tls_connector(&roots, alpn)),
            connects,
        }
    }

    async fn connect(self, uri: Uri) -> Result<UpstreamIo, UpstreamError> {
        let host_str = uri.host().ok_or(UpstreamError::NoHost)?;
        let host = TargetHost::parse(host_str);
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = self.resolver.connect(&host, port).await?;
        self.connects.inc();
        if !https {
            return Ok(UpstreamIo::Plain(TokioIo::new(tcp)));
        }
        let name = match &host {
            TargetHost::Ip(ip) => ServerName::IpAddress((*ip).into()),
            TargetHost::Name(n) => ServerName::try_from(n.clone()).map_err(|_| UpstreamError::BadName(n.clone()))?,
        };
        let tls = match (handshake(&self.tls, &host, name.clone(), tcp).await, &self.fallback) {
            (Err(e), Some(fallback)) if e.refused_alpn() => {
                let tcp = self.resolver.connect(&host, port).await?;
                self.connects.inc();
                handshake(fallback, &host, name, tcp).await?
            }
            (tls, _) => tls?,
        };
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        Ok(UpstreamIo::Tls {
            io: Box::new(TokioIo::new(tls)),
            h2,
        })
    }
}

/// The TLS handshake over `tcp`, within [`HANDSHAKE_TIMEOUT`].
async fn handshake(
    tls: &TlsConnector,
    host: &TargetHost,
    name: ServerName<'static>,
    tcp: TcpStream,
) -> Result<TlsStream<TcpStream>, UpstreamError> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.connect(name, tcp)).await {
        Err(_) => Err(UpstreamError::HandshakeTimeout { host: host.to_string() }),
        Ok(Err(source)) => Err(classify_handshake(host, source)),
        Ok(Ok(tls)) => Ok(tls),
    }
}

fn classify_handshake(host: &TargetHost, source: io::Error) -> UpstreamError {
    let rustls_err = source.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>());
    match rustls_err {
        Some(
            e @ (rustls::Error::InvalidCertificate(_)
            | rustls::Error::NoCertificatesPresented
            | rustls::Error::UnsupportedNameType),
        ) => UpstreamError::Untrusted {
            host: host.to_string(),
            reason: e.to_string(),
        },
        _ => UpstreamError::Handshake {
            host: host.to_string(),
            source,
        },
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = UpstreamIo;
    type Error = UpstreamError;
    type Future = Pin<Box<dyn Future<Output = Result<UpstreamIo, UpstreamError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(self.clone().connect(uri))
    }
}

/// An upstream connection, plain or TLS.
pub(crate) enum UpstreamIo {
    Plain(TokioIo<TcpStream>),
    Tls {
        io: Box<TokioIo<TlsStream<TcpStream>>>,
        h2: bool,
    },
}

impl Connection for UpstreamIo {
    fn connected(&self) -> Connected {
        match self {
            Self::Tls { h2: true, .. } => Connected::new().negotiated_h2(),
            _ => Connected::new(),
        }
    }
}

impl hyper::rt::Read for UpstreamIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Self::Tls { io, .. } => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl hyper::rt::Write for UpstreamIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Self::Tls { io, .. } => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_flush(cx),
            Self::Tls { io, .. } => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Self::Tls { io, .. } => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Self::Tls { io, .. } => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(io) => io.is_write_vectored(),
            Self::Tls { io, .. } => io.is_write_vectored(),
        }
    }
}

/// A pooled client over [`Connector`].
pub(crate) type PooledClient = Client<Connector, ProxyBody>;

/// The pooled clients of one sidecar.
#[derive(Clone)]
pub(crate) struct Upstreams {
    /// Offers `h2` and `http/1.1`; an h2 client's requests, and requests with a body (over h2 an
    /// early answer survives an unread body: K08).
    pub h2_or_h1: PooledClient,
    /// Offers `http/1.1`, then `h2` and `http/1.1` to an upstream that refuses it; an HTTP/1.x
    /// client's requests without a body. The client's own protocol end to end where the
    /// upstream speaks it: no translation to h2 (whose stream and HPACK machinery was 12 % of
    /// such a request's instructions, `benches/instructions.sh h1`).
    pub h1_first: PooledClient,
    /// Offers only `http/1.1`; WebSocket upgrades (RFC 6455 needs HTTP/1.1) and `http://`.
    pub h1_only: PooledClient,
    pub resolver: Resolver,
}

impl Upstreams {
    pub(crate) fn new(resolver: Resolver, roots: Arc<rustls::RootCertStore>, connects: Counter) -> Self {
        let build = |alpn: &[&[u8]], fallback: Option<&[&[u8]]>| {
            Client::builder(TokioExecutor::new())
                .timer(TokioTimer::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .pool_max_idle_per_host(64)
                .http2_adaptive_window(true)
                // As on the client side (intercept.rs): one TLS record per small request.
                .http1_writev(false)
                .build(Connector::new(
                    resolver.clone(),
                    roots.clone(),
                    alpn,
                    fallback,
                    connects.clone(),
                ))
        };
        Self {
            h2_or_h1: build(&[b"h2", b"http/1.1"], None),
            h1_first: build(&[b"http/1.1"], Some(&[b"h2", b"http/1.1"])),
            h1_only: build(&[b"http/1.1"], None),
            resolver,
        }
    }
}
