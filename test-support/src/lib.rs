//! What LAP's tests share (a dev-dependency only; nothing here ships):
//!
//! - [`TestPki`]: one test CA and a leaf it signed for the names a stand-in answers as.
//! - [`serve_tls`] / [`serve_https`]: a TLS stand-in on `127.0.0.1:0` that reports its address
//!   (no port is picked for it, so none can be taken first), stopped on drop.
//! - [`eventually`], [`eventually_ok`], [`eventually_true`]: poll a condition until a deadline,
//!   failing with what was awaited (and what was last seen).
//! - [`ws_read_until`]: read a WebSocket until a condition on what was read, with a deadline.
//! - [`sse`]: the product's server-sent-events reader (`lap-sse`), for tests that read streams.
#![warn(unreachable_pub)]

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

pub use lap_sse as sse;

/// A test CA and one server leaf it signed (ECDSA P-256, rcgen's default).
pub struct TestPki {
    /// The CA certificate, PEM: what a client under test trusts.
    pub ca_pem: String,
    /// The leaf, then the CA.
    pub chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    leaf_pem: String,
    key_pem: String,
}

impl TestPki {
    /// A CA named `ca_name` and a leaf for `names`: each a DNS name, or an IP address (an IP SAN).
    pub fn new(ca_name: &str, names: &[&str]) -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
            SanType,
        };
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.distinguished_name.push(DnType::CommonName, ca_name);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = ca_params.self_signed(&ca_key).expect("CA self-signed");

        let leaf_key = KeyPair::generate().expect("leaf key");
        let mut leaf_params = CertificateParams::new(Vec::<String>::new()).expect("leaf params");
        for name in names {
            leaf_params.subject_alt_names.push(match name.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*name).try_into().expect("a DNS name")),
            });
        }
        if let Some(first) = names.first() {
            leaf_params.distinguished_name.push(DnType::CommonName, *first);
        }
        leaf_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        leaf_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf_params.use_authority_key_identifier_extension = true;
        let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).expect("leaf signed");
        Self {
            ca_pem: ca.pem(),
            chain: vec![leaf.der().clone(), ca.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
            leaf_pem: leaf.pem(),
            key_pem: leaf_key.serialize_pem(),
        }
    }

    /// Write the CA certificate to `dir/file`; returns the path.
    pub fn write_ca(&self, dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, &self.ca_pem).expect("write the test CA");
        path
    }

    /// Write the chain (the leaf, then the CA) and the leaf's PKCS#8 key, PEM, to `dir/cert_file`
    /// and `dir/key_file` (for a stand-in in another process, e.g. Python's `ssl`).
    pub fn write_leaf(&self, dir: &Path, cert_file: &str, key_file: &str) {
        std::fs::write(dir.join(cert_file), format!("{}{}", self.leaf_pem, self.ca_pem)).expect("write the test leaf");
        std::fs::write(dir.join(key_file), &self.key_pem).expect("write the test leaf's key");
    }

    /// A rustls server config presenting the leaf, offering `alpn` (e.g. `[b"h2", b"http/1.1"]`).
    pub fn server_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .expect("server certificate");
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

/// A stand-in server running on its own task; stopped (the task aborted) on drop.
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accept TLS connections on `127.0.0.1:0` with `config` and hand each to `handle` on its own
/// task (TCP_NODELAY set). A connection whose handshake fails is dropped (and said on stderr).
pub async fn serve_tls<H, F>(config: Arc<rustls::ServerConfig>, handle: H) -> Server
where
    H: Fn(TlsStream<TcpStream>) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address");
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let handle = Arc::new(handle);
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, handle) = (acceptor.clone(), handle.clone());
            tokio::spawn(async move {
                match acceptor.accept(tcp).await {
                    Ok(tls) => handle(tls).await,
                    Err(e) => eprintln!("test TLS server {addr}: handshake failed: {e}"),
                }
            });
        }
    });
    Server { addr, task }
}

/// [`serve_tls`] with HTTP on top: http/1.1 or h2 by ALPN (hyper-util's auto builder), each
/// request answered by `service`.
pub async fn serve_https<S, F, B>(config: Arc<rustls::ServerConfig>, service: S) -> Server
where
    S: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Response<B>, Infallible>> + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_tls(config, move |tls| {
        let service = service.clone();
        async move {
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(tls), hyper::service::service_fn(service))
                .await;
        }
    })
    .await
}

/// Poll `probe` every 20 ms until it returns `Some`, for at most `within`; panics naming `what`
/// when the deadline passes.
pub async fn eventually<T, P, F>(within: Duration, what: &str, mut probe: P) -> T
where
    P: FnMut() -> F,
    F: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`eventually`] whose probe says what it saw: `Err(seen)` until the condition holds; the
/// panic at the deadline names `what` and the last `seen` (a status, a log, a body).
pub async fn eventually_ok<T, E, P, F>(within: Duration, what: &str, mut probe: P) -> T
where
    E: std::fmt::Display,
    P: FnMut() -> F,
    F: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + within;
    loop {
        match probe().await {
            Ok(v) => return v,
            Err(seen) => assert!(
                Instant::now() < deadline,
                "not within {within:?}: {what}; last seen: {seen}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`eventually`] for a synchronous condition.
pub async fn eventually_true(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    eventually(within, what, || std::future::ready(condition().then_some(()))).await
}

/// Read messages from `ws` (a tungstenite stream) into `acc` with `step` until `step` says the
/// wait is over, for at most `within`. On the deadline, an error, or the end of the stream it
/// panics naming `what`, what happened, and `describe(acc)` (what was read so far).
pub async fn ws_read_until<S, A>(
    ws: &mut S,
    within: Duration,
    what: &str,
    acc: &mut A,
    mut step: impl FnMut(&mut A, tokio_tungstenite::tungstenite::Message) -> bool,
    describe: impl Fn(&A) -> String,
) where
    S: futures_util::Stream<
            Item = Result<tokio_tungstenite::tungstenite::Message, tokio_tungstenite::tungstenite::Error>,
        > + Unpin,
{
    use futures_util::StreamExt as _;
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await {
            Ok(Some(Ok(message))) => {
                if step(acc, message) {
                    return;
                }
            }
            Ok(Some(Err(e))) => panic!(
                "waiting for {what}: the WebSocket failed: {e}; read so far: {}",
                describe(acc)
            ),
            Ok(None) => panic!(
                "waiting for {what}: the WebSocket ended; read so far: {}",
                describe(acc)
            ),
            Err(_) => panic!(
                "waiting for {what}: not within {within:?}; read so far: {}",
                describe(acc)
            ),
        }
    }
}
