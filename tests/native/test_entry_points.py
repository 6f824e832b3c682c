"""The CUDA driver entry points, checked one by one against the library.

tests/native/cuda_entry_points.tsv lists every entry point of cuda.h 13.4 (and the earlier
and per-thread variants of the allocation-relevant ones) with what the library does with it.
The library must interpose exactly the entry points the list says it does, and
cuGetProcAddress must hand out the hook for every variant of them. Where the list comes from
(JuliaGPU/CUDA.jl's libcuda.jl regenerated against CUDA 13.4, cross-checked with NVIDIA's
cuda-python bindings and the 13.4 driver API reference) is recorded at the top of the list.
"""

from __future__ import annotations

import csv
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from native_helpers import UUIDS, Build, Claim, MiB

from tessera.enforcement.limits import GpuLimit

pytestmark = pytest.mark.native

LIST = Path(__file__).with_name("cuda_entry_points.tsv")
INTERPOSED = {"charged", "credited", "tracked", "refused", "query", "paced", "resolve"}
NOT_INTERPOSED = {"host", "exporter", "not-closable", "none"}


@dataclass(frozen=True)
class Entry:
    name: str
    cls: str
    source: str
    base: str
    version: str
    ptsz: str
    note: str


def entries() -> list[Entry]:
    lines = [ln for ln in LIST.read_text().splitlines() if ln and not ln.startswith("#")]
    rows = list(csv.reader(lines, delimiter="\t"))
    assert rows[0] == ["name", "class", "source", "base", "version", "ptsz", "note"]
    return [Entry(*r) for r in rows[1:]]


def test_the_list_covers_cuda_13_4_once_per_entry_point() -> None:
    es = entries()
    names = [e.name for e in es]
    assert len(names) == len(set(names))
    assert sum(e.source == "13.4" for e in es) == 505  # cu* names bound by cuda.h 13.4
    assert all(e.cls in INTERPOSED | NOT_INTERPOSED for e in es)
    # everything that allocates or frees device memory says how
    for e in es:
        if e.cls not in ("none",):
            assert e.note, e.name
    # the 13.x additions that allocate are all there
    for n in (
        "cuMemGetDefaultMemPool",
        "cuMemGetMemPool",
        "cuMemSetMemPool",
        "cuCtxSynchronize_v2",
        "cuMulticastBindMem_v2",
        "cuLogicalEndpointBindMem",
        "cuGraphAddNode_v3",
        "cuCheckpointProcessRestore",
        "cuGreenCtxCreate",
    ):
        assert n in names, n


def test_the_library_interposes_exactly_the_listed_entry_points(plain: Build) -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(plain.lib)], capture_output=True, text=True, check=True
    ).stdout
    exported = {ln.split()[-1] for ln in out.splitlines() if ln.split()[-1].startswith("cu")}
    listed = {e.name for e in entries() if e.cls in INTERPOSED}
    assert exported == listed, (sorted(exported - listed), sorted(listed - exported))


def test_cuGetProcAddress_gives_the_hook_for_every_interposed_variant(
    tmp_path: Path, plain: Build
) -> None:
    c = Claim(tmp_path, plain, [GpuLimit(UUIDS[0], 100 * MiB, 0)])
    es = [e for e in entries() if e.cls in INTERPOSED]
    cmds = ["init"]
    for e in es:
        assert e.base != "-", e.name
        cmds += ["procmatch", e.name, e.base, e.version, e.ptsz]
    out = c.tp("link", *cmds)
    assert out[1:] == [f"procmatch {e.name} 0 hook" for e in es]
