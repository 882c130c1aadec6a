//! Attaching this terminal to a session's (`GET …/sessions/{id}/tty`, a WebSocket): raw mode,
//! bytes both ways, `resize` on SIGWINCH, `ping` to keep idle connections alive, and Ctrl-D to
//! detach (the session keeps running). [`RawMode`] restores the terminal on every way out:
//! return, error, panic unwinding.

use std::io::Write;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls;
use tokio_tungstenite::tungstenite::error::UrlError;
use tokio_tungstenite::tungstenite::handshake::client::{Request, Response};
use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest, Message};
use tokio_tungstenite::WebSocketStream;
use tokio_util::either::Either;

/// Ctrl-D: detach.
pub(crate) const DETACH: u8 = 0x04;
/// How often an idle attach pings (keeps proxies from closing it).
const PING_EVERY: Duration = Duration::from_secs(30);
/// What a terminal needs after a full-screen program: leave the alternate screen, show the
/// cursor, stop mouse reporting and bracketed paste, normal keypad and cursor keys, reset colours.
const RESET: &str = "\x1b[?1049l\x1b[?25h\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?2004l\x1b[?1l\x1b>\x1b[0m";

/// Raw mode for as long as it lives; dropping it restores the terminal.
#[derive(Debug)]
pub(crate) struct RawMode {
    active: bool,
}

impl RawMode {
    /// Enter raw mode if stdin is a terminal (otherwise a no-op guard).
    pub(crate) fn enter() -> std::io::Result<Self> {
        use std::io::IsTerminal;
        if !std::io::stdin().is_terminal() {
            return Ok(Self { active: false });
        }
        crossterm::terminal::enable_raw_mode()?;
        Ok(Self { active: true })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if self.active {
            let mut out = std::io::stdout();
            let _ = out.write_all(RESET.as_bytes());
            // Whatever follows (the detach message) goes below the agent's screen, not over it.
            if let Some((_, rows)) = term_size() {
                let _ = write!(out, "\x1b[{rows};1H\r\n");
            }
            let _ = out.flush();
            let _ = crossterm::terminal::disable_raw_mode();
        }
    }
}

/// Why an attach ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum End {
    /// Ctrl-D (or stdin closed): the session keeps running.
    Detached,
    /// The agent exited with this code.
    AgentExited(u64),
    /// The server closed the connection (session stopped, server gone).
    Closed,
}

/// An attach failure.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AttachError {
    #[error("cannot connect to the session's terminal: {0}")]
    Connect(String),
    #[error("the terminal connection failed: {0}")]
    Io(String),
}

/// Split typed bytes at the first Ctrl-D (pure): what to send, and whether to detach.
pub(crate) fn split_detach(input: &[u8]) -> (&[u8], bool) {
    match input.iter().position(|b| *b == DETACH) {
        Some(i) => (&input[..i], true),
        None => (input, false),
    }
}

/// The WebSocket URL of a session's terminal (`http` → `ws`, `https` → `wss`) with a size.
pub(crate) fn tty_url(server: &str, tty_path: &str, size: Option<(u16, u16)>) -> String {
    let ws = if let Some(rest) = server.strip_prefix("https://") {
        format!("wss://{rest}")
    } else if let Some(rest) = server.strip_prefix("http://") {
        format!("ws://{rest}")
    } else {
        server.to_owned()
    };
    match size {
        Some((cols, rows)) => format!("{ws}{tty_path}?cols={cols}&rows={rows}"),
        None => format!("{ws}{tty_path}"),
    }
}

fn resize_message(cols: u16, rows: u16) -> Message {
    Message::Text(
        serde_json::json!({"type": "resize", "cols": cols, "rows": rows})
            .to_string()
            .into(),
    )
}

fn term_size() -> Option<(u16, u16)> {
    crossterm::terminal::size().ok().filter(|(c, r)| *c > 0 && *r > 0)
}

/// Whether the agent has painted anything yet: its output so far, read as a terminal would,
/// holds a visible character. The attach's first bytes are the harness's repaint of the screen,
/// which for an agent still starting is escape codes on a blank screen.
struct FirstPaint(vt100::Parser);

