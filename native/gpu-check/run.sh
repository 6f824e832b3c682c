#!/usr/bin/env bash
# Tessera GPU check: run on a machine with an NVIDIA GPU (uses GPU 0, ~7 minutes, stops at 9).
# `run.sh --only evstamp,contention` runs the issue-23 checks alone (~3 minutes).
# First run: H200, 2026-12-04 (docs/enforcement.md section 5.1). Prints a table; exit status 1 if any check fails.
set -euo pipefail
cd "$(dirname "$0")"
command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found: this needs an NVIDIA GPU" >&2; exit 2; }
exec timeout 560 python3 gpu_check.py "$@"
