//! The sidecar's configuration: the TOML file of SPEC §2.1 and its validation.
//!
//! [`SidecarConfig`] is the wire shape (what the file holds; the control plane writes it with
//! `toml::to_string`). [`Settings::from_config`] validates *everything* and returns either a
//! ready-to-run [`Settings`] or every problem found, each naming its key (`secrets[1].hosts[0]`).
//! Nothing starts half-configured.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::egress::{own_interface_addresses, AddressPolicy, EgressPolicy};
use crate::hosts::{Binding, BindingSet, HostPattern, HostSet};
use crate::secret::{Secret, Surfaces};

/// Default explicit-proxy listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:14322";
/// Default admin listen address.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:14323";
/// Default `worker_threads`: one thread serves every connection. A sidecar serves one session; on
/// one thread a request's client side and upstream side never wait for a wake-up across threads
/// (docs/performance.md, "Profiling: what changed": CPU per request, one worker vs two).
pub const DEFAULT_WORKER_THREADS: usize = 1;
/// Largest `worker_threads` accepted.
pub const MAX_WORKER_THREADS: usize = 256;
/// Default `upstream_response_timeout_secs`: how long an upstream may take to send a response
/// head. Long, since a model may think for minutes before its first byte.
pub const DEFAULT_UPSTREAM_RESPONSE_TIMEOUT_SECS: u64 = 600;
/// Largest `upstream_response_timeout_secs` accepted (a day).
pub const MAX_UPSTREAM_RESPONSE_TIMEOUT_SECS: u64 = 86_400;

/// The TOML file, as written. Every key is optional except inside `[[secrets]]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SidecarConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_listen: Option<String>,
    /// iptables-redirected connections (transparent mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transparent_listen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert_path: Option<PathBuf>,
    /// Threads serving connections (default [`DEFAULT_WORKER_THREADS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_threads: Option<i64>,
    /// Seconds an upstream may take to send its response head (default
    /// [`DEFAULT_UPSTREAM_RESPONSE_TIMEOUT_SECS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_response_timeout_secs: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_key_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstream_ca_files: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intercept: Option<String>,
    /// Under `intercept = "all"`: targets (`host` or `host:port`, port 443 unless written) tunnelled
    /// byte for byte anyway, for clients that pin certificates. A host some secret is bound to is
    /// always intercepted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passthrough: Vec<String>,
    /// Which request bodies (and WebSocket messages from the client) the stub tripwire refuses:
    /// `every-host` (default) or `hosts-without-secrets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_tripwire: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_token_file: Option<PathBuf>,
    /// Read `{"secrets":[...]}` from standard input once at start, until end of file (an
    /// inherited pipe: real values never touch a disk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_stdin: Option<bool>,
    /// Written (0600, atomically) once the sidecar is ready: the addresses actually bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resolve: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "EgressConfig::is_empty")]
    pub egress: EgressConfig,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretSpec>,
}

/// `[egress]`: host patterns; deny wins over allow; a non-empty allow list is exclusive.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EgressConfig {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
    /// Refuse every target that resolves to this host: loopback, unspecified, link-local, or
    /// one of its interface addresses (the addresses `[resolve]` names excepted). The local
    /// backend sets it, so a sandbox reaches no service of the machine it runs on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deny_local: bool,
}

impl EgressConfig {
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty() && !self.deny_local
    }
}

/// One `[[secrets]]` entry (also the element of `secrets_file`'s `{"secrets": [...]}`).
#[derive(Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    pub name: String,
    pub stub: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_file: Option<PathBuf>,
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locations: Option<Vec<String>>,
}

impl fmt::Debug for SecretSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretSpec")
            .field("name", &self.name)
            .field("value", &self.value.as_ref().map(|_| "<redacted>"))
            .field("value_env", &self.value_env)
            .field("value_file", &self.value_file)
            .field("hosts", &self.hosts)
            .field("locations", &self.locations)
            .finish_non_exhaustive()
    }
}

/// `secrets_file`'s JSON shape.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretsFile {
    pub secrets: Vec<SecretSpec>,
}

/// Which connections are intercepted (TLS-terminated) rather than tunnelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterceptMode {
    /// Only hosts that some secret is bound to; others are tunnelled byte for byte.
    BoundHosts,
    /// Every CONNECT target (the stub tripwire then covers every host).
    All,
}

impl InterceptMode {
    /// The config spelling (`bound-hosts`, `all`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BoundHosts => "bound-hosts",
            Self::All => "all",
        }
    }
}

/// Where a request body carrying a stub of a secret not bound to the target is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyTripwire {
    /// Toward every host the stub's secret is not bound to.
    EveryHost,
    /// Only toward hosts no secret is bound to: a model API bound to its own key receives the
    /// other stubs a conversation quotes (tool output) as stubs.
    HostsWithoutSecrets,
}

