//! LAP harness (SPEC §4): runs an agent CLI non-interactively behind a small authenticated
//! HTTP server. [`agent`] drives the CLIs (pure argument building and output parsing);
//! [`server`] is the HTTP surface.

pub mod agent;
pub mod server;
