//! `lap agents create|edit` flags and the request bodies they make (pure but for reading
//! `--env KEY` values from this environment): the flags mirror the API's agent fields
//! (`harness_id`, `model`, `repo_url`, `branch`, `prompt`, `secrets`, `allow_out`, `deny_out`,
//! `env_vars`, `env_var_hosts`).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// The fields both `create` and `edit` take.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct AgentFlags {
    /// The agent CLI: claude-code, codex, opencode or claude-agent-sdk.
    #[arg(long)]
    pub(crate) harness: Option<String>,
    /// The model the CLI is started with.
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// A git repository cloned into the workspace at bring-up.
    #[arg(long)]
    pub(crate) repo: Option<String>,
    /// The branch of --repo.
    #[arg(long)]
    pub(crate) branch: Option<String>,
    /// A system prompt for the agent.
    #[arg(long)]
    pub(crate) prompt: Option<String>,
    /// A registry secret the agent's sessions get (repeatable; `lap secrets list` shows them).
    /// On `edit`, replaces the list.
    #[arg(long = "secret", value_name = "NAME")]
    pub(crate) secrets: Vec<String>,
    /// A host its sessions may reach (repeatable; `allow_out`). On `edit`, replaces the list.
    #[arg(long = "allow-out", value_name = "HOST")]
    pub(crate) allow_out: Vec<String>,
    /// A host its sessions may not reach (repeatable; `deny_out`). On `edit`, replaces the list.
    #[arg(long = "deny-out", value_name = "HOST")]
    pub(crate) deny_out: Vec<String>,
    /// An agent-level secret env var, its value from this environment (`--env GITHUB_TOKEN`)
    /// or KEY=VALUE (repeatable). On `edit`, added to (or replacing) the stored ones.
    #[arg(long = "env", value_name = "KEY[=VALUE]")]
    pub(crate) env: Vec<String>,
    /// The hosts an env var's value may be sent to, for names without a built-in binding
    /// (`--env-host MY_TOKEN=api.example.com,*.example.com`; repeatable).
    #[arg(long = "env-host", value_name = "KEY=HOST[,HOST]")]
    pub(crate) env_hosts: Vec<String>,
}

/// A flag that does not say what it should.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FlagError {
    #[error("--env {0}: `{0}` is not set in this environment (or give --env {0}=VALUE)")]
    EnvUnset(String),
    #[error("--env-host {0}: expected KEY=HOST[,HOST]")]
    EnvHost(String),
    #[error("--clear {0}: one of secrets, allow-out, deny-out, env (model, prompt, repo and branch can be changed, not unset)")]
    Clear(String),
    #[error("--harness is required: claude-code, codex, opencode or claude-agent-sdk")]
    NoHarness,
    #[error("nothing to change: give a flag (`lap agents edit --help`)")]
    NothingToChange,
}

/// `-e KEY` (value from `get`) or `-e KEY=VALUE`.
pub(crate) fn env_values(
    specs: &[String],
    get: impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, FlagError> {
    let mut out = BTreeMap::new();
    for spec in specs {
        let (k, v) = match spec.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (
                spec.clone(),
                get(spec).ok_or_else(|| FlagError::EnvUnset(spec.clone()))?,
            ),
        };
        out.insert(k, v);
    }
    Ok(out)
}

fn env_hosts(specs: &[String]) -> Result<BTreeMap<String, Vec<String>>, FlagError> {
    let mut out = BTreeMap::new();
    for spec in specs {
        let (k, hosts) = spec
            .split_once('=')
            .filter(|(k, h)| !k.is_empty() && !h.is_empty())
            .ok_or_else(|| FlagError::EnvHost(spec.clone()))?;
        let hosts: Vec<String> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_owned)
            .collect();
        out.insert(k.to_owned(), hosts);
    }
    Ok(out)
}

/// The `POST /agents` body.
pub(crate) fn create_body(
    name: &str,
    f: &AgentFlags,
    get: impl Fn(&str) -> Option<String>,
) -> Result<Value, FlagError> {
    let harness = f.harness.clone().ok_or(FlagError::NoHarness)?;
    let mut b = json!({ "name": name, "harness_id": harness });
    for (key, v) in [
        ("model", &f.model),
        ("repo_url", &f.repo),
        ("branch", &f.branch),
        ("prompt", &f.prompt),
    ] {
        if let Some(v) = v {
            b[key] = json!(v);
        }
    }
    for (key, v) in [
        ("secrets", &f.secrets),
        ("allow_out", &f.allow_out),
        ("deny_out", &f.deny_out),
    ] {
        if !v.is_empty() {
            b[key] = json!(v);
        }
    }
    if !f.env.is_empty() {
        b["env_vars"] = json!(env_values(&f.env, get)?);
    }
    if !f.env_hosts.is_empty() {
        b["env_var_hosts"] = json!(env_hosts(&f.env_hosts)?);
    }
    Ok(b)
}

/// What `lap agents edit` changes beyond [`AgentFlags`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Edit {
    pub(crate) rename: Option<String>,
    pub(crate) add_secrets: Vec<String>,
    pub(crate) remove_secrets: Vec<String>,
    pub(crate) clear: Vec<String>,
}

