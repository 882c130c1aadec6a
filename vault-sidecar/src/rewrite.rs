//! Stub swapping and value redaction: pure functions over bytes, no I/O.
//!
//! Start with [`HostRules`]: built once per request from a [`SecretSet`] snapshot and the CONNECT
//! target, it swaps stubs in header values (including inside `Authorization: Basic`), in the query
//! string and, through a [`StreamRewriter`], in the body. A stub whose secret is *not* bound to the
//! target is never swapped; finding one is an [`Exfiltration`] the caller turns into a `403`.
//!
//! [`StreamRewriter`] replaces patterns in a body that arrives in chunks and gives exactly the output
//! of a one-shot replacement over the whole body, whatever the chunking, holding back only the
//! bytes of a live partial match at the end of a chunk.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

#[cfg(doc)]
use crate::config::Surfaces;
use crate::config::{HeaderUse, Location, Secret, TargetHost, CREDENTIAL_SCHEMES};
use crate::secrets::{Finder, SecretSet};

/// How many times the tripwire percent-decodes a path, query or header looking for a stub.
pub(crate) const MAX_DECODES: usize = 4;

/// A stub the request may not carry where it does, toward this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exfiltration {
    /// The secret's name (never its value or stub).
    pub secret: String,
    pub location: Location,
    pub why: StubRefusal,
}

/// Why a stub was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StubRefusal {
    /// Its secret is not bound to the target host.
    Unbound,
    /// Its secret is bound to the target, but this is not one of the secret's credential
    /// surfaces (W01): a host that reflects the field would hand the real value back.
    Undeclared,
}

/// Which secrets were injected where, for audit and metrics. Deduplicated, in first-seen order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Injections(pub Vec<(usize, Location)>);

