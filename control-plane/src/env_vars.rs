//! Per-session `env_vars` (SPEC §3.3): validation, host binding and stub minting.
//!
//! Everything here is pure: [`validate`] checks a request's map against every rule and returns
//! the host binding of each key, or the first violation naming its key; [`mint_stub`] makes a
//! fresh stub from a caller-supplied RNG. The values themselves only ever go to the sidecar.

use std::collections::BTreeMap;

use lap_vault_config::MIN_VALUE_LEN;
use rand::Rng;

/// At most this many keys per session.
pub const MAX_KEYS: usize = 50;
/// At most this many bytes for the JSON of the whole map.
pub const MAX_JSON_BYTES: usize = 16 * 1024;

/// Names the platform sets itself; a user may not override them (compared exactly).
const RESERVED: &[&str] = &[
    "REPO_URL",
    "BRANCH",
    "LITELLM_API_KEY",
    "LITELLM_API_BASE",
    "LITELLM_DEFAULT_MODEL",
    "AGENT_PROMPT",
    "PORT",
    "GIT_TOKEN",
    "AGENT_REQUIREMENTS",
    "HARNESS_AUTH_TOKEN",
    "NODE_USE_ENV_PROXY",
    "SSL_CERT_DIR",
    // Extension: the harness process needs its own HOME and PATH.
    "HOME",
    "PATH",
];

/// Names that change how the sandbox's loaders, interpreters and shells start programs, or that
/// name a program to run: an `env_vars` entry (whose value the harness sees as a stub) or an
/// agent's plain environment must not set them. Exact names; prefixes are in
/// [`RESERVED_PREFIXES`].
const RESERVED_HOOKS: &[&str] = &[
    // Node, Bun, Deno
    "NODE_OPTIONS",
    "NODE_PATH",
    "NODE_REPL_EXTERNAL_MODULE",
    "BUN_OPTIONS",
    "DENO_DIR",
    // Shells: start-up files and hooks
    "BASH_ENV",
    "ENV",
    "ZDOTDIR",
    "PROMPT_COMMAND",
    "PS4",
    "IFS",
    "SHELL",
    "SHELLOPTS",
    "BASHOPTS",
    "CDPATH",
    "GLOBIGNORE",
    // git: programs it runs and configuration it reads
    "GIT_ASKPASS",
    "GIT_EDITOR",
    "GIT_EXEC_PATH",
    "GIT_EXTERNAL_DIFF",
    "GIT_PAGER",
    "GIT_PROXY_COMMAND",
    "GIT_CONFIG",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_CONFIG_COUNT",
    "GIT_TEMPLATE_DIR",
    "SSH_ASKPASS",
    // Other interpreters' start-up hooks
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    // Programs other programs run for you
    "EDITOR",
    "VISUAL",
    "PAGER",
    "BROWSER",
    "MANPAGER",
    "LESSOPEN",
    "LESSCLOSE",
    // Where temporary files and the user's files go
    "TMPDIR",
    "TMP",
    "TEMP",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_RUNTIME_DIR",
    "USER",
    "LOGNAME",
];

/// Prefixes of reserved names: the dynamic loader (`LD_PRELOAD`, `LD_LIBRARY_PATH`, `LD_AUDIT`),
/// ssh as git runs it (`GIT_SSH`, `GIT_SSH_COMMAND`), git's per-variable configuration
/// (`GIT_CONFIG_KEY_0`, `GIT_CONFIG_VALUE_0`), Python's start-up (`PYTHONSTARTUP`,
/// `PYTHONPATH`, `PYTHONHOME`, …), glibc's malloc and locale hooks (`GCONV_PATH`), and
/// `BASH_FUNC_` exported shell functions.
const RESERVED_PREFIXES: &[&str] = &[
    "LD_",
    "GIT_SSH",
    "GIT_CONFIG_",
    "PYTHON",
    "BASH_FUNC_",
    "GCONV_",
    "MALLOC_",
];

