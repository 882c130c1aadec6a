//! REST wire types (SPEC §3.2) and the plain records the store keeps.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a write-only value reads back as.
pub const REDACTED: &str = "<redacted>";

/// The agent CLIs a harness can run.
pub const HARNESS_IDS: &[&str] = &["claude-code", "codex", "opencode", "claude-agent-sdk"];

/// The names an agent's `tools[]` may list, the same for every harness (lap-harness maps each to
/// the CLI's own tools and permission settings).
pub const TOOL_NAMES: &[&str] = &["bash", "read", "edit", "write", "glob", "grep", "webfetch", "websearch"];

/// An agent as stored (secret values in clear only in memory).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AgentSpec {
    pub name: String,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub prompt: Option<String>,
    /// Absent: `opencode`, as in LAP.
    #[serde(default = "default_harness_id")]
    pub harness_id: String,
    #[serde(default)]
    pub repo_url: Option<String>,
    #[serde(default)]
    pub branch: Option<String>,
    #[serde(default)]
    pub allow_out: Vec<String>,
    #[serde(default)]
    pub deny_out: Vec<String>,
    #[serde(default)]
    pub env_var_hosts: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub secrets: Vec<String>,
    /// The tools the agent may use, from [`TOOL_NAMES`]; `None` (absent or `null`): every tool.
    /// `[]`: none.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// A shell command the harness runs in the workspace at bring-up, after the clone (phase
    /// `installing_deps`; a non-zero exit fails the session with its last lines).
    #[serde(default)]
    pub requirements: Option<String>,
    /// Plain, non-secret variables for the harness (a base URL, feature flags): stored and shown
    /// as they are, the same reserved names as `env_vars` refused.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Remote MCP servers (streamable HTTP) the agent's CLI connects to, written into each CLI's
    /// own MCP configuration; their hosts are added to `allow_out` when it lists hosts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<McpServer>,
    /// Kubernetes: requests and limits of the harness container (defaults from
    /// `LAP_K8S_HARNESS_REQUESTS` / `LAP_K8S_HARNESS_LIMITS`); ignored by the local backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// Kubernetes: the pods' `runtimeClassName` (gvisor, kata), instead of
    /// `LAP_K8S_RUNTIME_CLASS`; ignored by the local backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,
}

/// One of an agent's `mcp_servers`: `{"name": "docs", "url": "https://mcp.example.com/mcp"}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// `[A-Za-z0-9_-]`, 1 to 64 characters, unique in the agent (the CLI shows its tools as
    /// `mcp__NAME__TOOL`).
    pub name: String,
    /// `http://` or `https://`, with a host.
    pub url: String,
}

/// A field that is present (`null` included) is `Some`: `null` → `Some(None)`.
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

fn default_harness_id() -> String {
    "opencode".to_owned()
}

/// An agent's `resources`: Kubernetes quantities by resource name (`cpu`, `memory`,
/// `ephemeral-storage`), e.g. `{"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
}

/// `POST /agents` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateAgent {
    #[serde(flatten)]
    pub spec: AgentSpec,
    #[serde(default)]
    pub env_vars: BTreeMap<String, String>,
}

/// `PATCH /agents/{id}` body: every field optional; an `env_vars` value of `"<redacted>"`
/// keeps the stored value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchAgent {
    pub name: Option<String>,
    pub model: Option<Option<String>>,
    pub prompt: Option<Option<String>>,
    pub harness_id: Option<String>,
    pub repo_url: Option<Option<String>>,
    pub branch: Option<Option<String>>,
    pub allow_out: Option<Vec<String>>,
    pub deny_out: Option<Vec<String>>,
    pub env_vars: Option<BTreeMap<String, String>>,
    pub env_var_hosts: Option<BTreeMap<String, Vec<String>>>,
    pub secrets: Option<Vec<String>>,
    /// `null` clears (every tool), absent keeps.
    #[serde(default, deserialize_with = "present")]
    pub tools: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "present")]
    pub requirements: Option<Option<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub mcp_servers: Option<Vec<McpServer>>,
    pub resources: Option<Option<Resources>>,
    pub runtime_class: Option<Option<String>>,
}

