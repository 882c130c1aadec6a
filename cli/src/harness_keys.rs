//! The key each harness's agent CLI needs to answer (pure): `lap <agent>` warns before starting
//! a session that has none of them, which would come up `ready` and then ask for `/login`.

/// The env var names any one of which lets `harness` reach its model (empty: not known).
pub(crate) fn accepted(harness: &str) -> &'static [&'static str] {
    match harness {
        "claude-code" | "claude-agent-sdk" => &["ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN"],
        "codex" => &["OPENAI_API_KEY"],
        "opencode" => &[
            "ANTHROPIC_API_KEY",
            "OPENAI_API_KEY",
            "OPENROUTER_API_KEY",
            "GEMINI_API_KEY",
        ],
        _ => &[],
    }
}

/// The warning for a session of `agent` (the server's view) with these `-e` names, or `None`
/// when the session env, the agent's own `env_vars` or its registry `secrets` hold a key.
pub(crate) fn missing_key_warning(agent: &serde_json::Value, session_env: &[&str]) -> Option<String> {
    let harness = agent["harness_id"].as_str().unwrap_or_default();
    let keys = accepted(harness);
    if keys.is_empty() {
        return None;
    }
    let in_agent_env = |k: &str| agent["env_vars"].get(k).is_some();
    let in_secrets = |k: &str| {
        agent["secrets"]
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s.as_str() == Some(k)))
    };
    if keys
        .iter()
        .any(|k| session_env.contains(k) || in_agent_env(k) || in_secrets(k))
    {
        return None;
    }
    let name = agent["name"].as_str().unwrap_or_default();
    let key = keys[0];
    Some(format!(
        "warning: agent `{name}` ({harness}) has no {}: the session will start, but its agent cannot answer.\n  \
         Pass it: lap {name} -e {key}\n  \
         or bind it once: printf %s \"${key}\" | lap secrets set {key} --host <its API host> && lap agents edit {name} --add-secret {key}",
        keys.join(" or ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_claude_agent_without_a_key_is_warned_about() {
        let bare = json!({"name": "coder", "harness_id": "claude-code", "env_vars": {}, "secrets": []});
        let w = missing_key_warning(&bare, &[]).unwrap_or_default();
        assert!(
            w.contains("ANTHROPIC_API_KEY") && w.contains("lap coder -e ANTHROPIC_API_KEY"),
            "{w}"
        );
        assert_eq!(missing_key_warning(&bare, &["ANTHROPIC_API_KEY"]), None);
        assert_eq!(missing_key_warning(&bare, &["ANTHROPIC_AUTH_TOKEN"]), None);
        assert!(missing_key_warning(&bare, &["OPENAI_API_KEY"]).is_some());
        let bound = json!({"name": "c", "harness_id": "claude-code", "secrets": ["ANTHROPIC_API_KEY"]});
        assert_eq!(missing_key_warning(&bound, &[]), None);
        let own = json!({"name": "c", "harness_id": "claude-code", "env_vars": {"ANTHROPIC_API_KEY": "<redacted>"}});
        assert_eq!(missing_key_warning(&own, &[]), None);
    }

    #[test]
    fn codex_needs_an_openai_key_and_unknown_harnesses_are_left_alone() {
        let codex = json!({"name": "x", "harness_id": "codex"});
        assert!(missing_key_warning(&codex, &["ANTHROPIC_API_KEY"]).is_some());
        assert_eq!(missing_key_warning(&codex, &["OPENAI_API_KEY"]), None);
        assert_eq!(missing_key_warning(&json!({"harness_id": "future"}), &[]), None);
    }
}
