//! `lap-server` settings (SPEC §3.1): flags with environment fallbacks, and duration parsing.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::backend::sandbox::SandboxApiVersion;

/// `LAP_LOCAL_ISOLATION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LocalIsolation {
    /// Linux namespaces through bubblewrap.
    #[value(alias = "bwrap")]
    Bubblewrap,
    /// No isolation (development only).
    None,
}

/// Which sandbox backend runs sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// A `vault-sidecar` and a `lap-harness` process per session on loopback.
    Local,
    /// An agent-sandbox `Sandbox` resource per session (`LAP_K8S_*` settings).
    Kubernetes,
}

/// The server's settings. Every flag has an environment fallback.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "lap-server",
    version,
    about = "LAP control plane: agents, secrets and sandboxed agent sessions"
)]
pub struct Settings {
    /// Address to serve the REST API on.
    #[arg(long, env = "LAP_LISTEN", default_value = "127.0.0.1:4000")]
    pub listen: SocketAddr,
    /// Directory for the SQLite database, keys and per-session sandboxes.
    #[arg(long, env = "LAP_DATA_DIR", default_value = "./.lap")]
    pub data_dir: PathBuf,
    /// `sqlite://…` or `postgres://…`; default: SQLite in the data dir.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// API key (Bearer). Default: created on first start in `<data dir>/master_key` and printed once.
    #[arg(long, env = "MASTER_KEY", hide_env_values = true)]
    pub master_key: Option<String>,
    /// At-rest encryption key (base64 of 32 bytes, or any passphrase). Default: created in
    /// `<data dir>/encryption_key`.
    #[arg(long, env = "LAP_ENCRYPTION_KEY", hide_env_values = true)]
    pub encryption_key: Option<String>,
    /// Sandbox backend.
    #[arg(long, env = "LAP_BACKEND", value_enum, default_value = "local")]
    pub backend: BackendKind,
    /// Idle sessions are stopped after this long (`30s`, `10m`, `24h`).
    #[arg(long, env = "LAP_IDLE_TIMEOUT", default_value = "24h", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// A session still `creating` after this long is `failed`.
    #[arg(long, env = "LAP_CREATE_TIMEOUT", default_value = "10m", value_parser = parse_duration)]
    pub create_timeout: Duration,
    /// How long audit events (interceptions, admin actions) and stopped sessions' logs are kept.
    #[arg(long, env = "LAP_AUDIT_RETENTION", default_value = "30d", value_parser = parse_duration)]
    pub audit_retention: Duration,
    /// How often the reconciler runs.
    #[arg(long, env = "LAP_RECONCILE_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub reconcile_interval: Duration,
    /// A sidecar TOML whose resolve, upstream_ca_files, egress and intercept settings go into
    /// every session's sidecar config.
    #[arg(long, env = "LAP_SIDECAR_BASE_CONFIG")]
    pub sidecar_base_config: Option<PathBuf>,
    /// The `vault-sidecar` binary (default: next to `lap-server`, then PATH).
    #[arg(long, env = "LAP_SIDECAR_BIN")]
    pub sidecar_bin: Option<PathBuf>,
    /// The `lap-harness` binary (default: next to `lap-server`, then PATH).
    #[arg(long, env = "LAP_HARNESS_BIN")]
    pub harness_bin: Option<PathBuf>,
    /// Local backend: how each session's harness is isolated. `bubblewrap` (default): its own
    /// user, mount, pid, network, ipc and uts namespaces. `none`: development only, the agent runs
    /// as this server's user and can read the platform's files.
    #[arg(long, env = "LAP_LOCAL_ISOLATION", value_enum, default_value = "bubblewrap")]
    pub local_isolation: LocalIsolation,
    /// Local backend: where the sandboxes' own directories (home, tmp) live; default
    /// `<data dir>-sandboxes`, beside the data dir (which stays 0700 and invisible to them).
    #[arg(long, env = "LAP_LOCAL_SANDBOX_ROOT")]
    pub local_sandbox_root: Option<PathBuf>,
    /// Local backend: more host paths visible read-only in every sandbox, `:`-separated
    /// (agent CLIs installed outside /usr and /opt, e.g. `/nix/store:/home/me/.local/lib`).
    #[arg(long, env = "LAP_LOCAL_RO_PATHS", default_value = "")]
    pub local_ro_paths: String,
    /// Local backend, server running as root: the uid (and gid) sandboxes run as, one that owns
    /// nothing of the platform.
    #[arg(long, env = "LAP_LOCAL_SANDBOX_UID", default_value = "10001")]
    pub local_sandbox_uid: u32,
    /// A model gateway (LiteLLM proxy) every harness sends its model calls to: `https://HOST[:PORT][/PATH]`.
    #[arg(long, env = "LAP_MODEL_GATEWAY_URL")]
    pub model_gateway_url: Option<String>,
    /// The registry secret holding the gateway's key (swapped in by the vault toward the gateway only).
    #[arg(long, env = "LAP_MODEL_GATEWAY_SECRET", default_value = "LAP_MODEL_GATEWAY_KEY")]
    pub model_gateway_secret: String,
    /// Kubernetes backend: the settings that shape each session's pod.
    #[command(flatten)]
    pub k8s: KubernetesSettings,
}

