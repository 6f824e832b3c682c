"""Every allocation route of docs/enforcement.md, against the fake driver.

The fake driver (native/fake) models what the real one does with memory, independently of the
library: physical allocations live while a handle, mapping, binding or exported descriptor
refers to them; pools keep a reserve that grows in 2 MiB chunks and shrinks at a synchronize
(down to the release threshold), a trim or a destroy; graph memory comes from a per-device graph
pool reserved at launch; destroying or resetting a context frees what it owned. Each test states
what the claim is charged (cuMemGetInfo / NVML through the library) next to what the fake GPU
really holds (``used``), so a route that passes uncharged shows up as the two disagreeing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from native_helpers import UUIDS, Build, Claim, MiB, wait_line

from tessera.enforcement.limits import GpuLimit
from tessera.enforcement.region import read_region, slot_alive

pytestmark = pytest.mark.native

OOM = 2
REFUSED = 801  # CUDA_ERROR_NOT_SUPPORTED, with a line on stderr saying why
CHUNK = 2 * MiB  # the fake pools' growth granularity (and VMM granularity)


def meminfo(free: int, total: int) -> str:
    return f"meminfo 0 free={free} total={total}"


def claim(
    tmp: Path, build: Build, limit: int, overhead: int = 0, gpus: int = 1, name: str = "claim"
) -> Claim:
    return Claim(
        tmp,
        build,
        [GpuLimit(UUIDS[i], limit, 0) for i in range(gpus)],
        context_overhead=overhead,
        name=name,
    )


# ---- virtual memory management -----------------------------------------------------------


def test_mapped_memory_stays_charged_after_its_handle_is_released(
    tmp_path: Path, anybuild: Build
) -> None:
    """NVIDIA's sample idiom: map, then release the handle at once; the mapping keeps it."""
    lim = 5 * CHUNK
    c = claim(tmp_path, anybuild, lim)
    cmds = ["init", "dev", "0", "reserve", str(64 * MiB)]
    for i in range(5):
        cmds += ["create", str(CHUNK), "dev", "map", str(i), "vrelease", str(i)]
    cmds += ["create", str(CHUNK), "dev", "calls", "cuMemCreate", "meminfo", "used", "0"]
    cmds += [x for i in range(5) for x in ("unmap", str(i))] + ["meminfo", "used", "0"]
    out = c.tp("link", *cmds)
    assert out[3:18] == [
        line for i in range(5) for line in (f"create 0 h{i}", f"map 0 m{i}", "vrelease 0")
    ]
    assert out[18:22] == [
        f"create {OOM} h-1",
        "calls cuMemCreate 5",
        meminfo(0, lim),
        f"used 0 {lim}",
    ]
    assert out[22:] == ["unmap 0"] * 5 + [meminfo(lim, lim), "used 0 0"]


def test_retain_then_release_as_a_query_keeps_the_allocation_charged(
    tmp_path: Path, plain: Build
) -> None:
    """Recent NCCL asks for the handle of a mapped buffer (retain) and releases it at once."""
    lim = 100 * MiB
    c = claim(tmp_path, plain, lim)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "reserve",
        str(8 * MiB),
        "create",
        str(CHUNK),
        "dev",
        "map",
        "0",
        "retain",
        "0",
        "vrelease",
        "1",
        "vrelease",
        "0",
        "meminfo",
        "used",
        "0",
        "unmap",
        "0",
        "meminfo",
        "used",
        "0",
    )
    assert out[2:] == [
        "reserve 0",
        "create 0 h0",
        "map 0 m0",
        "retain 0 h1",
        "vrelease 0",
        "vrelease 0",
        meminfo(lim - CHUNK, lim),
        f"used 0 {CHUNK}",
        "unmap 0",
        meminfo(lim, lim),
        "used 0 0",
    ]


