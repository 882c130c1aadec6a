//! Sandbox backends (SPEC §3.4): one trait, so the API and the reconciler never know which.
//!
//! [`SandboxSpec`] is everything a sandbox needs (the sidecar's secrets with their real values,
//! the harness's non-secret settings); [`SandboxHandle`] is what the control plane keeps to reach
//! and stop it. Start reading at [`local`]; the Kubernetes backend is [`kubernetes`] (I/O) over
//! [`sandbox`] (the pure shape of the pod).

pub mod kubernetes;
pub mod local;
pub mod sandbox;

use std::collections::BTreeMap;

use async_trait::async_trait;
use lap_vault_config::SecretSpec;
use serde::{Deserialize, Serialize};

/// The `intercept` mode of a session's vault: the base config's, else `all`, so the stub tripwire
/// covers every host the agent reaches (issue 14); hosts whose clients pin certificates go in
/// the base config's `passthrough` list, or the base sets `intercept = "bound-hosts"`.
pub fn session_intercept(base: &lap_vault_config::SidecarConfig) -> String {
    base.intercept.clone().unwrap_or_else(|| "all".into())
}

/// What to bring up for one session.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub session_id: String,
    pub harness_id: String,
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub repo_url: Option<String>,
    pub branch: Option<String>,
    pub allow_out: Vec<String>,
    pub deny_out: Vec<String>,
    /// For the sidecar only: each with its real value and its per-session stub.
    pub secrets: Vec<SecretSpec>,
    /// The agent's `tools[]` (`None`: every tool), for the harness as `LAP_AGENT_TOOLS`.
    pub tools: Option<Vec<String>>,
    /// The agent's `mcp_servers`, for the harness as `LAP_AGENT_MCP_SERVERS` (JSON).
    pub mcp_servers: Vec<crate::model::McpServer>,
    /// The agent's plain `env`, for the harness as it is (validated: no reserved name).
    pub env: BTreeMap<String, String>,
    /// The per-session token the harness requires as Bearer.
    pub harness_token: String,
    /// Kubernetes: the agent's resources and runtime class (the local backend ignores it).
    pub placement: Placement,
    /// Bring-up progress (`starting-vault`, `starting-harness`, then the harness's own
    /// [`HARNESS_PHASES`]), shown as the session's phase.
    pub phases: Option<tokio::sync::mpsc::UnboundedSender<&'static str>>,
}

impl SandboxSpec {
    /// Report a bring-up phase (ignored when nobody listens).
    pub fn phase(&self, phase: &'static str) {
        if let Some(tx) = &self.phases {
            let _ = tx.send(phase);
        }
    }

    /// The agent's settings as harness variables: its plain `env`, then `LAP_AGENT_TOOLS`
    /// (comma-separated; empty for no tool) when it lists tools, and `LAP_AGENT_MCP_SERVERS`
    /// (`[{"name","url"}]`) when it lists MCP servers.
    pub fn agent_env(&self) -> BTreeMap<String, String> {
        let mut env = self.env.clone();
        if let Some(t) = &self.tools {
            env.insert("LAP_AGENT_TOOLS".to_owned(), t.join(","));
        }
        if !self.mcp_servers.is_empty() {
            let json = serde_json::to_string(&self.mcp_servers).unwrap_or_else(|_| "[]".to_owned());
            env.insert("LAP_AGENT_MCP_SERVERS".to_owned(), json);
        }
        env
    }

    /// The harness's view of the secrets: name → stub.
    pub fn stub_env(&self) -> BTreeMap<String, String> {
        self.secrets.iter().map(|s| (s.name.clone(), s.stub.clone())).collect()
    }
}

/// Where and with what a session's pod runs: the agent's own `resources` and `runtime_class`
/// (`None`: the backend's defaults).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    pub resources: Option<crate::model::Resources>,
    pub runtime_class: Option<String>,
}

/// The bring-up phases a harness reports on `/healthz` (`{"phase": …}`), in order.
pub const HARNESS_PHASES: [&str; 3] = ["cloning_repo", "installing_deps", "harness_listening"];

/// A phase a harness reported, if it is one of [`HARNESS_PHASES`].
pub fn harness_phase(reported: &str) -> Option<&'static str> {
    HARNESS_PHASES.into_iter().find(|p| *p == reported)
}