impl BodyTripwire {
    /// The config spelling (`every-host`, `hosts-without-secrets`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EveryHost => "every-host",
            Self::HostsWithoutSecrets => "hosts-without-secrets",
        }
    }
}

/// Where the CA comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSource {
    /// Generate a fresh per-pod CA at start; its key never leaves memory.
    Generate,
    /// Load this CA (cluster-CA mode).
    Files { cert: PathBuf, key: PathBuf },
}

/// A problem in the configuration, naming the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Dotted key path, e.g. `secrets[0].value_env` or `listen`.
    pub key: String,
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

/// All the problems found in one configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// A validated configuration, ready to run.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub transparent_listen: Option<SocketAddr>,
    /// Tokio worker threads serving connections.
    pub worker_threads: usize,
    /// How long an upstream may take to send its response head.
    pub upstream_response_timeout: std::time::Duration,
    pub ca_cert_path: Option<PathBuf>,
    pub ca: CaSource,
    pub upstream_ca_files: Vec<PathBuf>,
    pub intercept: InterceptMode,
    /// Targets tunnelled under [`InterceptMode::All`] (unless a secret is bound to them).
    pub passthrough: BindingSet,
    pub body_tripwire: BodyTripwire,
    pub secrets_file: Option<PathBuf>,
    pub admin_token_file: Option<PathBuf>,
    /// `secrets_stdin`: the secrets read from standard input at start are in [`Settings::secrets`].
    pub secrets_stdin: bool,
    pub ready_file: Option<PathBuf>,
    /// `(host lowercase, port)` → address, like `curl --resolve`.
    pub resolve: HashMap<(String, u16), SocketAddr>,
    pub egress: EgressPolicy,
    /// The rules applied to resolved addresses at connect time.
    pub addresses: AddressPolicy,
    /// Secrets given inline in the config file.
    pub inline_secrets: Vec<SecretSpec>,
    /// Secrets given on standard input at start (`secrets_stdin`): kept as the base of the
    /// set the admin API replaces, updates and revokes (`PUT`/`DELETE /secrets`).
    pub pushed_secrets: Vec<SecretSpec>,
    /// Inline secrets plus those of `secrets_file` and standard input, validated: the set the
    /// sidecar starts with (the proxy takes it; reloads build the next set from the sources).
    pub secrets: Vec<Secret>,
}

/// Read and parse a config file; a syntax error is reported against the file.
pub fn read_config(path: &Path) -> Result<SidecarConfig, ConfigErrors> {
    parse_config(&read_text(path)?)
}

fn read_text(path: &Path) -> Result<String, ConfigErrors> {
    std::fs::read_to_string(path).map_err(|e| one("config", format!("cannot read {}: {e}", path.display())))
}

/// Parse config TOML text: every unknown key and every value of the wrong type is named.
pub fn parse_config(text: &str) -> Result<SidecarConfig, ConfigErrors> {
    let (config, problems) = parse_config_lenient(text)?;
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigErrors(problems))
    }
}

/// Most problems one config may list before the rest is given up on.
const MAX_SHAPE_PROBLEMS: usize = 64;

/// Parse config TOML text, keeping going past keys that do not fit.
///
/// A TOML syntax error ends parsing (`Err`, with its line and column). Otherwise each unknown
/// key or mistyped value is recorded under its path (`secrets[0].host`, `egress.alow`) and
/// removed, and the rest is parsed again; the config returned is what remains. A problem that
/// cannot be removed by key (a `[[secrets]]` entry missing its `stub`) is the last one listed.
fn parse_config_lenient(text: &str) -> Result<(SidecarConfig, Vec<ConfigError>), ConfigErrors> {
    let table: toml::Table = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
    let mut value = toml::Value::Table(table);
    let mut problems = Vec::new();
    loop {
        match serde_path_to_error::deserialize::<_, SidecarConfig>(value.clone()) {
            Ok(config) => return Ok((config, problems)),
            Err(e) => {
                let key = e.path().to_string();
                let reason = e.inner().message().to_owned();
                let removed = remove_key(&mut value, e.path());
                problems.push(ConfigError {
                    key: if key == "." { "config".to_owned() } else { key },
                    reason,
                });
                if !removed || problems.len() >= MAX_SHAPE_PROBLEMS {
                    return Err(ConfigErrors(problems));
                }
            }
        }
    }
}

/// Remove the value at `path` when its last step is a table key.
fn remove_key(value: &mut toml::Value, path: &serde_path_to_error::Path) -> bool {
    use serde_path_to_error::Segment;
    let segments: Vec<&Segment> = path.iter().collect();
    let Some((Segment::Map { key: last }, parents)) = segments.split_last() else {
        return false;
    };
    let mut here = value;
    for segment in parents {
        let next = match (segment, here) {
            (Segment::Map { key }, toml::Value::Table(t)) => t.get_mut(key.as_str()),
            (Segment::Seq { index }, toml::Value::Array(a)) => a.get_mut(*index),
            _ => None,
        };
        let Some(next) = next else { return false };
        here = next;
    }
    match here {
        toml::Value::Table(t) => t.remove(last.as_str()).is_some(),
        _ => false,
    }
}