impl Injections {
    pub fn record(&mut self, secret: usize, location: Location) {
        if !self.0.contains(&(secret, location)) {
            self.0.push((secret, location));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The rules for one request: the secrets snapshot and which of its secrets the target is bound to.
pub struct HostRules<'a> {
    set: &'a SecretSet,
    bound: Vec<bool>,
}

impl<'a> HostRules<'a> {
    /// The rules toward the CONNECT target `host:port`.
    pub fn new(set: &'a SecretSet, host: &TargetHost, port: u16) -> Self {
        Self {
            set,
            bound: set.binding_for(host, port),
        }
    }

    /// The rules over cleartext (`http://`): no secret is bound there, so any stub refuses.
    pub fn cleartext(set: &'a SecretSet) -> Self {
        Self {
            set,
            bound: vec![false; set.len()],
        }
    }

    pub fn set(&self) -> &'a SecretSet {
        self.set
    }

    /// Whether this host is bound to some secret (then bodies may carry other secrets' stubs
    /// under `body_tripwire = "hosts-without-secrets"`).
    pub fn has_bound(&self) -> bool {
        self.bound.iter().any(|b| *b)
    }

    /// Whether some secret's stub would trip the tripwire here (a secret not bound to this host).
    pub fn has_unbound(&self) -> bool {
        self.set.stub_automaton().is_some() && !self.bound.iter().all(|b| *b)
    }

    /// The body tripwire over a whole body: a stub of a secret this host is not bound to, as
    /// written or encoded ([`HostRules::tripwire`]), refuses. A JSON body with `\u` escapes
    /// (RFC 8259 §7: any character may be written so) is also read string by string, unescaped.
    pub fn body(&self, input: &[u8]) -> Result<(), Exfiltration> {
        if !self.has_unbound() {
            return Ok(());
        }
        self.unbound_anywhere(input)?;
        if input.windows(2).any(|w| w == b"\\u") {
            if let Ok(json) = serde_json::from_slice::<serde_json::Value>(input) {
                return self.json_strings(&json);
            }
        }
        Ok(())
    }

    fn json_strings(&self, v: &serde_json::Value) -> Result<(), Exfiltration> {
        match v {
            serde_json::Value::String(s) => self.unbound_anywhere(s.as_bytes()),
            serde_json::Value::Array(items) => items.iter().try_for_each(|i| self.json_strings(i)),
            serde_json::Value::Object(map) => map.iter().try_for_each(|(k, v)| {
                self.unbound_anywhere(k.as_bytes())?;
                self.json_strings(v)
            }),
            _ => Ok(()),
        }
    }

    /// An unbound secret's stub in `input`, as written, encoded or percent-encoded.
    fn unbound_anywhere(&self, input: &[u8]) -> Result<(), Exfiltration> {
        if let Some(ac) = self.set.stub_automaton() {
            if let Some(id) = ac
                .find_iter(input)
                .map(|m| m.pattern().as_usize())
                .find(|&id| !self.bound[id])
            {
                return Err(self.refusal(id, Location::Body, StubRefusal::Unbound));
            }
        }
        self.tripwire(input, Location::Body)
    }

    /// The body tripwire for a body that streams: `None` when every secret is bound here.
    pub fn stub_scanner(&self, location: Location) -> Option<StubScanner> {
        if !self.has_unbound() {
            return None;
        }
        // Every pattern is a stub or an encoded form of one: base64 grows it by 4/3, JSON
        // escaping at most doubles it.
        let longest = self.set.stub_bytes().iter().map(Bytes::len).max().unwrap_or(0);
        Some(StubScanner {
            bound: self.bound.clone(),
            location,
            keep: longest * 2 + 4,
            tail: Vec::new(),
            decoded: Vec::new(),
            json: None,
        })
    }

    /// The tripwire beyond the stub as written: a stub of a secret this host is not bound to,
    /// base64- or JSON-encoded ([`crate::secrets::stub_forms`]), or percent-encoded (decoded up to
    /// [`MAX_DECODES`] levels, `%25` hiding one each), refuses. Nothing to find when every secret
    /// is bound to this host.
    pub fn tripwire(&self, input: &[u8], location: Location) -> Result<(), Exfiltration> {
        if self.bound.iter().all(|b| *b) {
            return Ok(());
        }
        self.unbound_encoded(input, location)?;
        if !input.contains(&b'%') {
            return Ok(());
        }
        let mut form = input.to_vec();
        for _ in 0..MAX_DECODES {
            let decoded: Vec<u8> = percent_encoding::percent_decode(&form).collect();
            if decoded == form {
                break;
            }
            if let Some(ac) = self.set.stub_automaton() {
                if let Some(id) = ac
                    .find_iter(&decoded)
                    .map(|m| m.pattern().as_usize())
                    .find(|&id| !self.bound[id])
                {
                    return Err(self.refusal(id, location, StubRefusal::Unbound));
                }
            }
            self.unbound_encoded(&decoded, location)?;
            form = decoded;
        }
        Ok(())
    }

    /// A header *name* (lowercase, as HTTP/2 sends it and as parsed: RFC 9110 §5.1) is never a
    /// surface: any stub in it, in any case, refuses.
    pub fn header_name(&self, name: &str) -> Result<(), Exfiltration> {
        for (id, secret) in self.set.secrets().iter().enumerate() {
            if contains_ignore_ascii_case(name.as_bytes(), secret.stub.as_bytes()) {
                return Err(self.refusal(id, Location::Header, self.outside(id)));
            }
        }
        Ok(())
    }

    /// An encoded form of an unbound secret's stub in `input`.
    fn unbound_encoded(&self, input: &[u8], location: Location) -> Result<(), Exfiltration> {
        if let Some((ac, ids)) = self.set.encoded_stub_automaton() {
            if let Some(id) = ac
                .find_iter(input)
                .map(|m| ids[m.pattern().as_usize()])
                .find(|&id| !self.bound[id])
            {
                return Err(self.refusal(id, location, StubRefusal::Unbound));
            }
        }
        Ok(())
    }

    /// Swap stubs in the value of header `name` (lowercase); `Ok(None)` when nothing changed.
    ///
    /// A stub is swapped only where its secret declares the header ([`Surfaces::header`]):
    /// a declared `Authorization` with a [`CREDENTIAL_SCHEMES`] scheme, or a named header
    /// anywhere in its value. `Authorization: Basic <base64>` is decoded, swapped and re-encoded
    /// (RFC 7617), so credentials in a URL (`https://user:STUB@host/`) work.
    pub fn header_value(
        &self,
        name: &str,
        value: &[u8],
        injections: &mut Injections,
    ) -> Result<Option<Vec<u8>>, Exfiltration> {
        let Some(ac) = self.set.stub_automaton() else {
            return Ok(None);
        };
        self.tripwire(value, Location::Header)?;
        // The scheme is read only when a stub is found where it matters (not per request).
        let allowed = |secret: &Secret, at: usize| match secret.surfaces.header(name) {
            Some(HeaderUse::Whole) => true,
            Some(HeaderUse::SchemeCredentials) => {
                auth_scheme(value).is_some_and(|(scheme, creds)| at >= creds && is_credential_scheme(scheme))
            }
            None => false,
        };
        let swapped = self.swap(ac, value, Location::Header, injections, allowed)?;
        let current = swapped.as_deref().unwrap_or(value);
        if let Some(encoded) = basic_credentials(current) {
            if let Ok(decoded) = BASE64.decode(encoded.trim_ascii()) {
                // The credentials as the host reads them: encoded stubs inside refuse too.
                self.tripwire(&decoded, Location::Header)?;
                let inside = |secret: &Secret, _: usize| secret.surfaces.header(name).is_some();
                if let Some(inner) = self.swap(ac, &decoded, Location::Header, injections, inside)? {
                    let scheme_len = current.len() - encoded.len();
                    let mut out = current[..scheme_len].to_vec();
                    out.extend_from_slice(BASE64.encode(inner).as_bytes());
                    return Ok(Some(out));
                }
            }
        }
        Ok(swapped)
    }

    /// Swap stubs in a request target's query (`/path?query`): only in the value of a parameter
    /// its secret declares ([`Surfaces::query`], the name compared percent-decoded). A stub in
    /// the path or in a parameter's name refuses. `Ok(None)` when nothing changed.
    pub fn path_and_query(&self, pq: &str, injections: &mut Injections) -> Result<Option<String>, Exfiltration> {
        let Some(ac) = self.set.stub_automaton() else {
            return Ok(None);
        };
        self.tripwire(pq.as_bytes(), Location::Query)?;
        let Some(first) = ac.find_iter(pq.as_bytes()).next() else {
            return Ok(None);
        };
        let (path, query) = match pq.split_once('?') {
            Some((p, q)) => (p, q),
            None => (pq, ""),
        };
        if first.start() < path.len() {
            let id = first.pattern().as_usize();
            return Err(self.refusal(id, Location::Query, self.outside(id)));
        }
        let mut out = String::with_capacity(pq.len() + 64);
        out.push_str(path);
        out.push('?');
        for (i, param) in query.split('&').enumerate() {
            if i > 0 {
                out.push('&');
            }
            let (name, value) = param.split_once('=').unwrap_or((param, ""));
            if let Some(m) = ac.find_iter(name.as_bytes()).next() {
                let id = m.pattern().as_usize();
                return Err(self.refusal(id, Location::Query, self.outside(id)));
            }
            let decoded_name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
            let allowed = |secret: &Secret, _: usize| secret.surfaces.query(&decoded_name);
            out.push_str(name);
            if param.len() > name.len() {
                out.push('=');
            }
            match self.swap(ac, value.as_bytes(), Location::Query, injections, allowed)? {
                // Stubs and values are printable ASCII (checked at load), so this stays valid UTF-8.
                Some(v) => out.push_str(&String::from_utf8_lossy(&v)),
                None => out.push_str(value),
            }
        }
        Ok(Some(out))
    }

    /// A rewriter for the body of a `method` request to `path` (with its `Content-Type`), when
    /// some secret bound to this host declares that body ([`Surfaces::body`]). Stubs anywhere
    /// else in a body toward its bound host pass as they are: a conversation sent to a model
    /// carries the stubs the agent has seen, and the upstream only ever sees a stub.
    pub fn body_rewriter(&self, method: &str, path: &str, content_type: Option<&[u8]>) -> Option<StreamRewriter> {
        let ac = self.set.stub_automaton()?;
        let mut any = false;
        let replacements: Vec<Option<Bytes>> = self
            .set
            .secrets()
            .iter()
            .zip(&self.bound)
            .map(|(s, &bound)| {
                (bound && s.surfaces.body(method, path, content_type)).then(|| {
                    any = true;
                    Bytes::from(s.value.clone())
                })
            })
            .collect();
        any.then(|| StreamRewriter::new(ac.clone(), self.set.stub_bytes().clone(), replacements))
    }

    /// Why the stub of secret `id` may not be where it is: its host, or its place.
    fn outside(&self, id: usize) -> StubRefusal {
        if self.bound[id] {
            StubRefusal::Undeclared
        } else {
            StubRefusal::Unbound
        }
    }

    fn refusal(&self, secret: usize, location: Location, why: StubRefusal) -> Exfiltration {
        Exfiltration {
            secret: self.set.secrets()[secret].name.clone(),
            location,
            why,
        }
    }

    /// Swap every stub in `input` whose secret is bound and `allowed` there (given the match's
    /// offset); any other stub refuses.
    fn swap(
        &self,
        ac: &Finder,
        input: &[u8],
        location: Location,
        injections: &mut Injections,
        allowed: impl Fn(&Secret, usize) -> bool,
    ) -> Result<Option<Vec<u8>>, Exfiltration> {
        let mut out: Option<Vec<u8>> = None;
        let mut last = 0;
        for m in ac.find_iter(input) {
            let id = m.pattern().as_usize();
            if !self.bound[id] {
                return Err(self.refusal(id, location, StubRefusal::Unbound));
            }
            let secret = &self.set.secrets()[id];
            if !allowed(secret, m.start()) {
                return Err(self.refusal(id, location, StubRefusal::Undeclared));
            }
            let buf = out.get_or_insert_with(|| Vec::with_capacity(input.len() + 64));
            buf.extend_from_slice(&input[last..m.start()]);
            buf.extend_from_slice(secret.value.as_bytes());
            last = m.end();
            injections.record(id, location);
        }
        if let Some(buf) = &mut out {
            buf.extend_from_slice(&input[last..]);
        }
        Ok(out)
    }
}

/// The tripwire over a stream (a request body that is not buffered, WebSocket messages from the
/// client): finds a stub of a secret the host is not bound to, as written, base64/JSON-encoded,
/// percent-encoded (up to [`MAX_DECODES`] levels, as [`HostRules::tripwire`] decodes a whole
/// input) or written with JSON string escapes (`\u005f`), across chunk boundaries. It only looks: the caller forwards a chunk once
/// [`StubScanner::push`] has passed it, so a stub is refused before its last byte leaves (its
/// first bytes may have).
#[derive(Debug, Clone)]
pub struct StubScanner {
    /// Which secrets the host is bound to, by index.
    bound: Vec<bool>,
    location: Location,
    /// Bytes of the previous chunks kept, so a pattern across a boundary is found.
    keep: usize,
    tail: Vec<u8>,
    /// The stream percent-decoded once, twice, …: a level starts at the first `%` in the one
    /// before it (until then it equals that one, which is already searched).
    decoded: Vec<DecodedLevel>,
    /// The stream with JSON string escapes undone (`\u005f`, `\/`), from its first `\\`: what a
    /// body read whole gets from parsing its JSON.
    json: Option<JsonLevel>,
}

/// The stream with JSON's escapes (RFC 8259 §7) undone, as far as a stub can hold them: `\uXXXX`
/// below U+0080 becomes its byte and the one-letter escapes theirs; any other escape stays as
/// written.
#[derive(Debug, Clone, Default)]
struct JsonLevel {
    /// An escape cut by the chunk boundary (`\`, `\u`, up to `\uXXX`).
    pending: Vec<u8>,
    tail: Vec<u8>,
}

impl JsonLevel {
    fn decode<'a>(&mut self, input: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        if self.pending.is_empty() && !input.contains(&b'\\') {
            return input.into();
        }
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(input);
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        while i < buf.len() {
            if buf[i] != b'\\' {
                out.push(buf[i]);
                i += 1;
                continue;
            }
            let Some(&next) = buf.get(i + 1) else {
                self.pending = buf[i..].to_vec();
                return out.into();
            };
            let simple = match next {
                b'"' => Some(b'"'),
                b'\\' => Some(b'\\'),
                b'/' => Some(b'/'),
                b'b' => Some(0x08),
                b'f' => Some(0x0c),
                b'n' => Some(b'\n'),
                b'r' => Some(b'\r'),
                b't' => Some(b'\t'),
                _ => None,
            };
            if let Some(b) = simple {
                out.push(b);
                i += 2;
                continue;
            }
            if next == b'u' {
                let hex = &buf[i + 2..buf.len().min(i + 6)];
                if hex.len() < 4 && hex.iter().all(u8::is_ascii_hexdigit) {
                    self.pending = buf[i..].to_vec();
                    return out.into();
                }
                let code = std::str::from_utf8(hex)
                    .ok()
                    .and_then(|h| u32::from_str_radix(h, 16).ok());
                if let Some(c) = code.filter(|c| *c < 0x80 && hex.len() == 4) {
                    out.push(c as u8);
                    i += 6;
                    continue;
                }
            }
            out.push(b'\\');
            i += 1;
        }
        out.into()
    }
}

