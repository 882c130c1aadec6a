//! The CONNECT target and what may be done with it: parsing, egress policy, loop refusal, and the
//! intercept-or-tunnel decision. Pure functions; the I/O is in [`crate::listener`].

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use crate::config::{is_valid_dns_name, TargetHost};
use crate::config::{BindingSet, InterceptMode};
use crate::secrets::SecretSet;

/// Where a CONNECT (or absolute-form request) goes: host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub host: TargetHost,
    pub port: u16,
}

impl Target {
    /// `host:port`, with IPv6 in brackets.
    pub fn authority(&self) -> String {
        match &self.host {
            TargetHost::Ip(IpAddr::V6(ip)) => format!("[{ip}]:{}", self.port),
            host => format!("{host}:{}", self.port),
        }
    }

    /// The authority as it appears in a URI for `scheme` (port omitted when it is the default).
    pub fn uri_authority(&self, default_port: u16) -> String {
        let host = match &self.host {
            TargetHost::Ip(IpAddr::V6(ip)) => format!("[{ip}]"),
            host => host.to_string(),
        };
        if self.port == default_port {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.authority())
    }
}

/// Why a CONNECT target was rejected as malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("CONNECT needs an authority-form target (host:port), RFC 9110 §9.3.6")]
    Missing,
    #[error("`{0}` is not a valid host name or IP address")]
    BadHost(String),
    #[error("port 0 cannot be reached")]
    BadPort,
}

/// Parse a target from a host (as in a URI: names, IPv4, `[IPv6]`) and optional port.
pub fn parse_target(host: Option<&str>, port: Option<u16>, default_port: u16) -> Result<Target, TargetError> {
    let raw = host.filter(|h| !h.is_empty()).ok_or(TargetError::Missing)?;
    let host = TargetHost::parse(raw);
    if let TargetHost::Name(name) = &host {
        if !is_valid_dns_name(name) {
            return Err(TargetError::BadHost(raw.to_owned()));
        }
    }
    let port = port.unwrap_or(default_port);
    if port == 0 {
        return Err(TargetError::BadPort);
    }
    Ok(Target { host, port })
}

/// Whether a target points back at one of the sidecar's own listeners.
pub fn is_self(target: &Target, own: &[SocketAddr]) -> bool {
    own.iter().any(|addr| {
        addr.port() == target.port
            && match &target.host {
                TargetHost::Ip(ip) => {
                    ip == &addr.ip() || ip.is_loopback() || ip.is_unspecified() || addr.ip().is_unspecified()
                }
                TargetHost::Name(name) => name == "localhost" || name.ends_with(".localhost"),
            }
    })
}

/// Whether the sidecar terminates TLS for this target (else it tunnels bytes untouched): a host
/// some secret is bound to always; under `intercept = "all"` every other one too, except the
/// `passthrough` targets.
pub(crate) fn should_intercept(
    mode: InterceptMode,
    passthrough: &BindingSet,
    secrets: &SecretSet,
    target: &Target,
) -> bool {
    secrets.has_secret_for(&target.host, target.port)
        || (mode == InterceptMode::All && !passthrough.matches(&target.host, target.port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_names_ipv4_and_ipv6() {
        let t = parse_target(Some("API.Anthropic.com"), Some(443), 443).expect("name");
        assert_eq!(t.authority(), "api.anthropic.com:443");
        let t = parse_target(Some("[::1]"), Some(8443), 443).expect("v6");
        assert_eq!(t.authority(), "[::1]:8443");
        assert_eq!(t.uri_authority(443), "[::1]:8443");
        let t = parse_target(Some("10.1.2.3"), None, 443).expect("v4");
        assert_eq!(t.uri_authority(443), "10.1.2.3");
        assert_eq!(parse_target(None, Some(1), 443), Err(TargetError::Missing));
        assert!(matches!(
            parse_target(Some("bad host"), Some(1), 443),
            Err(TargetError::BadHost(_))
        ));
        assert_eq!(parse_target(Some("a.com"), Some(0), 443), Err(TargetError::BadPort));
    }

    #[test]
    fn loops_back_to_own_ports_are_detected() {
        let own: Vec<SocketAddr> = vec![
            "127.0.0.1:14322".parse().expect("a"),
            "127.0.0.1:14323".parse().expect("a"),
        ];
        let t = |h: &str, p: u16| parse_target(Some(h), Some(p), 443).expect("t");
        assert!(is_self(&t("127.0.0.1", 14323), &own));
        assert!(is_self(&t("localhost", 14322), &own));
        assert!(is_self(&t("127.0.0.2", 14322), &own));
        assert!(!is_self(&t("127.0.0.1", 443), &own));
        assert!(!is_self(&t("example.com", 14322), &own));
    }
}
