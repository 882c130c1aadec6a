//! Host patterns: which hosts a secret is bound to, and which hosts egress may reach.
//!
//! A pattern is one of (SPEC §2.1):
//! - an exact host name, compared case-insensitively, trailing dot ignored (`api.anthropic.com`);
//! - `*.suffix`: any subdomain of `suffix` at any depth, but not `suffix` itself;
//! - an IP address (v4 or v6, `[v6]` accepted);
//! - a CIDR block (`10.0.0.0/8`, `fd00::/8`);
//! - `*`: any host.
//!
//! Matching is a pure function of the pattern and the *CONNECT target* host (never a header).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// One host pattern, parsed. See the module docs for the grammar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Any host (`*`).
    Any,
    /// Exactly this host name (lowercase, no trailing dot).
    Exact(String),
    /// Subdomains of this suffix; stored with its leading dot (`.github.com`).
    Suffix(String),
    /// Exactly this IP address.
    Ip(IpAddr),
    /// Any address in this block.
    Cidr(IpNet),
}

/// Why a host pattern was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostPatternError {
    #[error("empty host pattern")]
    Empty,
    #[error("`{0}` is not a valid host name, `*.suffix`, IP, CIDR or `*`")]
    Invalid(String),
    #[error("`{0}`: a wildcard is only allowed as the whole first label (`*.example.com`)")]
    MisplacedWildcard(String),
}

impl FromStr for HostPattern {
    type Err = HostPatternError;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let s = raw.trim();
        if s.is_empty() {
            return Err(HostPatternError::Empty);
        }
        if s == "*" {
            return Ok(Self::Any);
        }
        if s.contains('/') {
            return s
                .parse::<IpNet>()
                .map(|net| Self::Cidr(net.trunc()))
                .map_err(|_| HostPatternError::Invalid(raw.to_owned()));
        }
        if let Some(ip) = parse_ip(s) {
            return Ok(Self::Ip(ip));
        }
        if let Some(rest) = s.strip_prefix("*.") {
            let suffix = normalize_name(rest);
            if suffix.contains('*') {
                return Err(HostPatternError::MisplacedWildcard(raw.to_owned()));
            }
            if !is_valid_dns_name(&suffix) {
                return Err(HostPatternError::Invalid(raw.to_owned()));
            }
            return Ok(Self::Suffix(format!(".{suffix}")));
        }
        if s.contains('*') {
            return Err(HostPatternError::MisplacedWildcard(raw.to_owned()));
        }
        let name = normalize_name(s);
        if !is_valid_dns_name(&name) {
            return Err(HostPatternError::Invalid(raw.to_owned()));
        }
        Ok(Self::Exact(name))
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Any => f.write_str("*"),
            Self::Exact(name) => f.write_str(name),
            Self::Suffix(suffix) => write!(f, "*{suffix}"),
            Self::Ip(ip) => write!(f, "{ip}"),
            Self::Cidr(net) => write!(f, "{net}"),
        }
    }
}

impl HostPattern {
    /// Whether `host` (a CONNECT target host: name, IPv4, or IPv6 with or without brackets)
    /// matches this pattern.
    pub fn matches(&self, host: &str) -> bool {
        self.matches_target(&TargetHost::parse(host))
    }

    /// Like [`HostPattern::matches`], for a host already parsed once per request.
    pub fn matches_target(&self, host: &TargetHost) -> bool {
        match (self, host) {
            (Self::Any, _) => true,
            (Self::Exact(name), TargetHost::Name(h)) => name == h,
            (Self::Suffix(suffix), TargetHost::Name(h)) => h.len() > suffix.len() && h.ends_with(suffix.as_str()),
            (Self::Ip(ip), TargetHost::Ip(h)) => ip == h,
            (Self::Cidr(net), TargetHost::Ip(h)) => net.contains(h),
            _ => false,
        }
    }
}

/// A CONNECT target host, normalised once: lowercase name without trailing dot, or an IP.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetHost {
    Name(String),
    Ip(IpAddr),
}

impl TargetHost {
    /// Parse a host as it appears in an authority (`example.com`, `1.2.3.4`, `[::1]`, `::1`).
    ///
    /// A name the system resolver would read as an IPv4 address — `1.2.3.4.` (trailing dot) and the
    /// inet_aton spellings `127.1`, `2130706433`, `0x7f.0.0.1`, `0177.0.0.1` — *is* that address, so
    /// IP and CIDR rules (egress, bindings, the own-port check) apply to it.
    pub fn parse(host: &str) -> Self {
        if let Some(ip) = parse_ip(host) {
            return Self::Ip(ip);
        }
        let name = normalize_name(host);
        match parse_ip(&name).or_else(|| inet_aton(&name).map(IpAddr::V4)) {
            Some(ip) => Self::Ip(ip),
            None => Self::Name(name),
        }
    }
}

