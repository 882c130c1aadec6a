//! The console's security decisions, as pure functions over plain data: the page's
//! Content-Security-Policy, the sign-in cookie, the CSRF token, whether a request comes from
//! another site, and when a sign-in has expired. docs/console.md says why each is so.

use std::time::Duration;

use axum::http::{header, HeaderMap};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use cookie::{Cookie, SameSite};
use sha2::{Digest, Sha256};

/// The sign-in cookie's name.
pub const COOKIE_NAME: &str = "lap_console";
/// A sign-in ends this long after its last request…
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(2 * 60 * 60);
/// …and at the latest this long after it began (also the cookie's `Max-Age`).
pub(super) const MAX_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);
/// `last_seen_at` is written at most this often.
pub(super) const TOUCH_EVERY: Duration = Duration::from_secs(60);
/// The request header carrying the CSRF token on cookie-authenticated writes.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// The page's policy (CSP Level 3). Scripts only from this origin, never inline; style
/// elements only from this origin or carrying this response's `nonce` (xterm.js adds its
/// theme and cell sizes as `<style>` elements, which the console's script gives the nonce);
/// style *attributes* allowed, since xterm.js sets 24-bit colours with `setAttribute("style")`
/// and an attribute styles only its own element. Fetches, the event stream and the terminal's
/// WebSocket only to this origin (`'self'` covers `ws:`/`wss:` of the same host); no frames,
/// no plugins, no `<base>`, forms post only here.
pub(super) fn content_security_policy(style_nonce: &str) -> String {
    [
        "default-src 'none'".to_owned(),
        "script-src 'self'".to_owned(),
        format!("style-src 'self' 'nonce-{style_nonce}'"),
        format!("style-src-elem 'self' 'nonce-{style_nonce}'"),
        "style-src-attr 'unsafe-inline'".to_owned(),
        "img-src 'self' data:".to_owned(),
        "font-src 'self'".to_owned(),
        "connect-src 'self'".to_owned(),
        "manifest-src 'self'".to_owned(),
        "base-uri 'none'".to_owned(),
        "form-action 'self'".to_owned(),
        "frame-ancestors 'none'".to_owned(),
        "object-src 'none'".to_owned(),
    ]
    .join("; ")
}

/// A fresh random value (256 bits, base64url): a cookie value or a nonce.
pub(super) fn random_token() -> String {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut b);
    URL_SAFE_NO_PAD.encode(b)
}

fn digest(domain: &str, value: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(domain.as_bytes());
    h.update([0]);
    h.update(value.as_bytes());
    h.finalize().into()
}

/// The database key of a sign-in: the SHA-256 of its cookie value, so the table alone lets no
/// one sign in.
pub(super) fn session_key(cookie_value: &str) -> String {
    digest("lap-console-session", cookie_value)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The CSRF token of a sign-in, derived from its cookie value (which script cannot read): the
/// page gets it from the sign-in answer or `GET /console/session` and sends it as
/// [`CSRF_HEADER`]; another site can neither read it nor compute it.
pub(super) fn csrf_token(cookie_value: &str) -> String {
    URL_SAFE_NO_PAD.encode(digest("lap-console-csrf", cookie_value))
}

/// Whether `presented` is the CSRF token of the sign-in `cookie_value` (constant time).
pub(super) fn csrf_matches(cookie_value: &str, presented: &str) -> bool {
    use subtle::ConstantTimeEq;
    let expected = csrf_token(cookie_value);
    expected.len() == presented.len() && bool::from(expected.as_bytes().ct_eq(presented.as_bytes()))
}

/// The sign-in cookie: `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's
/// page sends it), `Path=/` (the API and the console), `Max-Age` [`MAX_LIFETIME`], and
/// `Secure` when the browser reached us over TLS.
pub(super) fn signin_cookie(value: &str, secure: bool) -> Cookie<'static> {
    Cookie::build((COOKIE_NAME, value.to_owned()))
        .http_only(true)
        .same_site(SameSite::Strict)
        .path("/")
        .max_age(cookie::time::Duration::seconds(MAX_LIFETIME.as_secs() as i64))
        .secure(secure)
        .build()
}

/// The `Set-Cookie` that removes the sign-in cookie.
pub(super) fn removal_cookie(secure: bool) -> Cookie<'static> {
    let mut c = signin_cookie("", secure);
    c.make_removal();
    c
}

/// The sign-in cookie's value in a request, if there is one.
pub(super) fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == COOKIE_NAME && !c.value().is_empty())
        .map(|c| c.value().to_owned())
}

/// Whether the browser reached this server over TLS: lap-server itself speaks plain HTTP, so
/// TLS is a proxy's (`X-Forwarded-Proto: https`) or the browser says so in `Origin`, which it
/// sends with every `POST`. A client lying here only spoils its own cookie.
pub(super) fn browser_uses_tls(headers: &HeaderMap) -> bool {
    let forwarded = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(str::trim);
    if let Some(proto) = forwarded {
        return proto.eq_ignore_ascii_case("https");
    }
    headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|o| o.starts_with("https://"))
}

