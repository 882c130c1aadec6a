//! The terminal (`GET /tty`, SPEC §4): one PTY per harness running the agent's TUI, shared by
//! every viewer.
//!
//! The agent starts on the first attach and keeps running when viewers leave. Everything it
//! prints goes through a [`vt100::Parser`] (the current screen) and to every viewer; a viewer that
//! attaches (or falls behind) first gets the current screen repainted from the parser, never a
//! replay of everything printed. Any viewer may type and resize; the last resize wins (tmux's
//! `window-size latest`). When the agent exits, viewers get `{"type":"exit","code":N}` and the
//! next attach starts it again; when the harness stops (the session is stopping), viewers get a
//! close frame (1001, going away) instead.
//!
//! Wire: binary frames are raw terminal bytes both ways. Text frames from a viewer are control
//! messages, `{"type":"resize","cols":C,"rows":R}` and `{"type":"ping"}` (answered
//! `{"type":"pong"}`); a text frame that is not a JSON object with a `type` is typed as input.

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use portable_pty::{CommandBuilder, MasterPty, PtySize};
use serde::Deserialize;
use tokio::sync::broadcast;

/// Lines of scrollback the screen keeps (not replayed on attach; there for the parser's state).
const SCROLLBACK: usize = 0;
/// Output chunks a viewer may fall behind before it is resynchronised with a repaint.
const BACKLOG: usize = 1024;
/// Largest accepted terminal side, in cells.
pub const MAX_SIDE: u16 = 1000;

/// The program a terminal runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TtyCommand {
    pub program: std::path::PathBuf,
    pub args: Vec<String>,
    /// Extra environment on top of the harness's own.
    pub env: Vec<(String, String)>,
    /// Variables of the harness's environment the program must not see.
    pub env_remove: Vec<String>,
}

/// A terminal size in cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Size {
    pub cols: u16,
    pub rows: u16,
}

impl Default for Size {
    fn default() -> Self {
        Self { cols: 80, rows: 24 }
    }
}

impl Size {
    /// A size both sides of which are within `1..=MAX_SIDE`.
    pub fn checked(cols: u16, rows: u16) -> Result<Self, String> {
        if cols == 0 || rows == 0 || cols > MAX_SIDE || rows > MAX_SIDE {
            return Err(format!("cols and rows must be between 1 and {MAX_SIDE}"));
        }
        Ok(Self { cols, rows })
    }

    /// (rows, cols) for the screen model; a zero side (never accepted from a viewer) becomes 1.
    fn nonzero(self) -> (std::num::NonZeroU16, std::num::NonZeroU16) {
        let nz = |n: u16| std::num::NonZeroU16::new(n).unwrap_or(std::num::NonZeroU16::MIN);
        (nz(self.rows), nz(self.cols))
    }

    fn pty(self) -> PtySize {
        PtySize {
            rows: self.rows,
            cols: self.cols,
            pixel_width: 0,
            pixel_height: 0,
        }
    }
}

/// What a viewer sends in a text frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    Resize(Size),
    Ping,
    /// Not a control message: typed as input.
    Input(String),
}

/// Read a text frame (pure). `Err` is a control message that is malformed.
pub fn parse_control(text: &str) -> Result<Control, String> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return Ok(Control::Input(text.to_owned()));
    };
    let Some(kind) = v.get("type").and_then(|t| t.as_str()) else {
        return Ok(Control::Input(text.to_owned()));
    };
    match kind {
        "ping" => Ok(Control::Ping),
        "resize" => {
            let side = |k: &str| {
                v.get(k)
                    .and_then(|n| n.as_u64())
                    .and_then(|n| u16::try_from(n).ok())
                    .ok_or_else(|| format!("resize: `{k}` must be a number between 1 and {MAX_SIDE}"))
            };
            Ok(Control::Resize(Size::checked(side("cols")?, side("rows")?)?))
        }
        other => Err(format!("unknown control message type `{other}`: use resize or ping")),
    }
}

/// What the agent's terminal produced.
#[derive(Debug, Clone)]
pub enum Output {
    Bytes(Bytes),
    /// The agent exited with this code.
    Exit(u32),
    /// The harness is shutting down (the session is stopping): not the agent's own exit.
    Stopped,
}

/// A terminal failure.
#[derive(Debug, thiserror::Error)]
pub enum TtyError {
    #[error("cannot open a pseudo-terminal: {0}")]
    Open(String),
    #[error("cannot start `{program}` in the terminal: {reason}")]
    Spawn { program: String, reason: String },
}

