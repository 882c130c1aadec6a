//! Running an agent CLI non-interactively, one message at a time, with conversation continuity.
//!
//! [`AgentKind`] knows each CLI: its binary, the arguments for a first and a follow-up message,
//! and how to read its output ([`parse_claude`], [`parse_codex`], pure and unit-tested).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// How long one message may run.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The tool names an agent's `tools[]` may list (`LAP_AGENT_TOOLS`, comma-separated), the same
/// for every harness; each CLI's own names are in [`claude_tool_names`] and [`opencode_permission`].
pub const TOOL_NAMES: &[&str] = &["bash", "read", "edit", "write", "glob", "grep", "webfetch", "websearch"];

/// `LAP_AGENT_TOOLS`: unset is every tool (`None`); otherwise the comma-separated names, each one
/// of [`TOOL_NAMES`] (`""` is no tool at all).
pub fn parse_tools(value: Option<&str>) -> Result<Option<Vec<String>>, String> {
    let Some(v) = value else { return Ok(None) };
    let mut out = Vec::new();
    for name in v.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !TOOL_NAMES.contains(&name) {
            return Err(format!(
                "LAP_AGENT_TOOLS: unknown tool `{name}` (known: {})",
                TOOL_NAMES.join(", ")
            ));
        }
        if !out.iter().any(|o| o == name) {
            out.push(name.to_owned());
        }
    }
    Ok(Some(out))
}

/// Claude Code's (and the Agent SDK's) tool names for one of [`TOOL_NAMES`].
pub fn claude_tool_names(tool: &str) -> &'static [&'static str] {
    match tool {
        "bash" => &["Bash", "BashOutput", "KillShell"],
        "read" => &["Read", "LS"],
        "edit" => &["Edit", "MultiEdit", "NotebookEdit"],
        "write" => &["Write"],
        "glob" => &["Glob"],
        "grep" => &["Grep"],
        "webfetch" => &["WebFetch"],
        "websearch" => &["WebSearch"],
        _ => &[],
    }
}

/// Claude's `--allowedTools` and `--disallowedTools` values (comma-separated) for `tools`.
pub fn claude_tool_lists(tools: &[String]) -> (String, String) {
    let (mut allowed, mut denied) = (Vec::new(), Vec::new());
    for t in TOOL_NAMES {
        let names = claude_tool_names(t);
        if tools.iter().any(|x| x == t) {
            allowed.extend_from_slice(names);
        } else {
            denied.extend_from_slice(names);
        }
    }
    (allowed.join(","), denied.join(","))
}

/// opencode's `permission` configuration (its `OPENCODE_CONFIG_CONTENT`): `"allow"` for every
/// tool; otherwise everything denied but the listed tools (opencode's `edit` covers its `write`
/// and `patch` tools, `read` its `list`).
pub fn opencode_permission(tools: Option<&[String]>) -> serde_json::Value {
    let Some(tools) = tools else {
        return serde_json::json!({ "permission": "allow" });
    };
    let mut p = serde_json::Map::new();
    p.insert("*".into(), "deny".into());
    for t in tools {
        let keys: &[&str] = match t.as_str() {
            "read" => &["read", "list"],
            "write" | "edit" => &["edit"],
            "bash" => &["bash"],
            "glob" => &["glob"],
            "grep" => &["grep"],
            "webfetch" => &["webfetch"],
            "websearch" => &["websearch"],
            _ => &[],
        };
        for k in keys {
            p.insert((*k).to_owned(), "allow".into());
        }
    }
    serde_json::json!({ "permission": p })
}

/// One of the agent's remote MCP servers (streamable HTTP), from `LAP_AGENT_MCP_SERVERS`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct McpServer {
    pub name: String,
    pub url: String,
}

/// `LAP_AGENT_MCP_SERVERS`: unset is none; otherwise a JSON array of `{"name","url"}` (the
/// control plane checked both).
pub fn parse_mcp_servers(value: Option<&str>) -> Result<Vec<McpServer>, String> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(Vec::new()),
        Some(v) => serde_json::from_str(v)
            .map_err(|e| format!("LAP_AGENT_MCP_SERVERS: not a JSON array of {{\"name\", \"url\"}}: {e}")),
    }
}

/// Claude's `--mcp-config` value for `servers`: `{"mcpServers": {NAME: {"type": "http", "url"}}}`.
pub fn claude_mcp_config(servers: &[McpServer]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = servers
        .iter()
        .map(|m| (m.name.clone(), serde_json::json!({"type": "http", "url": m.url})))
        .collect();
    serde_json::json!({ "mcpServers": map }).to_string()
}

