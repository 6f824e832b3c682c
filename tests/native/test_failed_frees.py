"""A claim is credited only after the driver's free succeeded.

The fake driver's ``FAKE_FAIL_FREE=WHICH:N`` makes the first N calls of this process to the
named entry points fail with ``CUDA_ERROR_ILLEGAL_ADDRESS`` (700) and leave the memory held.
For every route family the library tracks, each test fills most of a 64 MiB limit, frees it
with the driver failing (the caller gets 700, the region still shows the bytes, a further
allocation past the limit is refused before it reaches the driver), then frees it again with the
driver succeeding (credited to the byte, the same allocation now fits). The region is read by
the Python reader while the process is alive and holding the memory (``Stepped``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from native_helpers import UUIDS, Build, Claim, MiB, Stepped

from tessera.enforcement.limits import GpuLimit
from tessera.enforcement.region import read_region

pytestmark = pytest.mark.native

OOM = 2
ILLEGAL_ADDRESS = 700  # what FAKE_FAIL_FREE makes the driver return
LIM = 64 * MiB
HELD = 48 * MiB  # what the test allocates and then frees
MORE = 32 * MiB  # does not fit next to HELD; fits once HELD is credited


def claim(tmp: Path, build: Build, overhead: int = 0) -> Claim:
    return Claim(tmp, build, [GpuLimit(UUIDS[0], LIM, 0)], context_overhead=overhead)


def region_used(c: Claim) -> int:
    return read_region(c.region).used(UUIDS[0])


def meminfo(used: int) -> str:
    return f"meminfo 0 free={LIM - used} total={LIM}"


def refused_while_held(held: int, calls: int) -> list[str]:
    """Output of AFTER_FAILED: the claim still holds ``held``, so MORE is refused before it
    reaches the driver (which has seen ``calls`` cuMemAlloc_v2 calls, all before the free)."""
    return [
        meminfo(held),
        f"nvml 0 total={LIM} used={held} free={LIM - held}",
        f"alloc {MORE} {OOM}",
        f"calls cuMemAlloc_v2 {calls}",
    ]


AFTER_FAILED = ["meminfo", "nvml", "0", "alloc", str(MORE), "calls", "cuMemAlloc_v2"]
AFTER_CREDIT = ["meminfo", "used", "0"]
ALLOC_AGAIN = ["alloc", str(MORE), "meminfo", "used", "0"]


def check_sequence(
    c: Claim,
    allocate: list[str],
    free: list[str],
    knob: str,
    failed: list[str],
    held: int,
    calls: int = 0,
) -> list[str]:
    """Allocate ``held`` bytes, free them with the first free failing, free them again, allocate
    MORE. Returns the output of the allocation stage; asserts everything after it."""
    with Stepped(
        c,
        "link",
        ["init", "dev", "0", *allocate, "used", "0"],
        [*free, *AFTER_FAILED, "used", "0"],
        [*free, *AFTER_CREDIT],
        ALLOC_AGAIN,
        FAKE_FAIL_FREE=knob,
    ) as s:
        first = s.next()
        assert first[-1] == f"used 0 {held}"  # what the fake GPU holds
        assert region_used(c) == held
        # the driver's free fails: its error comes back, nothing is credited
        assert s.next() == [*failed, *refused_while_held(held, calls), f"used 0 {held}"]
        assert region_used(c) == held
        # the driver's free succeeds: credited to the byte
        freed = [line.replace(str(ILLEGAL_ADDRESS), "0") for line in failed]
        assert s.next() == [*freed, meminfo(0), "used 0 0"]
        assert region_used(c) == 0
        assert s.next() == [f"alloc {MORE} 0", meminfo(MORE), f"used 0 {MORE}"]
    return first


def test_a_failed_cuMemFree_is_not_credited(tmp_path: Path, anybuild: Build) -> None:
    c = claim(tmp_path, anybuild)
    first = check_sequence(
        c,
        ["alloc", str(HELD)],
        ["free"],
        "cuMemFree_v2:1",
        [f"free {ILLEGAL_ADDRESS}"],
        HELD,
        calls=1,
    )
    assert first[2] == f"alloc {HELD} 0"


def test_a_failed_pitch_and_managed_free_is_not_credited(tmp_path: Path, plain: Build) -> None:
    c = claim(tmp_path, plain)
    # 4096 x 4096 rows (pitch 4096) + 32 MiB managed = 48 MiB, freed newest first
    check_sequence(
        c,
        ["pitch", "4096", "4096", "4", "managed", str(32 * MiB)],
        ["free", "free"],
        "cuMemFree_v2:2",
        [f"free {ILLEGAL_ADDRESS}", f"free {ILLEGAL_ADDRESS}"],
        HELD,
    )


@pytest.mark.parametrize("kind", ["alloc", "managed-pool"])
def test_a_failed_cuMemFreeAsync_is_not_credited(tmp_path: Path, plain: Build, kind: str) -> None:
    """Allocations charged one by one and freed with cuMemFreeAsync: a cuMemAlloc, and an
    allocation from a managed pool."""
    c = claim(tmp_path, plain)
    allocate = (
        ["alloc", str(HELD)]
        if kind == "alloc"
        else ["getpool", "managed", "palloc", "0", str(HELD)]
    )
    # after the successful free, a stream synchronize: the credit waits for the stream
    check_sequence(
        c,
        allocate,
        ["afree", "ssync"],
        "cuMemFreeAsync:1",
        [f"afree {ILLEGAL_ADDRESS}", "ssync 0"],
        HELD,
        calls=int(kind == "alloc"),
    )


@pytest.mark.parametrize("trim", ["trim", "pdestroy"])
def test_a_pool_whose_trim_or_destroy_fails_stays_charged(
    tmp_path: Path, plain: Build, trim: str
) -> None:
    """A device pool is charged its reserve; the reserve goes back only through the driver's
    cuMemPoolTrimTo / cuMemPoolDestroy, and stays charged while those fail."""
    c = claim(tmp_path, plain)
    knob = "cuMemPoolTrimTo:1" if trim == "trim" else "cuMemPoolDestroy:1"
    release = ["trim", "0", "0"] if trim == "trim" else ["pdestroy", "0"]
    first = check_sequence(
        c,
        ["poolcreate", "dev", "palloc", "0", str(HELD), "pfree"],
        release,
        knob,
        [f"{trim} {ILLEGAL_ADDRESS}"],
        HELD,
    )
    # the allocation went back to the pool's reserve, which the claim is still charged
    assert first[2:] == ["poolcreate 0 p0", f"palloc {HELD} 0", "pfree 0", f"used 0 {HELD}"]


def test_a_failed_cuMemRelease_is_not_credited(tmp_path: Path, anybuild: Build) -> None:
    c = claim(tmp_path, anybuild)
    check_sequence(
        c, ["vmm", str(HELD)], ["free"], "cuMemRelease:1", [f"free {ILLEGAL_ADDRESS}"], HELD
    )


def test_a_failed_cuMemUnmap_keeps_the_allocation_charged(tmp_path: Path, plain: Build) -> None:
    """NVIDIA's sample idiom: create, map, release the handle; the last unmap frees."""
    c = claim(tmp_path, plain)
    first = check_sequence(
        c,
        ["reserve", str(LIM), "create", str(HELD), "dev", "map", "0", "vrelease", "0"],
        ["unmap", "0"],
        "cuMemUnmap:1",
        [f"unmap {ILLEGAL_ADDRESS}"],
        HELD,
    )
    assert first[2:] == ["reserve 0", "create 0 h0", "map 0 m0", "vrelease 0", f"used 0 {HELD}"]


