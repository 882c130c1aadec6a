//! Secrets: what a stub stands for, where it may be sent, and the compiled set used per request.
//!
//! A [`SecretSet`] is an immutable snapshot. Reloads build a new one and swap it in; a request keeps
//! the snapshot it started with (SPEC §2.2 `POST /reload`).

use std::fmt;
use std::str::FromStr;

use std::sync::Arc;

use bytes::Bytes;

use aho_corasick::{packed, AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};

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
    stubs: Option<Arc<Finder>>,
    /// Pattern `j` is `secrets[redact_ids[j]].value`.
    values: Option<Arc<Finder>>,
    redact_ids: Vec<usize>,
    /// Every stub's bytes, by secret index (the body rewriter's patterns), built once per set.
    stub_bytes: Arc<[Bytes]>,
    /// The redactor's patterns (`secrets[redact_ids[j]].value`) and replacements (their stubs).
    redact_values: Arc<[Bytes]>,
    redact_stubs: Arc<[Option<Bytes>]>,
    bound: HostSet,
}

impl fmt::Debug for SecretSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretSet")
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

/// Leftmost-longest search for a handful of patterns (stubs, or real values).
///
/// Two searchers with the same matches: the packed SIMD searcher (Teddy) where the CPU and the
/// pattern set allow it, else a full DFA. On bodies that hold no pattern, the common case, Teddy
/// needs about a tenth of the DFA's instructions per byte (`examples/scan_cost.rs` under
/// callgrind: README, Performance).
#[derive(Clone, Debug)]
pub struct Finder {
    dfa: AhoCorasick,
    packed: Option<packed::Searcher>,
}

impl Finder {
    /// `None` when there are no patterns (or they can't be compiled).
    pub fn new<I, P>(patterns: I) -> Option<Self>
    where
        I: IntoIterator<Item = P>,
        P: AsRef<[u8]>,
    {
        let patterns: Vec<P> = patterns.into_iter().collect();
        if patterns.is_empty() {
            return None;
        }
        let dfa = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .kind(Some(AhoCorasickKind::DFA))
            // Its start-byte prefilter doubles the cost on text full of those bytes; Teddy covers the need.
            .prefilter(false)
            .build(&patterns)
            .ok()?;
        let packed = packed::Config::new()
            .match_kind(packed::MatchKind::LeftmostLongest)
            .builder()
            .extend(&patterns)
            .build();
        Some(Self { dfa, packed })
    }

    /// Non-overlapping leftmost-longest matches, left to right; pattern ids in insertion order.
    pub fn find_iter<'f, 'h>(&'f self, haystack: &'h [u8]) -> FindIter<'f, 'h> {
        match &self.packed {
            Some(p) => FindIter::Packed(p.find_iter(haystack)),
            None => FindIter::Dfa(self.dfa.find_iter(haystack)),
        }
    }

    /// Whether the SIMD searcher is in use (else the DFA).
    pub fn is_packed(&self) -> bool {
        self.packed.is_some()
    }
}

/// Matches from [`Finder::find_iter`].
pub enum FindIter<'f, 'h> {
    Packed(packed::FindIter<'f, 'h>),
    Dfa(aho_corasick::FindIter<'f, 'h>),
}

impl Iterator for FindIter<'_, '_> {
    type Item = aho_corasick::Match;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            FindIter::Packed(it) => it.next(),
            FindIter::Dfa(it) => it.next(),
        }
    }
}