/// A TOML basic string holding `s` (JSON's string escapes are TOML's).
fn toml_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// The provider name codex's `-c` overrides declare for `OPENAI_BASE_URL` ([`codex_overrides`]).
const CODEX_PROVIDER: &str = "lap-openai";

/// Codex's `-c` overrides (TOML values):
/// - for each of `s.mcp`: `mcp_servers.NAME.url="URL"`;
/// - for `s.openai_base_url`: a model provider of its own at that URL (`model_provider`, and
///   `model_providers.lap-openai.{name, base_url, env_key = "OPENAI_API_KEY", wire_api =
///   "responses"}`). Codex 0.171 no longer reads `OPENAI_BASE_URL`, and its built-in `openai`
///   provider takes no `base_url` from configuration; a provider declared this way is how its
///   configuration reference points it at a gateway.
fn codex_overrides(s: &RunSettings<'_>) -> Vec<String> {
    let mut a: Vec<String> = s
        .mcp
        .iter()
        .flat_map(|m| {
            [
                "-c".to_owned(),
                format!("mcp_servers.{}.url={}", m.name, toml_string(&m.url)),
            ]
        })
        .collect();
    if let Some(url) = s.openai_base_url {
        let p = CODEX_PROVIDER;
        for kv in [
            format!("model_provider={}", toml_string(p)),
            format!(
                "model_providers.{p}.name={}",
                toml_string("OpenAI API at OPENAI_BASE_URL")
            ),
            format!("model_providers.{p}.base_url={}", toml_string(url)),
            format!("model_providers.{p}.env_key={}", toml_string("OPENAI_API_KEY")),
            format!("model_providers.{p}.wire_api={}", toml_string("responses")),
        ] {
            a.extend(["-c".to_owned(), kv]);
        }
    }
    a
}

/// What a message runs with besides its text: the agent's settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunSettings<'a> {
    pub model: Option<&'a str>,
    pub prompt: Option<&'a str>,
    /// `None`: every tool (see [`parse_tools`]).
    pub tools: Option<&'a [String]>,
    /// The agent's remote MCP servers (see [`parse_mcp_servers`]).
    pub mcp: &'a [McpServer],
    /// `OPENAI_BASE_URL` as the harness got it (a model gateway's, for codex): codex is pointed
    /// at it with `-c` overrides ([`codex_overrides`]); the other CLIs read the variable.
    pub openai_base_url: Option<&'a str>,
}

/// The agent CLIs a harness can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentKind {
    ClaudeCode,
    Codex,
    Opencode,
    /// The Claude Agent SDK (npm `@anthropic-ai/claude-agent-sdk`) through `lap-agent-sdk`, a
    /// small runner shipped with its image (`harness-images/claude-agent-sdk/`) that prints the
    /// SDK's messages as claude's stream-json. Message API only: no terminal UI.
    ClaudeAgentSdk,
}

/// `lap-agent-sdk` (harness-images/claude-agent-sdk/lap-agent-sdk.mjs), carried in the harness
/// so the claude-agent-sdk harness runs where only the SDK is installed (the local backend):
/// [`install_sdk_runner`].
pub const SDK_RUNNER: &str = include_str!("../../claude-agent-sdk/lap-agent-sdk.mjs");

/// Write [`SDK_RUNNER`] to `dir/lap-agent-sdk` (0755) and check that it loads the SDK
/// (`lap-agent-sdk --check`); the runner's path, or what to install.
pub async fn install_sdk_runner(dir: &std::path::Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let install = "npm install -g @anthropic-ai/claude-agent-sdk";
    if which("node").is_none() {
        return Err(format!(
            "the claude-agent-sdk harness needs Node.js (`node` on PATH) and the SDK: {install}"
        ));
    }
    let path = dir.join("lap-agent-sdk");
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(&path, SDK_RUNNER)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
    };
    write().map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let out = Command::new(&path)
        .arg("--check")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
    if out.status.success() {
        Ok(path)
    } else {
        Err(format!(
            "the Claude Agent SDK is not installed where the harness runs ({}); install it with `{install}`",
            tail(&String::from_utf8_lossy(&out.stderr))
        ))
    }
}

/// A message failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot start `{bin}`: {source}")]
    Spawn {
        bin: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the agent did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the turn was aborted")]
    Aborted,
    #[error("the agent failed: {0}")]
    Failed(String),
}

impl AgentKind {
    pub fn parse(id: &str) -> Option<Self> {
        Some(match id {
            "claude-code" => Self::ClaudeCode,
            "codex" => Self::Codex,
            "opencode" => Self::Opencode,
            "claude-agent-sdk" => Self::ClaudeAgentSdk,
            _ => return None,
        })
    }

