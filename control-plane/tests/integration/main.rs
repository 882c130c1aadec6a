//! The control plane, black box and through its router, with real processes and stores. One test
//! binary (one link, one copy of the dependencies on disk), a module per behaviour:
//!
//! - [`api`], [`console`]: the REST API and the web console at the HTTP level (the router with
//!   `tower::ServiceExt::oneshot`, a real SQLite or Postgres store).
//! - [`console_browser`]: the web console in headless Chromium against a real `lap-server`.
//! - [`startup`], [`lap_cli`], [`readme`]: `lap-server`, `lap` and the README's blocks as a newcomer
//!   runs them.
//! - [`e2e`], [`tty`], [`tool_use`]: real `lap-server`, `vault-sidecar` and `lap-harness`
//!   processes with the real agent CLIs against local stand-ins for the model APIs.
//! - [`gateway`]: a real LiteLLM proxy as the model gateway, in front of the model stand-in.
//! - [`lifecycle`], [`faults`]: sessions over their lifetime and under the platform cases.
//! - [`sandbox`], [`netfilter`]: the local sandbox and the pod's netfilter rules, attacked from
//!   inside.
//! - [`kubernetes`], [`agent_placement`], [`replicas`]: the Kubernetes backend against the fake
//!   API server ([`support::fake_kube`]); [`kubernetes_live`] against a real cluster (ignored
//!   without one).
//! - [`deploy`], [`schemas`]: `deploy/` and every generated object against the real schemas.
//!
//! Run one module with a nextest filter, e.g.
//! `cargo nextest run -p lap-control-plane -E 'test(/^tty::/)'`.

#![allow(clippy::unwrap_used)]

mod support;

mod agent_placement;
mod api;
mod console;
mod console_browser;
mod deploy;
mod e2e;
mod faults;
mod gateway;
mod kubernetes;
mod kubernetes_live;
mod lap_cli;
mod lifecycle;
mod netfilter;
mod readme;
mod replicas;
mod sandbox;
mod schemas;
mod startup;
mod tool_use;
mod tty;
