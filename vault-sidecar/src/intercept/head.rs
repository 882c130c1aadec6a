//! The pure head phases of an intercepted request: whether its authority names the CONNECT
//! target, the request head rewritten for the upstream (stubs swapped, hop-by-hop fields out,
//! codings the sidecar can decode), and the response head redacted for the client. No I/O.

use http::header::{self, HeaderValue};
use http::{request, response, Method, StatusCode, Uri, Version};

use crate::config::TargetHost;
use crate::connect::Target;
use crate::decode::{self, Coding};
use crate::headers::strip_hop_by_hop;
use crate::refusal::{BlockReason, ErrorKind, Refusal};
use crate::rewrite::{self, Exfiltration, HostRules, Injections, StubRefusal};
use crate::secrets::SecretSet;

/// Whether a request's authority (h2 `:authority`, else `Host`) names the CONNECT target.
pub(crate) fn authority_matches(parts: &request::Parts, target: &Target) -> bool {
    // The common case first, without parsing: `Host: name:port` exactly as the CONNECT target.
    if parts.uri.authority().is_none() {
        if let (Some(host), TargetHost::Name(name)) = (parts.headers.get(header::HOST), &target.host) {
            let named = host.to_str().ok().is_some_and(|h| {
                h.rsplit_once(':').is_some_and(|(h, _)| h.eq_ignore_ascii_case(name)) && port_names(h, target.port)
            });
            if named {
                return true;
            }
        }
    }
    let from_host;
    let authority = match parts.uri.authority() {
        Some(a) => a,
        None => match parts
            .headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.parse::<http::uri::Authority>().ok())
        {
            Some(a) => {
                from_host = a;
                &from_host
            }
            // HTTP/1.0 clients may omit Host; the CONNECT target then stands.
            None => return parts.version < Version::HTTP_11,
        },
    };
    port_names(authority.as_str(), target.port) && host_matches(authority.host(), &target.host)
}

/// An authority's port (RFC 3986 §3.2.3) is absent, empty (the scheme's default) or `port`. A
/// port that is not a number (`host:-443`) names nothing: `Authority::port_u16` would read it
/// as absent.
fn port_names(authority: &str, port: u16) -> bool {
    if authority.ends_with(']') {
        return true; // `[v6]` without a port
    }
    match authority.rsplit_once(':') {
        None | Some((_, "")) => true,
        Some((_, p)) => p.parse::<u16>().is_ok_and(|p| p == port),
    }
}

/// `host` (as written in a request) names `target`. The common case, the name exactly as the
/// CONNECT target had it, is a case-insensitive comparison; anything else is parsed and normalized.
pub(crate) fn host_matches(host: &str, target: &TargetHost) -> bool {
    match target {
        TargetHost::Name(name) if host.eq_ignore_ascii_case(name) => true,
        _ => TargetHost::parse(host) == *target,
    }
}

/// The refusal for a stub sent toward a host its secret is not bound to, or outside its
/// secret's credential surfaces.
pub(crate) fn exfiltration(ex: Exfiltration, target: &Target) -> Refusal {
    let reason = match ex.why {
        StubRefusal::Unbound => {
            tracing::warn!(host = %target.host, secret = %ex.secret, location = ex.location.as_str(), "stub sent to a host its secret is not bound to; refused");
            BlockReason::StubExfiltration
        }
        StubRefusal::Undeclared => {
            tracing::warn!(host = %target.host, secret = %ex.secret, location = ex.location.as_str(), "stub sent outside its secret's credential surfaces; refused");
            BlockReason::StubOutsideSurface
        }
    };
    Refusal::Blocked {
        reason,
        host: target.host.to_string(),
        secret: Some((ex.secret, ex.location.as_str())),
        detail: None,
    }
}