/// One percent-decoded form of the stream.
#[derive(Debug, Clone, Default)]
struct DecodedLevel {
    /// An escape cut by the chunk boundary (`%`, or `%` and one hex digit), decoded with the
    /// next chunk.
    pending: Vec<u8>,
    /// The decoded bytes kept, as [`StubScanner::tail`].
    tail: Vec<u8>,
}

impl DecodedLevel {
    /// The next chunk of this level from the next chunk of the level before (RFC 3986 §2.1).
    fn decode<'a>(&mut self, input: &'a [u8]) -> std::borrow::Cow<'a, [u8]> {
        if self.pending.is_empty() && !input.contains(&b'%') {
            return input.into();
        }
        let mut buf = std::mem::take(&mut self.pending);
        buf.extend_from_slice(input);
        let n = buf.len();
        let held = if buf.last() == Some(&b'%') {
            1
        } else if n >= 2 && buf[n - 2] == b'%' && buf[n - 1].is_ascii_hexdigit() {
            2
        } else {
            0
        };
        self.pending = buf.split_off(n - held);
        percent_encoding::percent_decode(&buf).collect::<Vec<u8>>().into()
    }
}

impl StubScanner {
    /// Look at the next chunk (of the same stream as the previous ones).
    pub fn push(&mut self, set: &SecretSet, chunk: &[u8]) -> Result<(), Exfiltration> {
        let (bound, keep, location) = (&self.bound, self.keep, self.location);
        let refuse = |id: usize| Exfiltration {
            secret: set.secrets()[id].name.clone(),
            location,
            why: StubRefusal::Unbound,
        };
        // The tail before this chunk starts the next level's, should this chunk start it.
        let mut before = (self.decoded.is_empty() && chunk.contains(&b'%')).then(|| self.tail.clone());
        if self.json.is_none() && chunk.contains(&b'\\') {
            self.json = Some(JsonLevel {
                pending: Vec::new(),
                tail: self.tail.clone(),
            });
        }
        search(set, bound, keep, &mut self.tail, chunk).map_err(refuse)?;
        if let Some(json) = &mut self.json {
            let out = json.decode(chunk);
            search(set, bound, keep, &mut json.tail, &out).map_err(refuse)?;
        }
        let mut input = std::borrow::Cow::Borrowed(chunk);
        for depth in 0..MAX_DECODES {
            if depth == self.decoded.len() {
                let Some(tail) = before.take() else { break };
                self.decoded.push(DecodedLevel {
                    pending: Vec::new(),
                    tail,
                });
            }
            let last = depth + 1 == self.decoded.len();
            let level = &mut self.decoded[depth];
            // Borrowed: no escape in this chunk, the level's chunk is the one before's.
            let changed = match level.decode(&input) {
                std::borrow::Cow::Owned(v) => Some(v),
                std::borrow::Cow::Borrowed(_) => None,
            };
            let out = changed.as_deref().unwrap_or(&input);
            before = (last && out.contains(&b'%')).then(|| level.tail.clone());
            search(set, bound, keep, &mut level.tail, out).map_err(refuse)?;
            if let Some(v) = changed {
                input = v.into();
            }
        }
        Ok(())
    }
}

