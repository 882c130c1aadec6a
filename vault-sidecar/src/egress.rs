//! Egress policy: decided on the CONNECT (or absolute-form request) target before anything is sent.
//!
//! Deny wins over allow. A non-empty allow list is exclusive, with every host some secret is bound to
//! added to it automatically (SPEC §2.1 `[egress]`).

use crate::hosts::{HostSet, TargetHost};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts::HostPattern;

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