/// Proxy and CA variables of SPEC §2.3, reserved in either case.
const RESERVED_ANY_CASE: &[&str] = &[
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "NODE_EXTRA_CA_CERTS",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "CARGO_HTTP_CAINFO",
    // Extension: codex's CA bundle variable, set like the others.
    "CODEX_CA_CERTIFICATE",
];

/// Built-in host bindings for well-known names.
const BUILTIN_HOSTS: &[(&str, &[&str])] = &[
    (
        "GITHUB_TOKEN",
        &["github.com", "api.github.com", "*.githubusercontent.com"],
    ),
    ("GH_TOKEN", &["github.com", "api.github.com", "*.githubusercontent.com"]),
    ("ANTHROPIC_API_KEY", &["api.anthropic.com"]),
    ("ANTHROPIC_AUTH_TOKEN", &["api.anthropic.com"]),
    ("OPENAI_API_KEY", &["api.openai.com", "chatgpt.com"]),
    ("CIRCLECI_TOKEN", &["circleci.com"]),
    ("GITLAB_TOKEN", &["gitlab.com"]),
    ("NPM_TOKEN", &["registry.npmjs.org"]),
    ("HF_TOKEN", &["huggingface.co", "*.huggingface.co"]),
    ("GEMINI_API_KEY", &["generativelanguage.googleapis.com"]),
    ("GOOGLE_API_KEY", &["generativelanguage.googleapis.com"]),
    ("OPENROUTER_API_KEY", &["openrouter.ai"]),
    ("GROQ_API_KEY", &["api.groq.com"]),
    ("MISTRAL_API_KEY", &["api.mistral.ai"]),
];

/// Built-in credential surfaces for well-known names that take their key somewhere beyond the
/// credential headers (the sidecar's bare `header`, every other name's default).
const BUILTIN_SURFACES: &[(&str, &[&str])] = &[
    // Google's Generative Language API: `x-goog-api-key`, or the `key` query parameter.
    ("GEMINI_API_KEY", &["header", "query:key"]),
    ("GOOGLE_API_KEY", &["header", "query:key"]),
];

/// Recognisable prefixes kept on stubs, longest first so the most specific wins.
const STUB_PREFIXES: &[&str] = &[
    "sk-ant-api03-",
    "sk-ant-oat01-",
    "github_pat_",
    "sk-ant-",
    "sk-proj-",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "ghp_",
    "gho_",
    "ghs_",
    "ghu_",
    "ghr_",
    "npm_",
    "gsk_",
    "AIza",
    "hf_",
    "sk-",
];

/// Random characters in a stub: 32 base-62 characters, about 190 bits.
const STUB_RANDOM_CHARS: usize = 32;

/// One rule broken, naming the offending key (`env_vars.FOO`) or the map (`env_vars`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct EnvVarError {
    pub field: String,
    pub reason: String,
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> EnvVarError {
    EnvVarError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A validated key with the hosts its value may be sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub name: String,
    pub hosts: Vec<String>,
    /// Its credential surfaces (the sidecar's `locations`); empty for the default, `["header"]`.
    pub surfaces: Vec<String>,
}

/// Whether `key` matches `^[A-Za-z_][A-Za-z0-9_]*$`.
pub fn is_valid_name(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Why `key` is reserved, if it is.
pub fn reserved_reason(key: &str) -> Option<&'static str> {
    if key.len() >= 4 && key[..4].eq_ignore_ascii_case("LAP_") {
        return Some("LAP_* names are reserved for the platform");
    }
    if RESERVED.contains(&key) {
        return Some("this name is set by the platform and cannot be overridden");
    }
    if RESERVED_ANY_CASE.iter().any(|r| r.eq_ignore_ascii_case(key)) {
        return Some("proxy and CA variables are set by the platform and cannot be overridden");
    }
    if RESERVED_HOOKS.contains(&key) || RESERVED_PREFIXES.iter().any(|p| key.starts_with(p)) {
        return Some(
            "this name changes how the sandbox's loaders, interpreters or shells start programs \
             (LD_*, NODE_OPTIONS, BASH_ENV, PYTHON*, GIT_SSH*, EDITOR, TMPDIR, …) and is reserved",
        );
    }
    None
}

