"""Memory the driver takes by itself (docs/enforcement.md section 4.6, section 6 route 6).

The fake driver takes device memory for ``cuMemAlloc`` and its kin in pages of its allocation
granularity (2 MiB), as the real one does, whatever the library charges: an allocation of
2 MiB + 1 byte holds 4 MiB of the GPU. The library charges whole pages, so a claim's charge and
what the GPU holds for it agree and the limit holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from native_helpers import UUIDS, Build, Claim, GiB, MiB, Stepped

from tessera.enforcement.limits import DEFAULT_CONTEXT_OVERHEAD, GpuLimit, allocatable
from tessera.enforcement.region import read_region

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


def _gap(c: Claim, cmds: list[str], **env: str) -> tuple[int, int]:
    """(the claim's charge, the driver's per-process figure) of one process that ran cmds on
    GPU 0 and holds what it allocated: the fake's NVML figure comes from what the fake itself
    handed out (contexts, pages, reserves), never from the library's bookkeeping."""
    with Stepped(
        c, "link", ["init", "dev", "0", *cmds, "nvmlproc", "0"], ["used", "0"], **env
    ) as p:
        out = p.next()
        charged = read_region(c.region).used(UUIDS[0])
        driver = int(out[-1].split("used=")[1])
        assert out[-1].startswith("nvmlproc 0 ")
        p.next()
    return charged, driver


def test_the_charge_against_the_drivers_per_process_figure(tmp_path: Path, plain: Build) -> None:
    """How close the library's charge comes to what the driver reports for the process
    (docs/enforcement.md 4.6). Large allocations, pools, VMM and graph memory agree to the
    byte; what remains is the shared pages of small allocations and any difference between
    the limits file's context-overhead and what a context really takes."""
    ctx = 300 * MiB
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], 4 * GiB, 0)], context_overhead=ctx)
    large = [x for _ in range(10) for x in ("alloc", str(3 * MiB))]  # 4 MiB each, held
    pools = ["async", "5000000", "vmm", str(2 * MiB), "gcreate", "galloc", "0", str(6 * MiB)]
    pools += ["ginst", "0", "0", "glaunch", "0"]
    charged, driver = _gap(c, large + pools, FAKE_CTX_BYTES=str(ctx))
    assert charged == driver == ctx + 10 * 4 * MiB + 6 * MiB + 2 * MiB + 6 * MiB
    # 200 allocations of 10 KiB and 20 of 200 KiB: 6 MiB charged, packed into shared pages
    small = [x for _ in range(200) for x in ("alloc", str(10 * 1024))]
    small += [x for _ in range(20) for x in ("alloc", str(200 * 1024))]
    charged, driver = _gap(c, small, FAKE_CTX_BYTES=str(ctx))
    assert charged == ctx + 200 * 10 * 1024 + 20 * 200 * 1024
    assert driver == ctx + 3 * PAGE  # 2000 KiB in one 2 MiB page, 4000 KiB in two (10 a page)
    assert driver - charged == 147456  # 144 KiB uncharged: 0.05 % of the process's figure
    # a context that takes more than the limits file says (a GPU of its own: the fake reads
    # FAKE_CTX_BYTES when its state is made): the difference is uncharged
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], 4 * GiB, 0)], ctx, tmp_path / "gpu2", "c2")
    charged, driver = _gap(c, ["alloc", str(64 * MiB)], FAKE_CTX_BYTES=str(ctx + 212 * MiB))
    assert (charged, driver) == (ctx + 64 * MiB, ctx + 212 * MiB + 64 * MiB)
