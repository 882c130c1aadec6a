//! The side-by-side load comparison (SPEC §5): one run, one nginx TLS upstream (h2 and http/1.1),
//! three ways to reach it:
//!
//! - **D**: direct TLS, the client holding the real key;
//! - **P**: through the vault sidecar from this build, the client holding the stub;
//! - **M**: through mitmproxy (`mitmdump`) with an equivalent header-swap addon.
//!
//! Each measurement runs D, P and M back to back with the same client code (reqwest), so the ratios
//! P/D and P/M come from one run on one machine. Client, proxy and upstream share the machine's cores,
//! so the client is part of every cost. Then the sidecar alone: 1000 concurrent first CONNECTs to a
//! new host, and N idle intercepted tunnels (RSS per tunnel).
//!
//! Run it with `bash benches/compare.sh` (installs nginx and mitmproxy, builds, runs this).

mod measure;
mod servers;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use clap::Parser;
use lap_benches::pki::{self, UpstreamPki};
use lap_benches::tunnel;
use measure::{Proto, Route, Samples};
use servers::{REAL_KEY, STUB_KEY};

#[derive(Parser, Debug)]
#[command(about = "Direct TLS (D) vs the vault sidecar (P) vs mitmproxy (M), against one local nginx")]
struct Args {
    /// Sequential keep-alive requests per latency row for D and P (M gets a fifth: it is ~10x slower).
    #[arg(long, default_value_t = 10_000)]
    requests: usize,
    /// Seconds per requests/s row.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Concurrent clients in the requests/s rows.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Idle intercepted tunnels held open to measure memory per tunnel.
    #[arg(long, default_value_t = 10_000)]
    tunnels: usize,
    /// Concurrent first CONNECTs to one new host (the leaf must be minted once).
    #[arg(long, default_value_t = 1000)]
    first_connects: usize,
    /// The sidecar binary (default: `vault-sidecar` next to this program).
    #[arg(long)]
    sidecar: Option<PathBuf>,
    /// mitmproxy's `mitmdump` (default: target/bench-venv/bin/mitmdump, then PATH).
    #[arg(long)]
    mitmdump: Option<PathBuf>,
    /// Which routes to run (for profiling one of them); the report needs all three.
    #[arg(long, default_value = "DPM")]
    routes: String,
    /// Which protocols the latency and requests/s rows use (for profiling one of them): `h1`, `h2` or both.
    #[arg(long, value_delimiter = ',', default_value = "h1,h2")]
    protocols: Vec<String>,
    /// Skip the sidecar-only checks (first CONNECTs, idle tunnels).
    #[arg(long)]
    no_sidecar_checks: bool,
    /// Also write the Markdown report here.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

/// One row of the report: a value per route (missing where it doesn't apply).
struct Row {
    metric: String,
    values: [Option<f64>; 3],
    unit: &'static str,
}

async fn run(args: Args) -> Result<()> {
    let exe_dir = std::env::current_exe()?
        .parent()
        .context("own directory")?
        .to_path_buf();
    let sidecar_bin = args.sidecar.clone().unwrap_or_else(|| exe_dir.join("vault-sidecar"));
    ensure!(
        sidecar_bin.is_file(),
        "no sidecar binary at {} (cargo build --release -p lap-vault-sidecar)",
        sidecar_bin.display()
    );
    let mitmdump = || match &args.mitmdump {
        Some(p) => Ok(p.clone()),
        None => servers::find_program(&[exe_dir.join("../bench-venv/bin/mitmdump")], "mitmdump")
            .context("mitmdump not found: pass --mitmdump or run benches/compare.sh, which installs it"),
    };

    let dir = tempfile::tempdir()?;
    let pki = UpstreamPki::generate()?;
    std::fs::write(dir.path().join("upstream-ca.pem"), &pki.ca_pem)?;
    std::fs::write(dir.path().join("upstream-leaf.pem"), &pki.leaf_pem)?;
    std::fs::write(dir.path().join("upstream-leaf.key"), &pki.leaf_key_pem)?;

    let port = servers::free_port()?;
    let nginx = servers::nginx(dir.path(), port)?;
    let sidecar = servers::sidecar(&sidecar_bin, dir.path(), port)?;
    let mitm = if args.routes.contains('M') {
        Some(servers::mitmproxy(&mitmdump()?, dir.path())?)
    } else {
        None
    };
    let (mitm_addr, mitm_ca) = mitm
        .as_ref()
        .map_or((None, String::new()), |(_, a, ca)| (Some(*a), ca.clone()));
    eprintln!(
        "nginx on :{port}, sidecar on {} (pid {}, admin {}), mitmproxy on {mitm_addr:?}",
        sidecar.proxy,
        sidecar.server.pid(),
        sidecar.admin
    );

    let routes = [
        Route {
            name: "D",
            proxy: None,
            roots_pem: pki.ca_pem.clone(),
            key: REAL_KEY,
        },
        Route {
            name: "P",
            proxy: Some(sidecar.proxy),
            roots_pem: sidecar.ca_pem.clone(),
            key: STUB_KEY,
        },
        Route {
            name: "M",
            proxy: mitm_addr,
            roots_pem: mitm_ca,
            key: STUB_KEY,
        },
    ];
    let url = |path: &str| format!("https://localhost:{port}{path}");
    let pids = [None, Some(sidecar.server.pid()), mitm.as_ref().map(|(m, _, _)| m.pid())];
    // Whose CPU time a request costs on each route: the process terminating the client's TLS.
    let tls_server_pids = [Some(nginx.pid()), pids[1], pids[2]];
    let run_route = |r: &Route| args.routes.contains(r.name);

    let mut rows: Vec<Row> = Vec::new();
    let mut nagle: Vec<(Proto, f64, f64)> = Vec::new();
    let metrics_before = scrape(sidecar.admin).await?;

    for name in &args.protocols {
        ensure!(
            name == "h1" || name == "h2",
            "--protocols: `{name}` is neither h1 nor h2"
        );
    }
    let protos = [Proto::H1, Proto::H2]
        .into_iter()
        .filter(|p| args.protocols.iter().any(|n| (n == "h1") == (*p == Proto::H1)));
    for proto in protos {
        let tag = if proto == Proto::H1 { "http/1.1" } else { "h2" };
        let mut lat: [Option<Samples>; 3] = [None, None, None];
        let mut rps = [None; 3];
        let mut cpu_seq = [None; 3];
        let mut cpu_conc = [None; 3];
        for (i, route) in routes.iter().enumerate().filter(|(_, r)| run_route(r)) {
            let client = route.client(proto, port)?;
            let version = measure::negotiated(&client, &url("/v1/small"), route.key).await?;
            let want = if proto == Proto::H1 {
                reqwest::Version::HTTP_11
            } else {
                reqwest::Version::HTTP_2
            };
            ensure!(version == want, "{} {tag}: negotiated {version:?}", route.name);
            let n = if route.name == "M" {
                args.requests / 5
            } else {
                args.requests
            };
            let pid = tls_server_pids[i].context("route without a process")?;
            let cpu0 = servers::cpu_ns(pid)?;
            let s = measure::latency(&client, &url("/v1/small"), route.key, n / 10, n).await?;
            cpu_seq[i] = Some((servers::cpu_ns(pid)? - cpu0) as f64 / 1000.0 / (n + n / 10) as f64);
            eprintln!(
                "{} {tag} latency: p50 {:.0} µs, p99 {:.0} µs over {}",
                route.name,
                s.pct_us(0.5),
                s.pct_us(0.99),
                s.len()
            );
            if route.name == "P" {
                nagle.push((proto, s.pct_us(0.5), s.pct_us(0.999)));
            }
            lat[i] = Some(s);
            // A fresh client per throughput row, warmed for a second before the measured window.
            let client = route.client(proto, port)?;
            measure::throughput(
                &client,
                &url("/v1/small"),
                route.key,
                args.concurrency,
                Duration::from_secs(1),
            )
            .await?;
            let cpu0 = servers::cpu_ns(pid)?;
            let (done, elapsed) = measure::throughput(
                &client,
                &url("/v1/small"),
                route.key,
                args.concurrency,
                Duration::from_secs_f64(args.seconds),
            )
            .await?;
            cpu_conc[i] = Some((servers::cpu_ns(pid)? - cpu0) as f64 / 1000.0 / done as f64);
            let r = done as f64 / elapsed.as_secs_f64();
            eprintln!(
                "{} {tag} requests/s ({} clients): {r:.0}; CPU per request {:.1} µs sequential, {:.1} µs concurrent",
                route.name,
                args.concurrency,
                cpu_seq[i].unwrap_or_default(),
                cpu_conc[i].unwrap_or_default()
            );
            rps[i] = Some(r);
        }
        let pick = |q: f64| lat.each_ref().map(|s| s.as_ref().map(|s| s.pct_us(q)));
        rows.push(row(format!("keep-alive latency p50, {tag}"), pick(0.5), "µs"));
        rows.push(row(format!("keep-alive latency p99, {tag}"), pick(0.99), "µs"));
        rows.push(row(format!("keep-alive latency p99.9, {tag}"), pick(0.999), "µs"));
        rows.push(row(
            format!("requests/s, {} clients, {tag}", args.concurrency),
            rps,
            "req/s",
        ));
        rows.push(row(
            format!("CPU per request in the TLS server (nginx / proxy), sequential, {tag}"),
            cpu_seq,
            "µs",
        ));
        rows.push(row(
            format!(
                "CPU per request in the TLS server (nginx / proxy), {} clients, {tag}",
                args.concurrency
            ),
            cpu_conc,
            "µs",
        ));
    }
    let metrics_after = scrape(sidecar.admin).await?;
    let connects = delta(&metrics_before, &metrics_after, "upstream_connects_total");
    let requests = delta(&metrics_before, &metrics_after, "requests_total");
    let reuse = if requests > 0.0 { 1.0 - connects / requests } else { 0.0 };
    eprintln!("P upstream connections: {connects} new for {requests} requests");

    let mut ttfe = [None; 3];
    let mut down = [None; 3];
    let mut up = [None; 3];
    let mut peak = [None; 3];
    for (i, route) in routes.iter().enumerate().filter(|(_, r)| run_route(r)) {
        let client = route.client(Proto::H1, port)?;
        let s = measure::first_event(&client, &url("/v1/sse"), route.key, 200).await?;
        ttfe[i] = Some(s.pct_us(0.5));
        eprintln!("{} first SSE event p50: {:.0} µs", route.name, s.pct_us(0.5));
        down[i] = Some(measure::download(&client, &url("/v1/download"), route.key).await?);
        up[i] = Some(measure::upload(&client, &url("/v1/upload"), route.key).await?);
        eprintln!(
            "{} 1 GiB download {:.0} MiB/s, upload {:.0} MiB/s",
            route.name,
            down[i].unwrap_or_default(),
            up[i].unwrap_or_default()
        );
        if let Some(pid) = pids[i] {
            peak[i] = Some(servers::rss_kib(pid)?.0 as f64 / 1024.0);
        }
    }
    rows.push(row("time to first SSE event p50, http/1.1".into(), ttfe, "µs"));
    rows.push(row("1 GiB download, http/1.1".into(), down, "MiB/s"));
    rows.push(row("1 GiB upload, http/1.1".into(), up, "MiB/s"));
    rows.push(row("proxy peak RSS after all of the above".into(), peak, "MiB"));

    if args.no_sidecar_checks {
        for r in &rows {
            println!("{}: {:?} {}", r.metric, r.values, r.unit);
        }
        return Ok(());
    }
    // The sidecar alone.
    let sidecar_tls = Arc::new(pki::client_config(&sidecar.ca_pem, &[b"http/1.1"]).map_err(anyhow::Error::msg)?);
    let before = scrape(sidecar.admin).await?;
    let first = first_connects(sidecar.proxy, port, sidecar_tls.clone(), args.first_connects).await?;
    let after = scrape(sidecar.admin).await?;
    let mints = delta(&before, &after, "cert_mints_total");
    eprintln!("{first} concurrent first CONNECTs to a new host: {mints} leaf minted");

    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, rss0) = servers::rss_kib(sidecar.server.pid())?;
    let held = idle_tunnels(sidecar.proxy, port, sidecar_tls, args.tunnels).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, rss1) = servers::rss_kib(sidecar.server.pid())?;
    let per_tunnel = rss1.saturating_sub(rss0) as f64 / held.len() as f64;
    eprintln!(
        "{} idle intercepted tunnels: RSS {rss0} KiB → {rss1} KiB, {per_tunnel:.1} KiB each",
        held.len()
    );
    drop(held);

    let report = render(
        &args,
        &rows,
        Extras {
            reuse,
            connects,
            requests,
            mints,
            first_connects: first,
            per_tunnel,
            tunnels: args.tunnels,
            nagle: &nagle,
            rss0,
            rss1,
        },
    )?;
    println!("{report}");
    if let Some(out) = &args.out {
        std::fs::write(out, &report).with_context(|| format!("write {}", out.display()))?;
    }
    Ok(())
}