/// A TOML syntax error, at its line and column and under the key of that line.
fn syntax_error(text: &str, e: &toml::de::Error) -> ConfigErrors {
    match e.span() {
        Some(span) => {
            let (line, column) = line_column(text, span.start);
            one(
                &key_at(text, span.start),
                // One line per problem: toml's messages may run over two.
                format!(
                    "line {line}, column {column}: {}",
                    e.message().trim().replace('\n', "; ")
                ),
            )
        }
        None => one("config", e.message().to_owned()),
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Best effort: the key named on the line where a TOML error starts.
fn key_at(text: &str, offset: usize) -> String {
    let line_start = text[..offset.min(text.len())].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("");
    match line.split_once('=') {
        Some((k, _)) => k.trim().trim_matches('"').to_owned(),
        None => line.trim().to_owned(),
    }
}

fn one(key: &str, reason: String) -> ConfigErrors {
    ConfigErrors(vec![ConfigError {
        key: key.to_owned(),
        reason,
    }])
}

/// Parse `secrets_file` JSON.
pub fn read_secrets_file(path: &Path) -> Result<Vec<SecretSpec>, ConfigErrors> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| one("secrets_file", format!("cannot read {}: {e}", path.display())))?;
    let file: SecretsFile = serde_json::from_str(&text)
        .map_err(|e| one("secrets_file", format!("{}: invalid JSON: {e}", path.display())))?;
    Ok(file.secrets)
}

/// Parse the `{"secrets":[...]}` document of `secrets_stdin` (read by the binary).
pub fn parse_secrets_stdin(bytes: &[u8]) -> Result<Vec<SecretSpec>, ConfigErrors> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    let file: SecretsFile = serde_json::from_slice(bytes).map_err(|e| {
        one(
            "secrets_stdin",
            format!("standard input is not {{\"secrets\":[...]}}: {e}"),
        )
    })?;
    Ok(file.secrets)
}

/// Validate a set of secrets on its own (the admin API's `PUT /secrets` body), naming each
/// problem under `key` (`secrets[2].hosts`).
pub fn validate_secret_specs(key: &str, specs: &[SecretSpec]) -> Result<Vec<Secret>, ConfigErrors> {
    let mut problems = Problems(Vec::new());
    let keyed: Vec<(String, &SecretSpec)> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("{key}[{i}]"), s))
        .collect();
    let env = |name: &str| std::env::var(name).ok();
    let secrets = validate_secrets(&mut problems, &keyed, &env);
    if problems.0.is_empty() {
        Ok(secrets)
    } else {
        Err(ConfigErrors(problems.0))
    }
}

struct Problems(Vec<ConfigError>);

impl Problems {
    fn add(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.0.push(ConfigError {
            key: key.into(),
            reason: reason.into(),
        });
    }
}

impl Settings {
    /// Validate a parsed config, reading `value_env`, `value_file` and `secrets_file`.
    pub fn from_config(config: &SidecarConfig) -> Result<Self, ConfigErrors> {
        Self::from_config_with_env(config, &|name| std::env::var(name).ok())
    }

