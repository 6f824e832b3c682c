#!/usr/bin/env bash
# Install the Debian packages `make image` builds with (no Docker daemon, no registry):
#   buildah      the daemonless OCI image builder (builds deploy/images/Dockerfile)
#   runc         the OCI runtime buildah runs each RUN step in (a Recommends of buildah's)
#   mmdebstrap   makes the Debian bookworm base image from Debian's packages when the
#                digest-pinned upstream base cannot be pulled (tools/image/base.sh)
#
# Idempotent and fast when everything is installed (one dpkg-query). Installs with apt-get
# only when running as root on a system with apt-get; otherwise prints the missing packages
# and how to install them, and exits 1: `make image` cannot run without them.
#
# Usage: tools/image/install.sh [--check]   (--check: never install, exit 1 if missing)
set -euo pipefail

packages=(buildah runc mmdebstrap)
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
if [[ $check_only == 1 ]] || [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "tools/image/install.sh: missing Debian packages: ${missing[*]};" \
       "make image needs them: apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "tools/image/install.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt_get() { apt-get -o DPkg::Lock::Timeout=600 -qq "$@"; }
if ! apt_get install -y --no-install-recommends "${missing[@]}" >/dev/null; then
  apt_get update
  apt_get install -y --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "tools/image/install.sh: installed ${missing[*]}"