    /// The CLI binary name.
    pub fn binary(self) -> &'static str {
        match self {
            Self::ClaudeCode => "claude",
            Self::ClaudeAgentSdk => "lap-agent-sdk",
            Self::Codex => "codex",
            Self::Opencode => "opencode",
        }
    }

    /// The npm package that provides the CLI.
    pub fn npm_package(self) -> &'static str {
        match self {
            Self::ClaudeCode => "@anthropic-ai/claude-code",
            Self::ClaudeAgentSdk => "@anthropic-ai/claude-agent-sdk",
            Self::Codex => "@openai/codex",
            Self::Opencode => "opencode-ai",
        }
    }

    /// Arguments for one message; `conversation` is the id from the previous answer.
    ///
    /// Permissions (the sandbox is the safety boundary, so inside it the agent acts without
    /// asking; nobody is there to answer a prompt):
    /// - claude, claude-agent-sdk: every tool → `--permission-mode bypassPermissions`; a `tools`
    ///   list → `--permission-mode dontAsk` with `--allowedTools` (the listed tools' Claude names)
    ///   and `--disallowedTools` (the others'), so an unlisted tool is refused, not asked about.
    /// - codex: every tool, or a list with `bash` → `--dangerously-bypass-approvals-and-sandbox`:
    ///   codex's own sandbox (Landlock/seccomp, bubblewrap) cannot be set up inside ours (no
    ///   nested user namespace), so `workspace-write` would make every command fail; approvals
    ///   `never` because no one can answer. A list without `bash` → `--sandbox read-only`: codex
    ///   has no per-tool switch, its commands and patches are then refused.
    /// - opencode: its `permission` configuration in `OPENCODE_CONFIG_CONTENT` ([`Self::env`]).
    pub fn args(self, text: &str, conversation: Option<&str>, s: &RunSettings<'_>) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        let (model, prompt) = (s.model, s.prompt);
        match self {
            Self::ClaudeCode | Self::ClaudeAgentSdk => {
                if self == Self::ClaudeCode {
                    a.extend(["-p", "--output-format", "stream-json", "--verbose"].map(String::from));
                }
                match s.tools {
                    None => a.extend(["--permission-mode", "bypassPermissions"].map(String::from)),
                    Some(tools) => {
                        let (allowed, denied) = claude_tool_lists(tools);
                        a.extend(["--permission-mode".to_owned(), "dontAsk".to_owned()]);
                        if !allowed.is_empty() {
                            a.extend(["--allowedTools".to_owned(), allowed]);
                        }
                        if !denied.is_empty() {
                            a.extend(["--disallowedTools".to_owned(), denied]);
                        }
                    }
                }
                if let Some(id) = conversation {
                    a.extend(["--resume".to_owned(), id.to_owned()]);
                }
                if let Some(m) = model {
                    a.extend(["--model".to_owned(), m.to_owned()]);
                }
                if let Some(p) = prompt {
                    a.extend(["--append-system-prompt".to_owned(), p.to_owned()]);
                }
                if !s.mcp.is_empty() {
                    a.push(format!("--mcp-config={}", claude_mcp_config(s.mcp)));
                }
                a.extend(["--".to_owned(), text.to_owned()]);
            }
            Self::Codex => {
                a.extend(["exec", "--json", "--skip-git-repo-check"].map(String::from));
                a.extend(codex_overrides(s));
                let full = s.tools.is_none_or(|t| t.iter().any(|x| x == "bash"));
                if full {
                    a.push("--dangerously-bypass-approvals-and-sandbox".to_owned());
                } else {
                    a.extend(["--sandbox", "read-only"].map(String::from));
                }
                if let Some(m) = model {
                    a.extend(["-m".to_owned(), m.to_owned()]);
                }
                if let Some(id) = conversation {
                    a.extend(["resume".to_owned(), id.to_owned()]);
                }
                let text = match (prompt, conversation) {
                    (Some(p), None) => format!("{p}\n\n{text}"),
                    _ => text.to_owned(),
                };
                // `--`: a message starting with `-` is still the message.
                a.extend(["--".to_owned(), text]);
            }
            Self::Opencode => {
                a.push("run".to_owned());
                if conversation.is_some() {
                    a.push("--continue".to_owned());
                }
                if let Some(m) = model {
                    a.extend(["-m".to_owned(), m.to_owned()]);
                }
                let text = match (prompt, conversation) {
                    (Some(p), None) => format!("{p}\n\n{text}"),
                    _ => text.to_owned(),
                };
                // `--`: a message starting with `-` is still the message.
                a.extend(["--".to_owned(), text]);
            }
        }
        a
    }

    /// Environment for one message (and for the TUI) beyond the harness's own: opencode's
    /// configuration, its permissions ([`opencode_permission`]), the agent's model declared under
    /// its provider (`provider.P.models.M = {}`: opencode refuses a model its catalogue
    /// (models.dev) does not list, as a model gateway's own names are; for a listed model the
    /// empty entry changes nothing, opencode merges it over the catalogue's) and its `mcp`
    /// servers (`{"type": "remote", "url"}`); for claude with MCP servers,
    /// `MCP_CONNECTION_NONBLOCKING=false`.
    pub fn env(self, s: &RunSettings<'_>) -> Vec<(String, String)> {
        match self {
            Self::Opencode => {
                let mut config = opencode_permission(s.tools);
                if let Some((provider, model)) = s.model.and_then(|m| m.split_once('/')) {
                    config["provider"] = serde_json::json!({ provider: { "models": { model: {} } } });
                }
                if !s.mcp.is_empty() {
                    let mcp: serde_json::Map<String, serde_json::Value> = s
                        .mcp
                        .iter()
                        .map(|m| {
                            let server = serde_json::json!({"type": "remote", "url": m.url, "enabled": true});
                            (m.name.clone(), server)
                        })
                        .collect();
                    config["mcp"] = serde_json::Value::Object(mcp);
                }
                vec![("OPENCODE_CONFIG_CONTENT".to_owned(), config.to_string())]
            }
            // A turn waits for the MCP servers to connect, so their tools are there from its
            // first request (claude 2.1 otherwise starts with them "still connecting").
            Self::ClaudeCode | Self::ClaudeAgentSdk if !s.mcp.is_empty() => {
                vec![("MCP_CONNECTION_NONBLOCKING".to_owned(), "false".to_owned())]
            }
            _ => Vec::new(),
        }
    }

    /// Arguments for the interactive TUI the terminal runs; `None` when the harness has none
    /// (claude-agent-sdk is driven through its message API only).
    /// The agent's MCP servers go in too (claude `--mcp-config`, codex `-c`; opencode reads
    /// them from `OPENCODE_CONFIG_CONTENT`, [`Self::env`]), and codex's model provider.
    pub fn tui_args(self, s: &RunSettings<'_>) -> Option<Vec<String>> {
        let (model, prompt, mcp) = (s.model, s.prompt, s.mcp);
        let mut a: Vec<String> = Vec::new();
        match self {
            Self::ClaudeAgentSdk => return None,
            Self::ClaudeCode => {
                if let Some(m) = model {
                    a.extend(["--model".to_owned(), m.to_owned()]);
                }
                if let Some(p) = prompt {
                    a.extend(["--append-system-prompt".to_owned(), p.to_owned()]);
                }
                if !mcp.is_empty() {
                    a.push(format!("--mcp-config={}", claude_mcp_config(mcp)));
                }
            }
            Self::Codex | Self::Opencode => {
                if self == Self::Codex {
                    a.extend(codex_overrides(s));
                }
                if let Some(m) = model {
                    a.extend(["-m".to_owned(), m.to_owned()]);
                }
            }
        }
        Some(a)
    }

    /// Read a finished run's stdout: the reply text and the conversation id to resume.
    pub fn parse_output(self, stdout: &str) -> Result<Reply, String> {
        match self {
            Self::ClaudeCode | Self::ClaudeAgentSdk => parse_claude(stdout),
            Self::Codex => parse_codex(stdout),
            Self::Opencode => Ok(Reply {
                text: stdout.trim().to_owned(),
                conversation: Some("continue".to_owned()),
            }),
        }
    }
}

