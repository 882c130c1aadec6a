//! Egress policy, decided twice:
//!
//! - [`EgressPolicy`] on the CONNECT (or absolute-form request) target before anything is sent.
//!   Deny wins over allow. A non-empty allow list is exclusive, with every host some secret is
//!   bound to added to it automatically (SPEC §2.1 `[egress]`).
//! - [`AddressPolicy`] on every address a target resolves to, at connect time, so a name that
//!   resolves into a denied block (DNS, `[resolve]`, DNS rebinding) or a v4-mapped spelling of a
//!   denied address is refused too. With `deny_local`, loopback, unspecified and link-local
//!   addresses and this host's own interface addresses are refused as well, except the addresses
//!   the operator's `[resolve]` table names: a sandbox reaches no service on the host it runs on.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use crate::hosts::{HostPattern, HostSet, TargetHost};

/// The egress rules, compiled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    allow: HostSet,
    deny: HostSet,
    bound: HostSet,
}

/// The outcome for one target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressDecision {
    Allow,
    /// Matched `egress.deny`.
    Denied,
    /// `egress.allow` is non-empty and the target is neither allowed nor bound to a secret.
    NotAllowed,
}

impl EgressPolicy {
    pub fn new(allow: HostSet, deny: HostSet, bound: HostSet) -> Self {
        Self { allow, deny, bound }
    }

    /// Replace the bound-hosts list (after a secrets reload).
    pub fn with_bound(&self, bound: HostSet) -> Self {
        Self {
            allow: self.allow.clone(),
            deny: self.deny.clone(),
            bound,
        }
    }

    pub fn decide(&self, host: &TargetHost) -> EgressDecision {
        if self.deny.matches(host) {
            EgressDecision::Denied
        } else if self.allow.is_empty() || self.allow.matches(host) || self.bound.matches(host) {
            EgressDecision::Allow
        } else {
            EgressDecision::NotAllowed
        }
    }
}

/// Why an address was refused by the [`AddressPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressDenial {
    /// The address is in an `egress.deny` IP or CIDR rule.
    DenyRule,
    /// `deny_local`: loopback, unspecified, link-local, or one of this host's own addresses.
    Local,
}

impl AddressDenial {
    /// In words, for the answer's `detail`.
    pub fn describe(self) -> &'static str {
        match self {
            Self::DenyRule => "the target resolves to an address the [egress] deny rules refuse",
            Self::Local => "the target resolves to an address of this host (egress.deny_local)",
        }
    }
}

/// The rules applied to each resolved address before a TCP connect.
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    deny: Vec<IpNet>,
    deny_local: bool,
    /// This host's interface addresses (canonical), refused with `deny_local`.
    own: HashSet<IpAddr>,
    /// Addresses named by `[resolve]`: trusted by `deny_local` (not by deny rules).
    trusted: HashSet<SocketAddr>,
}

/// An IP in canonical form: an IPv4-mapped IPv6 address (`::ffff:127.0.0.1`) is its IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// Loopback, unspecified (`0.0.0.0`, `::`, which reach the local host) or link-local
/// (`169.254.0.0/16`, `fe80::/10`: cloud metadata services live there).
pub fn is_host_local(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => v4.is_loopback() || v4.is_unspecified() || v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified() || v6.is_unicast_link_local(),
    }
}

impl AddressPolicy {
    /// From the deny patterns (their IP and CIDR rules apply to addresses), `deny_local`, this
    /// host's own addresses and the `[resolve]` targets.
    pub fn new(
        deny: &HostSet,
        deny_local: bool,
        own: impl IntoIterator<Item = IpAddr>,
        trusted: impl IntoIterator<Item = SocketAddr>,
    ) -> Self {
        let deny = deny
            .0
            .iter()
            .filter_map(|p| match p {
                HostPattern::Ip(ip) => Some(IpNet::from(canonical(*ip))),
                HostPattern::Cidr(net) => Some(*net),
                _ => None,
            })
            .collect();
        Self {
            deny,
            deny_local,
            own: own.into_iter().map(canonical).collect(),
            trusted: trusted.into_iter().collect(),
        }
    }

    /// `Err` when `addr` may not be connected to.
    pub fn check(&self, addr: SocketAddr) -> Result<(), AddressDenial> {
        let ip = canonical(addr.ip());
        let in_rule = |net: &IpNet| {
            net.contains(&ip)
                // A v6 rule written for a mapped address (`::ffff:10.0.0.0/104`) still applies.
                || net.contains(&addr.ip())
        };
        if self.deny.iter().any(in_rule) {
            return Err(AddressDenial::DenyRule);
        }
        let trusted = self.trusted.contains(&addr) || self.trusted.contains(&SocketAddr::new(ip, addr.port()));
        if self.deny_local && !trusted && (is_host_local(ip) || self.own.contains(&ip)) {
            return Err(AddressDenial::Local);
        }
        Ok(())
    }
}

