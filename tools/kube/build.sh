#!/usr/bin/env bash
# Build the local control plane, a real node and the upstream-allocator harness from Go modules:
#   etcd (go.etcd.io/etcd/server/v3, module tools/kube/etcd), kube-apiserver, kube-scheduler,
#   kube-controller-manager, kubectl, kubelet (k8s.io/kubernetes, module tools/kube),
#   containerd, containerd-shim-runc-v2, ctr (github.com/containerd/containerd/v2, module
#   tools/kube/containerd) and allocator-harness (tools/kube/cmd/allocator-harness)
# into tools/kube/bin/. The build is skipped when bin/.stamp matches a hash of the go
# version, go.mod/go.sum files, this script and every .go source under tools/kube.
#
# Usage: tools/kube/build.sh [--force]
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

binaries=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet kube-proxy allocator-harness
          containerd containerd-shim-runc-v2 ctr)
mkdir -p "$bin"
# One build at a time (a CLI call and a test session may race).
exec 9>"$bin/.lock"
flock 9

inputs_hash() {
  {
    go version
    cd "$here"
    find . -path ./bin -prune -o -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' -o -name 'build.sh' \) -print \
      | LC_ALL=C sort | xargs sha256sum
  } | sha256sum | cut -d' ' -f1
}

hash="$(inputs_hash)"
if [[ $force == 0 && -f "$bin/.stamp" && "$(cat "$bin/.stamp")" == "$hash" ]]; then
  missing=0
  for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || missing=1; done
  if [[ $missing == 0 ]]; then
    echo "build.sh: binaries in $bin are up to date"
    exit 0
  fi
fi
rm -f "$bin/.stamp"

start=$(date +%s)
cd "$here"
k8s_version="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"   # e.g. v1.37.2
minor="${k8s_version#v1.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
export CGO_ENABLED=0
echo "build.sh: building kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet kube-proxy ($k8s_version) and allocator-harness"
go build -o "$bin/" -ldflags "$ldflags" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kubectl \
  k8s.io/kubernetes/cmd/kubelet \
  k8s.io/kubernetes/cmd/kube-proxy \
  ./cmd/allocator-harness
etcd_version="$(cd etcd && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
echo "build.sh: building etcd ($etcd_version)"
(cd etcd && go build -o "$bin/etcd" -ldflags "-s -w" ./cmd/etcd)
containerd_version="$(cd containerd && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)"
echo "build.sh: building containerd containerd-shim-runc-v2 ctr ($containerd_version)"
# Upstream's static build: no cgo, and without the btrfs/devmapper/zfs snapshotters (cgo or
# kernel features this node does not use; overlayfs is the snapshotter).
(cd containerd && go build -o "$bin/" -tags "no_btrfs no_devmapper no_zfs" \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr)
echo "$hash" > "$bin/.stamp"
echo "build.sh: done in $(( $(date +%s) - start ))s -> $bin"
