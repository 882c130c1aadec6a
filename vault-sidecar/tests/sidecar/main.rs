//! The vault sidecar, black box: the `vault-sidecar` binary driven by real clients (curl, git,
//! python, node, openssl, the agent CLIs, raw sockets) against local stand-ins for the hosts
//! it serves. One test binary, a module per behaviour:
//!
//! - [`real_clients`]: the stub swapped on the way out, real values redacted on the way back,
//!   host binding and egress, streaming, WebSocket, git, through real clients.
//! - [`operating`]: what an operator sees and does: redaction of reflected values, the tripwire,
//!   metrics, the admin API, secret rotation and reload, standard input.
//! - [`limits`]: bad and hostile input, timeouts, and the bounds on memory and descriptors.
//! - [`reported_cases`]: the proxy cases of real-world reports (`K01`–`K12`), each with its
//!   correct value.
//! - [`agents`]: the real agent CLIs (claude, codex, opencode) through the sidecar.
//! - [`tripwire`]: stubs toward a host their secret is not bound to in a request body, a
//!   cleartext request or a WebSocket message: refused before they leave, and audited.
//! - [`transparent`]: iptables-redirected connections in a network namespace.
//! - [`stand_ins`]: the test upstream itself, answering directly (so a sidecar failure is never
//!   a stand-in's).
//!
//! [`support`] starts everything; every test has its own processes, ports and directories.

mod support;

mod agents;
mod limits;
mod operating;
mod real_clients;
mod reported_cases;
mod stand_ins;
mod transparent;
mod tripwire;
