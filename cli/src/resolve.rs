//! Which session a command means (pure): `lap attach`, `stop`, `send`, `audit` and `logs` take
//! a session id, a unique prefix of one (with or without `ses_`), or an agent's name or id (its
//! latest session, preferring a ready one).

use serde_json::Value;

/// Why a reference names no single session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResolveError {
    #[error("session `{0}` not found, and no agent has that name: `lap sessions --all` lists sessions")]
    NotFound(String),
    #[error("`{query}` is the start of {} session ids ({}): give more of one", .matches.len(), .matches.join(", "))]
    Ambiguous { query: String, matches: Vec<String> },
    #[error("agent `{0}` has no session: start one with `lap {0}`")]
    NoSession(String),
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// The session `query` means among `sessions` (the server's views) and `agents`: an exact id;
/// else an agent's name or id, whose newest `ready` session (else its newest live one, else its
/// newest of any status) it is; else the one id starting with `query` or `ses_` + `query`.
pub(crate) fn session<'a>(query: &str, sessions: &'a [Value], agents: &[Value]) -> Result<&'a Value, ResolveError> {
    if let Some(x) = sessions.iter().find(|x| s(x, "id") == query) {
        return Ok(x);
    }
    if let Some(agent) = agents.iter().find(|a| s(a, "name") == query || s(a, "id") == query) {
        let aid = s(agent, "id");
        let name = s(agent, "name");
        let mut own: Vec<&Value> = sessions.iter().filter(|x| s(x, "agent_id") == aid).collect();
        // RFC 3339 UTC times of one format sort as text.
        own.sort_by(|a, b| s(b, "created_at").cmp(s(a, "created_at")));
        let pick = own
            .iter()
            .find(|x| s(x, "status") == "ready")
            .or_else(|| own.iter().find(|x| s(x, "status") == "creating"))
            .or_else(|| own.first());
        return pick.copied().ok_or_else(|| ResolveError::NoSession(name.to_owned()));
    }
    let prefixed = format!("ses_{query}");
    let matches: Vec<&Value> = sessions
        .iter()
        .filter(|x| !query.is_empty() && (s(x, "id").starts_with(query) || s(x, "id").starts_with(&prefixed)))
        .collect();
    match matches.as_slice() {
        [one] => Ok(*one),
        [] => Err(ResolveError::NotFound(query.to_owned())),
        many => Err(ResolveError::Ambiguous {
            query: query.to_owned(),
            matches: many.iter().map(|x| s(x, "id").to_owned()).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn fixtures() -> (Vec<Value>, Vec<Value>) {
        let agents = vec![
            json!({"id": "agt_1", "name": "coder"}),
            json!({"id": "agt_2", "name": "idle"}),
        ];
        let sessions = vec![
            json!({"id": "ses_abc1", "agent_id": "agt_1", "status": "dead", "created_at": "2026-12-01T10:00:00.000Z"}),
            json!({"id": "ses_abd2", "agent_id": "agt_1", "status": "ready", "created_at": "2026-12-01T11:00:00.000Z"}),
            json!({"id": "ses_xyz3", "agent_id": "agt_1", "status": "ready", "created_at": "2026-12-01T12:00:00.000Z"}),
            json!({"id": "ses_qqq4", "agent_id": "agt_1", "status": "failed", "created_at": "2026-12-01T13:00:00.000Z"}),
        ];
        (sessions, agents)
    }

    #[test]
    fn ids_prefixes_and_agent_names() {
        let (sessions, agents) = fixtures();
        let id = |q: &str| session(q, &sessions, &agents).map(|v| v["id"].as_str().unwrap().to_owned());
        assert_eq!(id("ses_abc1").unwrap(), "ses_abc1");
        assert_eq!(id("ses_x").unwrap(), "ses_xyz3");
        assert_eq!(id("xy").unwrap(), "ses_xyz3", "prefix without ses_");
        // The newest ready one, not the newer failed one nor the dead one.
        assert_eq!(id("coder").unwrap(), "ses_xyz3");
        assert_eq!(id("agt_1").unwrap(), "ses_xyz3");
        assert_eq!(id("idle"), Err(ResolveError::NoSession("idle".into())));
        assert_eq!(id("nope"), Err(ResolveError::NotFound("nope".into())));
        assert_eq!(id(""), Err(ResolveError::NotFound(String::new())));
        let e = id("ab").unwrap_err();
        assert!(
            matches!(&e, ResolveError::Ambiguous { matches, .. } if matches.len() == 2),
            "{e}"
        );
        assert!(e.to_string().contains("ses_abc1, ses_abd2"), "{e}");
        assert!(id("nope").unwrap_err().to_string().contains("not found"));
    }

    #[test]
    fn an_agent_with_only_dead_sessions_gives_its_newest() {
        let agents = vec![json!({"id": "agt_1", "name": "coder"})];
        let sessions = vec![
            json!({"id": "ses_1", "agent_id": "agt_1", "status": "dead", "created_at": "2026-12-01T10:00:00.000Z"}),
            json!({"id": "ses_2", "agent_id": "agt_1", "status": "dead", "created_at": "2026-12-01T11:00:00.000Z"}),
        ];
        assert_eq!(session("coder", &sessions, &agents).unwrap()["id"], "ses_2");
    }
}