    /// [`Settings::from_config`] with an injectable environment (for tests).
    pub fn from_config_with_env(
        config: &SidecarConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigErrors> {
        Self::from_config_with(config, env, Vec::new())
    }

    /// Parse and validate config text, listing every problem of both steps in one run: the keys
    /// that do not fit ([`parse_config_lenient`]) and then what the rest fails validation on.
    /// `pushed` reads the `secrets_stdin` secrets the parsed config asks for.
    pub fn from_text(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
        pushed: impl FnOnce(&SidecarConfig) -> Result<Vec<SecretSpec>, ConfigErrors>,
    ) -> Result<Self, ConfigErrors> {
        let (config, mut problems) = parse_config_lenient(text)?;
        let stdin_secrets = pushed(&config).unwrap_or_else(|e| {
            problems.extend(e.0);
            Vec::new()
        });
        match Self::from_config_with(&config, env, stdin_secrets) {
            Ok(settings) if problems.is_empty() => Ok(settings),
            Ok(_) => Err(ConfigErrors(problems)),
            Err(e) => {
                problems.extend(e.0);
                Err(ConfigErrors(problems))
            }
        }
    }

    /// [`Settings::from_config`] plus the secrets read from standard input (`secrets_stdin`).
    pub fn from_config_with(
        config: &SidecarConfig,
        env: &dyn Fn(&str) -> Option<String>,
        stdin_secrets: Vec<SecretSpec>,
    ) -> Result<Self, ConfigErrors> {
        let mut problems = Problems(Vec::new());
        let listen = addr(&mut problems, "listen", config.listen.as_deref(), DEFAULT_LISTEN);
        let admin_listen = addr(
            &mut problems,
            "admin_listen",
            config.admin_listen.as_deref(),
            DEFAULT_ADMIN_LISTEN,
        );
        let transparent_listen = config
            .transparent_listen
            .as_deref()
            .map(|s| addr(&mut problems, "transparent_listen", Some(s), DEFAULT_LISTEN));
        if listen == admin_listen && listen.port() != 0 {
            problems.add("admin_listen", "must differ from `listen`");
        }
        let worker_threads = match config.worker_threads {
            None => DEFAULT_WORKER_THREADS,
            Some(n) if (1..=MAX_WORKER_THREADS as i64).contains(&n) => n as usize,
            Some(n) => {
                problems.add(
                    "worker_threads",
                    format!("must be between 1 and {MAX_WORKER_THREADS}, got {n}"),
                );
                DEFAULT_WORKER_THREADS
            }
        };
        let upstream_response_timeout = match config.upstream_response_timeout_secs {
            None => DEFAULT_UPSTREAM_RESPONSE_TIMEOUT_SECS,
            Some(n) if (1..=MAX_UPSTREAM_RESPONSE_TIMEOUT_SECS as i64).contains(&n) => n as u64,
            Some(n) => {
                problems.add(
                    "upstream_response_timeout_secs",
                    format!("must be between 1 and {MAX_UPSTREAM_RESPONSE_TIMEOUT_SECS} seconds, got {n}"),
                );
                DEFAULT_UPSTREAM_RESPONSE_TIMEOUT_SECS
            }
        };
        let upstream_response_timeout = std::time::Duration::from_secs(upstream_response_timeout);

        let ca = match (&config.ca_cert_file, &config.ca_key_file) {
            (None, None) => CaSource::Generate,
            (Some(cert), Some(key)) => {
                for (k, p) in [("ca_cert_file", cert), ("ca_key_file", key)] {
                    if !p.is_file() {
                        problems.add(k, format!("{} is not a readable file", p.display()));
                    }
                }
                CaSource::Files {
                    cert: cert.clone(),
                    key: key.clone(),
                }
            }
            (Some(_), None) => {
                problems.add("ca_key_file", "required when ca_cert_file is set");
                CaSource::Generate
            }
            (None, Some(_)) => {
                problems.add("ca_cert_file", "required when ca_key_file is set");
                CaSource::Generate
            }
        };
        for (i, p) in config.upstream_ca_files.iter().enumerate() {
            if !p.is_file() {
                problems.add(
                    format!("upstream_ca_files[{i}]"),
                    format!("{} is not a readable file", p.display()),
                );
            }
        }
        let intercept = match config.intercept.as_deref() {
            None | Some("bound-hosts") => InterceptMode::BoundHosts,
            Some("all") => InterceptMode::All,
            Some(other) => {
                problems.add("intercept", format!("`{other}` is not one of \"bound-hosts\", \"all\""));
                InterceptMode::BoundHosts
            }
        };
        let mut passthrough = Vec::new();
        for (i, raw) in config.passthrough.iter().enumerate() {
            match raw.parse::<Binding>() {
                Ok(b) => passthrough.push(b),
                Err(e) => problems.add(format!("passthrough[{i}]"), e.to_string()),
            }
        }
        if !config.passthrough.is_empty() && intercept != InterceptMode::All {
            problems.add(
                "passthrough",
                "applies only with intercept = \"all\" (under \"bound-hosts\" every unbound host is tunnelled)",
            );
        }
        let body_tripwire = match config.body_tripwire.as_deref() {
            None | Some("every-host") => BodyTripwire::EveryHost,
            Some("hosts-without-secrets") => BodyTripwire::HostsWithoutSecrets,
            Some(other) => {
                problems.add(
                    "body_tripwire",
                    format!("`{other}` is not one of \"every-host\", \"hosts-without-secrets\""),
                );
                BodyTripwire::EveryHost
            }
        };
        if let Some(p) = &config.admin_token_file {
            match std::fs::read_to_string(p) {
                Ok(t) if t.trim().is_empty() => problems.add("admin_token_file", format!("{} is empty", p.display())),
                Ok(_) => {}
                Err(e) => problems.add("admin_token_file", format!("cannot read {}: {e}", p.display())),
            }
        }

        let mut resolve = HashMap::new();
        for (k, v) in &config.resolve {
            let key = format!("resolve.\"{k}\"");
            let Some((host, port)) = split_host_port(k) else {
                problems.add(key, "key must be host:port (e.g. \"api.anthropic.com:443\")");
                continue;
            };
            match v.parse::<SocketAddr>() {
                Ok(a) => {
                    resolve.insert((host.trim_end_matches('.').to_ascii_lowercase(), port), a);
                }
                Err(_) => problems.add(key, format!("`{v}` is not an address:port (e.g. \"127.0.0.1:8443\")")),
            }
        }

        let allow: Vec<HostPattern> = parse_each(&mut problems, "egress.allow", &config.egress.allow);
        let deny: Vec<HostPattern> = parse_each(&mut problems, "egress.deny", &config.egress.deny);

        let mut specs: Vec<(String, &SecretSpec)> = config
            .secrets
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("secrets[{i}]"), s))
            .collect();
        let file_specs = match &config.secrets_file {
            Some(path) => match read_secrets_file(path) {
                Ok(s) => s,
                Err(errs) => {
                    problems.0.extend(errs.0);
                    Vec::new()
                }
            },
            None => Vec::new(),
        };
        specs.extend(
            file_specs
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("secrets_file.secrets[{i}]"), s)),
        );
        specs.extend(
            stdin_secrets
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("secrets_stdin.secrets[{i}]"), s)),
        );
        let secrets = validate_secrets(&mut problems, &specs, env);

        let mut bound = HostSet::default();
        for s in &secrets {
            bound.0.extend(s.hosts.hosts().cloned());
        }
        let deny = HostSet(deny);
        let addresses = AddressPolicy::new(
            &deny,
            config.egress.deny_local,
            if config.egress.deny_local {
                own_interface_addresses()
            } else {
                Vec::new()
            },
            resolve.values().copied(),
        );
        let egress = EgressPolicy::new(HostSet(allow), deny, bound);

        if !problems.0.is_empty() {
            return Err(ConfigErrors(problems.0));
        }
        Ok(Self {
            listen,
            admin_listen,
            transparent_listen,
            worker_threads,
            upstream_response_timeout,
            ca_cert_path: config.ca_cert_path.clone(),
            ca,
            upstream_ca_files: config.upstream_ca_files.clone(),
            intercept,
            passthrough: BindingSet(passthrough),
            body_tripwire,
            secrets_file: config.secrets_file.clone(),
            admin_token_file: config.admin_token_file.clone(),
            secrets_stdin: config.secrets_stdin.unwrap_or(false),
            ready_file: config.ready_file.clone(),
            resolve,
            egress,
            addresses,
            inline_secrets: config.secrets.clone(),
            pushed_secrets: stdin_secrets,
            secrets,
        })
    }

    /// Re-validate inline secrets, a fresh read of `secrets_file`, and `pushed` (the secrets the
    /// admin API holds: standard input's at start, then what `PUT`/`DELETE /secrets` made of them).
    pub fn reload_secrets(&self, pushed: &[SecretSpec]) -> Result<Vec<Secret>, ConfigErrors> {
        let mut problems = Problems(Vec::new());
        let mut specs: Vec<(String, &SecretSpec)> = self
            .inline_secrets
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("secrets[{i}]"), s))
            .collect();
        let file_specs = match &self.secrets_file {
            Some(path) => read_secrets_file(path)?,
            None => Vec::new(),
        };
        specs.extend(
            file_specs
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("secrets_file.secrets[{i}]"), s)),
        );
        specs.extend(pushed.iter().enumerate().map(|(i, s)| (format!("secrets[{i}]"), s)));
        let env = |name: &str| std::env::var(name).ok();
        let secrets = validate_secrets(&mut problems, &specs, &env);
        if problems.0.is_empty() {
            Ok(secrets)
        } else {
            Err(ConfigErrors(problems.0))
        }
    }
}