/// Rewrite the request head for the upstream, in place: the request target's query swapped (a
/// foreign stub in the path refuses), an absolute `https` URI toward `authority`, hop-by-hop
/// fields out (`Upgrade` kept for an upgrade), `Host` and `Expect` out (our own server side
/// answered `100-continue`, RFC 9110 §10.1.1), every header value swapped. When the sidecar
/// redacts (`redacts`), `Accept-Encoding` offers only codings it decodes; a request that carried a
/// real value loses `Range`/`If-Range`, so a reflected value never comes back in two halves.
pub(crate) fn rewrite_request(
    parts: &mut request::Parts,
    rules: &HostRules<'_>,
    target: &Target,
    authority: Option<&http::uri::Authority>,
    upgrade: bool,
    injections: &mut Injections,
) -> Result<(), Refusal> {
    let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let swapped = rules
        .path_and_query(pq, injections)
        .map_err(|ex| exfiltration(ex, target))?;
    let pq = match swapped {
        Some(s) => http::uri::PathAndQuery::try_from(s),
        None => http::uri::PathAndQuery::try_from(pq),
    };
    let uri = match (authority, pq) {
        (Some(authority), Ok(pq)) => {
            let mut uri = http::uri::Parts::default();
            uri.scheme = Some(http::uri::Scheme::HTTPS);
            uri.authority = Some(authority.clone());
            uri.path_and_query = Some(pq);
            Uri::from_parts(uri).ok()
        }
        _ => None,
    };
    parts.uri = uri.ok_or_else(|| Refusal::bad_request("the request target is not a valid URI"))?;
    parts.version = Version::HTTP_11;

    check_transfer_codings(&parts.headers, target)?;
    strip_hop_by_hop(&mut parts.headers, upgrade);
    parts.headers.remove(header::HOST);
    parts.headers.remove(header::EXPECT);
    for (name, value) in parts.headers.iter_mut() {
        rules
            .header_name(name.as_str())
            .map_err(|ex| exfiltration(ex, target))?;
        if let Some(swapped) = rules
            .header_value(name.as_str(), value.as_bytes(), injections)
            .map_err(|ex| exfiltration(ex, target))?
        {
            *value = HeaderValue::from_bytes(&swapped).map_err(|_| {
                tracing::error!(header = %name, "a secret value is not a valid header value");
                Refusal::failed(
                    ErrorKind::InvalidSecretValue,
                    &target.host,
                    "a secret's value cannot be sent in a header",
                )
            })?;
        }
    }

    if rules.set().value_automaton().is_some() {
        match parts.headers.get(header::ACCEPT_ENCODING).map(decode::offer) {
            Some(Some(offered)) => {
                parts.headers.insert(header::ACCEPT_ENCODING, offered);
            }
            Some(None) => {
                parts.headers.remove(header::ACCEPT_ENCODING);
            }
            None => {}
        }
    }
    if upgrade && rules.set().value_automaton().is_some() {
        // No WebSocket extension: a compressed frame would hide a reflected value (W04).
        parts.headers.remove(header::SEC_WEBSOCKET_EXTENSIONS);
    }
    if !injections.is_empty() {
        parts.headers.remove(header::RANGE);
        parts.headers.remove(header::IF_RANGE);
    }
    Ok(())
}

/// The tripwire over a cleartext request's head (`rules` from [`HostRules::cleartext`]): a stub
/// in the path, the query, a header name or a header value refuses.
pub(crate) fn tripwire_cleartext(
    parts: &request::Parts,
    rules: &HostRules<'_>,
    target: &Target,
) -> Result<(), Refusal> {
    let mut none = Injections::default();
    let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    rules
        .path_and_query(pq, &mut none)
        .map_err(|ex| exfiltration(ex, target))?;
    for (name, value) in &parts.headers {
        rules
            .header_name(name.as_str())
            .map_err(|ex| exfiltration(ex, target))?;
        rules
            .header_value(name.as_str(), value.as_bytes(), &mut none)
            .map_err(|ex| exfiltration(ex, target))?;
    }
    Ok(())
}

/// Whether the request body is identity-coded (the only coding whose stubs are swapped): every
/// `Content-Encoding` field, if any, says only `identity`.
pub(crate) fn identity_body(parts: &request::Parts) -> bool {
    decode::content_codings(&parts.headers).is_ok_and(|c| c.is_empty())
}

/// Only `chunked` is relayed as a transfer coding (RFC 9112 §6.1: a server answers `501` to one
/// it does not understand). hyper undoes `chunked` and the field is hop-by-hop, so any other
/// coding (`gzip, chunked`) would reach the upstream undone and unread by the tripwire.
pub(crate) fn check_transfer_codings(headers: &http::HeaderMap, target: &Target) -> Result<(), Refusal> {
    for value in headers.get_all(header::TRANSFER_ENCODING) {
        let text = String::from_utf8_lossy(value.as_bytes());
        if let Some(other) = text
            .split(',')
            .map(str::trim)
            .find(|c| !c.is_empty() && !c.eq_ignore_ascii_case("chunked"))
        {
            return Err(Refusal::failed(
                ErrorKind::UnsupportedTransferCoding,
                &target.host,
                format!("the transfer coding `{other}` is not relayed: only chunked (RFC 9112 §6.1)"),
            ));
        }
    }
    Ok(())
}

