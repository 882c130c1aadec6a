//! The control plane's service layer: agents, the secrets registry and session lifecycle,
//! over the [`Store`] and a [`SandboxBackend`]. The HTTP layer ([`crate::api`]) only parses and
//! renders; the reconciler ([`crate::reconciler`]) calls [`App::reconcile_once`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lap_vault_config::SecretSpec;
use rand::RngCore;
use tokio::sync::broadcast;

use crate::audit::Actor;
use crate::backend::{SandboxBackend, SandboxHandle, SandboxSpec};
use crate::crypto::Cipher;
use crate::env_vars;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::model::{
    now_ms, Agent, AgentSpec, CreateAgent, CreateSession, PatchAgent, RegistrySecret, SecretInput, Session,
    SessionView, Status, HARNESS_IDS, REDACTED, TOOL_NAMES,
};
use crate::store::{AgentRow, AuditFilter, AuditRow, SecretRow, Store};

/// Settings the service needs.
#[derive(Debug, Clone)]
pub struct AppConfig {
    pub master_key: String,
    pub idle_timeout: Duration,
    pub create_timeout: Duration,
    /// How long audit events are kept (`LAP_AUDIT_RETENTION`).
    pub audit_retention: Duration,
    /// Where every harness sends its model calls (`LAP_MODEL_GATEWAY_URL`), when set.
    pub model_gateway: Option<crate::settings::ModelGateway>,
}

/// The variables that point a harness's CLI at a model gateway at `url`, and the name of the
/// variable holding its key: claude and the Agent SDK read `ANTHROPIC_BASE_URL` (without `/v1`)
/// and `ANTHROPIC_API_KEY`; opencode's Anthropic provider (the AI SDK's) the same names, its
/// base URL with `/v1`; codex `OPENAI_BASE_URL` (with `/v1`), which the harness turns into a
/// codex model provider of its own, and `OPENAI_API_KEY`.
fn gateway_env(harness_id: &str, url: &str) -> (Vec<(&'static str, String)>, &'static str) {
    match harness_id {
        "codex" => (vec![("OPENAI_BASE_URL", format!("{url}/v1"))], "OPENAI_API_KEY"),
        "opencode" => (vec![("ANTHROPIC_BASE_URL", format!("{url}/v1"))], "ANTHROPIC_API_KEY"),
        _ => (vec![("ANTHROPIC_BASE_URL", url.to_owned())], "ANTHROPIC_API_KEY"),
    }
}

/// How long a replica's claim on a reconcile pass lasts without renewal: it is renewed every
/// [`LEASE_RENEW`] while the pass runs and released when it ends, so a replica killed mid-pass
/// blocks the others for at most this long (a restarted one reconciles within 5 s).
pub(crate) const RECONCILER_LEASE_MS: i64 = 3_000;
/// How long a bring-up's claim on its session lasts without renewal. A session `creating` with
/// no valid claim (its replica died) is failed by the next pass after it expires.
const BRINGUP_LEASE_MS: i64 = 15_000;
/// How often held leases are renewed; a bring-up also checks then whether its session was
/// stopped meanwhile (by any replica) and, if so, cancels itself.
pub(crate) const LEASE_RENEW: Duration = Duration::from_secs(1);

fn bringup_lease(session_id: &str) -> String {
    format!("bringup:{session_id}")
}

/// Shared state of the server.
pub struct App {
    pub store: Store,
    pub cipher: Cipher,
    pub backend: Arc<dyn SandboxBackend>,
    pub config: AppConfig,
    pub metrics: Metrics,
    /// Sessions whose bring-up runs in this process, with the signal that cancels it.
    pub(crate) in_flight: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Notify>>>,
    /// An orphan sweep runs (at most one at a time, outside the reconcile pass).
    pub(crate) sweeping: std::sync::atomic::AtomicBool,
    /// This process has run a reconcile pass (the first one adopts the sessions it finds alive).
    pub(crate) passed_once: std::sync::atomic::AtomicBool,
    /// This process's identity in the `leases` table (random per start).
    pub(crate) replica: String,
    events: broadcast::Sender<SessionView>,
    pub(crate) http: reqwest::Client,
    /// Clients toward harnesses (TCP or their Unix socket).
    pub harness: crate::harness::HarnessClients,
    /// Failed health probes in a row, per ready session (this replica's passes).
    pub(crate) unhealthy: Mutex<std::collections::HashMap<String, u32>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App").finish_non_exhaustive()
    }
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `allow_out` with `hosts` added (each MCP server's host, the model gateway's), when it lists
/// hosts (empty: every host is allowed already, as the egress policy says).
fn allow_also(allow_out: &[String], hosts: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = allow_out.to_vec();
    if out.is_empty() {
        return out;
    }
    for host in hosts {
        if !out.contains(&host) {
            out.push(host);
        }
    }
    out
}

/// An agent's `mcp_servers`: names `[A-Za-z0-9_-]{1,64}`, unique; URLs `http(s)://` with a host.
fn check_mcp_servers(servers: &[crate::model::McpServer]) -> Result<(), ApiError> {
    let bad = |i: usize, what: String| ApiError::BadRequest(format!("mcp_servers[{i}].{what}"));
    for (i, m) in servers.iter().enumerate() {
        let name_ok = (1..=64).contains(&m.name.len())
            && m.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !name_ok {
            return Err(bad(i, format!("name: `{}` must be 1 to 64 of A-Z a-z 0-9 _ -", m.name)));
        }
        if servers[..i].iter().any(|o| o.name == m.name) {
            return Err(bad(i, format!("name: `{}` is listed twice", m.name)));
        }
        let url = reqwest::Url::parse(&m.url).map_err(|e| bad(i, format!("url: `{}` is not a URL: {e}", m.url)))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
            return Err(bad(
                i,
                format!("url: `{}` must be an http:// or https:// URL with a host", m.url),
            ));
        }
    }
    Ok(())
}

/// A new resource id with a readable prefix (`agt_…`, `ses_…`).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_hex(12))
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

