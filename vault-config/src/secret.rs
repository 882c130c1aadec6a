//! One secret as validated: its name, stub, real value, the hosts it may be sent to and the
//! credential surfaces of a request where its stub is swapped.

use std::fmt;
use std::str::FromStr;

use crate::hosts::BindingSet;

/// The kind of place in a request a stub was found: what metrics and audit events name.
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
}

/// The headers a bare `header` surface means: where HTTP APIs take a credential. `authorization`
/// only with one of [`CREDENTIAL_SCHEMES`]; `proxy-authorization` is for the proxy and never
/// forwarded.
pub const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "private-token",
    "x-auth-token",
];

/// The `Authorization` schemes a bare `header` surface swaps in (compared case-insensitively, RFC
/// 9110 §11.1): `Bearer` (RFC 6750), `Basic` (RFC 7617, decoded, swapped and re-encoded) and
/// `token` (GitHub's).
pub const CREDENTIAL_SCHEMES: &[&str] = &["bearer", "basic", "token"];

/// The query parameters a bare `query` surface means.
pub const CREDENTIAL_PARAMS: &[&str] = &["key", "api_key", "apikey", "access_token", "token"];

/// The header fields no surface may name: they are the connection's, not the request's.
const UNNAMEABLE_HEADERS: &[&str] = &[
    "host",
    "connection",
    "proxy-authorization",
    "proxy-connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// One place in a request where a secret's stub is swapped for its value. Everywhere else, a
/// stub toward its bound host is not swapped (see the sidecar's docs for what then happens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Surface {
    /// `header`: the [`CREDENTIAL_HEADERS`].
    CredentialHeaders,
    /// `header:NAME`: that header (lowercase), whatever the value's form.
    Header(String),
    /// `query`: the value of one of the [`CREDENTIAL_PARAMS`].
    CredentialParams,
    /// `query:NAME`: the value of that query parameter (case-sensitive, as decoded).
    Query(String),
    /// `body`: form-encoded request bodies (`application/x-www-form-urlencoded`), the shape of
    /// an OAuth 2.0 client credential (RFC 6749 §2.3.1).
    FormBody,
    /// `body:METHOD PATH`: the body of requests with that method and path (`PATH*` for a prefix),
    /// whatever their content type.
    Body { method: String, path: String },
}

/// How a stub in one header may be swapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderUse {
    /// Anywhere in the value (and inside `Basic` credentials).
    Whole,
    /// Only in the credentials of an `Authorization` with one of [`CREDENTIAL_SCHEMES`].
    SchemeCredentials,
}

impl Surface {
    pub fn location(&self) -> Location {
        match self {
            Self::CredentialHeaders | Self::Header(_) => Location::Header,
            Self::CredentialParams | Self::Query(_) => Location::Query,
            Self::FormBody | Self::Body { .. } => Location::Body,
        }
    }
}

impl fmt::Display for Surface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CredentialHeaders => f.write_str("header"),
            Self::Header(name) => write!(f, "header:{name}"),
            Self::CredentialParams => f.write_str("query"),
            Self::Query(name) => write!(f, "query:{name}"),
            Self::FormBody => f.write_str("body"),
            Self::Body { method, path } => write!(f, "body:{method} {path}"),
        }
    }
}

const SURFACE_FORMS: &str =
    "one of \"header\", \"header:NAME\", \"query\", \"query:NAME\", \"body\", \"body:METHOD /PATH\"";

