"""Benchmark: CPU cost the enforcement library adds to hooked CUDA calls.

Builds the library, the fake ``libcuda.so.1`` and ``tp_bench`` with ``make -C native`` (or
uses ``--build DIR`` from an earlier build), then runs each operation three ways on the fake
driver: without the library, with it under a claim that is not paced (``cores 0``), and under
a paced claim (``cores 30``). Each figure is the process CPU time (user + system) per
operation, the median of ``--repeat`` runs, so that other work on a shared machine does not
inflate it; the cost of the library is the difference to the run without it. The fake driver's
own calls take ~0.1-0.5 µs, so the differences are what the library adds, not what a GPU costs.
``--lib`` measures another build of the library (an older commit) against the same fake driver
and programs, for before/after figures.

    .venv/bin/python bench/bench_enforce.py
    .venv/bin/python bench/bench_enforce.py --repeat 9 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tessera.enforcement.layout import REGION_FILE
from tessera.enforcement.limits import GpuLimit, Limits, write_limits

REPO = Path(__file__).resolve().parents[1]
NATIVE = REPO / "native"
MiB = 1 << 20
GPU = "GPU-00000000-1111-2222-3333-444444444444"
FAKE_GPUS = f"{GPU}=17179869184"

# (name, tp_bench command, operations per run, further arguments)
OPERATIONS = [
    ("cuMemAlloc_v2 + cuMemFree_v2", ["alloc"], 200_000, [str(MiB)]),
    ("cuMemAllocAsync + cuMemFreeAsync (default pool)", ["async"], 200_000, [str(MiB)]),
    ("cuMemCreate + cuMemMap + cuMemUnmap + cuMemRelease", ["vmm"], 100_000, [str(2 * MiB)]),
    ("cuLaunchKernel", ["launch"], 2_000_000, []),
]


def build(root: Path) -> Path:
    r = subprocess.run(
        ["make", "-C", str(NATIVE), f"BUILD={root}", "test-programs"],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        sys.exit(f"make failed:\n{r.stdout}\n{r.stderr}")
    return root


def env_for(build_dir: Path, work: Path, cores: int | None, lib: Path) -> dict[str, str]:
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CUDA_", "FAKE_", "TESSERA_", "LD_PRELOAD"))
    }
    e["LD_LIBRARY_PATH"] = str(build_dir / "fake")
    e["FAKE_GPUS"] = FAKE_GPUS
    if cores is not None:
        d = work / f"claim-{cores}"
        d.mkdir(exist_ok=True)
        limits = d / "limits"
        if not limits.exists():
            write_limits(
                str(limits),
                Limits(region=str(d / REGION_FILE), gpus=(GpuLimit(GPU, 8 * 1024 * MiB, cores),)),
            )
        e["TESSERA_LIMITS_FILE"] = str(limits)
        e["LD_PRELOAD"] = str(lib)
    return e


def one(build_dir: Path, env: dict[str, str], args: list[str]) -> float | None:
    r = subprocess.run(
        [str(build_dir / "bin" / "tp_bench"), *args], env=env, capture_output=True, text=True
    )
    if r.returncode != 0:
        return None  # operation not available in this build
    fields = dict(kv.split("=") for kv in r.stdout.split())
    return float(fields["cpu_ns_per_op"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=Path, help="an existing native build directory")
    ap.add_argument(
        "--lib",
        type=Path,
        help="the library to measure (default: the build's), e.g. an older build of "
        "it, against the same fake driver and programs",
    )
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply operation counts")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-enforce-") as tmp:
        work = Path(tmp)
        build_dir = a.build or build(work / "build")
        lib = a.lib or build_dir / "libtessera-enforce.so"
        rows = []
        for name, args, n, extra in OPERATIONS:
            cmd = [*args, str(int(n * a.scale)), *extra]
            cells: dict[str, float | None] = {}
            for label, cores in (("without", None), ("unpaced", 0), ("paced", 30)):
                xs = [
                    one(build_dir, env_for(build_dir, work, cores, lib), cmd)
                    for _ in range(a.repeat)
                ]
                got = [x for x in xs if x is not None]
                cells[label] = statistics.median(got) if len(got) == len(xs) else None
            base = cells["without"]
            row = {"operation": name, **{f"{k}_ns": v for k, v in cells.items()}}
            for k in ("unpaced", "paced"):
                v = cells[k]
                row[f"added_{k}_ns"] = None if v is None or base is None else round(v - base, 1)
            rows.append(row)
            print(
                f"{name:55s} "
                + "  ".join(
                    f"{k}={'n/a' if row[k] is None else row[k]}" for k in row if k != "operation"
                ),
                flush=True,
            )
        if a.json:
            a.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
