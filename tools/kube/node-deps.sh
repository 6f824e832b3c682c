#!/usr/bin/env bash
# Install the Debian packages a real node (`tessera cluster up --kubelet`) needs:
#   runc                          the OCI runtime containerd's runc shim calls (/usr/sbin/runc)
#   containernetworking-plugins   CNI plugins bridge, host-local, loopback (/usr/lib/cni)
#   busybox-static                the static busybox every locally built test image carries
#   iproute2                      `ip`, to delete the pod bridge when the node stops
# (gcc, for the static pause program, is needed by `make native` already.)
#
# Idempotent and fast when everything is installed (one dpkg-query). Installs with apt-get
# only when running as root on a system with apt-get; otherwise prints the missing packages
# and how to install them, and exits 0: the `node` tests then fail with the same advice, the
# rest of the suite does not need these packages.
#
# Usage: tools/kube/node-deps.sh [--check]   (--check: never install, exit 1 if missing)
# Exit:  0 all installed (or not installable here, see above); 1 missing with --check;
#        non-zero from apt-get when an install was attempted and failed.
set -euo pipefail

packages=(runc containernetworking-plugins busybox-static iproute2 nftables)
check_only=0
case "${1:-}" in
  --check) check_only=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)"
  [[ "$status" == "installed" ]] || missing+=("$p")
done
if [[ ${#missing[@]} == 0 ]]; then
  exit 0
fi
if [[ $check_only == 1 ]]; then
  echo "node-deps.sh: missing Debian packages: ${missing[*]} (install: apt-get install -y ${missing[*]})" >&2
  exit 1
fi
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "node-deps.sh: not installing ${missing[*]} (needs root and apt-get); the real-node tests" \
       "(marker node) need them: apt-get install -y ${missing[*]}" >&2
  exit 0
fi
echo "node-deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "node-deps.sh: installed ${missing[*]}"
