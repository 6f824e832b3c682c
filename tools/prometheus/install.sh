#!/usr/bin/env bash
# Installs Debian's `prometheus` package (the real server the monitor tests scrape with).
# Idempotent: a no-op when `prometheus` is already on PATH. Needs root (CI runs as root) and
# Debian's package archive. The package's service is never started: the tests run their own
# server on loopback with a temporary config and data directory.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "tools/prometheus/install.sh: prometheus is not installed and this is not root:" \
         "run 'sudo apt-get install --no-install-recommends prometheus'" >&2
    exit 1
fi

# Keep the package's init script from starting a system-wide server (Debian's policy-rc.d
# mechanism: exit 101 = action forbidden). Only a policy we created ourselves is removed.
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    created_policy=1
fi
cleanup() { if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
apt_get() { apt-get -o DPkg::Lock::Timeout=600 -q "$@"; }
if ! apt_get install -y --no-install-recommends prometheus; then
    apt_get update
    apt_get install -y --no-install-recommends prometheus
fi
command -v prometheus >/dev/null
