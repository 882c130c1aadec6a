//! `lap-server` settings (SPEC §3.1): flags with environment fallbacks, and duration parsing.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// Which sandbox backend runs sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// A `vault-sidecar` and a `lap-harness` process per session on loopback.
    Local,
    /// A `Sandbox` resource per session (not available in this build).
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

    #[test]
    fn defaults() {
        let s = Settings::try_parse_from(["lap-server"]).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:4000");
        assert_eq!(s.data_dir, PathBuf::from("./.lap"));
        assert_eq!(s.backend, BackendKind::Local);
        assert_eq!(s.idle_timeout, Duration::from_secs(86400));
        assert_eq!(s.create_timeout, Duration::from_secs(600));
        assert_eq!(s.reconcile_interval, Duration::from_secs(10));
    }

    #[test]
    fn flags() {
        let s = Settings::try_parse_from(["lap-server", "--listen", "0.0.0.0:9", "--idle-timeout", "30s"]).unwrap();
        assert_eq!(s.listen.port(), 9);
        assert_eq!(s.idle_timeout, Duration::from_secs(30));
        assert!(Settings::try_parse_from(["lap-server", "--idle-timeout", "soon"]).is_err());
    }
}