/// An agent in a response: `env_vars` values are `"<redacted>"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentView {
    pub id: String,
    #[serde(flatten)]
    pub spec: AgentSpec,
    pub env_vars: BTreeMap<String, String>,
    pub created_at: String,
    pub updated_at: String,
}

/// A stored agent with its decrypted agent-level secrets.
#[derive(Debug, Clone)]
pub struct Agent {
    pub id: String,
    pub spec: AgentSpec,
    pub env_vars: BTreeMap<String, String>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Agent {
    pub fn view(&self) -> AgentView {
        AgentView {
            id: self.id.clone(),
            spec: self.spec.clone(),
            env_vars: self.env_vars.keys().map(|k| (k.clone(), REDACTED.to_owned())).collect(),
            created_at: rfc3339(self.created_at),
            updated_at: rfc3339(self.updated_at),
        }
    }
}

/// A registry secret (`/api/v1/secrets`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretInput {
    #[serde(default)]
    pub name: Option<String>,
    pub value: String,
    pub hosts: Vec<String>,
    #[serde(default)]
    pub locations: Vec<String>,
}

/// A stored registry secret, value decrypted.
#[derive(Clone)]
pub struct RegistrySecret {
    pub name: String,
    pub value: String,
    pub hosts: Vec<String>,
    pub locations: Vec<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl std::fmt::Debug for RegistrySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrySecret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// A registry secret in a response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SecretView {
    pub name: String,
    pub value: String,
    pub hosts: Vec<String>,
    pub locations: Vec<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl RegistrySecret {
    pub fn view(&self) -> SecretView {
        SecretView {
            name: self.name.clone(),
            value: REDACTED.to_owned(),
            hosts: self.hosts.clone(),
            locations: self.locations.clone(),
            created_at: rfc3339(self.created_at),
            updated_at: rfc3339(self.updated_at),
        }
    }
}

/// Session lifecycle (SPEC §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Creating,
    Ready,
    Dead,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "creating",
            Self::Ready => "ready",
            Self::Dead => "dead",
            Self::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "creating" => Self::Creating,
            "ready" => Self::Ready,
            "dead" => Self::Dead,
            "failed" => Self::Failed,
            _ => return None,
        })
    }

    /// `dead` and `failed` never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Dead | Self::Failed)
    }
}

/// A stored session.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub agent_id: String,
    pub title: Option<String>,
    pub status: Status,
    pub phase: String,
    pub failure_reason: Option<String>,
    /// `sha256:<hex>` of the session's terminal token ([`crate::crypto::Cipher::tty_token`]).
    pub tty_token_hash: String,
    /// What isolates its harness (`bubblewrap`, `none`, `pod`), from the backend that made it.
    pub isolation: Option<String>,
    /// Encrypted [`crate::backend::SandboxHandle`] once the sandbox exists.
    pub sandbox: Option<String>,
    pub created_at: i64,
    pub last_seen_at: i64,
    pub stopped_at: Option<i64>,
    pub idle_timeout_ms: i64,
}

/// A session in a response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionView {
    pub id: String,
    pub agent_id: String,
    pub title: Option<String>,
    pub status: Status,
    pub phase: String,
    pub failure_reason: Option<String>,
    pub tty_url: String,
    pub tty_token: String,
    /// `bubblewrap`, `pod`, or `none` (a development server without isolation: the agent ran
    /// as the server's user, with the platform's files in reach).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    pub created_at: String,
    pub last_seen_at: String,
    pub stopped_at: Option<String>,
    pub idle_timeout_ms: i64,
}