def test_exported_allocation_stays_charged_until_its_exporter_exits(
    tmp_path: Path, anybuild: Build
) -> None:
    """A shareable handle keeps the memory alive while any copy of it is open, anywhere."""
    lim = 100 * MiB
    c = claim(tmp_path, anybuild, lim)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "create",
        str(CHUNK),
        "dev",
        "export",
        "0",
        "import",
        "0",
        str(CHUNK),
        "vrelease",
        "0",
        "vrelease",
        "1",
        "meminfo",
        "used",
        "0",
        "closefd",
        "0",
        "meminfo",
    )
    assert out[2:] == [
        "create 0 h0",
        "export 0 f0",
        "import 0 h1",
        "vrelease 0",
        "vrelease 0",
        meminfo(lim - CHUNK, lim),
        f"used 0 {CHUNK}",
        "closefd 0",
        meminfo(lim - CHUNK, lim),
    ]
    # the exporter is gone and every descriptor closed: the driver and the claim hold nothing
    assert read_region(c.region).used(UUIDS[0]) == 0
    assert c.tp("link", "init", "used", "0", preload=False) == ["init 0", "used 0 0"]


def test_an_allocation_imported_from_another_process_is_charged_when_mapped(
    tmp_path: Path, plain: Build, procs: list[subprocess.Popen[str]]
) -> None:
    lim = 100 * MiB
    c = claim(tmp_path, plain, lim)
    a = c.spawn(
        "tp_cuda",
        "link",
        "init",
        "dev",
        "0",
        "create",
        str(4 * CHUNK),
        "dev",
        "export",
        "0",
        "hold",
    )
    procs.append(a)
    lines = wait_line(a, "holding")
    assert lines[-2:] == ["export 0 f0", "holding"]
    fd = next(
        f
        for f in os.listdir(f"/proc/{a.pid}/fd")
        if ".exp." in os.readlink(f"/proc/{a.pid}/fd/{f}")
    )
    exported = os.readlink(f"/proc/{a.pid}/fd/{fd}")
    # the importer opens the exported file as it would receive the descriptor
    b = c.spawn(
        "tp_cuda",
        "link",
        "init",
        "dev",
        "0",
        "reserve",
        str(16 * MiB),
        "importpath",
        exported,
        str(4 * CHUNK),
        "meminfo",
        "map",
        "0",
        "meminfo",
        "hold",
    )
    procs.append(b)
    lines = wait_line(b, "holding")
    assert lines[3:] == [
        "importpath 0 h0",
        meminfo(lim - 4 * CHUNK, lim),
        "map 0 m0",
        meminfo(lim - 8 * CHUNK, lim),
        "holding",
    ]  # both pay while both hold
    a.kill()
    a.wait()
    snap = read_region(c.region)
    assert [(s.pid, s.used[0]) for s in snap.slots] == [(b.pid, 4 * CHUNK)]


def test_multicast_bindings_hold_physical_memory(tmp_path: Path, anybuild: Build) -> None:
    lim = 100 * MiB
    c = claim(tmp_path, anybuild, lim)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "create",
        str(CHUNK),
        "dev",
        "mc",
        str(CHUNK),
        "mcbind",
        "1",
        "0",
        "vrelease",
        "0",
        "meminfo",
        "used",
        "0",
        "mcunbind",
        "1",
        "meminfo",
        "used",
        "0",
        # bound by address, then the multicast object goes away with its binding
        "reserve",
        str(8 * MiB),
        "create",
        str(CHUNK),
        "dev",
        "map",
        "2",
        "mcbindaddr",
        "1",
        "0",
        "unmap",
        "0",
        "vrelease",
        "2",
        "meminfo",
        "vrelease",
        "1",
        "meminfo",
        "used",
        "0",
    )
    assert out[2:] == [
        "create 0 h0",
        "mc 0 h1",
        "mcbind 0",
        "vrelease 0",
        meminfo(lim - CHUNK, lim),
        f"used 0 {CHUNK}",
        "mcunbind 0",
        meminfo(lim, lim),
        "used 0 0",
        "reserve 0",
        "create 0 h2",
        "map 0 m0",
        "mcbindaddr 0",
        "unmap 0",
        "vrelease 0",
        meminfo(lim - CHUNK, lim),
        "vrelease 0",
        meminfo(lim, lim),
        "used 0 0",
    ]


