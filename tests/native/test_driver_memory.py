"""Memory the driver takes by itself (docs/enforcement.md section 4.6, section 6 route 6).

The fake driver takes device memory for ``cuMemAlloc`` and its kin in pages of its allocation
granularity (2 MiB), as the real one does, whatever the library charges: an allocation of
2 MiB + 1 byte holds 4 MiB of the GPU. The library charges whole pages, so a claim's charge and
what the GPU holds for it agree and the limit holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from native_helpers import UUIDS, Build, Claim, MiB

from tessera.enforcement.limits import GpuLimit

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
