//! `lap-harness`: check the agent CLI is there, listen on `PORT`, bring the sandbox up (clone,
//! requirements, CLI auth; `/healthz` reports each phase), then serve.
//!
//! Environment: `PORT`, `HARNESS_AUTH_TOKEN` (required), `LAP_HARNESS_ID` (claude-code, codex,
//! opencode, claude-agent-sdk; default claude-code), `LAP_MODEL`, `AGENT_PROMPT`, `REPO_URL`,
//! `BRANCH`, `GIT_TOKEN` (for the clone only: removed from the environment before anything else
//! runs), `AGENT_REQUIREMENTS` (a shell command run in the workspace after the clone),
//! `LAP_HARNESS_HOST` (bind address, default 127.0.0.1), `LAP_HARNESS_SOCKET` (serve on this
//! Unix socket instead of a TCP port: the local backend's sandboxes have no network), and
//! `LAP_VAULT_HANDOFF=stdin` with `LAP_VAULT_LISTEN` (the vault's socket is bound here, inside
//! the sandbox, and handed to the control plane first: [`lap_harness::vault_handoff`]).
//! `LAP_HARNESS_BOOTSTRAP_TOKEN` without `HARNESS_AUTH_TOKEN` (a Kubernetes warm-pool pod): wait
//! for the session's environment on `PUT /session` first, then `exec` with it
//! ([`lap_harness::bootstrap`]). A
//! start-up failure prints `lap-harness: fatal: <reason>` and exits 3; the control plane shows
//! that reason as the session's `failure_reason`.

use std::process::ExitCode;
use std::sync::Arc;

use lap_harness::agent::{self, AgentKind};
use lap_harness::bootstrap;
use lap_harness::bringup::{self, Phase};
use lap_harness::server;
use lap_harness::tty::{Terminal, TtyCommand};