fn addr(problems: &mut Problems, key: &str, raw: Option<&str>, default: &str) -> SocketAddr {
    let fallback: SocketAddr = default.parse().unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
    match raw {
        None => fallback,
        Some(s) => s.parse().unwrap_or_else(|_| {
            problems.add(key, format!("`{s}` is not an address:port (e.g. \"{default}\")"));
            fallback
        }),
    }
}

/// Each of `raw` parsed (host patterns, bindings); a problem under `key[i]` for each that fails.
fn parse_each<T>(problems: &mut Problems, key: &str, raw: &[String]) -> Vec<T>
where
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    raw.iter()
        .enumerate()
        .filter_map(|(i, s)| match s.parse::<T>() {
            Ok(p) => Some(p),
            Err(e) => {
                problems.add(format!("{key}[{i}]"), e.to_string());
                None
            }
        })
        .collect()
}

/// `host:port` or `[v6]:port`.
pub fn split_host_port(s: &str) -> Option<(&str, u16)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:")?;
        (h, p)
    } else {
        s.rsplit_once(':')?
    };
    if host.is_empty() || host.contains(':') && !s.starts_with('[') {
        return None;
    }
    Some((host, port.parse().ok()?))
}

/// Minimum stub length: shorter stubs would match ordinary text.
pub const MIN_STUB_LEN: usize = 8;

/// Minimum real-value length: the sidecar redacts every real value (and its encoded forms) from
/// what it relays back; a shorter value would match ordinary bytes, so it is refused here rather
/// than left unredacted.
pub const MIN_VALUE_LEN: usize = 8;