impl fmt::Display for TargetHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => f.write_str(name),
            Self::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Parse an IP address, accepting IPv6 in brackets.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    let inner = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')).unwrap_or(s);
    inner.parse().ok()
}

/// IPv4 in the forms `inet_aton(3)` (and so `getaddrinfo`) accepts: 1 to 4 parts, each decimal, octal
/// (leading `0`) or hex (`0x`), the last part filling the remaining bytes.
fn inet_aton(s: &str) -> Option<std::net::Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(parts.len());
    for p in parts {
        let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
            (h, 16)
        } else if p.len() > 1 && p.starts_with('0') {
            (&p[1..], 8)
        } else {
            (p, 10)
        };
        if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
            return None;
        }
        nums.push(u32::from_str_radix(digits, radix).ok()?);
    }
    let (&last, head) = nums.split_last()?;
    if head.iter().any(|&n| n > 255) {
        return None;
    }
    let last_bits = 8 * (4 - head.len() as u32);
    if last_bits < 32 && last >= 1 << last_bits {
        return None;
    }
    let high = head
        .iter()
        .enumerate()
        .fold(0u32, |acc, (i, &n)| acc | n << (24 - 8 * i as u32));
    Some(std::net::Ipv4Addr::from(high | last))
}

fn normalize_name(s: &str) -> String {
    s.trim_end_matches('.').to_ascii_lowercase()
}

/// A DNS name as accepted in patterns and CONNECT targets: labels of letters, digits, `-` and `_`,
/// 1–63 bytes each, 253 bytes in all (RFC 1035 §2.3.4, with `_` tolerated as real services use it).
pub fn is_valid_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// A list of patterns; matches when any of them does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostSet(pub Vec<HostPattern>);

impl HostSet {
    pub fn matches(&self, host: &TargetHost) -> bool {
        self.0.iter().any(|p| p.matches_target(host))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The port a [`Binding`] without one names: HTTPS.
pub const DEFAULT_BINDING_PORT: u16 = 443;

/// Where a secret may be sent: a [`HostPattern`] and one port (W08: a binding to
/// `api.example.com` is for `:443`, not for every service the host runs).
///
/// Written `PATTERN` (port 443) or `PATTERN:PORT`; an IPv6 address or block takes brackets
/// before a port (`[fd00::1]:8443`, `[fd00::/8]:8443`). Without brackets a pattern with more
/// than one `:` is an IPv6 address with no port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub host: HostPattern,
    pub port: u16,
}

/// Why a binding was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    #[error(transparent)]
    Host(#[from] HostPatternError),
    #[error("`{0}`: the port must be a number from 1 to 65535")]
    Port(String),
}

impl FromStr for Binding {
    type Err = BindingError;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let s = raw.trim();
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            match rest.split_once(']') {
                Some((inside, "")) => (inside, None),
                Some((inside, tail)) => match tail.strip_prefix(':') {
                    Some(port) => (inside, Some(port)),
                    None => return Err(HostPatternError::Invalid(raw.to_owned()).into()),
                },
                None => return Err(HostPatternError::Invalid(raw.to_owned()).into()),
            }
        } else {
            match s.split_once(':') {
                Some((host, port)) if !port.contains(':') => (host, Some(port)),
                _ => (s, None),
            }
        };
        let port = match port {
            None => DEFAULT_BINDING_PORT,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => n,
                _ => return Err(BindingError::Port(raw.to_owned())),
            },
        };
        Ok(Self {
            host: host.parse()?,
            port,
        })
    }
}

impl fmt::Display for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v6 = matches!(
            &self.host,
            HostPattern::Ip(IpAddr::V6(_)) | HostPattern::Cidr(IpNet::V6(_))
        );
        match (self.port, v6) {
            (DEFAULT_BINDING_PORT, _) => write!(f, "{}", self.host),
            (port, true) => write!(f, "[{}]:{port}", self.host),
            (port, false) => write!(f, "{}:{port}", self.host),
        }
    }
}

impl Binding {
    /// Whether a request to `host:port` (the CONNECT target) is within this binding.
    pub fn matches(&self, host: &TargetHost, port: u16) -> bool {
        self.port == port && self.host.matches_target(host)
    }
}

/// The bindings of one secret; matches when any of them does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BindingSet(pub Vec<Binding>);

impl BindingSet {
    pub fn matches(&self, host: &TargetHost, port: u16) -> bool {
        self.0.iter().any(|b| b.matches(host, port))
    }