fn validate_agent_spec(spec: &AgentSpec, env_vars: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if spec.name.trim().is_empty() {
        return Err(bad("name: must not be empty"));
    }
    if !HARNESS_IDS.contains(&spec.harness_id.as_str()) {
        return Err(bad(format!("harness_id: must be one of {}", HARNESS_IDS.join(", "))));
    }
    for (k, hosts) in &spec.env_var_hosts {
        env_vars::validate_hosts(&format!("env_var_hosts.{k}"), hosts)?;
    }
    for (field, list) in [("allow_out", &spec.allow_out), ("deny_out", &spec.deny_out)] {
        for (i, h) in list.iter().enumerate() {
            h.parse::<lap_vault_config::HostPattern>()
                .map_err(|e| bad(format!("{field}[{i}]: {e}")))?;
        }
    }
    env_vars::validate(env_vars, &BTreeMap::new(), &spec.env_var_hosts)?;
    if let Some(tools) = &spec.tools {
        for (i, t) in tools.iter().enumerate() {
            if !TOOL_NAMES.contains(&t.as_str()) {
                return Err(bad(format!(
                    "tools[{i}]: unknown tool `{t}`; use {}",
                    TOOL_NAMES.join(", ")
                )));
            }
        }
    }
    env_vars::validate_plain("env", &spec.env)?;
    check_mcp_servers(&spec.mcp_servers)?;
    if let Some(k) = spec.env.keys().find(|k| env_vars.contains_key(*k)) {
        return Err(bad(format!(
            "env.{k}: also in env_vars; a name is either a secret or plain"
        )));
    }
    if let Some(r) = &spec.resources {
        crate::backend::sandbox::resources::check(r).map_err(|e| bad(format!("resources.{e}")))?;
    }
    if let Some(rc) = &spec.runtime_class {
        crate::backend::sandbox::resources::check_runtime_class(rc).map_err(|e| bad(format!("runtime_class: {e}")))?;
    }
    Ok(())
}

fn validate_locations(locations: &[String]) -> Result<(), ApiError> {
    env_vars::validate_surfaces("locations", locations).map_err(|e| bad(e.to_string()))
}