/// Whether the browser says this request comes from another site or origin
/// (`Sec-Fetch-Site`, sent by every current browser); requests without it (curl, `lap`) are
/// judged by their credentials alone.
pub(super) fn from_another_site(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| matches!(v, "cross-site" | "same-site"))
}

/// What a sign-in's times say about it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Freshness {
    /// Valid; nothing to write.
    Fresh,
    /// Valid; record this request as its last activity.
    Touch,
    /// Idle too long or too old: signed out.
    Expired,
}

/// Whether a sign-in created at `created_ms` and last seen at `last_seen_ms` is valid at `now_ms`.
pub(super) fn freshness(created_ms: i64, last_seen_ms: i64, now_ms: i64) -> Freshness {
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    if now_ms - created_ms >= ms(MAX_LIFETIME) || now_ms - last_seen_ms >= ms(IDLE_TIMEOUT) {
        Freshness::Expired
    } else if now_ms - last_seen_ms >= ms(TOUCH_EVERY) {
        Freshness::Touch
    } else {
        Freshness::Fresh
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn policy_has_no_inline_script_and_names_the_nonce() {
        let csp = content_security_policy("abc");
        let script = csp.split("; ").find(|d| d.starts_with("script-src")).unwrap();
        assert_eq!(script, "script-src 'self'");
        assert!(csp.contains("style-src-elem 'self' 'nonce-abc'"));
        assert!(csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"));
        assert!(!csp.contains("unsafe-eval"));
    }

    #[test]
    fn cookie_flags() {
        let c = signin_cookie("v", false).to_string();
        assert!(c.starts_with("lap_console=v;"), "{c}");
        for attr in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
            assert!(c.contains(attr), "{attr} missing in {c}");
        }
        assert!(!c.contains("Secure"), "{c}");
        assert!(signin_cookie("v", true).to_string().contains("Secure"));
        let gone = removal_cookie(false).to_string();
        assert!(
            gone.contains("Max-Age=0") && gone.starts_with("lap_console=;"),
            "{gone}"
        );
    }

    #[test]
    fn cookie_value_is_found_among_others() {
        assert_eq!(
            cookie_value(&headers(&[("cookie", "a=1; lap_console=xyz; b=2")])).as_deref(),
            Some("xyz")
        );
        assert_eq!(
            cookie_value(&headers(&[("cookie", "a=1"), ("cookie", "lap_console=q")])).as_deref(),
            Some("q")
        );
        assert_eq!(cookie_value(&headers(&[("cookie", "lap_console=")])), None);
        assert_eq!(cookie_value(&headers(&[])), None);
    }

    #[test]
    fn tokens_are_derived_and_distinct() {
        let v = random_token();
        assert_eq!(v.len(), 43);
        assert_ne!(v, random_token());
        assert_eq!(session_key(&v).len(), 64);
        assert_ne!(session_key(&v), csrf_token(&v));
        assert!(csrf_matches(&v, &csrf_token(&v)));
        assert!(!csrf_matches(&v, &csrf_token("other")));
        assert!(!csrf_matches(&v, ""));
    }

    #[test]
    fn tls_is_what_the_proxy_or_the_browser_says() {
        assert!(!browser_uses_tls(&headers(&[])));
        assert!(!browser_uses_tls(&headers(&[("origin", "http://127.0.0.1:4000")])));
        assert!(browser_uses_tls(&headers(&[("origin", "https://lap.example")])));
        assert!(browser_uses_tls(&headers(&[("x-forwarded-proto", "https")])));
        assert!(browser_uses_tls(&headers(&[("x-forwarded-proto", "https, http")])));
        // The proxy's word wins over the page's.
        assert!(!browser_uses_tls(&headers(&[
            ("x-forwarded-proto", "http"),
            ("origin", "https://lap.example")
        ])));
    }

    #[test]
    fn other_sites() {
        assert!(from_another_site(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(from_another_site(&headers(&[("sec-fetch-site", "same-site")])));
        assert!(!from_another_site(&headers(&[("sec-fetch-site", "same-origin")])));
        assert!(!from_another_site(&headers(&[("sec-fetch-site", "none")])));
        assert!(!from_another_site(&headers(&[])));
    }

    #[test]
    fn expiry() {
        let min = 60_000;
        assert_eq!(freshness(0, 0, 0), Freshness::Fresh);
        assert_eq!(freshness(0, 0, min - 1), Freshness::Fresh);
        assert_eq!(freshness(0, 0, min), Freshness::Touch);
        assert_eq!(freshness(0, 0, 120 * min - 1), Freshness::Touch);
        assert_eq!(freshness(0, 0, 120 * min), Freshness::Expired, "idle");
        assert_eq!(freshness(0, 718 * min, 720 * min - 1), Freshness::Touch);
        assert_eq!(freshness(0, 719 * min, 720 * min), Freshness::Expired, "too old");
    }
}
