//! `lap`: the LAP command line (SPEC §4).
//!
//! `lap login`, `lap agents`, `lap sessions`, `lap <agent-name>` (create a session, show its
//! bring-up, attach), `lap attach <session>`, `lap send <session> TEXT`, `lap secrets set NAME
//! --host H`. The server and key come from `LAP_URL`/`MASTER_KEY`, else from `lap login`'s file
//! ([`config`]). Start reading at [`commands`].

mod client;
mod commands;
mod config;
mod stream;
mod terminal;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "lap",
    version,
    about = "Run coding agents as isolated LAP sessions",
    after_help = "Start a session of an agent and attach to its terminal: lap <agent-name>\n\
                  In a terminal, Ctrl-D detaches; the session keeps running (lap attach <session>)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Save the server URL and master key (0600) for later commands.
    Login {
        /// The server, e.g. http://127.0.0.1:4000 (asked for when not given).
        #[arg(long)]
        url: Option<String>,
    },
    /// List agents.
    Agents,
    /// List sessions.
    Sessions {
        /// Only this agent's (name or id).
        #[arg(long)]
        agent: Option<String>,
    },
    /// Attach this terminal to a session (Ctrl-D detaches).
    Attach { session: String },
    /// Send a message to a session and stream the reply.
    Send {
        session: String,
        /// The message.
        #[arg(required = true, num_args = 1..)]
        text: Vec<String>,
    },
    /// The secrets registry.
    #[command(subcommand)]
    Secrets(SecretsCommand),
    /// `lap <agent-name> [-e KEY]…`: start a session of that agent and attach to it.
    #[command(external_subcommand)]
    Agent(Vec<String>),
}

#[derive(Debug, Subcommand)]
enum SecretsCommand {
    /// Create or rotate a secret; its value is read from stdin, never from the command line.
    Set {
        name: String,
        /// A host it may be sent to (repeatable): exact, *.suffix, IP or CIDR.
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// Where it is swapped: header (default), query, body (repeatable).
        #[arg(long = "location")]
        locations: Vec<String>,
    },
}

/// `lap <agent-name>`'s own options.
#[derive(Debug, Parser)]
#[command(
    name = "lap",
    no_binary_name = true,
    about = "Start a session of an agent, show its bring-up, attach to its terminal",
    override_usage = "lap <AGENT> [-e KEY[=VALUE]]... [--title TITLE] [--no-attach]"
)]
pub(crate) struct RunArgs {
    /// The agent's name (or id).
    pub(crate) agent: String,
    /// A session env var, its value taken from this environment (`-e ANTHROPIC_API_KEY`), or
    /// given as KEY=VALUE (repeatable). Values go to the session's vault only.
    #[arg(short = 'e', long = "env")]
    pub(crate) env: Vec<String>,
    /// A title for the session.
    #[arg(long)]
    pub(crate) title: Option<String>,
    /// Create the session and wait until it is ready, but do not attach.
    #[arg(long)]
    pub(crate) no_attach: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lap: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Login { url } => commands::login(url).await,
            Command::Agents => commands::agents().await,
            Command::Sessions { agent } => commands::sessions(agent).await,
            Command::Attach { session } => commands::attach(&session).await,
            Command::Send { session, text } => commands::send(&session, &text.join(" ")).await,
            Command::Secrets(SecretsCommand::Set { name, hosts, locations }) => {
                commands::secrets_set(&name, &hosts, &locations).await
            }
            Command::Agent(args) => match RunArgs::try_parse_from(args) {
                Ok(a) => commands::run(a).await,
                Err(e) => e.exit(),
            },
        }
    });
    // Threads blocked on stdin must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("lap: {e:#}");
            ExitCode::FAILURE
        }
    }
}