def test_a_failed_cuMulticastUnbind_keeps_the_allocation_charged(
    tmp_path: Path, plain: Build
) -> None:
    c = claim(tmp_path, plain)
    first = check_sequence(
        c,
        ["create", str(HELD), "dev", "mc", str(HELD), "mcbind", "1", "0", "vrelease", "0"],
        ["mcunbind", "1"],
        "cuMulticastUnbind:1",
        [f"mcunbind {ILLEGAL_ADDRESS}"],
        HELD,
    )
    assert first[2:] == ["create 0 h0", "mc 0 h1", "mcbind 0", "vrelease 0", f"used 0 {HELD}"]


def test_a_failed_graph_memory_trim_keeps_the_graph_pool_charged(
    tmp_path: Path, plain: Build
) -> None:
    """Graph memory is charged at the graph pool's reserve, which only cuDeviceGraphMemTrim
    (or the context going) gives back."""
    c = claim(tmp_path, plain)
    first = check_sequence(
        c,
        [
            "gcreate",
            "galloc",
            "0",
            str(HELD),
            "ginst",
            "0",
            "0",
            "glaunch",
            "0",
            "gfreeptr",
            "0",
            "gmem",
        ],
        ["gtrim"],
        "cuDeviceGraphMemTrim:1",
        [f"gtrim {ILLEGAL_ADDRESS}"],
        HELD,
    )
    # freed back into the graph pool, which still reserves it
    assert first[2:] == [
        "gcreate 0 g0",
        "galloc 0",
        "ginst 0 e0",
        "glaunch 0",
        "gfreeptr 0",
        f"gmem 0 used=0 reserved={HELD}",
        f"used 0 {HELD}",
    ]


