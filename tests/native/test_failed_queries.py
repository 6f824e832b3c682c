"""A reserve the driver cannot report stays charged.

Device pools and graph pools are charged what the driver reports they reserve
(``CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT``, ``CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT``). After a
kernel fault a real driver fails every later call with ``CUDA_ERROR_ILLEGAL_ADDRESS`` (700, a
"sticky" error) while the process keeps its memory until it exits; NVML still answers. A
reading that fails must not be taken for "0 bytes reserved": the library used to credit a pool's
whole charge then (at a memory query, before a refusal, after a synchronize, after a context
went), and another process of the claim could allocate past the limit.

The fake driver's ``FAKE_FAULT=WHICH`` makes the process's first kernel launch fault: from then
on every call to the entry points in WHICH fails with 700 (``all``: as a real driver does; a
list of names: only those, e.g. only the reserve queries). Each test fills most of a 64 MiB
limit in a process, faults it, makes it run the accounting path under test, and then checks
with the process alive and holding its memory: the claim's region still shows every byte the
fake GPU holds for it, and a second process of the claim is refused an allocation that does
not fit next to it, before the driver sees it. Once the faulted process exits, its slot goes,
and the claim is charged nothing. (The fake GPU does not model the release of a dead process's
memory, so it is not asked again then.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from native_helpers import UUIDS, Build, Claim, MiB, Stepped

from tessera.enforcement.limits import GpuLimit
from tessera.enforcement.region import read_region

pytestmark = pytest.mark.native

OOM = 2
ILLEGAL_ADDRESS = 700  # what FAKE_FAULT makes the driver return
LIM = 64 * MiB
HELD = 48 * MiB  # what the faulted process holds (a multiple of the fake's 2 MiB chunk)
MORE = 32 * MiB  # does not fit next to HELD; fits once HELD is gone
RESERVE_QUERIES = "cuMemPoolGetAttribute,cuDeviceGetGraphMemAttribute"

# what the faulted process allocates: from a pool it created, from the default pool, as graph
# memory, as a VMM allocation; each leaves HELD in use (no free)
ALLOCATE = {
    "pool": ["poolcreate", "dev", "palloc", "0", str(HELD)],
    "default-pool": ["async", str(HELD)],
    "graph": ["gcreate", "galloc", "0", str(HELD), "ginst", "0", "0", "glaunch", "0"],
    "vmm": ["create", str(HELD), "dev"],
}
FAULT = ["launch", "1", "1"]  # the first launch faults (FAKE_FAULT)


def claim(tmp: Path, build: Build) -> Claim:
    return Claim(tmp, build, [GpuLimit(UUIDS[0], LIM, 0)])


def region_used(c: Claim) -> int:
    return read_region(c.region).used(UUIDS[0])


def nvml(used: int) -> str:
    return f"nvml 0 total={LIM} used={used} free={LIM - used}"


def second_process(c: Claim) -> list[str]:
    """Another process of the claim asks for MORE; returns its output after init/dev."""
    out = c.tp(
        "link", "init", "dev", "0", "alloc", str(MORE), "calls", "cuMemAlloc_v2", "used", "0"
    )
    assert out[:2] == ["init 0", "dev 0 0"]
    return out[2:]


# the second process is refused before its allocation reaches the driver
REFUSED = [f"alloc {MORE} {OOM}", "calls cuMemAlloc_v2 0", f"used 0 {HELD}"]


def run_faulted(c: Claim, allocate: list[str], after_fault: list[str], knob: str) -> list[str]:
    """Allocate (HELD must be charged and held), fault, run ``after_fault``; then, with the
    process alive, check the region still charges HELD and a second process is refused; let
    the process exit and check its charge went with it. Returns the faulted stage's output."""
    with Stepped(
        c,
        "link",
        ["init", "dev", "0", *allocate, "used", "0"],
        [*FAULT, *after_fault, "used", "0"],
        [],
        FAKE_FAULT=knob,
    ) as s:
        first = s.next()
        assert first[-1] == f"used 0 {HELD}"  # what the fake GPU holds
        assert region_used(c) == HELD
        second = s.next()
        assert second[0] == "launch 0"  # the faulting launch itself succeeds
        assert second[-1] == f"used 0 {HELD}"  # the faulted process still holds it all
        assert region_used(c) == HELD
        assert second_process(c) == REFUSED
        assert region_used(c) == HELD
        assert s.next() == []  # the faulted process exits: its slot goes with it
    assert region_used(c) == 0
    return second


# ---- a faulted process: every later call fails with 700 --------------------------------


@pytest.mark.parametrize("kind", ["pool", "default-pool", "graph"])
def test_a_faulted_process_keeps_its_reserve_charged_through_nvml(
    tmp_path: Path, anybuild: Build, kind: str
) -> None:
    """NVML answers in a faulted process; its memory query brings the process's pools to the
    driver's figures, which now cannot be read. (The pool routes used to credit HELD here.)"""
    c = claim(tmp_path, anybuild)
    second = run_faulted(c, ALLOCATE[kind], ["nvml", "0"], "all")
    assert second[1:-1] == [nvml(HELD)]


@pytest.mark.parametrize("kind", ["pool", "graph"])
def test_a_faulted_process_is_refused_without_crediting_its_reserve(
    tmp_path: Path, plain: Build, kind: str
) -> None:
    """An allocation that does not fit brings the pools to the driver's figures before it is
    refused. (The library used to credit the pool, charge the allocation in its place, get 700
    from the driver and undo only the allocation's charge.)"""
    c = claim(tmp_path, plain)
    second = run_faulted(c, ALLOCATE[kind], ["alloc", str(MORE), "calls", "cuMemAlloc_v2"], "all")
    assert second[1:-1] == [f"alloc {MORE} {OOM}", "calls cuMemAlloc_v2 0"]