/// One running agent in a PTY.
pub struct Pty {
    master: Mutex<Box<dyn MasterPty + Send>>,
    input: std::sync::mpsc::Sender<Vec<u8>>,
    screen: Mutex<vt100::Parser>,
    output: broadcast::Sender<Output>,
    exited: std::sync::atomic::AtomicBool,
    /// Set by [`Terminal::shutdown`]: the agent is being stopped, it did not exit on its own.
    stopping: std::sync::atomic::AtomicBool,
    killer: Mutex<Box<dyn portable_pty::ChildKiller + Send + Sync>>,
    pid: Option<u32>,
}

impl std::fmt::Debug for Pty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pty").field("pid", &self.pid).finish_non_exhaustive()
    }
}

/// A viewer's start: the current screen, then every output after it.
#[derive(Debug)]
pub struct Attached {
    pub pty: Arc<Pty>,
    /// Escape codes that paint the current screen on a blank terminal.
    pub repaint: Bytes,
    pub output: broadcast::Receiver<Output>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Escape codes reproducing `screen` on a blank terminal: the alternate screen if the agent
/// uses it, the cells, cursor and input modes (application keys, bracketed paste, mouse).
fn repaint(screen: &vt100::Screen) -> Bytes {
    let mut out = Vec::new();
    if screen.alternate_screen() {
        out.extend_from_slice(b"\x1b[?1049h");
    }
    out.extend_from_slice(screen.state_formatted().as_bytes());
    Bytes::from(out)
}

impl Pty {
    fn spawn(cmd: &TtyCommand, cwd: &std::path::Path, size: Size) -> Result<Arc<Self>, TtyError> {
        let system = portable_pty::native_pty_system();
        let pair = system.openpty(size.pty()).map_err(|e| TtyError::Open(e.to_string()))?;
        let mut builder = CommandBuilder::new(&cmd.program);
        builder.args(&cmd.args);
        builder.cwd(cwd);
        for k in &cmd.env_remove {
            builder.env_remove(k);
        }
        for (k, v) in &cmd.env {
            builder.env(k, v);
        }
        let spawn_err = |reason: String| TtyError::Spawn {
            program: cmd.program.display().to_string(),
            reason,
        };
        let mut child = pair
            .slave
            .spawn_command(builder)
            .map_err(|e| spawn_err(e.to_string()))?;
        drop(pair.slave);
        let mut reader = pair.master.try_clone_reader().map_err(|e| spawn_err(e.to_string()))?;
        let mut writer = pair.master.take_writer().map_err(|e| spawn_err(e.to_string()))?;
        let (input, input_rx) = std::sync::mpsc::channel::<Vec<u8>>();
        let pty = Arc::new(Self {
            master: Mutex::new(pair.master),
            input,
            screen: Mutex::new({
                let (rows, cols) = size.nonzero();
                vt100::Parser::new(rows, cols, SCROLLBACK)
            }),
            output: broadcast::channel(BACKLOG).0,
            exited: false.into(),
            stopping: false.into(),
            killer: Mutex::new(child.clone_killer()),
            pid: child.process_id(),
        });
        // Input: a blocking writer thread, so a full PTY buffer never stalls the runtime.
        std::thread::Builder::new()
            .name("tty-input".into())
            .spawn(move || {
                while let Ok(bytes) = input_rx.recv() {
                    if writer.write_all(&bytes).and_then(|()| writer.flush()).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| spawn_err(e.to_string()))?;
        // Output: parse into the screen and fan out, under the screen lock, so an attach sees
        // each chunk either in its repaint or in its stream, never both or neither.
        let out = Arc::clone(&pty);
        std::thread::Builder::new()
            .name("tty-output".into())
            .spawn(move || {
                let mut buf = vec![0u8; 16 * 1024];
                loop {
                    match reader.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let mut screen = lock(&out.screen);
                            screen.process(&buf[..n]);
                            let _ = out.output.send(Output::Bytes(Bytes::copy_from_slice(&buf[..n])));
                        }
                    }
                }
                let code = child.wait().map(|s| s.exit_code()).unwrap_or(1);
                let _screen = lock(&out.screen);
                out.exited.store(true, std::sync::atomic::Ordering::SeqCst);
                if out.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                    let _ = out.output.send(Output::Stopped);
                } else {
                    let _ = out.output.send(Output::Exit(code));
                }
                tracing::info!(code, "the terminal's agent exited");
            })
            .map_err(|e| spawn_err(e.to_string()))?;
        tracing::info!(pid = pty.pid, program = %cmd.program.display(), "terminal started");
        Ok(pty)
    }