def test_holds_the_library_does_not_follow_are_refused(tmp_path: Path, plain: Build) -> None:
    c = claim(tmp_path, plain, 100 * MiB)
    r = c.run(
        "tp_cuda",
        "link",
        "init",
        "dev",
        "0",
        "create",
        str(CHUNK),
        "dev",
        "sparse",
        "0",
        "lebind",
        "0",
        "calls",
        "cuMemMapArrayAsync",
        "calls",
        "cuLogicalEndpointBindMem",
    )
    assert r.stdout.splitlines()[2:] == [
        "create 0 h0",
        f"sparse {REFUSED}",
        f"lebind {REFUSED}",
        "calls cuMemMapArrayAsync 0",
        "calls cuLogicalEndpointBindMem 0",
    ]
    assert "cuMemMapArrayAsync refused: mapping limited GPU memory into a sparse array" in r.stderr
    assert "cuLogicalEndpointBindMem refused" in r.stderr


def test_memory_locations(tmp_path: Path, anybuild: Build) -> None:
    """A locality domain (CUDA 13.4) is device memory; host memory is never charged; a
    location the library does not know is refused before the driver sees it."""
    lim = 4 * MiB
    c = claim(tmp_path, anybuild, lim)
    r = c.run(
        "tp_cuda",
        "link",
        "init",
        "dev",
        "0",
        "create",
        str(CHUNK),
        "domain",
        "meminfo",
        "create",
        str(4 * CHUNK),
        "host",
        "meminfo",
        "used",
        "0",
        "create",
        str(CHUNK),
        "domain",
        "create",
        str(CHUNK),
        "domain",
        "create",
        str(CHUNK),
        "invisible",
        "calls",
        "cuMemCreate",
    )
    assert r.stdout.splitlines()[2:] == [
        "create 0 h0",
        meminfo(lim - CHUNK, lim),
        "create 0 h1",
        meminfo(lim - CHUNK, lim),
        f"used 0 {CHUNK}",
        "create 0 h2",
        f"create {OOM} h-1",
        f"create {REFUSED} h-1",
        "calls cuMemCreate 3",
    ]
    assert "cuMemCreate refused: a memory location type this library cannot account" in r.stderr


# ---- stream-ordered pools -------------------------------------------------------------------


def test_a_pool_is_charged_its_reserve_until_it_trims(tmp_path: Path, anybuild: Build) -> None:
    lim = 100 * MiB
    c = claim(tmp_path, anybuild, lim)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "async",
        str(MiB),
        "meminfo",
        "afree",
        "meminfo",
        "used",
        "0",
        "sync",
        "meminfo",
        "used",
        "0",
    )
    assert out[2:] == [
        f"async {MiB} 0",
        meminfo(lim - CHUNK, lim),
        "afree 0",
        meminfo(lim - CHUNK, lim),
        f"used 0 {CHUNK}",  # back in the reserve
        "sync 0",
        meminfo(lim, lim),
        "used 0 0",
    ]  # released at the synchronize


def test_a_pool_that_never_releases_keeps_its_reserve_charged(tmp_path: Path, plain: Build) -> None:
    """PyTorch's cudaMallocAsync backend sets the release threshold to the maximum."""
    lim = 100 * MiB
    c = claim(tmp_path, plain, lim)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "curpool",
        "thresh",
        "0",
        str(2**64 - 1),
        "async",
        str(6 * MiB),
        "afree",
        "sync",
        "meminfo",
        "used",
        "0",
        "alloc",
        str(lim - 6 * MiB + 1),
        "alloc",
        str(lim - 6 * MiB),
        "peak",
        "0",
        "free",
        "trim",
        "0",
        "0",
        "meminfo",
        "used",
        "0",
    )
    assert out[2:] == [
        "curpool 0 p0",
        "thresh 0",
        f"async {6 * MiB} 0",
        "afree 0",
        "sync 0",
        meminfo(lim - 6 * MiB, lim),
        f"used 0 {6 * MiB}",
        f"alloc {lim - 6 * MiB + 1} {OOM}",
        f"alloc {lim - 6 * MiB} 0",
        f"peak 0 {lim}",
        "free 0",
        "trim 0",
        meminfo(lim, lim),
        "used 0 0",
    ]