/// The model gateway sessions send their model calls to (`LAP_MODEL_GATEWAY_URL`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelGateway {
    /// The URL without a trailing `/`.
    pub url: String,
    /// What the gateway's key is bound to: its host, with `:PORT` unless 443.
    pub binding: String,
    /// The registry secret with the gateway's key (`LAP_MODEL_GATEWAY_SECRET`).
    pub secret: String,
}

impl Settings {
    /// `LAP_MODEL_GATEWAY_URL` checked: `https://` (the vault swaps keys only inside TLS) with a
    /// host, no query or credentials; `None` when unset.
    pub fn model_gateway(&self) -> Result<Option<ModelGateway>, SettingError> {
        const KEY: &str = "LAP_MODEL_GATEWAY_URL";
        let Some(raw) = self
            .model_gateway_url
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty())
        else {
            return Ok(None);
        };
        let url = reqwest::Url::parse(raw).map_err(|e| setting_error(KEY, format!("`{raw}` is not a URL: {e}")))?;
        if url.scheme() != "https" {
            return Err(setting_error(
                KEY,
                format!("`{raw}` must be https:// (the vault swaps the gateway's key in only inside TLS)"),
            ));
        }
        let Some(host) = url.host_str().filter(|h| !h.is_empty()) else {
            return Err(setting_error(KEY, format!("`{raw}` has no host")));
        };
        if url.query().is_some() || !url.username().is_empty() || url.password().is_some() {
            return Err(setting_error(
                KEY,
                format!("`{raw}` must not carry a query or credentials"),
            ));
        }
        let binding = match url.port() {
            Some(p) if p != 443 => format!("{host}:{p}"),
            _ => host.to_owned(),
        };
        let name = self.model_gateway_secret.trim();
        if name.is_empty() {
            return Err(setting_error("LAP_MODEL_GATEWAY_SECRET", "must name a registry secret"));
        }
        Ok(Some(ModelGateway {
            url: raw.trim_end_matches('/').to_owned(),
            binding,
            secret: name.to_owned(),
        }))
    }
}