impl FromStr for Surface {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, arg) = match s.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (s, None),
        };
        match (kind, arg) {
            ("header", None) => Ok(Self::CredentialHeaders),
            ("query", None) => Ok(Self::CredentialParams),
            ("body", None) => Ok(Self::FormBody),
            ("header", Some(name)) => {
                let name = name.to_ascii_lowercase();
                if name.is_empty() || !name.bytes().all(is_tchar) {
                    return Err(format!(
                        "`{s}`: the header name must be a field name token (RFC 9110 §5.1)"
                    ));
                }
                if UNNAMEABLE_HEADERS.contains(&name.as_str()) {
                    return Err(format!(
                        "`{s}`: `{name}` belongs to the connection, not the request, and is never a credential surface"
                    ));
                }
                Ok(Self::Header(name))
            }
            ("query", Some(name)) => {
                if name.is_empty()
                    || name
                        .bytes()
                        .any(|b| matches!(b, b'&' | b'=' | b'#' | b'?') || !b.is_ascii_graphic())
                {
                    return Err(format!(
                        "`{s}`: the parameter name must be non-empty printable ASCII without `&`, `=`, `#` or `?`"
                    ));
                }
                Ok(Self::Query(name.to_owned()))
            }
            ("body", Some(route)) => {
                let Some((method, path)) = route.split_once(' ') else {
                    return Err(format!(
                        "`{s}`: write the route as `body:METHOD /PATH`, e.g. `body:POST /oauth/token`"
                    ));
                };
                if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
                    return Err(format!("`{s}`: the method must be upper-case letters, e.g. POST"));
                }
                if !path.starts_with('/') || path.bytes().any(|b| b == b'?' || b == b'#' || !b.is_ascii_graphic()) {
                    return Err(format!(
                        "`{s}`: the path must start with `/` and hold no query, fragment or space"
                    ));
                }
                if path.find('*').is_some_and(|i| i + 1 != path.len()) {
                    return Err(format!("`{s}`: `*` may only end the path (a prefix)"));
                }
                Ok(Self::Body {
                    method: method.to_owned(),
                    path: path.to_owned(),
                })
            }
            _ => Err(format!("`{s}` is not {SURFACE_FORMS}")),
        }
    }
}

/// RFC 9110 §5.6.2 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A secret's credential surfaces; `["header"]` when none are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Surfaces(pub Vec<Surface>);

impl Default for Surfaces {
    fn default() -> Self {
        Self(vec![Surface::CredentialHeaders])
    }
}

impl Surfaces {
    /// How a stub in header `name` (lowercase, as parsed) may be swapped; `None`: not at all.
    pub fn header(&self, name: &str) -> Option<HeaderUse> {
        let mut found = None;
        for s in &self.0 {
            match s {
                Surface::Header(n) if n == name => return Some(HeaderUse::Whole),
                Surface::CredentialHeaders if name == "authorization" => found = Some(HeaderUse::SchemeCredentials),
                Surface::CredentialHeaders if CREDENTIAL_HEADERS.contains(&name) => return Some(HeaderUse::Whole),
                _ => {}
            }
        }
        found
    }

    /// Whether a stub in the value of query parameter `name` (percent-decoded) is swapped.
    pub fn query(&self, name: &str) -> bool {
        self.0.iter().any(|s| match s {
            Surface::CredentialParams => CREDENTIAL_PARAMS.contains(&name),
            Surface::Query(n) => n == name,
            _ => false,
        })
    }

    /// Whether stubs in the body of this request are swapped: `content_type` is its
    /// `Content-Type` field value, if any.
    pub fn body(&self, method: &str, path: &str, content_type: Option<&[u8]>) -> bool {
        self.0.iter().any(|s| match s {
            Surface::FormBody => content_type.is_some_and(is_form),
            Surface::Body { method: m, path: p } => {
                m == method
                    && match p.strip_suffix('*') {
                        Some(prefix) => path.starts_with(prefix),
                        None => p == path,
                    }
            }
            _ => false,
        })
    }

    /// Whether any surface is of kind `location`.
    pub fn has(&self, location: Location) -> bool {
        self.0.iter().any(|s| s.location() == location)
    }
}