impl FirstPaint {
    fn new(size: Option<(u16, u16)>) -> Self {
        use std::num::NonZeroU16;
        let (cols, rows) = size.unwrap_or((80, 24));
        let nz = |n: u16| NonZeroU16::new(n).unwrap_or(NonZeroU16::MIN);
        Self(vt100::Parser::new(nz(rows), nz(cols), 0))
    }

    /// Feed the agent's bytes; true once the screen shows something.
    fn painted(&mut self, bytes: &[u8]) -> bool {
        self.0.process(bytes);
        !self.0.screen().contents().trim().is_empty()
    }
}

/// The line shown until the agent's first bytes (raw mode: `\r`, cleared first).
fn starting_line(elapsed: Duration) -> String {
    format!(
        "\r\x1b[2KThe agent is starting ({}s)… Ctrl-D detaches.",
        elapsed.as_secs()
    )
}

/// The TLS client of `wss://` attaches: the Mozilla roots of `webpki-roots`, as the CLI's HTTP
/// client (reqwest's `rustls-tls`) trusts.
fn tls_connector() -> Result<tokio_rustls::TlsConnector, rustls::Error> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    if let Some(config) = CONFIG.get() {
        return Ok(tokio_rustls::TlsConnector::from(config.clone()));
    }
    let roots = rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let config = rustls::ClientConfig::builder_with_provider(rustls::crypto::ring::default_provider().into())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(
        CONFIG.get_or_init(|| Arc::new(config)).clone(),
    ))
}

/// Open the WebSocket of `req` (`ws://` or `wss://`, RFC 6455 §4.1).
async fn connect(
    req: Request,
) -> Result<(WebSocketStream<Either<TcpStream, TlsStream<TcpStream>>>, Response), tungstenite::Error> {
    let uri = req.uri();
    let tls = match uri.scheme_str() {
        Some("wss") => true,
        Some("ws") => false,
        _ => return Err(tungstenite::Error::Url(UrlError::UnsupportedUrlScheme)),
    };
    let host = uri
        .host()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned())
        .ok_or(tungstenite::Error::Url(UrlError::NoHostName))?;
    let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let tcp = TcpStream::connect((host.as_str(), port)).await?;
    let stream = if tls {
        let name =
            rustls::pki_types::ServerName::try_from(host).map_err(|_| tungstenite::Error::Url(UrlError::NoHostName))?;
        let connector = tls_connector().map_err(|e| tungstenite::Error::Io(std::io::Error::other(e)))?;
        Either::Right(connector.connect(name, tcp).await?)
    } else {
        Either::Left(tcp)
    };
    tokio_tungstenite::client_async(req, stream).await
}

