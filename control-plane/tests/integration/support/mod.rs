//! Helpers for the end-to-end tests: a running `lap-server` process, a TLS stand-in for the
//! Anthropic Messages API, and paths to the workspace's binaries.

#![allow(dead_code, clippy::unwrap_used, unreachable_pub)]

pub mod anthropic;
pub mod browser;
pub mod fake_cli;
pub mod fake_kube;
pub mod gateway;
pub mod model_script;
pub mod server;
pub mod tmux;

/// The schema validator lives beside the fake API server, which validates what it is sent
/// (and the `kubernetes_bringup` bench includes `fake_kube.rs` on its own).
pub use fake_kube::schema;
