//! One outcome type for every request the sidecar does not relay: a [`Refusal`] is either a
//! policy block (`403`, `X-Vault-Blocked: <reason>`) or a failure (`4xx`/`5xx`, `X-Vault-Error:
//! <kind>`). It knows its status, its header, its JSON body, and how it is counted and audited, so
//! every entry point answers the same way (SPEC §2.2 "Errors are answers": never a silent close).
//!
//! Bodies are JSON naming the host and the reason, never a secret's value or stub.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use crate::upstream::{ProxyBody, UpstreamError};

pub(crate) const X_VAULT_ERROR: &str = "x-vault-error";
pub(crate) const X_VAULT_BLOCKED: &str = "x-vault-blocked";

/// Why a request was blocked; the value of `X-Vault-Blocked` and of the audit event's `blocked`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum BlockReason {
    /// The `[egress]` policy (or the resolved-address policy) does not allow the target.
    EgressPolicy,
    /// A stub was sent toward a host its secret is not bound to.
    StubExfiltration,
    /// A stub was sent toward its bound host, but not in one of its secret's credential
    /// surfaces (a header, query parameter or path the host could reflect).
    StubOutsideSurface,
    /// The target is one of the sidecar's own listeners.
    Loop,
}

impl BlockReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::EgressPolicy => "egress-policy",
            Self::StubExfiltration => "stub-exfiltration",
            Self::StubOutsideSurface => "stub-outside-surface",
            Self::Loop => "proxy-loop",
        }
    }
}

/// What went wrong when the sidecar could not do its job; the value of `X-Vault-Error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ErrorKind {
    /// A malformed request to the proxy itself.
    BadRequest,
    /// Inside a tunnel, a request named a host other than the CONNECT target (RFC 9110 §15.5.20).
    Misdirected,
    /// A secret's real value cannot be written where its stub was (e.g. a header).
    InvalidSecretValue,
    /// The upstream's answer could not be read as HTTP.
    UpstreamProtocol,
    /// The upstream answered with a `Content-Encoding` the sidecar cannot decode to redact.
    UndecodableEncoding,
    /// A request body the tripwire must read has a `Content-Encoding` the sidecar cannot decode
    /// (RFC 9110 §15.5.16).
    UnsupportedRequestEncoding,
    /// A request with a transfer coding other than `chunked` (RFC 9112 §6.1: `501`).
    UnsupportedTransferCoding,
    Dns,
    Connect,
    ConnectTimeout,
    UpstreamCertUntrusted,
    TlsHandshake,
    TlsHandshakeTimeout,
    /// The upstream sent no response head within `upstream_response_timeout_secs`.
    UpstreamResponseTimeout,
    BadTarget,
}

impl ErrorKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad-request",
            Self::Misdirected => "misdirected-request",
            Self::InvalidSecretValue => "invalid-secret-value",
            Self::UpstreamProtocol => "upstream-protocol",
            Self::UndecodableEncoding => "undecodable-encoding",
            Self::UnsupportedRequestEncoding => "unsupported-request-encoding",
            Self::UnsupportedTransferCoding => "unsupported-transfer-coding",
            Self::Dns => "dns",
            Self::Connect => "connect",
            Self::ConnectTimeout => "connect-timeout",
            Self::UpstreamCertUntrusted => "upstream-cert-untrusted",
            Self::TlsHandshake => "tls-handshake",
            Self::TlsHandshakeTimeout => "tls-handshake-timeout",
            Self::UpstreamResponseTimeout => "upstream-response-timeout",
            Self::BadTarget => "bad-target",
        }
    }

    /// `400` for the client's own mistakes, `421` for a misdirected request, `415` for a request
    /// body coding the tripwire cannot read, `501` for a transfer coding other than chunked, `500` when a secret
    /// cannot be used, `504` for timeouts, `502` for everything the upstream did.
    pub(crate) fn status(self) -> StatusCode {
        match self {
            Self::BadRequest => StatusCode::BAD_REQUEST,
            Self::Misdirected => StatusCode::MISDIRECTED_REQUEST,
            Self::UnsupportedRequestEncoding => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::UnsupportedTransferCoding => StatusCode::NOT_IMPLEMENTED,
            Self::InvalidSecretValue => StatusCode::INTERNAL_SERVER_ERROR,
            Self::ConnectTimeout | Self::TlsHandshakeTimeout | Self::UpstreamResponseTimeout => {
                StatusCode::GATEWAY_TIMEOUT
            }
            _ => StatusCode::BAD_GATEWAY,
        }
    }
}