fn is_env_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn validate_secrets(
    problems: &mut Problems,
    specs: &[(String, &SecretSpec)],
    env: &dyn Fn(&str) -> Option<String>,
) -> Vec<Secret> {
    let mut out = Vec::with_capacity(specs.len());
    let mut names = HashMap::new();
    let mut stubs: HashMap<&str, &str> = HashMap::new();
    for (key, spec) in specs {
        let before = problems.0.len();
        if !is_env_name(&spec.name) {
            problems.add(
                format!("{key}.name"),
                format!("`{}` must match [A-Za-z_][A-Za-z0-9_]*", spec.name),
            );
        } else if let Some(prev) = names.insert(spec.name.as_str(), key.as_str()) {
            problems.add(
                format!("{key}.name"),
                format!("`{}` is already defined by {prev}", spec.name),
            );
        }
        if spec.stub.len() < MIN_STUB_LEN {
            problems.add(
                format!("{key}.stub"),
                format!("required, at least {MIN_STUB_LEN} bytes"),
            );
        } else if spec.stub.bytes().any(|b| !(0x21..0x7f).contains(&b)) {
            problems.add(format!("{key}.stub"), "must be printable ASCII without spaces");
        } else if let Some(prev) = stubs.insert(spec.stub.as_str(), spec.name.as_str()) {
            problems.add(format!("{key}.stub"), format!("same stub as secret `{prev}`"));
        }
        let sources = [
            spec.value.is_some(),
            spec.value_env.is_some(),
            spec.value_file.is_some(),
        ];
        let value = match sources.iter().filter(|s| **s).count() {
            0 => {
                problems.add(
                    format!("{key}.value"),
                    "one of value, value_env, value_file is required",
                );
                None
            }
            1 => {
                if let Some(v) = &spec.value {
                    Some(v.clone())
                } else if let Some(var) = &spec.value_env {
                    let v = env(var);
                    if v.is_none() {
                        problems.add(
                            format!("{key}.value_env"),
                            format!("environment variable `{var}` is not set"),
                        );
                    }
                    v
                } else if let Some(path) = &spec.value_file {
                    match std::fs::read_to_string(path) {
                        Ok(v) => Some(v.trim_end_matches(['\r', '\n']).to_owned()),
                        Err(e) => {
                            problems.add(
                                format!("{key}.value_file"),
                                format!("cannot read {}: {e}", path.display()),
                            );
                            None
                        }
                    }
                } else {
                    None
                }
            }
            _ => {
                problems.add(
                    format!("{key}.value"),
                    "give exactly one of value, value_env, value_file",
                );
                None
            }
        };
        if let Some(v) = &value {
            if v.len() < MIN_VALUE_LEN {
                problems.add(
                    format!("{key}.value"),
                    format!(
                        "the real value is {} byte{}; at least {MIN_VALUE_LEN} are required (a shorter one \
                         would match ordinary bytes, so it could not be redacted from responses)",
                        v.len(),
                        if v.len() == 1 { "" } else { "s" }
                    ),
                );
            } else if v == &spec.stub {
                problems.add(format!("{key}.stub"), "must differ from the real value");
            }
        }
        if spec.hosts.is_empty() {
            problems.add(
                format!("{key}.hosts"),
                "required: at least one host the secret may be sent to",
            );
        }
        let hosts: Vec<Binding> = parse_each(problems, &format!("{key}.hosts"), &spec.hosts);
        let surfaces = match &spec.locations {
            None => Surfaces::default(),
            Some(list) if list.is_empty() => {
                problems.add(format!("{key}.locations"), "must not be empty");
                Surfaces::default()
            }
            Some(list) => Surfaces(parse_each(problems, &format!("{key}.locations"), list)),
        };
        if problems.0.len() == before {
            if let Some(value) = value {
                out.push(Secret {
                    name: spec.name.clone(),
                    stub: spec.stub.clone(),
                    value,
                    hosts: BindingSet(hosts),
                    surfaces,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(toml: &str) -> Result<Settings, ConfigErrors> {
        let cfg = parse_config(toml)?;
        Settings::from_config_with_env(&cfg, &|name| (name == "REAL_VAR").then(|| "from-env-value".to_owned()))
    }

    fn keys(errs: ConfigErrors) -> Vec<String> {
        errs.0.into_iter().map(|e| e.key).collect()
    }

    #[test]
    fn empty_config_uses_defaults() {
        let s = settings("").expect("valid");
        assert_eq!(s.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(s.admin_listen.to_string(), DEFAULT_ADMIN_LISTEN);
        assert_eq!(s.intercept, InterceptMode::BoundHosts);
        assert_eq!(s.ca, CaSource::Generate);
        assert_eq!(s.worker_threads, DEFAULT_WORKER_THREADS);
        assert!(s.secrets.is_empty());
    }

    #[test]
    fn passthrough_and_body_tripwire_are_validated() {
        let s = settings("").expect("valid");
        assert_eq!(s.body_tripwire, BodyTripwire::EveryHost);
        assert!(s.passthrough.0.is_empty());
        let s = settings(
            r#"
            intercept = "all"
            passthrough = ["pinned.example", "*.pinned.example:8443"]
            body_tripwire = "hosts-without-secrets"
            "#,
        )
        .expect("valid");
        assert_eq!(s.body_tripwire, BodyTripwire::HostsWithoutSecrets);
        assert!(s
            .passthrough
            .matches(&crate::hosts::TargetHost::parse("pinned.example"), 443));
        assert!(s
            .passthrough
            .matches(&crate::hosts::TargetHost::parse("a.pinned.example"), 8443));
        assert!(!s
            .passthrough
            .matches(&crate::hosts::TargetHost::parse("a.pinned.example"), 443));
        let errs = settings(
            r#"
            passthrough = ["ex ample", "ok.example:0"]
            body_tripwire = "sometimes"
            "#,
        )
        .expect_err("invalid");
        assert_eq!(
            keys(errs),
            vec!["passthrough[0]", "passthrough[1]", "passthrough", "body_tripwire"]
        );
    }

    #[test]
    fn worker_threads_is_bounded() {
        assert_eq!(settings("worker_threads = 4").expect("valid").worker_threads, 4);
        for bad in ["worker_threads = 0", "worker_threads = -1", "worker_threads = 100000"] {
            let errs = settings(bad).expect_err(bad);
            assert!(errs.to_string().contains("must be between 1 and 256"), "{bad}: {errs}");
            assert_eq!(keys(errs), vec!["worker_threads"], "{bad}");
        }
    }

    #[test]
    fn upstream_response_timeout_is_bounded() {
        let default = settings("").expect("valid").upstream_response_timeout;
        assert_eq!(default, std::time::Duration::from_secs(600));
        let s = settings("upstream_response_timeout_secs = 5").expect("valid");
        assert_eq!(s.upstream_response_timeout, std::time::Duration::from_secs(5));
        for bad in [
            "upstream_response_timeout_secs = 0",
            "upstream_response_timeout_secs = 86401",
        ] {
            let errs = settings(bad).expect_err(bad);
            assert!(
                errs.to_string().contains("must be between 1 and 86400 seconds"),
                "{bad}: {errs}"
            );
            assert_eq!(keys(errs), vec!["upstream_response_timeout_secs"], "{bad}");
        }
    }

    #[test]
    fn full_config_parses() {
        let s = settings(
            r#"
            listen = "127.0.0.1:1"
            admin_listen = "127.0.0.1:2"
            intercept = "all"
            [resolve]
            "api.anthropic.com:443" = "127.0.0.1:8443"
            [egress]
            deny = ["10.0.0.0/8", "*.evil.example"]
            [[secrets]]
            name = "ANTHROPIC_API_KEY"
            stub = "sk-ant-lapstub-0123456789"
            value = "sk-ant-real"
            hosts = ["api.anthropic.com"]
            [[secrets]]
            name = "GH"
            stub = "ghp_lapstub_abcdefgh"
            value_env = "REAL_VAR"
            hosts = ["github.com", "*.githubusercontent.com"]
            locations = ["header", "query:key", "body:POST /login/oauth/access_token"]
            "#,
        )
        .expect("valid");
        assert_eq!(s.intercept, InterceptMode::All);
        assert_eq!(
            s.resolve[&("api.anthropic.com".to_owned(), 443)].to_string(),
            "127.0.0.1:8443"
        );
        assert_eq!(s.secrets.len(), 2);
        assert_eq!(s.secrets[1].value, "from-env-value");
        assert!(s.secrets[1].surfaces.body("POST", "/login/oauth/access_token", None));
        assert!(s.secrets[1].surfaces.query("key"));
        assert_eq!(
            s.secrets[0].surfaces,
            crate::Surfaces::default(),
            "`header` when none are written"
        );
        assert!(!s.secrets[0].surfaces.has(crate::Location::Query));
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let errs = settings(
            r#"
            listen = "nope"
            intercept = "some"
            [resolve]
            "bad" = "127.0.0.1:1"
            [egress]
            allow = ["a.*.b"]
            [[secrets]]
            name = "1BAD"
            stub = "short"
            value = "x"
            value_env = "REAL_VAR"
            hosts = []
            locations = ["cookie"]
            [[secrets]]
            name = "OK"
            stub = "okstub-123456"
            value_env = "MISSING_VAR"
            hosts = ["ex ample"]
            "#,
        )
        .expect_err("invalid");
        assert_eq!(
            keys(errs),
            vec![
                "listen",
                "intercept",
                "resolve.\"bad\"",
                "egress.allow[0]",
                "secrets[0].name",
                "secrets[0].stub",
                "secrets[0].value",
                "secrets[0].hosts",
                "secrets[0].locations[0]",
                "secrets[1].value_env",
                "secrets[1].hosts[0]",
            ]
        );
    }

    #[test]
    fn every_problem_is_listed_in_one_run() {
        let text = r#"
            listen = "nope"
            lisen = "127.0.0.1:1"
            worker_threads = "two"
            [egress]
            alow = ["a.com"]
            [[secrets]]
            name = "A"
            stub = "stub-aaaaaaaa"
            value = "value-one-1"
            host = ["a.com"]
            "#;
        let errs = Settings::from_text(text, &|_| None, |_| Ok(Vec::new())).expect_err("invalid");
        assert_eq!(
            keys(errs.clone()),
            // The shape's problems come first, in key order, then validation's.
            vec![
                "egress.alow",
                "lisen",
                "secrets[0].host",
                "worker_threads",
                "listen",
                "secrets[0].hosts"
            ],
            "{errs}"
        );
        assert!(errs.0[1].reason.contains("unknown field `lisen`"), "{errs}");
        // parse_config alone stops at the shape, naming every key that does not fit.
        assert_eq!(parse_config(text).expect_err("invalid").0.len(), 4);
    }

    #[test]
    fn a_syntax_error_names_its_line_and_column() {
        let errs = parse_config("listen = \"a\"\nadmin_listen = \n").expect_err("invalid");
        assert_eq!(errs.0.len(), 1);
        assert_eq!(errs.0[0].key, "admin_listen");
        assert!(errs.0[0].reason.starts_with("line 2, column 16:"), "{errs}");
    }

    #[test]
    fn duplicate_names_and_stubs_are_rejected() {
        let errs = settings(
            r#"
            [[secrets]]
            name = "A"
            stub = "stub-aaaaaaaa"
            value = "value-one-1"
            hosts = ["a.com"]
            [[secrets]]
            name = "A"
            stub = "stub-aaaaaaaa"
            value = "value-two-2"
            hosts = ["a.com"]
            "#,
        )
        .expect_err("invalid");
        assert_eq!(keys(errs), vec!["secrets[1].name", "secrets[1].stub"]);
    }

    #[test]
    fn a_value_too_short_to_redact_is_refused() {
        // Wire case: a 7-byte value would be swapped in but never redacted from what comes back.
        let errs = settings(
            r#"
            [[secrets]]
            name = "SHORT"
            stub = "stub-aaaaaaaa"
            value = "1234567"
            hosts = ["a.com"]
            "#,
        )
        .expect_err("invalid");
        assert_eq!(errs.0.len(), 1, "{errs}");
        assert_eq!(errs.0[0].key, "secrets[0].value");
        assert!(errs.0[0].reason.contains("7 bytes"), "{errs}");
        assert!(
            !errs.to_string().contains("1234567"),
            "the error must not repeat the value: {errs}"
        );
        let eight = r#"
            [[secrets]]
            name = "EIGHT"
            stub = "stub-aaaaaaaa"
            value = "12345678"
            hosts = ["a.com"]
            "#;
        assert_eq!(settings(eight).expect("8 bytes is enough").secrets.len(), 1);
    }

    #[test]
    fn unknown_keys_and_bad_syntax_name_the_key() {
        let errs = settings("listen = \"127.0.0.1:1\"\nlisten_typo = 3\n").expect_err("invalid");
        assert_eq!(errs.0[0].key, "listen_typo");
        assert!(errs.0[0].reason.contains("unknown field"), "{}", errs.0[0].reason);
    }

    #[test]
    fn value_file_is_read_and_trimmed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v");
        std::fs::write(&path, "real-from-file\n").expect("write");
        let toml = format!(
            "[[secrets]]\nname = \"F\"\nstub = \"stub-ffffffff\"\nvalue_file = {:?}\nhosts = [\"*\"]\n",
            path
        );
        let s = settings(&toml).expect("valid");
        assert_eq!(s.secrets[0].value, "real-from-file");
    }

    #[test]
    fn config_round_trips_through_toml() {
        let cfg = SidecarConfig {
            listen: Some("127.0.0.1:5".into()),
            secrets: vec![SecretSpec {
                name: "N".into(),
                stub: "stub-12345678".into(),
                value: Some("v".into()),
                hosts: vec!["a.com".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = toml::to_string(&cfg).expect("serialize");
        assert_eq!(parse_config(&text).expect("parse"), cfg);
    }

    #[test]
    fn split_host_port_forms() {
        assert_eq!(split_host_port("a.com:443"), Some(("a.com", 443)));
        assert_eq!(split_host_port("[::1]:8443"), Some(("::1", 8443)));
        assert_eq!(split_host_port("::1:443"), None);
        assert_eq!(split_host_port("a.com"), None);
        assert_eq!(split_host_port(":443"), None);
    }
}
