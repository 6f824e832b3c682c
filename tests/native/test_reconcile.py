"""The claim's charge reconciled with the driver's per-process figure (docs/enforcement.md 4.6).

A context that takes more than ``context-overhead`` says is memory the claim holds uncharged.
The node (here: this test, in the processes' own PID namespace, as the node driver with the
host's) reads NVML's per-process used memory from the fake, whose figure comes from what the
fake itself handed out, maps the region's slots to their pids, and writes what the claim holds
beyond its charges into the claim directory's ``driver/usage``; the library holds that back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from native_helpers import UUIDS, Build, Claim, MiB, Stepped

from tessera.enforcement.limits import GpuLimit
from tessera.enforcement.reconcile import host_pid, reconcile_claim, unaccounted
from tessera.enforcement.region import read_region

pytestmark = pytest.mark.native

OOM = 2
CHILD = """
import json, sys
from tessera.driver.discovery import load_nvml
from tessera.enforcement.reconcile import nvml_per_process
print(json.dumps(nvml_per_process(load_nvml(sys.argv[1]))))
"""


def _per_process(c: Claim) -> dict[str, dict[int, int]]:
    """NVML's per-process figures, read through nvidia-ml-py as the node driver reads them."""
    env = {**c.env(preload=False)}
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(c.build.fake / "libnvidia-ml.so.1")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return {u: {int(p): b for p, b in f.items()} for u, f in json.loads(r.stdout).items()}


def _reconcile(c: Claim) -> dict[str, int]:
    """The node driver's reconcile of claim ``c`` (``reconcile_claim``); returns the
    unaccounted bytes per GPU it wrote."""
    snap, figures = read_region(c.region), _per_process(c)
    reconcile_claim(c.dir, snap, figures)
    return unaccounted(snap, figures)


def test_a_context_larger_than_the_overhead_is_held_back(tmp_path: Path, plain: Build) -> None:
    lim = 1024 * MiB
    ovh, real = 300 * MiB, 512 * MiB  # the limits file says 300 MiB, a context takes 512 MiB
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], lim, 0)], context_overhead=ovh)
    env = {"FAKE_CTX_BYTES": str(real)}
    with Stepped(
        c, "link", ["init", "dev", "0", "alloc", str(64 * MiB)], ["used", "0"], **env
    ) as a:
        a.next()
        (slot,) = read_region(c.region).slots
        assert host_pid(slot) == a.p.pid
        assert _reconcile(c) == {UUIDS[0]: real - ovh}  # 212 MiB the charge does not show
        assert (c.dir / "driver" / "usage").read_text() == (
            f"version 2\ngpu {UUIDS[0]} unaccounted {real - ovh}\n"
            f"pid {slot.index} {slot.generation} {slot.pid} {a.p.pid}\n"
        )
        assert os.stat(c.dir / "driver" / "usage").st_mode & 0o777 == 0o444
        # a second process: the claim's charges (364 + 300 MiB) and the 212 MiB held back
        left = lim - (ovh + 64 * MiB) - ovh - (real - ovh)
        out = c.tp("link", "init", "dev", "0", "meminfo", "alloc", str(left + 2 * MiB),
                   "alloc", str(left), "used", "0", **env)  # fmt: skip
        # before: free was 360 MiB and the fake GPU then held 1448 MiB under a 1 GiB limit
        assert out[2:] == [
            f"meminfo 0 free={left} total={lim}",
            f"alloc {left + 2 * MiB} {OOM}",
            f"alloc {left} 0",
            # A's 576 MiB + B's 512 MiB context + 148 MiB: B's own excess (212 MiB) was not
            # known yet - the overshoot left is one reconcile period's new contexts
            f"used 0 {real + 64 * MiB + real + left}",
        ]
        a.next()
