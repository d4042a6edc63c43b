#!/usr/bin/env bash
# Build spire-server and spire-agent for tests/spire from source, pinned by tools/spire/go.mod
# (go.sum committed: the module graph and every checksum are fixed; `go get -tool` put both
# commands there). Binaries are cached by version at ~/.cache/nodegate/spire/<version>/ and only
# what is missing is built, so a warm run is instant and a cold one (about 15-30 min on a loaded
# 2-core machine) happens once per pin.
#
#   scripts/build-spire.sh          build what is missing, print the cache directory and the time
#   NODEGATE_CACHE=DIR ...          cache root instead of ~/.cache/nodegate
#
# Needs Go >= the go line in tools/spire/go.mod and a C compiler (CGO: SPIRE's sqlite datastore).
set -euo pipefail

die() { echo "build-spire: $*" >&2; exit 1; }

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$root/tools/spire"
if ! command -v go >/dev/null 2>&1; then
  # Without Go, tests/spire skip in one line, unless CI requires them (NODEGATE_REQUIRE_SPIRE=1).
  [[ "${NODEGATE_REQUIRE_SPIRE:-}" == 1 ]] && die "go is not on PATH (https://go.dev/dl/)"
  echo "build-spire: no go on PATH; tests/spire will be skipped"
  exit 0
fi

version="$(awk '$1 == "github.com/spiffe/spire" { print $2 }' "$mod/go.mod")"
[[ -n "$version" ]] || die "tools/spire/go.mod does not require github.com/spiffe/spire"
cache="${NODEGATE_CACHE:-$HOME/.cache/nodegate}/spire/$version"
mkdir -p "$cache"

start=$(date +%s)
built=()
for cmd in spire-server spire-agent; do
  [[ -x "$cache/$cmd" ]] && continue
  echo "build-spire: building $cmd $version (cold builds take a while)"
  # A temporary name, then rename: an interrupted build never leaves a half-written binary
  # that the next run would take for a finished one.
  (cd "$mod" && CGO_ENABLED=1 go build -trimpath -o "$cache/.$cmd.tmp" "github.com/spiffe/spire/cmd/$cmd")
  mv -f "$cache/.$cmd.tmp" "$cache/$cmd"
  built+=("$cmd")
done
elapsed=$(( $(date +%s) - start ))
if (( ${#built[@]} )); then
  echo "build-spire: built ${built[*]} in ${elapsed}s -> $cache"
else
  echo "build-spire: spire $version already in $cache"
fi
