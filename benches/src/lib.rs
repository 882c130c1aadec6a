//! Shared parts of the benchmarks: a throwaway PKI for the stand-in upstream, a CONNECT tunnel
//! client, and an in-process TLS upstream.
//!
//! - `benches/sidecar.rs` (criterion, `cargo bench -p lap-benches`): the hot path in isolation,
//!   and one request through an in-process sidecar vs the same request direct.
//! - `src/bin/compare` (`bash benches/compare.sh`): the side-by-side load comparison of direct TLS,
//!   the sidecar and mitmproxy against one nginx upstream.
//! - `src/bin/sandbox` and `src/bin/control_plane` (`bash benches/sandbox.sh`,
//!   `bash benches/control-plane.sh`): the whole platform, through a `lap-server` ([`lapserver`]).

pub mod lapserver;
pub mod pki;
pub mod tunnel;
pub mod upstream;
