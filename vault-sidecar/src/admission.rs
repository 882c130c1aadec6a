//! Whether a connection may go to its target at all: the one check every entry point makes (an
//! explicit `CONNECT`, an absolute-form `http://` request, a transparently redirected connection)
//! before anything else. Pure: the caller brings the sidecar's own addresses and the policies.
//!
//! Order: a target that is one of the sidecar's own listeners is a loop (refused even if egress
//! would allow it); then the `[egress]` policy decides on the name (or address) the client gave;
//! for a redirected connection, whose real destination is an address, the address must also not
//! be denied by name nor refused by the resolved-address policy.

use std::net::SocketAddr;

use crate::config::TargetHost;
use crate::config::{AddressPolicy, EgressDecision, EgressPolicy};
use crate::connect::{is_self, Target};
use crate::refusal::BlockReason;

/// What the entry point knows about where the connection goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Destination<'a> {
    /// The target as the client named it (CONNECT target, URI host, or the TLS SNI).
    pub(crate) target: &'a Target,
    /// For a redirected connection: the address it was really sent to (`SO_ORIGINAL_DST`).
    pub(crate) original: Option<SocketAddr>,
}

/// The policies a destination is checked against.
#[derive(Clone, Copy)]
pub(crate) struct Policies<'a> {
    /// The sidecar's own listening addresses.
    pub(crate) own: &'a [SocketAddr],
    pub(crate) egress: &'a EgressPolicy,
    pub(crate) addresses: &'a AddressPolicy,
}

/// `Ok` when the destination may be reached; else why not.
pub(crate) fn admit(dest: Destination<'_>, policies: Policies<'_>) -> Result<(), BlockReason> {
    let original = dest.original.map(|addr| Target {
        host: TargetHost::Ip(addr.ip()),
        port: addr.port(),
    });
    if is_self(dest.target, policies.own) || original.as_ref().is_some_and(|t| is_self(t, policies.own)) {
        return Err(BlockReason::Loop);
    }
    if policies.egress.decide(&dest.target.host) != EgressDecision::Allow {
        return Err(BlockReason::EgressPolicy);
    }
    if let (Some(addr), Some(ip_target)) = (dest.original, &original) {
        if policies.egress.decide(&ip_target.host) == EgressDecision::Denied || policies.addresses.check(addr).is_err()
        {
            return Err(BlockReason::EgressPolicy);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HostSet;
    use crate::connect::parse_target;

    fn egress(allow: &[&str], deny: &[&str]) -> EgressPolicy {
        let set = |l: &[&str]| HostSet(l.iter().map(|s| s.parse().expect(s)).collect());
        EgressPolicy::new(set(allow), set(deny), HostSet::default())
    }

    fn target(host: &str, port: u16) -> Target {
        parse_target(Some(host), Some(port), 443).expect("target")
    }

    #[test]
    fn own_ports_are_a_loop_even_when_egress_allows_them() {
        let own: Vec<SocketAddr> = vec!["127.0.0.1:14322".parse().expect("addr")];
        let egress = egress(&[], &[]);
        let addresses = AddressPolicy::default();
        let p = Policies {
            own: &own,
            egress: &egress,
            addresses: &addresses,
        };
        let t = target("localhost", 14322);
        assert_eq!(
            admit(
                Destination {
                    target: &t,
                    original: None
                },
                p
            ),
            Err(BlockReason::Loop)
        );
        // A redirected connection naming another host by SNI, really sent to our own port.
        let t = target("api.example.com", 443);
        let original = Some("127.0.0.1:14322".parse().expect("addr"));
        assert_eq!(admit(Destination { target: &t, original }, p), Err(BlockReason::Loop));
        assert_eq!(
            admit(
                Destination {
                    target: &t,
                    original: None
                },
                p
            ),
            Ok(())
        );
    }

    #[test]
    fn egress_decides_on_the_name_and_a_redirected_address_must_not_be_denied() {
        let own: Vec<SocketAddr> = Vec::new();
        let egress = egress(&["api.example.com", "10.0.0.0/8"], &["10.9.9.9"]);
        let addresses = AddressPolicy::default();
        let p = Policies {
            own: &own,
            egress: &egress,
            addresses: &addresses,
        };
        let allowed = target("api.example.com", 443);
        let other = target("evil.example", 443);
        assert_eq!(
            admit(
                Destination {
                    target: &allowed,
                    original: None
                },
                p
            ),
            Ok(())
        );
        assert_eq!(
            admit(
                Destination {
                    target: &other,
                    original: None
                },
                p
            ),
            Err(BlockReason::EgressPolicy)
        );
        let to = |a: &str| Some(a.parse::<SocketAddr>().expect("addr"));
        assert_eq!(
            admit(
                Destination {
                    target: &allowed,
                    original: to("10.1.2.3:443")
                },
                p
            ),
            Ok(())
        );
        assert_eq!(
            admit(
                Destination {
                    target: &allowed,
                    original: to("10.9.9.9:443")
                },
                p
            ),
            Err(BlockReason::EgressPolicy),
            "an allowed SNI does not launder a denied address"
        );
    }
}
