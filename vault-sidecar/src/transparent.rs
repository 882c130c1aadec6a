//! Transparent mode: connections redirected here by iptables (`-j REDIRECT --to-ports`) from a
//! harness that ignores `HTTPS_PROXY`.
//!
//! The original destination comes from `SO_ORIGINAL_DST` (netfilter; `IP6T_SO_ORIGINAL_DST` for
//! IPv6). For TLS, the ClientHello is read first: its SNI names the target host (the original
//! address stands in when there is none), then the connection behaves exactly as a CONNECT to
//! that target: egress policy, intercept or tunnel, the same swapping rules. The bytes read to
//! learn the SNI are replayed ([`Prefixed`]). Non-TLS traffic is relayed untouched to the original
//! destination after the egress check (stubs are never swapped over cleartext).
//!
//! There is no HTTP channel before the handshake, so a refused connection is closed (and logged,
//! and counted in `vault_blocked_total`).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use crate::admission::Destination;
use crate::config::{is_valid_dns_name, TargetHost};
use crate::connect::{should_intercept, Target};
use crate::intercept::context::Mode;
use crate::intercept::serve_tunnel;
use crate::proxy::Proxy;

/// Deadline for a complete ClientHello.
pub(crate) const CLIENT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// A ClientHello larger than this is refused.
pub(crate) const MAX_CLIENT_HELLO: usize = 64 * 1024;

/// Accept redirected connections until the process ends.
pub(crate) async fn serve(proxy: Arc<Proxy>, listener: TcpListener) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "transparent accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let proxy = proxy.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(proxy, stream).await {
                tracing::debug!(peer = %peer, error = %e, "transparent connection ended");
            }
        });
    }
}

/// The pre-NAT destination of a redirected connection.
pub(crate) fn original_destination(stream: &TcpStream) -> io::Result<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt};
    let local = stream.local_addr()?;
    if local.is_ipv4() {
        let sa = getsockopt(stream, sockopt::OriginalDst).map_err(io::Error::from)?;
        let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
        Ok(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sa.sin_port)))
    } else {
        let sa = getsockopt(stream, sockopt::Ip6tOriginalDst).map_err(io::Error::from)?;
        let ip = Ipv6Addr::from(sa.sin6_addr.s6_addr);
        Ok(SocketAddr::new(IpAddr::V6(ip), u16::from_be(sa.sin6_port)))
    }
}

/// What the first bytes of a connection say.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// A complete TLS ClientHello, with its SNI if any.
    Tls { sni: Option<String> },
    /// Not TLS.
    NotTls,
    /// More bytes are needed.
    Incomplete,
    /// TLS, but the ClientHello is malformed.
    Invalid,
}

/// Inspect buffered bytes for a ClientHello (pure; `rustls::server::Acceptor` does the parsing).
pub fn parse_hello(buf: &[u8]) -> Hello {
    match buf.first() {
        None => return Hello::Incomplete,
        Some(0x16) => {}
        Some(_) => return Hello::NotTls,
    }
    let mut acceptor = rustls::server::Acceptor::default();
    let mut rd = buf;
    while !rd.is_empty() {
        if acceptor.read_tls(&mut rd).is_err() {
            return Hello::Invalid;
        }
    }
    match acceptor.accept() {
        Ok(Some(accepted)) => Hello::Tls {
            sni: accepted.client_hello().server_name().map(str::to_owned),
        },
        Ok(None) => Hello::Incomplete,
        Err(_) => Hello::Invalid,
    }
}