impl App {
    pub fn new(store: Store, cipher: Cipher, backend: Arc<dyn SandboxBackend>, config: AppConfig) -> Arc<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        Arc::new(Self {
            store,
            cipher,
            backend,
            config,
            metrics: Metrics::default(),
            in_flight: Mutex::new(std::collections::HashMap::new()),
            sweeping: std::sync::atomic::AtomicBool::new(false),
            passed_once: std::sync::atomic::AtomicBool::new(false),
            replica: new_id("rep"),
            events: broadcast::channel(256).0,
            http,
            harness: crate::harness::HarnessClients::default(),
            unhealthy: Mutex::new(std::collections::HashMap::new()),
        })
    }

    /// Constant-time check of a presented API key.
    pub fn authorized(&self, presented: &str) -> bool {
        use subtle::ConstantTimeEq;
        let a = self.config.master_key.as_bytes();
        let b = presented.as_bytes();
        a.len() == b.len() && bool::from(a.ct_eq(b))
    }

    /// Session updates as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<SessionView> {
        self.events.subscribe()
    }

    async fn emit(&self, id: &str) {
        if let Ok(Some(s)) = self.store.get_session(id).await {
            let _ = self.events.send(self.session_view(&s));
        }
    }

    /// Stop and remove a sandbox, and forget the client toward its harness.
    async fn destroy_sandbox(&self, handle: &SandboxHandle) {
        self.backend.destroy(handle).await;
        if let Some(sock) = &handle.harness_socket {
            self.harness.forget(sock);
        }
    }

    /// A session as the API shows it, with its terminal token.
    pub fn session_view(&self, s: &Session) -> SessionView {
        s.view(self.cipher.tty_token(&s.id))
    }

    // ---- agents ----

    fn agent_from_row(&self, row: AgentRow) -> Result<Agent, ApiError> {
        let spec: AgentSpec =
            serde_json::from_str(&row.spec).map_err(|e| ApiError::Internal(format!("agent {}: {e}", row.id)))?;
        let env_vars: BTreeMap<String, String> = self.cipher.open_json(&row.env_vars_enc)?;
        Ok(Agent {
            id: row.id,
            spec,
            env_vars,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }

    fn agent_row(&self, a: &Agent) -> Result<AgentRow, ApiError> {
        Ok(AgentRow {
            id: a.id.clone(),
            name: a.spec.name.clone(),
            spec: serde_json::to_string(&a.spec).map_err(|e| ApiError::Internal(e.to_string()))?,
            env_vars_enc: self.cipher.seal_json(&a.env_vars)?,
            created_at: a.created_at,
            updated_at: a.updated_at,
        })
    }

    async fn check_registry_names(&self, names: &[String]) -> Result<(), ApiError> {
        for (i, n) in names.iter().enumerate() {
            if self.store.get_secret(n).await?.is_none() {
                return Err(bad(format!(
                    "secrets[{i}]: no secret named `{n}` in the registry (POST /api/v1/secrets)"
                )));
            }
        }
        Ok(())
    }

    pub async fn create_agent(&self, input: CreateAgent) -> Result<Agent, ApiError> {
        validate_agent_spec(&input.spec, &input.env_vars)?;
        self.check_registry_names(&input.spec.secrets).await?;
        let now = now_ms();
        let agent = Agent {
            id: new_id("agt"),
            spec: input.spec,
            env_vars: input.env_vars,
            created_at: now,
            updated_at: now,
        };
        self.store
            .insert_agent(&self.agent_row(&agent)?)
            .await
            .map_err(|e| match ApiError::from(e) {
                ApiError::Conflict(_) => {
                    ApiError::Conflict(format!("name: an agent named `{}` exists", agent.spec.name))
                }
                other => other,
            })?;
        Ok(agent)
    }

    pub async fn get_agent(&self, id: &str) -> Result<Agent, ApiError> {
        let row = self
            .store
            .get_agent(id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("agent `{id}`")))?;
        self.agent_from_row(row)
    }

    pub async fn list_agents(&self, limit: i64, offset: i64) -> Result<(Vec<Agent>, i64), ApiError> {
        let (rows, total) = self.store.list_agents(limit, offset).await?;
        Ok((
            rows.into_iter()
                .map(|r| self.agent_from_row(r))
                .collect::<Result<_, _>>()?,
            total,
        ))
    }

    pub async fn patch_agent(&self, id: &str, p: PatchAgent) -> Result<Agent, ApiError> {
        let mut a = self.get_agent(id).await?;
        if let Some(v) = p.name {
            a.spec.name = v;
        }
        if let Some(v) = p.model {
            a.spec.model = v;
        }
        if let Some(v) = p.prompt {
            a.spec.prompt = v;
        }
        if let Some(v) = p.harness_id {
            a.spec.harness_id = v;
        }
        if let Some(v) = p.repo_url {
            a.spec.repo_url = v;
        }
        if let Some(v) = p.branch {
            a.spec.branch = v;
        }
        if let Some(v) = p.allow_out {
            a.spec.allow_out = v;
        }
        if let Some(v) = p.deny_out {
            a.spec.deny_out = v;
        }
        if let Some(v) = p.env_var_hosts {
            a.spec.env_var_hosts = v;
        }
        if let Some(v) = p.secrets {
            self.check_registry_names(&v).await?;
            a.spec.secrets = v;
        }
        if let Some(v) = p.tools {
            a.spec.tools = v;
        }
        if let Some(v) = p.env {
            a.spec.env = v;
        }
        if let Some(v) = p.mcp_servers {
            a.spec.mcp_servers = v;
        }
        if let Some(v) = p.requirements {
            a.spec.requirements = v;
        }
        if let Some(v) = p.resources {
            a.spec.resources = v;
        }
        if let Some(v) = p.runtime_class {
            a.spec.runtime_class = v;
        }
        if let Some(new) = p.env_vars {
            let old = std::mem::take(&mut a.env_vars);
            for (k, v) in new {
                let value = if v == REDACTED {
                    old.get(&k)
                        .cloned()
                        .ok_or_else(|| bad(format!("env_vars.{k}: no stored value to keep")))?
                } else {
                    v
                };
                a.env_vars.insert(k, value);
            }
        }
        validate_agent_spec(&a.spec, &a.env_vars)?;
        a.updated_at = now_ms();
        let before = self.get_agent(id).await?;
        self.store
            .update_agent(&self.agent_row(&a)?)
            .await
            .map_err(|e| match ApiError::from(e) {
                ApiError::Conflict(_) => ApiError::Conflict(format!("name: an agent named `{}` exists", a.spec.name)),
                other => other,
            })?;
        self.propagate_agent_env_vars(&before, &a).await;
        Ok(a)
    }

    /// An agent's own `env_vars` changed: running sessions get the new values (same stubs), and
    /// lose the removed ones, like a registry rotation. A key added now reaches new sessions only
    /// (a running harness has no stub for it).
    async fn propagate_agent_env_vars(&self, before: &Agent, after: &Agent) {
        if before.env_vars == after.env_vars && before.spec.env_var_hosts == after.spec.env_var_hosts {
            return;
        }
        let Ok(bindings) = env_vars::validate(&after.env_vars, &BTreeMap::new(), &after.spec.env_var_hosts) else {
            return;
        };
        for (s, handle) in self.running_sessions_using(|a| a.id == after.id).await {
            for b in &bindings {
                let (Some(new), old) = (after.env_vars.get(&b.name), before.env_vars.get(&b.name)) else {
                    continue;
                };
                if old.is_none() || (old == Some(new) && before.spec.env_var_hosts == after.spec.env_var_hosts) {
                    continue;
                }
                if let Err(e) = self
                    .backend
                    .rotate_secret(&handle, &b.name, new, &b.hosts, &b.surfaces)
                    .await
                {
                    tracing::warn!(session = %s.id, key = %b.name, error = %e, "agent env_vars change did not reach session");
                }
            }
            for k in before.env_vars.keys().filter(|k| !after.env_vars.contains_key(*k)) {
                if let Err(e) = self.backend.revoke_secret(&handle, k).await {
                    tracing::warn!(session = %s.id, key = %k, error = %e, "agent env_vars removal did not reach session");
                }
            }
        }
    }

    /// Delete an agent. With sessions still `creating` or `ready`: 409 naming them, unless
    /// `stop_sessions`, when they are stopped first. Returns the sessions stopped.
    pub async fn delete_agent(&self, id: &str, stop_sessions: bool) -> Result<Vec<String>, ApiError> {
        self.get_agent(id).await?;
        let live: Vec<String> = self
            .store
            .sessions_with_status(&[Status::Creating, Status::Ready])
            .await?
            .into_iter()
            .filter(|s| s.agent_id == id)
            .map(|s| s.id)
            .collect();
        if !live.is_empty() && !stop_sessions {
            return Err(ApiError::Conflict(format!(
                "agent `{id}` has running sessions: {}; stop them (DELETE /sessions/{{id}}) or delete with \
                 ?stop_sessions=true",
                live.join(", ")
            )));
        }
        let mut stopped = Vec::new();
        for sid in &live {
            if self.stop_session_once(sid).await?.1 {
                stopped.push(sid.clone());
            }
        }
        if !self.store.delete_agent(id).await? {
            return Err(ApiError::NotFound(format!("agent `{id}`")));
        }
        // A session created for this agent while it was being deleted: never left running.
        for s in self
            .store
            .sessions_with_status(&[Status::Creating, Status::Ready])
            .await?
        {
            if s.agent_id == id && self.stop_session_once(&s.id).await?.1 {
                stopped.push(s.id);
            }
        }
        Ok(stopped)
    }

    // ---- secrets registry ----

    fn secret_from_row(&self, r: SecretRow) -> Result<RegistrySecret, ApiError> {
        let value = String::from_utf8(self.cipher.open(&r.value_enc)?)
            .map_err(|_| ApiError::Internal(format!("secret {}: not UTF-8", r.name)))?;
        Ok(RegistrySecret {
            value,
            hosts: serde_json::from_str(&r.hosts).map_err(|e| ApiError::Internal(e.to_string()))?,
            locations: serde_json::from_str(&r.locations).map_err(|e| ApiError::Internal(e.to_string()))?,
            name: r.name,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }

    /// Create (`replace` false: 409 if it exists) or rotate (`replace` true) a registry secret;
    /// a rotation reaches running sessions through their sidecar's reload.
    pub async fn put_secret(&self, name: &str, input: SecretInput, replace: bool) -> Result<RegistrySecret, ApiError> {
        if !env_vars::is_valid_name(name) {
            return Err(bad("name: must match ^[A-Za-z_][A-Za-z0-9_]*$"));
        }
        if input.value.is_empty() {
            return Err(bad("value: must not be empty"));
        }
        env_vars::check_value("value", &input.value)?;
        env_vars::validate_hosts("hosts", &input.hosts)?;
        validate_locations(&input.locations)?;
        let now = now_ms();
        let existing = self.store.get_secret(name).await?;
        let row = SecretRow {
            name: name.to_owned(),
            value_enc: self.cipher.seal(input.value.as_bytes())?,
            hosts: serde_json::to_string(&input.hosts).map_err(|e| ApiError::Internal(e.to_string()))?,
            locations: serde_json::to_string(&input.locations).map_err(|e| ApiError::Internal(e.to_string()))?,
            created_at: existing.as_ref().map_or(now, |e| e.created_at),
            updated_at: now,
        };
        self.store
            .put_secret(&row, replace)
            .await
            .map_err(|e| match ApiError::from(e) {
                ApiError::Conflict(_) => {
                    ApiError::Conflict(format!("name: a secret named `{name}` exists; PUT rotates it"))
                }
                other => other,
            })?;
        if replace {
            self.propagate_rotation(name, &input).await;
        }
        self.secret_from_row(row)
    }

    async fn propagate_rotation(&self, name: &str, input: &SecretInput) {
        for (s, handle) in self
            .running_sessions_using(|a| a.spec.secrets.iter().any(|n| n == name))
            .await
        {
            match self
                .backend
                .rotate_secret(&handle, name, &input.value, &input.hosts, &input.locations)
                .await
            {
                Ok(()) => tracing::info!(session = %s.id, secret = %name, "rotated secret in running session"),
                Err(e) => tracing::warn!(session = %s.id, secret = %name, error = %e, "rotation did not reach session"),
            }
        }
    }

    pub async fn get_secret(&self, name: &str) -> Result<RegistrySecret, ApiError> {
        let row = self
            .store
            .get_secret(name)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("secret `{name}`")))?;
        self.secret_from_row(row)
    }

    pub async fn list_secrets(&self, limit: i64, offset: i64) -> Result<(Vec<RegistrySecret>, i64), ApiError> {
        let (rows, total) = self.store.list_secrets(limit, offset).await?;
        Ok((
            rows.into_iter()
                .map(|r| self.secret_from_row(r))
                .collect::<Result<_, _>>()?,
            total,
        ))
    }

    /// Delete a registry secret and revoke it from every running session that holds it: their
    /// vaults stop swapping its stub at once. Returns those sessions.
    pub async fn delete_secret(&self, name: &str) -> Result<Vec<String>, ApiError> {
        if !self.store.delete_secret(name).await? {
            return Err(ApiError::NotFound(format!("secret `{name}`")));
        }
        let mut revoked = Vec::new();
        for (s, handle) in self
            .running_sessions_using(|a| a.spec.secrets.iter().any(|n| n == name))
            .await
        {
            match self.backend.revoke_secret(&handle, name).await {
                Ok(()) => {
                    tracing::info!(session = %s.id, secret = %name, "revoked secret from running session");
                    revoked.push(s.id);
                }
                Err(e) => {
                    tracing::warn!(session = %s.id, secret = %name, error = %e, "revocation did not reach session")
                }
            }
        }
        Ok(revoked)
    }

    /// Ready sessions whose agent matches `uses`, with their sandboxes.
    async fn running_sessions_using(&self, uses: impl Fn(&Agent) -> bool) -> Vec<(Session, SandboxHandle)> {
        let Ok(sessions) = self.store.sessions_with_status(&[Status::Ready]).await else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for s in sessions {
            let Ok(agent) = self.get_agent(&s.agent_id).await else {
                continue;
            };
            if !uses(&agent) {
                continue;
            }
            if let Some(h) = self.handle(&s) {
                out.push((s, h));
            }
        }
        out
    }

    // ---- sessions ----

    /// Validate the request, record the session as `creating` and start the bring-up in the
    /// background. Per-session values go only to the backend, never to the store.
    pub async fn create_session(self: &Arc<Self>, agent_id: &str, req: CreateSession) -> Result<Session, ApiError> {
        let agent = self.get_agent(agent_id).await?;
        let bindings = env_vars::validate(&req.env_vars, &req.env_var_hosts, &agent.spec.env_var_hosts)?;
        if let Some(t) = &req.title {
            if t.len() > 512 {
                return Err(bad("title: at most 512 bytes"));
            }
        }

        let mut registry = Vec::with_capacity(agent.spec.secrets.len());
        for (i, name) in agent.spec.secrets.iter().enumerate() {
            let s = self.store.get_secret(name).await?.ok_or_else(|| {
                ApiError::Conflict(format!(
                    "secrets[{i}]: the agent uses `{name}`, which is not in the registry"
                ))
            })?;
            registry.push(self.secret_from_row(s)?);
        }
        let agent_bindings = env_vars::validate(&agent.env_vars, &BTreeMap::new(), &agent.spec.env_var_hosts)?;
        // The model gateway's key, from the registry: without it the agent could not talk to its
        // model, so the session is refused rather than started broken.
        let gateway = match &self.config.model_gateway {
            None => None,
            Some(g) => {
                let row = self.store.get_secret(&g.secret).await?.ok_or_else(|| {
                    ApiError::Conflict(format!(
                        "the model gateway (LAP_MODEL_GATEWAY_URL) needs its key in the registry as `{}`; \
                         add it with POST /api/v1/secrets",
                        g.secret
                    ))
                })?;
                Some((g.clone(), self.secret_from_row(row)?.value))
            }
        };

        // Later sources win: agent env vars, then registry secrets, then this session's env vars.
        let secrets = {
            let mut rng = rand::thread_rng();
            let mut secrets: BTreeMap<String, SecretSpec> = BTreeMap::new();
            let mut add = |name: &str, value: &str, hosts: Vec<String>, locations: Option<Vec<String>>| {
                let stub = env_vars::mint_stub(value, &mut rng);
                secrets.insert(
                    name.to_owned(),
                    SecretSpec {
                        name: name.to_owned(),
                        stub,
                        value: Some(value.to_owned()),
                        hosts,
                        locations,
                        ..SecretSpec::default()
                    },
                );
            };
            for b in agent_bindings {
                if let Some(v) = agent.env_vars.get(&b.name) {
                    add(&b.name, v, b.hosts, (!b.surfaces.is_empty()).then_some(b.surfaces));
                }
            }
            for s in &registry {
                add(
                    &s.name,
                    &s.value,
                    s.hosts.clone(),
                    (!s.locations.is_empty()).then(|| s.locations.clone()),
                );
            }
            for b in bindings {
                if let Some(v) = req.env_vars.get(&b.name) {
                    add(&b.name, v, b.hosts, (!b.surfaces.is_empty()).then_some(b.surfaces));
                }
            }
            // Last: with a gateway, the model key variable holds the gateway's key, bound to it.
            if let Some((g, key)) = &gateway {
                let (_, var) = gateway_env(&agent.spec.harness_id, &g.url);
                add(var, key, vec![g.binding.clone()], None);
            }
            secrets
        };

        let (phase_tx, phase_rx) = tokio::sync::mpsc::unbounded_channel::<&'static str>();
        let now = now_ms();
        let id = new_id("ses");
        let session = Session {
            tty_token_hash: crate::crypto::token_hash(&self.cipher.tty_token(&id)),
            id,
            agent_id: agent.id.clone(),
            title: req.title.clone(),
            status: Status::Creating,
            phase: "provisioning".into(),
            failure_reason: None,
            isolation: Some(self.backend.isolation().to_owned()),
            sandbox: None,
            created_at: now,
            last_seen_at: now,
            stopped_at: None,
            idle_timeout_ms: i64::try_from(self.config.idle_timeout.as_millis()).unwrap_or(i64::MAX),
        };
        // Claimed before the row exists, so no other replica's reconciler ever sees this session
        // `creating` without a live bring-up (the claim is renewed while it runs).
        self.store
            .try_lease(&bringup_lease(&session.id), &self.replica, now, BRINGUP_LEASE_MS)
            .await?;
        self.store.insert_session(&session).await?;
        self.metrics.sessions_created.inc();
        let spec = SandboxSpec {
            session_id: session.id.clone(),
            harness_id: agent.spec.harness_id.clone(),
            model: agent.spec.model.clone(),
            prompt: agent.spec.prompt.clone(),
            repo_url: agent.spec.repo_url.clone(),
            branch: agent.spec.branch.clone(),
            allow_out: allow_also(
                &agent.spec.allow_out,
                agent
                    .spec
                    .mcp_servers
                    .iter()
                    .filter_map(|m| reqwest::Url::parse(&m.url).ok()?.host_str().map(str::to_owned))
                    .chain(gateway.as_ref().map(|(g, _)| g.binding.clone())),
            ),
            deny_out: agent.spec.deny_out.clone(),
            secrets: secrets.into_values().collect(),
            tools: agent.spec.tools.clone(),
            mcp_servers: agent.spec.mcp_servers.clone(),
            env: {
                let mut env = agent.spec.env.clone();
                if let Some(r) = &agent.spec.requirements {
                    env.insert("AGENT_REQUIREMENTS".to_owned(), r.clone());
                }
                if let Some((g, _)) = &gateway {
                    for (k, v) in gateway_env(&agent.spec.harness_id, &g.url).0 {
                        env.insert(k.to_owned(), v);
                    }
                }
                env
            },
            harness_token: random_hex(24),
            placement: crate::backend::Placement {
                resources: agent.spec.resources.clone(),
                runtime_class: agent.spec.runtime_class.clone(),
            },
            phases: Some(phase_tx),
        };
        let cancel = Arc::new(tokio::sync::Notify::new());
        if let Ok(mut f) = self.in_flight.lock() {
            f.insert(session.id.clone(), cancel.clone());
        }
        let app = Arc::clone(self);
        let initial_prompt = req.initial_prompt.clone();
        tokio::spawn(async move { app.bring_up(spec, phase_rx, initial_prompt, cancel).await });
        Ok(session)
    }

    /// Bring the sandbox up; cancelled (and whatever it started removed) as soon as the session
    /// is stopped, on this replica ([`App::stop_session`] signals `cancel`) or another (the
    /// lease renewal sees the row is no longer `creating`). The phases the backend reports
    /// (`phases`) are recorded and emitted here, in order, every one before the outcome: a
    /// watcher sees each phase the session went through, then `ready` or `failed`.
    async fn bring_up(
        self: Arc<Self>,
        spec: SandboxSpec,
        mut phases: tokio::sync::mpsc::UnboundedReceiver<&'static str>,
        initial_prompt: Option<String>,
        cancel: Arc<tokio::sync::Notify>,
    ) {
        let id = spec.session_id.clone();
        let lease = bringup_lease(&id);
        let renew = {
            let (store, replica, lease, id, cancel) = (
                self.store.clone(),
                self.replica.clone(),
                lease.clone(),
                id.clone(),
                cancel.clone(),
            );
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(LEASE_RENEW).await;
                    if let Err(e) = store.try_lease(&lease, &replica, now_ms(), BRINGUP_LEASE_MS).await {
                        tracing::warn!(lease = %lease, error = %e, "renewing the bring-up lease failed");
                    }
                    if let Ok(Some(s)) = store.get_session(&id).await {
                        if s.status != Status::Creating {
                            cancel.notify_one();
                            return;
                        }
                    }
                }
            })
        };
        let create = tokio::time::timeout(self.config.create_timeout, self.backend.create(spec));
        tokio::pin!(create);
        let result = loop {
            tokio::select! {
                r = &mut create => break Some(r),
                () = cancel.notified() => break None,
                Some(phase) = phases.recv() => self.record_phase(&id, phase).await,
            }
        };
        // What the backend reported just before it returned comes before the outcome.
        while let Ok(phase) = phases.try_recv() {
            self.record_phase(&id, phase).await;
        }
        renew.abort();
        let Some(result) = result else {
            // Stopped while creating: the create future is dropped; remove what it started.
            self.backend.remove(&id).await;
            tracing::info!(session = %id, "bring-up cancelled: the session was stopped");
            if let Ok(mut f) = self.in_flight.lock() {
                f.remove(&id);
            }
            let _ = self.store.release_lease(&lease, &self.replica).await;
            self.emit(&id).await;
            return;
        };
        let outcome = match result {
            Ok(Ok(handle)) => match self.cipher.seal_json(&handle) {
                Ok(enc) => match self
                    .store
                    .transition(&id, Status::Creating, Status::Ready, None, Some(&enc))
                    .await
                {
                    Ok(true) => {
                        tracing::info!(session = %id, "session ready");
                        Ok(Some(handle))
                    }
                    _ => {
                        // Deleted (or timed out by the reconciler) meanwhile.
                        self.destroy_sandbox(&handle).await;
                        Ok(None)
                    }
                },
                Err(e) => {
                    self.destroy_sandbox(&handle).await;
                    Err(format!("internal error: {e}"))
                }
            },
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "the sandbox did not become ready within {}s (LAP_CREATE_TIMEOUT)",
                self.config.create_timeout.as_secs()
            )),
        };
        if let Err(reason) = &outcome {
            tracing::warn!(session = %id, reason = %reason, "session failed");
            self.metrics.sessions_failed.inc();
            let _ = self
                .store
                .transition(&id, Status::Creating, Status::Failed, Some(reason), None)
                .await;
        }
        if let Ok(mut f) = self.in_flight.lock() {
            f.remove(&id);
        }
        let _ = self.store.release_lease(&lease, &self.replica).await;
        self.emit(&id).await;
        if let (Ok(Some(_)), Some(text)) = (&outcome, initial_prompt) {
            if let Err(e) = self.send_message(&id, &text).await {
                tracing::warn!(session = %id, error = %e, "initial prompt failed");
            }
        }
    }

    async fn record_phase(&self, id: &str, phase: &str) {
        if self.store.set_phase(id, phase).await.is_ok() {
            self.emit(id).await;
        }
    }

    pub async fn get_session(&self, id: &str) -> Result<Session, ApiError> {
        self.store
            .get_session(id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("session `{id}`")))
    }

    fn handle(&self, s: &Session) -> Option<SandboxHandle> {
        s.sandbox.as_deref().and_then(|enc| self.cipher.open_json(enc).ok())
    }

    /// Stop a session; idempotent, always ends `dead`. A session still `creating` has its
    /// bring-up cancelled and whatever it started removed before this returns (when the
    /// bring-up runs on another replica, that replica notices within [`LEASE_RENEW`]).
    pub async fn stop_session(&self, id: &str) -> Result<Session, ApiError> {
        self.stop_session_once(id).await.map(|(s, _)| s)
    }

    /// [`App::stop_session`], and whether this call is the one that ended it (of concurrent
    /// DELETEs, on any replica, exactly one is).
    pub async fn stop_session_once(&self, id: &str) -> Result<(Session, bool), ApiError> {
        let s = self.get_session(id).await?;
        let ended = s.status != Status::Dead && self.store.transition(id, s.status, Status::Dead, None, None).await?;
        if ended {
            let cancel = self.in_flight.lock().ok().and_then(|f| f.get(id).cloned());
            if let Some(cancel) = cancel {
                cancel.notify_one();
                self.backend.remove(id).await;
            }
            if let Some(h) = self.handle(&s) {
                self.pull_before_stop(&s, &h).await;
                self.destroy_sandbox(&h).await;
            }
            self.emit(id).await;
        }
        Ok((self.get_session(id).await?, ended))
    }

    async fn ready_handle(&self, id: &str) -> Result<SandboxHandle, ApiError> {
        let s = self.get_session(id).await?;
        match s.status {
            Status::Ready => self
                .handle(&s)
                .ok_or_else(|| ApiError::Internal(format!("session {id} is ready without a sandbox"))),
            Status::Creating => Err(ApiError::Conflict(format!(
                "session `{id}` is still creating; wait for ready"
            ))),
            other => Err(ApiError::Conflict(format!("session `{id}` is {}", other.as_str()))),
        }
    }

    /// Send a message to the harness; returns its JSON answer.
    pub async fn send_message(&self, id: &str, text: &str) -> Result<serde_json::Value, ApiError> {
        let handle = self.ready_handle(id).await?;
        self.store.touch_session(id).await?;
        self.metrics.messages.inc();
        let resp = self
            .harness
            .for_handle(&handle)
            .post(format!("{}/message", handle.harness_url))
            .bearer_auth(&handle.harness_token)
            .json(&serde_json::json!({ "text": text }))
            .send()
            .await
            .map_err(|e| {
                self.metrics.message_errors.inc();
                ApiError::BadGateway(format!("the harness is unreachable: {e}"))
            })?;
        let status = resp.status();
        let body: serde_json::Value = resp
            .json()
            .await
            .map_err(|e| ApiError::BadGateway(format!("the harness sent an unreadable answer: {e}")))?;
        self.store.touch_session(id).await?;
        if !status.is_success() {
            self.metrics.message_errors.inc();
            let msg = body
                .get("error")
                .and_then(|e| e.as_str())
                .unwrap_or("no details")
                .to_owned();
            // 409 from the harness: the turn was aborted (`POST /sessions/{id}/abort`).
            if status == reqwest::StatusCode::CONFLICT {
                return Err(ApiError::Conflict(msg));
            }
            return Err(ApiError::BadGateway(msg));
        }
        Ok(body)
    }

    /// Open the harness's SSE stream for a message.
    pub async fn message_stream(&self, id: &str, text: &str) -> Result<reqwest::Response, ApiError> {
        let handle = self.ready_handle(id).await?;
        self.store.touch_session(id).await?;
        self.metrics.messages.inc();
        let resp = self
            .harness
            .for_handle(&handle)
            .post(format!("{}/message_stream", handle.harness_url))
            .bearer_auth(&handle.harness_token)
            .json(&serde_json::json!({ "text": text }))
            .send()
            .await
            .map_err(|e| ApiError::BadGateway(format!("the harness is unreachable: {e}")))?;
        if !resp.status().is_success() {
            return Err(ApiError::BadGateway(format!("the harness answered {}", resp.status())));
        }
        Ok(resp)
    }

    /// `POST /sessions/{id}/abort`: end the running turn (the harness kills its CLI and what it
    /// started; that turn's `/message` answers 409). `{"aborted": bool}`: whether a turn was
    /// running. The session stays `ready`.
    pub async fn abort_turn(&self, id: &str) -> Result<serde_json::Value, ApiError> {
        let handle = self.ready_handle(id).await?;
        self.store.touch_session(id).await?;
        let resp = self
            .harness
            .for_handle(&handle)
            .post(format!("{}/abort", handle.harness_url))
            .bearer_auth(&handle.harness_token)
            .send()
            .await
            .map_err(|e| ApiError::BadGateway(format!("the harness is unreachable: {e}")))?;
        if !resp.status().is_success() {
            return Err(ApiError::BadGateway(format!("the harness answered {}", resp.status())));
        }
        resp.json()
            .await
            .map_err(|e| ApiError::BadGateway(format!("the harness sent an unreadable answer: {e}")))
    }

    /// `POST /sessions/{id}/restart`: the harness replaces itself in the same sandbox (the
    /// workspace and its files kept, the running turn aborted, the conversation started over);
    /// answers once the new harness serves (`/healthz` 200), within `timeout`.
    pub async fn restart_harness(&self, id: &str, timeout: Duration) -> Result<Session, ApiError> {
        let handle = self.ready_handle(id).await?;
        self.store.touch_session(id).await?;
        let client = self.harness.for_handle(&handle);
        let healthz = format!("{}/healthz", handle.harness_url);
        // Each harness process names itself with a `boot` id on /healthz: the restart is done
        // when a different one answers 200.
        let boot = |v: &serde_json::Value| v.get("boot").and_then(|b| b.as_str()).map(str::to_owned);
        let probe = || async {
            let r = client.get(&healthz).timeout(Duration::from_secs(2)).send().await.ok()?;
            let ok = r.status().is_success();
            let v: serde_json::Value = r.json().await.ok()?;
            Some((ok, v))
        };
        let before = probe().await.and_then(|(_, v)| boot(&v));
        let resp = client
            .post(format!("{}/restart", handle.harness_url))
            .bearer_auth(&handle.harness_token)
            .send()
            .await
            .map_err(|e| ApiError::BadGateway(format!("the harness is unreachable: {e}")))?;
        if resp.status() != reqwest::StatusCode::ACCEPTED {
            return Err(ApiError::BadGateway(format!("the harness answered {}", resp.status())));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some((true, v)) = probe().await {
                if boot(&v) != before {
                    break;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ApiError::BadGateway(format!(
                    "the harness did not come back within {timeout:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.get_session(id).await
    }

    /// Open the harness's agent event stream (SSE) for a ready session.
    pub async fn harness_events(&self, id: &str) -> Result<reqwest::Response, ApiError> {
        let handle = self.ready_handle(id).await?;
        let resp = self
            .harness
            .for_handle(&handle)
            .get(format!("{}/events", handle.harness_url))
            .bearer_auth(&handle.harness_token)
            .send()
            .await
            .map_err(|e| ApiError::BadGateway(format!("the harness is unreachable: {e}")))?;
        if !resp.status().is_success() {
            return Err(ApiError::BadGateway(format!("the harness answered {}", resp.status())));
        }
        Ok(resp)
    }

    /// The harness behind a session's terminal, if `presented` is that session's own
    /// `tty_token` (constant-time compare): 404 for no such session, 401 for any other token
    /// (another session's too), 409 unless the session is ready.
    pub async fn tty_handle(&self, id: &str, presented: Option<&str>) -> Result<SandboxHandle, ApiError> {
        let s = self.get_session(id).await?;
        if !crate::crypto::token_matches(presented.unwrap_or_default(), &s.tty_token_hash) {
            return Err(ApiError::TtyUnauthorized);
        }
        self.ready_handle(id).await
    }

    /// Record terminal activity (resets the idle timeout).
    pub async fn touch(&self, id: &str) {
        if let Err(e) = self.store.touch_session(id).await {
            tracing::warn!(session = %id, error = %e, "cannot record terminal activity");
        }
    }

    // ---- the durable audit ----

    /// Record an admin action. A failure to store it is logged, not returned: the action happened.
    pub async fn record(
        &self,
        kind: &str,
        actor: &Actor,
        session_id: Option<&str>,
        agent_id: Option<&str>,
        secrets: &[String],
        detail: serde_json::Value,
    ) {
        let row = AuditRow {
            id: new_id("aud"),
            time: now_ms(),
            kind: kind.to_owned(),
            actor: actor.0.to_owned(),
            session_id: session_id.map(str::to_owned),
            agent_id: agent_id.map(str::to_owned),
            secrets: crate::audit::secrets_column(secrets),
            detail: detail.to_string(),
        };
        match self.store.insert_audit(&row).await {
            Ok(_) => tracing::info!(kind, actor = actor.0, session = session_id, agent = agent_id, "audit"),
            Err(e) => tracing::error!(kind, error = %e, "cannot store an audit event"),
        }
    }

    /// Pull the interceptions the session's sidecar holds that are not stored yet; returns how
    /// many were new.
    pub async fn pull_interceptions(&self, s: &Session, handle: &SandboxHandle) -> Result<usize, String> {
        let cursor = self
            .store
            .audit_cursor(&s.id)
            .await
            .map_err(|e| e.to_string())?
            .as_deref()
            .and_then(crate::audit::Cursor::parse);
        let fetch = |after: u64| {
            self.http
                .get(format!("{}/interceptions?after={after}", handle.sidecar_admin_url))
                .bearer_auth(&handle.sidecar_admin_token)
                .timeout(Duration::from_secs(5))
                .send()
        };
        let read = |r: reqwest::Response| async move {
            if !r.status().is_success() {
                return Err(format!("the vault sidecar answered {}", r.status()));
            }
            let run = r
                .headers()
                .get("x-audit-run")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let events: Vec<serde_json::Value> = r.json().await.map_err(|e| format!("bad JSON: {e}"))?;
            Ok((run, events))
        };
        let after = cursor.as_ref().map_or(0, |c| c.seq);
        let (run, mut events) = read(fetch(after).await.map_err(|e| e.to_string())?).await?;
        let want = crate::audit::after_for(cursor.as_ref(), &run);
        if want != after {
            // The sidecar restarted: its numbering began again.
            events = read(fetch(want).await.map_err(|e| e.to_string())?).await?.1;
        }
        let mut new = 0;
        let mut last = cursor.filter(|c| c.run == run).map_or(0, |c| c.seq);
        let now = now_ms();
        for e in &events {
            let row = crate::audit::interception_row(&s.id, &s.agent_id, e, now);
            if self.store.insert_audit(&row).await.map_err(|e| e.to_string())? {
                new += 1;
            }
            last = last.max(e["seq"].as_u64().unwrap_or(0));
        }
        if !run.is_empty() {
            let c = crate::audit::Cursor { run, seq: last };
            self.store
                .set_audit_cursor(&s.id, &c.render())
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(new)
    }

    /// Pull what the sidecar still holds before its sandbox goes away (best effort).
    async fn pull_before_stop(&self, s: &Session, handle: &SandboxHandle) {
        if let Err(e) = self.pull_interceptions(s, handle).await {
            tracing::warn!(session = %s.id, error = %e, "could not pull the last interceptions before stopping");
        }
    }

    /// `GET /api/v1/audit`.
    pub async fn audit(&self, f: &AuditFilter, limit: i64, offset: i64) -> Result<(Vec<AuditRow>, i64), ApiError> {
        Ok(self.store.list_audit(f, limit, offset).await?)
    }

    /// The sidecar's audit events for a session, from the durable audit (pulled first while the
    /// session runs), oldest first: they outlive the session and server restarts.
    /// `GET /sessions/{id}/logs`: the last `tail` lines of its harness or vault log.
    pub async fn logs(
        &self,
        id: &str,
        source: crate::backend::LogSource,
        tail: usize,
    ) -> Result<serde_json::Value, ApiError> {
        let s = self.get_session(id).await?;
        let lines = match self.backend.logs(&s.id, source, tail).await {
            Ok(lines) => lines.unwrap_or_default(),
            Err(crate::backend::BackendError::Unavailable(m)) => {
                return Err(ApiError::Rejected {
                    status: axum::http::StatusCode::NOT_IMPLEMENTED,
                    message: m,
                })
            }
            Err(e) => return Err(ApiError::Internal(e.to_string())),
        };
        Ok(serde_json::json!({ "session_id": s.id, "source": source.as_str(), "lines": lines }))
    }

    pub async fn interceptions(&self, id: &str) -> Result<serde_json::Value, ApiError> {
        let s = self.get_session(id).await?;
        if s.status == Status::Ready {
            if let Some(handle) = self.handle(&s) {
                if let Err(e) = self.pull_interceptions(&s, &handle).await {
                    tracing::warn!(session = %id, error = %e, "could not pull interceptions; showing those stored");
                }
            }
        }
        let filter = AuditFilter {
            session_id: Some(id.to_owned()),
            kind: Some("interception".into()),
            ..AuditFilter::default()
        };
        let mut events = Vec::new();
        let mut offset = 0;
        loop {
            let (rows, total) = self.store.list_audit(&filter, 200, offset).await?;
            offset += i64::try_from(rows.len()).unwrap_or(0);
            events.extend(rows.iter().map(|r| r.view().detail));
            if rows.is_empty() || offset >= total {
                break;
            }
        }
        Ok(serde_json::Value::Array(events))
    }

    /// This process's replica id (its name in the `leases` table).
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// One reconcile pass ([`crate::reconciler::reconcile_once`]).
    pub async fn reconcile_once(self: &Arc<Self>) -> Result<bool, ApiError> {
        crate::reconciler::reconcile_once(self).await
    }

    pub(crate) fn bringup_lease(session_id: &str) -> String {
        bringup_lease(session_id)
    }

    pub(crate) fn sandbox_handle(&self, s: &Session) -> Option<SandboxHandle> {
        self.handle(s)
    }

    pub(crate) async fn emit_session(&self, id: &str) {
        self.emit(id).await;
    }

    /// Pull the last interceptions, stop and remove the sandbox, in the background (the
    /// reconciler never waits on a slow stop).
    pub(crate) fn stop_in_background(self: &Arc<Self>, s: Session, handle: SandboxHandle) {
        let app = Arc::clone(self);
        tokio::spawn(async move {
            app.pull_before_stop(&s, &handle).await;
            app.destroy_sandbox(&handle).await;
        });
    }

    /// Count of sessions per status, for `/metrics`.
    pub async fn session_counts(&self) -> Vec<(Status, usize)> {
        let counts = self.store.count_sessions_by_status().await.unwrap_or_default();
        [Status::Creating, Status::Ready, Status::Dead, Status::Failed]
            .into_iter()
            .map(|st| {
                let n = counts.iter().find(|(s, _)| s == st.as_str()).map_or(0, |(_, n)| *n);
                (st, usize::try_from(n).unwrap_or(0))
            })
            .collect()
    }
}
