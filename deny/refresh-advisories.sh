#!/usr/bin/env bash
# Refresh the RustSec advisory snapshot that `.ci/deny` checks the dependency graph against.
#
#   bash deny/refresh-advisories.sh                 # clone https://github.com/rustsec/advisory-db
#   bash deny/refresh-advisories.sh /path/to/clone  # or copy from a clone you already have
#
# CI reaches no git host, so the advisories live in the repository: `deny/advisory-db/crates/`
# (one TOML-fronted Markdown file per advisory, CC0-1.0, see deny/advisory-db/LICENSE.txt) and
# `deny/advisory-db/SNAPSHOT` (the upstream commit and its date). Commit the result with the
# commit hash in the message; review new advisories with `bash .ci/deny`.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-}
tmp=
if [ -z "$src" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  git clone --quiet --depth 1 https://github.com/rustsec/advisory-db "$tmp/advisory-db"
  src=$tmp/advisory-db
fi
commit=$(git -C "$src" rev-parse HEAD)
date=$(git -C "$src" log -1 --format=%cI HEAD)
rm -rf deny/advisory-db
mkdir -p deny/advisory-db
git -C "$src" archive HEAD crates LICENSE.txt | tar -x -C deny/advisory-db
printf 'commit %s\ndate %s\nsource https://github.com/rustsec/advisory-db\n' "$commit" "$date" >deny/advisory-db/SNAPSHOT
echo "deny/advisory-db: $(find deny/advisory-db/crates -name '*.md' | wc -l) advisories at $commit ($date)"
