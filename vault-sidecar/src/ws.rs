//! WebSocket messages from a bound host, redacted (issue 14, W04).
//!
//! After an intercepted `101 Switching Protocols` with `Upgrade: websocket`, the upstream's bytes
//! are WebSocket frames (RFC 6455 §5.2). A real value the upstream reflects in a text or binary
//! message must reach the client as its stub, even when the message is fragmented and the value
//! split across frames. [`FrameRedactor`] parses the upstream's frames as they stream and passes
//! each data message through one [`StreamRewriter`] (so a value split across fragments is found);
//! what it releases goes out re-fragmented (an intermediary may change a message's fragmentation
//! when no extension is negotiated, §5.4), the message's last fragment carrying what the rewriter
//! held back. Control frames (`close`, `ping`, `pong`: at most 125 bytes, §5.5) are redacted
//! whole.
//!
//! The sidecar removes `Sec-WebSocket-Extensions` from the upgrade request, so no extension
//! (`permessage-deflate`, RFC 7692) hides a value; a frame with an RSV bit set anyway is
//! something it cannot read, and the connection is closed (fail closed).
//!
//! The client's frames go to the upstream as they are, but read first ([`FrameTripwire`]): a stub
//! of a secret the host is not bound to in a message (as written or encoded, across frames)
//! closes the connection before the frame that completes it leaves, with a `1008` close to the
//! client. No surface declares a WebSocket message, so nothing in one is swapped; a bound
//! secret's stub passes as the stub, as in a body.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::rewrite::{self, Exfiltration, StreamRewriter, StubScanner};
use crate::secrets::SecretSet;

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
/// Largest control frame payload (RFC 6455 §5.5).
const MAX_CONTROL: usize = 125;

/// Why the upstream's byte stream is not WebSocket the sidecar can redact.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a frame with RSV bits {0:#x}: an extension the vault did not negotiate")]
    Reserved(u8),
    #[error("opcode {0:#x} is reserved (RFC 6455 §5.2)")]
    Opcode(u8),
    #[error("a control frame longer than 125 bytes or fragmented (RFC 6455 §5.5)")]
    Control,
    #[error("a continuation frame outside a message, or a new message inside one (RFC 6455 §5.4)")]
    Fragmentation,
    #[error("a frame length over 2^63 (RFC 6455 §5.2)")]
    Length,
}

/// The head of the frame being read.
#[derive(Debug, Clone, Copy)]
struct Head {
    fin: bool,
    opcode: u8,
    mask: Option<[u8; 4]>,
    remaining: u64,
    /// Payload offset so far (for unmasking a masked frame across reads).
    offset: u64,
}

/// What [`FrameReader::next`] read.
enum Piece {
    /// A frame's head (its payload follows).
    Head(Head),
    /// The next bytes of the current frame's payload, unmasked; `done` on its last bytes.
    Payload { head: Head, bytes: BytesMut, done: bool },
}

/// Reads frames as they stream in (RFC 6455 §5.2), one head or payload piece at a time.
#[derive(Default)]
struct FrameReader {
    buf: BytesMut,
    head: Option<Head>,
}

impl FrameReader {
    fn extend(&mut self, input: &[u8]) {
        self.buf.extend_from_slice(input);
    }

    /// The next piece of what has arrived; `None` when more bytes are needed.
    fn next(&mut self) -> Result<Option<Piece>, FrameError> {
        let Some(mut head) = self.head else {
            let Some((head, len)) = parse_head(&self.buf)? else {
                return Ok(None);
            };
            self.buf.advance(len);
            self.head = Some(head);
            return Ok(Some(Piece::Head(head)));
        };
        let take = usize::try_from(head.remaining)
            .unwrap_or(usize::MAX)
            .min(self.buf.len());
        if take == 0 && head.remaining > 0 {
            return Ok(None);
        }
        let mut bytes = self.buf.split_to(take);
        if let Some(key) = head.mask {
            for (i, b) in bytes.iter_mut().enumerate() {
                *b ^= key[((head.offset + i as u64) % 4) as usize];
            }
        }
        head.offset += take as u64;
        head.remaining -= take as u64;
        let done = head.remaining == 0;
        self.head = (!done).then_some(head);
        Ok(Some(Piece::Payload { head, bytes, done }))
    }
}

