//! `vault-sidecar`: parse flags, validate the whole config, then start. Exit 2 on bad config.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lap_vault_sidecar::config::{parse_secrets_stdin, ConfigErrors, SecretSpec, Settings, SidecarConfig};
use lap_vault_sidecar::logwriter;
use lap_vault_sidecar::Inherited;

/// jemalloc with background purging: memory freed after a burst of connections (10k silent
/// CONNECTs, say) goes back to the OS within seconds instead of staying resident in glibc arenas.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "vault-sidecar",
    version,
    about = "LAP vault sidecar: swaps credential stubs for real keys on the wire",
    after_help = "The config file's keys (all optional but inside [[secrets]]):\n  \
        listen, admin_listen, transparent_listen, admin_token_file, ca_cert_path, ca_cert_file, ca_key_file,\n  \
        upstream_ca_files, intercept, passthrough, body_tripwire, worker_threads, upstream_response_timeout_secs,\n  \
        secrets_file, secrets_stdin, ready_file,\n  \
        [resolve] \"host:port\" = \"ip:port\", [egress] allow/deny/deny_local,\n  \
        [[secrets]] name, stub, value | value_env | value_file, hosts, locations.\n\
        Each is described in docs/sidecar.md, section \"Sidecar configuration\", of the LAP repository; \
        `vault-sidecar check FILE` validates a file and lists every problem in it."
)]
struct Cli {
    /// Config file (TOML; its keys are listed below and in docs/sidecar.md, "Sidecar configuration").
    #[arg(long, env = "VAULT_CONFIG", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the config: exit 0 printing what each secret may do, or exit 2 printing every problem.
    Check {
        /// The config file (default: `--config`, or VAULT_CONFIG).
        file: Option<PathBuf>,
    },
}

/// `secrets_stdin`: standard input read to its end, as `{"secrets":[...]}`.
fn stdin_secrets(config: &SidecarConfig) -> Result<Vec<SecretSpec>, ConfigErrors> {
    if config.secrets_stdin != Some(true) {
        return Ok(Vec::new());
    }
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin().lock().read_to_end(&mut bytes) {
        return Err(ConfigErrors(vec![lap_vault_sidecar::config::ConfigError {
            key: "secrets_stdin".into(),
            reason: format!("cannot read standard input: {e}"),
        }]));
    }
    parse_secrets_stdin(&bytes)
}

fn main() -> ExitCode {
    // Socket activation (sd_listen_fds(3)): with LISTEN_FDS=1 the explicit proxy port is the
    // listening socket on fd 3, bound by the supervisor (the local backend binds it inside the
    // sandbox's network namespace). Taken before any thread starts: it edits the environment.
    let inherited = match listenfd::ListenFd::from_env().take_tcp_listener(0) {
        Ok(listen) => Inherited { listen },
        Err(e) => {
            eprintln!("vault-sidecar: LISTEN_FDS: fd 3 is not a listening TCP socket: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse();
    // `Some(file)` for `check [FILE]`.
    let checked = cli.command.map(|Command::Check { file }| file);
    let Some(path) = checked.clone().flatten().or(cli.config) else {
        eprintln!("vault-sidecar: --config FILE (or VAULT_CONFIG) is required");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) => {
            // As every config problem: `FILE: key: reason` (docs/sidecar.md, key `config`).
            eprintln!("{}: config: cannot read {}: {e}", path.display(), path.display());
            return ExitCode::from(2);
        }
    };
    let settings = match Settings::from_text(&text, &|name| std::env::var(name).ok(), stdin_secrets) {
        Ok(s) => s,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{}: {e}", path.display());
            }
            return ExitCode::from(2);
        }
    };
    if checked.is_some() {
        let n = settings.secrets.len();
        println!("{}: ok ({n} secret{})", path.display(), if n == 1 { "" } else { "s" });
        // What each secret may do: names, hosts and surfaces, never a stub or a value.
        for secret in &settings.secrets {
            let hosts: Vec<String> = secret.hosts.0.iter().map(ToString::to_string).collect();
            println!(
                "  {}: sent to {}; swapped in {}",
                secret.name,
                hosts.join(", "),
                secret.surfaces
            );
        }
        return ExitCode::SUCCESS;
    }
    // Held until main returns: dropping it flushes the lines still queued for stdout.
    let _log_flush = init_logging();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.worker_threads)
        .enable_all()
        .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vault-sidecar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // SIGTERM/SIGINT end the process through main, so the log queue is flushed on the way out.
    let served = runtime.block_on(async {
        tokio::select! {
            r = lap_vault_sidecar::run_with(settings, inherited) => r,
            () = terminated() => {
                tracing::info!("vault sidecar stopping on signal");
                Ok(())
            }
        }
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "vault sidecar cannot start");
            eprintln!("vault-sidecar: {e}");
            ExitCode::from(2)
        }
    }
}

/// Resolves on the first SIGTERM or SIGINT (never, if the handlers can't be installed).
async fn terminated() {
    use tokio::signal::unix::{signal, SignalKind};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

/// JSON lines on stdout, written in batches by a dedicated thread ([`logwriter`]): a request's audit
/// line costs its formatting and an append to a buffer, not a `write(2)` or a thread wake-up. Lines
/// are never dropped (writers wait when stdout can't keep up); dropping the guard writes the rest.
fn init_logging() -> Option<logwriter::FlushGuard> {
    let filter = std::env::var("LAP_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".to_owned());
    let subscriber = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter));
    match logwriter::batched(std::io::stdout(), logwriter::FLUSH_DELAY) {
        Ok((writer, guard)) => {
            lap_vault_sidecar::write_audit_lines_to(writer.clone());
            subscriber.with_writer(writer).init();
            Some(guard)
        }
        Err(e) => {
            // No thread for the writer: write each line directly instead.
            subscriber.with_writer(std::io::stdout).init();
            tracing::warn!(error = %e, "cannot start the log writer thread; logging synchronously");
            None
        }
    }
}
