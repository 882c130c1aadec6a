//! `lap-harness`: check the agent CLI is there, prepare it, then serve on `PORT`.
//!
//! Environment: `PORT`, `HARNESS_AUTH_TOKEN` (required), `LAP_HARNESS_ID` (claude-code, codex,
//! opencode, claude-agent-sdk; default claude-code), `LAP_MODEL`, `AGENT_PROMPT`, `REPO_URL`,
//! `BRANCH`, `LAP_HARNESS_HOST` (bind address, default 127.0.0.1). A start-up failure prints
//! `lap-harness: fatal: <reason>` and exits 3; the control
//! plane shows that reason as the session's `failure_reason`.

use std::process::ExitCode;
use std::sync::Arc;

use lap_harness::agent::{self, AgentKind};
use lap_harness::server;

fn fatal(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("lap-harness: fatal: {msg}");
    ExitCode::from(3)
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

#[tokio::main]
async fn main() -> ExitCode {
    let filter = env("LAP_LOG")
        .or_else(|| env("RUST_LOG"))
        .unwrap_or_else(|| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .json()
        .init();

    let harness_id = env("LAP_HARNESS_ID").unwrap_or_else(|| "claude-code".into());
    let Some(kind) = AgentKind::parse(&harness_id) else {
        return fatal(format!(
            "unknown harness `{harness_id}`: use claude-code, codex, opencode or claude-agent-sdk"
        ));
    };
    let Some(token) = env("HARNESS_AUTH_TOKEN") else {
        return fatal("HARNESS_AUTH_TOKEN is not set");
    };
    let port: u16 = match env("PORT").map(|p| p.parse()) {
        Some(Ok(p)) => p,
        None => 8080,
        Some(Err(_)) => return fatal("PORT is not a port number"),
    };
    let Some(bin) = agent::which(kind.binary()) else {
        return fatal(format!(
            "the `{}` CLI for harness {harness_id} is not installed where the harness runs; \
             install it with `npm install -g {}` and create a new session",
            kind.binary(),
            kind.npm_package()
        ));
    };

    if let Some(url) = env("REPO_URL") {
        if let Err(e) = clone_repo(&url, env("BRANCH").as_deref()).await {
            return fatal(e);
        }
    }
    if kind == AgentKind::Codex {
        if let Some(key) = env("OPENAI_API_KEY") {
            if let Err(e) = codex_login(&bin, &key).await {
                return fatal(e);
            }
        }
    }

    let h = Arc::new(server::Harness {
        kind,
        harness_id,
        bin,
        token,
        model: env("LAP_MODEL"),
        prompt: env("AGENT_PROMPT"),
        conversation: tokio::sync::Mutex::new(None),
    });
    // Loopback for the local backend; LAP_HARNESS_HOST=0.0.0.0 in a container.
    let host = env("LAP_HARNESS_HOST").unwrap_or_else(|| "127.0.0.1".into());
    let listener = match tokio::net::TcpListener::bind((host.as_str(), port)).await {
        Ok(l) => l,
        Err(e) => return fatal(format!("cannot listen on port {port}: {e}")),
    };
    tracing::info!(port, "lap-harness listening");
    if let Err(e) = axum::serve(listener, server::router(h)).await {
        return fatal(e);
    }
    ExitCode::SUCCESS
}

/// `git clone` (through the sidecar, with the stub credentials in the environment).
async fn clone_repo(url: &str, branch: Option<&str>) -> Result<(), String> {
    let mut cmd = tokio::process::Command::new("git");
    cmd.args(["clone", "--depth", "1"]);
    if let Some(b) = branch {
        cmd.args(["--branch", b]);
    }
    cmd.args([url, "."]);
    let out = cmd.output().await.map_err(|e| format!("cannot run git: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "git clone {url} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `codex login --with-api-key`, reading the (stub) key from stdin.
async fn codex_login(bin: &std::path::Path, key: &str) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(bin)
        .args(["login", "--with-api-key"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run codex login: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(format!("{key}\n").as_bytes()).await;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("codex login: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "codex login failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
