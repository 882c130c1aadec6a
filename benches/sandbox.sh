#!/usr/bin/env bash
# What the local sandbox costs (issue 12): create → ready and keep-alive latency through the vault,
# with bubblewrap isolation and without, in one run. Builds release, runs benches/src/bin/sandbox.rs.
# Needs bubblewrap and curl. Usage: bash benches/sandbox.sh [--sessions 20] [--requests 2000]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v bwrap >/dev/null || { echo "bubblewrap is required: apt-get install bubblewrap" >&2; exit 1; }
cargo build --release --locked -p lap-control-plane -p lap-vault-sidecar -p lap-harness -p lap-benches --bins
exec "${CARGO_TARGET_DIR:-target}/release/sandbox" "$@"
