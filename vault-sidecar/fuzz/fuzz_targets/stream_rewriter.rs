//! `rewrite::StreamRewriter` (request body swap and response redaction): any chunking of any body gives
//! the output of a one-shot replacement, and only a live partial match is ever held back.
#![no_main]

mod common;

use bytes::Bytes;
use lap_vault_sidecar::TargetHost;
use lap_vault_sidecar::{redactor, HostRules, StreamRewriter};
use libfuzzer_sys::fuzz_target;

use common::{expand, replace_reference, set, HOSTS, ROUTE, SECRETS};

fn run(mut rw: StreamRewriter, body: &[u8], cuts: &[usize], max_pat: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut start = 0;
    for &c in cuts.iter().chain(std::iter::once(&body.len())) {
        let end = c.clamp(start, body.len());
        out.extend_from_slice(&rw.push(Bytes::copy_from_slice(&body[start..end])));
        assert!(
            rw.pending() < max_pat.max(1),
            "held back {} bytes, more than a partial match",
            rw.pending()
        );
        start = end;
    }
    out.extend_from_slice(&rw.finish());
    assert_eq!(rw.pending(), 0);
    out
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let ncuts = (data[0] % 16) as usize;
    let (cut_bytes, body) = data[1..].split_at(ncuts.min(data.len() - 1));
    let body = expand(body);
    let mut cuts: Vec<usize> = Vec::new();
    let mut pos = 0usize;
    for &c in cut_bytes {
        pos += c as usize;
        cuts.push(pos);
    }

    // Response redaction: real values → stubs.
    let vals: Vec<&[u8]> = SECRETS.iter().map(|s| s.2.as_bytes()).collect();
    let stubs: Vec<Option<&[u8]>> = SECRETS.iter().map(|s| Some(s.1.as_bytes())).collect();
    let max_val = vals.iter().map(|v| v.len()).max().unwrap_or(0);
    let want = replace_reference(&body, &vals, &stubs);
    let one_shot = run(redactor(set()).expect("redactor"), &body, &[], max_val);
    let chunked = run(redactor(set()).expect("redactor"), &body, &cuts, max_val);
    assert_eq!(one_shot, want, "one-shot redaction differs from the reference");
    assert_eq!(chunked, want, "chunked redaction differs from one-shot (cuts {cuts:?})");

    // Request body swap toward api.anthropic.com: only BODY_TOKEN's stub is replaced.
    let rules = HostRules::new(set(), &TargetHost::parse(HOSTS[0]), 443);
    let stub_pats: Vec<&[u8]> = SECRETS.iter().map(|s| s.1.as_bytes()).collect();
    let reps: Vec<Option<&[u8]>> = SECRETS
        .iter()
        .map(|s| (s.3 == "body").then_some(s.2.as_bytes()))
        .collect();
    let max_stub = stub_pats.iter().map(|v| v.len()).max().unwrap_or(0);
    let want = replace_reference(&body, &stub_pats, &reps);
    let rewriter = rules.body_rewriter(ROUTE.0, ROUTE.1, None).expect("body rewriter");
    let got = run(rewriter, &body, &cuts, max_stub);
    assert_eq!(
        got, want,
        "chunked body swap differs from the reference (cuts {cuts:?})"
    );
});