    /// The host patterns, ports aside (the egress policy decides on hosts).
    pub fn hosts(&self) -> impl Iterator<Item = &HostPattern> {
        self.0.iter().map(|b| &b.host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_is_for_one_port_443_unless_written() {
        let b = |s: &str| s.parse::<Binding>().expect(s);
        let host = TargetHost::parse("api.example.test");
        // W08: bound to api.example.test, so :443 and nothing else.
        assert!(b("api.example.test").matches(&host, 443));
        assert!(!b("api.example.test").matches(&host, 444));
        assert!(b("api.example.test:444").matches(&host, 444));
        assert!(!b("api.example.test:444").matches(&host, 443));
        assert!(b("*.example.test:8443").matches(&TargetHost::parse("a.example.test"), 8443));
        assert_eq!(b("10.0.0.0/8:8443").port, 8443);
        assert!(b("10.0.0.0/8:8443").matches(&TargetHost::parse("10.1.2.3"), 8443));
        assert_eq!(b("fd00::1").port, 443, "an IPv6 address without brackets has no port");
        assert!(b("[fd00::1]:8443").matches(&TargetHost::parse("[fd00::1]"), 8443));
        assert!(b("[fd00::/8]:8443").matches(&TargetHost::parse("fd00::5"), 8443));
        assert_eq!(b("[fd00::1]").port, 443);
        for (s, shown) in [
            ("api.example.test", "api.example.test"),
            ("api.example.test:8443", "api.example.test:8443"),
            ("[fd00::1]:8443", "[fd00::1]:8443"),
            ("*:80", "*:80"),
        ] {
            assert_eq!(b(s).to_string(), shown);
            assert_eq!(b(&b(s).to_string()), b(s), "{s} round-trips");
        }
        for bad in [
            "api.example.test:0",
            "api.example.test:65536",
            "api.example.test:x",
            "[fd00::1]x",
            "[fd00::1",
        ] {
            assert!(bad.parse::<Binding>().is_err(), "{bad}");
        }
        assert!(matches!(
            "bad host:443".parse::<Binding>(),
            Err(BindingError::Host(HostPatternError::Invalid(_)))
        ));
    }

    fn p(s: &str) -> HostPattern {
        s.parse().expect(s)
    }

    #[test]
    fn exact_is_case_insensitive_and_ignores_trailing_dot() {
        assert!(p("API.anthropic.com").matches("api.Anthropic.com."));
        assert!(!p("api.anthropic.com").matches("anthropic.com"));
        assert!(!p("api.anthropic.com").matches("xapi.anthropic.com"));
    }

    #[test]
    fn suffix_matches_any_depth_but_not_apex() {
        let s = p("*.githubusercontent.com");
        assert!(s.matches("raw.githubusercontent.com"));
        assert!(s.matches("a.b.githubusercontent.com"));
        assert!(!s.matches("githubusercontent.com"));
        assert!(!s.matches("evilgithubusercontent.com"));
    }

    #[test]
    fn ip_and_cidr() {
        assert!(p("127.0.0.1").matches("127.0.0.1"));
        assert!(p("[::1]").matches("::1"));
        assert!(p("::1").matches("[::1]"));
        assert!(p("10.0.0.0/8").matches("10.2.3.4"));
        assert!(!p("10.0.0.0/8").matches("11.0.0.1"));
        assert!(!p("10.0.0.0/8").matches("ten.example"));
        assert!(!p("127.0.0.1").matches("localhost"));
    }

    #[test]
    fn any_matches_everything() {
        assert!(p("*").matches("example.com"));
        assert!(p("*").matches("1.2.3.4"));
    }

    #[test]
    fn invalid_patterns_are_rejected() {
        assert_eq!("".parse::<HostPattern>(), Err(HostPatternError::Empty));
        assert!(matches!(
            "a.*.com".parse::<HostPattern>(),
            Err(HostPatternError::MisplacedWildcard(_))
        ));
        assert!(matches!(
            "*.*.com".parse::<HostPattern>(),
            Err(HostPatternError::MisplacedWildcard(_))
        ));
        assert!(matches!(
            "exa mple.com".parse::<HostPattern>(),
            Err(HostPatternError::Invalid(_))
        ));
        assert!(matches!(
            "10.0.0.0/99".parse::<HostPattern>(),
            Err(HostPatternError::Invalid(_))
        ));
        assert!(matches!(
            "-bad.com".parse::<HostPattern>(),
            Err(HostPatternError::Invalid(_))
        ));
    }

    #[test]
    fn display_round_trips() {
        for s in ["*", "api.github.com", "*.github.com", "10.0.0.0/8", "::1"] {
            assert_eq!(p(&p(s).to_string()), p(s));
        }
    }
}
