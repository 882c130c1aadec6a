//! Black-box test support for the `vault-sidecar` binary.
//!
//! Start reading at [`Harness::start`]: it brings up a local TLS [`Upstream`] stand-in (hyper + rustls, certificates
//! minted at test time by a throwaway test CA) and a [`Sidecar`] process whose `[resolve]` table points the well-known
//! hosts (api.anthropic.com, api.github.com, github.com, attacker.example) at that upstream. Tests then drive real
//! clients (curl, git, python3, node, openssl, raw sockets) through the sidecar and assert on what the upstream
//! recorded ([`Recorded`]) and what the client received.
//!
//! Every test gets its own ports, temp dirs and processes, so the suite runs in parallel.
#![allow(dead_code, unreachable_pub)]

pub mod clients;
pub mod ops;
pub mod sidecar;
pub mod upstream;

pub use clients::*;
pub use sidecar::*;
pub use upstream::*;

use std::future::Future;
use std::time::Duration;

/// Secret bound to api.anthropic.com, swapped in headers.
pub const ANTHROPIC_STUB: &str = "sk-ant-api03-lapstub-7f3a9c1e5b2d4f6a8c0e";
pub const ANTHROPIC_REAL: &str = "sk-ant-api03-REALKEY-0d9e8f7a6b5c4d3e2f1a-secret";
/// Secret bound to github.com and api.github.com, swapped in headers.
pub const GITHUB_STUB: &str = "ghp_lapstubA1b2C3d4E5f6G7h8I9j0K1l2M3n4";
pub const GITHUB_REAL: &str = "ghp_REALtokenZ9y8X7w6V5u4T3s2R1q0P9o8N7xx";
/// Secret bound to api.anthropic.com, swapped only in the query string.
pub const QUERY_STUB: &str = "lapstub-query-4c8e2a6f0b3d";
pub const QUERY_REAL: &str = "REAL-query-9a7c5e3b1d2f77";
/// Secret bound to api.anthropic.com, swapped only in the body. The real value is longer than the stub, so a
/// correct swap must fix the framing.
pub const BODY_STUB: &str = "lapstub-body-5d1f3b7e9a2c";
pub const BODY_REAL: &str = "REAL-body-8b6d4f2a0c1e3579-longer-than-the-stub";

/// Every real value, for "never leaves" checks.
pub const ALL_REALS: [&str; 4] = [ANTHROPIC_REAL, GITHUB_REAL, QUERY_REAL, BODY_REAL];

/// The hosts the upstream certificate covers and the harness maps to the upstream.
pub const UPSTREAM_HOSTS: [&str; 4] = ["api.anthropic.com", "api.github.com", "github.com", "attacker.example"];

/// Awaits `fut`, panicking with `what` if it takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Lowercase hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Incremental SHA-256.
pub struct Sha256(ring::digest::Context);

impl Sha256 {
    pub fn new() -> Self {
        Self(ring::digest::Context::new(&ring::digest::SHA256))
    }
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }
    pub fn finish(self) -> String {
        hex(self.0.finish().as_ref())
    }
}

impl Default for Sha256 {
    fn default() -> Self {
        Self::new()
    }
}

/// The deterministic byte pattern served by `/big` and used for upload bodies: byte `i` is `i % 251`.
pub fn pattern_byte(i: u64) -> u8 {
    (i % 251) as u8
}

/// `len` bytes of the pattern starting at offset 0.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len as u64).map(pattern_byte).collect()
}

/// SHA-256 of `len` pattern bytes, computed in 1 MiB steps.
pub fn pattern_sha256(len: u64) -> String {
    let mut h = Sha256::new();
    let mut off = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while off < len {
        let n = ((len - off) as usize).min(buf.len());
        for (k, b) in buf[..n].iter_mut().enumerate() {
            *b = pattern_byte(off + k as u64);
        }
        h.update(&buf[..n]);
        off += n as u64;
    }
    h.finish()
}

/// Milliseconds since the UNIX epoch (shared clock between the upstream and the test's clients).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Upstream + sidecar wired together, the usual starting point of a test.
pub struct Harness {
    pub upstream: Upstream,
    pub sidecar: Sidecar,
}

impl Harness {
    /// Upstream speaking `alpn`, sidecar with the standard secrets and `tweak` applied to its config.
    pub async fn start(alpn: Alpn, tweak: impl FnOnce(&mut SidecarConfig)) -> Harness {
        let upstream = Upstream::start(UpstreamOptions {
            alpn,
            git_token: Some(GITHUB_REAL.to_string()),
        })
        .await;
        let mut cfg = SidecarConfig::standard(&upstream);
        tweak(&mut cfg);
        let sidecar = Sidecar::start(cfg).await;
        Harness { upstream, sidecar }
    }

    /// Both ALPN protocols upstream, default config.
    pub async fn default_setup() -> Harness {
        Self::start(Alpn::Both, |_| {}).await
    }

    /// Panics if any real value appears in the sidecar's stdout/stderr logs (audit lines included).
    pub fn assert_logs_clean(&self) {
        self.sidecar.assert_logs_clean();
    }
}