def test_a_new_pool_per_round_cannot_escape(tmp_path: Path, anybuild: Build) -> None:
    lim = 5 * CHUNK
    c = claim(tmp_path, anybuild, lim)
    cmds = ["init", "dev", "0"]
    for i in range(5):
        cmds += ["poolcreate", "dev", "palloc", str(i), str(CHUNK), "pfree"]
    cmds += ["poolcreate", "dev", "palloc", "5", str(CHUNK), "meminfo", "peak", "0"]
    cmds += [x for i in range(6) for x in ("pdestroy", str(i))] + ["meminfo", "used", "0"]
    out = c.tp("link", *cmds)
    assert out[2:17] == [
        line for i in range(5) for line in (f"poolcreate 0 p{i}", f"palloc {CHUNK} 0", "pfree 0")
    ]
    assert out[17:21] == [
        "poolcreate 0 p5",
        f"palloc {CHUNK} {OOM}",
        meminfo(0, lim),
        f"peak 0 {lim}",
    ]
    assert out[21:] == ["pdestroy 0"] * 6 + [meminfo(lim, lim), "used 0 0"]


def test_cuda13_pool_getters_charge_the_pool_s_own_gpu(tmp_path: Path, plain: Build) -> None:
    """cuMemGetDefaultMemPool(location of GPU 1) while GPU 0's context is current."""
    lim = 100 * MiB
    c = claim(tmp_path, plain, lim, gpus=2)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "getpool",
        "dev1",
        "palloc",
        "0",
        str(3 * MiB),
        "nvml",
        "0",
        "nvml",
        "1",
    )
    assert out[2:] == [
        "getpool 0 p0",
        f"palloc {3 * MiB} 0",
        f"nvml 0 total={lim} used=0 free={lim}",
        f"nvml 0 total={lim} used={2 * CHUNK} free={lim - 2 * CHUNK}",
    ]


@pytest.mark.parametrize("located", [True, False])
def test_a_pool_the_library_never_saw_is_located_or_refused(
    tmp_path: Path, plain: Build, located: bool
) -> None:
    """A pool made behind the library's back: CUDA 13.2+ drivers say where it is
    (CU_MEMPOOL_ATTR_LOCATION_TYPE/ID); older ones cannot, and then it is refused."""
    lim = 100 * MiB
    c = claim(tmp_path, plain, lim, gpus=2)
    env = {} if located else {"FAKE_POOL_NO_LOCATION": "1"}
    r = c.run(
        "tp_cuda",
        "link",
        "init",
        "dev",
        "0",
        "rawpool",
        "palloc",
        "0",
        str(3 * MiB),
        "nvml",
        "1",
        "used",
        "1",
        **env,
    )
    if located:
        assert r.stdout.splitlines()[2:] == [
            "rawpool 0 p0",
            f"palloc {3 * MiB} 0",
            f"nvml 0 total={lim} used={2 * CHUNK} free={lim - 2 * CHUNK}",
            f"used 1 {2 * CHUNK}",
        ]
    else:
        assert r.stdout.splitlines()[2:] == [
            "rawpool 0 p0",
            f"palloc {3 * MiB} {REFUSED}",
            f"nvml 0 total={lim} used=0 free={lim}",
            "used 1 0",
        ]
        assert "a pool whose location this library cannot tell" in r.stderr


def test_a_pool_destroyed_with_allocations_outstanding_stays_charged(
    tmp_path: Path, plain: Build
) -> None:
    """The driver releases its reserve only once they are freed; the library keeps it charged
    until the process exits."""
    lim = 100 * MiB
    c = claim(tmp_path, plain, lim)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "poolcreate",
        "dev",
        "palloc",
        "0",
        str(3 * MiB),
        "pdestroy",
        "0",
        "meminfo",
        "used",
        "0",
        "pfree",
        "meminfo",
        "used",
        "0",
    )
    assert out[2:] == [
        "poolcreate 0 p0",
        f"palloc {3 * MiB} 0",
        "pdestroy 0",
        meminfo(lim - 2 * CHUNK, lim),
        f"used 0 {2 * CHUNK}",
        "pfree 0",
        meminfo(lim - 2 * CHUNK, lim),  # over-counted: released by the driver,
        "used 0 0",
    ]  # still charged until exit
    assert read_region(c.region).used(UUIDS[0]) == 0