/// A request the sidecar answers itself instead of relaying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    Blocked {
        reason: BlockReason,
        host: String,
        /// For a stub exfiltration: the secret's name and where its stub was.
        secret: Option<(String, &'static str)>,
        /// A sentence for people.
        detail: Option<String>,
    },
    Failed {
        kind: ErrorKind,
        /// The host the request was for, when there is one.
        host: Option<String>,
        reason: String,
    },
}

impl Refusal {
    pub(crate) fn blocked(reason: BlockReason, host: impl ToString) -> Self {
        let detail = match reason {
            BlockReason::Loop => Some("the target is this sidecar's own port".to_owned()),
            BlockReason::EgressPolicy => Some("the target is not allowed by the [egress] policy".to_owned()),
            BlockReason::StubExfiltration | BlockReason::StubOutsideSurface => None,
        };
        Self::Blocked {
            reason,
            host: host.to_string(),
            secret: None,
            detail,
        }
    }

    pub(crate) fn failed(kind: ErrorKind, host: impl ToString, reason: impl Into<String>) -> Self {
        Self::Failed {
            kind,
            host: Some(host.to_string()),
            reason: reason.into(),
        }
    }

    /// A malformed request to the proxy itself (no host to name).
    pub(crate) fn bad_request(reason: impl Into<String>) -> Self {
        Self::Failed {
            kind: ErrorKind::BadRequest,
            host: None,
            reason: reason.into(),
        }
    }

    /// An upstream exchange that failed: an address refused by the egress policy is a block like
    /// every egress refusal; anything else an error of the upstream's kind.
    pub(crate) fn upstream(e: &UpstreamError, host: impl ToString) -> Self {
        match e.kind() {
            None => Self::Blocked {
                reason: BlockReason::EgressPolicy,
                host: host.to_string(),
                secret: None,
                detail: Some(e.to_string()),
            },
            Some(kind) => Self::failed(kind, host, e.to_string()),
        }
    }

    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::Blocked { .. } => StatusCode::FORBIDDEN,
            Self::Failed { kind, .. } => kind.status(),
        }
    }

    /// The audit event's `blocked` (a misdirected request counts as blocked: it is a policy
    /// decision about the target, answered with `421`).
    pub(crate) fn audit_blocked(&self) -> Option<&'static str> {
        match self {
            Self::Blocked { reason, .. } => Some(reason.as_str()),
            Self::Failed {
                kind: ErrorKind::Misdirected,
                ..
            } => Some(ErrorKind::Misdirected.as_str()),
            Self::Failed { .. } => None,
        }
    }

    /// Whether the request (and any real value swapped into it) may have been written toward the
    /// upstream before this refusal: only when the upstream's answer was what failed. A block,
    /// or a failure to resolve, connect or shake hands, means nothing left the sidecar.
    pub(crate) fn reached_upstream(&self) -> bool {
        matches!(
            self,
            Self::Failed {
                kind: ErrorKind::UpstreamProtocol | ErrorKind::UndecodableEncoding | ErrorKind::UpstreamResponseTimeout,
                ..
            }
        )
    }

    /// The audit event's `error`.
    pub(crate) fn audit_error(&self) -> Option<&'static str> {
        match self {
            Self::Failed { kind, .. } if *kind != ErrorKind::Misdirected => Some(kind.as_str()),
            _ => None,
        }
    }

    /// The secret named by a stub-exfiltration block.
    pub(crate) fn blocked_secret(&self) -> Option<&str> {
        match self {
            Self::Blocked {
                secret: Some((name, _)),
                ..
            } => Some(name),
            _ => None,
        }
    }

    pub(crate) fn into_response(self) -> Response<ProxyBody> {
        let status = self.status();
        let (header, value, body) = match self {
            Self::Blocked {
                reason,
                host,
                secret,
                detail,
            } => {
                let mut body = serde_json::json!({ "error": "blocked", "reason": reason.as_str(), "host": host });
                if let Some((name, location)) = secret {
                    body["secret"] = name.into();
                    body["location"] = location.into();
                }
                if let Some(detail) = detail {
                    body["detail"] = detail.into();
                }
                (X_VAULT_BLOCKED, reason.as_str(), body)
            }
            Self::Failed { kind, host, reason } => {
                let mut body = serde_json::json!({ "error": kind.as_str(), "reason": reason });
                if let Some(host) = host {
                    body["host"] = host.into();
                }
                (X_VAULT_ERROR, kind.as_str(), body)
            }
        };
        let mut resp = Response::new(full(body.to_string()));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(header, HeaderValue::from_static(value));
        h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        resp
    }
}