/// Search `tail` and `chunk` for a stub (or an encoded form of one) of a secret not `bound`, and
/// keep the last `keep` bytes in `tail`; `Err` names the secret, by index.
fn search(set: &SecretSet, bound: &[bool], keep: usize, tail: &mut Vec<u8>, chunk: &[u8]) -> Result<(), usize> {
    let window: std::borrow::Cow<'_, [u8]> = if tail.is_empty() {
        chunk.into()
    } else {
        let mut w = std::mem::take(tail);
        w.extend_from_slice(chunk);
        w.into()
    };
    if let Some(ac) = set.stub_automaton() {
        if let Some(id) = ac
            .find_iter(&window)
            .map(|m| m.pattern().as_usize())
            .find(|&id| !bound[id])
        {
            return Err(id);
        }
    }
    if let Some((ac, ids)) = set.encoded_stub_automaton() {
        if let Some(id) = ac
            .find_iter(&window)
            .map(|m| ids[m.pattern().as_usize()])
            .find(|&id| !bound[id])
        {
            return Err(id);
        }
    }
    let from = window.len().saturating_sub(keep);
    *tail = window[from..].to_vec();
    Ok(())
}

/// An `Authorization` value's scheme and the offset where its credentials start (RFC 9110
/// §11.6.2: `scheme SP credentials`), when it has both.
fn auth_scheme(value: &[u8]) -> Option<(&[u8], usize)> {
    let start = value.len() - value.trim_ascii_start().len();
    let rest = &value[start..];
    let end = rest.iter().position(|b| *b == b' ')?;
    let creds = start + end + rest[end..].iter().take_while(|b| **b == b' ').count();
    (end > 0 && creds < value.len()).then_some((&rest[..end], creds))
}

fn is_credential_scheme(scheme: &[u8]) -> bool {
    CREDENTIAL_SCHEMES
        .iter()
        .any(|s| s.as_bytes().eq_ignore_ascii_case(scheme))
}

fn contains_ignore_ascii_case(haystack: &[u8], needle: &[u8]) -> bool {
    needle.len() <= haystack.len() && haystack.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
}

/// The base64 part of a `Basic` credentials header value, if it is one.
fn basic_credentials(value: &[u8]) -> Option<&[u8]> {
    let rest = value.trim_ascii_start();
    if rest.len() > 6 && rest[..5].eq_ignore_ascii_case(b"basic") && rest[5].is_ascii_whitespace() {
        let offset = value.len() - rest.len() + 6;
        Some(&value[offset..])
    } else {
        None
    }
}

/// Replace real values (in any of their [`crate::secrets::value_forms`]) by their stubs in one
/// response header value; `None` when unchanged.
pub(crate) fn redact_value(set: &SecretSet, value: &[u8]) -> Option<Vec<u8>> {
    let (ac, _) = set.value_automaton()?;
    let (_, replacements) = set.redaction();
    let mut out: Option<Vec<u8>> = None;
    let mut last = 0;
    for m in ac.find_iter(value) {
        let buf = out.get_or_insert_with(|| Vec::with_capacity(value.len()));
        buf.extend_from_slice(&value[last..m.start()]);
        buf.extend_from_slice(replacements[m.pattern().as_usize()].as_deref().unwrap_or_default());
        last = m.end();
    }
    if let Some(buf) = &mut out {
        buf.extend_from_slice(&value[last..]);
    }
    out
}

/// Redact every value of a header (or trailer) map in place. A value that cannot be written
/// redacted is not written at all (empty), never left holding the real value.
pub(crate) fn redact_headers(set: &SecretSet, headers: &mut http::HeaderMap) {
    for (_, value) in headers.iter_mut() {
        if let Some(redacted) = redact_value(set, value.as_bytes()) {
            *value = http::HeaderValue::from_bytes(&redacted).unwrap_or_else(|_| http::HeaderValue::from_static(""));
        }
    }
}