/// The built-in host binding for a well-known name.
pub fn builtin_hosts(key: &str) -> Option<&'static [&'static str]> {
    BUILTIN_HOSTS.iter().find(|(k, _)| *k == key).map(|(_, h)| *h)
}

/// The built-in credential surfaces of a well-known name; empty for the default.
pub fn builtin_surfaces(key: &str) -> &'static [&'static str] {
    BUILTIN_SURFACES
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(&[], |(_, s)| *s)
}

/// Check a secret's credential surfaces (`field`, the sidecar's `locations`): each `header`,
/// `header:NAME`, `query`, `query:NAME`, `body` or `body:METHOD /PATH`.
pub fn validate_surfaces(field: &str, surfaces: &[String]) -> Result<(), EnvVarError> {
    for (i, s) in surfaces.iter().enumerate() {
        s.parse::<lap_vault_config::Surface>()
            .map_err(|e| err(format!("{field}[{i}]"), e))?;
    }
    Ok(())
}

/// Check the hosts a value may be sent to (`field`): each a host pattern with its port, 443
/// unless written (`api.example.com`, `git.example.com:8443`).
pub fn validate_hosts(field: &str, hosts: &[String]) -> Result<(), EnvVarError> {
    if hosts.is_empty() {
        return Err(err(field, "must list at least one host"));
    }
    for (i, h) in hosts.iter().enumerate() {
        h.parse::<lap_vault_config::Binding>()
            .map_err(|e| err(format!("{field}[{i}]"), e.to_string()))?;
    }
    Ok(())
}

/// A value the vault can send in a header, query or body: printable ASCII (space to `~`), so no
/// CR, LF, NUL or other control byte that would break the request it is swapped into; and at
/// least [`MIN_VALUE_LEN`] bytes, the shortest value the sidecar can redact from what comes back.
pub fn check_value(field: &str, value: &str) -> Result<(), EnvVarError> {
    match value.bytes().position(|b| !(0x20..=0x7e).contains(&b)) {
        None if value.len() < MIN_VALUE_LEN => Err(err(
            field,
            format!(
                "the value is {} byte{}; at least {MIN_VALUE_LEN} are required (a shorter one would match \
                 ordinary bytes, so the vault could not redact it from responses)",
                value.len(),
                if value.len() == 1 { "" } else { "s" }
            ),
        )),
        None => Ok(()),
        Some(i) => Err(err(
            field,
            format!(
                "the value holds byte {:#04x} at offset {i}: values must be printable ASCII \
                 (no CR, LF, NUL or other control characters)",
                value.as_bytes()[i]
            ),
        )),
    }
}

/// Validate an agent's plain `env` (non-secret variables the harness sees as they are): the
/// same names as `env_vars` (valid, not reserved), at most [`MAX_KEYS`] keys and
/// [`MAX_JSON_BYTES`] of JSON, no NUL in a value; and not a well-known secret's name
/// (`ANTHROPIC_API_KEY`, …: those go in `env_vars`, so the harness holds a stub). `field` names
/// the map (`env`).
pub fn validate_plain(field: &str, env: &BTreeMap<String, String>) -> Result<(), EnvVarError> {
    if env.len() > MAX_KEYS {
        return Err(err(
            field,
            format!("at most {MAX_KEYS} keys are allowed, got {}", env.len()),
        ));
    }
    let size = serde_json::to_string(env).map(|s| s.len()).unwrap_or(usize::MAX);
    if size > MAX_JSON_BYTES {
        return Err(err(
            field,
            format!("at most {MAX_JSON_BYTES} bytes of JSON are allowed, got {size}"),
        ));
    }
    for (key, value) in env {
        let f = format!("{field}.{key}");
        if !is_valid_name(key) {
            return Err(err(f, "key must match ^[A-Za-z_][A-Za-z0-9_]*$"));
        }
        if let Some(reason) = reserved_reason(key) {
            return Err(err(f, reason));
        }
        if builtin_hosts(key).is_some() {
            return Err(err(
                f,
                "a secret's name: put it in env_vars, so the harness holds a stub and the vault the value",
            ));
        }
        if value.contains('\0') {
            return Err(err(f, "the value holds a NUL byte"));
        }
    }
    Ok(())
}

