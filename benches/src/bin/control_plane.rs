//! The control plane under load and after a crash (issue 15), in one run:
//!
//! - **create → ready, `--sessions` at once**: that many `POST /agents/{id}/session` fired
//!   together at one `lap-server` (local backend, bubblewrap), each timed until its session reads
//!   `ready` (p50, p99, max). Every session must become ready; one that fails fails the bench.
//! - **restart → first reconcile after kill -9**: with `--ready` sessions running and a 100 ms
//!   reconcile interval, `lap-server` is killed (SIGKILL) and
//!   started again at once on the same data; timed from the restart until `/metrics` counts its
//!   first finished pass (`lap_reconcile_passes_total`), `--restarts` times each: killed between
//!   passes, and killed mid-pass (one harness SIGSTOPped makes each pass wait out its 2 s probe;
//!   resumed right after the kill), where the dead replica's reconciler lease (3 s, renewed
//!   every 1 s) has to run out first.
//!
//! Run it with `bash benches/control-plane.sh` (builds release, runs this).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use clap::Parser;
use lap_benches::lapserver::{bin_dir, free_port, obedient_claude, percentile, LapServer};
use reqwest::Method;
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "Concurrent create → ready, and restart → first reconcile after kill -9")]
struct Args {
    /// Sessions created at once.
    #[arg(long, default_value_t = 60)]
    sessions: usize,
    /// Ready sessions while lap-server is killed and restarted.
    #[arg(long, default_value_t = 3)]
    ready: usize,
    /// kill -9 / restart rounds.
    #[arg(long, default_value_t = 5)]
    restarts: usize,
    /// Directory holding `lap-server`, `vault-sidecar` and `lap-harness` (default: next to this program).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

async fn agent(server: &LapServer) -> Result<String> {
    let a = server
        .call(
            Method::POST,
            "/agents",
            Some(json!({"name": "bench", "harness_id": "claude-code"})),
        )
        .await?;
    Ok(a["id"].as_str().context("agent id")?.to_owned())
}

/// The `lap-harness` of a local session: the child of its sandbox's init (`pids.json`'s second
/// entry).
fn harness_pid(data: &std::path::Path, sid: &str) -> Result<i32> {
    let procs: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(data.join("sandboxes").join(sid).join("pids.json"))?)?;
    let init = procs
        .get(1)
        .and_then(|p| p["pid"].as_i64())
        .context("the sandbox's init in pids.json")?;
    for e in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<i64>().ok());
        if ppid == Some(init) {
            return Ok(pid);
        }
    }
    anyhow::bail!("no process under the sandbox's init {init}")
}

fn signal(pid: i32, sig: &str) -> Result<()> {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()?
        .success();
    ensure!(ok, "kill -{sig} {pid}");
    Ok(())
}

