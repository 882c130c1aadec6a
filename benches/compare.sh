#!/usr/bin/env bash
# The side-by-side load comparison (SPEC §5, issue 7): direct TLS (D), the vault sidecar (P) and
# mitmproxy (M) against one local nginx, in one run. Installs what it needs, builds release, runs.
# Usage: bash benches/compare.sh [compare flags, e.g. --out target/compare.md; --help lists them]
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v nginx >/dev/null || missing+=(nginx-light)
[ -e /usr/lib/nginx/modules/ngx_http_echo_module.so ] || missing+=(libnginx-mod-http-echo)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ "${#missing[@]}" -gt 0 ]; then
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# nginx's package starts a system nginx on :80; the comparison runs its own, so that one may stay.

venv=${CARGO_TARGET_DIR:-target}/bench-venv
if [ ! -x "$venv/bin/mitmdump" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check mitmproxy
fi

cargo build --release --locked -p lap-vault-sidecar -p lap-benches --bins
exec "${CARGO_TARGET_DIR:-target}/release/compare" --mitmdump "$venv/bin/mitmdump" "$@"
