#!/bin/sh
# lap-harness image entrypoint: pick up the pod CA the vault sidecar writes to the shared volume,
# make the CA variables of SPEC §2.3 point at it (unless the platform set them already), then run
# lap-harness. The harness container runs as a non-root user, so the system store is not
# modified: a bundle (system roots + pod CA) is written next to the user's home instead.
set -eu
ca="${LAP_CA_FILE:-/lap-shared/ca.pem}"
wait="${LAP_CA_WAIT_SECONDS:-60}"
i=0
while [ ! -s "$ca" ] && [ "$i" -lt "$wait" ]; do
  sleep 1
  i=$((i + 1))
done
if [ -s "$ca" ]; then
  bundle="${HOME:-/tmp}/.lap-ca-bundle.pem"
  cat /etc/ssl/certs/ca-certificates.crt "$ca" > "$bundle"
  : "${NODE_EXTRA_CA_CERTS:=$ca}"
  for v in SSL_CERT_FILE REQUESTS_CA_BUNDLE CURL_CA_BUNDLE GIT_SSL_CAINFO CARGO_HTTP_CAINFO CODEX_CA_CERTIFICATE; do
    eval "[ -n \"\${$v:-}\" ] || export $v=\"\$bundle\""
  done
  export NODE_EXTRA_CA_CERTS
else
  echo "lap-entrypoint: no pod CA at $ca after ${wait}s; HTTPS through the vault will fail" >&2
fi
exec /usr/local/bin/lap-harness "$@"
