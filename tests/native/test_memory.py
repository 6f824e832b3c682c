"""Memory enforcement on the fake driver: interception paths, every allocation kind, queries,
CUDA_VISIBLE_DEVICES, contexts, processes, threads, crashes."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
from native_helpers import PHYS, UUIDS, Build, Claim, GiB, MiB, wait_line

from tessera.enforcement.limits import GpuLimit
from tessera.enforcement.region import create_region, read_region, slot_alive

pytestmark = pytest.mark.native

OOM = 2
LIMIT = 100 * MiB
OVH = 2 * MiB  # a whole page of the driver's 2 MiB allocation granularity


@pytest.mark.parametrize("mode", ["link", "dlsym", "procaddr"])
def test_every_interception_path_enforces_and_reports(
    tmp_path: Path, anybuild: Build, mode: str
) -> None:
    c = Claim(tmp_path, anybuild, [GpuLimit(UUIDS[1], LIMIT, 0)], context_overhead=OVH)
    out = c.tp(
        mode,
        "init",
        "dev",
        "1",
        "meminfo",
        "alloc",
        str(60 * MiB),
        "alloc",
        str(60 * MiB),
        "calls",
        "cuMemAlloc_v2",
        "meminfo",
        "nvml",
        "1",
        "nvml2",
        "1",
        "nvml",
        "0",
        "totalmem",
        "1",
        "totalmem",
        "0",
        "used",
        "1",
        "freeall",
        "meminfo",
    )
    used = 60 * MiB + OVH
    assert out == [
        "init 0",
        "dev 1 0",
        f"meminfo 0 free={LIMIT - OVH} total={LIMIT}",
        f"alloc {60 * MiB} 0",
        f"alloc {60 * MiB} {OOM}",
        "calls cuMemAlloc_v2 1",  # the refused allocation never reached the driver
        f"meminfo 0 free={LIMIT - used} total={LIMIT}",
        f"nvml 0 total={LIMIT} used={used} free={LIMIT - used}",
        f"nvml2 0 total={LIMIT} used={used} free={LIMIT - used} reserved=0",
        f"nvml 0 total={PHYS} used=0 free={PHYS}",  # GPU 0 is not in the claim
        f"totalmem 0 {LIMIT}",
        f"totalmem 0 {PHYS}",
        f"used 1 {60 * MiB}",
        "freeall 0",
        f"meminfo 0 free={LIMIT - OVH} total={LIMIT}",
    ]


def test_without_the_library_nothing_is_limited(tmp_path: Path, plain: Build) -> None:
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[1], LIMIT, 0)])
    out = c.tp("link", "init", "dev", "1", "alloc", str(200 * MiB), "meminfo", preload=False)
    assert out[2:] == [f"alloc {200 * MiB} 0", f"meminfo 0 free={PHYS - 200 * MiB} total={PHYS}"]


def test_procaddr_pointers_unknown_to_dlsym_are_matched_by_name(
    tmp_path: Path, plain: Build
) -> None:
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], LIMIT, 0)])
    out = c.tp(
        "procaddr",
        "init",
        "dev",
        "0",
        "alloc",
        str(LIMIT + 1),
        "alloc",
        str(LIMIT),
        "calls",
        "cuMemAlloc_v2",
        "meminfo",
        FAKE_PROCADDR_TRAMPOLINE="1",
    )
    assert out[2:] == [
        f"alloc {LIMIT + 1} {OOM}",
        f"alloc {LIMIT} 0",
        "calls cuMemAlloc_v2 1",
        f"meminfo 0 free=0 total={LIMIT}",
    ]


def test_rtld_next_stays_relative_to_the_caller(tmp_path: Path, anybuild: Build) -> None:
    c = Claim(tmp_path, anybuild, [GpuLimit(UUIDS[0], LIMIT, 0)])
    assert c.tp("link", "rtldnext") == ["rtldnext same"]


def test_every_allocation_kind_is_charged_and_credited(tmp_path: Path, anybuild: Build) -> None:
    lim = 64 * MiB
    c = Claim(tmp_path, anybuild, [GpuLimit(UUIDS[0], lim, 0)])
    chunk = 2 * MiB  # stream-ordered pools reserve in 2 MiB chunks on the fake driver
    steps = [
        (["alloc", "1000000"], 1000000),
        (["managed", "2000000"], 2000000),
        (["pitch", "1000", "100", "4"], 1024 * 100),
        # the default pool's reserve grows to cover what is in use: 3000000 -> 2 chunks
        (["async", "3000000"], 2 * chunk),
        (["pool", "4000000"], 2 * chunk),  # same pool: 7000000 in use, 4 chunks reserved
        (["mkpool", "5000000"], 3 * chunk),  # a pool of its own
        (["vmm", str(2 * MiB)], 2 * MiB),
        (["array", "1024", "256"], 4 * 1024 * 256),
        (["array3d", "64", "64", "64"], 4 * 64 * 64 * 64),
        (["mipmap", "256", "256", "3"], 4 * (256 * 256 + 128 * 128 + 64 * 64)),
    ]
    cmds = ["init", "dev", "0"]
    for args, _ in steps:
        cmds += [*args, "meminfo"]
    cmds += ["used", "0", "freeall", "meminfo", "sync", "meminfo", "used", "0"]
    out = c.tp("link", *cmds)
    total = 0
    i = 2
    for args, nbytes in steps:
        total += nbytes
        assert out[i].split()[-1] == "0" or out[i].startswith(("pitch 0", "array", "mipmap")), out[
            i
        ]
        assert out[i + 1] == f"meminfo 0 free={lim - total} total={lim}", (args, out[i + 1])
        i += 2
    # The fake driver holds what was charged, except that the six allocations smaller than its
    # 2 MiB page share pages (512-byte aligned, first fit): 5543616 bytes charged, three pages
    # held. The difference is what the reconciliation with NVML's per-process figure covers.
    small = sum(
        n
        for args, n in steps
        if args[0] in ("alloc", "managed", "pitch", "array", "array3d", "mipmap")
    )
    assert small == 5543616
    assert out[i] == f"used 0 {total - small + 3 * chunk}"
    reserves = 7 * chunk  # freed pool allocations go back to their pools' reserves
    assert out[i + 1 :] == [
        "freeall 0",
        f"meminfo 0 free={lim - reserves} total={lim}",
        "sync 0",
        f"meminfo 0 free={lim} total={lim}",
        "used 0 0",
    ]


def test_pitch_settles_on_the_real_pitch(tmp_path: Path, plain: Build) -> None:
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], 1 * MiB, 0)])
    # the fake pads rows to 2048: charge goes from the 512-padded estimate to pitch*height
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "pitch",
        "1000",
        "100",
        "4",
        "meminfo",
        "pitch",
        "1000",
        "500",
        "4",
        "meminfo",
        "calls",
        "cuMemFree_v2",
        FAKE_PITCH_ALIGN="2048",
    )
    assert out[2:] == [
        "pitch 0 pitch=2048",
        f"meminfo 0 free={MiB - 204800} total={MiB}",
        # 1024*500 fits the estimate, 2048*500 does not: freed again and refused
        f"pitch {OOM} pitch=2048",
        f"meminfo 0 free={MiB - 204800} total={MiB}",
        "calls cuMemFree_v2 1",
    ]


def test_allocation_exactly_at_the_limit(tmp_path: Path, plain: Build) -> None:
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], 10 * MiB, 0)], context_overhead=2 * MiB)
    out = c.tp(
        "dlsym",
        "init",
        "dev",
        "0",
        "alloc",
        str(8 * MiB),
        "alloc",
        "1",
        "free",
        "alloc",
        str(8 * MiB + 1),
        "alloc",
        str(8 * MiB),
        "meminfo",
    )
    assert out[2:] == [
        f"alloc {8 * MiB} 0",
        f"alloc 1 {OOM}",
        "free 0",
        f"alloc {8 * MiB + 1} {OOM}",
        f"alloc {8 * MiB} 0",
        f"meminfo 0 free=0 total={10 * MiB}",
    ]


def test_context_overhead_is_charged_per_context(tmp_path: Path, anybuild: Build) -> None:
    c = Claim(tmp_path, anybuild, [GpuLimit(UUIDS[2], 25 * MiB, 0)], context_overhead=10 * MiB)
    out = c.tp(
        "link",
        "init",
        "dev",
        "2",
        "meminfo",
        "ctx",
        "2",
        "meminfo",
        "ctx",
        "2",
        "destroyctx",
        "dev",
        "2",
        "meminfo",
        "release",
        "2",
        "release",
        "2",
        "nvml",
        "2",
    )
    assert out == [
        "init 0",
        "dev 2 0",
        f"meminfo 0 free={15 * MiB} total={25 * MiB}",
        "ctx 2 0",
        f"meminfo 0 free={5 * MiB} total={25 * MiB}",
        f"ctx 2 {OOM}",
        "destroyctx 0",
        "dev 2 0",  # retained again: the primary context is charged once
        f"meminfo 0 free={15 * MiB} total={25 * MiB}",
        "release 2 0",
        "release 2 0",
        f"nvml 0 total={25 * MiB} used=0 free={25 * MiB}",
    ]


@pytest.mark.parametrize(
    ("cvd", "phys0", "phys1"),
    [
        ("3,1", 3, 1),
        ("1,3", 1, 3),
        (f"{UUIDS[3][:12]},{UUIDS[2]}", 3, 2),  # UUID forms (a prefix and a full UUID)
        ("2,0", 2, 0),  # both GPUs are whole devices of the claim
    ],
)
def test_cuda_visible_devices_maps_ordinals_by_uuid(
    tmp_path: Path, plain: Build, cvd: str, phys0: int, phys1: int
) -> None:
    limits = {1: 1 * GiB, 3: 2 * GiB}
    # GPUs 0 and 2 are whole devices of the same claim: visible, not limited.
    c = Claim(
        tmp_path,
        plain,
        [GpuLimit(UUIDS[i], m, 0) for i, m in limits.items()],
        unlimited=(UUIDS[0], UUIDS[2]),
    )
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "meminfo",
        "alloc",
        str(300 * MiB),
        "dev",
        "1",
        "meminfo",
        "alloc",
        str(100 * MiB),
        "nvml",
        "0",
        "nvml",
        "1",
        "nvml",
        "2",
        "nvml",
        "3",
        CUDA_VISIBLE_DEVICES=cvd,
    )
    t0, t1 = limits.get(phys0, PHYS), limits.get(phys1, PHYS)
    assert out[2] == f"meminfo 0 free={t0} total={t0}"
    assert out[5] == f"meminfo 0 free={t1} total={t1}"
    # NVML enumerates physical GPUs; usage shows up under the UUID the ordinal maps to
    used = {phys0: 300 * MiB, phys1: 100 * MiB}
    for i in range(4):
        total, u = limits.get(i, PHYS), used.get(i, 0)
        assert out[7 + i] == f"nvml 0 total={total} used={u} free={total - u}", (i, out)


def test_usage_is_shared_by_the_processes_of_a_claim(
    tmp_path: Path, anybuild: Build, procs: list[subprocess.Popen[str]]
) -> None:
    c = Claim(tmp_path, anybuild, [GpuLimit(UUIDS[0], LIMIT, 0)], context_overhead=OVH)
    a = c.spawn("tp_cuda", "link", "init", "dev", "0", "alloc", str(40 * MiB), "hold")
    procs.append(a)
    wait_line(a, "holding")
    out = c.tp(
        "dlsym",
        "init",
        "dev",
        "0",
        "meminfo",
        "alloc",
        str(60 * MiB),
        "alloc",
        str(56 * MiB),
        "meminfo",
        "ready",
    )
    assert out[2:] == [
        f"meminfo 0 free={LIMIT - 40 * MiB - 2 * OVH} total={LIMIT}",
        f"alloc {60 * MiB} {OOM}",
        f"alloc {56 * MiB} 0",
        f"meminfo 0 free=0 total={LIMIT}",
        "ready",
    ]
    snap = read_region(c.region)
    assert [(s.pid, s.used[0], s.contexts[0]) for s in snap.slots] == [
        (a.pid, 40 * MiB + OVH, 1)
    ]  # the second process has exited and given its slot back
    assert snap.gpus[0].uuid == UUIDS[0] and snap.gpus[0].memory_limit == LIMIT
    assert snap.used(UUIDS[0]) == 40 * MiB + OVH


def test_killed_process_usage_is_reclaimed(
    tmp_path: Path, anybuild: Build, procs: list[subprocess.Popen[str]]
) -> None:
    c = Claim(tmp_path, anybuild, [GpuLimit(UUIDS[0], LIMIT, 0)], context_overhead=OVH)
    a = c.spawn("tp_cuda", "link", "init", "dev", "0", "alloc", str(70 * MiB), "hold")
    procs.append(a)
    wait_line(a, "holding")
    before = read_region(c.region)
    assert [(s.pid, s.used[0], s.alive) for s in before.slots] == [(a.pid, 70 * MiB + OVH, True)]
    idx = before.slots[0].index
    assert slot_alive(c.region, idx)
    a.send_signal(signal.SIGKILL)
    a.wait()
    assert not slot_alive(c.region, idx)
    # the slot still says LIVE until a library instance reclaims it; readers skip it already
    raw = read_region(c.region, check_liveness=False)
    assert [(s.pid, s.used[0]) for s in raw.slots] == [(a.pid, 70 * MiB + OVH)]
    assert read_region(c.region).used(UUIDS[0]) == 0
    out = c.tp("link", "init", "dev", "0", "meminfo", "alloc", str(LIMIT - OVH), "meminfo")
    assert out[2:] == [
        f"meminfo 0 free={LIMIT - OVH} total={LIMIT}",
        f"alloc {LIMIT - OVH} 0",
        f"meminfo 0 free=0 total={LIMIT}",
    ]
    after = read_region(c.region, check_liveness=False)
    assert after.slots == ()  # reclaimed by the second process, which then exited cleanly


def test_threads_and_processes_never_exceed_the_limit(
    tmp_path: Path, anybuild: Build, procs: list[subprocess.Popen[str]]
) -> None:
    lim = 64 * MiB
    c = Claim(tmp_path, anybuild, [GpuLimit(UUIDS[0], lim, 0)])
    iters = "150" if anybuild.preload_prefix else "400"
    ps = [c.spawn("tp_threads", "8", iters, str(4 * MiB), "100") for _ in range(3)]
    procs.extend(ps)
    oks = ooms = 0
    for p in ps:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        fields = dict(kv.split("=") for kv in out.split())
        assert fields["other"] == "0", out
        oks += int(fields["ok"])
        ooms += int(fields["oom"])
    assert oks + ooms == 3 * 8 * int(iters)
    assert oks > 0 and ooms > 0  # 24 threads x 4 MiB contend for 16 blocks
    # what the fake driver ever held at once, across all processes, stayed within the limit
    out = c.tp("link", "peak", "0", "used", "0", preload=False)
    peak = int(out[0].split()[2])
    assert lim // 2 <= peak <= lim, peak
    assert out[1] == "used 0 0"
    assert read_region(c.region, check_liveness=False).slots == ()


def test_region_created_by_python_is_used_by_the_library(
    tmp_path: Path, plain: Build, procs: list[subprocess.Popen[str]]
) -> None:
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], LIMIT, 0), GpuLimit(UUIDS[1], LIMIT, 0)])
    # the driver creates the region, listing the GPUs in another order than the limits file
    create_region(c.region, [(UUIDS[1], LIMIT, 0), (UUIDS[0], LIMIT, 0)], context_overhead=0)
    p = c.spawn(
        "tp_cuda",
        "link",
        "init",
        "dev",
        "0",
        "alloc",
        str(4 * MiB),
        "dev",
        "1",
        "alloc",
        str(6 * MiB),
        "hold",
    )
    procs.append(p)
    wait_line(p, "holding")
    snap = read_region(c.region)
    assert [(g.index, g.uuid, g.used) for g in snap.gpus] == [
        (0, UUIDS[1], 6 * MiB),
        (1, UUIDS[0], 4 * MiB),
    ]
    assert [s.used[:3] for s in snap.slots] == [(6 * MiB, 4 * MiB, 0)]


def test_unlimited_device_is_not_limited_and_inert_without_limits(
    tmp_path: Path, plain: Build
) -> None:
    # GPU 0 is a whole device of the claim (an unlimited line); a GPU in no line of the limits
    # file is refused (test_two_claims.py).
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[1], LIMIT, 0)], unlimited=(UUIDS[0],))
    out = c.tp("link", "init", "dev", "0", "alloc", str(2 * GiB), "meminfo")
    assert out[2:] == [f"alloc {2 * GiB} 0", f"meminfo 0 free={PHYS - 2 * GiB} total={PHYS}"]
    out = c.tp("link", "init", "dev", "1", "alloc", str(2 * GiB), "meminfo", TESSERA_LIMITS_FILE="")
    assert out[2:] == [f"alloc {2 * GiB} 0", f"meminfo 0 free={PHYS - 2 * GiB} total={PHYS}"]
