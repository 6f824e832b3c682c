"""Memory the driver takes by itself (docs/enforcement.md section 4.6, section 6 route 6).

The fake driver takes device memory for ``cuMemAlloc`` and its kin in pages of its allocation
granularity (2 MiB), as the real one does, whatever the library charges: an allocation of
2 MiB + 1 byte holds 4 MiB of the GPU. The library charges whole pages, so a claim's charge and
what the GPU holds for it agree and the limit holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from native_helpers import UUIDS, Build, Claim, GiB, MiB

from tessera.enforcement.limits import DEFAULT_CONTEXT_OVERHEAD, GpuLimit, allocatable

pytestmark = pytest.mark.native

OOM = 2
PAGE = 2 * MiB  # the fake's allocation granularity (cuMemGetAllocationGranularity)


def test_allocations_are_charged_whole_pages_of_the_granularity(
    tmp_path: Path, anybuild: Build
) -> None:
    lim = 10 * MiB
    c = Claim(tmp_path, anybuild, [GpuLimit(UUIDS[0], lim, 0)])
    odd = PAGE + 1
    cmds = ["init", "dev", "0"]
    cmds += ["alloc", str(odd), "meminfo", "used", "0"]
    cmds += ["pitch", "1000", "512", "1", "meminfo", "used", "0"]
    cmds += ["alloc", str(odd), "alloc", str(odd), "used", "0", "peak", "0", "freeall", "used", "0"]
    out = c.tp("link", *cmds)
    # before: the charge was the size asked for (2 MiB + 1 charged, 4 MiB held), the third
    # allocation fitted too and the fake GPU held 14 MiB under a 10 MiB limit
    assert out[2:] == [
        f"alloc {odd} 0",
        f"meminfo 0 free={lim - 2 * PAGE} total={lim}",
        f"used 0 {2 * PAGE}",
        "pitch 0 pitch=1024",  # 1024 x 512 = 512 KiB: charged its size, held in a shared page
        f"meminfo 0 free={lim - 2 * PAGE - 512 * 1024} total={lim}",
        f"used 0 {3 * PAGE}",
        f"alloc {odd} 0",
        f"alloc {odd} {OOM}",
        f"used 0 {5 * PAGE}",
        f"peak 0 {5 * PAGE}",
        "freeall 0",
        "used 0 0",
    ]


def test_a_share_holds_its_memory_contexts_included(tmp_path: Path, plain: Build) -> None:
    """docs/enforcement.md 4.5: a share's memory is its whole footprint on the GPU. The limits
    file the driver writes charges each CUDA context the default context-overhead; a process
    of an 8 GiB share sees (and can allocate) what ``allocatable`` says - the figure
    ``tessera simulate`` reports - and the fake GPU then holds exactly 8 GiB for it."""
    lim = 8 * GiB
    ovh = DEFAULT_CONTEXT_OVERHEAD
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], lim, 0)], context_overhead=ovh)
    left = allocatable(lim, ovh)
    assert left == lim - 512 * MiB
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "meminfo",
        "alloc",
        str(left),
        "alloc",
        str(PAGE),
        "used",
        "0",
        FAKE_CTX_BYTES=str(ovh),  # the driver takes that much for the context itself
    )
    assert out[2:] == [
        f"meminfo 0 free={left} total={lim}",
        f"alloc {left} 0",
        f"alloc {PAGE} {OOM}",
        f"used 0 {lim}",
    ]
