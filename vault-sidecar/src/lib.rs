//! LAP vault sidecar: an explicit HTTPS proxy that swaps credential stubs for real keys, only toward
//! the hosts each key is bound to.
//!
//! A request's life, in file order:
//! [`listener`] (explicit proxy port: CONNECT, absolute-form) → [`connect`] (target, loop, egress
//! via [`egress`]/[`hosts`], intercept or tunnel) → [`tls`] (per-pod CA, leaves, ALPN) →
//! [`intercept`] (one request inside the tunnel) → [`rewrite`] (pure stub swapping and redaction,
//! streamed by [`body`], compressed responses decoded by [`decode`] first) → [`upstream`] (pool, verification) → [`answer`] (errors as answers) →
//! [`audit`]. [`config`] is what the operator writes; [`proxy`] holds the shared state and starts
//! everything; [`admin`] is the health/CA/metrics/audit port.
pub mod admin;
pub mod answer;
pub mod audit;
pub mod body;
pub mod config;
pub mod connect;
pub mod decode;
pub mod egress;
pub mod headers;
pub mod hosts;
pub mod intercept;
pub mod listener;
pub mod logwriter;
pub mod metrics;
pub mod proxy;
pub mod rewrite;
pub mod secrets;
pub mod tls;
pub mod transparent;
pub mod upstream;
