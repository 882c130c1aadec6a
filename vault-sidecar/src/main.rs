//! `vault-sidecar`: parse flags, validate the whole config, then start. Exit 2 on bad config.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use lap_vault_sidecar::config::{read_config, Settings};

/// jemalloc with background purging: memory freed after a burst of connections (10k silent
/// CONNECTs, say) goes back to the OS within seconds instead of staying resident in glibc arenas.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "vault-sidecar",
    version,
    about = "LAP vault sidecar: swaps credential stubs for real keys on the wire"
)]
struct Cli {
    /// Config file (TOML, SPEC §2.1).
    #[arg(long, env = "VAULT_CONFIG", global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the config: exit 0, or exit 2 printing every problem.
    Check,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Some(path) = cli.config else {
        eprintln!("vault-sidecar: --config FILE (or VAULT_CONFIG) is required");
        return ExitCode::from(2);
    };
    let settings = match read_config(&path).and_then(|c| Settings::from_config(&c)) {
        Ok(s) => s,
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{}: {e}", path.display());
            }
            return ExitCode::from(2);
        }
    };
    if matches!(cli.command, Some(Command::Check)) {
        let n = settings.secrets.len();
        println!("{}: ok ({n} secret{})", path.display(), if n == 1 { "" } else { "s" });
        return ExitCode::SUCCESS;
    }
    init_logging();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vault-sidecar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(lap_vault_sidecar::proxy::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "vault sidecar cannot start");
            eprintln!("vault-sidecar: {e}");
            ExitCode::from(2)
        }
    }
}

fn init_logging() {
    let filter = std::env::var("LAP_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".to_owned());
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stdout)
        .init();
}