/// Settings of the Kubernetes backend (`LAP_BACKEND=kubernetes`). The cluster itself is found
/// the usual way (in-cluster service account, else `KUBECONFIG` / `~/.kube/config`).
#[derive(Debug, Clone, clap::Args)]
pub struct KubernetesSettings {
    /// Namespace the Sandboxes and their Secrets are created in.
    #[arg(long = "k8s-namespace", env = "LAP_K8S_NAMESPACE", default_value = "lap-sandboxes")]
    pub namespace: String,
    /// agent-sandbox API version to write: v1beta1, or v1alpha1 for older controllers.
    #[arg(
        long = "k8s-sandbox-api-version",
        env = "LAP_K8S_SANDBOX_API_VERSION",
        value_enum,
        default_value = "v1beta1"
    )]
    pub api_version: SandboxApiVersion,
    /// The vault sidecar's image.
    #[arg(
        long = "k8s-vault-image",
        env = "LAP_K8S_VAULT_IMAGE",
        default_value = "lap/vault-sidecar:dev"
    )]
    pub vault_image: String,
    /// The harness image; `{harness_id}` is replaced by the agent's harness id.
    #[arg(
        long = "k8s-harness-image",
        env = "LAP_K8S_HARNESS_IMAGE",
        default_value = "lap/harness-{harness_id}:dev"
    )]
    pub harness_image: String,
    /// Per-harness image overrides: `claude-code=reg/img:tag,codex=reg/other:tag`.
    #[arg(long = "k8s-harness-images", env = "LAP_K8S_HARNESS_IMAGES", default_value = "")]
    pub harness_images: String,
    /// Image of the init container that installs the iptables redirect (needs `iptables` and
    /// `/bin/sh`); default: the vault image.
    #[arg(long = "k8s-netfilter-image", env = "LAP_K8S_NETFILTER_IMAGE")]
    pub netfilter_image: Option<String>,
    /// `runtimeClassName` of the pods (e.g. gvisor, kata); default: the cluster's default runtime.
    #[arg(long = "k8s-runtime-class", env = "LAP_K8S_RUNTIME_CLASS")]
    pub runtime_class: Option<String>,
    /// Redirect the harness's outbound TCP to the vault with iptables (true | false).
    #[arg(long = "k8s-transparent", env = "LAP_K8S_TRANSPARENT", default_value = "true", action = clap::ArgAction::Set)]
    pub transparent: bool,
    /// A session's maximum lifetime: the Sandbox's `shutdownTime` is its creation plus this.
    #[arg(long = "k8s-max-lifetime", env = "LAP_K8S_MAX_LIFETIME", default_value = "7d", value_parser = parse_duration)]
    pub max_lifetime: Duration,
    /// The port the harness serves on inside the pod.
    #[arg(long = "k8s-harness-port", env = "LAP_K8S_HARNESS_PORT", default_value = "8080")]
    pub harness_port: u16,
    /// Default requests of the harness container (`cpu=500m,memory=1Gi`); an agent's
    /// `resources.requests` override them per resource.
    #[arg(
        long = "k8s-harness-requests",
        env = "LAP_K8S_HARNESS_REQUESTS",
        default_value = "cpu=500m,memory=1Gi"
    )]
    pub harness_requests: String,
    /// Default limits of the harness container (`memory=4Gi`; no CPU limit by default, so
    /// agents are not throttled); an agent's `resources.limits` override them per resource.
    #[arg(
        long = "k8s-harness-limits",
        env = "LAP_K8S_HARNESS_LIMITS",
        default_value = "memory=4Gi"
    )]
    pub harness_limits: String,
    /// Warm pools: `harness_id=size,…` (`claude-code=3,codex=1`). Each gets a SandboxTemplate and
    /// a SandboxWarmPool; its sessions take a pod with a SandboxClaim. Empty: every session is
    /// a cold start.
    #[arg(long = "k8s-warm-pools", env = "LAP_K8S_WARM_POOLS", default_value = "")]
    pub warm_pools: String,
}

/// Why a Kubernetes setting was rejected; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct SettingError {
    pub key: &'static str,
    pub reason: String,
}

fn setting_error(key: &'static str, reason: impl Into<String>) -> SettingError {
    SettingError {
        key,
        reason: reason.into(),
    }
}

/// A DNS-1123 label (namespace names, runtime class names).
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// An image reference: non-empty, no whitespace.
fn check_image(key: &'static str, image: &str) -> Result<(), SettingError> {
    if image.trim().is_empty() || image.chars().any(char::is_whitespace) {
        return Err(setting_error(key, format!("`{image}` is not an image reference")));
    }
    Ok(())
}

