//! `ws::FrameRedactor` (WebSocket frames from a bound host, RFC 6455 §5): any frames in any
//! chunking either end in a `FrameError` or come out as frames whose complete data messages are
//! the input's with every real value replaced by its stub; control frames keep their opcode and
//! hold no real value. Whatever came out before an error holds no real value either. Never a
//! panic.
#![no_main]

mod common;

use std::sync::{Arc, OnceLock};

use bytes::BytesMut;
use lap_vault_sidecar::fuzz::FrameRedactor;
use lap_vault_sidecar::SecretSet;
use libfuzzer_sys::fuzz_target;

use common::{build_set, contains, frames, replace_reference, SECRETS};

fn shared() -> Arc<SecretSet> {
    static SET: OnceLock<Arc<SecretSet>> = OnceLock::new();
    SET.get_or_init(|| Arc::new(build_set())).clone()
}

/// Complete data messages `(opcode, payload)` and control frames `(opcode, payload)`, in order.
#[derive(Default)]
struct Parsed {
    messages: Vec<(u8, Vec<u8>)>,
    controls: Vec<(u8, Vec<u8>)>,
}

/// Reassemble frames that are known to be well formed (the redactor's output, or input the
/// redactor accepted whole).
fn parse(mut buf: &[u8]) -> Parsed {
    let mut parsed = Parsed::default();
    let mut current: Option<(u8, Vec<u8>)> = None;
    while buf.len() >= 2 {
        let (fin, opcode) = (buf[0] & 0x80 != 0, buf[0] & 0x0F);
        let masked = buf[1] & 0x80 != 0;
        let (len, mut at) = match buf[1] & 0x7F {
            126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
            127 if buf.len() >= 10 => (u64::from_be_bytes(buf[2..10].try_into().expect("8 bytes")) as usize, 10),
            126 | 127 => break,
            n => (n as usize, 2),
        };
        if masked && buf.len() < at + 4 {
            break;
        }
        let key = masked.then(|| {
            let k = [buf[at], buf[at + 1], buf[at + 2], buf[at + 3]];
            at += 4;
            k
        });
        if buf.len().saturating_sub(at) < len {
            break;
        }
        let mut payload = buf[at..at + len].to_vec();
        if let Some(k) = key {
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= k[i % 4];
            }
        }
        buf = &buf[at + len..];
        if opcode >= 0x8 {
            parsed.controls.push((opcode, payload));
            continue;
        }
        match (&mut current, opcode) {
            (None, 0x1 | 0x2) => current = Some((opcode, payload)),
            (Some((_, p)), 0x0) => p.extend_from_slice(&payload),
            _ => panic!("a frame out of sequence in well-formed frames"),
        }
        if fin {
            parsed.messages.extend(current.take());
        }
    }
    parsed
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let chunk = (data[0] as usize % 64) + 1;
    let input = frames(&data[1..]);
    let mut redactor = FrameRedactor::new(shared());
    let mut out = BytesMut::new();
    let mut accepted = true;
    for piece in input.chunks(chunk) {
        if redactor.push(piece, &mut out).is_err() {
            accepted = false;
            break;
        }
    }
    let got = parse(&out);
    let values: Vec<&[u8]> = SECRETS.iter().map(|s| s.2.as_bytes()).collect();
    for (opcode, payload) in got.messages.iter().chain(&got.controls) {
        for v in &values {
            assert!(!contains(payload, v), "a real value in an opcode {opcode:#x} payload");
        }
    }
    if accepted {
        let want = parse(&input);
        let stubs: Vec<Option<&[u8]>> = SECRETS.iter().map(|s| Some(s.1.as_bytes())).collect();
        let redacted: Vec<(u8, Vec<u8>)> = want
            .messages
            .iter()
            .map(|(op, p)| (*op, replace_reference(p, &values, &stubs)))
            .collect();
        assert_eq!(got.messages, redacted, "complete messages differ from the reference");
        let ops = |c: &[(u8, Vec<u8>)]| c.iter().map(|(op, _)| *op).collect::<Vec<_>>();
        assert_eq!(ops(&got.controls), ops(&want.controls), "control frames differ");
    }
});
