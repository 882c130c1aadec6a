#!/usr/bin/env bash
# Build every image deploy/ and the Kubernetes backend refer to, with the tags kind-up.sh loads:
#   lap/lap-server:dev, lap/vault-sidecar:dev, lap/harness-<harness_id>:dev
# Usage: deploy/build-images.sh [TAG]   (default tag: dev)
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-dev}"
command -v docker >/dev/null || { echo "build-images: \`docker\` is required" >&2; exit 1; }
docker build -f deploy/images/lap-server/Dockerfile -t "lap/lap-server:$tag" .
docker build -f deploy/images/vault-sidecar/Dockerfile -t "lap/vault-sidecar:$tag" .
for id in claude-code codex opencode claude-agent-sdk; do
  docker build -f "harness-images/$id/Dockerfile" -t "lap/harness-$id:$tag" .
done
