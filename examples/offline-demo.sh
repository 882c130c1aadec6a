#!/usr/bin/env bash
# The offline demo: an agent (the real Claude Code CLI) answers, and runs a command, through the
# vault, with no internet and no Anthropic key. A local stand-in for api.anthropic.com
# (examples/model-standin.py) accepts only a made-up "real" key; the session's agent holds just
# a stub of it, so every answer it gets proves the vault swapped the key in on the wire.
#
# Needs: the binaries of the README's first command on PATH (lap, lap-server, vault-sidecar,
# lap-harness), bubblewrap, python3, openssl, and the claude CLI
# (npm install -g @anthropic-ai/claude-code). It starts its own lap-server on a free port, with
# its data in DEMO_DIR (default /tmp/lap-offline), and stops everything it started on exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${DEMO_DIR:-/tmp/lap-offline}
real_key="sk-ant-api03-OFFLINE-DEMO-REAL-KEY-0123456789"   # made up: the stand-in accepts only this one
for tool in lap lap-server vault-sidecar lap-harness claude python3 openssl bwrap; do
  command -v "$tool" >/dev/null || { echo "offline-demo: \`$tool\` is not on PATH (see the README's first command)" >&2; exit 1; }
done
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
# wait_for FILE PATTERN WHAT: the first line of FILE matching PATTERN, within 30 s.
wait_for() {
  for _ in $(seq 300); do
    if line=$(grep -m1 -E "$2" "$1" 2>/dev/null); then echo "$line"; return; fi
    sleep 0.1
  done
  echo "offline-demo: $3 did not start; its log ($1) ends:" >&2; tail -n 5 "$1" >&2; exit 1
}

echo "== 1. a CA and a leaf for api.anthropic.com, and the model stand-in"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2 \
  -subj /CN=lap-offline-demo-ca 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout leaf.key -out leaf.csr \
  -subj /CN=api.anthropic.com 2>/dev/null
printf "subjectAltName=DNS:api.anthropic.com\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n" > leaf.cnf
openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem -days 2 -extfile leaf.cnf 2>/dev/null
python3 "$here/model-standin.py" leaf.pem leaf.key 0 "$real_key" > model.log 2>&1 &
pids+=($!)
port=$(wait_for model.log 'https://127.0.0.1:[0-9]+' "the model stand-in" | sed -E 's|.*127.0.0.1:([0-9]+).*|\1|')

echo "== 2. lap-server, its sessions' vaults sending api.anthropic.com to the stand-in"
# The one setting the demo needs: a base config every session's sidecar starts from.
cat > sidecar-base.toml <<TOML
upstream_ca_files = ["$dir/ca.pem"]   # trust the stand-in's CA toward upstreams
[resolve]
"api.anthropic.com:443" = "127.0.0.1:$port"
TOML
LAP_LISTEN=127.0.0.1:0 LAP_DATA_DIR="$dir/data" LAP_SIDECAR_BASE_CONFIG="$dir/sidecar-base.toml" \
  lap-server > server.log 2>&1 &
pids+=($!)
url=$(wait_for server.log 'listening on http://' "lap-server" | grep -oE 'http://[0-9.:]+')
export LAP_URL=$url MASTER_KEY LAP_CONFIG="$dir/lap.toml"   # this shell only: your own `lap login` is untouched
MASTER_KEY=$(cat "$dir/data/master_key")
echo "lap-server at $url"

echo "== 3. an agent and a session: the agent gets a stub, its vault the real key"
lap agents create demo --harness claude-code
ANTHROPIC_API_KEY=$real_key lap demo -e ANTHROPIC_API_KEY --no-attach

echo "== 4. a message, and a command the agent runs in its sandbox"
lap send demo "Say hello"
lap send demo "LAP-RUN: echo the sandbox runs \$(uname -s) as uid \$(id -u) in \$PWD"

echo "== 5. what the vault did"
lap audit demo
lap stop demo
echo "== the model stand-in's log: every request it answered carried the real key, which the agent never held"
cat model.log