def test_host_and_managed_pools(tmp_path: Path, anybuild: Build) -> None:
    """Host pools take no GPU memory; managed pools are charged per allocation."""
    lim = 8 * MiB
    c = claim(tmp_path, anybuild, lim)
    r = c.run(
        "tp_cuda",
        "link",
        "init",
        "dev",
        "0",
        "poolcreate",
        "host",
        "palloc",
        "0",
        str(16 * MiB),
        "meminfo",
        "getpool",
        "managed",
        "palloc",
        "1",
        str(3 * MiB),
        "meminfo",
        "pfree",
        "meminfo",
        "poolcreate",
        "invisible",
        "used",
        "0",
    )
    assert r.stdout.splitlines()[2:] == [
        "poolcreate 0 p0",
        f"palloc {16 * MiB} 0",
        meminfo(lim, lim),
        "getpool 0 p1",
        f"palloc {3 * MiB} 0",
        meminfo(lim - 3 * MiB, lim),
        "pfree 0",
        meminfo(lim, lim),
        f"poolcreate {REFUSED} p-1",
        "used 0 0",
    ]


def test_a_free_on_a_busy_stream_is_credited_when_the_stream_gets_there(
    tmp_path: Path, plain: Build
) -> None:
    lim = 100 * MiB
    c = claim(tmp_path, plain, lim)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "alloc",
        str(8 * MiB),
        "launch",
        "1",
        "300000",
        "afree",
        "meminfo",
        "sync",
        "meminfo",
    )
    assert out[2:] == [
        f"alloc {8 * MiB} 0",
        "launch 0",
        "afree 0",
        meminfo(lim - 8 * MiB, lim),  # a 300 ms kernel is ahead of the free
        "sync 0",
        meminfo(lim, lim),
    ]


# ---- graph memory ---------------------------------------------------------------------------


def test_graph_memory_is_charged_when_the_graph_pool_reserves_it(
    tmp_path: Path, anybuild: Build
) -> None:
    lim = 8 * MiB
    c = claim(tmp_path, anybuild, lim)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "gcreate",
        "galloc",
        "0",
        str(6 * MiB),
        "ginst",
        "0",
        "0",
        "meminfo",
        "glaunch",
        "0",
        "meminfo",
        "alloc",
        str(4 * MiB),
        "gfreeptr",
        "0",
        "meminfo",
        "gmem",
        "gtrim",
        "meminfo",
        "gdestroy",
        "0",
        "used",
        "0",
    )
    assert out[2:] == [
        "gcreate 0 g0",
        "galloc 0",
        "ginst 0 e0",
        meminfo(lim, lim),
        "glaunch 0",
        meminfo(2 * MiB, lim),
        f"alloc {4 * MiB} {OOM}",
        "gfreeptr 0",
        meminfo(2 * MiB, lim),
        f"gmem 0 used=0 reserved={6 * MiB}",
        "gtrim 0",
        meminfo(lim, lim),
        "gdestroy 0",
        "used 0 0",
    ]


def test_a_graph_launch_that_does_not_fit_is_refused(tmp_path: Path, plain: Build) -> None:
    lim = 8 * MiB
    c = claim(tmp_path, plain, lim)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "alloc",
        str(4 * MiB),
        "gcreate",
        "galloc",
        "0",
        str(6 * MiB),
        "ginst",
        "0",
        "0",
        "glaunch",
        "0",
        "gmem",
        "used",
        "0",
        "ginst",
        "0",
        "2",
    )  # instantiate with UPLOAD: reserved (and refused) now
    assert out[2:] == [
        f"alloc {4 * MiB} 0",
        "gcreate 0 g0",
        "galloc 0",
        "ginst 0 e0",
        f"glaunch {OOM}",
        "gmem 0 used=0 reserved=0",
        f"used 0 {4 * MiB}",
        f"ginst {OOM} e-1",
    ]


def test_captured_allocations_are_charged_when_the_graph_runs(tmp_path: Path, plain: Build) -> None:
    lim = 100 * MiB
    c = claim(tmp_path, plain, lim)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "capture",
        str(3 * MiB),
        "meminfo",
        "ginst",
        "0",
        "0",
        "glaunch",
        "0",
        "meminfo",
        "used",
        "0",
        "gfreeptr",
        "0",
        "gtrim",
        "meminfo",
    )
    assert out[2:] == [
        "capture 0 alloc=0 g0",
        meminfo(lim, lim),
        "ginst 0 e0",
        "glaunch 0",
        meminfo(lim - 2 * CHUNK, lim),
        f"used 0 {2 * CHUNK}",
        "gfreeptr 0",
        "gtrim 0",
        meminfo(lim, lim),
    ]