/// Parses the upstream's frames and re-emits them with real values replaced by stubs.
pub struct FrameRedactor {
    secrets: std::sync::Arc<SecretSet>,
    frames: FrameReader,
    /// The data message being relayed: its opcode (until its first fragment is written) and its
    /// rewriter.
    message: Option<Message>,
    /// Control frame payload being gathered.
    control: BytesMut,
    /// Redactions made, by pattern of [`SecretSet::value_automaton`].
    hits: Vec<u64>,
}

struct Message {
    /// `Some(opcode)` until the first fragment has gone out; then continuations follow.
    first: Option<u8>,
    rewriter: Option<StreamRewriter>,
}

impl FrameRedactor {
    pub fn new(secrets: std::sync::Arc<SecretSet>) -> Self {
        let n = secrets.value_automaton().map_or(0, |(_, ids)| ids.len());
        Self {
            secrets,
            frames: FrameReader::default(),
            message: None,
            control: BytesMut::new(),
            hits: vec![0; n],
        }
    }

    pub fn hits(&self) -> &[u64] {
        &self.hits
    }

    /// Feed bytes from the upstream; appends the frames to send to the client to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut BytesMut) -> Result<(), FrameError> {
        self.frames.extend(input);
        while let Some(piece) = self.frames.next()? {
            match piece {
                Piece::Head(head) => self.start(head)?,
                Piece::Payload { head, bytes, done } => {
                    self.payload(&head, bytes.freeze(), out);
                    if done {
                        self.end(&head, out);
                    }
                }
            }
        }
        Ok(())
    }

    /// A frame head: checks it against the message state.
    fn start(&mut self, head: Head) -> Result<(), FrameError> {
        match head.opcode {
            0x8..=0xA => {
                if !head.fin || head.remaining > MAX_CONTROL as u64 {
                    return Err(FrameError::Control);
                }
                self.control.clear();
            }
            OP_CONTINUATION if self.message.is_none() => return Err(FrameError::Fragmentation),
            OP_TEXT | OP_BINARY if self.message.is_some() => return Err(FrameError::Fragmentation),
            OP_TEXT | OP_BINARY => {
                self.message = Some(Message {
                    first: Some(head.opcode),
                    rewriter: rewrite::redactor(&self.secrets),
                });
            }
            OP_CONTINUATION => {}
            op => return Err(FrameError::Opcode(op)),
        }
        Ok(())
    }

    fn payload(&mut self, head: &Head, payload: Bytes, out: &mut BytesMut) {
        if head.opcode >= 0x8 {
            self.control.extend_from_slice(&payload);
            return;
        }
        let Some(msg) = self.message.as_mut() else { return };
        let released = match msg.rewriter.as_mut() {
            Some(rw) => rw.push(payload),
            None => payload,
        };
        if !released.is_empty() {
            let opcode = msg.first.take().unwrap_or(OP_CONTINUATION);
            write_frame(out, false, opcode, &released);
        }
    }

    fn end(&mut self, head: &Head, out: &mut BytesMut) {
        if head.opcode >= 0x8 {
            let payload = self.control.split().freeze();
            let mut redacted = rewrite::redact_value(&self.secrets, &payload).map_or(payload, Bytes::from);
            if redacted.len() > MAX_CONTROL {
                // A close keeps its status code; anything else goes out empty.
                redacted = if head.opcode == 0x8 {
                    redacted.slice(..2)
                } else {
                    Bytes::new()
                };
            }
            write_frame(out, true, head.opcode, &redacted);
            return;
        }
        if !head.fin {
            return;
        }
        let Some(mut msg) = self.message.take() else { return };
        let rest = match msg.rewriter.as_mut() {
            Some(rw) => {
                let rest = rw.finish();
                for (total, n) in self.hits.iter_mut().zip(rw.hits()) {
                    *total += n;
                }
                rest
            }
            None => Bytes::new(),
        };
        let opcode = msg.first.take().unwrap_or(OP_CONTINUATION);
        write_frame(out, true, opcode, &rest);
    }
}

