#!/usr/bin/env bash
# Build `helm` (module helm.sh/helm/v4, pinned in go.mod/go.sum here) from the Go module proxy
# into tools/helm/bin/helm, as upstream's Makefile does (CGO_ENABLED=0, -trimpath, version
# stamped into helm.sh/helm/v4/internal/version). Test tooling: the e2e tests render and lint
# the chart deploy/helm/tessera with it. Skipped when bin/.stamp matches a hash of the go
# version, go.mod, go.sum and this script.
#
# Usage: tools/helm/build.sh [--force]
# Env:   GOFLAGS/GOCACHE/GOMODCACHE/GOPROXY are honoured as usual.
# Exit:  0 built or up to date; non-zero with go's error output otherwise.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="$here/bin"
force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  *) echo "usage: $0 [--force]" >&2; exit 2 ;;
esac

command -v go >/dev/null || { echo "build.sh: 'go' not found on PATH; install Go >= 1.26 (https://go.dev/dl/)" >&2; exit 2; }

mkdir -p "$bin"
exec 9>"$bin/.lock"
flock 9

hash="$( { go version; cd "$here"; sha256sum go.mod go.sum build.sh; } | sha256sum | cut -d' ' -f1)"
if [[ $force == 0 && -f "$bin/.stamp" && "$(cat "$bin/.stamp")" == "$hash" && -x "$bin/helm" ]]; then
  echo "build.sh: $bin/helm is up to date"
  exit 0
fi
rm -f "$bin/.stamp"

start=$(date +%s)
cd "$here"
version="$(go list -m -f '{{.Version}}' helm.sh/helm/v4)"   # e.g. v4.3.2
pkg=helm.sh/helm/v4/internal/version
echo "build.sh: building helm ($version)"
CGO_ENABLED=0 go build -trimpath -o "$bin/helm" \
  -ldflags "-s -w -X $pkg.version=$version -X $pkg.metadata= -X $pkg.gitTreeState=clean" \
  helm.sh/helm/v4/cmd/helm
echo "$hash" > "$bin/.stamp"
echo "build.sh: done in $(( $(date +%s) - start ))s -> $bin/helm"