/// The `PATCH /agents/{id}` body for `current` (the agent as the server shows it): only what the
/// flags change. Stored `env_vars` read back as `"<redacted>"`, which the server keeps as they are.
pub(crate) fn patch_body(
    current: &Value,
    f: &AgentFlags,
    e: &Edit,
    get: impl Fn(&str) -> Option<String>,
) -> Result<Value, FlagError> {
    let mut b = Map::new();
    if let Some(n) = &e.rename {
        b.insert("name".into(), json!(n));
    }
    if let Some(h) = &f.harness {
        b.insert("harness_id".into(), json!(h));
    }
    for (key, v) in [
        ("model", &f.model),
        ("repo_url", &f.repo),
        ("branch", &f.branch),
        ("prompt", &f.prompt),
    ] {
        if let Some(v) = v {
            b.insert(key.into(), json!(v));
        }
    }
    for (key, v) in [("allow_out", &f.allow_out), ("deny_out", &f.deny_out)] {
        if !v.is_empty() {
            b.insert(key.into(), json!(v));
        }
    }
    if !f.secrets.is_empty() || !e.add_secrets.is_empty() || !e.remove_secrets.is_empty() {
        let mut list: Vec<String> = if f.secrets.is_empty() {
            current["secrets"]
                .as_array()
                .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
                .unwrap_or_default()
        } else {
            f.secrets.clone()
        };
        for s in &e.add_secrets {
            if !list.contains(s) {
                list.push(s.clone());
            }
        }
        list.retain(|s| !e.remove_secrets.contains(s));
        b.insert("secrets".into(), json!(list));
    }
    if !f.env.is_empty() {
        let mut env: BTreeMap<String, String> = current["env_vars"]
            .as_object()
            .map(|o| o.keys().map(|k| (k.clone(), "<redacted>".to_owned())).collect())
            .unwrap_or_default();
        env.extend(env_values(&f.env, get)?);
        b.insert("env_vars".into(), json!(env));
    }
    if !f.env_hosts.is_empty() {
        let mut hosts: BTreeMap<String, Vec<String>> =
            serde_json::from_value(current["env_var_hosts"].clone()).unwrap_or_default();
        hosts.extend(env_hosts(&f.env_hosts)?);
        b.insert("env_var_hosts".into(), json!(hosts));
    }
    for c in &e.clear {
        let (key, empty) = match c.as_str() {
            // The server reads `"model": null` as "not given" (PatchAgent's plain
            // Option<Option<_>>), so model, prompt, repo and branch cannot be unset yet.
            "secrets" => ("secrets", json!([])),
            "allow-out" => ("allow_out", json!([])),
            "deny-out" => ("deny_out", json!([])),
            "env" => ("env_vars", json!({})),
            other => return Err(FlagError::Clear(other.to_owned())),
        };
        b.insert(key.into(), empty);
    }
    if b.is_empty() {
        return Err(FlagError::NothingToChange);
    }
    Ok(Value::Object(b))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn env(k: &str) -> Option<String> {
        (k == "HERE").then(|| "from-env".to_owned())
    }

    #[test]
    fn create_sends_only_what_was_given() {
        let f = AgentFlags {
            harness: Some("codex".into()),
            repo: Some("https://github.com/o/r".into()),
            secrets: vec!["GIT_TOKEN".into()],
            env: vec!["HERE".into(), "B=v=w".into()],
            env_hosts: vec!["B=a.example, *.b.example".into()],
            ..AgentFlags::default()
        };
        let b = create_body("coder", &f, env).unwrap();
        assert_eq!(
            b,
            json!({"name": "coder", "harness_id": "codex", "repo_url": "https://github.com/o/r",
                   "secrets": ["GIT_TOKEN"], "env_vars": {"HERE": "from-env", "B": "v=w"},
                   "env_var_hosts": {"B": ["a.example", "*.b.example"]}})
        );
        assert_eq!(create_body("x", &AgentFlags::default(), env), Err(FlagError::NoHarness));
        let unset = AgentFlags {
            harness: Some("codex".into()),
            env: vec!["NOT_HERE".into()],
            ..AgentFlags::default()
        };
        assert_eq!(
            create_body("x", &unset, env),
            Err(FlagError::EnvUnset("NOT_HERE".into()))
        );
        let bad = AgentFlags {
            harness: Some("codex".into()),
            env_hosts: vec!["NOHOSTS=".into()],
            ..AgentFlags::default()
        };
        assert!(matches!(create_body("x", &bad, env), Err(FlagError::EnvHost(_))));
    }

    #[test]
    fn edit_patches_the_changed_fields_and_keeps_stored_values() {
        let current = json!({"name": "coder", "harness_id": "claude-code", "secrets": ["A", "B"],
                             "env_vars": {"OLD": "<redacted>"}, "env_var_hosts": {"OLD": ["o.example"]}});
        let f = AgentFlags {
            model: Some("opus".into()),
            env: vec!["NEW=1".into()],
            ..AgentFlags::default()
        };
        let e = Edit {
            add_secrets: vec!["C".into(), "A".into()],
            remove_secrets: vec!["B".into()],
            clear: vec!["deny-out".into()],
            ..Edit::default()
        };
        let b = patch_body(&current, &f, &e, env).unwrap();
        assert_eq!(
            b,
            json!({"model": "opus", "secrets": ["A", "C"], "deny_out": [],
                   "env_vars": {"OLD": "<redacted>", "NEW": "1"}})
        );
        let replace = AgentFlags {
            secrets: vec!["Z".into()],
            ..AgentFlags::default()
        };
        assert_eq!(
            patch_body(&current, &replace, &Edit::default(), env).unwrap(),
            json!({"secrets": ["Z"]})
        );
        assert_eq!(
            patch_body(&current, &AgentFlags::default(), &Edit::default(), env),
            Err(FlagError::NothingToChange)
        );
        let bad = Edit {
            clear: vec!["model".into()],
            ..Edit::default()
        };
        assert_eq!(
            patch_body(&current, &AgentFlags::default(), &bad, env),
            Err(FlagError::Clear("model".into()))
        );
    }
}
