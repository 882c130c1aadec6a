#!/usr/bin/env bash
# A message's round trip through a model gateway (a real LiteLLM proxy) against the same message sent to the
# model directly (issue 16), in one run: control-plane/benches/gateway.rs. Needs bubblewrap, the claude CLI
# (npm install -g @anthropic-ai/claude-code) and LiteLLM (pip install 'litellm[proxy]'; LAP_TEST_LITELLM names
# its CLI, as .ci/run sets it). Usage: bash benches/gateway.sh   (BENCH_MESSAGES=20 messages per session)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p lap-vault-sidecar -p lap-harness --bins
exec cargo bench --locked -p lap-control-plane --bench gateway
