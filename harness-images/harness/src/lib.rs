//! LAP harness (SPEC §4): runs an agent CLI behind a small authenticated HTTP server, both
//! non-interactively (messages) and as its TUI in a shared terminal. [`agent`] drives the CLIs
//! (pure argument building and output parsing); [`tty`] is the terminal; [`server`] is the
//! HTTP surface.

pub mod agent;
pub mod bootstrap;
pub mod bringup;
pub mod server;
pub mod tty;
pub mod vault_handoff;
