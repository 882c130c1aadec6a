//! The durable audit: what the vault sidecars intercepted and what was done to the platform,
//! kept in the database for `LAP_AUDIT_RETENTION` (default 30 days), across restarts and after
//! the sessions are gone.
//!
//! - **Interceptions** are pulled from each running session's sidecar (`GET /interceptions?after=`,
//!   the sidecar numbering its events per run), on every reconcile pass and once more before a
//!   sandbox is stopped; each is stored once (`<session>:<run>:<seq>`).
//! - **Admin actions** (`agent.create|update|delete`, `secret.create|update|delete`,
//!   `session.create|delete|attach|message`) are recorded by the API as they happen, with the
//!   actor: `api-key` (Bearer master key), `console` (a signed-in console), `tty-token` (a
//!   session's own terminal token), `server` (the server itself: idle stop).
//!
//! Values are never recorded: an interception names secrets only (the sidecar's own event), an
//! admin action names the resources and fields it touched.

use serde::{Deserialize, Serialize};

use crate::model::rfc3339;
use crate::store::AuditRow;

/// Who did it, for admin actions (set on the request by the auth middleware).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor(pub &'static str);

impl Actor {
    pub const API_KEY: Actor = Actor("api-key");
    pub const CONSOLE: Actor = Actor("console");
    pub const TTY_TOKEN: Actor = Actor("tty-token");
    pub const SERVER: Actor = Actor("server");
}

/// `GET /api/v1/audit` query.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    pub session_id: Option<String>,
    pub agent_id: Option<String>,
    pub secret: Option<String>,
    pub kind: Option<String>,
    pub limit: Option<i64>,
    pub offset: Option<i64>,
}

/// One audit event as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AuditView {
    pub id: String,
    pub time: String,
    pub kind: String,
    pub actor: String,
    pub session_id: Option<String>,
    pub agent_id: Option<String>,
    pub secrets: Vec<String>,
    pub detail: serde_json::Value,
}

/// `,A,B,` for names.
pub fn secrets_column(names: &[String]) -> String {
    if names.is_empty() {
        return String::new();
    }
    format!(",{},", names.join(","))
}

impl AuditRow {
    pub fn view(&self) -> AuditView {
        AuditView {
            id: self.id.clone(),
            time: rfc3339(self.time),
            kind: self.kind.clone(),
            actor: self.actor.clone(),
            session_id: self.session_id.clone(),
            agent_id: self.agent_id.clone(),
            secrets: self
                .secrets
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            detail: serde_json::from_str(&self.detail).unwrap_or(serde_json::Value::Null),
        }
    }
}

/// Where a session's interceptions were pulled to: the sidecar's run, and the last `seq` stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub run: String,
    pub seq: u64,
}

impl Cursor {
    pub fn parse(s: &str) -> Option<Self> {
        let (run, seq) = s.rsplit_once(':')?;
        Some(Self {
            run: run.to_owned(),
            seq: seq.parse().ok()?,
        })
    }

    pub fn render(&self) -> String {
        format!("{}:{}", self.run, self.seq)
    }
}

/// The `after` to ask a sidecar of run `run` for, given the stored cursor: the cursor's `seq` if
/// it is of that run, else 0 (the sidecar restarted and numbers from 1 again).
pub fn after_for(cursor: Option<&Cursor>, run: &str) -> u64 {
    match cursor {
        Some(c) if c.run == run => c.seq,
        _ => 0,
    }
}

/// The stored form of one sidecar event (`run`/`seq` from the event; unnumbered events, from an
/// older sidecar, get `seq` 0 and are kept by their content).
pub fn interception_row(session_id: &str, agent_id: &str, event: &serde_json::Value, now_ms: i64) -> AuditRow {
    let run = event["run"].as_str().unwrap_or("");
    let seq = event["seq"].as_u64().unwrap_or(0);
    let mut secrets: Vec<String> = event["injected"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["secret"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    if let Some(b) = event["blocked_secret"].as_str() {
        secrets.push(b.to_owned());
    }
    secrets.sort();
    secrets.dedup();
    let time = event["time"]
        .as_str()
        .and_then(|t| time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok())
        .map(|t| i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(now_ms))
        .unwrap_or(now_ms);
    AuditRow {
        id: format!("{session_id}:{run}:{seq}"),
        time,
        kind: "interception".into(),
        actor: "vault".into(),
        session_id: Some(session_id.to_owned()),
        agent_id: Some(agent_id.to_owned()),
        secrets: secrets_column(&secrets),
        detail: event.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn cursors_restart_with_the_sidecar() {
        let c = Cursor::parse("ab12:41").unwrap();
        assert_eq!(c.render(), "ab12:41");
        assert_eq!(after_for(Some(&c), "ab12"), 41);
        assert_eq!(after_for(Some(&c), "ff00"), 0, "another run numbers from 1 again");
        assert_eq!(after_for(None, "ab12"), 0);
        assert_eq!(Cursor::parse("nocolon"), None);
    }

    #[test]
    fn an_interception_is_stored_once_by_session_run_and_seq() {
        let e = serde_json::json!({
            "run": "ab12", "seq": 7, "time": "2026-12-01T10:00:00.5Z", "host": "api.anthropic.com",
            "injected": [{"secret": "B_KEY", "location": "header"}, {"secret": "A_KEY", "location": "query"}],
            "blocked_secret": "C_KEY"
        });
        let r = interception_row("ses_1", "agt_1", &e, 0);
        assert_eq!(r.id, "ses_1:ab12:7");
        assert_eq!(r.secrets, ",A_KEY,B_KEY,C_KEY,");
        assert_eq!(r.time, 1_796_119_200_500);
        assert_eq!(r.view().secrets, ["A_KEY", "B_KEY", "C_KEY"]);
        assert_eq!(r.view().detail["host"], "api.anthropic.com");
        assert_eq!(secrets_column(&[]), "");
    }
}
