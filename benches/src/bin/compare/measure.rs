//! The measurements, each run the same way against D, P and M. Every request must answer 200
//! (the upstream answers 401 without the real key), so a broken swap fails the run instead of
//! producing fast numbers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use bytes::Bytes;

use crate::servers::GIB;

/// One way to reach the upstream: direct, or through a proxy whose CA the client trusts.
#[derive(Clone)]
pub(crate) struct Route {
    pub(crate) name: &'static str,
    pub(crate) proxy: Option<std::net::SocketAddr>,
    /// The roots the client trusts (upstream CA for D, the proxy's CA otherwise).
    pub(crate) roots_pem: String,
    /// What the client sends as `x-api-key`: the real key for D, the stub otherwise.
    pub(crate) key: &'static str,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Proto {
    H1,
    H2,
}

impl Route {
    pub(crate) fn client(&self, proto: Proto, upstream_port: u16) -> Result<reqwest::Client> {
        let mut b = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(self.roots_pem.as_bytes())?)
            .tcp_nodelay(true)
            .pool_max_idle_per_host(usize::MAX)
            .pool_idle_timeout(Duration::from_secs(600))
            .timeout(Duration::from_secs(300));
        b = match self.proxy {
            Some(p) => b.proxy(reqwest::Proxy::all(format!("http://{p}"))?),
            None => b
                .no_proxy()
                .resolve("localhost", std::net::SocketAddr::from(([127, 0, 0, 1], upstream_port))),
        };
        if proto == Proto::H1 {
            b = b.http1_only();
        }
        Ok(b.build()?)
    }
}

async fn get_ok(client: &reqwest::Client, url: &str, key: &str) -> Result<reqwest::Response> {
    let resp = client.get(url).header("x-api-key", key).send().await?;
    ensure!(resp.status() == 200, "GET {url}: {} (swap failed?)", resp.status());
    Ok(resp)
}

/// Check the negotiated protocol once, so an "h2" row is really h2 end to end from the client.
pub(crate) async fn negotiated(client: &reqwest::Client, url: &str, key: &str) -> Result<reqwest::Version> {
    let resp = get_ok(client, url, key).await?;
    let v = resp.version();
    resp.bytes().await?;
    Ok(v)
}

/// Sequential requests on one warm keep-alive connection; latency of each (send → last body byte).
pub(crate) async fn latency(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    warmup: usize,
    n: usize,
) -> Result<Samples> {
    for _ in 0..warmup {
        get_ok(client, url, key).await?.bytes().await?;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        get_ok(client, url, key).await?.bytes().await?;
        out.push(t0.elapsed());
    }
    Ok(Samples::new(out))
}

/// `concurrency` tasks sharing one client, each looping requests for `dur`; requests completed, and
/// the time they took.
pub(crate) async fn throughput(
    client: &reqwest::Client,
    url: &str,
    key: &'static str,
    concurrency: usize,
    dur: Duration,
) -> Result<(u64, Duration)> {
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + dur;
    let mut tasks = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (client, url, done) = (client.clone(), url.to_owned(), done.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                get_ok(&client, &url, key).await?.bytes().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await.context("load task")??;
    }
    Ok((done.load(Ordering::Relaxed), start.elapsed()))
}

/// One streamed GET of the 1 GiB blob; MiB/s.
pub(crate) async fn download(client: &reqwest::Client, url: &str, key: &str) -> Result<f64> {
    let t0 = Instant::now();
    let mut resp = get_ok(client, url, key).await?;
    let mut n = 0u64;
    while let Some(chunk) = resp.chunk().await? {
        n += chunk.len() as u64;
    }
    ensure!(n == GIB, "download: {n} bytes, expected {GIB}");
    Ok(mib_per_s(n, t0.elapsed()))
}

/// One streamed POST of 1 GiB in 1 MiB chunks; MiB/s.
pub(crate) async fn upload(client: &reqwest::Client, url: &str, key: &str) -> Result<f64> {
    let chunk = Bytes::from(vec![b'x'; 1 << 20]);
    let chunks = (0..(GIB >> 20)).map(move |_| Ok::<_, std::io::Error>(chunk.clone()));
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let t0 = Instant::now();
    let resp = client
        .post(url)
        .header("x-api-key", key)
        .header("content-length", GIB)
        .body(body)
        .send()
        .await?;
    ensure!(resp.status() == 200, "upload: {}", resp.status());
    resp.bytes().await?;
    Ok(mib_per_s(GIB, t0.elapsed()))
}

/// Time from sending an SSE request to holding its first complete event (`\n\n`), on a warm
/// connection; the stream is read to its end each time so the connection stays reusable.
pub(crate) async fn first_event(client: &reqwest::Client, url: &str, key: &str, n: usize) -> Result<Samples> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n + 5 {
        let t0 = Instant::now();
        let mut resp = get_ok(client, url, key).await?;
        let mut buf = Vec::new();
        let mut first = None;
        while let Some(chunk) = resp.chunk().await? {
            buf.extend_from_slice(&chunk);
            if first.is_none() && buf.windows(2).any(|w| w == b"\n\n") {
                first = Some(t0.elapsed());
            }
        }
        let Some(first) = first else {
            bail!("SSE stream ended without an event")
        };
        if i >= 5 {
            out.push(first);
        }
    }
    Ok(Samples::new(out))
}

fn mib_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

/// Sorted durations.
pub(crate) struct Samples(Vec<Duration>);

impl Samples {
    pub(crate) fn new(mut v: Vec<Duration>) -> Self {
        v.sort_unstable();
        Self(v)
    }

    /// Nearest-rank percentile, in microseconds.
    pub(crate) fn pct_us(&self, q: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let rank = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        self.0[rank - 1].as_secs_f64() * 1e6
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}