impl KubernetesSettings {
    /// Check every value; the first problem names its key.
    pub fn validate(&self) -> Result<(), SettingError> {
        if !is_dns_label(&self.namespace) {
            return Err(setting_error(
                "LAP_K8S_NAMESPACE",
                format!(
                    "`{}` is not a namespace name (lowercase letters, digits, '-')",
                    self.namespace
                ),
            ));
        }
        check_image("LAP_K8S_VAULT_IMAGE", &self.vault_image)?;
        check_image("LAP_K8S_HARNESS_IMAGE", &self.harness_image)?;
        if let Some(img) = &self.netfilter_image {
            check_image("LAP_K8S_NETFILTER_IMAGE", img)?;
        }
        self.harness_image_overrides()?;
        if let Some(rc) = &self.runtime_class {
            if !is_dns_label(rc) {
                return Err(setting_error(
                    "LAP_K8S_RUNTIME_CLASS",
                    format!("`{rc}` is not a RuntimeClass name"),
                ));
            }
        }
        self.harness_resources()?;
        self.warm_pool_sizes()?;
        if self.max_lifetime < Duration::from_secs(60) {
            return Err(setting_error("LAP_K8S_MAX_LIFETIME", "must be at least 1m"));
        }
        if self.harness_port == 0 || [14322, 14323, 14324].contains(&self.harness_port) {
            return Err(setting_error(
                "LAP_K8S_HARNESS_PORT",
                format!("{} is 0 or one of the vault's ports (14322-14324)", self.harness_port),
            ));
        }
        Ok(())
    }

    /// `LAP_K8S_HARNESS_REQUESTS` and `LAP_K8S_HARNESS_LIMITS` parsed.
    pub fn harness_resources(&self) -> Result<crate::model::Resources, SettingError> {
        use crate::backend::sandbox::resources;
        let requests =
            resources::parse_list(&self.harness_requests).map_err(|e| setting_error("LAP_K8S_HARNESS_REQUESTS", e))?;
        let limits =
            resources::parse_list(&self.harness_limits).map_err(|e| setting_error("LAP_K8S_HARNESS_LIMITS", e))?;
        let r = crate::model::Resources { requests, limits };
        resources::check(&r).map_err(|e| setting_error("LAP_K8S_HARNESS_REQUESTS", e))?;
        Ok(r)
    }

    /// `LAP_K8S_WARM_POOLS` parsed: harness id → pool size.
    pub fn warm_pool_sizes(&self) -> Result<std::collections::BTreeMap<String, i32>, SettingError> {
        let mut map = std::collections::BTreeMap::new();
        for item in self.warm_pools.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (id, n) = item
                .split_once('=')
                .ok_or_else(|| setting_error("LAP_K8S_WARM_POOLS", format!("`{item}` is not harness_id=size")))?;
            let id = id.trim();
            if !crate::model::HARNESS_IDS.contains(&id) {
                return Err(setting_error(
                    "LAP_K8S_WARM_POOLS",
                    format!(
                        "`{id}` is not a harness id (one of {})",
                        crate::model::HARNESS_IDS.join(", ")
                    ),
                ));
            }
            let n: i32 = n
                .trim()
                .parse()
                .ok()
                .filter(|n| (0..=1000).contains(n))
                .ok_or_else(|| setting_error("LAP_K8S_WARM_POOLS", format!("`{item}`: the size is 0 to 1000")))?;
            map.insert(id.to_owned(), n);
        }
        Ok(map)
    }

    /// `LAP_K8S_HARNESS_IMAGES` parsed: harness id → image.
    pub fn harness_image_overrides(&self) -> Result<std::collections::BTreeMap<String, String>, SettingError> {
        let mut map = std::collections::BTreeMap::new();
        for item in self.harness_images.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let Some((id, image)) = item.split_once('=') else {
                return Err(setting_error(
                    "LAP_K8S_HARNESS_IMAGES",
                    format!("`{item}` is not harness_id=image"),
                ));
            };
            if !crate::model::HARNESS_IDS.contains(&id.trim()) {
                return Err(setting_error(
                    "LAP_K8S_HARNESS_IMAGES",
                    format!(
                        "`{id}` is not a harness id (one of {})",
                        crate::model::HARNESS_IDS.join(", ")
                    ),
                ));
            }
            check_image("LAP_K8S_HARNESS_IMAGES", image.trim())?;
            map.insert(id.trim().to_owned(), image.trim().to_owned());
        }
        Ok(map)
    }
}

