//! `lap`: the LAP command line (SPEC §4).
//!
//! `lap <agent-name>` (create a session, show its bring-up, attach) is the main form; then
//! `lap login`, `lap agents [create|edit|rm]`, `lap sessions`, `lap attach`, `lap send`,
//! `lap stop`, `lap audit`, `lap logs`, `lap secrets [list|set|rm]`. The server and key come
//! from `LAP_URL`/`MASTER_KEY`, else from `lap login`'s file ([`config`]). Start reading at
//! [`commands`]; the pure parts are [`resolve`] (which session a name means), [`agent_spec`]
//! (flags to request bodies), [`harness_keys`], [`vault_events`], [`when`] and [`stream`].

/// `println!` for a command's output: a reader that went away (`lap sessions | head`) ends the
/// command quietly, as `ls | head` does, instead of the panic `println!` gives on `EPIPE`.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
        }
    }};
}

mod agent_spec;
mod client;
mod commands;
mod config;
mod harness_keys;
mod resolve;
mod stream;
mod terminal;
mod vault_events;
mod when;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

const USAGE: &str = "lap <AGENT> [-e KEY[=VALUE]]... [--title TITLE] [--no-attach]\n       lap [--json] <COMMAND>";

#[derive(Debug, Parser)]
#[command(
    name = "lap",
    version,
    about = "Run coding agents as isolated LAP sessions",
    override_usage = USAGE,
    before_help = "Start a session of an agent and attach to its terminal:  lap <agent-name> [-e ANTHROPIC_API_KEY]\n\
                   (Ctrl-D detaches; the session keeps running: lap attach <agent-name|session>)",
    after_help = "A <SESSION> is a session id, a unique start of one, or an agent's name (its latest ready session).\n\
                  `lap <agent-name> --help` shows the options of the main form."
)]
struct Cli {
    /// Print JSON (the server's own objects) instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of the `agents edit` variant costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Save the server URL and master key (0600) for later commands.
    Login {
        /// The server, e.g. http://127.0.0.1:4000 (asked for when not given).
        #[arg(long)]
        url: Option<String>,
    },
    /// List agents, or create, edit or remove one.
    Agents {
        #[command(subcommand)]
        command: Option<AgentsCommand>,
    },
    /// List live sessions (creating, ready, failed); --all adds the stopped (dead) ones.
    Sessions {
        /// Only this agent's (name or id).
        #[arg(long)]
        agent: Option<String>,
        /// Stopped (dead) sessions too.
        #[arg(long)]
        all: bool,
    },
    /// Attach this terminal to a session (Ctrl-D detaches).
    Attach {
        /// A session id, a unique start of one, or an agent's name.
        session: String,
    },
    /// Send a message to a session and stream the reply.
    Send {
        /// A session id, a unique start of one, or an agent's name.
        session: String,
        /// The message.
        #[arg(required = true, num_args = 1..)]
        text: Vec<String>,
    },
    /// Stop a session (its sandbox is destroyed; it becomes dead).
    Stop {
        /// A session id, a unique start of one, or an agent's name.
        session: String,
    },
    /// A session's audit: the vault's interceptions and the admin actions on it, oldest first.
    Audit {
        /// A session id, a unique start of one, or an agent's name.
        session: String,
    },
    /// A session's event log: its state changes and the agent's own events, as they happen.
    Logs {
        /// A session id, a unique start of one, or an agent's name.
        session: String,
        /// Keep following (until Ctrl-C, or the session is dead or failed) instead of stopping once
        /// nothing arrives for --quiet-for.
        #[arg(short, long)]
        follow: bool,
        /// Without --follow, stop after this many seconds without an event.
        #[arg(long, default_value_t = 2)]
        quiet_for: u64,
        /// Print the last lines of the harness's own log (lap-harness and the agent CLI) instead.
        #[arg(long, conflicts_with_all = ["vault", "follow"])]
        harness: bool,
        /// Print the last lines of the vault sidecar's log (JSON lines; audit events, never a value) instead.
        #[arg(long, conflicts_with = "follow")]
        vault: bool,
        /// With --harness or --vault: how many lines.
        #[arg(long, default_value_t = 200)]
        tail: u32,
    },
    /// The secrets registry: list, set (value from stdin) or remove.
    #[command(subcommand)]
    Secrets(SecretsCommand),
    /// `lap <agent-name> [-e KEY]…`: start a session of that agent and attach to it.
    #[command(external_subcommand)]
    Agent(Vec<String>),
}