/// Why the client's frames stop at the vault.
#[derive(Debug)]
pub enum ClientFrames {
    /// A stub the tripwire refuses.
    Stub(Exfiltration),
    /// Framing the vault cannot read, so cannot check.
    Frame(FrameError),
}

impl From<FrameError> for ClientFrames {
    fn from(e: FrameError) -> Self {
        Self::Frame(e)
    }
}

/// Reads the client's (masked) frames as they stream and passes their payloads, unmasked,
/// through a [`StubScanner`]: one over the data messages (so a stub split across fragments is
/// found), a fresh one per control frame.
pub struct FrameTripwire {
    secrets: std::sync::Arc<SecretSet>,
    data: StubScanner,
    fresh: StubScanner,
    control: Option<StubScanner>,
    frames: FrameReader,
}

impl FrameTripwire {
    pub fn new(secrets: std::sync::Arc<SecretSet>, scanner: StubScanner) -> Self {
        Self {
            secrets,
            data: scanner.clone(),
            fresh: scanner,
            control: None,
            frames: FrameReader::default(),
        }
    }

    /// Look at the next bytes from the client; `Ok` when they may go on to the upstream.
    pub fn push(&mut self, input: &[u8]) -> Result<(), ClientFrames> {
        self.frames.extend(input);
        while let Some(piece) = self.frames.next()? {
            match piece {
                Piece::Head(head) if head.opcode >= 0x8 => {
                    if !head.fin || head.remaining > MAX_CONTROL as u64 {
                        return Err(FrameError::Control.into());
                    }
                    self.control = Some(self.fresh.clone());
                }
                Piece::Head(head) if !matches!(head.opcode, OP_CONTINUATION | OP_TEXT | OP_BINARY) => {
                    return Err(FrameError::Opcode(head.opcode).into());
                }
                Piece::Head(_) => {}
                Piece::Payload { head, bytes, .. } => {
                    let scanner = match (head.opcode >= 0x8, self.control.as_mut()) {
                        (true, Some(c)) => c,
                        _ => &mut self.data,
                    };
                    scanner.push(&self.secrets, &bytes).map_err(ClientFrames::Stub)?;
                }
            }
        }
        Ok(())
    }
}

/// A frame head from the start of `buf`, with its length in bytes; `None` when more bytes are
/// needed.
fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, FrameError> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let rsv = buf[0] & 0x70;
    if rsv != 0 {
        return Err(FrameError::Reserved(rsv >> 4));
    }
    let (fin, opcode) = (buf[0] & 0x80 != 0, buf[0] & 0x0F);
    let masked = buf[1] & 0x80 != 0;
    let (len, mut at) = match buf[1] & 0x7F {
        126 if buf.len() >= 4 => (u64::from(u16::from_be_bytes([buf[2], buf[3]])), 4),
        127 if buf.len() >= 10 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[2..10]);
            let len = u64::from_be_bytes(b);
            if len >> 63 != 0 {
                return Err(FrameError::Length);
            }
            (len, 10)
        }
        126 | 127 => return Ok(None),
        n => (u64::from(n), 2),
    };
    let mask = if masked {
        if buf.len() < at + 4 {
            return Ok(None);
        }
        let key = [buf[at], buf[at + 1], buf[at + 2], buf[at + 3]];
        at += 4;
        Some(key)
    } else {
        None
    };
    Ok(Some((
        Head {
            fin,
            opcode,
            mask,
            remaining: len,
            offset: 0,
        },
        at,
    )))
}

