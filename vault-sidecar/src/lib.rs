//! LAP vault sidecar: an explicit HTTPS proxy that swaps credential stubs for real keys, only toward
//! the hosts each key is bound to.
//!
//! A request's life, in file order:
//! [`listener`] (explicit proxy port: CONNECT, absolute-form) and [`transparent`] (redirected
//! connections) → [`admission`] (the one check of every entry point: loop, egress) → [`connect`]
//! (intercept or tunnel) → [`tls`] (per-pod CA, leaves, ALPN) → [`intercept`] (one request inside
//! the tunnel, as phases: admit → rewrite the head → request body → send → redact the head →
//! response body → finish) → [`rewrite`] (pure stub swapping and redaction, streamed by [`body`],
//! compressed responses decoded by [`decode`] first, WebSocket messages by [`ws`]) → [`upstream`]
//! (pool, verification). Anything not relayed is a [`refusal`]; every request ends in one
//! `finish` that records [`metrics`] and the [`audit`] event. [`config`] (the `lap-vault-config`
//! crate: the file, its validation, host patterns, the egress policy) is what the operator writes;
//! [`proxy`] holds the shared state and starts everything; [`admin`] is the health/CA/metrics/audit
//! port.
//!
//! The crate's API is what the binary, the control plane, the benches and the fuzz targets use;
//! everything else is private.
#![warn(unreachable_pub)]

mod admin;
mod admission;
mod audit;
mod body;
mod connect;
mod decode;
mod headers;
mod intercept;
mod listener;
pub mod logwriter;
mod metrics;
mod proxy;
mod refusal;
mod rewrite;
mod secrets;
mod tls;
mod transparent;
mod upstream;
mod ws;

/// The configuration types and their validation (the `lap-vault-config` crate).
pub use lap_vault_config as config;
pub use lap_vault_config::{AddressDenial, AddressPolicy, Binding, BindingSet, HostPattern, HostSet, TargetHost};

pub use audit::write_lines_to as write_audit_lines_to;
pub use connect::{is_self, parse_target, Target, TargetError};
pub use lap_vault_config::{Location, Secret, Surface, Surfaces};
pub use proxy::{run, run_with, Inherited};
pub use rewrite::{redactor, Exfiltration, HostRules, Injections, StreamRewriter, StubRefusal};
pub use secrets::SecretSet;
pub use tls::{Ca, LeafCache};
pub use transparent::{parse_hello, Hello};

/// Entry points for the fuzz targets (`vault-sidecar/fuzz`), not an API.
#[doc(hidden)]
pub mod fuzz {
    pub use crate::rewrite::StubScanner;
    pub use crate::ws::{ClientFrames, FrameError, FrameRedactor, FrameTripwire};

    /// Decode `body` as a relayed response with `Content-Encoding: content_encoding` is decoded
    /// (the codings the sidecar accepts, applied in order): the identity bytes, or why not.
    pub async fn decode(content_encoding: &str, body: bytes::Bytes) -> Result<Vec<u8>, String> {
        use http_body_util::BodyExt;
        let value = http::HeaderValue::from_str(content_encoding).map_err(|e| e.to_string())?;
        let codings = crate::decode::codings(&value)?;
        let body = http_body_util::Full::new(body).map_err(|e| match e {}).boxed_unsync();
        let decoded = crate::decode::decoded(body, &codings);
        decoded
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .map_err(|e| e.to_string())
    }

    /// The request-body tripwire over a body with `Content-Encoding: content_encoding`: `chunks`
    /// pushed in order through `scanner` after decoding. `Ok(true)` when it refused a stub,
    /// `Ok(false)` when every chunk passed, `Err` when the coding is unknown or the body does not
    /// decode.
    pub fn scan_compressed<'a>(
        content_encoding: &str,
        scanner: StubScanner,
        secrets: std::sync::Arc<crate::SecretSet>,
        chunks: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<bool, String> {
        use crate::decode::{DecodingScanner, ScanRefusal};
        let value = http::HeaderValue::from_str(content_encoding).map_err(|e| e.to_string())?;
        let codings = crate::decode::codings(&value)?;
        let mut d = DecodingScanner::new(&codings, scanner, secrets).map_err(|e| e.to_string())?;
        for chunk in chunks {
            match d.push(chunk) {
                Ok(()) => {}
                Err(ScanRefusal::Stub(_)) => return Ok(true),
                Err(ScanRefusal::Corrupt(reason)) => return Err(reason),
            }
        }
        Ok(false)
    }

    /// What the sidecar offers upstream for a client's `Accept-Encoding` (`None`: no header).
    pub fn offer(accept_encoding: &str) -> Option<String> {
        let value = http::HeaderValue::from_str(accept_encoding).ok()?;
        crate::decode::offer(&value).map(|v| v.to_str().unwrap_or_default().to_owned())
    }
}
