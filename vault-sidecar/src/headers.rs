//! Hop-by-hop headers (RFC 9110 §7.6.1): never forwarded, in either direction.
//!
//! Removed: `Connection` and every header it names, `Proxy-Connection`, `Keep-Alive`,
//! `Transfer-Encoding`, `TE` (except `TE: trailers`, which h2 and gRPC need), `Upgrade` (kept
//! on a WebSocket handshake), `Proxy-Authorization`, `Proxy-Authenticate`. `Trailer` is
//! end-to-end (RFC 9110 §6.6.2) and kept: an HTTP/1.1 server sends only the trailers it declares.

use http::header::{self, HeaderName, HeaderValue};
use http::HeaderMap;

const FIXED: &[HeaderName] = &[
    header::PROXY_AUTHORIZATION,
    header::PROXY_AUTHENTICATE,
    header::TRANSFER_ENCODING,
];

/// Whether a request or response asks for a protocol upgrade (RFC 9110 §7.8).
pub(crate) fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE) && connection_tokens(headers).any(|t| t.eq_ignore_ascii_case("upgrade"))
}

fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Whether `name` is hop-by-hop by itself (headers named by `Connection` are only hop-by-hop when a
/// `Connection` header is present, and it is one of these).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TE
        || name == header::UPGRADE
        || FIXED.contains(name)
        || name.as_str() == "proxy-connection"
        || name.as_str() == "keep-alive"
}

/// Remove hop-by-hop headers in place. With `keep_upgrade`, `Upgrade` and `Connection: upgrade`
/// survive (the WebSocket handshake needs both).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Most messages carry none: one pass over the names instead of a removal (a hash) per name.
    if !keep_upgrade && !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let named: Vec<HeaderName> = connection_tokens(headers)
        .filter(|t| !(keep_upgrade && t.eq_ignore_ascii_case("upgrade")))
        .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
        .collect();
    let te_trailers = headers
        .get(header::TE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    // One pass over the names, then one removal per name present (usually just `Connection`),
    // instead of a removal (a hash) for every name that could be there.
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|n| !(keep_upgrade && *n == header::UPGRADE) && (is_hop_by_hop(n) || named.contains(n)))
        .cloned()
        .collect();
    for name in &doomed {
        headers.remove(name);
    }
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).expect("name"),
                HeaderValue::from_str(v).expect("value"),
            );
        }
        h
    }

    #[test]
    fn messages_without_hop_by_hop_headers_are_unchanged_and_any_one_triggers_stripping() {
        let plain = map(&[("content-type", "text/plain"), ("x-api-key", "k"), ("accept", "*/*")]);
        let mut h = plain.clone();
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h, plain);
        let mut declared = map(&[("trailer", "x-echo")]);
        strip_hop_by_hop(&mut declared, false);
        assert_eq!(declared, map(&[("trailer", "x-echo")]), "Trailer is end-to-end");
        for hop in [
            "connection",
            "te",
            "upgrade",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
        ] {
            let mut h = plain.clone();
            h.insert(HeaderName::from_static(hop), HeaderValue::from_static("x"));
            strip_hop_by_hop(&mut h, false);
            assert_eq!(h, plain, "{hop} stayed");
        }
    }

    #[test]
    fn strips_fixed_and_connection_named_headers() {
        let mut h = map(&[
            ("connection", "keep-alive, x-secret-hop"),
            ("x-secret-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic abc"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("te", "gzip"),
            ("upgrade", "h2c"),
            ("x-api-key", "k"),
        ]);
        strip_hop_by_hop(&mut h, false);
        let names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, vec!["x-api-key"]);
    }

    #[test]
    fn te_trailers_survives() {
        let mut h = map(&[("te", "trailers")]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.get("te").map(HeaderValue::as_bytes), Some(&b"trailers"[..]));
    }

    #[test]
    fn websocket_handshake_keeps_upgrade() {
        let mut h = map(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "x"),
        ]);
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get("upgrade").map(HeaderValue::as_bytes), Some(&b"websocket"[..]));
        assert_eq!(h.get("connection").map(HeaderValue::as_bytes), Some(&b"upgrade"[..]));
        assert!(h.contains_key("sec-websocket-key"));
    }
}
