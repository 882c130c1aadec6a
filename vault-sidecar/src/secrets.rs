//! Secrets: what a stub stands for, where it may be sent, and the compiled set used per request.
//!
//! A [`SecretSet`] is an immutable snapshot. Reloads build a new one and swap it in; a request keeps
//! the snapshot it started with (SPEC §2.2 `POST /reload`).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use aho_corasick::{packed, AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};

use crate::config::{HostSet, Secret, TargetHost, MIN_VALUE_LEN};

/// Values shorter than this are not redacted from responses: they would match ordinary bytes.
/// Validation refuses them ([`MIN_VALUE_LEN`]); a set built directly from [`Secret`]s skips them.
pub(crate) const MIN_REDACT_LEN: usize = MIN_VALUE_LEN;

/// The forms a value can come back in, each with the same form of the stub, as (pattern,
/// replacement) pairs, distinct patterns only, none shorter than [`MIN_REDACT_LEN`]:
///
/// - the value itself;
/// - base64, standard and URL-safe alphabets (RFC 4648 §4, §5): the whole encoding (padded and
///   not), and for each of the three alignments the value can have inside a longer encoded
///   string, the characters that only the value's bits determine. Replacing those by the stub's
///   leaves a string that decodes to the stub (or, at an unaligned offset, to the stub's bits
///   with the boundary characters garbled), never to the value;
/// - percent-encoded (RFC 3986 §2.1; every byte but the unreserved ones, upper- and lowercase
///   hex), where that differs from the value;
/// - JSON-string-escaped (RFC 8259 §7, `/` as `\/` as some encoders write it), where that
///   differs.
pub(crate) fn value_forms(value: &[u8], stub: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    use base64::Engine;
    let mut forms: Vec<(Vec<u8>, Vec<u8>)> = vec![(value.to_vec(), stub.to_vec())];
    // Unpadded first: where the value's encoding needs no padding the two are the same pattern,
    // and the stub's replacement must not gain a `=` the original did not have.
    for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD, &STANDARD, &URL_SAFE] {
        forms.push((engine.encode(value).into_bytes(), engine.encode(stub).into_bytes()));
    }
    for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
        for align in 0..3 {
            forms.push((base64_middle(engine, value, align), base64_middle(engine, stub, align)));
        }
    }
    for upper in [true, false] {
        forms.push((percent_encode(value, upper), percent_encode(stub, upper)));
    }
    forms.push((json_escape(value), json_escape(stub)));
    let mut seen = std::collections::HashSet::new();
    forms.retain(|(p, _)| p.len() >= MIN_REDACT_LEN && seen.insert(p.clone()));
    forms
}

/// The encoded forms of a stub the tripwire looks for besides the stub itself: its base64
/// (standard and URL-safe, whole and at each alignment inside a longer string) and JSON-escaped
/// forms, as in [`value_forms`]. Percent-encoding is not enumerated (any subset of bytes may be
/// encoded): the tripwire decodes instead.
pub(crate) fn stub_forms(stub: &[u8]) -> Vec<Vec<u8>> {
    value_forms(stub, stub)
        .into_iter()
        .map(|(pattern, _)| pattern)
        .filter(|p| p.as_slice() != stub && !p.contains(&b'%'))
        .collect()
}

/// The base64 characters of `bytes` preceded by `align` other bytes that depend on `bytes` alone.
fn base64_middle(engine: &impl base64::Engine, bytes: &[u8], align: usize) -> Vec<u8> {
    let mut padded = vec![0u8; align];
    padded.extend_from_slice(bytes);
    let encoded = engine.encode(&padded).into_bytes();
    // Character i holds bits [6i, 6i+6); the value's bits are [8·align, 8·(align+len)).
    let first = (8 * align).div_ceil(6);
    let end = (8 * (align + bytes.len())) / 6;
    encoded.get(first..end).map(<[u8]>::to_vec).unwrap_or_default()
}

fn percent_encode(bytes: &[u8], upper: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b);
        } else if upper {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        } else {
            out.extend_from_slice(format!("%{b:02x}").as_bytes());
        }
    }
    out
}

fn json_escape(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'/' => out.extend_from_slice(b"\\/"),
            0..=0x1f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out
}