/// A CLI's answer to one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub text: String,
    /// What to pass to resume the conversation next time.
    pub conversation: Option<String>,
}

/// `claude -p --output-format stream-json --verbose`: JSON lines; the `result` line carries the
/// final text and `session_id`; `is_error` marks failures.
pub fn parse_claude(stdout: &str) -> Result<Reply, String> {
    let mut session = None;
    let mut texts = Vec::new();
    for line in stdout.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if let Some(id) = v.get("session_id").and_then(|s| s.as_str()) {
            session = Some(id.to_owned());
        }
        match v.get("type").and_then(|t| t.as_str()) {
            Some("assistant") => {
                if let Some(blocks) = v.pointer("/message/content").and_then(|c| c.as_array()) {
                    for b in blocks {
                        if b.get("type").and_then(|t| t.as_str()) == Some("text") {
                            if let Some(t) = b.get("text").and_then(|t| t.as_str()) {
                                texts.push(t.to_owned());
                            }
                        }
                    }
                }
            }
            Some("result") => {
                let result = v.get("result").and_then(|r| r.as_str()).unwrap_or_default().to_owned();
                let is_error = v.get("is_error").and_then(|e| e.as_bool()).unwrap_or(false)
                    || v.get("subtype")
                        .and_then(|s| s.as_str())
                        .is_some_and(|s| s != "success");
                if is_error {
                    return Err(if result.is_empty() { line.to_owned() } else { result });
                }
                let text = if result.is_empty() { texts.join("\n") } else { result };
                return Ok(Reply {
                    text,
                    conversation: session,
                });
            }
            _ => {}
        }
    }
    if texts.is_empty() {
        Err("the claude CLI produced no result".to_owned())
    } else {
        Ok(Reply {
            text: texts.join("\n"),
            conversation: session,
        })
    }
}

