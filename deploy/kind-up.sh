#!/usr/bin/env bash
# A local LAP on kind: cluster, agent-sandbox with its extensions (the release's
# sandbox-with-extensions.yaml), the kind overlay. Prerequisites and the live-cluster tests:
# deploy/README.md.
#
#   deploy/kind-up.sh                       # cluster `lap`, agent-sandbox v0.5.6 (the CRDs LAP is tested against)
#   AGENT_SANDBOX_VERSION=v0.5.5 deploy/kind-up.sh
#
# Images: lap/lap-server:dev, lap/vault-sidecar:dev and lap/harness-<harness_id>:dev are loaded
# into the cluster when they exist locally (docker); build them first with deploy/build-images.sh. Secrets (master key,
# encryption key, Postgres password) are generated here on first run, never committed.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER="${KIND_CLUSTER:-lap}"
VERSION="${AGENT_SANDBOX_VERSION:-v0.5.6}"
# Core and extensions (SandboxTemplate, SandboxWarmPool, SandboxClaim) in one asset, the
# controller declared once with extensions enabled.
MANIFEST="https://github.com/kubernetes-sigs/agent-sandbox/releases/download/${VERSION}/sandbox-with-extensions.yaml"

for tool in kind kubectl docker openssl; do
  command -v "$tool" >/dev/null || { echo "kind-up: \`$tool\` is required" >&2; exit 1; }
done

echo "== cluster $CLUSTER"
if ! kind get clusters | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --config deploy/overlays/kind/kind-config.yaml
fi
kubectl config use-context "kind-$CLUSTER" >/dev/null

echo "== agent-sandbox ($VERSION)"
kubectl apply --server-side -f "$MANIFEST"
kubectl wait --for=condition=Established --timeout=120s crd/sandboxes.agents.x-k8s.io \
  crd/sandboxtemplates.extensions.agents.x-k8s.io crd/sandboxwarmpools.extensions.agents.x-k8s.io \
  crd/sandboxclaims.extensions.agents.x-k8s.io
kubectl -n agent-sandbox-system rollout status deploy --timeout=180s || true

echo "== images"
for image in lap/lap-server:dev lap/vault-sidecar:dev \
             lap/harness-claude-code:dev lap/harness-codex:dev lap/harness-opencode:dev \
             lap/harness-claude-agent-sdk:dev; do
  if docker image inspect "$image" >/dev/null 2>&1; then
    kind load docker-image --name "$CLUSTER" "$image"
  else
    echo "   $image is not built locally; pods using it will not start"
  fi
done

echo "== secrets"
kubectl apply -f - <<YAML
apiVersion: v1
kind: Namespace
metadata:
  name: lap-system
YAML
if ! kubectl -n lap-system get secret lap-keys >/dev/null 2>&1; then
  kubectl -n lap-system create secret generic lap-keys \
    --from-literal=MASTER_KEY="$(openssl rand -hex 24)" \
    --from-literal=LAP_ENCRYPTION_KEY="$(openssl rand -base64 32)"
fi
if ! kubectl -n lap-system get secret lap-database >/dev/null 2>&1; then
  pw="$(openssl rand -hex 16)"
  kubectl -n lap-system create secret generic lap-database \
    --from-literal=POSTGRES_PASSWORD="$pw" \
    --from-literal=DATABASE_URL="postgres://lap:${pw}@lap-postgres.lap-system.svc:5432/lap"
fi

echo "== LAP"
kubectl apply -k deploy/overlays/kind
kubectl -n lap-system rollout status statefulset/lap-postgres --timeout=180s
kubectl -n lap-system rollout status deploy/lap-server --timeout=180s || true

cat <<MSG

LAP is up. Reach it with:
  kubectl -n lap-system port-forward svc/lap-server 4000:80 &
  export MASTER_KEY=\$(kubectl -n lap-system get secret lap-keys -o jsonpath='{.data.MASTER_KEY}' | base64 -d)
  curl -s -H "Authorization: Bearer \$MASTER_KEY" http://127.0.0.1:4000/api/v1/managed_agents/agents
MSG
