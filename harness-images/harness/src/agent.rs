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
    pub fn args(
        self,
        text: &str,
        conversation: Option<&str>,
        model: Option<&str>,
        prompt: Option<&str>,
    ) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        match self {
            Self::ClaudeCode | Self::ClaudeAgentSdk => {
                if self == Self::ClaudeCode {
                    a.extend(["-p", "--output-format", "stream-json", "--verbose"].map(String::from));
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
                a.extend(["--".to_owned(), text.to_owned()]);
            }
            Self::Codex => {
                a.extend(["exec", "--json", "--skip-git-repo-check"].map(String::from));
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

    /// Arguments for the interactive TUI the terminal runs; `None` when the harness has none
    /// (claude-agent-sdk is driven through its message API only).
    pub fn tui_args(self, model: Option<&str>, prompt: Option<&str>) -> Option<Vec<String>> {
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
            }
            Self::Codex | Self::Opencode => {
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
    model: Option<&str>,
    prompt: Option<&str>,
    events: Option<tokio::sync::mpsc::UnboundedSender<String>>,
) -> Result<Reply, AgentError> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
    let spawn_err = |source| AgentError::Spawn {
        bin: bin.display().to_string(),
        source,
    };
    let mut cmd = Command::new(bin);
    cmd.args(kind.args(text, conversation, model, prompt))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // Keep the CLIs quiet: no auto-update, telemetry or other non-essential traffic.
    cmd.env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CI", "1");
    let mut child = cmd.spawn().map_err(spawn_err)?;
    let stdout_pipe = child.stdout.take();
    let stderr_pipe = child.stderr.take();
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
    let (status, stdout, stderr) = tokio::time::timeout(MESSAGE_TIMEOUT, run)
        .await
        .map_err(|_| AgentError::Timeout(MESSAGE_TIMEOUT))??;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn claude_args_resume_and_model() {
        let a = AgentKind::ClaudeCode.args("hi", None, None, None);
        assert_eq!(a, ["-p", "--output-format", "stream-json", "--verbose", "--", "hi"]);
        let a = AgentKind::ClaudeCode.args("--help me", None, None, None);
        assert_eq!(a[a.len() - 2..], ["--", "--help me"]);
        let a = AgentKind::ClaudeCode.args("hi", Some("abc"), Some("m"), Some("be nice"));
        assert!(a.windows(2).any(|w| w == ["--resume", "abc"]));
        assert!(a.windows(2).any(|w| w == ["--model", "m"]));
        assert!(a.windows(2).any(|w| w == ["--append-system-prompt", "be nice"]));
    }

    #[test]
    fn codex_and_opencode_args() {
        assert_eq!(
            AgentKind::Codex.args("hi", None, None, None),
            ["exec", "--json", "--skip-git-repo-check", "--", "hi"]
        );
        assert_eq!(
            AgentKind::Codex.args("hi", Some("t1"), None, None),
            ["exec", "--json", "--skip-git-repo-check", "resume", "t1", "--", "hi"]
        );
        assert_eq!(AgentKind::Opencode.args("hi", None, None, None), ["run", "--", "hi"]);
        assert_eq!(
            AgentKind::Opencode.args("hi", Some("continue"), None, None),
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
        assert_eq!(AgentKind::ClaudeCode.tui_args(None, None), Some(vec![]));
        assert_eq!(
            AgentKind::ClaudeCode.tui_args(Some("m"), Some("p")).unwrap(),
            ["--model", "m", "--append-system-prompt", "p"]
        );
        assert_eq!(AgentKind::Codex.tui_args(Some("m"), Some("p")).unwrap(), ["-m", "m"]);
        assert_eq!(AgentKind::ClaudeAgentSdk.tui_args(None, None), None);
    }

    #[test]
    fn kinds() {
        let sdk = AgentKind::parse("claude-agent-sdk").unwrap();
        assert_eq!(sdk.binary(), "lap-agent-sdk");
        assert_eq!(sdk.npm_package(), "@anthropic-ai/claude-agent-sdk");
        assert_eq!(sdk.args("hi", Some("s"), None, None), ["--resume", "s", "--", "hi"]);
        assert_eq!(AgentKind::parse("codex").unwrap().npm_package(), "@openai/codex");
        assert!(AgentKind::parse("vim").is_none());
    }
}