fn row(metric: String, values: [Option<f64>; 3], unit: &'static str) -> Row {
    Row { metric, values, unit }
}

/// `first_connects` tunnels opened at once to `127.0.0.1` (a host no earlier request used), each
/// with one request; returns how many succeeded (all must).
async fn first_connects(proxy: SocketAddr, port: u16, tls: Arc<rustls::ClientConfig>, n: usize) -> Result<usize> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (tls, barrier) = (tls.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut sender = tunnel::open(proxy, "127.0.0.1", port, tls)
                .await
                .map_err(anyhow::Error::msg)?;
            small_request(&mut sender, "127.0.0.1", port).await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        t.await.context("first-CONNECT task")??;
        ok += 1;
    }
    Ok(ok)
}

/// Open `n` intercepted tunnels to the upstream, one request each, and hold them idle.
async fn idle_tunnels(
    proxy: SocketAddr,
    port: u16,
    tls: Arc<rustls::ClientConfig>,
    n: usize,
) -> Result<Vec<tunnel::Sender>> {
    let mut held = Vec::with_capacity(n);
    let started = Instant::now();
    for batch in (0..n).collect::<Vec<_>>().chunks(100) {
        let mut tasks = Vec::with_capacity(batch.len());
        for _ in batch {
            let tls = tls.clone();
            tasks.push(tokio::spawn(async move {
                let mut sender = tunnel::open(proxy, "localhost", port, tls)
                    .await
                    .map_err(anyhow::Error::msg)?;
                small_request(&mut sender, "localhost", port).await?;
                anyhow::Ok(sender)
            }));
        }
        for t in tasks {
            held.push(t.await.context("tunnel task")??);
        }
    }
    eprintln!("opened {n} tunnels in {:.1} s", started.elapsed().as_secs_f64());
    Ok(held)
}

