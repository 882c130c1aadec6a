#!/usr/bin/env bash
# Instructions per request through the sidecar, counted by callgrind: a measure that doesn't move with the
# machine's load (docs/performance.md). The sidecar runs under valgrind while `compare` sends sequential
# keep-alive requests of one protocol; callgrind's counters are zeroed, then dumped 20 s later, and the
# total is divided by the change in the sidecar's requests_total over the same window.
# Usage: bash benches/instructions.sh [h1|h2] [sidecar binary]   (default: h1, target/release/vault-sidecar)
set -euo pipefail
cd "$(dirname "$0")/.."
proto=${1:-h1}
case "$proto" in h1|h2) ;; *) echo "usage: $0 [h1|h2] [sidecar binary]" >&2; exit 2 ;; esac
# valgrind, and the nginx origin `compare` puts behind the sidecar (as benches/compare.sh installs it).
missing=()
command -v valgrind >/dev/null || missing+=(valgrind)
command -v nginx >/dev/null || missing+=(nginx)
[ -e /usr/lib/nginx/modules/ngx_http_echo_module.so ] || missing+=(libnginx-mod-http-echo)
if [ "${#missing[@]}" -gt 0 ]; then
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${missing[@]}" >/dev/null
fi
cargo build --release --locked -p lap-vault-sidecar -p lap-benches --bins
out=${CARGO_TARGET_DIR:-target}
sidecar=$(realpath "${2:-$out/release/vault-sidecar}")
work=$(mktemp -d "$out/instructions.XXXXXX")
work=$(realpath "$work")
# compare's own children (nginx, the sidecar under valgrind) first: killed by a signal, compare can't stop them.
trap 'pkill -P "$compare" 2>/dev/null; kill "$compare" 2>/dev/null; pkill -f "callgrind-out-file=$work/" 2>/dev/null; true' EXIT
cat > "$work/sidecar" <<EOW
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file=$work/callgrind.out "$sidecar" "\$@" 2>$work/valgrind.log
EOW
chmod +x "$work/sidecar"
"$out/release/compare" --routes P --no-sidecar-checks --protocols "$proto" --sidecar "$work/sidecar" \
  --requests 100000000 > "$work/compare.log" 2>&1 &
compare=$!
admin=""
for _ in $(seq 600); do
  admin=$(sed -n 's/.*admin \([0-9.:]*\)).*/\1/p' "$work/compare.log")
  [ -n "$admin" ] && break
  kill -0 "$compare" 2>/dev/null || { cat "$work/compare.log" >&2; exit 1; }
  sleep 0.5
done
[ -n "$admin" ] || { echo "the sidecar did not start: $work/compare.log" >&2; exit 1; }
requests() { curl -sf "http://$admin/metrics" | awk '/^[a-z_]*requests_total/ { s += $NF } END { print s + 0 }'; }
pid=$(pgrep -f "callgrind-out-file=$work/callgrind.out" | head -1)
sleep 20   # warm: the tunnel, the leaf, the upstream connection
callgrind_control -z "$pid" >/dev/null 2>&1; r0=$(requests)
sleep 20
callgrind_control -d "$pid" >/dev/null 2>&1; r1=$(requests)
dump=$(ls "$work"/callgrind.out.* | head -1)
ir=$(awk '/^(summary|totals):/ { print $2; exit }' "$dump")
n=$((r1 - r0))
[ "$n" -gt 0 ] || { echo "no requests in the window" >&2; exit 1; }
echo "$proto: $n requests, $ir instructions, $((ir / n)) instructions per request (profile: $dump)"
