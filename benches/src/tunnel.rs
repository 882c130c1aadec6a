//! One intercepted tunnel, opened by hand: `CONNECT host:port` to the proxy (RFC 9110 §9.3.6), TLS
//! inside it, then an HTTP/1.1 connection (hyper) over that TLS stream. Used where a pooled client
//! would hide what is measured: many concurrent first CONNECTs, and thousands of idle tunnels.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

pub type Sender = SendRequest<Full<Bytes>>;

/// Open `CONNECT host:port` through `proxy`, handshake TLS with SNI `host`, and start an HTTP/1.1
/// connection on it. The connection task runs until the returned sender and the peer let it go.
pub async fn open(proxy: SocketAddr, host: &str, port: u16, tls: Arc<rustls::ClientConfig>) -> Result<Sender, String> {
    let mut tcp = TcpStream::connect(proxy)
        .await
        .map_err(|e| format!("connect to proxy: {e}"))?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    tcp.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| format!("write CONNECT: {e}"))?;
    // Read the proxy's answer up to the blank line; nothing follows it before the TLS handshake.
    let mut head = Vec::with_capacity(128);
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tcp
            .read(&mut byte)
            .await
            .map_err(|e| format!("read CONNECT answer: {e}"))?
            == 0
        {
            return Err("proxy closed before answering CONNECT".into());
        }
        head.push(byte[0]);
        if head.len() > 8192 {
            return Err("CONNECT answer head over 8 KiB".into());
        }
    }
    if !(head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200")) {
        return Err(format!(
            "CONNECT refused: {}",
            String::from_utf8_lossy(&head).trim_end()
        ));
    }
    let name = ServerName::try_from(host.to_owned()).map_err(|e| format!("server name {host}: {e}"))?;
    let stream = TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake inside the tunnel: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP/1.1 handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}