async fn small_request(sender: &mut tunnel::Sender, host: &str, port: u16) -> Result<()> {
    use http_body_util::BodyExt as _;
    let req = hyper::Request::get("/v1/small")
        .header("host", format!("{host}:{port}"))
        .header("x-api-key", STUB_KEY)
        .body(http_body_util::Full::new(bytes::Bytes::new()))?;
    let resp = sender.send_request(req).await?;
    ensure!(resp.status() == 200, "GET /v1/small in a tunnel: {}", resp.status());
    resp.into_body().collect().await?;
    Ok(())
}

/// The sidecar's counters, summed over labels, by metric name.
async fn scrape(admin: SocketAddr) -> Result<HashMap<String, f64>> {
    let text = reqwest::Client::builder()
        .no_proxy()
        .build()?
        .get(format!("http://{admin}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name_labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = name_labels.split('{').next().unwrap_or(name_labels);
        if let Ok(v) = value.parse::<f64>() {
            *out.entry(name.to_owned()).or_insert(0.0) += v;
        }
    }
    Ok(out)
}

/// Change of the counter whose name ends with `suffix`.
fn delta(before: &HashMap<String, f64>, after: &HashMap<String, f64>, suffix: &str) -> f64 {
    let get = |m: &HashMap<String, f64>| {
        m.iter()
            .filter(|(k, _)| k.ends_with(suffix))
            .map(|(_, v)| *v)
            .sum::<f64>()
    };
    get(after) - get(before)
}

struct Extras<'a> {
    reuse: f64,
    connects: f64,
    requests: f64,
    mints: f64,
    first_connects: usize,
    per_tunnel: f64,
    tunnels: usize,
    nagle: &'a [(Proto, f64, f64)],
    rss0: u64,
    rss1: u64,
}

