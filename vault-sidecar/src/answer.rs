//! Every failure is an HTTP answer with a kind, never a silent close (SPEC §2.2 "Errors are answers").
//!
//! - `X-Vault-Error: <kind>` on `502`/`504`/`500`: the sidecar could not do its job (upstream down, ...).
//! - `X-Vault-Blocked: <reason>` on `403`: policy refused the request (egress, stub exfiltration, loop).
//!
//! Bodies are JSON naming the host and the reason, never a secret's value or stub.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use crate::upstream::ProxyBody;

pub const X_VAULT_ERROR: &str = "x-vault-error";
pub const X_VAULT_BLOCKED: &str = "x-vault-blocked";

/// Why a request was blocked; the value of `X-Vault-Blocked`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockReason {
    EgressPolicy,
    StubExfiltration,
    Loop,
}

impl BlockReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EgressPolicy => "egress-policy",
            Self::StubExfiltration => "stub-exfiltration",
            Self::Loop => "proxy-loop",
        }
    }
}

/// A body from bytes.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed_unsync()
}

/// An empty body.
pub fn empty() -> ProxyBody {
    full(Bytes::new())
}

fn json_response(
    status: StatusCode,
    header: (&'static str, &'static str),
    body: serde_json::Value,
) -> Response<ProxyBody> {
    let mut resp = Response::new(full(body.to_string()));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header.0, HeaderValue::from_static(header.1));
    h.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

/// `403` with `X-Vault-Blocked`.
pub fn blocked(reason: BlockReason, host: &str, detail: serde_json::Value) -> Response<ProxyBody> {
    let mut body = serde_json::json!({ "error": "blocked", "reason": reason.as_str(), "host": host });
    if let (Some(obj), serde_json::Value::Object(extra)) = (body.as_object_mut(), detail) {
        obj.extend(extra);
    }
    json_response(StatusCode::FORBIDDEN, (X_VAULT_BLOCKED, reason.as_str()), body)
}

/// An error answer with `X-Vault-Error: kind`.
pub fn error(status: StatusCode, kind: &'static str, host: &str, reason: &str) -> Response<ProxyBody> {
    json_response(
        status,
        (X_VAULT_ERROR, kind),
        serde_json::json!({ "error": kind, "host": host, "reason": reason }),
    )
}

/// The answer for a failed upstream exchange of `kind` ([`crate::upstream::UpstreamError::kind`]):
/// an egress refusal decided on the resolved address is a `403` with `X-Vault-Blocked:
/// egress-policy` like every egress refusal; anything else an error with `X-Vault-Error`.
pub fn upstream_failure(status: StatusCode, kind: &'static str, host: &str, reason: &str) -> Response<ProxyBody> {
    if kind == crate::upstream::EGRESS_POLICY {
        return blocked(BlockReason::EgressPolicy, host, serde_json::json!({ "detail": reason }));
    }
    error(status, kind, host, reason)
}

/// A plain `4xx` for a malformed request to the proxy itself.
pub fn bad_request(reason: &str) -> Response<ProxyBody> {
    json_response(
        StatusCode::BAD_REQUEST,
        (X_VAULT_ERROR, "bad-request"),
        serde_json::json!({ "error": "bad-request", "reason": reason }),
    )
}