#[derive(Debug, Subcommand)]
enum AgentsCommand {
    /// List agents (the default).
    List,
    /// Create an agent.
    Create {
        name: String,
        #[command(flatten)]
        flags: agent_spec::AgentFlags,
    },
    /// Change an agent: only the fields given change.
    Edit {
        /// The agent's name or id.
        agent: String,
        #[command(flatten)]
        flags: agent_spec::AgentFlags,
        /// A new name.
        #[arg(long)]
        rename: Option<String>,
        /// Add a registry secret to its list (repeatable).
        #[arg(long = "add-secret", value_name = "NAME")]
        add_secrets: Vec<String>,
        /// Remove a registry secret from its list (repeatable).
        #[arg(long = "rm-secret", value_name = "NAME")]
        remove_secrets: Vec<String>,
        /// Empty a list: secrets, allow-out, deny-out, env (repeatable).
        #[arg(long, value_name = "FIELD")]
        clear: Vec<String>,
    },
    /// Remove an agent.
    Rm {
        /// The agent's name or id.
        agent: String,
        /// Stop its running sessions first (otherwise an agent with live sessions is kept).
        #[arg(long)]
        stop_sessions: bool,
    },
}

#[derive(Debug, Subcommand)]
enum SecretsCommand {
    /// List the registry's secrets (names, hosts, locations; never values).
    List,
    /// Create or rotate a secret; its value is read from stdin, never from the command line.
    Set {
        name: String,
        /// A host it may be sent to (repeatable): exact, *.suffix, IP or CIDR.
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// A credential surface where its stub is swapped (repeatable): header (the default, the
        /// credential headers), header:NAME, query, query:NAME, body (form bodies), body:METHOD /PATH.
        #[arg(long = "location")]
        locations: Vec<String>,
    },
    /// Remove a secret (revoked from running sessions that use it).
    Rm { name: String },
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
    let json = cli.json;
    let result = runtime.block_on(async {
        match cli.command {
            Command::Login { url } => commands::login(url).await,
            Command::Agents { command } => match command {
                None | Some(AgentsCommand::List) => commands::agents(json).await,
                Some(AgentsCommand::Create { name, flags }) => commands::agents_create(&name, &flags, json).await,
                Some(AgentsCommand::Edit {
                    agent,
                    flags,
                    rename,
                    add_secrets,
                    remove_secrets,
                    clear,
                }) => {
                    let edit = agent_spec::Edit {
                        rename,
                        add_secrets,
                        remove_secrets,
                        clear,
                    };
                    commands::agents_edit(&agent, &flags, &edit, json).await
                }
                Some(AgentsCommand::Rm { agent, stop_sessions }) => commands::agents_rm(&agent, stop_sessions).await,
            },
            Command::Sessions { agent, all } => commands::sessions(agent, all, json).await,
            Command::Attach { session } => commands::attach(&session).await,
            Command::Send { session, text } => commands::send(&session, &text.join(" ")).await,
            Command::Stop { session } => commands::stop(&session, json).await,
            Command::Audit { session } => commands::audit(&session, json).await,
            Command::Logs {
                session,
                follow,
                quiet_for,
                harness,
                vault,
                tail,
            } => match (harness, vault) {
                (true, _) => commands::log_file(&session, "harness", tail, json).await,
                (_, true) => commands::log_file(&session, "vault", tail, json).await,
                _ => commands::logs(&session, follow, quiet_for, json).await,
            },
            Command::Secrets(SecretsCommand::List) => commands::secrets_list(json).await,
            Command::Secrets(SecretsCommand::Set { name, hosts, locations }) => {
                commands::secrets_set(&name, &hosts, &locations).await
            }
            Command::Secrets(SecretsCommand::Rm { name }) => commands::secrets_rm(&name).await,
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
