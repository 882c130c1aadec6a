//! LAP control plane (SPEC §3): `lap-server`'s REST API, store, sandbox backends and reconciler.
//!
//! Start reading at [`api`] (routes; the terminal's WebSocket relay is [`tty`]) → [`app`] (what each request does) → [`backend`] (how a
//! sandbox is brought up). Pure cores: [`env_vars`] (per-session env var rules and stubs),
//! [`lifecycle`] (reconciler decisions), [`settings`] (flags and durations). The web console is
//! [`console`].

pub mod agent_events;
pub mod api;
pub mod app;
pub mod audit;
pub mod backend;
pub mod console;
pub mod crypto;
pub mod env_vars;
pub mod error;
pub mod harness;
pub mod keys;
pub mod lifecycle;
pub mod metrics;
pub mod model;
pub mod reconciler;
pub mod server;
pub mod settings;
pub mod store;
pub mod tty;