/// `codex exec --json`: JSON lines. Current format: `thread.started {thread_id}`,
/// `item.completed {item:{type:"agent_message",text}}`, `turn.failed`/`error`. Older format:
/// `{msg:{type:"session_configured",session_id}}`, `{msg:{type:"agent_message",message}}`.
pub fn parse_codex(stdout: &str) -> Result<Reply, String> {
    let mut thread = None;
    let mut texts = Vec::new();
    let mut error = None;
    for line in stdout.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let msg = v.get("msg").unwrap_or(&v);
        let kind = msg.get("type").and_then(|t| t.as_str()).unwrap_or_default();
        match kind {
            "thread.started" => thread = msg.get("thread_id").and_then(|t| t.as_str()).map(str::to_owned),
            "session_configured" => thread = msg.get("session_id").and_then(|t| t.as_str()).map(str::to_owned),
            "item.completed" => {
                let item = &msg["item"];
                let it = item
                    .get("type")
                    .or_else(|| item.get("item_type"))
                    .and_then(|t| t.as_str());
                if it == Some("agent_message") || it == Some("assistant_message") {
                    if let Some(t) = item.get("text").and_then(|t| t.as_str()) {
                        texts.push(t.to_owned());
                    }
                }
            }
            "agent_message" => {
                if let Some(t) = msg.get("message").and_then(|t| t.as_str()) {
                    texts.push(t.to_owned());
                }
            }
            "turn.failed" | "error" | "stream_error" => {
                let e = msg
                    .pointer("/error/message")
                    .or_else(|| msg.get("message"))
                    .and_then(|m| m.as_str());
                error = Some(e.unwrap_or(line).to_owned());
            }
            _ => {}
        }
    }
    match (texts.is_empty(), error) {
        (true, Some(e)) => Err(e),
        (true, None) => Err("the codex CLI produced no answer".to_owned()),
        (false, _) => Ok(Reply {
            text: texts.join("\n"),
            conversation: thread,
        }),
    }
}

/// Find `bin` on PATH.
pub fn which(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(bin)).find(|p| p.is_file())
}

