//! An in-process TLS upstream (hyper, h2 and http/1.1) for the criterion request benches: every
//! request must carry `x-api-key: <expected>` (so a bench that forgot the swap fails loudly with
//! 401s), and gets a small JSON message back.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// The response body of a successful request.
pub const MESSAGE: &[u8] = br#"{"id":"msg_bench","type":"message","content":[{"type":"text","text":"ok"}]}"#;

/// Serve on `127.0.0.1:0` until the runtime ends; returns the bound address.
pub async fn serve(tls: rustls::ServerConfig, expected_key: &'static str) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req: Request<Incoming>| async move {
                    let authorised = req
                        .headers()
                        .get("x-api-key")
                        .is_some_and(|v| v.as_bytes() == expected_key.as_bytes());
                    let response = if authorised {
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(MESSAGE)))
                    } else {
                        Response::builder()
                            .status(StatusCode::UNAUTHORIZED)
                            .body(Full::new(Bytes::from_static(b"{\"error\":\"bad x-api-key\"}")))
                    };
                    Ok::<_, Infallible>(response.unwrap_or_default())
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}