fn fatal(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("lap-harness: fatal: {msg}");
    ExitCode::from(3)
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// `lap-harness --help`.
const HELP: &str = "\
lap-harness: the server inside a LAP session's sandbox. It checks the agent CLI is installed,
listens, brings the sandbox up (clone, requirements, the CLI's auth; GET /healthz reports each
phase), then serves the agent's messages and terminal to the control plane. lap-server starts it;
you do not run it by hand except to debug a harness image.

Usage: lap-harness [--help | --version]   (configured by the environment only)

Environment:
  HARNESS_AUTH_TOKEN   required: the bearer token the control plane presents
  PORT                 TCP port (default 8080); LAP_HARNESS_HOST the address (default 127.0.0.1)
  LAP_HARNESS_SOCKET   serve on this Unix socket instead of a TCP port
  LAP_HARNESS_ID       claude-code (default), codex, opencode or claude-agent-sdk
  LAP_MODEL            the model the agent CLI is started with
  AGENT_PROMPT         a system prompt for the agent
  REPO_URL, BRANCH     a repository cloned into the workspace at bring-up
  GIT_TOKEN            for that clone only; removed from the environment before anything runs
  AGENT_REQUIREMENTS   a shell command run in the workspace after the clone (e.g. `npm ci`)
  LAP_VAULT_HANDOFF=stdin with LAP_VAULT_LISTEN: bind the vault's socket here, hand it over first
  LAP_HARNESS_BOOTSTRAP_TOKEN (without HARNESS_AUTH_TOKEN): a warm-pool pod waiting for PUT /session
  LAP_LOG / RUST_LOG   log filter (default info); logs are JSON on stdout

A start-up failure prints `lap-harness: fatal: <reason>` and exits 3.
See docs/agents.md (Bring-up phases, Harness images) in the LAP repository.
";

/// `--help`/`-h` and `--version`/`-V`, answered before anything reads the environment.
fn help_or_version(args: &[String]) -> Option<ExitCode> {
    match args.first().map(String::as_str) {
        Some("--help" | "-h" | "help") => {
            print!("{HELP}");
            Some(ExitCode::SUCCESS)
        }
        Some("--version" | "-V") => {
            println!("lap-harness {}", env!("CARGO_PKG_VERSION"));
            Some(ExitCode::SUCCESS)
        }
        Some(other) => {
            eprintln!(
                "lap-harness: unknown argument `{other}`: it is configured by the environment (lap-harness --help)"
            );
            Some(ExitCode::from(2))
        }
        None => None,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(code) = help_or_version(&args) {
        return code;
    }
    // GIT_TOKEN is for the clone only: take it out of the environment before any thread starts,
    // so neither the agent nor its terminal ever inherit it.
    let git_token = env("GIT_TOKEN");
    std::env::remove_var("GIT_TOKEN");
    // A restarted harness (`POST /restart`) keeps the workspace as it is: no clone, no requirements.
    let restarted = env(RESTARTED).is_some();
    std::env::remove_var(RESTARTED);
    if env("LAP_VAULT_HANDOFF").as_deref() == Some("stdin") {
        let listen = env("LAP_VAULT_LISTEN").unwrap_or_else(|| "127.0.0.1:14322".into());
        if let Err(e) = lap_harness::vault_handoff::run(&listen) {
            return fatal(e);
        }
    }
    for k in ["LAP_VAULT_HANDOFF", "LAP_VAULT_LISTEN"] {
        std::env::remove_var(k);
    }
    if let (Some(token), None) = (env(bootstrap::TOKEN_VAR), env("HARNESS_AUTH_TOKEN")) {
        return bootstrap_then_exec(token);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => return fatal(format!("cannot start the async runtime: {e}")),
    };
    runtime.block_on(run(git_token, restarted))
}

async fn run(git_token: Option<String>, restarted: bool) -> ExitCode {
    let filter = env("LAP_LOG")
        .or_else(|| env("RUST_LOG"))
        .unwrap_or_else(|| "info".into());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .json()
        .flatten_event(true)
        .with_current_span(false)
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
    let bin = match agent::which(kind.binary()) {
        Some(bin) => bin,
        // No runner on PATH (the local backend): the copy this harness carries, under $HOME.
        None if kind == AgentKind::ClaudeAgentSdk => {
            let home = env("HOME").unwrap_or_else(|| "/tmp".into());
            match agent::install_sdk_runner(&std::path::Path::new(&home).join(".lap")).await {
                Ok(p) => p,
                Err(e) => return fatal(e),
            }
        }
        None => {
            return fatal(format!(
                "the `{}` CLI for harness {harness_id} is not installed where the harness runs; \
                 install it with `npm install -g {}` and create a new session",
                kind.binary(),
                kind.npm_package()
            ))
        }
    };
    let workspace = match std::env::current_dir() {
        Ok(d) => d,
        Err(e) => return fatal(format!("cannot read the working directory: {e}")),
    };
    let (model, prompt) = (env("LAP_MODEL"), env("AGENT_PROMPT"));
    let tools = match agent::parse_tools(std::env::var("LAP_AGENT_TOOLS").ok().as_deref()) {
        Ok(t) => t,
        Err(e) => return fatal(e),
    };
    let mcp = match agent::parse_mcp_servers(std::env::var("LAP_AGENT_MCP_SERVERS").ok().as_deref()) {
        Ok(m) => m,
        Err(e) => return fatal(e),
    };
    let openai_base_url = env("OPENAI_BASE_URL");
    // The TUI gets the CLI's configuration a message run gets (opencode's permissions, model
    // and MCP servers; codex's model provider).
    let settings = agent::RunSettings {
        model: model.as_deref(),
        prompt: prompt.as_deref(),
        tools: tools.as_deref(),
        mcp: &mcp,
        openai_base_url: openai_base_url.as_deref(),
    };
    let terminal = kind.tui_args(&settings).map(|args| {
        let mut env: Vec<(String, String)> = vec![
            ("TERM".into(), "xterm-256color".into()),
            ("COLORTERM".into(), "truecolor".into()),
            ("DISABLE_AUTOUPDATER".into(), "1".into()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(), "1".into()),
        ];
        env.extend(kind.env(&settings));
        Terminal::new(
            TtyCommand {
                program: bin.clone(),
                args,
                env,
                env_remove: vec!["HARNESS_AUTH_TOKEN".into(), "PORT".into(), "LAP_HARNESS_SOCKET".into()],
            },
            workspace.clone(),
        )
    });

    let first_phase = if env("REPO_URL").is_some() && !restarted {
        Phase::CloningRepo
    } else {
        Phase::InstallingDeps
    };
    let h = Arc::new(server::Harness {
        kind,
        harness_id,
        bin: bin.clone(),
        token,
        model,
        prompt,
        tools,
        mcp,
        openai_base_url,
        conversation: tokio::sync::Mutex::new(None),
        terminal,
        phase: std::sync::RwLock::new(first_phase),
        events: tokio::sync::broadcast::channel(1024).0,
        abort: tokio::sync::watch::channel(0).0,
        restart: tokio::sync::Notify::new(),
        boot: format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ),
    });
    // Listen first, so the control plane can follow the bring-up phases on /healthz. A Unix
    // socket for the local backend (LAP_HARNESS_SOCKET); LAP_HARNESS_HOST=0.0.0.0 in a container.
    let serve_h = Arc::clone(&h);
    let stop_h = Arc::clone(&h);
    let (restart_tx, mut restart_rx) = tokio::sync::oneshot::channel::<()>();
    let stopped = async move {
        tokio::select! {
            () = shutdown_signal() => {},
            () = stop_h.restart.notified() => {
                // The running turn ends (its CLI killed) before the process is replaced.
                stop_h.abort.send_modify(|g| *g = g.wrapping_add(1));
                let _ = tokio::time::timeout(std::time::Duration::from_secs(10), stop_h.conversation.lock()).await;
                let _ = restart_tx.send(());
            }
        }
        // Viewers' WebSockets end when the agent does.
        if let Some(t) = &stop_h.terminal {
            t.shutdown();
        }
    };
    let mut server = if let Some(path) = env("LAP_HARNESS_SOCKET") {
        let _ = std::fs::remove_file(&path);
        let listener = match tokio::net::UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => return fatal(format!("cannot listen on {path}: {e}")),
        };
        tokio::spawn(async move {
            axum::serve(listener, server::router(serve_h))
                .with_graceful_shutdown(stopped)
                .await
        })
    } else {
        let host = env("LAP_HARNESS_HOST").unwrap_or_else(|| "127.0.0.1".into());
        let listener = match tokio::net::TcpListener::bind((host.as_str(), port)).await {
            Ok(l) => l,
            Err(e) => return fatal(format!("cannot listen on port {port}: {e}")),
        };
        tokio::spawn(async move {
            axum::serve(listener, server::router(serve_h))
                .with_graceful_shutdown(stopped)
                .await
        })
    };

    let bring_up = async {
        if let Some(url) = env("REPO_URL").filter(|_| !restarted) {
            h.set_phase(Phase::CloningRepo);
            bringup::clone_repo(&url, env("BRANCH").as_deref(), git_token.as_deref(), &workspace).await?;
        }
        drop(git_token);
        h.set_phase(Phase::InstallingDeps);
        if let Some(cmd) = env("AGENT_REQUIREMENTS").filter(|_| !restarted) {
            bringup::install_requirements(&cmd, &workspace).await?;
        }
        match kind {
            AgentKind::Codex => {
                if let Some(key) = env("OPENAI_API_KEY") {
                    bringup::codex_login(&bin, &key).await?;
                }
            }
            AgentKind::ClaudeCode | AgentKind::ClaudeAgentSdk => {
                if let Some(home) = env("HOME") {
                    bringup::prepare_claude(
                        std::path::Path::new(&home),
                        env("ANTHROPIC_API_KEY").as_deref(),
                        &workspace,
                    )?;
                }
            }
            AgentKind::Opencode => {}
        }
        Ok::<(), bringup::BringUpError>(())
    };
    tokio::select! {
        r = bring_up => if let Err(e) = r {
            return fatal(e);
        },
        r = &mut server => return fatal(format!("the server stopped during bring-up: {r:?}")),
    }
    h.set_phase(Phase::HarnessListening);
    tracing::info!(port, "lap-harness listening");
    // A restart: stop serving (connections still open, an /events stream, get a moment), then
    // replace this process with a fresh harness, in the same sandbox and environment.
    let mut result = None;
    let mut restart = tokio::select! {
        r = &mut server => {
            result = Some(r);
            false
        }
        // Err: the sender went with a SIGTERM shutdown.
        r = &mut restart_rx => r.is_ok(),
    };
    if result.is_some() {
        // Both may be done at once: a restart finishes serving right after it is announced.
        restart = restart_rx.try_recv().is_ok();
    }
    if let Some(t) = &h.terminal {
        t.shutdown();
    }
    if restart {
        if result.is_none() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), server).await;
        }
        return re_exec();
    }
    let result = match result {
        Some(r) => r,
        None => server.await,
    };
    match result {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => fatal(e),
        Err(e) => fatal(e),
    }
}

