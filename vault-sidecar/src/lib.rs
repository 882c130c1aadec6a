//! LAP vault sidecar: an explicit HTTPS proxy that swaps credential stubs for real keys, only toward
//! the hosts each key is bound to.
//!
//! Start reading at [`config`] (what the operator writes), then follow a request:
//! [`hosts`]/[`egress`] (may this target be reached) → [`rewrite`] (pure stub swapping and redaction).
pub mod config;
pub mod egress;
pub mod hosts;
pub mod rewrite;
pub mod secrets;