# ---- contexts -------------------------------------------------------------------------------


def test_a_context_reset_returns_everything_it_held(tmp_path: Path, anybuild: Build) -> None:
    """cudaDeviceReset: before, the old allocations stayed charged and every later allocation
    was refused with the GPU empty."""
    lim, ovh = 100 * MiB, MiB
    c = claim(tmp_path, anybuild, lim, ovh)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "alloc",
        str(60 * MiB),
        "array",
        "1024",
        "256",
        "async",
        str(MiB),
        "setlimit",
        "heap",
        str(16 * MiB),
        "meminfo",
        "reset",
        "0",
        "dev",
        "0",
        "meminfo",
        "used",
        "0",
        "alloc",
        str(90 * MiB),
    )
    assert out[2:] == [
        f"alloc {60 * MiB} 0",
        "array 0",
        f"async {MiB} 0",
        "setlimit 0",
        meminfo(lim - ovh - 60 * MiB - MiB - CHUNK - 8 * MiB, lim),
        "reset 0 0",
        "dev 0 0",
        meminfo(lim - ovh, lim),
        "used 0 0",
        f"alloc {90 * MiB} 0",
    ]


@pytest.mark.parametrize("how", ["destroy", "release", "green", "detach"])
def test_a_destroyed_context_returns_its_allocations(
    tmp_path: Path, plain: Build, how: str
) -> None:
    lim, ovh = 100 * MiB, MiB
    c = claim(tmp_path, plain, lim, ovh)
    make, end = {
        "destroy": (["ctx", "0"], ["destroyctx"]),
        "release": (["dev", "0"], ["release", "0"]),
        "green": (["green", "0"], ["greendestroy"]),
        "detach": (["ctx", "0"], ["detach"]),
    }[how]
    out = c.tp(
        "link", "init", *make, "alloc", str(10 * MiB), *end, "dev", "0", "meminfo", "used", "0"
    )
    assert out[-3:] == ["dev 0 0", meminfo(lim - ovh, lim), "used 0 0"]


def test_context_calls_refused_under_a_claim(tmp_path: Path, plain: Build) -> None:
    c = claim(tmp_path, plain, 100 * MiB)
    r = c.run(
        "tp_cuda",
        "link",
        "init",
        "ctx",
        "0",
        "attach",
        "glctx",
        "0",
        "restore",
        "calls",
        "cuCtxAttach",
        "calls",
        "cuGLCtxCreate_v2",
    )
    assert r.stdout.splitlines()[2:] == [
        f"attach {REFUSED}",
        f"glctx {REFUSED}",
        f"restore {REFUSED}",
        "calls cuCtxAttach 0",
        "calls cuGLCtxCreate_v2 0",
    ]
    assert "cuCheckpointProcessRestore refused: restoring onto other GPUs" in r.stderr


def test_context_limits_that_take_memory_are_charged(tmp_path: Path, anybuild: Build) -> None:
    """Stack: per thread for every resident thread (8 SMs x 1024 on the fake); heap and printf
    FIFO as they are; above the values the context started with."""
    lim = 100 * MiB
    c = claim(tmp_path, anybuild, lim)
    stack = (4096 - 1024) * 8 * 1024
    r = c.run(
        "tp_cuda",
        "link",
        "init",
        "dev",
        "0",
        "setlimit",
        "stack",
        "4096",
        "meminfo",
        "used",
        "0",
        "setlimit",
        "heap",
        str(16 * MiB),
        "meminfo",
        "setlimit",
        "stack",
        "1024",
        "meminfo",
        "setlimit",
        "pending",
        "4096",
        "setlimit",
        "l2",
        "1024",
        "setlimit",
        "stack",
        "16384",
        "calls",
        "cuCtxSetLimit",
        "reset",
        "0",
        "dev",
        "0",
        "meminfo",
        "used",
        "0",
    )
    assert r.stdout.splitlines()[2:] == [
        "setlimit 0",
        meminfo(lim - stack, lim),
        f"used 0 {stack}",
        "setlimit 0",
        meminfo(lim - stack - 8 * MiB, lim),
        "setlimit 0",
        meminfo(lim - 8 * MiB, lim),
        f"setlimit {REFUSED}",
        "setlimit 0",
        f"setlimit {OOM}",
        "calls cuCtxSetLimit 4",
        "reset 0 0",
        "dev 0 0",
        meminfo(lim, lim),
        "used 0 0",
    ]
    assert "raising the device-runtime or per-block memory limits" in r.stderr