/// Run the CLI once and read its answer. Each stdout line (for claude and codex, one JSON
/// event) is also sent to `events` as it arrives, when given.
pub async fn run_once(
    kind: AgentKind,
    bin: &std::path::Path,
    text: &str,
    conversation: Option<&str>,
    settings: &RunSettings<'_>,
    events: Option<tokio::sync::mpsc::UnboundedSender<String>>,
    abort: Option<tokio::sync::watch::Receiver<u64>>,
) -> Result<Reply, AgentError> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
    let spawn_err = |source| AgentError::Spawn {
        bin: bin.display().to_string(),
        source,
    };
    let mut cmd = Command::new(bin);
    cmd.args(kind.args(text, conversation, settings))
        .envs(kind.env(settings))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: an abort or a timeout ends the CLI and every command it started.
        .process_group(0)
        .kill_on_drop(true);
    // Keep the CLIs quiet: no auto-update, telemetry or other non-essential traffic.
    cmd.env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CI", "1");
    let mut child = cmd.spawn().map_err(spawn_err)?;
    let stdout_pipe = child.stdout.take();
    let stderr_pipe = child.stderr.take();
    let pid = child.id();
    let run = async {
        let stderr_task = tokio::spawn(async move {
            let mut buf = Vec::new();
            if let Some(mut e) = stderr_pipe {
                let _ = e.read_to_end(&mut buf).await;
            }
            String::from_utf8_lossy(&buf).into_owned()
        });
        let mut stdout = String::new();
        if let Some(out) = stdout_pipe {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(tx) = &events {
                    let _ = tx.send(line.clone());
                }
                stdout.push_str(&line);
                stdout.push('\n');
            }
        }
        let status = child.wait().await.map_err(spawn_err)?;
        let stderr = stderr_task.await.unwrap_or_default();
        Ok::<_, AgentError>((status, stdout, stderr))
    };
    let aborted = async {
        match abort {
            Some(mut rx) => {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    };
    let outcome = tokio::select! {
        r = tokio::time::timeout(MESSAGE_TIMEOUT, run) => r.map_err(|_| AgentError::Timeout(MESSAGE_TIMEOUT)),
        () = aborted => Err(AgentError::Aborted),
    };
    if outcome.is_err() {
        if let Some(root) = pid.and_then(|p| i32::try_from(p).ok()) {
            kill_tree(root);
        }
        let _ = child.wait().await;
    }
    let (status, stdout, stderr) = outcome??;
    match kind.parse_output(&stdout) {
        Ok(reply) if status.success() || !reply.text.is_empty() => Ok(reply),
        Ok(_) => Err(AgentError::Failed(tail(&stderr))),
        Err(e) => {
            let detail = if stderr.trim().is_empty() {
                e
            } else {
                format!("{e}; stderr: {}", tail(&stderr))
            };
            Err(AgentError::Failed(detail))
        }
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

/// Kill the CLI `root` and every process it started, wherever they went: its own process group,
/// and each descendant by parent pid (a tool may start its commands in a new session, as Claude
/// Code's `Bash` does, which the group kill misses). Each round stops what it finds (a stopped
/// process cannot fork) until a round finds nothing new, then kills them all.
fn kill_tree(root: i32) {
    use rustix::process::{kill_process, kill_process_group, Pid, Signal};
    let mut found: Vec<i32> = vec![root];
    for _ in 0..16 {
        let mut new = false;
        for p in descendants(&found) {
            if !found.contains(&p) {
                found.push(p);
                new = true;
            }
        }
        for p in &found {
            if let Some(pid) = Pid::from_raw(*p) {
                let _ = kill_process(pid, Signal::STOP);
            }
        }
        if !new {
            break;
        }
    }
    if let Some(pgid) = Pid::from_raw(root) {
        let _ = kill_process_group(pgid, Signal::KILL);
    }
    for p in &found {
        if let Some(pid) = Pid::from_raw(*p) {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
}

/// The processes whose parent (by `/proc/PID/stat`, field 4) is one of `roots` or descends from
/// one; empty where `/proc` cannot be read.
fn descendants(roots: &[i32]) -> Vec<i32> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces and parentheses; it ends at the last `)`.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((pid, ppid));
        }
    }
    let mut out: Vec<i32> = Vec::new();
    let mut frontier: Vec<i32> = roots.to_vec();
    while let Some(p) = frontier.pop() {
        for &(child, ppid) in &parent_of {
            if ppid == p && !out.contains(&child) && !roots.contains(&child) {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const ALL: RunSettings<'static> = RunSettings {
        model: None,
        prompt: None,
        tools: None,
        mcp: &[],
        openai_base_url: None,
    };

    #[test]
    fn claude_args_resume_and_model() {
        let a = AgentKind::ClaudeCode.args("hi", None, &ALL);
        assert_eq!(
            a,
            [
                "-p",
                "--output-format",
                "stream-json",
                "--verbose",
                "--permission-mode",
                "bypassPermissions",
                "--",
                "hi"
            ]
        );
        let a = AgentKind::ClaudeCode.args("--help me", None, &ALL);
        assert_eq!(a[a.len() - 2..], ["--", "--help me"]);
        let s = RunSettings {
            model: Some("m"),
            prompt: Some("be nice"),
            ..ALL
        };
        let a = AgentKind::ClaudeCode.args("hi", Some("abc"), &s);
        assert!(a.windows(2).any(|w| w == ["--resume", "abc"]));
        assert!(a.windows(2).any(|w| w == ["--model", "m"]));
        assert!(a.windows(2).any(|w| w == ["--append-system-prompt", "be nice"]));
    }

    /// The agent's MCP servers reach each CLI in its own configuration.
    #[test]
    fn mcp_servers_reach_every_cli() {
        let mcp = parse_mcp_servers(Some(r#"[{"name":"docs","url":"https://mcp.example.com/mcp"}]"#)).unwrap();
        let s = RunSettings { mcp: &mcp, ..ALL };
        let want = r#"--mcp-config={"mcpServers":{"docs":{"type":"http","url":"https://mcp.example.com/mcp"}}}"#;
        for kind in [AgentKind::ClaudeCode, AgentKind::ClaudeAgentSdk] {
            let a = kind.args("hi", None, &s);
            let at = a.iter().position(|x| x == want).expect("--mcp-config");
            assert_eq!(a[at + 1..], ["--", "hi"], "{a:?}");
        }
        let a = AgentKind::Codex.args("hi", None, &s);
        assert!(
            a.windows(2)
                .any(|w| w == ["-c", r#"mcp_servers.docs.url="https://mcp.example.com/mcp""#]),
            "{a:?}"
        );
        let env = AgentKind::Opencode.env(&s);
        let config: serde_json::Value = serde_json::from_str(&env[0].1).unwrap();
        assert_eq!(
            config["mcp"]["docs"],
            serde_json::json!({"type": "remote", "url": "https://mcp.example.com/mcp", "enabled": true})
        );
        assert_eq!(config["permission"], "allow", "the permissions stay");
        assert_eq!(parse_mcp_servers(None).unwrap(), vec![]);
        assert!(parse_mcp_servers(Some("{"))
            .unwrap_err()
            .contains("LAP_AGENT_MCP_SERVERS"));
        assert!(AgentKind::ClaudeCode.tui_args(&s).unwrap().contains(&want.to_owned()));
    }

    #[test]
    fn claude_tools_allow_the_listed_and_refuse_the_rest() {
        let tools = vec!["read".to_owned(), "bash".to_owned()];
        let s = RunSettings {
            tools: Some(&tools),
            ..ALL
        };
        for kind in [AgentKind::ClaudeCode, AgentKind::ClaudeAgentSdk] {
            let a = kind.args("hi", None, &s);
            assert!(a.windows(2).any(|w| w == ["--permission-mode", "dontAsk"]), "{a:?}");
            assert!(
                a.windows(2)
                    .any(|w| w == ["--allowedTools", "Bash,BashOutput,KillShell,Read,LS"]),
                "{a:?}"
            );
            let denied = a.iter().skip_while(|x| *x != "--disallowedTools").nth(1).unwrap();
            assert!(
                denied.contains("Write") && denied.contains("Edit") && !denied.contains("Bash"),
                "{denied}"
            );
        }
        // No tool at all: nothing allowed, everything refused.
        let none: Vec<String> = Vec::new();
        let a = AgentKind::ClaudeCode.args(
            "hi",
            None,
            &RunSettings {
                tools: Some(&none),
                ..ALL
            },
        );
        assert!(!a.iter().any(|x| x == "--allowedTools"), "{a:?}");
        assert!(a.iter().any(|x| x == "--disallowedTools"), "{a:?}");
    }

    #[test]
    fn tools_are_parsed_and_checked() {
        assert_eq!(parse_tools(None).unwrap(), None);
        assert_eq!(parse_tools(Some("")).unwrap(), Some(vec![]));
        assert_eq!(
            parse_tools(Some("bash, edit,bash")).unwrap(),
            Some(vec!["bash".to_owned(), "edit".to_owned()])
        );
        let e = parse_tools(Some("bash,rm")).unwrap_err();
        assert!(e.contains("`rm`") && e.contains("LAP_AGENT_TOOLS"), "{e}");
    }

    #[test]
    fn opencode_permissions() {
        assert_eq!(opencode_permission(None), serde_json::json!({"permission": "allow"}));
        let tools = vec!["write".to_owned(), "read".to_owned()];
        assert_eq!(
            opencode_permission(Some(&tools)),
            serde_json::json!({"permission": {"*": "deny", "edit": "allow", "read": "allow", "list": "allow"}})
        );
        let env = AgentKind::Opencode.env(&ALL);
        assert_eq!(env[0].0, "OPENCODE_CONFIG_CONTENT");
        assert!(AgentKind::ClaudeCode.env(&ALL).is_empty());
    }

    /// opencode is told the agent's model exists under its provider (a gateway's own model name
    /// is in no catalogue); a model without a provider adds nothing.
    #[test]
    fn opencode_declares_the_model_under_its_provider() {
        let config = |model| {
            let env = AgentKind::Opencode.env(&RunSettings { model, ..ALL });
            serde_json::from_str::<serde_json::Value>(&env[0].1).unwrap()
        };
        let c = config(Some("anthropic/lap-gateway-model"));
        assert_eq!(
            c["provider"],
            serde_json::json!({"anthropic": {"models": {"lap-gateway-model": {}}}})
        );
        assert_eq!(c["permission"], "allow", "the permissions stay");
        assert_eq!(config(Some("bare-model")).get("provider"), None);
        assert_eq!(config(None).get("provider"), None);
    }

    /// With `OPENAI_BASE_URL`, codex runs (messages and TUI) get a provider at that URL that
    /// reads its key from `OPENAI_API_KEY` and speaks the Responses API; without it, none.
    #[test]
    fn codex_is_pointed_at_openai_base_url() {
        let s = RunSettings {
            openai_base_url: Some("http://127.0.0.1:4000/v1"),
            ..ALL
        };
        let want = [
            r#"model_provider="lap-openai""#,
            r#"model_providers.lap-openai.name="OpenAI API at OPENAI_BASE_URL""#,
            r#"model_providers.lap-openai.base_url="http://127.0.0.1:4000/v1""#,
            r#"model_providers.lap-openai.env_key="OPENAI_API_KEY""#,
            r#"model_providers.lap-openai.wire_api="responses""#,
        ];
        for a in [
            AgentKind::Codex.args("hi", None, &s),
            AgentKind::Codex.tui_args(&s).unwrap(),
        ] {
            for kv in want {
                assert!(a.windows(2).any(|w| w == ["-c", kv]), "{kv} in {a:?}");
            }
        }
        assert!(!AgentKind::Codex
            .args("hi", None, &ALL)
            .iter()
            .any(|x| x.contains("model_provider")));
        for kind in [AgentKind::ClaudeCode, AgentKind::Opencode] {
            assert!(!kind.args("hi", None, &s).iter().any(|x| x.contains("model_provider")));
        }
    }

    #[test]
    fn codex_and_opencode_args() {
        assert_eq!(
            AgentKind::Codex.args("hi", None, &ALL),
            [
                "exec",
                "--json",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "--",
                "hi"
            ]
        );
        assert_eq!(
            AgentKind::Codex.args("hi", Some("t1"), &ALL),
            [
                "exec",
                "--json",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "resume",
                "t1",
                "--",
                "hi"
            ]
        );
        let read_only = vec!["read".to_owned()];
        let a = AgentKind::Codex.args(
            "hi",
            None,
            &RunSettings {
                tools: Some(&read_only),
                ..ALL
            },
        );
        assert!(a.windows(2).any(|w| w == ["--sandbox", "read-only"]), "{a:?}");
        assert!(!a.iter().any(|x| x.starts_with("--dangerously")), "{a:?}");
        assert_eq!(AgentKind::Opencode.args("hi", None, &ALL), ["run", "--", "hi"]);
        assert_eq!(
            AgentKind::Opencode.args("hi", Some("continue"), &ALL),
            ["run", "--continue", "--", "hi"]
        );
    }

    #[test]
    fn claude_stream_json() {
        let out = r#"{"type":"system","subtype":"init","session_id":"s-1"}
{"type":"assistant","message":{"content":[{"type":"text","text":"Hel"}]},"session_id":"s-1"}
{"type":"result","subtype":"success","is_error":false,"result":"Hello!","session_id":"s-1"}"#;
        assert_eq!(
            parse_claude(out).unwrap(),
            Reply {
                text: "Hello!".into(),
                conversation: Some("s-1".into())
            }
        );
        let err = r#"{"type":"result","subtype":"success","is_error":true,"result":"Invalid API key"}"#;
        assert_eq!(parse_claude(err).unwrap_err(), "Invalid API key");
        assert!(parse_claude("not json").is_err());
    }

    #[test]
    fn codex_json() {
        let out = r#"{"type":"thread.started","thread_id":"th-9"}
{"type":"item.completed","item":{"id":"i","type":"reasoning","text":"hmm"}}
{"type":"item.completed","item":{"id":"j","type":"agent_message","text":"Done."}}
{"type":"turn.completed","usage":{}}"#;
        assert_eq!(
            parse_codex(out).unwrap(),
            Reply {
                text: "Done.".into(),
                conversation: Some("th-9".into())
            }
        );
        let old = r#"{"id":"0","msg":{"type":"session_configured","session_id":"old-1"}}
{"id":"1","msg":{"type":"agent_message","message":"Hi"}}"#;
        assert_eq!(
            parse_codex(old).unwrap(),
            Reply {
                text: "Hi".into(),
                conversation: Some("old-1".into())
            }
        );
        let failed = r#"{"type":"turn.failed","error":{"message":"401 Unauthorized"}}"#;
        assert_eq!(parse_codex(failed).unwrap_err(), "401 Unauthorized");
    }

    #[test]
    fn tui_args() {
        let mp = RunSettings {
            model: Some("m"),
            prompt: Some("p"),
            ..ALL
        };
        assert_eq!(AgentKind::ClaudeCode.tui_args(&ALL), Some(vec![]));
        assert_eq!(
            AgentKind::ClaudeCode.tui_args(&mp).unwrap(),
            ["--model", "m", "--append-system-prompt", "p"]
        );
        assert_eq!(AgentKind::Codex.tui_args(&mp).unwrap(), ["-m", "m"]);
        assert_eq!(AgentKind::ClaudeAgentSdk.tui_args(&ALL), None);
    }

    #[test]
    fn kinds() {
        let sdk = AgentKind::parse("claude-agent-sdk").unwrap();
        assert_eq!(sdk.binary(), "lap-agent-sdk");
        assert_eq!(sdk.npm_package(), "@anthropic-ai/claude-agent-sdk");
        assert_eq!(
            sdk.args("hi", Some("s"), &ALL),
            ["--permission-mode", "bypassPermissions", "--resume", "s", "--", "hi"]
        );
        assert_eq!(AgentKind::parse("codex").unwrap().npm_package(), "@openai/codex");
        assert!(AgentKind::parse("vim").is_none());
    }
}