/// `application/x-www-form-urlencoded`, parameters (`; charset=…`) allowed.
fn is_form(content_type: &[u8]) -> bool {
    let essence = content_type.split(|&b| b == b';').next().unwrap_or_default();
    essence
        .trim_ascii()
        .eq_ignore_ascii_case(b"application/x-www-form-urlencoded")
}

impl fmt::Display for Surfaces {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

/// One secret, validated. `Debug` never shows the value or the stub.
#[derive(Clone)]
pub struct Secret {
    pub name: String,
    pub stub: String,
    pub value: String,
    /// Where it may be sent: host patterns, each with its port (443 unless written).
    pub hosts: BindingSet,
    /// Where in a request toward those hosts its stub is swapped.
    pub surfaces: Surfaces,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .field("surfaces", &self.surfaces)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn surfaces(list: &[&str]) -> Surfaces {
        Surfaces(list.iter().map(|s| s.parse().expect("surface")).collect())
    }

    #[test]
    fn every_form_parses_and_prints_back() {
        for s in [
            "header",
            "header:x-probe",
            "query",
            "query:key",
            "body",
            "body:POST /oauth/token",
            "body:PUT /v1/*",
        ] {
            assert_eq!(s.parse::<Surface>().expect(s).to_string(), s);
        }
        assert_eq!(
            "header:X-Api-Key".parse::<Surface>(),
            Ok(Surface::Header("x-api-key".into()))
        );
    }

    #[test]
    fn bad_forms_say_what_is_wrong() {
        for (s, says) in [
            ("cookie", "is not one of"),
            ("header:", "field name token"),
            ("header:x probe", "field name token"),
            ("header:Host", "belongs to the connection"),
            ("header:proxy-authorization", "belongs to the connection"),
            ("query:", "parameter name"),
            ("query:a=b", "parameter name"),
            ("body:POST", "body:METHOD /PATH"),
            ("body:post /x", "upper-case"),
            ("body:POST x", "start with `/`"),
            ("body:POST /x?y", "start with `/`"),
            ("body:POST /a*/b", "may only end"),
        ] {
            let err = s.parse::<Surface>().expect_err(s);
            assert!(err.contains(says), "{s}: {err}");
        }
    }

    #[test]
    fn a_bare_header_is_the_credential_headers_and_authorization_by_scheme() {
        let s = Surfaces::default();
        for name in CREDENTIAL_HEADERS.iter().filter(|n| **n != "authorization") {
            assert_eq!(s.header(name), Some(HeaderUse::Whole), "{name}");
        }
        assert_eq!(s.header("authorization"), Some(HeaderUse::SchemeCredentials));
        for name in ["x-probe", "cookie", "user-agent", "proxy-authorization"] {
            assert_eq!(s.header(name), None, "{name}");
        }
        let named = surfaces(&["header", "header:authorization", "header:x-probe"]);
        assert_eq!(named.header("authorization"), Some(HeaderUse::Whole));
        assert_eq!(named.header("x-probe"), Some(HeaderUse::Whole));
        assert_eq!(named.header("x-other"), None);
    }

    #[test]
    fn query_and_body_surfaces_name_their_place() {
        let s = surfaces(&["query", "query:sig", "body", "body:POST /oauth/token", "body:PUT /v1/*"]);
        assert!(s.query("key") && s.query("access_token") && s.query("sig"));
        assert!(!s.query("q") && !s.query("KEY"));
        let form = Some(&b"application/x-www-form-urlencoded; charset=utf-8"[..]);
        assert!(s.body("GET", "/anything", form));
        assert!(!s.body("POST", "/gists", Some(b"application/json")));
        assert!(s.body("POST", "/oauth/token", Some(b"application/json")));
        assert!(!s.body("POST", "/oauth/token2", None));
        assert!(!s.body("GET", "/oauth/token", None));
        assert!(s.body("PUT", "/v1/files/a", None));
        assert!(!s.body("PUT", "/v2/files", None));
        assert!(!Surfaces::default().body("POST", "/oauth/token", form));
    }
}