    /// The current screen and a subscription to everything after it.
    fn subscribe(self: &Arc<Self>) -> Attached {
        let screen = lock(&self.screen);
        Attached {
            pty: Arc::clone(self),
            repaint: repaint(screen.screen()),
            output: self.output.subscribe(),
        }
    }

    /// Resubscribe after falling behind: a fresh repaint and stream.
    pub fn resync(self: &Arc<Self>) -> Attached {
        self.subscribe()
    }

    /// Type `bytes` into the terminal.
    pub fn write(&self, bytes: Vec<u8>) {
        let _ = self.input.send(bytes);
    }

    /// Resize the terminal (the agent gets SIGWINCH) and the screen model.
    pub fn resize(&self, size: Size) {
        let mut screen = lock(&self.screen);
        let (rows, cols) = size.nonzero();
        if screen.screen().size() == (rows, cols) {
            return;
        }
        screen.set_size(rows, cols);
        if let Err(e) = lock(&self.master).resize(size.pty()) {
            tracing::warn!(error = %e, "terminal resize failed");
        }
    }

    pub fn has_exited(&self) -> bool {
        self.exited.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The agent's process id.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Stop the agent.
    pub fn kill(&self) {
        let _ = lock(&self.killer).kill();
    }

    /// The screen as plain text (rows joined by newlines).
    pub fn contents(&self) -> String {
        lock(&self.screen).screen().contents()
    }
}

/// The harness's terminal: started on first attach, restarted on an attach after it exited.
#[derive(Debug)]
pub struct Terminal {
    command: TtyCommand,
    cwd: std::path::PathBuf,
    current: Mutex<Option<Arc<Pty>>>,
}

impl Terminal {
    pub fn new(command: TtyCommand, cwd: std::path::PathBuf) -> Self {
        Self {
            command,
            cwd,
            current: Mutex::new(None),
        }
    }

    /// Attach a viewer, starting the agent at `size` if it is not running. A running terminal
    /// keeps its size until a viewer sends `resize`.
    pub fn attach(&self, size: Option<Size>) -> Result<Attached, TtyError> {
        let mut current = lock(&self.current);
        if let Some(pty) = current.as_ref().filter(|p| !p.has_exited()) {
            return Ok(pty.subscribe());
        }
        let pty = Pty::spawn(&self.command, &self.cwd, size.unwrap_or_default())?;
        let attached = pty.subscribe();
        *current = Some(pty);
        Ok(attached)
    }

    /// The running terminal, if any.
    pub fn running(&self) -> Option<Arc<Pty>> {
        lock(&self.current).clone().filter(|p| !p.has_exited())
    }

    /// Stop the agent (harness shutdown); viewers get [`Output::Stopped`], not an exit.
    pub fn shutdown(&self) {
        if let Some(p) = lock(&self.current).take() {
            p.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
            p.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn control_messages() {
        assert_eq!(parse_control(r#"{"type":"ping"}"#), Ok(Control::Ping));
        assert_eq!(
            parse_control(r#"{"type":"resize","cols":120,"rows":40}"#),
            Ok(Control::Resize(Size { cols: 120, rows: 40 }))
        );
        assert!(parse_control(r#"{"type":"resize","cols":0,"rows":40}"#).is_err());
        assert!(parse_control(r#"{"type":"resize","cols":70000,"rows":40}"#).is_err());
        assert!(parse_control(r#"{"type":"resize","cols":"x","rows":40}"#)
            .unwrap_err()
            .contains("cols"));
        assert!(parse_control(r#"{"type":"nope"}"#).unwrap_err().contains("nope"));
        assert_eq!(parse_control("ls\r"), Ok(Control::Input("ls\r".into())));
        assert_eq!(parse_control("42"), Ok(Control::Input("42".into())));
        assert_eq!(parse_control(r#"{"a":1}"#), Ok(Control::Input(r#"{"a":1}"#.into())));
    }

    #[test]
    fn repaint_reproduces_the_screen() {
        let size = Size { cols: 20, rows: 5 }.nonzero();
        let mut p = vt100::Parser::new(size.0, size.1, 0);
        p.process(b"hello\r\n\x1b[1mworld\x1b[0m");
        let mut q = vt100::Parser::new(size.0, size.1, 0);
        q.process(b"garbage everywhere\r\nmore");
        q.process(&repaint(p.screen()));
        assert_eq!(q.screen().contents(), "hello\nworld");
        assert_eq!(q.screen().cursor_position(), p.screen().cursor_position());

        let mut alt = vt100::Parser::new(size.0, size.1, 0);
        alt.process(b"\x1b[?1049hfull screen");
        let r = repaint(alt.screen());
        assert!(r.starts_with(b"\x1b[?1049h"));
    }
}
