//! What the local sandbox costs (issue 12), in one run, each figure with isolation
//! (`LAP_LOCAL_ISOLATION=bubblewrap`) and without (`none`):
//!
//! - **create → ready**: `POST /agents/{id}/session` until the session reads `ready`, for
//!   `--sessions` sessions one after another (p50, p90, max);
//! - **keep-alive latency through the vault**: inside the session, one `curl` sends
//!   `--requests` sequential requests over one kept-alive connection through the vault
//!   (`CONNECT` tunnel, stub swapped) to an in-process TLS upstream that answers only the real
//!   key; per-request `time_total` (p50, p99), the first request left out.
//!
//! The agent is a stand-in `claude` that runs its prompt as a shell command, so the client runs
//! where an agent runs: in the sandbox, or (without isolation) on the host.
//!
//! Run it with `bash benches/sandbox.sh` (builds release, runs this).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use clap::Parser;
use lap_benches::lapserver::{bin_dir, free_port, obedient_claude, percentile, LapServer};
use lap_benches::pki::UpstreamPki;
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "Create → ready and keep-alive latency through the vault, bubblewrap vs no isolation")]
struct Args {
    /// Sessions created one after another per mode.
    #[arg(long, default_value_t = 20)]
    sessions: usize,
    /// Sequential keep-alive requests per mode.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    /// Directory holding `lap-server`, `vault-sidecar` and `lap-harness` (default: next to this program).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

const REAL: &str = "bench-REAL-key-0123456789abcdef";

async fn start(bins: &Path, dir: &Path, isolation: &str, base: &Path, path: &str, ro: &Path) -> Result<LapServer> {
    let env: [(&str, OsString); 4] = [
        ("LAP_SIDECAR_BASE_CONFIG", base.into()),
        ("LAP_LOCAL_ISOLATION", isolation.into()),
        ("LAP_LOCAL_RO_PATHS", ro.into()),
        ("PATH", path.into()),
    ];
    LapServer::start(bins, &dir.join(format!("data-{isolation}")), free_port()?, &env).await
}

struct ModeResult {
    ready_ms: Vec<f64>,
    request_us: Vec<f64>,
}

async fn run_mode(
    args: &Args,
    bins: &Path,
    dir: &Path,
    isolation: &str,
    base: &Path,
    path: &str,
    ro: &Path,
) -> Result<ModeResult> {
    let server = start(bins, dir, isolation, base, path, ro).await?;
    let agent = server
        .call(
            reqwest::Method::POST,
            "/agents",
            Some(json!({"name": "bench", "harness_id": "claude-code"})),
        )
        .await?;
    let aid = agent["id"].as_str().context("agent id")?.to_owned();
    let body = json!({"env_vars": {"BENCH_KEY": REAL}, "env_var_hosts": {"BENCH_KEY": ["localhost"]}});
    let mut ready_ms = Vec::new();
    let mut last = String::new();
    for _ in 0..args.sessions {
        let t = Instant::now();
        let s = server
            .call(
                reqwest::Method::POST,
                &format!("/agents/{aid}/session"),
                Some(body.clone()),
            )
            .await?;
        let sid = s["id"].as_str().context("session id")?.to_owned();
        loop {
            let v = server
                .call(reqwest::Method::GET, &format!("/sessions/{sid}"), None)
                .await?;
            match v["status"].as_str() {
                Some("ready") => break,
                Some("creating") => tokio::time::sleep(Duration::from_millis(2)).await,
                _ => bail!("{isolation}: session did not become ready: {v}"),
            }
        }
        ready_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        if !last.is_empty() {
            server
                .call(reqwest::Method::DELETE, &format!("/sessions/{last}"), None)
                .await?;
        }
        last = sid;
    }
    // Keep-alive requests through the vault, from where the agent runs.
    let urls = vec!["-o /dev/null https://localhost/v1/messages"; args.requests].join(" ");
    let command = format!(
        "curl -sS -x \"$HTTPS_PROXY\" --noproxy '' -H \"x-api-key: $BENCH_KEY\" \
         -w '%{{http_code}} %{{time_total}}\\n' {urls}"
    );
    let reply = server
        .call(
            reqwest::Method::POST,
            &format!("/sessions/{last}/message"),
            Some(json!({ "text": command })),
        )
        .await?;
    let text = reply["parts"][0]["text"].as_str().context("reply text")?;
    let mut request_us = Vec::new();
    for line in text.lines() {
        let (code, secs) = line.split_once(' ').context("a curl -w line")?;
        ensure!(
            code == "200",
            "{isolation}: the upstream answered {code} (the key was not swapped?): {line}"
        );
        request_us.push(secs.trim().parse::<f64>()? * 1e6);
    }
    ensure!(
        request_us.len() == args.requests,
        "{isolation}: {} of {} requests: {text}",
        request_us.len(),
        args.requests
    );
    request_us.remove(0);
    // Sessions outlive their server by design: stop the last one.
    server
        .call(reqwest::Method::DELETE, &format!("/sessions/{last}"), None)
        .await?;
    Ok(ModeResult { ready_ms, request_us })
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let bins = bin_dir(args.bin_dir.as_deref())?;
    let dir = tempfile::tempdir()?;
    let pki = UpstreamPki::generate()?;
    let upstream = lap_benches::upstream::serve(pki.server_config(&[b"h2", b"http/1.1"])?, REAL).await?;
    std::fs::write(dir.path().join("upstream-ca.pem"), &pki.ca_pem)?;
    let base = dir.path().join("base.toml");
    std::fs::write(
        &base,
        format!(
            "upstream_ca_files = [{:?}]\n[resolve]\n\"localhost:443\" = \"{upstream}\"\n",
            dir.path().join("upstream-ca.pem").display().to_string()
        ),
    )?;
    let bin = obedient_claude(dir.path())?;
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());

    let mut results = Vec::new();
    for isolation in ["bubblewrap", "none"] {
        eprintln!("{isolation}: {} sessions, {} requests…", args.sessions, args.requests);
        let mut r = run_mode(&args, &bins, dir.path(), isolation, &base, &path, &bin).await?;
        r.ready_ms.sort_by(f64::total_cmp);
        r.request_us.sort_by(f64::total_cmp);
        results.push((isolation, r));
    }
    let (b, n) = (&results[0].1, &results[1].1);
    println!("| measure | bubblewrap | none | bubblewrap − none | bubblewrap / none |");
    println!("|---|---|---|---|---|");
    for (name, p) in [
        ("create → ready p50 (ms)", 0.5),
        ("create → ready p90 (ms)", 0.9),
        ("create → ready max (ms)", 1.0),
    ] {
        let (x, y) = (percentile(&b.ready_ms, p), percentile(&n.ready_ms, p));
        println!("| {name} | {x:.1} | {y:.1} | {:+.1} | {:.2} |", x - y, x / y);
    }
    for (name, p) in [
        ("keep-alive request p50 (µs)", 0.5),
        ("keep-alive request p99 (µs)", 0.99),
    ] {
        let (x, y) = (percentile(&b.request_us, p), percentile(&n.request_us, p));
        println!("| {name} | {x:.0} | {y:.0} | {:+.0} | {:.3} |", x - y, x / y);
    }
    println!(
        "\n{} sessions and {} requests per mode; command: bash benches/sandbox.sh --sessions {} --requests {}",
        args.sessions, args.requests, args.sessions, args.requests
    );
    Ok(())
}
