"""Benchmark: compute shares on a time-sliced GPU, measured on the fake driver's contention model.

Runs the case matrix of ``tests/native/contention.py`` (issue 23: 30/70, 50/50, 20/30/50,
kernels 5 µs..10 ms, 1..4 streams, the four launch families, both event models, best-effort
neighbours). Every tenant is a claim of its own running ``tp_launch`` on the fake GPU; its share
is the GPU time the model gave its process over the measuring window (the model's own
figure, not the library's). Prints a Markdown table, the mean absolute error and the worst
error over limited tenants, and the GPU's idle time where the claims should saturate it.

    .venv/bin/python bench/bench_contention.py                  # builds native/ into a temp dir
    .venv/bin/python bench/bench_contention.py --build DIR --seconds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "native"))

from contention import MATRIX, errors, run_case  # noqa: E402
from native_helpers import Build  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=Path, help="an earlier `make -C native test-programs` BUILD")
    ap.add_argument("--seconds", type=float, default=3.0, help="measuring window per case")
    ap.add_argument("--warmup", type=float, default=1.5)
    ap.add_argument("--only", help="run the cases whose name contains this")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        root = a.build or Path(td) / "build"
        if not a.build:
            r = subprocess.run(
                ["make", "-C", str(REPO / "native"), f"BUILD={root}", "test-programs"],
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                sys.exit(f"make failed:\n{r.stdout}\n{r.stderr}")
        b = Build(root, root / "libtessera-enforce.so", root / "fake", root / "bin")
        rows = []
        print("| case | cores | achieved | GPU idle |\n|---|---|---|---|")
        for i, case in enumerate(MATRIX):
            if a.only and a.only not in case.name:
                continue
            work = Path(td) / f"case{i}"
            work.mkdir()
            out = run_case(
                work, b, list(case.tenants), seconds=a.seconds, warmup=a.warmup, stamp=case.stamp
            )
            err = errors(case, out)
            cores = " / ".join(str(t.cores) if t.cores else "be" for t in case.tenants)
            got = " / ".join(f"{s:.1f}" for s in out.shares)
            idle = f"{out.idle:.1f} %" if case.saturating else "—"
            print(f"| {case.name} | {cores} | {got} | {idle} |", flush=True)
            rows.append(
                {
                    "case": case.name,
                    "shares": out.shares,
                    "idle": out.idle,
                    "errors": err,
                    "saturating": case.saturating,
                }
            )
    errs = [abs(e) for r in rows for e in r["errors"]]
    idles = [r["idle"] for r in rows if r["saturating"]]
    if errs:
        print(f"\nMAE {sum(errs) / len(errs):.2f} points, worst {max(errs):.2f}", end="")
    if idles:
        print(f", GPU idle up to {max(idles):.1f} % where the shares fill it", end="")
    print()
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