impl Session {
    /// The session as the API shows it; `tty_token` is its terminal token (derived, not stored).
    pub fn view(&self, tty_token: String) -> SessionView {
        SessionView {
            id: self.id.clone(),
            agent_id: self.agent_id.clone(),
            title: self.title.clone(),
            status: self.status,
            phase: self.phase.clone(),
            failure_reason: self.failure_reason.clone(),
            tty_url: format!("/api/v1/managed_agents/sessions/{}/tty", self.id),
            tty_token,
            isolation: self.isolation.clone(),
            created_at: rfc3339(self.created_at),
            last_seen_at: rfc3339(self.last_seen_at),
            stopped_at: self.stopped_at.map(rfc3339),
            idle_timeout_ms: self.idle_timeout_ms,
        }
    }
}

/// `POST /agents/{id}/session` body.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    pub title: Option<String>,
    pub initial_prompt: Option<String>,
    #[serde(default)]
    pub env_vars: BTreeMap<String, String>,
    #[serde(default)]
    pub env_var_hosts: BTreeMap<String, Vec<String>>,
}

/// `POST /sessions/{id}/message` (and `message_stream`) body: `{"text": "…"}`, or
/// `{"parts": [{"type": "text", "text": "…"}, …]}` as LAP sends it (the parts' texts joined by a
/// blank line). Exactly one of the two.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<Vec<MessagePart>>,
}

/// One part of a message: `{"type": "text", "text": "…"}` (the only type a harness takes).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MessagePart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl MessageInput {
    /// The text to send, or what is wrong, naming the field (`parts[1].type: …`).
    pub fn into_text(self) -> Result<String, String> {
        match (self.text, self.parts) {
            (Some(t), None) => Ok(t),
            (None, Some(parts)) => {
                if parts.is_empty() {
                    return Err("parts: must hold at least one part".into());
                }
                let mut texts = Vec::with_capacity(parts.len());
                for (i, p) in parts.into_iter().enumerate() {
                    if p.kind != "text" {
                        return Err(format!("parts[{i}].type: `{}` is not supported; use \"text\"", p.kind));
                    }
                    texts.push(p.text.ok_or_else(|| format!("parts[{i}].text: missing"))?);
                }
                Ok(texts.join("\n\n"))
            }
            (Some(_), Some(_)) => Err("text, parts: give one of them, not both".into()),
            (None, None) => Err("text: missing (or give parts)".into()),
        }
    }
}

/// A paginated list.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Page<T> {
    pub data: Vec<T>,
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
}

/// `limit`/`offset` query parameters.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PageQuery {
    pub limit: Option<i64>,
    pub offset: Option<i64>,
    pub agent_id: Option<String>,
}

/// Default and maximum page sizes.
pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 200;

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// RFC 3339 (UTC, milliseconds) for epoch milliseconds.
pub fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86400);
    let rem = secs.rem_euclid(86400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn message_text_or_parts() {
        let m = |v: serde_json::Value| {
            serde_json::from_value::<MessageInput>(v)
                .expect("a message")
                .into_text()
        };
        assert_eq!(m(serde_json::json!({"text": "hi"})).expect("text"), "hi");
        assert_eq!(
            m(serde_json::json!({"parts": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}))
                .expect("text"),
            "a\n\nb"
        );
        assert!(m(serde_json::json!({"parts": [{"type": "image"}]}))
            .expect_err("refused")
            .starts_with("parts[0].type"));
        assert!(m(serde_json::json!({"parts": [{"type": "text"}]}))
            .expect_err("refused")
            .starts_with("parts[0].text"));
        assert!(m(serde_json::json!({"parts": []}))
            .expect_err("refused")
            .starts_with("parts:"));
        assert!(m(serde_json::json!({"text": "a", "parts": []}))
            .expect_err("refused")
            .contains("not both"));
        assert!(m(serde_json::json!({})).expect_err("refused").starts_with("text:"));
    }

    #[test]
    fn status_round_trip() {
        for s in [Status::Creating, Status::Ready, Status::Dead, Status::Failed] {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert!(Status::Dead.is_terminal() && !Status::Ready.is_terminal());
    }
}