/// A body from bytes.
pub(crate) fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed_unsync()
}

/// A whole body that holds `permit` (of the process-wide body budget) until it is dropped.
pub(crate) fn full_budgeted(bytes: Bytes, permit: tokio::sync::OwnedSemaphorePermit) -> ProxyBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .map_frame(move |frame| {
            let _held = &permit;
            frame
        })
        .boxed_unsync()
}

/// An empty body.
pub(crate) fn empty() -> ProxyBody {
    full(Bytes::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_block_is_a_403_with_its_reason_and_no_error() {
        let r = Refusal::blocked(BlockReason::EgressPolicy, "evil.example");
        assert_eq!(r.audit_blocked(), Some("egress-policy"));
        assert_eq!(r.audit_error(), None);
        let resp = r.into_response();
        assert_eq!(resp.status(), 403);
        assert_eq!(resp.headers()[X_VAULT_BLOCKED], "egress-policy");
        assert!(resp.headers().get(X_VAULT_ERROR).is_none());
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["host"], "evil.example");
        assert_eq!(v["reason"], "egress-policy");
    }

    #[tokio::test]
    async fn an_exfiltration_names_the_secret_and_where_its_stub_was() {
        let r = Refusal::Blocked {
            reason: BlockReason::StubExfiltration,
            host: "attacker.example".into(),
            secret: Some(("anthropic".into(), "header")),
            detail: None,
        };
        assert_eq!(r.blocked_secret(), Some("anthropic"));
        let body = r.into_response().into_body().collect().await.expect("body").to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(
            (v["secret"].as_str(), v["location"].as_str()),
            (Some("anthropic"), Some("header"))
        );
    }

    #[test]
    fn every_error_kind_has_its_status_and_a_misdirected_request_counts_as_blocked() {
        let cases = [
            (ErrorKind::BadRequest, 400),
            (ErrorKind::Misdirected, 421),
            (ErrorKind::InvalidSecretValue, 500),
            (ErrorKind::UpstreamProtocol, 502),
            (ErrorKind::UndecodableEncoding, 502),
            (ErrorKind::ConnectTimeout, 504),
            (ErrorKind::TlsHandshakeTimeout, 504),
            (ErrorKind::Dns, 502),
        ];
        for (kind, status) in cases {
            let r = Refusal::failed(kind, "h", "why");
            assert_eq!(r.status().as_u16(), status, "{kind:?}");
            let resp = r.clone().into_response();
            assert_eq!(resp.headers()[X_VAULT_ERROR], kind.as_str());
            if kind == ErrorKind::Misdirected {
                assert_eq!(
                    (r.audit_blocked(), r.audit_error()),
                    (Some("misdirected-request"), None)
                );
            } else {
                assert_eq!((r.audit_blocked(), r.audit_error()), (None, Some(kind.as_str())));
            }
        }
    }
}
