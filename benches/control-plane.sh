#!/usr/bin/env bash
# The control plane under load and after a crash (issue 15): create → ready for many sessions at
# once, and restart → first reconcile after kill -9. Builds release, runs
# benches/src/bin/control_plane.rs. Needs bubblewrap.
# Usage: bash benches/control-plane.sh [--sessions 60] [--ready 3] [--restarts 5]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v bwrap >/dev/null || { echo "bubblewrap is required: apt-get install bubblewrap" >&2; exit 1; }
cargo build --release --locked -p lap-control-plane -p lap-vault-sidecar -p lap-harness -p lap-benches --bins
exec "${CARGO_TARGET_DIR:-target}/release/control_plane" "$@"
