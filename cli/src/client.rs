//! The control plane's REST API (SPEC §3.2) as `lap` uses it: agents, sessions, messages,
//! secrets. Errors carry the server's own `{"error": …}` message.

use serde_json::{json, Value};

use crate::config::Creds;

const BASE: &str = "/api/v1/managed_agents";

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("the LAP server at {url} is unreachable ({cause}): is `lap-server` running there? (`lap login --url URL` or LAP_URL points lap at another)")]
    Unreachable { url: String, cause: String },
    #[error("the server refused the key ({message}): run `lap login`, or set MASTER_KEY (a local `lap-server` keeps its key in .lap/master_key)")]
    Unauthorized { message: String },
    /// The server's own error (`{"error": …}`); 5xx say the server failed.
    #[error("{}{message}", if *status >= 500 { format!("the server failed ({status}): ") } else { String::new() })]
    Api { status: u16, message: String },
    /// An answer without LAP's `{"error": …}` body: the URL is not a LAP server's.
    #[error("{url} answered {status} without a LAP error body: is it a `lap-server`? (`lap login --url URL` or LAP_URL points lap at another)")]
    NotLap { url: String, status: String },
    #[error("the server sent an unreadable answer: {0}")]
    Decode(String),
    #[error("{0}")]
    NotFound(String),
}

/// The server's advice in `lap`'s words: its messages name API calls (`POST /api/v1/secrets`)
/// where a `lap` user has a command.
pub(crate) fn cli_words(message: &str) -> String {
    const PHRASES: &[(&str, &str)] = &[
        ("(POST /api/v1/secrets)", "(`lap secrets set NAME --host HOST` adds it)"),
        (
            "stop them (DELETE /sessions/{id}) or delete with ?stop_sessions=true",
            "stop them (`lap stop SESSION`) or remove it with `lap agents rm AGENT --stop-sessions`",
        ),
    ];
    PHRASES
        .iter()
        .fold(message.to_owned(), |m, (api, cli)| m.replace(api, cli))
}

/// An API field and the `lap` flag that sets it, for [`ClientError::in_flags`].
pub(crate) type FieldFlags = &'static [(&'static str, &'static str)];

/// `lap agents create|edit`'s flags for the agent fields.
pub(crate) const AGENT_FLAGS: FieldFlags = &[
    ("harness_id", "--harness"),
    ("model", "--model"),
    ("repo_url", "--repo"),
    ("branch", "--branch"),
    ("prompt", "--prompt"),
    ("secrets", "--secret"),
    ("allow_out", "--allow-out"),
    ("deny_out", "--deny-out"),
    ("env_vars", "--env"),
    ("env_var_hosts", "--env-host"),
];

/// `lap secrets set`'s flags for the secret fields.
pub(crate) const SECRET_FLAGS: FieldFlags = &[("hosts", "--host"), ("locations", "--location"), ("value", "the value")];

/// `lap <agent>`'s flags for the session fields.
pub(crate) const SESSION_FLAGS: FieldFlags = &[("env_vars", "-e"), ("env_var_hosts", "-e")];

/// A message that starts with an API field (`allow_out[1]: …`, `harness_id: …`) in `lap`'s
/// words: the flag, and which of its repeats (`--allow-out #2: …`).
fn flag_words(message: &str, flags: FieldFlags) -> String {
    for (field, flag) in flags {
        let Some(rest) = message.strip_prefix(field) else {
            continue;
        };
        if let Some(rest) = rest.strip_prefix('[') {
            if let Some((index, rest)) = rest.split_once(']') {
                if let Ok(i) = index.parse::<usize>() {
                    return format!("{flag} #{}{rest}", i + 1);
                }
            }
        } else if let Some(key) = rest.strip_prefix('.') {
            return format!("{flag} {key}");
        } else if rest.starts_with(':') {
            return format!("{flag}{rest}");
        }
    }
    message.to_owned()
}

impl ClientError {
    /// The server's message with its leading API field named as the flag that set it.
    pub(crate) fn in_flags(self, flags: FieldFlags) -> Self {
        match self {
            Self::Api { status, message } => Self::Api {
                status,
                message: flag_words(&message, flags),
            },
            e => e,
        }
    }
}

/// The innermost cause of an error (`Connection refused`), which says what happened; the
/// outer layers only say where.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// A REST client for one server.
#[derive(Debug, Clone)]
pub(crate) struct Client {
    creds: Creds,
    http: reqwest::Client,
}