/// Attach to `url` with `token` (the session's `tty_token`) until detach, exit or close.
pub(crate) async fn attach(url_base: &str, tty_path: &str, token: &str) -> Result<End, AttachError> {
    let size = term_size();
    let mut req = tty_url(url_base, tty_path, size)
        .into_client_request()
        .map_err(|e| AttachError::Connect(e.to_string()))?;
    let auth = format!("Bearer {token}")
        .parse()
        .map_err(|_| AttachError::Connect("the tty token is not a header value".into()))?;
    req.headers_mut().insert("authorization", auth);
    let (ws, _) = connect(req).await.map_err(|e| match e {
        tungstenite::Error::Http(r) => {
            let msg = r
                .body()
                .as_deref()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok())
                .and_then(|v| v["error"].as_str().map(str::to_owned))
                .unwrap_or_default();
            AttachError::Connect(format!("{}: {msg}", r.status()))
        }
        other => AttachError::Connect(other.to_string()),
    })?;
    let (mut tx, mut rx) = ws.split();

    let _raw = RawMode::enter().map_err(|e| AttachError::Io(format!("cannot enter raw mode: {e}")))?;
    if let Some((cols, rows)) = size {
        // The session may already run at another size: make it ours.
        let _ = tx.send(resize_message(cols, rows)).await;
    }

    // stdin on a thread: blocking reads, forwarded as they come.
    let (in_tx, mut in_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            use std::io::Read;
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 4096];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if in_tx.blocking_send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        })
        .map_err(|e| AttachError::Io(e.to_string()))?;

    let mut winch = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
        .map_err(|e| AttachError::Io(e.to_string()))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| AttachError::Io(e.to_string()))?;
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| AttachError::Io(e.to_string()))?;
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    let mut stdout = tokio::io::stdout();
    // Until the agent's first bytes (its TUI takes seconds to start on a first attach), say so
    // rather than show a blank screen.
    let starting = std::time::Instant::now();
    let mut waiting = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut first_paint = FirstPaint::new(size);
    let mut tick = tokio::time::interval(Duration::from_millis(250));

    let end = loop {
        tokio::select! {
            m = rx.next() => match m {
                Some(Ok(Message::Binary(b))) => {
                    if waiting && first_paint.painted(&b) {
                        waiting = false;
                        let _ = stdout.write_all(b"\r\x1b[2K").await;
                    }
                    if stdout.write_all(&b).await.and(stdout.flush().await).is_err() {
                        break End::Detached;
                    }
                }
                Some(Ok(Message::Text(t))) => {
                    let v: serde_json::Value = serde_json::from_str(t.as_str()).unwrap_or_default();
                    if v["type"] == "exit" {
                        break End::AgentExited(v["code"].as_u64().unwrap_or(0));
                    }
                }
                Some(Ok(Message::Close(_))) | None => break End::Closed,
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(AttachError::Io(e.to_string())),
            },
            i = in_rx.recv() => match i {
                Some(bytes) => {
                    let (send, detach) = split_detach(&bytes);
                    if !send.is_empty() && tx.send(Message::Binary(send.to_vec().into())).await.is_err() {
                        break End::Closed;
                    }
                    if detach {
                        break End::Detached;
                    }
                }
                None => break End::Detached,
            },
            _ = winch.recv() => {
                if let Some((cols, rows)) = term_size() {
                    let _ = tx.send(resize_message(cols, rows)).await;
                }
            }
            _ = ping.tick() => {
                let _ = tx.send(Message::Text(r#"{"type":"ping"}"#.into())).await;
            }
            _ = tick.tick(), if waiting => {
                let line = starting_line(starting.elapsed());
                let _ = stdout.write_all(line.as_bytes()).await;
                let _ = stdout.flush().await;
            }
            _ = term.recv() => break End::Detached,
            _ = hup.recv() => break End::Detached,
        }
    };
    let _ = tx.send(Message::Close(None)).await;
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repaint_of_a_blank_screen_is_not_the_agent_painting() {
        let mut p = FirstPaint::new(Some((80, 24)));
        // What the harness sends first for an agent still starting: modes, a clear, the cursor.
        assert!(!p.painted(b"\x1b[?1049h\x1b[H\x1b[2J\x1b[?25h\x1b[1;1H"));
        assert!(!p.painted(b"\r\n  \t"));
        assert!(p.painted(b"\x1b[1mWelcome to Claude Code\x1b[0m"));
    }

    #[test]
    fn ctrl_d_detaches_after_sending_what_came_before() {
        assert_eq!(split_detach(b"ls\r"), (&b"ls\r"[..], false));
        assert_eq!(split_detach(b"ab\x04cd"), (&b"ab"[..], true));
        assert_eq!(split_detach(b"\x04"), (&b""[..], true));
        assert_eq!(split_detach(b"\x1b[A"), (&b"\x1b[A"[..], false));
    }

    #[test]
    fn the_starting_line_counts_seconds() {
        let l = starting_line(Duration::from_millis(3400));
        assert!(l.starts_with("\r\x1b[2K") && l.contains("starting (3s)"), "{l:?}");
    }

    #[test]
    fn tty_urls() {
        assert_eq!(
            tty_url(
                "http://127.0.0.1:4000",
                "/api/v1/managed_agents/sessions/s/tty",
                Some((80, 24))
            ),
            "ws://127.0.0.1:4000/api/v1/managed_agents/sessions/s/tty?cols=80&rows=24"
        );
        assert_eq!(tty_url("https://lap.example", "/t", None), "wss://lap.example/t");
    }

    #[test]
    fn a_guard_outside_a_terminal_is_harmless() {
        // Tests run without a terminal on stdin: entering and dropping must not fail.
        let g = RawMode::enter();
        assert!(g.is_ok());
    }
}