/// This host's interface addresses (empty when they cannot be listed).
pub fn own_interface_addresses() -> Vec<IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|a| {
            let sa = a.address?;
            if let Some(v4) = sa.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                sa.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> HostSet {
        HostSet(items.iter().map(|s| s.parse::<HostPattern>().expect(s)).collect())
    }

    fn t(s: &str) -> TargetHost {
        TargetHost::parse(s)
    }

    #[test]
    fn empty_policy_allows_everything() {
        assert_eq!(EgressPolicy::default().decide(&t("example.com")), EgressDecision::Allow);
    }

    #[test]
    fn deny_wins_over_allow_and_bound() {
        let p = EgressPolicy::new(
            set(&["*.example.com"]),
            set(&["bad.example.com", "10.0.0.0/8"]),
            set(&["10.1.1.1"]),
        );
        assert_eq!(p.decide(&t("bad.example.com")), EgressDecision::Denied);
        assert_eq!(p.decide(&t("10.1.1.1")), EgressDecision::Denied);
        assert_eq!(p.decide(&t("ok.example.com")), EgressDecision::Allow);
    }

    #[test]
    fn allow_list_is_exclusive_but_includes_bound_hosts() {
        let p = EgressPolicy::new(set(&["pypi.org"]), HostSet::default(), set(&["api.anthropic.com"]));
        assert_eq!(p.decide(&t("pypi.org")), EgressDecision::Allow);
        assert_eq!(p.decide(&t("api.anthropic.com")), EgressDecision::Allow);
        assert_eq!(p.decide(&t("example.com")), EgressDecision::NotAllowed);
    }
}

#[cfg(test)]
mod address_tests {
    use super::*;

    fn deny(items: &[&str]) -> HostSet {
        HostSet(items.iter().map(|s| s.parse::<HostPattern>().expect(s)).collect())
    }

    fn a(s: &str) -> SocketAddr {
        s.parse().expect(s)
    }

    #[test]
    fn deny_rules_apply_to_canonical_addresses() {
        let p = AddressPolicy::new(&deny(&["127.0.0.0/8", "10.1.2.3", "*.evil.example"]), false, [], []);
        assert_eq!(p.check(a("127.0.0.1:80")), Err(AddressDenial::DenyRule));
        // W06: the v4-mapped spelling is the same address.
        assert_eq!(p.check(a("[::ffff:127.0.0.1]:80")), Err(AddressDenial::DenyRule));
        assert_eq!(p.check(a("[::ffff:10.1.2.3]:443")), Err(AddressDenial::DenyRule));
        assert_eq!(p.check(a("10.1.2.4:443")), Ok(()));
        assert_eq!(p.check(a("[2001:db8::1]:443")), Ok(()));
    }

    #[test]
    fn deny_local_refuses_the_host_but_trusts_resolve_targets() {
        let own: IpAddr = "192.0.2.7".parse().expect("ip");
        let p = AddressPolicy::new(&HostSet::default(), true, [own], [a("127.0.0.1:8443")]);
        for bad in [
            "127.0.0.1:4000",
            "127.9.9.9:1",
            "0.0.0.0:4000",
            "[::]:4000",
            "[::1]:4000",
            "[::ffff:127.0.0.1]:4000",
            "169.254.169.254:80",
            "[fe80::1]:80",
            "192.0.2.7:22",
        ] {
            assert_eq!(p.check(a(bad)), Err(AddressDenial::Local), "{bad}");
        }
        assert_eq!(p.check(a("127.0.0.1:8443")), Ok(()), "a [resolve] target");
        assert_eq!(p.check(a("[::ffff:127.0.0.1]:8443")), Ok(()), "the same, v4-mapped");
        assert_eq!(
            p.check(a("127.0.0.1:8444")),
            Err(AddressDenial::Local),
            "only that port"
        );
        assert_eq!(p.check(a("93.184.215.14:443")), Ok(()));
    }

    #[test]
    fn resolve_targets_are_not_exempt_from_deny_rules() {
        // W07: a [resolve] target is trusted by deny_local, never by an explicit deny rule.
        let p = AddressPolicy::new(&deny(&["127.0.0.0/8"]), true, [], [a("127.0.0.1:8443")]);
        assert_eq!(p.check(a("127.0.0.1:8443")), Err(AddressDenial::DenyRule));
    }

    #[test]
    fn without_deny_local_the_host_is_reachable() {
        let p = AddressPolicy::default();
        assert_eq!(p.check(a("127.0.0.1:4000")), Ok(()));
    }
}