async fn handle(proxy: Arc<Proxy>, mut stream: TcpStream) -> io::Result<()> {
    let original = original_destination(&stream)?;
    let mut buf = BytesMut::with_capacity(4096);
    let hello = tokio::time::timeout(CLIENT_HELLO_TIMEOUT, async {
        loop {
            match parse_hello(&buf) {
                Hello::Incomplete if buf.len() < MAX_CLIENT_HELLO => {
                    if stream.read_buf(&mut buf).await? == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "closed before a ClientHello",
                        ));
                    }
                }
                Hello::Incomplete => return Ok(Hello::Invalid),
                other => return Ok(other),
            }
        }
    })
    .await
    .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no ClientHello before the deadline"))??;

    let ip_target = Target {
        host: TargetHost::Ip(original.ip()),
        port: original.port(),
    };
    let target = match &hello {
        Hello::Tls { sni: Some(name) } if is_valid_dns_name(name) => Target {
            host: TargetHost::parse(name),
            port: original.port(),
        },
        _ => ip_target.clone(),
    };
    let snapshot = proxy.snapshot();
    let dest = Destination {
        target: &target,
        original: Some(original),
    };
    if proxy.admit(dest, &snapshot.egress, Mode::Tunnel, "CONNECT").is_err() {
        // No HTTP channel before the handshake: logged and counted, then closed.
        return Ok(());
    }
    let io = Prefixed {
        prefix: buf,
        inner: stream,
    };
    if matches!(hello, Hello::Tls { .. })
        && should_intercept(
            proxy.settings.intercept,
            &proxy.settings.passthrough,
            &snapshot.secrets,
            &target,
        )
    {
        serve_tunnel(proxy, io, target).await;
        return Ok(());
    }
    let mut upstream = TcpStream::connect(original).await?;
    let _ = upstream.set_nodelay(true);
    proxy.metrics.upstream_connects.inc();
    proxy.metrics.count_request(Mode::Tunnel.as_str(), 200);
    let mut io = io;
    let start = std::time::Instant::now();
    let relayed = tokio::io::copy_bidirectional(&mut io, &mut upstream).await;
    proxy.audit_connection(
        "CONNECT",
        &target,
        Ok(()),
        *relayed.as_ref().unwrap_or(&(0, 0)),
        start.elapsed(),
    );
    relayed.map(|_| ())
}

/// A stream whose first bytes were already read: they are replayed before the rest.
pub(crate) struct Prefixed<S> {
    prefix: BytesMut,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc as StdArc;

    /// A real ClientHello from rustls' client, for `name`.
    fn client_hello(name: &str) -> Vec<u8> {
        let roots = rustls::RootCertStore::empty();
        let config = rustls::ClientConfig::builder_with_provider(StdArc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = rustls::pki_types::ServerName::try_from(name.to_owned()).expect("name");
        let mut conn = rustls::ClientConnection::new(StdArc::new(config), server_name).expect("conn");
        let mut out = Vec::new();
        conn.write_tls(&mut out).expect("write");
        out
    }

    #[test]
    fn sni_is_read_from_a_complete_client_hello() {
        let hello = client_hello("api.anthropic.com");
        assert_eq!(
            parse_hello(&hello),
            Hello::Tls {
                sni: Some("api.anthropic.com".into())
            }
        );
    }

    #[test]
    fn partial_hello_needs_more_bytes_at_every_split() {
        let hello = client_hello("api.github.com");
        for cut in 0..hello.len() {
            assert_eq!(parse_hello(&hello[..cut]), Hello::Incomplete, "cut at {cut}");
        }
    }

    #[test]
    fn ip_targets_have_no_sni_and_plain_http_is_not_tls() {
        let hello = client_hello("10.0.0.1");
        assert_eq!(parse_hello(&hello), Hello::Tls { sni: None });
        assert_eq!(parse_hello(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
    }

    #[test]
    fn garbage_after_a_tls_byte_is_invalid() {
        assert_eq!(
            parse_hello(&[0x16, 0x03, 0x01, 0x00, 0x05, 0xff, 0xff, 0xff, 0xff, 0xff]),
            Hello::Invalid
        );
    }

    #[tokio::test]
    async fn prefixed_replays_then_reads_the_rest() {
        let (a, mut b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut b, b" world")
            .await
            .expect("write");
        drop(b);
        let mut p = Prefixed {
            prefix: BytesMut::from(&b"hello"[..]),
            inner: a,
        };
        let mut out = String::new();
        p.read_to_string(&mut out).await.expect("read");
        assert_eq!(out, "hello world");
    }
}