/// Whether a response to `method` with this status has no body (RFC 9110 §6.4.1).
pub(crate) fn bodyless(method: &Method, status: StatusCode) -> bool {
    method == Method::HEAD || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED
}

/// Redact the response head for the client, in place: hop-by-hop fields out, every header value
/// with a real value (in any form the redactor knows) replaced by its stub.
pub(crate) fn redact_response(parts: &mut response::Parts, secrets: &SecretSet) {
    strip_hop_by_hop(&mut parts.headers, false);
    rewrite::redact_headers(secrets, &mut parts.headers);
}

/// The codings to undo before redacting the body, with `Content-Encoding` (and, when something is
/// decoded, `Content-Length`) taken out of the head: the client gets identity. A coding the sidecar
/// cannot decode refuses: what it cannot redact, it does not relay.
pub(crate) fn take_codings(parts: &mut response::Parts, host: &TargetHost) -> Result<Vec<Coding>, Refusal> {
    if !parts.headers.contains_key(header::CONTENT_ENCODING) {
        return Ok(Vec::new());
    }
    let codings = decode::content_codings(&parts.headers).map_err(|what| {
        Refusal::failed(
            ErrorKind::UndecodableEncoding,
            host,
            format!("the upstream answered with {what}, which the vault cannot decode to redact"),
        )
    })?;
    parts.headers.remove(header::CONTENT_ENCODING);
    if !codings.is_empty() {
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    Ok(codings)
}

/// `Content-Length`, when present and valid.
pub(crate) fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BindingSet;
    use crate::config::{Location, Secret, Surfaces};
    use crate::connect::parse_target;

    const STUB: &str = "lap_stub_anthropic_0123456789";
    const REAL: &str = "sk-ant-real-value-0123456789";

    fn set() -> SecretSet {
        SecretSet::new(vec![Secret {
            name: "anthropic".into(),
            stub: STUB.into(),
            value: REAL.into(),
            hosts: BindingSet(vec!["api.anthropic.com".parse().expect("binding")]),
            surfaces: Surfaces(["header", "query:key"].map(|s| s.parse().expect("surface")).to_vec()),
        }])
    }

    fn request(uri: &str, headers: &[(&str, &str)]) -> request::Parts {
        let mut b = http::Request::builder().uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("request").into_parts().0
    }

    fn target(host: &str) -> Target {
        parse_target(Some(host), Some(443), 443).expect("target")
    }

    #[test]
    fn host_matches_the_target_as_written_or_normalized() {
        let name = TargetHost::parse("api.anthropic.com");
        for same in ["api.anthropic.com", "API.Anthropic.COM", "api.anthropic.com."] {
            assert!(host_matches(same, &name), "{same}");
        }
        for other in ["api.anthropic.co", "evil.example", "api.anthropic.com.evil.example", ""] {
            assert!(!host_matches(other, &name), "{other}");
        }
        let ip = TargetHost::parse("127.0.0.1");
        for same in ["127.0.0.1", "0x7f.0.0.1", "2130706433"] {
            assert!(host_matches(same, &ip), "{same}");
        }
        assert!(!host_matches("127.0.0.2", &ip));
        assert!(host_matches("[::1]", &TargetHost::parse("::1")));
    }

    #[test]
    fn the_authority_must_name_the_connect_target_and_its_port() {
        let t = target("api.anthropic.com");
        assert!(authority_matches(&request("/", &[("host", "api.anthropic.com")]), &t));
        assert!(authority_matches(
            &request("/", &[("host", "api.anthropic.com:443")]),
            &t
        ));
        assert!(!authority_matches(
            &request("/", &[("host", "api.anthropic.com:8443")]),
            &t
        ));
        assert!(!authority_matches(&request("/", &[("host", "evil.example")]), &t));
        assert!(!authority_matches(&request("https://evil.example/", &[]), &t));
        assert!(!authority_matches(&request("/", &[]), &t), "HTTP/1.1 without Host");
        // `name:port` (the unparsed fast path) and its near misses.
        // An empty port is the scheme's default (RFC 3986 §3.2.3).
        for same in [
            "API.anthropic.com:443",
            "api.anthropic.com.:443",
            "api.anthropic.com:0443",
            "api.anthropic.com:",
        ] {
            assert!(authority_matches(&request("/", &[("host", same)]), &t), "{same}");
        }
        for other in [
            "api.anthropic.com:443:443",
            "evil.example:443",
            "api.anthropic.com.evil.example:443",
            "api.anthropic.com:-443",
            "api.anthropic.com:443x",
            ":443",
        ] {
            assert!(!authority_matches(&request("/", &[("host", other)]), &t), "{other}");
        }
    }

    #[test]
    fn an_ipv6_target_is_named_with_or_without_its_port() {
        let t = target("::1");
        for same in ["[::1]", "[::1]:443", "[::1]:"] {
            assert!(authority_matches(&request("/", &[("host", same)]), &t), "{same}");
        }
        for other in ["[::1]:8443", "[::2]:443", "[::1]:x"] {
            assert!(!authority_matches(&request("/", &[("host", other)]), &t), "{other}");
        }
    }

    #[test]
    fn the_request_head_is_swapped_toward_its_host_and_stripped_of_hop_by_hop_fields() {
        let set = set();
        let t = target("api.anthropic.com");
        let rules = HostRules::new(&set, &t.host, t.port);
        let authority: http::uri::Authority = "api.anthropic.com".parse().expect("authority");
        let mut parts = request(
            &format!("/v1/messages?key={STUB}"),
            &[
                ("host", "api.anthropic.com"),
                ("x-api-key", STUB),
                ("connection", "keep-alive, x-drop"),
                ("x-drop", "1"),
                ("expect", "100-continue"),
                ("accept-encoding", "gzip, compress;q=0.5, br"),
                ("range", "bytes=0-10"),
            ],
        );
        let mut inj = Injections::default();
        rewrite_request(&mut parts, &rules, &t, Some(&authority), false, &mut inj).expect("rewritten");
        assert_eq!(
            parts.uri.to_string(),
            format!("https://api.anthropic.com/v1/messages?key={REAL}")
        );
        assert_eq!(parts.headers["x-api-key"], REAL);
        for gone in ["host", "connection", "x-drop", "expect", "range"] {
            assert!(parts.headers.get(gone).is_none(), "{gone} removed");
        }
        assert_eq!(parts.headers["accept-encoding"], "gzip, br");
        let locations: Vec<Location> = inj.0.iter().map(|(_, l)| *l).collect();
        assert!(
            locations.contains(&Location::Header) && locations.contains(&Location::Query),
            "{locations:?}"
        );
    }

    #[test]
    fn a_stub_toward_another_host_is_a_block_naming_its_secret() {
        let set = set();
        let t = target("attacker.example");
        let rules = HostRules::new(&set, &t.host, t.port);
        let authority: http::uri::Authority = "attacker.example".parse().expect("authority");
        let mut parts = request("/", &[("authorization", &format!("Bearer {STUB}"))]);
        let err = rewrite_request(
            &mut parts,
            &rules,
            &t,
            Some(&authority),
            false,
            &mut Injections::default(),
        )
        .expect_err("refused");
        assert_eq!(err.audit_blocked(), Some("stub-exfiltration"));
        assert_eq!(err.blocked_secret(), Some("anthropic"));
    }

    #[test]
    fn the_response_head_is_redacted_and_its_codings_taken_out() {
        let set = set();
        let mut parts = http::Response::builder()
            .header("x-echo", format!("key={REAL}"))
            .header("content-encoding", "gzip")
            .header("content-length", "10")
            .header("connection", "close")
            .body(())
            .expect("response")
            .into_parts()
            .0;
        redact_response(&mut parts, &set);
        assert_eq!(parts.headers["x-echo"], format!("key={STUB}"));
        assert!(parts.headers.get("connection").is_none());
        let host = TargetHost::parse("api.anthropic.com");
        assert_eq!(take_codings(&mut parts, &host), Ok(vec![Coding::Gzip]));
        assert!(parts.headers.get("content-encoding").is_none() && parts.headers.get("content-length").is_none());

        parts
            .headers
            .insert("content-encoding", HeaderValue::from_static("compress"));
        let err = take_codings(&mut parts, &host).expect_err("undecodable");
        assert_eq!(err.audit_error(), Some("undecodable-encoding"));
        assert_eq!(err.status(), StatusCode::BAD_GATEWAY);
    }
}