# ---- resolution -------------------------------------------------------------------------------


def test_rtld_next_from_a_shared_library_reaches_the_hook(tmp_path: Path, anybuild: Build) -> None:
    lim = 100 * MiB
    c = claim(tmp_path, anybuild, lim)
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "nextalloc",
        str(lim + 1),
        "nextalloc",
        str(lim),
        "calls",
        "cuMemAlloc_v2",
        "meminfo",
        "marker",
    )
    # RTLD_NEXT for other names still starts after the caller (the executable)
    assert out[2:] == [
        f"nextalloc {lim + 1} {OOM}",
        f"nextalloc {lim} 0",
        "calls cuMemAlloc_v2 1",
        meminfo(0, lim),
        "marker found missing",
    ]


@pytest.mark.parametrize("limits", [True, False])
def test_a_deep_bound_plugin_reaches_the_hooks(tmp_path: Path, plain: Build, limits: bool) -> None:
    """A plugin loaded with RTLD_DEEPBIND binds to libcuda.so.1 before the preloaded library:
    direct calls, function pointers in data and its own dlsym are redirected. The plugin is
    found through tp_cuda's RUNPATH, as glibc would for the caller. (Not under ASan: its
    runtime refuses RTLD_DEEPBIND.)"""
    lim = 100 * MiB
    c = claim(tmp_path, plain, lim)
    env = {} if limits else {"TESSERA_LIMITS_FILE": ""}
    out = c.tp("link", "init", "dev", "0", "deepbind", str(40 * MiB), "used", "0", **env)
    if limits:
        assert out[2:] == [f"deepbind direct=0 table=0 dlsym={OOM}", f"used 0 {80 * MiB}"]
    else:
        assert out[2:] == ["deepbind direct=0 table=0 dlsym=0", f"used 0 {120 * MiB}"]


@pytest.mark.parametrize("limits", [True, False])
def test_dlmopen_into_a_new_namespace(tmp_path: Path, plain: Build, limits: bool) -> None:
    c = claim(tmp_path, plain, 100 * MiB)
    env = {} if limits else {"TESSERA_LIMITS_FILE": ""}
    r = c.run("tp_cuda", "link", "dlmopen", **env)
    if limits:
        assert r.stdout == (
            "dlmopen refused /tessera: dlmopen into another link-map namespace is "
            "refused under a GPU claim: cannot open shared object file: No such "
            "file or directory\n"
        )
        assert "dlmopen into another link-map namespace refused" in r.stderr
    else:
        assert r.stdout == "dlmopen loaded -\n"


@pytest.mark.parametrize("mode", ["link", "dlsym"])
def test_pre_3_2_entry_points_are_refused(tmp_path: Path, plain: Build, mode: str) -> None:
    c = claim(tmp_path, plain, 100 * MiB)
    out = c.tp(
        mode,
        "init",
        "dev",
        "0",
        "v1alloc",
        "100",
        "procalloc",
        "2000",
        "100",
        "procalloc",
        "3020",
        "100",
        "calls",
        "cuMemAlloc",
        "calls",
        "cuMemAlloc_v2",
    )
    assert out[2:] == [
        f"v1alloc {REFUSED}",
        f"procalloc 2000 {REFUSED}",
        "procalloc 3020 0",
        "calls cuMemAlloc 0",
        "calls cuMemAlloc_v2 1",
    ]