impl SecretSet {
    pub fn new(secrets: Vec<Secret>) -> Self {
        let stubs = Finder::new(secrets.iter().map(|s| s.stub.as_bytes())).map(Arc::new);
        let redact_ids: Vec<usize> = secrets
            .iter()
            .enumerate()
            .filter(|(_, s)| s.value.len() >= MIN_REDACT_LEN)
            .map(|(i, _)| i)
            .collect();
        let values = Finder::new(redact_ids.iter().map(|&i| secrets[i].value.as_bytes())).map(Arc::new);
        let bound = HostSet(secrets.iter().flat_map(|s| s.hosts.0.iter().cloned()).collect());
        let stub_bytes = secrets.iter().map(|s| Bytes::from(s.stub.clone())).collect();
        let redact_values = redact_ids
            .iter()
            .map(|&i| Bytes::from(secrets[i].value.clone()))
            .collect();
        let redact_stubs = redact_ids
            .iter()
            .map(|&i| Some(Bytes::from(secrets[i].stub.clone())))
            .collect();
        Self {
            secrets,
            stubs,
            values,
            redact_ids,
            stub_bytes,
            redact_values,
            redact_stubs,
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
    /// Shared: each request's rewriter holds a reference, never a copy (a packed searcher's clone
    /// allocates its Rabin-Karp buckets).
    pub fn stub_automaton(&self) -> Option<&Arc<Finder>> {
        self.stubs.as_ref()
    }

    /// Automaton over the redactable real values, and the secret index of each pattern.
    pub fn value_automaton(&self) -> Option<(&Arc<Finder>, &[usize])> {
        self.values.as_ref().map(|ac| (ac, self.redact_ids.as_slice()))
    }

    /// Every stub's bytes, by secret index.
    pub fn stub_bytes(&self) -> &Arc<[Bytes]> {
        &self.stub_bytes
    }

    /// The redactor's patterns (real values, in [`SecretSet::value_automaton`]'s order) and their stubs.
    pub fn redaction(&self) -> (&Arc<[Bytes]>, &Arc<[Option<Bytes>]>) {
        (&self.redact_values, &self.redact_stubs)
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn dfa_matches(patterns: &[Vec<u8>], text: &[u8]) -> Vec<(usize, usize, usize)> {
        AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(patterns)
            .expect("ac")
            .find_iter(text)
            .map(|m| (m.pattern().as_usize(), m.start(), m.end()))
            .collect()
    }

    #[test]
    fn stub_shaped_patterns_use_the_packed_searcher_where_the_cpu_has_ssse3() {
        let f = Finder::new([
            "sk-ant-api03-lapstub-aaaaaaaa",
            "sk-lapstub-cccccccc",
            "ghp_lapstubeeeeeeee",
        ])
        .expect("finder");
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("ssse3") {
            assert!(f.is_packed());
        }
        let text = b"{\"key\":\"sk-lapstub-cccccccc\",\"k2\":\"sk-ant-api03-lapstub-aaaaaaaa\"}".repeat(3);
        let got: Vec<_> = f
            .find_iter(&text)
            .map(|m| (m.pattern().as_usize(), m.start()))
            .collect();
        assert_eq!(got.len(), 6);
        assert_eq!(got[0], (1, 8));
    }

    proptest! {
        /// Whichever searcher `Finder` picks, its matches are the DFA's, on stub-like patterns
        /// sharing prefixes and on haystacks long enough for the SIMD path.
        #[test]
        fn finder_matches_are_the_leftmost_longest_dfa_matches(
            tails in prop::collection::vec(prop::collection::vec(b'a'..=b'c', 0..6), 1..6),
            noise in prop::collection::vec(prop_oneof![Just(b'a'), Just(b'c'), Just(b'-'), Just(b's'), Just(b'k'), Just(b'x')], 0..3000),
            inserts in prop::collection::vec((0usize..3000, 0usize..6), 0..20),
        ) {
            let mut patterns: Vec<Vec<u8>> = tails.iter().map(|t| [b"sk-".as_slice(), t].concat()).collect();
            patterns.sort();
            patterns.dedup();
            let mut text = noise;
            for (at, which) in inserts {
                let p = &patterns[which % patterns.len()];
                let at = at.min(text.len());
                text.splice(at..at, p.iter().copied());
            }
            let finder = Finder::new(&patterns).expect("finder");
            let got: Vec<_> = finder.find_iter(&text).map(|m| (m.pattern().as_usize(), m.start(), m.end())).collect();
            prop_assert_eq!(got, dfa_matches(&patterns, &text));
        }
    }
}
