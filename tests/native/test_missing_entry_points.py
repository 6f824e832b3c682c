"""Routes the library cannot account on a driver that lacks an entry point it needs.

``fake-old/libcuda.so.1`` is the fake driver built without ``cuGraphGetNodes``,
``cuMemPoolGetAttribute`` and ``cuDeviceGetMemPool`` (``-DFAKE_OLD_DRIVER``). Graph memory
nodes then cannot be found, and neither can a stream-ordered allocation's pool or its reserve:
the library refuses those calls (``CUDA_ERROR_NOT_SUPPORTED``, one stderr line saying which
entry point is missing) instead of charging nothing. Before, a graph's memory nodes went
uncharged and the fake GPU held more than the limit (docs/enforcement.md section 4.1).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from native_helpers import UUIDS, Build, Claim, MiB

from tessera.enforcement.limits import GpuLimit

pytestmark = pytest.mark.native

OOM = 2
REFUSED = 801  # CUDA_ERROR_NOT_SUPPORTED


def _old(c: Claim) -> dict[str, str]:
    """Environment of a process on the older driver (its NVML is the usual fake's)."""
    return {"LD_LIBRARY_PATH": f"{c.build.root / 'fake-old'}:{c.build.fake}"}


def test_the_old_driver_lacks_the_entry_points(tmp_path: Path, plain: Build) -> None:
    """The variant really is missing them (else the tests below prove nothing)."""
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], 8 * MiB, 0)])
    out = c.tp(
        "dlsym", "init", "procmatch", "cuGraphGetNodes", "cuGraphGetNodes", "12000", "0", **_old(c)
    )
    assert out == ["init 0", "procmatch cuGraphGetNodes 500 other"]  # CUDA_ERROR_NOT_FOUND


def test_graph_memory_nodes_are_refused_without_cuGraphGetNodes(
    tmp_path: Path, plain: Build
) -> None:
    lim = 8 * MiB
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], lim, 0)])
    cmds = ["init", "dev", "0", "alloc", str(4 * MiB), "gcreate", "galloc", "0", str(6 * MiB)]
    cmds += ["ginst", "0", "0", "glaunch", "0", "used", "0", "peak", "0"]
    r = c.run("tp_cuda", "dlsym", *cmds, **_old(c))
    out = r.stdout.splitlines()
    # before: "ginst 0 e0", "glaunch 0" and the fake GPU held 10 MiB under an 8 MiB limit
    assert out[2:6] == [f"alloc {4 * MiB} 0", "gcreate 0 g0", "galloc 0", f"ginst {REFUSED} e-1"]
    assert out[-2:] == [f"used 0 {4 * MiB}", f"peak 0 {4 * MiB}"]
    assert "graph instantiation refused: the driver lacks cuGraphGetNodes" in r.stderr
    # the same commands on the full fake driver still instantiate and charge (control)
    out = c.tp("dlsym", *cmds[:-4], "meminfo")
    assert out[5:] == ["ginst 0 e0", f"glaunch {OOM}", f"meminfo 0 free={4 * MiB} total={lim}"]


def test_stream_ordered_allocations_are_refused_without_the_pool_queries(
    tmp_path: Path, plain: Build
) -> None:
    lim = 8 * MiB
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], lim, 0)])
    r = c.run(
        "tp_cuda",
        "dlsym",
        "init",
        "dev",
        "0",
        "async",
        str(6 * MiB),
        "async",
        str(6 * MiB),
        "poolcreate",
        "dev",
        "palloc",
        "0",
        str(6 * MiB),
        "used",
        "0",
        **_old(c),
    )
    out = r.stdout.splitlines()
    # before: both cuMemAllocAsync calls passed uncharged (12 MiB held under 8 MiB)
    assert out[2:] == [
        f"async {6 * MiB} {REFUSED}",
        f"async {6 * MiB} {REFUSED}",
        "poolcreate 0 p0",
        f"palloc {6 * MiB} {REFUSED}",
        "used 0 0",
    ]
    assert "cuMemAllocAsync refused: the driver lacks cuDeviceGetMemPool" in r.stderr
    assert "cuMemAllocFromPoolAsync refused: the pool's reserve cannot be read" in r.stderr