/// A warm-pool pod: wait for the session on `PORT` ([`bootstrap`]), then become the ordinary
/// harness with the session's environment (and without the pool's token).
fn bootstrap_then_exec(token: String) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let port: u16 = match env("PORT").map(|p| p.parse()) {
        Some(Ok(p)) => p,
        None => 8080,
        Some(Err(_)) => return fatal("PORT is not a port number"),
    };
    let host = env("LAP_HARNESS_HOST").unwrap_or_else(|| "127.0.0.1".into());
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return fatal(format!("cannot start the async runtime: {e}")),
    };
    let session = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind((host.as_str(), port)).await?;
        eprintln!("lap-harness: waiting for a session on port {port}");
        bootstrap::wait(listener, token).await
    });
    drop(runtime);
    let env = match session {
        Ok(env) => env,
        Err(e) => return fatal(format!("bootstrap: {e}")),
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return fatal(format!("bootstrap: cannot find this program: {e}")),
    };
    let err = std::process::Command::new(exe)
        .envs(env)
        .env_remove(bootstrap::TOKEN_VAR)
        .exec();
    fatal(format!("bootstrap: exec: {err}"))
}

/// Set in the environment of a harness that replaced itself on `POST /restart`.
const RESTARTED: &str = "LAP_HARNESS_RESTARTED";

/// `exec` this program again, marked [`RESTARTED`].
fn re_exec() -> ExitCode {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return fatal(format!("restart: cannot find this program: {e}")),
    };
    tracing::info!("restarting the harness");
    let err = std::process::Command::new(exe).env(RESTARTED, "1").exec();
    fatal(format!("restart: exec: {err}"))
}

/// SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}