/// A compiled snapshot of all secrets: one automaton over the stubs, one over the real values.
pub struct SecretSet {
    secrets: Vec<Secret>,
    /// Pattern `i` is `secrets[i].stub`.
    stubs: Option<Arc<Finder>>,
    /// Pattern `j` is an encoded form of `secrets[encoded_stub_ids[j]].stub` ([`stub_forms`]).
    encoded_stubs: Option<Arc<Finder>>,
    encoded_stub_ids: Vec<usize>,
    /// Pattern `j` is a form of `secrets[redact_ids[j]].value` ([`value_forms`]).
    values: Option<Arc<Finder>>,
    redact_ids: Vec<usize>,
    /// Every stub's bytes, by secret index (the body rewriter's patterns), built once per set.
    stub_bytes: Arc<[Bytes]>,
    /// The redactor's patterns (the forms of `secrets[redact_ids[j]].value`) and replacements
    /// (the same forms of their stubs).
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
/// callgrind: docs/performance.md).
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
        // Every encoded form of every redactable value, with the same form of its stub.
        let mut redact_ids = Vec::new();
        let mut redact_values = Vec::new();
        let mut redact_stubs = Vec::new();
        for (i, s) in secrets.iter().enumerate() {
            if s.value.len() < MIN_REDACT_LEN {
                continue;
            }
            for (pattern, replacement) in value_forms(s.value.as_bytes(), s.stub.as_bytes()) {
                redact_ids.push(i);
                redact_values.push(Bytes::from(pattern));
                redact_stubs.push(Some(Bytes::from(replacement)));
            }
        }
        let values = Finder::new(redact_values.iter().map(|v| &v[..])).map(Arc::new);
        let mut encoded_stub_ids = Vec::new();
        let mut encoded_stubs = Vec::new();
        for (i, s) in secrets.iter().enumerate() {
            for form in stub_forms(s.stub.as_bytes()) {
                encoded_stub_ids.push(i);
                encoded_stubs.push(form);
            }
        }
        let encoded_stubs = Finder::new(&encoded_stubs).map(Arc::new);
        let bound = HostSet(secrets.iter().flat_map(|s| s.hosts.hosts().cloned()).collect());
        let stub_bytes = secrets.iter().map(|s| Bytes::from(s.stub.clone())).collect();
        Self {
            secrets,
            stubs,
            encoded_stubs,
            encoded_stub_ids,
            values,
            redact_ids,
            stub_bytes,
            redact_values: redact_values.into(),
            redact_stubs: redact_stubs.into(),
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

    /// Automaton over the stubs' encoded forms ([`stub_forms`]) for the tripwire, and the secret
    /// index of each pattern.
    pub fn encoded_stub_automaton(&self) -> Option<(&Arc<Finder>, &[usize])> {
        self.encoded_stubs
            .as_ref()
            .map(|ac| (ac, self.encoded_stub_ids.as_slice()))
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

    /// Every host pattern some secret is bound to, ports aside (the egress policy's view).
    pub fn bound_hosts(&self) -> &HostSet {
        &self.bound
    }

    /// Whether any secret is bound to `host:port` (decides interception in `bound-hosts` mode).
    pub fn has_secret_for(&self, host: &TargetHost, port: u16) -> bool {
        self.secrets.iter().any(|s| s.hosts.matches(host, port))
    }

    /// Which secrets are bound to `host:port`, by index.
    pub fn binding_for(&self, host: &TargetHost, port: u16) -> Vec<bool> {
        self.secrets.iter().map(|s| s.hosts.matches(host, port)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form is found where the value sits inside encoded data at any offset, and the
    /// redacted text decodes to no trace of the value.
    #[test]
    fn each_encoded_form_of_a_value_is_found_and_replaced() {
        use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
        use base64::Engine;
        let value = "sk-ant-api03-R/E+A?L\"key";
        let stub = "sk-ant-api03-lapstubABCDEFGHIJ";
        let forms = value_forms(value.as_bytes(), stub.as_bytes());
        let finder = Arc::new(Finder::new(forms.iter().map(|(p, _)| &p[..])).expect("finder"));
        let patterns: Vec<Bytes> = forms.iter().map(|(p, _)| Bytes::from(p.clone())).collect();
        let replacements: Vec<Option<Bytes>> = forms.iter().map(|(_, r)| Some(Bytes::from(r.clone()))).collect();
        let redact = |text: &[u8]| {
            let mut rw = crate::rewrite::StreamRewriter::new(finder.clone(), patterns.clone(), replacements.clone());
            let mut out = rw.push(Bytes::copy_from_slice(text)).to_vec();
            out.extend_from_slice(&rw.finish());
            out
        };
        for prefix in ["", "a", "ab", "abc"] {
            for engine in [&STANDARD, &URL_SAFE_NO_PAD] {
                let encoded = engine.encode(format!("{prefix}{value}:tail"));
                let out = redact(encoded.as_bytes());
                assert_ne!(
                    out,
                    encoded.as_bytes(),
                    "offset {}: not found in {encoded}",
                    prefix.len()
                );
                let lenient = base64::engine::GeneralPurpose::new(
                    if std::ptr::eq(engine, &STANDARD) {
                        &base64::alphabet::STANDARD
                    } else {
                        &base64::alphabet::URL_SAFE
                    },
                    base64::engine::GeneralPurposeConfig::new()
                        .with_decode_allow_trailing_bits(true)
                        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
                );
                let decoded = lenient.decode(&out).unwrap_or_default();
                assert!(
                    !decoded.windows(value.len()).any(|w| w == value.as_bytes()),
                    "{encoded}"
                );
            }
        }
        assert_eq!(
            redact(STANDARD.encode(value).as_bytes()),
            STANDARD.encode(stub).as_bytes()
        );
        let percent = "sk-ant-api03-R%2FE%2BA%3FL%22key";
        assert_eq!(redact(percent.as_bytes()), stub.as_bytes());
        assert_eq!(
            redact("sk-ant-api03-R%2fE%2bA%3fL%22key".as_bytes()),
            stub.as_bytes(),
            "lowercase hex"
        );
        let json = r#"{"k":"sk-ant-api03-R\/E+A?L\"key"}"#;
        assert_eq!(redact(json.as_bytes()), format!(r#"{{"k":"{stub}"}}"#).as_bytes());
    }
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
