"""Fuzz test: mutated real inputs through ``simulate``, ``lint`` and ``explain``.

For every kind of corpus file (DRA manifests, HAMi pods, GPU inventories, topologies, and
cluster files that name corpus inventories), ``TESSERA_FUZZ_MUTANTS`` mutants (default 200;
``make fuzz`` runs 2,000) are drawn with a fixed seed (``TESSERA_FUZZ_SEED``, default 1) and run
through the commands in a worker process (``tests/fuzz/worker.py``) bounded to 20 s and 3 GiB.
Every run must:

* exit 0, 1 or 2, with no traceback and no hang;
* on exit 2, print exactly one line on stderr, ``tessera: error: ...``, naming an input file;
* leave every input file as it was.

A failure names the mutant's seed; ``TESSERA_FUZZ_KEEP=DIR`` keeps the mutants for replay.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from corpus_paths import corpus_path

from .mutate import mutate

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "src" / "tessera" / "examples"
CLUSTER = EXAMPLES / "cluster.yaml"
H100 = (
    EXAMPLES
    / "inventories"
    / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
)
WORKLOAD = EXAMPLES / "workloads" / "dra-native.yaml"
MUTANTS = int(os.environ.get("TESSERA_FUZZ_MUTANTS", "200"))
SEED = int(os.environ.get("TESSERA_FUZZ_SEED", "1"))
WORKERS = 2
KINDS = ("dra-manifests", "hami-pods", "inventories", "topologies", "cluster")


@dataclass
class Run:
    kind: str
    seed: int
    mutant: Path
    args: list[str]
    inputs: list[Path]


def _cluster_text(rng: random.Random, corpus: Path) -> bytes:
    inventories = sorted((corpus / "inventories").iterdir())
    topologies = sorted((corpus / "topologies").glob("*topo-m*"))
    nodes = []
    for i in range(rng.randint(1, 3)):
        n: dict[str, object] = {"name": f"node-{i}", "inventory": str(rng.choice(inventories))}
        if rng.random() < 0.3:
            n["topology"] = str(rng.choice(topologies))
        if rng.random() < 0.3:
            n["count"] = rng.randint(1, 4)
        if rng.random() < 0.3:
            n["labels"] = {"zone": "a"}
        if rng.random() < 0.3:
            n["taints"] = [{"key": "gpu", "value": "x", "effect": "NoSchedule"}]
        nodes.append(n)
    return yaml.safe_dump(
        {"apiVersion": "tessera.dev/v1alpha1", "kind": "Cluster", "nodes": nodes}, sort_keys=False
    ).encode()


def _runs(kind: str, corpus: Path, folder: Path) -> Iterator[Run]:
    files = [] if kind == "cluster" else sorted(p for p in (corpus / kind).iterdir() if p.is_file())
    for k in range(MUTANTS):
        seed = SEED * 1_000_003 + KINDS.index(kind) * 100_000 + k
        rng = random.Random(seed)
        if kind == "cluster":
            data, suffix = _cluster_text(rng, corpus), ".yaml"
        else:
            src = rng.choice(files)
            data, suffix = src.read_bytes(), src.suffix or ".txt"
        yaml_like = kind in ("dra-manifests", "hami-pods", "cluster")
        mutant = folder / f"{kind}-{k:05d}{suffix}"
        mutant.write_bytes(mutate(rng, data, yaml_like=yaml_like))
        cmd = k % 3
        if kind in ("dra-manifests", "hami-pods"):
            args = (
                ["simulate", "--cluster", str(CLUSTER), str(mutant)]
                if cmd == 0
                else ["lint", str(mutant)]
                if cmd == 1
                else ["explain", "default/x", "--cluster", str(CLUSTER), str(mutant)]
            )
            inputs = [mutant, CLUSTER]
        elif kind == "inventories":
            args = (
                ["simulate", "--node", f"n1={mutant}", str(WORKLOAD)]
                if cmd != 2
                else ["lint", "--cluster", str(_wrap(folder, mutant, k)), str(WORKLOAD)]
            )
            inputs = [mutant, WORKLOAD]
        elif kind == "topologies":
            args = ["simulate", "--node", f"n1={H100}:{mutant}", str(WORKLOAD)]
            inputs = [mutant, H100, WORKLOAD]
        else:
            args = (
                ["simulate", "--cluster", str(mutant), str(WORKLOAD)]
                if cmd != 1
                else ["explain", "default/x", "--cluster", str(mutant), str(WORKLOAD)]
            )
            inputs = [mutant, WORKLOAD]
        yield Run(kind, seed, mutant, args, inputs)


def _wrap(folder: Path, inventory: Path, k: int) -> Path:
    f = folder / f"wrap-{k:05d}.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "tessera.dev/v1alpha1",
                "kind": "Cluster",
                "nodes": [{"name": "n1", "inventory": str(inventory)}],
            }
        )
    )
    return f


def _digest(paths: list[Path]) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


def _run_workers(runs: list[Run], folder: Path) -> list[dict[str, object]]:
    chunks = [runs[i::WORKERS] for i in range(WORKERS)]
    procs = []
    for n, chunk in enumerate(chunks):
        spec = folder / f"runs-{n}.json"
        spec.write_text(json.dumps([r.args for r in chunk]))
        p = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("worker.py")),
                "--seconds",
                "20",
                "--memory-mib",
                "3072",
                str(spec),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        procs.append(p)
    results: list[dict[str, object]] = []
    for chunk, p in zip(chunks, procs, strict=True):
        out, err = p.communicate(timeout=20 * len(chunk) + 120)
        lines = [json.loads(x) for x in out.splitlines() if x.strip()]
        assert len(lines) == len(chunk), (
            f"worker stopped after {len(lines)} of {len(chunk)} runs: {err[-2000:]}"
        )
        for r, res in zip(chunk, lines, strict=True):
            res["run"] = r
            results.append(res)
    return results


@pytest.mark.fuzz
@pytest.mark.parametrize("kind", KINDS)
def test_fuzz(kind: str, tmp_path: Path) -> None:
    corpus = corpus_path()
    keep = os.environ.get("TESSERA_FUZZ_KEEP")
    folder = Path(keep) / kind if keep else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    runs = list(_runs(kind, corpus, folder))
    watched = sorted(
        {p for r in runs for p in r.inputs}
        | set((corpus / "inventories").iterdir())
        | set((corpus / "topologies").iterdir())
    )
    before = _digest(watched)
    results = _run_workers(runs, folder)
    failures = []
    exits = {0: 0, 1: 0, 2: 0}
    for res in results:
        run: Run = res["run"]  # type: ignore[assignment]
        where = f"{kind} seed {run.seed} ({run.mutant.name}): tessera {' '.join(run.args)}"
        if res.get("traceback"):
            failures.append(f"{where}: {res['traceback']}")
            continue
        code = res["exit"]
        if code not in (0, 1, 2):
            failures.append(f"{where}: exit {code}")
            continue
        exits[int(code)] += 1  # type: ignore[call-overload]
        if code == 2:
            lines = str(res["stderr"]).strip().splitlines()
            if len(lines) != 1 or not lines[0].startswith("tessera: error: "):
                failures.append(f"{where}: stderr is not one error line: {res['stderr']!r}")
            elif (
                not any(str(p) in lines[0] for p in run.inputs)
                and "'default/x' is neither a pod" not in lines[0]
            ):
                # (explain's target is named instead when it is not in the input)
                failures.append(f"{where}: the error names no input file: {lines[0]!r}")
    after = _digest(watched)
    changed = [p for p in before if before[p] != after.get(p)]
    assert not changed, f"input files changed: {changed}"
    assert not failures, f"{len(failures)} of {len(results)} runs failed:\n" + "\n".join(
        failures[:20]
    )
    # Every outcome was reached by some mutant (the campaign exercised refusals and successes).
    assert exits[2] > 0 and exits[0] + exits[1] > 0, exits
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