/// One unmasked frame (server to client, RFC 6455 §5.1).
fn write_frame(out: &mut BytesMut, fin: bool, opcode: u8, payload: &[u8]) {
    out.put_u8(if fin { 0x80 } else { 0 } | opcode);
    match payload.len() {
        n if n < 126 => out.put_u8(n as u8),
        n if n <= usize::from(u16::MAX) => {
            out.put_u8(126);
            out.put_u16(n as u16);
        }
        n => {
            out.put_u8(127);
            out.put_u64(n as u64);
        }
    }
    out.extend_from_slice(payload);
}

/// Relay an upgraded WebSocket connection: client → upstream through a [`FrameTripwire`] when
/// one is given, upstream → client through a [`FrameRedactor`]. Returns the bytes each way, the
/// redaction hits and the stub the tripwire refused; ends when both directions have, or at once
/// (both sides closed) when the upstream sends what cannot be redacted or the client a stub.
pub(crate) async fn relay<C, U>(
    client: C,
    upstream: U,
    secrets: std::sync::Arc<SecretSet>,
    tripwire: Option<StubScanner>,
) -> (u64, u64, Vec<u64>, Option<Exfiltration>)
where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let mut redactor = FrameRedactor::new(secrets.clone());
    let mut tripwire = tripwire.map(|t| FrameTripwire::new(secrets, t));
    let stop = tokio::sync::Notify::new();
    let up = async {
        let mut sent = 0u64;
        let mut buf = vec![0u8; 16 * 1024];
        let mut refused = None;
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            match tripwire.as_mut().map(|t| t.push(&buf[..n])) {
                Some(Err(ClientFrames::Stub(ex))) => {
                    tracing::warn!(secret = %ex.secret, "a WebSocket message from the client carries a stub not bound to this host; closing");
                    refused = Some(ex);
                    stop.notify_one();
                    break;
                }
                Some(Err(ClientFrames::Frame(e))) => {
                    tracing::warn!(error = %e, "WebSocket frames from the client cannot be read; closing");
                    stop.notify_one();
                    break;
                }
                _ => {}
            }
            if uw.write_all(&buf[..n]).await.is_err() {
                break;
            }
            sent += n as u64;
        }
        let _ = uw.shutdown().await;
        (sent, refused)
    };
    let down = async {
        let mut sent = 0u64;
        let mut buf = vec![0u8; 16 * 1024];
        let mut out = BytesMut::new();
        loop {
            let n = tokio::select! {
                read = ur.read(&mut buf) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                },
                () = stop.notified() => {
                    // Policy violation (RFC 6455 §7.4.1).
                    write_frame(&mut out, true, 0x8, &1008u16.to_be_bytes());
                    let _ = cw.write_all(&out).await;
                    break;
                }
            };
            if let Err(e) = redactor.push(&buf[..n], &mut out) {
                tracing::warn!(error = %e, "WebSocket frames from the upstream cannot be redacted; closing");
                break;
            }
            if !out.is_empty() {
                if cw.write_all(&out).await.is_err() {
                    break;
                }
                sent += out.len() as u64;
                out.clear();
            }
        }
        let _ = cw.shutdown().await;
        sent
    };
    let ((up, refused), down) = tokio::join!(up, down);
    (up, down, redactor.hits().to_vec(), refused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BindingSet;
    use crate::config::{Secret, Surfaces};
    use std::sync::Arc;

    const STUB: &str = "lap_stub_ws_0123456789abcdef";
    const REAL: &str = "sk-real-ws-value-0123456789";

    fn secrets() -> Arc<SecretSet> {
        Arc::new(SecretSet::new(vec![Secret {
            name: "ws".into(),
            stub: STUB.into(),
            value: REAL.into(),
            hosts: BindingSet(vec!["ws.example".parse().expect("binding")]),
            surfaces: Surfaces::default(),
        }]))
    }

    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        write_frame(&mut out, fin, opcode, payload);
        out.to_vec()
    }

    /// Parse frames back into (opcode of the message, whole payload) messages and control frames.
    fn messages(mut wire: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut current: Option<(u8, Vec<u8>)> = None;
        while !wire.is_empty() {
            let (head, len) = parse_head(wire).expect("valid").expect("complete");
            let n = head.remaining as usize;
            let payload = &wire[len..len + n];
            wire = &wire[len + n..];
            if head.opcode >= 8 {
                out.push((head.opcode, payload.to_vec()));
                continue;
            }
            let msg = current.get_or_insert_with(|| (head.opcode, Vec::new()));
            msg.1.extend_from_slice(payload);
            if head.fin {
                out.push(current.take().expect("message"));
            }
        }
        assert!(current.is_none(), "a message was left unfinished");
        out
    }

    fn run(input: &[u8], chunk: usize) -> Vec<u8> {
        let mut r = FrameRedactor::new(secrets());
        let mut out = BytesMut::new();
        for piece in input.chunks(chunk.max(1)) {
            r.push(piece, &mut out).expect("redactable");
        }
        out.to_vec()
    }

    #[test]
    fn w04_a_text_frame_and_a_value_split_across_fragments_reach_the_client_as_stubs() {
        let mut input = frame(true, OP_TEXT, format!("{{\"echo\":\"{REAL}\"}}").as_bytes());
        let (a, b) = REAL.as_bytes().split_at(9);
        input.extend(frame(false, OP_BINARY, &[b"bin:".as_slice(), a].concat()));
        input.extend(frame(true, 0x9, b"ping")); // a control frame between fragments
        input.extend(frame(true, OP_CONTINUATION, &[b, b":end".as_slice()].concat()));
        for chunk in [1, 3, 7, 64, 4096] {
            let msgs = messages(&run(&input, chunk));
            assert_eq!(
                msgs,
                vec![
                    (OP_TEXT, format!("{{\"echo\":\"{STUB}\"}}").into_bytes()),
                    (0x9, b"ping".to_vec()),
                    (OP_BINARY, format!("bin:{STUB}:end").into_bytes()),
                ],
                "read {chunk} bytes at a time"
            );
        }
    }

    #[test]
    fn masked_frames_long_lengths_and_control_payloads_are_redacted() {
        let payload = format!("{}{REAL}", "x".repeat(70_000));
        let mut input = frame(true, OP_BINARY, payload.as_bytes());
        // A masked close frame whose reason holds the value.
        let reason = [&[0x03, 0xE8][..], REAL.as_bytes()].concat();
        let key = [1u8, 2, 3, 4];
        let masked: Vec<u8> = reason.iter().enumerate().map(|(i, b)| b ^ key[i % 4]).collect();
        input.extend([0x88, 0x80 | reason.len() as u8]);
        input.extend(key);
        input.extend(masked);
        let msgs = messages(&run(&input, 1000));
        assert_eq!(
            msgs[0],
            (OP_BINARY, format!("{}{STUB}", "x".repeat(70_000)).into_bytes())
        );
        assert_eq!(msgs[1], (0x8, [&[0x03, 0xE8][..], STUB.as_bytes()].concat()));
    }

    #[test]
    fn what_cannot_be_redacted_is_an_error() {
        let mut r = FrameRedactor::new(secrets());
        let mut out = BytesMut::new();
        assert_eq!(
            r.push(&[0xC1, 0x00], &mut out),
            Err(FrameError::Reserved(4)),
            "permessage-deflate"
        );
        let mut r = FrameRedactor::new(secrets());
        assert_eq!(
            r.push(&frame(true, OP_CONTINUATION, b"x"), &mut out),
            Err(FrameError::Fragmentation)
        );
        let mut r = FrameRedactor::new(secrets());
        assert_eq!(r.push(&frame(false, 0x9, b"x"), &mut out), Err(FrameError::Control));
        let mut r = FrameRedactor::new(secrets());
        assert_eq!(r.push(&frame(true, 0x3, b"x"), &mut out), Err(FrameError::Opcode(3)));
    }
}