impl Client {
    pub(crate) fn new(creds: Creds) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| ClientError::Unreachable {
                url: creds.url.clone(),
                cause: root_cause(&e),
            })?;
        Ok(Self { creds, http })
    }

    pub(crate) fn creds(&self) -> &Creds {
        &self.creds
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.creds.url))
            .bearer_auth(&self.creds.key)
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let r = req.send().await.map_err(|e| ClientError::Unreachable {
            url: self.creds.url.clone(),
            cause: root_cause(&e),
        })?;
        if r.status().is_success() {
            return Ok(r);
        }
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        let Some(message) = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
        else {
            return Err(ClientError::NotLap {
                url: self.creds.url.clone(),
                status: status.to_string(),
            });
        };
        let status = status.as_u16();
        let message = cli_words(&message);
        if status == 401 {
            return Err(ClientError::Unauthorized { message });
        }
        Err(ClientError::Api { status, message })
    }

    async fn json(&self, req: reqwest::RequestBuilder) -> Result<Value, ClientError> {
        self.send(req)
            .await?
            .json()
            .await
            .map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// Every item of a paginated list.
    async fn all(&self, path: &str) -> Result<Vec<Value>, ClientError> {
        let mut out = Vec::new();
        loop {
            let sep = if path.contains('?') { '&' } else { '?' };
            let page = self
                .json(self.request(
                    reqwest::Method::GET,
                    &format!("{path}{sep}limit=200&offset={}", out.len()),
                ))
                .await?;
            let data = page["data"].as_array().cloned().unwrap_or_default();
            let total = page["total"].as_u64().unwrap_or(0);
            let done = data.is_empty();
            out.extend(data);
            if done || out.len() as u64 >= total {
                return Ok(out);
            }
        }
    }

    /// Check the key works (`lap login`).
    pub(crate) async fn check(&self) -> Result<(), ClientError> {
        self.json(self.request(reqwest::Method::GET, &format!("{BASE}/agents?limit=1")))
            .await
            .map(drop)
    }

    pub(crate) async fn agents(&self) -> Result<Vec<Value>, ClientError> {
        self.all(&format!("{BASE}/agents")).await
    }

    /// The agent named (or with the id) `name`.
    pub(crate) async fn agent(&self, name: &str) -> Result<Value, ClientError> {
        self.agents()
            .await?
            .into_iter()
            .find(|a| a["name"] == name || a["id"] == name)
            .ok_or_else(|| ClientError::NotFound(format!("no agent named `{name}`: `lap agents` lists them")))
    }

    pub(crate) async fn sessions(&self, agent_id: Option<&str>) -> Result<Vec<Value>, ClientError> {
        match agent_id {
            Some(a) => self.all(&format!("{BASE}/sessions?agent_id={a}")).await,
            None => self.all(&format!("{BASE}/sessions")).await,
        }
    }

    pub(crate) async fn session(&self, id: &str) -> Result<Value, ClientError> {
        self.json(self.request(reqwest::Method::GET, &format!("{BASE}/sessions/{id}")))
            .await
    }

    /// `GET /sessions/{id}/events`: the SSE response (session state changes, agent events).
    pub(crate) async fn events(&self, id: &str) -> Result<reqwest::Response, ClientError> {
        self.send(self.request(reqwest::Method::GET, &format!("{BASE}/sessions/{id}/events")))
            .await
    }

    pub(crate) async fn create_session(&self, agent_id: &str, body: Value) -> Result<Value, ClientError> {
        self.json(
            self.request(reqwest::Method::POST, &format!("{BASE}/agents/{agent_id}/session"))
                .json(&body),
        )
        .await
    }

    /// `POST /sessions/{id}/message_stream`: the SSE response.
    pub(crate) async fn message_stream(&self, id: &str, text: &str) -> Result<reqwest::Response, ClientError> {
        self.send(
            self.request(reqwest::Method::POST, &format!("{BASE}/sessions/{id}/message_stream"))
                .json(&json!({ "text": text })),
        )
        .await
    }

    /// `POST /agents`.
    pub(crate) async fn create_agent(&self, body: &Value) -> Result<Value, ClientError> {
        self.json(
            self.request(reqwest::Method::POST, &format!("{BASE}/agents"))
                .json(body),
        )
        .await
    }

    /// `PATCH /agents/{id}`.
    pub(crate) async fn patch_agent(&self, id: &str, body: &Value) -> Result<Value, ClientError> {
        self.json(
            self.request(reqwest::Method::PATCH, &format!("{BASE}/agents/{id}"))
                .json(body),
        )
        .await
    }

    /// `DELETE /agents/{id}[?stop_sessions=true]`.
    pub(crate) async fn delete_agent(&self, id: &str, stop_sessions: bool) -> Result<(), ClientError> {
        let q = if stop_sessions { "?stop_sessions=true" } else { "" };
        self.send(self.request(reqwest::Method::DELETE, &format!("{BASE}/agents/{id}{q}")))
            .await
            .map(drop)
    }

    /// `DELETE /sessions/{id}`: stops it; the session as it is now.
    pub(crate) async fn stop_session(&self, id: &str) -> Result<Value, ClientError> {
        self.json(self.request(reqwest::Method::DELETE, &format!("{BASE}/sessions/{id}")))
            .await
    }

    /// `GET /api/v1/audit?session_id=…`: every audit event of a session, oldest first.
    pub(crate) async fn audit(&self, session_id: &str) -> Result<Vec<Value>, ClientError> {
        self.all(&format!("/api/v1/audit?session_id={session_id}")).await
    }

    /// `GET /sessions/{id}/interceptions`: the vault's audit events of a session, pulled from its
    /// sidecar first when it is ready (so they are current), oldest first.
    pub(crate) async fn interceptions(&self, id: &str) -> Result<Vec<Value>, ClientError> {
        let v = self
            .json(self.request(reqwest::Method::GET, &format!("{BASE}/sessions/{id}/interceptions")))
            .await?;
        Ok(v.as_array().cloned().unwrap_or_default())
    }

    /// `GET /sessions/{id}/logs?source=…&tail=…`: `{"lines": […]}`.
    pub(crate) async fn logs(&self, id: &str, source: &str, tail: u32) -> Result<Value, ClientError> {
        self.json(self.request(
            reqwest::Method::GET,
            &format!("{BASE}/sessions/{id}/logs?source={source}&tail={tail}"),
        ))
        .await
    }

    /// `GET /api/v1/secrets` (values read back redacted).
    pub(crate) async fn secrets(&self) -> Result<Vec<Value>, ClientError> {
        self.all("/api/v1/secrets").await
    }

    /// `DELETE /api/v1/secrets/{name}` (revoked from running sessions too).
    pub(crate) async fn delete_secret(&self, name: &str) -> Result<(), ClientError> {
        self.send(self.request(reqwest::Method::DELETE, &format!("/api/v1/secrets/{name}")))
            .await
            .map(drop)
    }

    /// `PUT /api/v1/secrets/{name}` (creates or rotates).
    pub(crate) async fn put_secret(
        &self,
        name: &str,
        value: &str,
        hosts: &[String],
        locations: &[String],
    ) -> Result<Value, ClientError> {
        self.json(
            self.request(reqwest::Method::PUT, &format!("/api/v1/secrets/{name}"))
                .json(&json!({ "value": value, "hosts": hosts, "locations": locations })),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_advice_becomes_commands() {
        assert_eq!(
            cli_words("secrets[0]: no secret named `X` in the registry (POST /api/v1/secrets)"),
            "secrets[0]: no secret named `X` in the registry (`lap secrets set NAME --host HOST` adds it)"
        );
        let m = cli_words(
            "agent `a` has running sessions: s; stop them (DELETE /sessions/{id}) or delete with ?stop_sessions=true",
        );
        assert!(
            m.contains("lap agents rm AGENT --stop-sessions") && !m.contains("DELETE"),
            "{m}"
        );
        assert_eq!(cli_words("other"), "other");
    }

    #[test]
    fn api_fields_become_flags() {
        assert_eq!(
            flag_words("harness_id: must be one of claude-code, codex", AGENT_FLAGS),
            "--harness: must be one of claude-code, codex"
        );
        assert_eq!(
            flag_words("allow_out[1]: `a b` is not a host pattern", AGENT_FLAGS),
            "--allow-out #2: `a b` is not a host pattern"
        );
        assert_eq!(flag_words("env_vars.FOO: reserved", AGENT_FLAGS), "--env FOO: reserved");
        assert_eq!(flag_words("hosts[0]: empty", SECRET_FLAGS), "--host #1: empty");
        // A field name that only starts the same way, or a message without a field, is kept.
        assert_eq!(flag_words("models: x", AGENT_FLAGS), "models: x");
        assert_eq!(flag_words("no such agent", AGENT_FLAGS), "no such agent");
    }

    #[test]
    fn errors_read_as_lap_words() {
        let e = ClientError::Api {
            status: 400,
            message: "allow_out[0]: bad".into(),
        };
        assert_eq!(e.in_flags(AGENT_FLAGS).to_string(), "--allow-out #1: bad");
        let e = ClientError::Api {
            status: 503,
            message: "store unavailable".into(),
        };
        assert_eq!(e.to_string(), "the server failed (503): store unavailable");
    }
}