@pytest.mark.parametrize("kind", ["array", "array3d", "mipmap"])
def test_a_failed_array_destroy_is_not_credited(tmp_path: Path, plain: Build, kind: str) -> None:
    c = claim(tmp_path, plain)
    # float elements: 4 bytes each
    allocate, knob, held = {
        "array": (["array", "4096", "3072"], "cuArrayDestroy:1", 4 * 4096 * 3072),
        "array3d": (["array3d", "256", "256", "192"], "cuArrayDestroy:1", 4 * 256 * 256 * 192),
        "mipmap": (
            ["mipmap", "4096", "2048", "3"],
            "cuMipmappedArrayDestroy:1",
            4 * (4096 * 2048 + 2048 * 1024 + 1024 * 512),
        ),
    }[kind]
    assert held > LIM - MORE  # so MORE does not fit while it is held
    check_sequence(c, allocate, ["free"], knob, [f"free {ILLEGAL_ADDRESS}"], held)


def test_a_failed_context_destroy_keeps_the_context_and_its_allocations_charged(
    tmp_path: Path, plain: Build
) -> None:
    ovh = 4 * MiB
    c = claim(tmp_path, plain, overhead=ovh)
    # the primary context (dev 0) and a created one are charged ovh each; 40 MiB in the latter
    held = 2 * ovh + 40 * MiB
    with Stepped(
        c,
        "link",
        ["init", "dev", "0", "ctx", "0", "alloc", str(40 * MiB), "used", "0"],
        ["destroyctx", "dev", "0", *AFTER_FAILED, "used", "0"],
        ["destroyctx", *AFTER_CREDIT],
        ALLOC_AGAIN,
        FAKE_FAIL_FREE="cuCtxDestroy_v2:1",
    ) as s:
        assert s.next()[2:] == ["ctx 0 0", f"alloc {40 * MiB} 0", f"used 0 {40 * MiB}"]
        assert region_used(c) == held
        assert s.next() == [
            f"destroyctx {ILLEGAL_ADDRESS}",
            "dev 0 0",
            *refused_while_held(held, 1),
            f"used 0 {40 * MiB}",
        ]
        assert region_used(c) == held
        # destroyed for real: the context, and the allocation it owned, are credited
        assert s.next() == ["destroyctx 0", meminfo(ovh), "used 0 0"]
        assert region_used(c) == ovh
        assert s.next() == [f"alloc {MORE} 0", meminfo(ovh + MORE), f"used 0 {MORE}"]


def test_a_failed_free_keeps_the_allocation_with_its_own_context(
    tmp_path: Path, plain: Build
) -> None:
    """An allocation of the primary context, freed with cuMemFreeAsync while another context is
    current: the free fails, the other context is destroyed. The allocation still belongs to
    the primary context, in the driver and in the claim, until that one goes. (The library
    used to record it again under the stream's context, and credited it with that context.)"""
    c = claim(tmp_path, plain)
    with Stepped(
        c,
        "link",
        [
            "init",
            "dev",
            "0",
            "alloc",
            str(HELD),
            "ctx",
            "0",
            "afree",
            "destroyctx",
            "dev",
            "0",
            *AFTER_FAILED,
            "used",
            "0",
        ],
        ["release", "0", "release", "0", "dev", "0", *AFTER_CREDIT],
        ALLOC_AGAIN,
        FAKE_FAIL_FREE="cuMemFreeAsync:1",
    ) as s:
        assert s.next()[2:] == [
            f"alloc {HELD} 0",
            "ctx 0 0",
            f"afree {ILLEGAL_ADDRESS}",
            "destroyctx 0",
            "dev 0 0",
            *refused_while_held(HELD, 1),
            f"used 0 {HELD}",
        ]
        assert region_used(c) == HELD
        # the primary context goes (retained twice, released twice), and its allocation with it
        assert s.next() == ["release 0 0", "release 0 0", "dev 0 0", meminfo(0), "used 0 0"]
        assert region_used(c) == 0
        assert s.next() == [f"alloc {MORE} 0", meminfo(MORE), f"used 0 {MORE}"]