/// Create one session and wait for it: (id, milliseconds to `ready`).
async fn create_until_ready(server: &LapServer, aid: &str) -> Result<(String, f64)> {
    let t = Instant::now();
    let s = server
        .call(Method::POST, &format!("/agents/{aid}/session"), Some(json!({})))
        .await?;
    let sid = s["id"].as_str().context("session id")?.to_owned();
    let v = server.settle(&sid, Duration::from_millis(5)).await?;
    ensure!(v["status"] == "ready", "a session did not become ready: {v}");
    Ok((sid, t.elapsed().as_secs_f64() * 1000.0))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let bins = bin_dir(args.bin_dir.as_deref())?;
    let dir = tempfile::tempdir()?;
    let bin = obedient_claude(dir.path())?;
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let env = |interval: &str| -> Vec<(&'static str, OsString)> {
        vec![
            ("PATH", path.clone().into()),
            ("LAP_LOCAL_RO_PATHS", bin.clone().into()),
            ("LAP_RECONCILE_INTERVAL", interval.into()),
            ("LAP_CREATE_TIMEOUT", "600s".into()),
        ]
    };

    // 1. Concurrent creates.
    eprintln!("{} concurrent creates…", args.sessions);
    let data = dir.path().join("data-creates");
    let server = LapServer::start(&bins, &data, free_port()?, &env("1s")).await?;
    let aid = agent(&server).await?;
    let results = futures_util::future::join_all((0..args.sessions).map(|_| create_until_ready(&server, &aid))).await;
    let mut ready_ms = Vec::new();
    let mut ids = Vec::new();
    for r in results {
        let (sid, ms) = r?;
        ids.push(sid);
        ready_ms.push(ms);
    }
    ready_ms.sort_by(f64::total_cmp);
    for r in futures_util::future::join_all(ids.iter().map(|sid| {
        let server = &server;
        async move { server.call(Method::DELETE, &format!("/sessions/{sid}"), None).await }
    }))
    .await
    {
        r?;
    }
    drop(server);

    // 2. kill -9, restart at once, until the first finished pass.
    eprintln!(
        "{} kill -9 / restart rounds with {} ready sessions…",
        args.restarts, args.ready
    );
    let data = dir.path().join("data-restarts");
    let port = free_port()?;
    let mut server = LapServer::start(&bins, &data, port, &env("100ms")).await?;
    let aid = agent(&server).await?;
    let mut ids = Vec::new();
    for _ in 0..args.ready {
        ids.push(create_until_ready(&server, &aid).await?.0);
    }
    // Between passes: passes over healthy sessions take milliseconds, so a kill at a random
    // moment mostly lands between them. Mid-pass: one harness SIGSTOPped makes every pass wait
    // out its 2 s probe, so the kill lands inside one and the dead replica's lease is held.
    let stalled = harness_pid(&data, &ids[0])?;
    let mut between_ms = Vec::new();
    let mut mid_ms = Vec::new();
    for round in 0..args.restarts * 2 {
        let mid = round % 2 == 1;
        if mid {
            signal(stalled, "STOP")?;
        }
        tokio::time::sleep(Duration::from_millis(700 + 37 * round as u64)).await;
        server.kill().await?;
        if mid {
            signal(stalled, "CONT")?;
        }
        let t = Instant::now();
        server = LapServer::start(&bins, &data, port, &env("100ms")).await?;
        loop {
            if server.metric("lap_reconcile_passes_total").await.unwrap_or(0) >= 1 {
                break;
            }
            ensure!(
                t.elapsed() < Duration::from_secs(60),
                "no reconcile pass within 60 s of a restart"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if mid {
            mid_ms.push(ms)
        } else {
            between_ms.push(ms)
        }
    }
    // Two failed probes end the stalled session; the others survived every restart.
    for sid in &ids[1..] {
        let v = server.call(Method::GET, &format!("/sessions/{sid}"), None).await?;
        ensure!(v["status"] == "ready", "a session did not survive the restarts: {v}");
    }
    for sid in &ids {
        server.call(Method::DELETE, &format!("/sessions/{sid}"), None).await?;
    }
    between_ms.sort_by(f64::total_cmp);
    mid_ms.sort_by(f64::total_cmp);

    println!("| measure | p50 | p99 | max |");
    println!("|---|---|---|---|");
    println!(
        "| create → ready, {} at once (ms) | {:.0} | {:.0} | {:.0} |",
        args.sessions,
        percentile(&ready_ms, 0.5),
        percentile(&ready_ms, 0.99),
        percentile(&ready_ms, 1.0)
    );
    for (what, v) in [("between passes", &between_ms), ("mid-pass", &mid_ms)] {
        println!(
            "| restart → first finished reconcile pass, kill -9 {what}, {} rounds (ms) | {:.0} | — | {:.0} |",
            args.restarts,
            percentile(v, 0.5),
            percentile(v, 1.0)
        );
    }
    println!(
        "\ncommand: bash benches/control-plane.sh --sessions {} --ready {} --restarts {}",
        args.sessions, args.ready, args.restarts
    );
    Ok(())
}