fn fmt_value(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) => format!("{v:.1}"),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "–".into(),
    }
}

fn find<'a>(rows: &'a [Row], metric: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.metric == metric)
}

fn render(args: &Args, rows: &[Row], x: Extras<'_>) -> Result<String> {
    let mut s = String::new();
    writeln!(s, "Machine: {}", machine())?;
    writeln!(
        s,
        "Run: `bash benches/compare.sh` ({} sequential requests per latency row for D and P, {} for M; {} s per requests/s row with {} clients; nginx 1 worker; client tokio runtime 2 threads)",
        args.requests,
        args.requests / 5,
        args.seconds,
        args.concurrency
    )?;
    writeln!(s)?;
    writeln!(
        s,
        "| metric | D (direct) | P (sidecar) | M (mitmproxy) | unit | P/D | P/M |"
    )?;
    writeln!(s, "|---|---:|---:|---:|---|---:|---:|")?;
    for r in rows {
        let [d, p, m] = r.values;
        writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.metric,
            fmt_value(d),
            fmt_value(p),
            fmt_value(m),
            r.unit,
            ratio(p, d),
            ratio(p, m)
        )?;
    }
    writeln!(s)?;
    writeln!(s, "| target (issue 7) | measured | met |")?;
    writeln!(s, "|---|---:|:---:|")?;
    let mut target = |name: String, measured: String, ok: bool| {
        writeln!(s, "| {name} | {measured} | {} |", if ok { "yes" } else { "**no**" })
    };
    for tag in ["http/1.1", "h2"] {
        for (q, limit) in [("p50", 1.6), ("p99", 2.0)] {
            if let Some(r) = find(rows, &format!("keep-alive latency {q}, {tag}")) {
                let v = ratio(r.values[1], r.values[0]);
                let ok = v.parse::<f64>().is_ok_and(|v| v <= limit);
                target(format!("keep-alive {q} P/D ≤ {limit}, {tag}"), v, ok)?;
            }
        }
        if let Some(r) = find(rows, &format!("requests/s, {} clients, {tag}", args.concurrency)) {
            let pd = ratio(r.values[1], r.values[0]);
            let pm = ratio(r.values[1], r.values[2]);
            target(
                format!("requests/s P/D ≥ 0.5, {tag}"),
                pd.clone(),
                pd.parse::<f64>().is_ok_and(|v| v >= 0.5),
            )?;
            target(
                format!("requests/s P/M ≥ 11, {tag}"),
                pm.clone(),
                pm.parse::<f64>().is_ok_and(|v| v >= 11.0),
            )?;
        }
    }
    if let Some(r) = find(rows, "1 GiB download, http/1.1") {
        let v = ratio(r.values[1], r.values[0]);
        target(
            "1 GiB download P/D ≥ 0.6".into(),
            v.clone(),
            v.parse::<f64>().is_ok_and(|v| v >= 0.6),
        )?;
    }
    if let Some(r) = find(rows, "time to first SSE event p50, http/1.1") {
        if let (Some(d), Some(p)) = (r.values[0], r.values[1]) {
            target(
                "time to first SSE event P − D ≤ 1 ms".into(),
                format!("{:.0} µs", p - d),
                p - d <= 1000.0,
            )?;
        }
    }
    target(
        format!(
            "{} concurrent first CONNECTs to one host mint one leaf",
            x.first_connects
        ),
        format!("{} minted", x.mints),
        x.mints == 1.0,
    )?;
    target(
        format!("idle intercepted tunnel ≤ 40 KiB ({} tunnels)", x.tunnels),
        format!("{:.1} KiB (RSS {} → {} KiB)", x.per_tunnel, x.rss0, x.rss1),
        x.per_tunnel <= 40.0,
    )?;
    if let Some(r) = find(rows, "proxy peak RSS after all of the above") {
        if let Some(p) = r.values[1] {
            target(
                "sidecar peak RSS ≤ 64 MiB moving 1 GiB each way".into(),
                format!("{p:.1} MiB"),
                p <= 64.0,
            )?;
        }
    }
    target(
        "upstream connection reuse ≥ 99 %".into(),
        format!(
            "{:.2} % ({} new connections, {} requests)",
            x.reuse * 100.0,
            x.connects,
            x.requests
        ),
        x.reuse >= 0.99,
    )?;
    for (proto, p50, p999) in x.nagle {
        let tag = if *proto == Proto::H1 { "http/1.1" } else { "h2" };
        target(
            format!("no Nagle stalls: P p99.9 ≤ 5 × p50, {tag}"),
            format!("{:.1} × ({p999:.0} / {p50:.0} µs)", p999 / p50),
            *p999 <= 5.0 * *p50,
        )?;
    }
    Ok(s)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpu}, {cores} cores, Linux {}", kernel.trim())
}