@pytest.mark.parametrize(
    "call,line",
    [
        (["meminfo"], f"meminfo {ILLEGAL_ADDRESS} free=0 total=0"),
        (["sync"], f"sync {ILLEGAL_ADDRESS}"),
        (["ssync"], f"ssync {ILLEGAL_ADDRESS}"),
        (["trim", "0", "0"], f"trim {ILLEGAL_ADDRESS}"),
        (["pdestroy", "0"], f"pdestroy {ILLEGAL_ADDRESS}"),
        (["reserved", "0"], f"reserved {ILLEGAL_ADDRESS} 0"),
    ],
    ids=["meminfo", "sync", "ssync", "trim", "pdestroy", "reserved"],
)
def test_a_faulted_process_whose_calls_fail_keeps_its_pool_charged(
    tmp_path: Path, plain: Build, call: list[str], line: str
) -> None:
    """The routes where the failing call is the driver's own: cuMemGetInfo, the synchronizes
    after which pools are read again, trim and destroy fail before the library reads anything."""
    c = claim(tmp_path, plain)
    second = run_faulted(c, ALLOCATE["pool"], call, "all")
    assert second[1:-1] == [line]


def test_a_faulted_process_keeps_its_graph_pool_charged_through_trim_and_destroy(
    tmp_path: Path, plain: Build
) -> None:
    c = claim(tmp_path, plain)
    second = run_faulted(c, ALLOCATE["graph"], ["gtrim", "gdestroy", "0", "nvml", "0"], "all")
    assert second[1:-1] == [f"gtrim {ILLEGAL_ADDRESS}", f"gdestroy {ILLEGAL_ADDRESS}", nvml(HELD)]


# ---- only the reserve queries fail -------------------------------------------------------


@pytest.mark.parametrize("sync", ["sync", "ssync"])
def test_a_synchronize_with_an_unreadable_reserve_credits_nothing(
    tmp_path: Path, plain: Build, sync: str
) -> None:
    """The synchronize succeeds and the pool, above its release threshold (0), is read again:
    the reading fails. The allocation is live, so the pool still reserves HELD. (The library
    used to credit HELD here.)"""
    c = claim(tmp_path, plain)
    second = run_faulted(c, ALLOCATE["pool"], [sync], RESERVE_QUERIES)
    assert second[1:-1] == [f"{sync} 0"]


@pytest.mark.parametrize("kind", ["pool", "default-pool", "graph"])
def test_a_memory_query_with_an_unreadable_reserve_credits_nothing(
    tmp_path: Path, anybuild: Build, kind: str
) -> None:
    """cuMemGetInfo succeeds, the reserve reading does not."""
    c = claim(tmp_path, anybuild)
    second = run_faulted(c, ALLOCATE[kind], ["meminfo"], RESERVE_QUERIES)
    assert second[1:-1] == [f"meminfo 0 free={LIM - HELD} total={LIM}"]


@pytest.mark.parametrize(
    "kind,trim", [("pool", ["trim", "0", "0"]), ("graph", ["gtrim"])], ids=["pool", "graph"]
)
def test_a_trim_with_an_unreadable_reserve_credits_nothing(
    tmp_path: Path, plain: Build, kind: str, trim: list[str]
) -> None:
    """cuMemPoolTrimTo / cuDeviceGraphMemTrim succeed (the memory is in use: nothing goes), the
    reading after them fails."""
    c = claim(tmp_path, plain)
    second = run_faulted(c, ALLOCATE[kind], trim, RESERVE_QUERIES)
    assert second[1:-1] == [f"{trim[0]} 0"]


@pytest.mark.parametrize(
    "kind,call,line",
    [
        ("pool", ["palloc", "0", str(2 * MiB)], f"palloc {2 * MiB} 801"),
        ("graph", ["glaunch", "0"], "glaunch 801"),
    ],
    ids=["pool", "graph"],
)
def test_an_allocation_with_an_unreadable_reserve_is_refused(
    tmp_path: Path, plain: Build, kind: str, call: list[str], line: str
) -> None:
    """How much an allocation from a pool, or a graph launch, may grow the reserve cannot be
    bounded without reading it: refused (CUDA_ERROR_NOT_SUPPORTED, with a line on stderr)
    before the driver sees it, nothing charged or credited."""
    c = claim(tmp_path, plain)
    entry = "cuMemAllocFromPoolAsync" if kind == "pool" else "cuGraphLaunch"
    second = run_faulted(c, ALLOCATE[kind], [*call, "calls", entry], RESERVE_QUERIES)
    assert second[1:-1] == [line, f"calls {entry} 1"]  # the call before the fault


# ---- a context goes while the driver cannot answer ---------------------------------------


@pytest.mark.parametrize(
    "kind,knob",
    [
        ("pool", "cuMemPoolGetAttribute"),
        ("graph", "cuDeviceGetGraphMemAttribute"),
        ("vmm", "cuMemGetAllocationPropertiesFromHandle"),
    ],
    ids=["pool", "graph", "vmm"],
)
def test_a_destroyed_context_credits_nothing_the_driver_cannot_report(
    tmp_path: Path, plain: Build, kind: str, knob: str
) -> None:
    """Another context of the device is created and destroyed (the driver succeeds): the
    library reads the device's pools, graph pool and VMM handles again to see what went with
    it. The primary context still holds HELD, and the reading fails. (The library used to take
    a failed reading for "gone with the context" and credit HELD.)"""
    c = claim(tmp_path, plain)
    second = run_faulted(c, ALLOCATE[kind], ["ctx", "0", "destroyctx"], knob)
    assert second[1:-1] == ["ctx 0 0", "destroyctx 0"]