/// How to reach and stop a running sandbox. Stored encrypted with the session.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SandboxHandle {
    /// Base URL of the harness (`http://10.1.2.3:8080`; `http://localhost` over `harness_socket`).
    pub harness_url: String,
    /// The harness's Unix socket, when it has no TCP port (the local backend's sandboxes have
    /// no network): requests to `harness_url` go through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness_socket: Option<std::path::PathBuf>,
    pub harness_token: String,
    /// Base URL of the sidecar's admin port.
    pub sidecar_admin_url: String,
    /// Bearer for the sidecar's `/interceptions` and `/reload`.
    pub sidecar_admin_token: String,
    /// Backend-specific details (processes, directories, resource names).
    pub detail: serde_json::Value,
}

/// Whether a sandbox still runs, and answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    Running,
    /// It is gone (a process exited, the pod was deleted); the reason, for `failure_reason`.
    Gone(String),
    /// It ended as designed (the Kubernetes Sandbox reached its `shutdownTime`); the reason,
    /// for `failure_reason`. The session ends `dead` with it, not "stopped unexpectedly".
    Ended(String),
    /// It exists but a health probe failed (a stopped or wedged process); the reason. The
    /// reconciler ends the session after [`crate::lifecycle::UNHEALTHY_THRESHOLD`] in a row.
    Unhealthy(String),
}

/// A backend failure; the message is shown to users as `failure_reason`.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{0}")]
    Failed(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("this backend is not available: {0}")]
    Unavailable(String),
}

/// A place sessions run.
#[async_trait]
pub trait SandboxBackend: Send + Sync + 'static {
    /// What isolates a session's harness (shown on each session as `isolation`): `bubblewrap`,
    /// `none` (local, development only), `pod`.
    fn isolation(&self) -> &'static str;
    /// Bring the sandbox up; returns once the harness answers `/healthz`. On error everything
    /// started is torn down again.
    async fn create(&self, spec: SandboxSpec) -> Result<SandboxHandle, BackendError>;
    /// Whether the sandbox still runs and answers its health probes.
    async fn liveness(&self, handle: &SandboxHandle) -> Liveness;
    /// Stop and remove it; idempotent.
    async fn destroy(&self, handle: &SandboxHandle);
    /// Replace the value of the secret `name` (keeping its stub), reloading the sidecar.
    async fn rotate_secret(
        &self,
        handle: &SandboxHandle,
        name: &str,
        value: &str,
        hosts: &[String],
        locations: &[String],
    ) -> Result<(), BackendError>;
    /// Take the secret `name` out of the sandbox's vault (registry DELETE): its stub is no
    /// longer swapped. Idempotent.
    async fn revoke_secret(&self, handle: &SandboxHandle, name: &str) -> Result<(), BackendError>;
    /// Stop and remove whatever a bring-up of session `session_id` has started so far (after it
    /// was cancelled: the session was stopped while `creating`). Idempotent.
    async fn remove(&self, session_id: &str);
    /// Remove sandboxes whose session is not in `keep` (orphans). Returns how many.
    async fn remove_orphans(&self, keep: &std::collections::HashSet<String>) -> usize;
    /// Delete kept logs of stopped sandboxes older than `retention` (backends that keep them).
    async fn prune_logs(&self, _retention: std::time::Duration) {}
    /// The last `tail` lines of a session's harness or vault log, live or kept after it stopped;
    /// `None` when there is none (yet, or any more).
    async fn logs(
        &self,
        _session_id: &str,
        source: LogSource,
        _tail: usize,
    ) -> Result<Option<Vec<String>>, BackendError> {
        Err(BackendError::Unavailable(format!(
            "this backend does not serve the {} log: read the pod's `{}` container with kubectl logs",
            source.as_str(),
            source.as_str()
        )))
    }
}

/// Which of a session's logs (`GET /sessions/{id}/logs?source=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSource {
    /// `lap-harness` and the agent CLI it runs (bring-up, `fatal:` lines).
    Harness,
    /// The vault sidecar: its JSON log lines and audit events (never a value).
    Vault,
}

impl LogSource {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "harness" => Some(Self::Harness),
            "vault" => Some(Self::Vault),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Harness => "harness",
            Self::Vault => "vault",
        }
    }
}
