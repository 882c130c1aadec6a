//! A `lap-server` child process for the whole-platform benches (`src/bin/sandbox.rs`,
//! `src/bin/control_plane.rs`): started from release binaries side by side, driven over its REST
//! API, read through `/metrics`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use serde_json::Value;

/// The master key the benches start `lap-server` with.
pub const MASTER_KEY: &str = "bench";

/// A `claude` that runs its `-p` prompt with `sh -c` and answers with the output, so a bench's
/// client runs where an agent runs (inside the sandbox).
const OBEDIENT_CLAUDE: &str = r#"#!/usr/bin/env python3
import json, subprocess, sys
args = sys.argv[1:]
text = args[args.index("--") + 1] if "--" in args else ""
r = subprocess.run(["sh", "-c", text], capture_output=True, text=True, timeout=600)
print(json.dumps({"type": "system", "subtype": "init", "session_id": "bench"}))
print(json.dumps({"type": "result", "subtype": "success", "is_error": False,
                  "result": r.stdout + r.stderr, "session_id": "bench"}))
"#;

/// Write the obedient `claude` into `dir/bin`; returns that directory (for `PATH` and
/// `LAP_LOCAL_RO_PATHS`).
pub fn obedient_claude(dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    std::fs::write(bin.join("claude"), OBEDIENT_CLAUDE)?;
    std::fs::set_permissions(bin.join("claude"), std::fs::Permissions::from_mode(0o755))?;
    Ok(bin)
}

/// A free loopback TCP port.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The directory holding the workspace binaries: `--bin-dir`, or next to this program.
pub fn bin_dir(given: Option<&Path>) -> Result<PathBuf> {
    match given {
        Some(d) => Ok(d.to_owned()),
        None => Ok(std::env::current_exe()?.parent().context("bin dir")?.to_owned()),
    }
}

/// The value at `p` (0..=1) of sorted samples, nearest rank.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub struct LapServer {
    pub url: String,
    http: reqwest::Client,
    child: tokio::process::Child,
}

impl Drop for LapServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

impl LapServer {
    /// Start `bins/lap-server` on `port` with `data_dir`, the sibling sidecar and harness, and
    /// `env`; waits for `/health` (30 s at most).
    pub async fn start(bins: &Path, data_dir: &Path, port: u16, env: &[(&str, OsString)]) -> Result<LapServer> {
        let mut cmd = tokio::process::Command::new(bins.join("lap-server"));
        cmd.env("LAP_LISTEN", format!("127.0.0.1:{port}"))
            .env("LAP_DATA_DIR", data_dir)
            .env("MASTER_KEY", MASTER_KEY)
            .env("LAP_SIDECAR_BIN", bins.join("vault-sidecar"))
            .env("LAP_HARNESS_BIN", bins.join("lap-harness"))
            .env("LAP_LOG", "warn")
            .env_remove("DATABASE_URL")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().context("start lap-server")?;
        let server = LapServer {
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder().no_proxy().build()?,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !server
            .http
            .get(format!("{}/health", server.url))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            ensure!(Instant::now() < deadline, "lap-server did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(server)
    }

    /// A call under `/api/v1/managed_agents`; a non-2xx answer is an error with its body.
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
        let mut req = self
            .http
            .request(method, format!("{}/api/v1/managed_agents{path}", self.url))
            .bearer_auth(MASTER_KEY);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await?;
        let status = r.status();
        let v: Value = r.json().await?;
        ensure!(status.is_success(), "{path}: {status} {v}");
        Ok(v)
    }

    /// A counter of `/metrics` (`None` until it answers).
    pub async fn metric(&self, name: &str) -> Option<u64> {
        let text = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
    }

    /// Poll the session until it leaves `creating`; its final view.
    pub async fn settle(&self, sid: &str, poll: Duration) -> Result<Value> {
        loop {
            let v = self
                .call(reqwest::Method::GET, &format!("/sessions/{sid}"), None)
                .await?;
            if v["status"] != "creating" {
                return Ok(v);
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// SIGKILL, as a crash: the sandboxes keep running.
    pub async fn kill(mut self) -> Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}