/// Why a duration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a duration: use a number and a unit, like 500ms, 30s, 10m, 24h or 7d")]
pub struct DurationError(String);

/// Parse `500ms`, `30s`, `10m`, `24h`, `7d` (a bare number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| DurationError(s.to_owned()))?;
    let secs = |mult: u64| n.checked_mul(mult).map(Duration::from_secs);
    let d = match unit.trim() {
        "ms" => Some(Duration::from_millis(n)),
        "" | "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3600),
        "d" => secs(86400),
        _ => None,
    };
    d.ok_or_else(|| DurationError(s.to_owned()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("24h").unwrap(), Duration::from_secs(86400));
        assert_eq!(parse_duration("2d").unwrap(), Duration::from_secs(172800));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("5").unwrap(), Duration::from_secs(5));
        for bad in ["", "s", "10x", "-1s", "1.5h", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    /// `LAP_MODEL_GATEWAY_URL`: https with a host, the key's binding with its port unless 443;
    /// anything else names the key.
    #[test]
    fn model_gateway_urls() {
        let gw = |url: &str| {
            Settings::try_parse_from(["lap-server", "--model-gateway-url", url])
                .unwrap()
                .model_gateway()
        };
        assert_eq!(
            Settings::try_parse_from(["lap-server"])
                .unwrap()
                .model_gateway()
                .unwrap(),
            None
        );
        let g = gw("https://litellm.internal:4000/").unwrap().unwrap();
        assert_eq!(
            (g.url.as_str(), g.binding.as_str(), g.secret.as_str()),
            (
                "https://litellm.internal:4000",
                "litellm.internal:4000",
                "LAP_MODEL_GATEWAY_KEY"
            )
        );
        assert_eq!(
            gw("https://gw.example.com/litellm").unwrap().unwrap().binding,
            "gw.example.com"
        );
        for bad in [
            "http://gw.example.com",
            "gw.example.com",
            "https://u:p@gw.example.com",
            "https://gw.example.com/?k=1",
        ] {
            let e = gw(bad).unwrap_err();
            assert_eq!(e.key, "LAP_MODEL_GATEWAY_URL", "{bad}");
        }
        assert!(gw("http://gw.example.com").unwrap_err().reason.contains("https://"));
    }

    #[test]
    fn defaults() {
        let s = Settings::try_parse_from(["lap-server"]).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:4000");
        assert_eq!(s.data_dir, PathBuf::from("./.lap"));
        assert_eq!(s.backend, BackendKind::Local);
        assert_eq!(s.idle_timeout, Duration::from_secs(86400));
        assert_eq!(s.create_timeout, Duration::from_secs(600));
        assert_eq!(s.reconcile_interval, Duration::from_secs(10));
        assert_eq!(s.k8s.namespace, "lap-sandboxes");
        assert_eq!(s.k8s.api_version, SandboxApiVersion::V1beta1);
        assert!(s.k8s.transparent);
        assert_eq!(s.k8s.max_lifetime, Duration::from_secs(7 * 86400));
        assert_eq!(s.k8s.harness_port, 8080);
        assert_eq!(s.k8s.runtime_class, None);
        let r = s.k8s.harness_resources().unwrap();
        assert_eq!(
            (r.requests["cpu"].as_str(), r.requests["memory"].as_str()),
            ("500m", "1Gi")
        );
        assert_eq!(r.limits["memory"], "4Gi");
        assert!(
            s.k8s.warm_pool_sizes().unwrap().is_empty(),
            "cold starts unless pools are set"
        );
        s.k8s.validate().unwrap();
    }

    #[test]
    fn kubernetes_settings() {
        let s = Settings::try_parse_from([
            "lap-server",
            "--backend",
            "kubernetes",
            "--k8s-sandbox-api-version",
            "v1alpha1",
            "--k8s-runtime-class",
            "gvisor",
            "--k8s-transparent",
            "false",
            "--k8s-harness-images",
            "codex=reg/codex:1, opencode=reg/oc:2",
            "--k8s-warm-pools",
            "claude-code=3, codex=0",
        ])
        .unwrap();
        assert_eq!(s.backend, BackendKind::Kubernetes);
        assert_eq!(s.k8s.api_version, SandboxApiVersion::V1alpha1);
        assert_eq!(s.k8s.runtime_class.as_deref(), Some("gvisor"));
        assert!(!s.k8s.transparent);
        let o = s.k8s.harness_image_overrides().unwrap();
        assert_eq!(o["codex"], "reg/codex:1");
        assert_eq!(o["opencode"], "reg/oc:2");
        let pools = s.k8s.warm_pool_sizes().unwrap();
        assert_eq!((pools["claude-code"], pools["codex"]), (3, 0));
        assert!(Settings::try_parse_from(["lap-server", "--k8s-sandbox-api-version", "v2"]).is_err());
    }

    #[test]
    fn bad_kubernetes_settings_name_their_key() {
        let bad = |args: &[&str]| {
            let mut all = vec!["lap-server"];
            all.extend_from_slice(args);
            Settings::try_parse_from(all).unwrap().k8s.validate().unwrap_err().key
        };
        assert_eq!(bad(&["--k8s-namespace", "Bad_NS"]), "LAP_K8S_NAMESPACE");
        assert_eq!(bad(&["--k8s-vault-image", "a b"]), "LAP_K8S_VAULT_IMAGE");
        assert_eq!(bad(&["--k8s-harness-image", ""]), "LAP_K8S_HARNESS_IMAGE");
        assert_eq!(bad(&["--k8s-harness-images", "nope=img"]), "LAP_K8S_HARNESS_IMAGES");
        assert_eq!(bad(&["--k8s-harness-images", "codex"]), "LAP_K8S_HARNESS_IMAGES");
        assert_eq!(bad(&["--k8s-runtime-class", "G Visor"]), "LAP_K8S_RUNTIME_CLASS");
        assert_eq!(bad(&["--k8s-max-lifetime", "10s"]), "LAP_K8S_MAX_LIFETIME");
        assert_eq!(bad(&["--k8s-harness-port", "14322"]), "LAP_K8S_HARNESS_PORT");
        assert_eq!(bad(&["--k8s-netfilter-image", " "]), "LAP_K8S_NETFILTER_IMAGE");
        assert_eq!(bad(&["--k8s-harness-requests", "cpu=lots"]), "LAP_K8S_HARNESS_REQUESTS");
        assert_eq!(bad(&["--k8s-harness-limits", "gpu=1"]), "LAP_K8S_HARNESS_LIMITS");
        assert_eq!(
            bad(&[
                "--k8s-harness-requests",
                "memory=8Gi",
                "--k8s-harness-limits",
                "memory=4Gi"
            ]),
            "LAP_K8S_HARNESS_REQUESTS"
        );
        assert_eq!(bad(&["--k8s-warm-pools", "nope=1"]), "LAP_K8S_WARM_POOLS");
        assert_eq!(bad(&["--k8s-warm-pools", "codex=-1"]), "LAP_K8S_WARM_POOLS");
        assert_eq!(bad(&["--k8s-warm-pools", "codex"]), "LAP_K8S_WARM_POOLS");
    }

    #[test]
    fn flags() {
        let s = Settings::try_parse_from(["lap-server", "--listen", "0.0.0.0:9", "--idle-timeout", "30s"]).unwrap();
        assert_eq!(s.listen.port(), 9);
        assert_eq!(s.idle_timeout, Duration::from_secs(30));
        assert!(Settings::try_parse_from(["lap-server", "--idle-timeout", "soon"]).is_err());
    }
}