def test_an_entry_point_variant_newer_than_the_library_is_refused(
    tmp_path: Path, plain: Build
) -> None:
    c = claim(tmp_path, plain, 100 * MiB)
    r = c.run(
        "tp_cuda",
        "link",
        "init",
        "dev",
        "0",
        "procalloc",
        "14000",
        "100",
        "procalloc",
        "13040",
        "100",
        FAKE_PROCADDR_FUTURE="1",
    )
    assert r.stdout.splitlines()[2:] == [f"procalloc 14000 {REFUSED}", "procalloc 13040 0"]
    assert (
        "cuGetProcAddress(cuMemAlloc, 14000) returned an entry point this library does not know"
        in r.stderr
    )


def _mseal() -> bool:
    rel = os.uname().release.split(".")
    return (int(rel[0]), int(rel[1].split("-")[0])) >= (6, 10)


def test_a_process_cannot_release_its_slot_lock(
    tmp_path: Path, anybuild: Build, procs: list[subprocess.Popen[str]]
) -> None:
    """Unlocking every lock it can reach (and unmapping the lock page) does not make a live
    process look dead to the others: its usage stays counted."""
    lim = 100 * MiB
    c = claim(tmp_path, anybuild, lim)
    a = c.spawn(
        "tp_cuda",
        "link",
        "init",
        "dev",
        "0",
        "alloc",
        str(60 * MiB),
        "unlockslot",
        "hold",
        TP_REGION=c.region,
    )
    procs.append(a)
    lines = wait_line(a, "holding")
    fds = int(lines[-2].split()[1].split("=")[1])
    assert fds >= 1  # it did unlock what its descriptors held
    if _mseal():
        assert lines[-2].endswith("unmapped=0 sealed=1")
    else:  # without mseal the page can be unmapped, and with it goes the lock
        assert lines[-2].endswith("unmapped=1 sealed=0")
    (slot,) = read_region(c.region).slots
    assert slot_alive(c.region, slot.index) is _mseal()
    out = c.tp("link", "init", "dev", "0", "alloc", str(60 * MiB))
    assert out[2] == f"alloc {60 * MiB} {OOM if _mseal() else 0}"


def test_physical_memory_never_exceeds_the_limit_on_any_route(tmp_path: Path, plain: Build) -> None:
    """The memory routes of the issue in one process under 8000 MiB on a 16 GiB GPU, each of
    which used to end with 14-16 GiB in use: five fit, the rest are refused, and the fake GPU
    never held more than the limit."""
    lim = 8000 * MiB
    c = claim(tmp_path, plain, lim)
    big = 1500 * MiB
    out = c.tp(
        "link",
        "init",
        "dev",
        "0",
        "reserve",
        str(16 * 1024 * MiB),
        "create",
        str(big),
        "dev",
        "map",
        "0",
        "vrelease",
        "0",  # sample idiom
        "create",
        str(big),
        "dev",
        "map",
        "1",
        "retain",
        "1",
        "vrelease",
        "2",
        "vrelease",
        "1",  # NCCL's query
        "create",
        str(big),
        "domain",  # CUDA 13.4 locality domain
        "curpool",
        "thresh",
        "0",
        str(2**64 - 1),
        "async",
        str(big),
        "afree",  # PyTorch
        "poolcreate",
        "dev",
        "palloc",
        "1",
        str(big),
        "pfree",  # a new pool
        "gcreate",
        "galloc",
        "0",
        str(big),
        "ginst",
        "0",
        "0",
        "glaunch",
        "0",  # graph
        "nextalloc",
        str(big),
        "setlimit",
        "heap",
        str(big),  # RTLD_NEXT, heap limit
        "peak",
        "0",
        "meminfo",
    )
    assert out[2:] == [
        "reserve 0",
        "create 0 h0",
        "map 0 m0",
        "vrelease 0",
        "create 0 h1",
        "map 0 m1",
        "retain 0 h2",
        "vrelease 0",
        "vrelease 0",
        "create 0 h3",
        "curpool 0 p0",
        "thresh 0",
        f"async {big} 0",
        "afree 0",
        "poolcreate 0 p1",
        f"palloc {big} 0",
        "pfree 0",
        "gcreate 0 g0",
        "galloc 0",
        "ginst 0 e0",
        f"glaunch {OOM}",
        f"nextalloc {big} {OOM}",
        f"setlimit {OOM}",
        f"peak 0 {5 * big}",
        meminfo(lim - 5 * big, lim),
    ]