/// A streaming redactor for a response body (real values → stubs), if any value is redactable.
pub fn redactor(set: &SecretSet) -> Option<StreamRewriter> {
    let (ac, _) = set.value_automaton()?;
    let (patterns, replacements) = set.redaction();
    Some(StreamRewriter::new(ac.clone(), patterns.clone(), replacements.clone()))
}

/// Streaming multi-pattern replacement with the output of a one-shot leftmost-longest replacement.
///
/// Feed chunks with [`StreamRewriter::push`], then call [`StreamRewriter::finish`]. Only the
/// longest suffix of the data seen that is a proper prefix of some pattern is held back, so data
/// that cannot be part of a match (an SSE event's trailing blank line, say) is released at once.
#[derive(Debug)]
pub struct StreamRewriter {
    ac: Arc<Finder>,
    /// Pattern bytes by pattern id (for the hold-back check).
    patterns: Arc<[Bytes]>,
    /// Replacement by pattern id; `None` leaves that pattern's matches as they are.
    replacements: Arc<[Option<Bytes>]>,
    max_len: usize,
    /// The bytes some pattern starts with, as a 256-bit set: the hold-back check looks at a
    /// suffix only when its first byte is one.
    first_bytes: [u64; 4],
    carry: BytesMut,
    /// Number of replacements made, by pattern id.
    hits: Vec<u64>,
}

impl StreamRewriter {
    /// `patterns[i]` must be the `i`th pattern of `ac`.
    pub fn new(
        ac: impl Into<Arc<Finder>>,
        patterns: impl Into<Arc<[Bytes]>>,
        replacements: impl Into<Arc<[Option<Bytes>]>>,
    ) -> Self {
        let (patterns, replacements) = (patterns.into(), replacements.into());
        let max_len = patterns.iter().map(Bytes::len).max().unwrap_or(0);
        let mut first_bytes = [0u64; 4];
        for b in patterns.iter().filter_map(|p| p.first()) {
            first_bytes[usize::from(b >> 6)] |= 1 << (b & 63);
        }
        let hits = vec![0; patterns.len()];
        Self {
            ac: ac.into(),
            patterns,
            replacements,
            max_len,
            first_bytes,
            carry: BytesMut::new(),
            hits,
        }
    }

    /// Replacements made so far, by pattern id.
    pub fn hits(&self) -> &[u64] {
        &self.hits
    }

    /// Bytes held back waiting for the next chunk.
    pub fn pending(&self) -> usize {
        self.carry.len()
    }

    /// Process one chunk; returns what can be released now (possibly empty).
    pub fn push(&mut self, chunk: Bytes) -> Bytes {
        let buf = if self.carry.is_empty() {
            chunk
        } else {
            self.carry.extend_from_slice(&chunk);
            self.carry.split().freeze()
        };
        let safe = buf.len() - self.holdback(&buf);
        self.process(buf, safe)
    }

    /// End of stream: release everything held back.
    pub fn finish(&mut self) -> Bytes {
        let buf = self.carry.split().freeze();
        let len = buf.len();
        self.process(buf, len)
    }

    /// Replace committed matches (those starting before `safe`) and keep the rest as carry.
    fn process(&mut self, buf: Bytes, safe: usize) -> Bytes {
        let mut out: Option<BytesMut> = None;
        let mut last = 0;
        let mut committed = safe;
        for m in self.ac.find_iter(&buf[..]) {
            if m.start() >= safe {
                break;
            }
            committed = committed.max(m.end());
            let id = m.pattern().as_usize();
            if let Some(rep) = &self.replacements[id] {
                let o = out.get_or_insert_with(|| BytesMut::with_capacity(buf.len() + 64));
                o.extend_from_slice(&buf[last..m.start()]);
                o.extend_from_slice(rep);
                last = m.end();
                self.hits[id] += 1;
            }
        }
        if committed < buf.len() {
            self.carry.extend_from_slice(&buf[committed..]);
        }
        match out {
            None => buf.slice(..committed),
            Some(mut o) => {
                o.extend_from_slice(&buf[last..committed]);
                o.freeze()
            }
        }
    }