/// Validate a session's `env_vars` against SPEC §3.3.
///
/// `env_var_hosts` are the request's bindings; `inherited_hosts` those of the agent (consulted
/// next); the built-in table last. Returns one [`Binding`] per key, in key order.
pub fn validate(
    env_vars: &BTreeMap<String, String>,
    env_var_hosts: &BTreeMap<String, Vec<String>>,
    inherited_hosts: &BTreeMap<String, Vec<String>>,
) -> Result<Vec<Binding>, EnvVarError> {
    if env_vars.len() > MAX_KEYS {
        return Err(err(
            "env_vars",
            format!("at most {MAX_KEYS} keys are allowed, got {}", env_vars.len()),
        ));
    }
    let size = serde_json::to_string(env_vars).map(|s| s.len()).unwrap_or(usize::MAX);
    if size > MAX_JSON_BYTES {
        return Err(err(
            "env_vars",
            format!("at most {MAX_JSON_BYTES} bytes of JSON are allowed, got {size}"),
        ));
    }
    for key in env_var_hosts.keys() {
        if !env_vars.contains_key(key) {
            return Err(err(
                format!("env_var_hosts.{key}"),
                "binds a key that is not in env_vars",
            ));
        }
    }
    let mut bindings = Vec::with_capacity(env_vars.len());
    for (key, value) in env_vars {
        let field = format!("env_vars.{key}");
        if !is_valid_name(key) {
            return Err(err(field, "key must match ^[A-Za-z_][A-Za-z0-9_]*$"));
        }
        if let Some(reason) = reserved_reason(key) {
            return Err(err(field, reason));
        }
        if value.is_empty() {
            return Err(err(field, "value must not be empty"));
        }
        check_value(&field, value)?;
        let hosts = if let Some(hosts) = env_var_hosts.get(key) {
            validate_hosts(&format!("env_var_hosts.{key}"), hosts)?;
            hosts.clone()
        } else if let Some(hosts) = inherited_hosts.get(key) {
            hosts.clone()
        } else if let Some(hosts) = builtin_hosts(key) {
            hosts.iter().map(|h| (*h).to_owned()).collect()
        } else {
            return Err(err(
                field,
                format!(
                    "no host binding: the vault only sends a value to hosts it is bound to; \
                     add \"env_var_hosts\": {{\"{key}\": [\"api.example.com\"]}}"
                ),
            ));
        };
        bindings.push(Binding {
            name: key.clone(),
            hosts,
            surfaces: builtin_surfaces(key).iter().map(|s| (*s).to_owned()).collect(),
        });
    }
    Ok(bindings)
}

/// The recognisable prefix of a real value that a stub keeps, if any.
pub fn stub_prefix(value: &str) -> &'static str {
    STUB_PREFIXES
        .iter()
        .find(|p| value.starts_with(**p))
        .copied()
        .unwrap_or("")
}

/// A fresh stub for `value`: its recognisable prefix, `lapstub`, then 32 random base-62
/// characters (about 190 bits).
pub fn mint_stub<R: Rng + ?Sized>(value: &str, rng: &mut R) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut stub = String::with_capacity(64);
    stub.push_str(stub_prefix(value));
    stub.push_str("lapstub");
    for _ in 0..STUB_RANDOM_CHARS {
        stub.push(char::from(ALPHABET[rng.gen_range(0..ALPHABET.len())]));
    }
    stub
}

