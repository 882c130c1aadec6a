//! Checks of the test stand-ins themselves, without the sidecar: the upstream's routes, git bridge and
//! WebSocket echo answer correctly to direct clients. When a sidecar test fails and these pass, the fault is
//! in the path through the sidecar, not in the harness.

use crate::support;

use std::time::Duration;

use base64::Engine as _;
use futures_util::{SinkExt as _, StreamExt as _};
use support::*;
use tokio::io::AsyncWriteExt as _;

async fn upstream() -> Upstream {
    Upstream::start(UpstreamOptions {
        alpn: Alpn::Both,
        git_token: Some(GITHUB_REAL.into()),
    })
    .await
}

fn direct_curl(u: &Upstream) -> Curl {
    let mut c = Curl::bare(u.dir.path())
        .arg("--cacert")
        .arg(u.ca_pem_path.to_string_lossy().to_string());
    for h in UPSTREAM_HOSTS {
        c = c.arg("--connect-to").arg(format!("{h}:443:{}", u.tls_addr));
    }
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_routes_answer_directly() {
    let u = upstream().await;
    for proto in ["--http1.1", "--http2"] {
        let out = direct_curl(&u)
            .args([proto, "-H", "x-api-key: abc", "https://api.anthropic.com/echo"])
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200);
        let want = if proto == "--http2" { "2" } else { "1.1" };
        assert_eq!(out.http_version, want);
        let v = out.json();
        assert_eq!(v["path"], "/echo");
        let out = direct_curl(&u)
            .args([proto, "https://api.anthropic.com/big?bytes=70000"])
            .run()
            .await
            .ok();
        assert_eq!(out.body, pattern(70000));
        assert_eq!(out.header("content-length"), Some("70000"));
        let out = direct_curl(&u)
            .args([proto, "https://api.anthropic.com/204"])
            .run()
            .await
            .ok();
        assert_eq!(out.status, 204);
        let out = direct_curl(&u)
            .args([proto, "--data-binary", "hello", "https://api.anthropic.com/upload"])
            .run()
            .await
            .ok();
        assert_eq!(out.json()["len"], 5);
        assert_eq!(out.json()["sha256"], sha256_hex(b"hello").as_str());
        // Only over HTTP/1.1: over h2 the upstream resets the unread request stream after answering, and
        // curl 7.88 then drops the response.
        if proto == "--http1.1" {
            let out = direct_curl(&u)
                .args([proto, "--data-binary", "x", "https://api.anthropic.com/reject401"])
                .run()
                .await
                .ok();
            assert_eq!(out.status, 401, "{out:?}");
        }
    }
    let rec = u.requests_to("/echo");
    assert_eq!(rec.len(), 2);
    assert_eq!(rec[0].header("x-api-key"), Some("abc"));
    assert_eq!(rec[0].sni.as_deref(), Some("api.anthropic.com"));
    assert_eq!(rec[1].version, "HTTP/2.0");
    assert!(u.saw("abc"));
    assert!(!u.saw("never-sent-value"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_h2_only_refuses_http1_only_clients() {
    let u = Upstream::start(UpstreamOptions {
        alpn: Alpn::H2Only,
        git_token: None,
    })
    .await;
    let out = direct_curl(&u)
        .args(["--http1.1", "https://api.anthropic.com/echo"])
        .run()
        .await;
    assert_ne!(
        out.exit, 0,
        "an h2-only upstream must refuse an http/1.1-only ALPN offer"
    );
    let out = direct_curl(&u)
        .args(["--http2", "https://api.anthropic.com/echo"])
        .run()
        .await
        .ok();
    assert_eq!(out.http_version, "2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_sse_is_incremental_directly() {
    let u = upstream().await;
    let mut child = tokio::process::Command::new("curl")
        .args(["-sS", "-N", "--noproxy", "*", "--cacert"])
        .arg(&u.ca_pem_path)
        .arg("--connect-to")
        .arg(format!("api.anthropic.com:443:{}", u.tls_addr))
        .arg("https://api.anthropic.com/sse?events=3&interval_ms=300")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("curl");
    use tokio::io::AsyncBufReadExt as _;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    within(Duration::from_secs(20), "sse", async {
        while let Ok(Some(l)) = lines.next_line().await {
            if let Some(d) = l.strip_prefix("data: ") {
                let v: serde_json::Value = serde_json::from_str(d).expect("json");
                seen.push((v["n"].as_u64().expect("n"), v["t"].as_u64().expect("t"), now_ms()));
            }
        }
    })
    .await;
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(seen[0].2 < seen[2].1, "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_git_bridge_auth_and_clone_push() {
    let u = upstream().await;
    let out = direct_curl(&u)
        .arg("https://github.com/owner/repo.git/info/refs?service=git-upload-pack")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 401);
    assert_eq!(out.header("www-authenticate"), Some("Basic realm=\"git\""));
    let out = direct_curl(&u)
        .args(["-u", "x-access-token:wrong"])
        .arg("https://github.com/owner/repo.git/info/refs?service=git-upload-pack")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 403);

    let work = tempfile::tempdir().expect("tmp");
    let cainfo = format!("http.sslCAInfo={}", u.ca_pem_path.display());
    let url = format!("https://x-access-token:{GITHUB_REAL}@{}/owner/repo.git", u.tls_addr);
    run_git(&["-c", &cainfo, "clone", &url, "clone"], work.path(), &[])
        .await
        .ok("direct git clone");
    let repo = work.path().join("clone");
    assert!(repo.join("README.md").exists());
    std::fs::write(repo.join("new.txt"), "pushed directly\n").expect("write");
    run_git(&["add", "new.txt"], &repo, &[]).await.ok("add");
    run_git(&["commit", "-q", "-m", "direct push"], &repo, &[])
        .await
        .ok("commit");
    run_git(&["-c", &cainfo, "push", "origin", "main"], &repo, &[])
        .await
        .ok("direct git push");
    assert!(u.git_log().await.contains("direct push"));
    let want = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{GITHUB_REAL}"))
    );
    assert!(u
        .requests()
        .iter()
        .any(|r| r.header("authorization") == Some(want.as_str())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_websocket_echo_directly() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    use tokio_tungstenite::tungstenite::Message;
    let u = upstream().await;
    let tcp = tokio::net::TcpStream::connect(u.tls_addr).await.expect("tcp");
    let tls = tls_over(
        tokio::io::BufReader::new(tcp),
        "api.anthropic.com",
        &u.ca_pem_path,
        &["http/1.1"],
    )
    .await
    .expect("tls");
    let mut req = "wss://api.anthropic.com/ws".into_client_request().expect("req");
    req.headers_mut().insert("x-api-key", "direct".parse().expect("hv"));
    let (mut ws, resp) = within(
        Duration::from_secs(10),
        "ws handshake",
        Box::pin(tokio_tungstenite::client_async(req, tls)),
    )
    .await
    .expect("ws handshake");
    assert_eq!(resp.status(), 101);
    ws.send(Message::text("ping-1")).await.expect("send");
    let back = within(Duration::from_secs(10), "echo", ws.next())
        .await
        .expect("frame")
        .expect("ok");
    assert_eq!(back.into_text().expect("text").as_str(), "ping-1");
    assert_eq!(u.only_request_to("/ws").header("x-api-key"), Some("direct"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_plain_listener_and_raw_framing() {
    let u = upstream().await;
    let tcp = tokio::net::TcpStream::connect(u.plain_addr).await.expect("tcp");
    let mut conn = tokio::io::BufReader::new(tcp);
    conn.get_mut()
        .write_all(b"HEAD /head HTTP/1.1\r\nHost: api.anthropic.com\r\n\r\nGET /echo HTTP/1.1\r\nHost: api.anthropic.com\r\n\r\n")
        .await
        .expect("write");
    let r1 = read_response(&mut conn, true).await.expect("head resp");
    assert_eq!(r1.status, 200);
    let r2 = read_response(&mut conn, false).await.expect("get resp");
    assert_eq!(r2.status, 200);
    assert_eq!(u.requests()[0].scheme, "http");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_early_401_reaches_curl_http1_directly() {
    let u = upstream().await;
    let file = u.dir.path().join("2mib.bin");
    write_pattern_file(&file, 2 << 20);
    for round in 0..5 {
        let out = direct_curl(&u)
            .args(["--http1.1", "-H", "Expect: 100-continue", "--data-binary"])
            .arg(format!("@{}", file.display()))
            .arg("https://api.anthropic.com/reject401")
            .run()
            .await;
        assert_eq!((out.exit, out.status), (0, 401), "round {round}: {}", out.stderr);
    }
}