    /// Length of the longest suffix of `buf` that is a proper prefix of some pattern.
    fn holdback(&self, buf: &[u8]) -> usize {
        let upper = self.max_len.saturating_sub(1).min(buf.len());
        (1..=upper)
            .rev()
            .find(|&k| {
                let suffix = &buf[buf.len() - k..];
                // Most suffixes start with no pattern's first byte: one bit test, no pattern read.
                let b = suffix[0];
                self.first_bytes[usize::from(b >> 6)] & (1 << (b & 63)) != 0
                    && self
                        .patterns
                        .iter()
                        .any(|p| p.len() > k && p[0] == b && p.starts_with(suffix))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BindingSet;
    use crate::config::{Secret, Surfaces};
    use aho_corasick::{AhoCorasickBuilder, MatchKind};
    use proptest::prelude::*;

    fn secret(name: &str, stub: &str, value: &str, hosts: &[&str], surfaces: &[&str]) -> Secret {
        Secret {
            name: name.into(),
            stub: stub.into(),
            value: value.into(),
            hosts: BindingSet(hosts.iter().map(|h| h.parse().expect("binding")).collect()),
            surfaces: Surfaces(surfaces.iter().map(|s| s.parse().expect("surface")).collect()),
        }
    }

    fn set() -> SecretSet {
        SecretSet::new(vec![
            secret(
                "ANTHROPIC_API_KEY",
                "sk-ant-STUB-aaaa",
                "sk-ant-REAL-1111",
                &["api.anthropic.com"],
                &["header"],
            ),
            secret(
                "GITHUB_TOKEN",
                "ghp_STUBbbbbbbbb",
                "ghp_REAL22222222",
                &["github.com", "api.github.com"],
                &[
                    "header",
                    "header:x-probe",
                    "query",
                    "body:POST /login/oauth/access_token",
                ],
            ),
        ])
    }

    fn host(h: &str) -> TargetHost {
        TargetHost::parse(h)
    }

    #[test]
    fn header_stub_is_swapped_for_bound_host() {
        let set = set();
        let rules = HostRules::new(&set, &host("api.anthropic.com"), 443);
        let mut inj = Injections::default();
        let out = rules
            .header_value("authorization", b"Bearer sk-ant-STUB-aaaa", &mut inj)
            .expect("ok")
            .expect("changed");
        assert_eq!(out, b"Bearer sk-ant-REAL-1111");
        assert_eq!(inj.0, vec![(0, Location::Header)]);
    }

    #[test]
    fn stub_repeated_in_one_value_is_swapped_everywhere() {
        let set = set();
        let rules = HostRules::new(&set, &host("api.anthropic.com"), 443);
        let mut inj = Injections::default();
        let out = rules
            .header_value("x-api-key", b"sk-ant-STUB-aaaa,sk-ant-STUB-aaaa", &mut inj)
            .expect("ok")
            .expect("changed");
        assert_eq!(out, b"sk-ant-REAL-1111,sk-ant-REAL-1111");
        assert_eq!(inj.0.len(), 1);
    }

    #[test]
    fn stub_for_unbound_host_is_exfiltration() {
        let set = set();
        let rules = HostRules::new(&set, &host("api.github.com"), 443);
        let err = rules
            .header_value("x-api-key", b"x sk-ant-STUB-aaaa", &mut Injections::default())
            .expect_err("blocked");
        assert_eq!(
            err,
            Exfiltration {
                secret: "ANTHROPIC_API_KEY".into(),
                location: Location::Header,
                why: StubRefusal::Unbound,
            }
        );
    }

    #[test]
    fn header_without_stub_is_untouched() {
        let set = set();
        let rules = HostRules::new(&set, &host("api.anthropic.com"), 443);
        assert_eq!(
            rules.header_value("x-api-key", b"application/json", &mut Injections::default()),
            Ok(None)
        );
    }

    #[test]
    fn basic_auth_is_decoded_swapped_and_reencoded() {
        let set = set();
        let rules = HostRules::new(&set, &host("github.com"), 443);
        let header = format!("Basic {}", BASE64.encode("x-access-token:ghp_STUBbbbbbbbb"));
        let mut inj = Injections::default();
        let out = rules
            .header_value("authorization", header.as_bytes(), &mut inj)
            .expect("ok")
            .expect("changed");
        assert_eq!(
            out,
            format!("Basic {}", BASE64.encode("x-access-token:ghp_REAL22222222")).into_bytes()
        );
        assert_eq!(inj.0, vec![(1, Location::Header)]);
    }

    #[test]
    fn basic_auth_with_unbound_stub_is_exfiltration() {
        let set = set();
        let rules = HostRules::new(&set, &host("evil.example"), 443);
        let header = format!("basic {}", BASE64.encode("x:ghp_STUBbbbbbbbb"));
        assert!(rules
            .header_value("authorization", header.as_bytes(), &mut Injections::default())
            .is_err());
    }

    #[test]
    fn basic_auth_that_is_not_base64_is_left_alone() {
        let set = set();
        let rules = HostRules::new(&set, &host("github.com"), 443);
        assert_eq!(
            rules.header_value("authorization", b"Basic !!!not-base64", &mut Injections::default()),
            Ok(None)
        );
    }

    #[test]
    fn query_is_swapped_only_in_a_declared_parameter() {
        let set = set();
        let gh = HostRules::new(&set, &host("api.github.com"), 443);
        let mut inj = Injections::default();
        let out = gh
            .path_and_query("/repos?access_token=ghp_STUBbbbbbbbb&x=1&flag", &mut inj)
            .expect("ok");
        assert_eq!(out.as_deref(), Some("/repos?access_token=ghp_REAL22222222&x=1&flag"));
        assert_eq!(inj.0, vec![(1, Location::Query)]);
        // The name compared decoded: `access%5Ftoken` is `access_token`.
        let out = gh
            .path_and_query("/r?access%5Ftoken=ghp_STUBbbbbbbbb", &mut Injections::default())
            .expect("ok");
        assert_eq!(out.as_deref(), Some("/r?access%5Ftoken=ghp_REAL22222222"));
        assert_eq!(gh.path_and_query("/r?q=1", &mut Injections::default()), Ok(None));

        // W01: a parameter, a name or a path that is not a surface refuses, bound or not.
        for pq in [
            "/search?q=ghp_STUBbbbbbbbb",
            "/r?ghp_STUBbbbbbbbb=1",
            "/r?ghp_STUBbbbbbbbb",
            "/repos/ghp_STUBbbbbbbbb?x=1",
        ] {
            let err = gh.path_and_query(pq, &mut Injections::default()).expect_err(pq);
            assert_eq!(
                (err.secret.as_str(), err.why),
                ("GITHUB_TOKEN", StubRefusal::Undeclared),
                "{pq}"
            );
        }
        let an = HostRules::new(&set, &host("api.anthropic.com"), 443);
        let err = an
            .path_and_query("/v1?key=sk-ant-STUB-aaaa", &mut Injections::default())
            .expect_err("a header-only secret in the query");
        assert_eq!(err.why, StubRefusal::Undeclared);
    }

    /// W01: toward its bound host, a stub is swapped only in a declared header; anywhere else in
    /// the head it is refused, so a host that reflects the field never sees the real value.
    #[test]
    fn a_header_is_swapped_only_where_declared() {
        let set = set();
        let gh = HostRules::new(&set, &host("api.github.com"), 443);
        let swapped = |name: &str, value: &str| gh.header_value(name, value.as_bytes(), &mut Injections::default());
        for (name, value, want) in [
            ("authorization", "token ghp_STUBbbbbbbbb", "token ghp_REAL22222222"),
            ("authorization", "Bearer ghp_STUBbbbbbbbb", "Bearer ghp_REAL22222222"),
            ("authorization", "BEARER  ghp_STUBbbbbbbbb", "BEARER  ghp_REAL22222222"),
            ("private-token", "ghp_STUBbbbbbbbb", "ghp_REAL22222222"),
            ("x-probe", "named ghp_STUBbbbbbbbb", "named ghp_REAL22222222"),
        ] {
            assert_eq!(
                swapped(name, value),
                Ok(Some(want.as_bytes().to_vec())),
                "{name}: {value}"
            );
        }
        for (name, value) in [
            ("x-other", "ghp_STUBbbbbbbbb"),
            ("cookie", "session=ghp_STUBbbbbbbbb"),
            ("user-agent", "ghp_STUBbbbbbbbb"),
            ("authorization", "Digest ghp_STUBbbbbbbbb"),
            ("authorization", "ghp_STUBbbbbbbbb"),
            ("authorization", "ghp_STUBbbbbbbbb x"),
        ] {
            let err = swapped(name, value).expect_err(value);
            assert_eq!(
                (err.secret.as_str(), err.why, err.location),
                ("GITHUB_TOKEN", StubRefusal::Undeclared, Location::Header),
                "{name}: {value}"
            );
        }
        let basic = format!("Basic {}", BASE64.encode("u:ghp_STUBbbbbbbbb"));
        assert!(swapped("x-other", &basic).is_err(), "inside Basic outside a surface");
        // A stub in a header name refuses, bound or not.
        let err = gh.header_name("x-ghp_stubbbbbbbbb").expect_err("name");
        assert_eq!(err.why, StubRefusal::Undeclared);
    }

    #[test]
    fn stub_in_path_to_unbound_host_is_exfiltration() {
        let set = set();
        let rules = HostRules::new(&set, &host("evil.example"), 443);
        assert!(rules
            .path_and_query("/leak/ghp_STUBbbbbbbbb", &mut Injections::default())
            .is_err());
    }

    /// W09: an encoded stub toward a host its secret is not bound to is refused like the stub.
    #[test]
    fn encoded_stubs_to_an_unbound_host_are_exfiltration() {
        use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
        let set = set();
        let rules = HostRules::new(&set, &host("evil.example"), 443);
        let stub = "sk-ant-STUB-aaaa";
        let every_byte: String = stub.bytes().map(|b| format!("%{b:02x}")).collect();
        let twice: String = every_byte.replace('%', "%25");
        for value in [
            STANDARD.encode(stub),
            URL_SAFE_NO_PAD.encode(format!("x{stub}")),
            format!("prefix.{}.suffix", STANDARD.encode(format!("ab{stub}cd"))),
            every_byte.clone(),
            twice.clone(),
            STANDARD.encode(format!("user:{stub}")),
        ] {
            let err = rules
                .header_value("x-api-key", value.as_bytes(), &mut Injections::default())
                .expect_err(&value);
            assert_eq!(err.secret, "ANTHROPIC_API_KEY", "{value}");
        }
        for pq in [
            format!("/x/{every_byte}"),
            format!("/x?q={twice}"),
            format!("/x?{}=1", STANDARD.encode(stub)),
        ] {
            assert!(rules.path_and_query(&pq, &mut Injections::default()).is_err(), "{pq}");
        }
        // Header names: the stub in any case.
        assert!(rules.header_name("x-sk-ant-stub-aaaa").is_err());
        assert!(rules.header_name("x-api-key").is_ok());
        // Toward its bound host an encoded stub is neither swapped nor refused.
        let bound = HostRules::new(&set, &host("api.anthropic.com"), 443);
        let encoded = STANDARD.encode(stub);
        assert_eq!(
            bound.header_value("x-api-key", encoded.as_bytes(), &mut Injections::default()),
            Ok(None)
        );
        // Ordinary base64 and percent-encoding pass.
        for value in [STANDARD.encode("an ordinary credential"), "%2Fhome%2Fuser".to_owned()] {
            assert!(
                rules
                    .header_value("x-api-key", value.as_bytes(), &mut Injections::default())
                    .is_ok(),
                "{value}"
            );
        }
    }

    #[test]
    fn body_rewriter_exists_only_for_a_declared_body() {
        let set = set();
        let route = ("POST", "/login/oauth/access_token", Some(&b"application/json"[..]));
        assert!(HostRules::new(&set, &host("api.anthropic.com"), 443)
            .body_rewriter(route.0, route.1, route.2)
            .is_none());
        let gh = HostRules::new(&set, &host("github.com"), 443);
        assert!(
            gh.body_rewriter("POST", "/gists", route.2).is_none(),
            "not the declared route"
        );
        assert!(
            gh.body_rewriter("GET", route.1, route.2).is_none(),
            "not the declared method"
        );
        let mut rw = gh.body_rewriter(route.0, route.1, route.2).expect("rewriter");
        let mut out = rw.push(Bytes::from_static(b"{\"t\":\"ghp_STUB"));
        out = [
            out,
            rw.push(Bytes::from_static(b"bbbbbbbb\", \"a\": \"sk-ant-STUB-aaaa\"}")),
        ]
        .concat()
        .into();
        out = [out, rw.finish()].concat().into();
        assert_eq!(&out[..], b"{\"t\":\"ghp_REAL22222222\", \"a\": \"sk-ant-STUB-aaaa\"}");
    }

    #[test]
    fn redaction_replaces_values_with_stubs() {
        let set = set();
        assert_eq!(
            redact_value(&set, b"echo sk-ant-REAL-1111").as_deref(),
            Some(&b"echo sk-ant-STUB-aaaa"[..])
        );
        let mut r = redactor(&set).expect("redactor");
        let a = r.push(Bytes::from_static(b"data: ghp_REAL2222"));
        assert_eq!(&a[..], b"data: ", "only the live partial match is held back");
        let b = r.push(Bytes::from_static(b"2222\n\n"));
        assert_eq!(&b[..], b"ghp_STUBbbbbbbbb\n\n", "a complete event is released at once");
        assert!(r.finish().is_empty());
    }

    #[test]
    fn sse_event_without_partial_match_is_not_delayed() {
        let set = set();
        let mut r = redactor(&set).expect("redactor");
        let event = Bytes::from_static(b"event: ping\ndata: {}\n\n");
        assert_eq!(r.push(event.clone()), event);
        assert_eq!(r.pending(), 0);
    }

    fn one_shot(patterns: &[Vec<u8>], replace: &[bool], text: &[u8]) -> Vec<u8> {
        let ac = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(patterns)
            .expect("ac");
        let mut out = Vec::new();
        let mut last = 0;
        for m in ac.find_iter(text) {
            if replace[m.pattern().as_usize()] {
                out.extend_from_slice(&text[last..m.start()]);
                out.extend_from_slice(format!("<{}>", m.pattern().as_usize()).as_bytes());
                last = m.end();
            }
        }
        out.extend_from_slice(&text[last..]);
        out
    }

    /// Basic credentials are read as the host reads them: a stub percent-encoded inside the
    /// base64 toward a host it is not bound to refuses (found by the header_value fuzz target).
    #[test]
    fn a_percent_encoded_stub_inside_basic_credentials_refuses() {
        use base64::Engine as _;
        let set = set();
        let rules = HostRules::new(&set, &host("api.anthropic.com"), 443);
        let creds = base64::engine::general_purpose::STANDARD.encode("user:%67hp_STUBbbbbbbbb");
        let e = rules
            .header_value(
                "authorization",
                format!("Basic {creds}").as_bytes(),
                &mut Injections::default(),
            )
            .expect_err("refused");
        assert_eq!((e.secret.as_str(), e.why), ("GITHUB_TOKEN", StubRefusal::Unbound));
    }

    /// A stream toward a host the stub isn't bound to, fed `chunk` bytes at a time.
    fn scan_in_chunks(stream: &[u8], chunk: usize) -> Result<(), Exfiltration> {
        let set = set();
        let rules = HostRules::new(&set, &host("attacker.example"), 443);
        let mut scanner = rules.stub_scanner(Location::Body).expect("unbound secrets");
        stream.chunks(chunk).try_for_each(|c| scanner.push(&set, c))
    }

    /// A stub written with JSON string escapes in a streamed body is refused at any chunking, as
    /// in a JSON body read whole (found attacking compressed and large bodies).
    #[test]
    fn streamed_json_escaped_stubs_are_refused_at_any_chunking() {
        let stream = br#"{"a":"ghp\u005fSTUB\u0062bbbbbbbb","b":"\\x"}"#.to_vec();
        let whole = HostRules::new(&set(), &host("attacker.example"), 443).body(&stream);
        assert!(whole.is_err(), "the whole body is refused");
        for chunk in 1..=stream.len() {
            let e = scan_in_chunks(&stream, chunk).expect_err("refused");
            assert_eq!(e.secret, "GITHUB_TOKEN", "chunks of {chunk}");
        }
        let clean = br#"{"a":"\u00e9\u12\\u005f \/ \n","b":"\"}"#.to_vec();
        for chunk in 1..=clean.len() {
            assert!(scan_in_chunks(&clean, chunk).is_ok(), "chunks of {chunk}");
        }
    }

    /// Percent-encoded stubs in a streamed body are refused as in a body read whole: once or
    /// twice encoded (`%25`), in any case, with an escape cut by a chunk boundary.
    #[test]
    fn streamed_percent_encoded_stubs_are_refused_at_any_chunking() {
        let once = b"q=%73k-ant-STUB-aaaa&x=1".to_vec();
        let twice = b"q=%2573k%252Dant-STUB-aaaa".to_vec();
        let every = b"q=%67%68%70%5F%53%54%55%42%62%62%62%62%62%62%62%62".to_vec();
        for stream in [&once, &twice, &every] {
            let whole = HostRules::new(&set(), &host("attacker.example"), 443).tripwire(stream, Location::Body);
            assert!(whole.is_err(), "{}", String::from_utf8_lossy(stream));
            for chunk in 1..=stream.len() {
                let e = scan_in_chunks(stream, chunk).expect_err("refused");
                assert_eq!(
                    e.secret,
                    whole.as_ref().expect_err("refused whole").secret,
                    "chunks of {chunk}"
                );
            }
        }
        // Escapes that decode to nothing of interest pass, at any chunking.
        let clean = b"a=%41%42%2%zz%%25&b=%".to_vec();
        for chunk in 1..=clean.len() {
            assert!(scan_in_chunks(&clean, chunk).is_ok(), "chunks of {chunk}");
        }
    }

    proptest! {
        #[test]
        fn any_chunking_gives_the_one_shot_output(
            patterns in prop::collection::vec(prop::collection::vec(b'a'..=b'd', 1..6), 1..5),
            replace in prop::collection::vec(any::<bool>(), 5),
            text in prop::collection::vec(b'a'..=b'e', 0..200),
            cuts in prop::collection::vec(0usize..200, 0..12),
        ) {
            let mut patterns = patterns;
            patterns.sort();
            patterns.dedup();
            let replace = &replace[..patterns.len()];
            // The production searcher (Teddy where available) against the plain automaton in `one_shot`.
            let ac = Finder::new(&patterns).expect("finder");
            let reps: Vec<Option<Bytes>> = (0..patterns.len())
                .map(|i| replace[i].then(|| Bytes::from(format!("<{i}>"))))
                .collect();
            let mut rw = StreamRewriter::new(ac, patterns.iter().map(|p| Bytes::from(p.clone())).collect::<Vec<_>>(), reps);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
            cuts.sort();
            let mut out = Vec::new();
            let mut prev = 0;
            for c in cuts.into_iter().chain([text.len()]) {
                out.extend_from_slice(&rw.push(Bytes::copy_from_slice(&text[prev..c])));
                prev = c;
            }
            out.extend_from_slice(&rw.finish());
            prop_assert_eq!(out, one_shot(&patterns, replace, &text));
        }

        /// The streamed scanner refuses at least what the tripwire over the whole input does
        /// (percent-decoded up to MAX_DECODES levels), and any chunking gives the one-push answer.
        #[test]
        fn the_streamed_tripwire_covers_the_whole_one(
            pieces in prop::collection::vec(prop::sample::select(vec![
                "%", "%2", "%25", "%73", "k-ant", "-STUB", "-aaaa", "s", "%6B", "%2D", "a", "x", "%4", "1",
            ]), 0..24),
            chunk in 1usize..12,
        ) {
            let stream = pieces.concat().into_bytes();
            let set = set();
            let rules = HostRules::new(&set, &host("attacker.example"), 443);
            let mut one = rules.stub_scanner(Location::Body).expect("unbound secrets");
            let whole = one.push(&set, &stream).is_err();
            prop_assert_eq!(scan_in_chunks(&stream, chunk).is_err(), whole);
            if rules.tripwire(&stream, Location::Body).is_err() {
                prop_assert!(whole, "{}", String::from_utf8_lossy(&stream));
            }
        }
    }
}
