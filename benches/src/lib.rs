//! Benchmarks live in `benches/sidecar.rs`; run them with `cargo bench -p lap-benches`.
