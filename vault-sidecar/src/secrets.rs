//! Secrets: what a stub stands for, where it may be sent, and the compiled set used per request.
//!
//! A [`SecretSet`] is an immutable snapshot. Reloads build a new one and swap it in; a request keeps
//! the snapshot it started with (SPEC §2.2 `POST /reload`).

use std::fmt;
use std::str::FromStr;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};

use crate::hosts::{HostSet, TargetHost};

/// Where in a request a stub may be swapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    Header,
    Query,
    Body,
}

impl Location {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Header => "header",
            Self::Query => "query",
            Self::Body => "body",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Self::Header => 1,
            Self::Query => 2,
            Self::Body => 4,
        }
    }
}

impl FromStr for Location {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "header" => Ok(Self::Header),
            "query" => Ok(Self::Query),
            "body" => Ok(Self::Body),
            other => Err(format!("`{other}` is not one of \"header\", \"query\", \"body\"")),
        }
    }
}

/// A small set of [`Location`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LocationSet(u8);

impl LocationSet {
    pub fn insert(&mut self, loc: Location) {
        self.0 |= loc.bit();
    }

    pub fn contains(self, loc: Location) -> bool {
        self.0 & loc.bit() != 0
    }

    pub fn iter(self) -> impl Iterator<Item = Location> {
        [Location::Header, Location::Query, Location::Body]
            .into_iter()
            .filter(move |l| self.contains(*l))
    }
}

/// One secret, validated. `Debug` never shows the value or the stub.
#[derive(Clone)]
pub struct Secret {
    pub name: String,
    pub stub: String,
    pub value: String,
    pub hosts: HostSet,
    pub locations: LocationSet,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .field("locations", &self.locations)
            .finish_non_exhaustive()
    }
}

/// Values shorter than this are not redacted from responses: they would match ordinary bytes.
pub const MIN_REDACT_LEN: usize = 8;

/// A compiled snapshot of all secrets: one automaton over the stubs, one over the real values.
pub struct SecretSet {
    secrets: Vec<Secret>,
    /// Pattern `i` is `secrets[i].stub`.
    stubs: Option<AhoCorasick>,
    /// Pattern `j` is `secrets[redact_ids[j]].value`.
    values: Option<AhoCorasick>,
    redact_ids: Vec<usize>,
    bound: HostSet,
}

impl fmt::Debug for SecretSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretSet")
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

fn automaton<I, P>(patterns: I) -> Option<AhoCorasick>
where
    I: IntoIterator<Item = P>,
    P: AsRef<[u8]>,
{
    let patterns: Vec<P> = patterns.into_iter().collect();
    if patterns.is_empty() {
        return None;
    }
    AhoCorasickBuilder::new()
        .match_kind(MatchKind::LeftmostLongest)
        // A handful of short patterns: a full DFA is small and scans fastest.
        .kind(Some(AhoCorasickKind::DFA))
        .prefilter(false)
        .build(patterns)
        .ok()
}

impl SecretSet {
    pub fn new(secrets: Vec<Secret>) -> Self {
        let stubs = automaton(secrets.iter().map(|s| s.stub.as_bytes()));
        let redact_ids: Vec<usize> = secrets
            .iter()
            .enumerate()
            .filter(|(_, s)| s.value.len() >= MIN_REDACT_LEN)
            .map(|(i, _)| i)
            .collect();
        let values = automaton(redact_ids.iter().map(|&i| secrets[i].value.as_bytes()));
        let bound = HostSet(secrets.iter().flat_map(|s| s.hosts.0.iter().cloned()).collect());
        Self {
            secrets,
            stubs,
            values,
            redact_ids,
            bound,
        }
    }

    pub fn empty() -> Self {
        Self::new(Vec::new())
    }

    pub fn secrets(&self) -> &[Secret] {
        &self.secrets
    }

    pub fn len(&self) -> usize {
        self.secrets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// Automaton over the stubs; pattern id = index into [`SecretSet::secrets`].
    pub fn stub_automaton(&self) -> Option<&AhoCorasick> {
        self.stubs.as_ref()
    }

    /// Automaton over the redactable real values, and the secret index of each pattern.
    pub fn value_automaton(&self) -> Option<(&AhoCorasick, &[usize])> {
        self.values.as_ref().map(|ac| (ac, self.redact_ids.as_slice()))
    }

    /// Every host pattern some secret is bound to.
    pub fn bound_hosts(&self) -> &HostSet {
        &self.bound
    }

    /// Whether any secret is bound to this host (decides interception in `bound-hosts` mode).
    pub fn has_secret_for(&self, host: &TargetHost) -> bool {
        self.bound.matches(host)
    }

    /// Which secrets are bound to `host`, by index.
    pub fn binding_for(&self, host: &TargetHost) -> Vec<bool> {
        self.secrets.iter().map(|s| s.hosts.matches(host)).collect()
    }
}
