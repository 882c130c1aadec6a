//! `rewrite::HostRules::header_value` (plain and inside `Basic` credentials) and `path_and_query`
//! against a reference: a stub of a secret not bound to the host, or outside its secret's one
//! credential surface (`header:x-fuzz`, `query:q`), is always refused, as written or
//! percent-encoded; otherwise every stub is replaced by its value and nothing else changes.
#![no_main]

mod common;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use lap_vault_sidecar::TargetHost;
use lap_vault_sidecar::{HostRules, Injections, StubRefusal};
use libfuzzer_sys::fuzz_target;

use common::{bound, contains, expand, replace_reference, set, HEADER, HOSTS, PARAM, SECRETS};

/// What header_value must do with `input` in header `x-fuzz` toward host `h`: `Err(())` for a
/// refusal, else the output.
fn expected(input: &[u8], h: usize) -> Result<Vec<u8>, ()> {
    expected_at(input, h, Some("header"))
}

/// The same where stubs of kind `kind` are swapped (`None`: nowhere, every stub refuses).
fn expected_at(input: &[u8], h: usize, kind: Option<&str>) -> Result<Vec<u8>, ()> {
    let pats: Vec<&[u8]> = SECRETS.iter().map(|s| s.1.as_bytes()).collect();
    let mut i = 0;
    while i < input.len() {
        if let Some((k, p)) = pats.iter().enumerate().find(|(_, p)| input[i..].starts_with(p)) {
            if !bound(k, h) || Some(SECRETS[k].3) != kind {
                return Err(());
            }
            i += p.len();
        } else {
            i += 1;
        }
    }
    // The tripwire also reads the input percent-decoded, up to four levels (`%25` hiding one each).
    let mut form = input.to_vec();
    for _ in 0..4 {
        let decoded = percent_decode(&form);
        if decoded == form {
            break;
        }
        if SECRETS.iter().enumerate().any(|(k, s)| !bound(k, h) && contains(&decoded, s.1.as_bytes())) {
            return Err(());
        }
        form = decoded;
    }
    let reps: Vec<Option<&[u8]>> = SECRETS.iter().map(|s| Some(s.2.as_bytes())).collect();
    Ok(replace_reference(input, &pats, &reps))
}

/// `%XX` (two hex digits) decoded; any other `%` kept (RFC 3986 §2.1).
fn percent_decode(input: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        if input[i] == b'%' && i + 2 < input.len() {
            if let (Some(a), Some(b)) = (hex(input[i + 1]), hex(input[i + 2])) {
                out.push(a * 16 + b);
                i += 3;
                continue;
            }
        }
        out.push(input[i]);
        i += 1;
    }
    out
}

/// Whether `decoded` holds the core of a stub not bound to host `h` (the stub without up to two
/// bytes at either end). The tripwire's base64 patterns cover only the base64 quanta wholly
/// inside a stub, so Basic credentials holding such a near-stub are refused: it fails closed.
fn near_unbound_stub(decoded: &[u8], h: usize) -> bool {
    SECRETS
        .iter()
        .enumerate()
        .any(|(k, s)| !bound(k, h) && contains(decoded, &s.1.as_bytes()[2..s.1.len() - 2]))
}

/// What path_and_query must do with `pq` toward host `h`: stubs only in the value of `q`.
fn expected_target(pq: &str, h: usize) -> Result<Vec<u8>, ()> {
    let Some((path, query)) = pq.split_once('?') else {
        return expected_at(pq.as_bytes(), h, None);
    };
    let mut out = expected_at(path.as_bytes(), h, None)?;
    out.push(b'?');
    for (i, param) in query.split('&').enumerate() {
        if i > 0 {
            out.push(b'&');
        }
        let (name, value) = param.split_once('=').unwrap_or((param, ""));
        out.extend_from_slice(&expected_at(name.as_bytes(), h, None)?);
        if param.len() > name.len() {
            out.push(b'=');
        }
        let swaps = (name == PARAM || name.eq_ignore_ascii_case("%71")).then_some("query");
        out.extend_from_slice(&expected_at(value.as_bytes(), h, swaps)?);
    }
    Ok(out)
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let h = (sel % 3) as usize;
    let host = TargetHost::parse(HOSTS[h]);
    let rules = HostRules::new(set(), &host, 443);
    let value = expand(rest);

    // Plain header value. (Without a Basic prefix, base64 decoding never runs when `value` is not
    // Basic-shaped; when it is, the Basic check below covers it.)
    let mut inj = Injections::default();
    let got = rules.header_value(HEADER, &value, &mut inj);
    let is_basic = value.trim_ascii_start().len() > 6
        && value.trim_ascii_start()[..5].eq_ignore_ascii_case(b"basic")
        && value.trim_ascii_start()[5].is_ascii_whitespace();
    // Nothing is bound to attacker.example: never a rewrite.
    assert!(
        !(h == 2 && matches!(got, Ok(Some(_)))),
        "a value toward an unbound host was rewritten"
    );
    if !is_basic {
        match (expected(&value, h), got) {
            (Err(()), Err(e)) => assert!(SECRETS.iter().any(|s| s.0 == e.secret)),
            (Ok(want), Ok(out)) => {
                let out = out.unwrap_or_else(|| value.clone());
                assert_eq!(out, want, "header value rewrite differs from the reference");
            }
            (want, got) => panic!(
                "tripwire mismatch for host {}: expected {want:?}, got {got:?}",
                HOSTS[h]
            ),
        }
    }

    // The same bytes as Basic credentials: decoded, checked, swapped, re-encoded.
    let header = format!("Basic {}", BASE64.encode(&value));
    let mut inj = Injections::default();
    let got = rules.header_value(HEADER, header.as_bytes(), &mut inj);
    match (expected(&value, h), got) {
        (Err(()), Err(_)) => {}
        (Ok(_), Err(e)) if e.why == StubRefusal::Unbound && near_unbound_stub(&value, h) => {}
        (Ok(want), Ok(out)) => {
            let out = out.unwrap_or_else(|| header.clone().into_bytes());
            let b64 = out.strip_prefix(b"Basic ").expect("scheme kept");
            let decoded = BASE64.decode(b64).expect("re-encoded base64");
            assert_eq!(decoded, want, "Basic credentials rewrite differs from the reference");
        }
        (want, got) => panic!(
            "Basic tripwire mismatch for host {}: expected {want:?}, got {got:?}",
            HOSTS[h]
        ),
    }
    // A real value never appears toward a host its secret is not bound to, unless the client sent it.
    if let Ok(Some(out)) = rules.header_value(HEADER, &value, &mut Injections::default()) {
        for (k, s) in SECRETS.iter().enumerate() {
            if !bound(k, h) {
                assert!(!contains(&out, s.2.as_bytes()) || contains(&value, s.2.as_bytes()));
            }
        }
    }
    // The request target: stubs only in the value of the declared parameter.
    if let Ok(pq) = std::str::from_utf8(&value) {
        let got = rules.path_and_query(pq, &mut Injections::default());
        let want = expected_target(pq, h);
        match (want, got) {
            (Err(()), Err(_)) => {}
            (Ok(want), Ok(out)) => {
                let out = out.map(String::into_bytes).unwrap_or_else(|| pq.as_bytes().to_vec());
                assert_eq!(out, want, "request target rewrite differs from the reference");
            }
            (want, got) => panic!(
                "request-target tripwire mismatch for host {}: expected {want:?}, got {got:?}",
                HOSTS[h]
            ),
        }
    }
});