#[cfg(test)]
mod plain_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn plain_env_follows_the_env_vars_names_rules() {
        validate_plain("env", &map(&[("API_BASE", "https://x.example/v1"), ("FLAG", "a b\nc")])).unwrap();
        for (key, says) in [
            ("PATH", "env.PATH"),
            ("LD_PRELOAD", "env.LD_PRELOAD"),
            ("https_proxy", "env.https_proxy"),
            ("LAP_X", "env.LAP_X"),
            ("NODE_OPTIONS", "env.NODE_OPTIONS"),
            ("1X", "env.1X"),
            ("ANTHROPIC_API_KEY", "env_vars"),
        ] {
            let e = validate_plain("env", &map(&[(key, "v")])).unwrap_err();
            assert!(e.to_string().contains(says), "{key}: {e}");
        }
        assert!(validate_plain("env", &map(&[("A", "x\0y")])).is_err());
        let many: BTreeMap<String, String> = (0..=MAX_KEYS).map(|i| (format!("K{i}"), "v".to_owned())).collect();
        assert!(validate_plain("env", &many)
            .unwrap_err()
            .to_string()
            .starts_with("env:"));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rand::SeedableRng;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn hosts(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.iter().map(|h| (*h).to_owned()).collect()))
            .collect()
    }

    fn check(vars: &[(&str, &str)]) -> Result<Vec<Binding>, EnvVarError> {
        validate(&map(vars), &BTreeMap::new(), &BTreeMap::new())
    }

    #[test]
    fn empty_map_is_fine() {
        assert_eq!(check(&[]).unwrap(), vec![]);
    }

    #[test]
    fn builtin_table_binds_well_known_names() {
        let b = check(&[
            ("ANTHROPIC_API_KEY", "sk-ant-x"),
            ("GITHUB_TOKEN", "ghp_x_value"),
            ("OPENAI_API_KEY", "sk-x-value"),
        ])
        .unwrap();
        assert_eq!(b[0].name, "ANTHROPIC_API_KEY");
        assert_eq!(b[0].hosts, vec!["api.anthropic.com"]);
        assert_eq!(
            b[1].hosts,
            vec!["github.com", "api.github.com", "*.githubusercontent.com"]
        );
        assert_eq!(b[2].hosts, vec!["api.openai.com", "chatgpt.com"]);
        assert_eq!(check(&[("GH_TOKEN", "x-value-1")]).unwrap()[0].hosts.len(), 3);
        assert_eq!(
            check(&[("CIRCLECI_TOKEN", "x-value-1")]).unwrap()[0].hosts,
            vec!["circleci.com"]
        );
    }

    #[test]
    fn builtin_table_declares_the_surfaces_beyond_credential_headers() {
        let b = check(&[("GEMINI_API_KEY", "AIza-value-1"), ("ANTHROPIC_API_KEY", "sk-ant-x")]).unwrap();
        let by_name = |n: &str| b.iter().find(|b| b.name == n).unwrap().surfaces.clone();
        assert_eq!(by_name("GEMINI_API_KEY"), vec!["header", "query:key"]);
        assert!(
            by_name("ANTHROPIC_API_KEY").is_empty(),
            "the default: the credential headers"
        );
        assert!(validate_surfaces(
            "locations",
            &["header:x-api-key".into(), "body:POST /oauth/token".into()]
        )
        .is_ok());
        let e = validate_surfaces("locations", &["header".into(), "cookie".into()]).unwrap_err();
        assert_eq!(e.field, "locations[1]");
        assert!(e.reason.contains("is not one of"), "{e}");
    }

    #[test]
    fn unknown_name_without_binding_says_how_to_bind() {
        let e = check(&[("MY_TOKEN", "v-value-1")]).unwrap_err();
        assert_eq!(e.field, "env_vars.MY_TOKEN");
        assert!(e.reason.contains("env_var_hosts"), "{e}");
    }

    #[test]
    fn explicit_binding_wins_over_inherited_and_builtin() {
        let b = validate(
            &map(&[("ANTHROPIC_API_KEY", "k-value-1"), ("MY_TOKEN", "v-value-1")]),
            &hosts(&[("ANTHROPIC_API_KEY", &["llm.internal"])]),
            &hosts(&[("MY_TOKEN", &["*.corp.example"])]),
        )
        .unwrap();
        assert_eq!(b[0].hosts, vec!["llm.internal"]);
        assert_eq!(b[1].hosts, vec!["*.corp.example"]);
    }

    #[test]
    fn bad_binding_names_the_host() {
        let e = validate(
            &map(&[("A", "v-value-1")]),
            &hosts(&[("A", &["ok.example", "bad host"])]),
            &BTreeMap::new(),
        )
        .unwrap_err();
        assert_eq!(e.field, "env_var_hosts.A[1]");
        let e = validate(&map(&[("A", "v-value-1")]), &hosts(&[("A", &[])]), &BTreeMap::new()).unwrap_err();
        assert_eq!(e.field, "env_var_hosts.A");
        let e = validate(&map(&[]), &hosts(&[("A", &["x.example"])]), &BTreeMap::new()).unwrap_err();
        assert_eq!(e.field, "env_var_hosts.A");
    }

    #[test]
    fn key_syntax() {
        for bad in ["", "1ABC", "A-B", "A B", "É", "A.B", "a=b"] {
            let e = validate(&map(&[(bad, "v")]), &hosts(&[]), &BTreeMap::new()).unwrap_err();
            assert_eq!(e.field, format!("env_vars.{bad}"), "{bad}");
            assert!(e.reason.contains("must match"), "{bad}: {e}");
        }
        for good in ["_", "a", "_A1", "abc_DEF_9"] {
            assert!(is_valid_name(good), "{good}");
        }
    }

    #[test]
    fn reserved_names_are_refused() {
        let reserved = [
            "REPO_URL",
            "BRANCH",
            "LITELLM_API_KEY",
            "LITELLM_API_BASE",
            "LITELLM_DEFAULT_MODEL",
            "AGENT_PROMPT",
            "PORT",
            "GIT_TOKEN",
            "AGENT_REQUIREMENTS",
            "HARNESS_AUTH_TOKEN",
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "NO_PROXY",
            "no_proxy",
            "ALL_PROXY",
            "all_proxy",
            "NODE_EXTRA_CA_CERTS",
            "SSL_CERT_FILE",
            "ssl_cert_file",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
            "CARGO_HTTP_CAINFO",
            "NODE_USE_ENV_PROXY",
            "SSL_CERT_DIR",
            "LAP_ANYTHING",
            "LAP_",
            "lap_x",
            "HOME",
        ];
        for key in reserved {
            let e = check(&[(key, "v")]).unwrap_err();
            assert_eq!(e.field, format!("env_vars.{key}"), "{key}");
        }
        assert!(reserved_reason("LAPTOP_KEY").is_none());
        assert!(reserved_reason("port").is_none());
    }

    #[test]
    fn loader_interpreter_and_shell_hooks_are_refused() {
        for key in [
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "LD_AUDIT",
            "NODE_OPTIONS",
            "BASH_ENV",
            "ENV",
            "PROMPT_COMMAND",
            "GIT_SSH",
            "GIT_SSH_COMMAND",
            "GIT_ASKPASS",
            "GIT_CONFIG_GLOBAL",
            "GIT_CONFIG_KEY_0",
            "PYTHONSTARTUP",
            "PYTHONPATH",
            "PERL5OPT",
            "RUBYOPT",
            "JAVA_TOOL_OPTIONS",
            "TMPDIR",
            "BROWSER",
            "EDITOR",
            "VISUAL",
            "PAGER",
            "BASH_FUNC_ls%%",
        ] {
            let reason = reserved_reason(key).unwrap_or_else(|| panic!("{key} is not reserved"));
            assert!(reason.contains("reserved"), "{key}: {reason}");
        }
        for ok in [
            "GITHUB_TOKEN",
            "NODE_ENV_TOKEN",
            "EDITORIAL_KEY",
            "ENVOY_TOKEN",
            "LDAP_PASSWORD",
        ] {
            assert!(reserved_reason(ok).is_none(), "{ok}");
        }
    }

    #[test]
    fn values_the_vault_cannot_send_are_refused() {
        for bad in ["a\r\nX-Injected: 1", "line\n", "nul\0", "tab\there", "é"] {
            let e = validate(&map(&[("ANTHROPIC_API_KEY", bad)]), &hosts(&[]), &BTreeMap::new()).unwrap_err();
            assert_eq!(e.field, "env_vars.ANTHROPIC_API_KEY", "{bad:?}");
            assert!(e.reason.contains("printable ASCII"), "{bad:?}: {e}");
        }
        assert!(check_value("v", "sk-ant-api03 with spaces ~!").is_ok());
    }

    #[test]
    fn values_too_short_to_redact_are_refused() {
        let e = check_value("value", "1234567").unwrap_err();
        assert_eq!(e.field, "value");
        assert!(e.reason.contains("7 bytes") && e.reason.contains("at least 8"), "{e}");
        assert!(
            !e.reason.contains("1234567"),
            "the error must not repeat the value: {e}"
        );
        assert!(check_value("value", "12345678").is_ok());
    }

    #[test]
    fn empty_value_is_refused() {
        assert_eq!(
            check(&[("GITHUB_TOKEN", "")]).unwrap_err().field,
            "env_vars.GITHUB_TOKEN"
        );
    }

    #[test]
    fn fifty_keys_is_the_limit() {
        let keys: Vec<String> = (0..51).map(|i| format!("K{i}")).collect();
        let all: BTreeMap<String, String> = keys.iter().map(|k| (k.clone(), "v-value-1".to_owned())).collect();
        let bind: BTreeMap<String, Vec<String>> =
            keys.iter().map(|k| (k.clone(), vec!["h.example".to_owned()])).collect();
        let e = validate(&all, &BTreeMap::new(), &bind).unwrap_err();
        assert_eq!(e.field, "env_vars");
        assert!(e.reason.contains("50"));
        let fifty: BTreeMap<String, String> = all.into_iter().take(50).collect();
        assert_eq!(validate(&fifty, &BTreeMap::new(), &bind).unwrap().len(), 50);
    }

    #[test]
    fn sixteen_kilobytes_is_the_limit() {
        // {"GITHUB_TOKEN":"…"} is 19 bytes of framing.
        let fits = "x".repeat(MAX_JSON_BYTES - 19);
        assert!(check(&[("GITHUB_TOKEN", &fits)]).is_ok());
        let over = "x".repeat(MAX_JSON_BYTES - 18);
        let e = check(&[("GITHUB_TOKEN", &over)]).unwrap_err();
        assert_eq!(e.field, "env_vars");
        assert!(e.reason.contains("16384"));
    }

    #[test]
    fn stubs_keep_recognisable_prefixes() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for (value, prefix) in [
            ("sk-ant-api03-REALREAL", "sk-ant-api03-"),
            ("sk-ant-xyz", "sk-ant-"),
            ("sk-proj-abc", "sk-proj-"),
            ("sk-abc", "sk-"),
            ("ghp_abc", "ghp_"),
            ("github_pat_abc", "github_pat_"),
            ("glpat-abc", "glpat-"),
            ("plainvalue", ""),
        ] {
            let stub = mint_stub(value, &mut rng);
            assert!(stub.starts_with(&format!("{prefix}lapstub")), "{value} -> {stub}");
            assert_eq!(stub.len(), prefix.len() + 7 + STUB_RANDOM_CHARS);
            assert!(!stub.contains(&value[prefix.len()..]) || value.len() == prefix.len());
        }
    }

    #[test]
    fn stubs_are_unique() {
        let mut rng = rand::thread_rng();
        let stubs: std::collections::HashSet<String> = (0..1000).map(|_| mint_stub("sk-ant-x", &mut rng)).collect();
        assert_eq!(stubs.len(), 1000);
        // 32 base-62 characters carry log2(62)*32 ≈ 190 bits.
        assert!((STUB_RANDOM_CHARS as f64) * 62f64.log2() >= 128.0);
    }
}
