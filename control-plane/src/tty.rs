//! `GET /api/v1/managed_agents/sessions/{id}/tty` (SPEC §3.2): a WebSocket relayed to the
//! harness's `/tty`, authorised by the session's own `tty_token` (`?token=` or
//! `Authorization: Bearer`), not the master key. The harness is dialled before the client's
//! upgrade is accepted, so an unreachable harness is a plain `502`. Frames pass through
//! unchanged both ways; every frame counts as activity for the idle timeout (recorded at most
//! once per [`TOUCH_EVERY`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{self, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};

use crate::app::App;
use crate::error::ApiError;

/// How often terminal traffic updates `last_seen_at` (the idle timeout is minutes to hours).
pub const TOUCH_EVERY: Duration = Duration::from_secs(1);
/// How long dialling the harness may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// The harness's side: over TCP (a pod) or its Unix socket (a local sandbox).
type Upstream = tokio_tungstenite::WebSocketStream<HarnessStream>;

/// A connection to a harness.
enum HarnessStream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl tokio::io::AsyncRead for HarnessStream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Self::Unix(s) => std::pin::Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for HarnessStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Tcp(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Self::Unix(s) => std::pin::Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => std::pin::Pin::new(s).poll_flush(cx),
            Self::Unix(s) => std::pin::Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Tcp(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Self::Unix(s) => std::pin::Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// Open the harness's `/tty` WebSocket for `req`, through its Unix socket when it has one.
async fn dial(
    handle: &crate::backend::SandboxHandle,
    req: tungstenite::handshake::client::Request,
) -> Result<Upstream, tungstenite::Error> {
    match &handle.harness_socket {
        Some(path) => {
            let stream = tokio::net::UnixStream::connect(path).await?;
            let (ws, _) = tokio_tungstenite::client_async(req, HarnessStream::Unix(stream)).await?;
            Ok(ws)
        }
        None => {
            let uri = req.uri();
            let host = uri.host().unwrap_or_default().trim_matches(['[', ']']).to_owned();
            let port = uri.port_u16().unwrap_or(80);
            let stream = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            let _ = stream.set_nodelay(true);
            let (ws, _) = tokio_tungstenite::client_async(req, HarnessStream::Tcp(stream)).await?;
            Ok(ws)
        }
    }
}

/// `?token=` and the initial terminal size, passed on to the harness.
#[derive(Debug, Default, Deserialize)]
pub struct TtyQuery {
    token: Option<String>,
    cols: Option<u16>,
    rows: Option<u16>,
}

/// The harness's `/tty` URL for its base URL (`http://…` → `ws://…`).
pub fn harness_tty_url(harness_url: &str, cols: Option<u16>, rows: Option<u16>) -> String {
    let base = harness_url.trim_end_matches('/');
    let base = if let Some(rest) = base.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = base.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        base.to_owned()
    };
    match (cols, rows) {
        (Some(c), Some(r)) => format!("{base}/tty?cols={c}&rows={r}"),
        _ => format!("{base}/tty"),
    }
}

/// The handler.
pub async fn tty(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    q: Result<Query<TtyQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let presented = q.token.as_deref().or(bearer);
    let handle = app.tty_handle(&id, presented).await?;
    let ws = ws.map_err(|e| ApiError::BadRequest(format!("/tty is a WebSocket: {e}")))?;

    let mut req = harness_tty_url(&handle.harness_url, q.cols, q.rows)
        .into_client_request()
        .map_err(|e| ApiError::Internal(format!("harness tty url: {e}")))?;
    let auth = format!("Bearer {}", handle.harness_token)
        .parse()
        .map_err(|_| ApiError::Internal("harness token is not a header value".into()))?;
    req.headers_mut().insert(header::AUTHORIZATION, auth);
    let upstream = match tokio::time::timeout(DIAL_TIMEOUT, dial(&handle, req)).await {
        Ok(Ok(up)) => up,
        Ok(Err(tungstenite::Error::Http(r))) => {
            let body = r
                .body()
                .as_deref()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or_else(|| format!("the harness answered {}", r.status()));
            // The harness's own refusals (no terminal UI, still starting) pass through.
            return Err(match r.status().as_u16() {
                400 => ApiError::BadRequest(body),
                409 => ApiError::Conflict(body),
                _ => ApiError::BadGateway(body),
            });
        }
        Ok(Err(e)) => return Err(ApiError::BadGateway(format!("the harness is unreachable: {e}"))),
        Err(_) => return Err(ApiError::BadGateway("the harness did not answer in time".into())),
    };
    app.touch(&id).await;
    app.metrics.tty_attaches.inc();
    let agent = app.get_session(&id).await.map(|s| s.agent_id).ok();
    app.record(
        "session.attach",
        &crate::audit::Actor::TTY_TOKEN,
        Some(&id),
        agent.as_deref(),
        &[],
        serde_json::json!({}),
    )
    .await;
    Ok(ws
        .on_upgrade(move |client| relay(client, upstream, app, id))
        .into_response())
}

fn to_upstream(m: ws::Message) -> Option<tungstenite::Message> {
    Some(match m {
        ws::Message::Binary(b) => tungstenite::Message::Binary(b),
        ws::Message::Text(t) => tungstenite::Message::Text(t.as_str().into()),
        ws::Message::Ping(b) => tungstenite::Message::Ping(b),
        ws::Message::Pong(b) => tungstenite::Message::Pong(b),
        ws::Message::Close(_) => return None,
    })
}

fn to_client(m: tungstenite::Message) -> Option<ws::Message> {
    Some(match m {
        tungstenite::Message::Binary(b) => ws::Message::Binary(b),
        tungstenite::Message::Text(t) => ws::Message::Text(t.as_str().into()),
        tungstenite::Message::Ping(b) => ws::Message::Ping(b),
        tungstenite::Message::Pong(b) => ws::Message::Pong(b),
        tungstenite::Message::Close(_) | tungstenite::Message::Frame(_) => return None,
    })
}

/// Relay until either side closes, then close the other.
async fn relay(client: WebSocket, upstream: Upstream, app: Arc<App>, id: String) {
    let (mut c_tx, mut c_rx) = client.split();
    let (mut u_tx, mut u_rx) = upstream.split();
    let mut last_touch = Instant::now();
    loop {
        let forwarded = tokio::select! {
            m = c_rx.next() => match m.and_then(Result::ok).and_then(to_upstream) {
                Some(m) => u_tx.send(m).await.is_ok(),
                None => false,
            },
            m = u_rx.next() => match m {
                Some(Ok(tungstenite::Message::Close(_))) | Some(Err(_)) | None => false,
                Some(Ok(m)) => match to_client(m) {
                    Some(m) => c_tx.send(m).await.is_ok(),
                    None => true,
                },
            },
        };
        if !forwarded {
            break;
        }
        if last_touch.elapsed() >= TOUCH_EVERY {
            last_touch = Instant::now();
            app.touch(&id).await;
        }
    }
    app.touch(&id).await;
    let _ = u_tx.close().await;
    let _ = c_tx.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tty_urls() {
        assert_eq!(
            harness_tty_url("http://127.0.0.1:9", None, None),
            "ws://127.0.0.1:9/tty"
        );
        assert_eq!(
            harness_tty_url("https://h.ns.svc:8080/", Some(100), Some(30)),
            "wss://h.ns.svc:8080/tty?cols=100&rows=30"
        );
        assert_eq!(harness_tty_url("http://h", Some(1), None), "ws://h/tty");
    }
}
