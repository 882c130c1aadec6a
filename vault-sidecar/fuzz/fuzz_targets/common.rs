//! A fixed secret set shared by the rewriter targets: two header secrets bound to distinct hosts, one
//! query secret and one body secret, each with one credential surface ([`surface`]). No stub is a
//! prefix of another and stubs hold `-`/`_` (never base64 text) and never `&`, `=`, `?` or `%`.
#![allow(dead_code)]

use std::sync::OnceLock;

use lap_vault_sidecar::config::{parse_config, Settings};
use lap_vault_sidecar::SecretSet;

pub const SECRETS: [(&str, &str, &str, &str); 4] = [
    (
        "ANTHROPIC_API_KEY",
        "sk-ant-lapstub-7f3a9c",
        "sk-ant-REAL-0d9e8f7a6b5c",
        "header",
    ),
    ("GITHUB_TOKEN", "ghp_lapstub_A1b2C3", "ghp_REAL_Z9y8X7w6V5u4", "header"),
    ("QUERY_TOKEN", "lapstub-query-4c8e", "REAL-query-9a7c5e3b", "query"),
    (
        "BODY_TOKEN",
        "lapstub-body-5d1f",
        "REAL-body-8b6d4f2a0c1e-longer",
        "body",
    ),
];

/// The header, query parameter and body route of the surfaces.
pub const HEADER: &str = "x-fuzz";
pub const PARAM: &str = "q";
pub const ROUTE: (&str, &str) = ("POST", "/upload");

/// The one credential surface of a secret of kind `kind`.
pub fn surface(kind: &str) -> String {
    match kind {
        "header" => format!("header:{HEADER}"),
        "query" => format!("query:{PARAM}"),
        _ => format!("body:{} {}", ROUTE.0, ROUTE.1),
    }
}

/// Hosts: index 0 binds ANTHROPIC/QUERY/BODY, 1 binds GITHUB, 2 binds nothing.
pub const HOSTS: [&str; 3] = ["api.anthropic.com", "github.com", "attacker.example"];

pub fn bound(secret: usize, host: usize) -> bool {
    matches!((secret, host), (0 | 2 | 3, 0) | (1, 1))
}

pub fn set() -> &'static SecretSet {
    static SET: OnceLock<SecretSet> = OnceLock::new();
    SET.get_or_init(build_set)
}

/// A new set of [`SECRETS`], as [`set`] holds.
pub fn build_set() -> SecretSet {
    {
        let mut toml = String::new();
        for (i, (name, stub, value, kind)) in SECRETS.iter().enumerate() {
            let loc = surface(kind);
            let host = if i == 1 { "github.com" } else { "api.anthropic.com" };
            toml.push_str(&format!(
                "[[secrets]]\nname = \"{name}\"\nstub = \"{stub}\"\nvalue = \"{value}\"\nhosts = [\"{host}\"]\nlocations = [\"{loc}\"]\n"
            ));
        }
        let cfg = parse_config(&toml).expect("fixed config parses");
        let settings = Settings::from_config_with_env(&cfg, &|_| None).expect("fixed config validates");
        SecretSet::new(settings.secrets)
    }
}

/// Expands a fuzz input into bytes rich in patterns: 0x00..=0x03 → a whole stub, 0x04..=0x07 → a stub
/// without its last 3 bytes, 0x08..=0x0b → a whole real value, 0x0c..=0x0f → a value's prefix,
/// 0x10..=0x13 → a stub with every byte percent-encoded, 0x14..=0x17 → the same encoded twice
/// (`%25XX`); others as they are.
pub fn expand(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() * 2);
    for &b in data {
        let i = (b & 3) as usize;
        match b {
            0x00..=0x03 => out.extend_from_slice(SECRETS[i].1.as_bytes()),
            0x04..=0x07 => out.extend_from_slice(&SECRETS[i].1.as_bytes()[..SECRETS[i].1.len() - 3]),
            0x08..=0x0b => out.extend_from_slice(SECRETS[i].2.as_bytes()),
            0x0c..=0x0f => out.extend_from_slice(&SECRETS[i].2.as_bytes()[..SECRETS[i].2.len() - 3]),
            0x10..=0x13 => SECRETS[i].1.bytes().for_each(|c| out.extend_from_slice(format!("%{c:02X}").as_bytes())),
            0x14..=0x17 => SECRETS[i].1.bytes().for_each(|c| out.extend_from_slice(format!("%25{c:02x}").as_bytes())),
            _ => out.push(b),
        }
    }
    out
}

/// Leftmost, non-overlapping replacement of `pats[k]` by `reps[k]` (`None`: keep the match as is), the
/// one-shot reference.
pub fn replace_reference(hay: &[u8], pats: &[&[u8]], reps: &[Option<&[u8]>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hay.len());
    let mut i = 0;
    while i < hay.len() {
        let hit = pats.iter().enumerate().find(|(_, p)| hay[i..].starts_with(p));
        match hit {
            Some((k, p)) => {
                out.extend_from_slice(reps[k].unwrap_or(p));
                i += p.len();
            }
            None => {
                out.push(hay[i]);
                i += 1;
            }
        }
    }
    out
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// One frame: FIN, opcode, optional masking key, payload (RFC 6455 §5.2).
pub fn frame(out: &mut Vec<u8>, fin: bool, opcode: u8, mask: Option<[u8; 4]>, payload: &[u8]) {
    out.push(u8::from(fin) << 7 | opcode);
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(m | n as u8),
        n if n <= 0xFFFF => {
            out.push(m | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(m | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(key) => {
            out.extend_from_slice(&key);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        }
        None => out.extend_from_slice(payload),
    }
}

/// Frames from a fuzz input: per frame a spec byte (opcode, FIN, mask, raw garbage), a length
/// byte and that many input bytes expanded (stubs and real values among them).
pub fn frames(data: &[u8]) -> Vec<u8> {
    frames_with(data).0
}

/// [`frames`], with each frame built `(opcode, payload)` (unmasked) and whether raw bytes were
/// mixed in (then the frames as built are not all the parser sees).
pub fn frames_with(mut data: &[u8]) -> (Vec<u8>, Vec<(u8, Vec<u8>)>, bool) {
    let mut built = Vec::new();
    let mut raw = false;
    let mut out = Vec::new();
    while data.len() >= 2 {
        let (spec, len) = (data[0], data[1] as usize % 48);
        data = &data[2..];
        let take = len.min(data.len());
        let payload = expand(&data[..take]);
        data = &data[take..];
        if spec & 0xF0 == 0xF0 {
            // Raw bytes: whatever the parser makes of them.
            out.extend_from_slice(&payload);
            raw = true;
            continue;
        }
        let opcode = [0x0, 0x1, 0x2, 0x8, 0x9, 0xA, 0x3, 0x1][(spec & 7) as usize];
        let mask = (spec & 0x10 != 0).then_some([spec, 0x5a, 0xa5, len as u8]);
        frame(&mut out, spec & 0x08 != 0 || opcode >= 0x8, opcode, mask, &payload);
        built.push((opcode, payload));
    }
    (out, built, raw)
}
