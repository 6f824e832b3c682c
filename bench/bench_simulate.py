"""Benchmark: place fractional GPU claims one by one on a large simulated cluster.

Nodes are 8x H100 80GB (the corpus gpud inventory's GPUs), described as a user writes a fleet:
one cluster-file entry with ``count: N`` (``docs/cluster-file.md``; every copy gets its own GPU
UUIDs). Claims come from a ResourceClaimTemplate per shape, one pod per claim, shapes drawn with
a fixed seed from realistic inference/training slices. Reports, apart, the generation of the
pods (the script's stand-in for reading them), the setup (cluster file -> slices -> the
allocator's index, every pod validated) and the placement: wall and CPU time, time per
claim, peak Python heap (tracemalloc, with --trace-memory) and RSS, and the placed / pending
counts.

Identical answers: the run's placements (pod, node, device, request, consumed capacity,
shareID) and pending reasons are hashed, and the digest is compared with the one recorded in
``bench/simulate_digests.json`` for the same nodes, claims and seed (recorded from the code
before the speed-ups of issue 16). A difference fails the run (exit 1); ``--record`` writes the
digest of a configuration not recorded yet.

    .venv/bin/python bench/bench_simulate.py --nodes 100 --claims 10000
    .venv/bin/python bench/bench_simulate.py --nodes 1000 --claims 50000 --json out.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import resource
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tessera.api.heap import collector_paused
from tessera.api.loader import Manifest, Source
from tessera.sim.cluster import Cluster, cluster_from_dict
from tessera.sim.simulate import SimResult, Simulation

EXAMPLES = Path(__file__).resolve().parents[1] / "src" / "tessera" / "examples"
H100 = (
    EXAMPLES
    / "inventories"
    / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
)
DIGESTS = Path(__file__).resolve().parent / "simulate_digests.json"

# (memory, cores) shapes and their weights: small inference slices dominate.
SHAPES = [
    ("4Gi", "10", 30),
    ("8Gi", "20", 30),
    ("16Gi", "25", 20),
    ("20Gi", "30", 10),
    ("40Gi", "50", 7),
    ("80Gi", "100", 3),
]


def make_cluster(n_nodes: int) -> Cluster:
    """The fleet as a cluster file gives it: one entry, ``count: n_nodes`` (nodes node-0 ..)."""
    doc = {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "Cluster",
        "nodes": [{"name": "node", "count": n_nodes, "inventory": str(H100.relative_to(EXAMPLES))}],
    }
    return cluster_from_dict(doc, EXAMPLES, "bench-cluster.yaml")


def make_workload(n_claims: int, seed: int) -> list[Manifest]:
    rng = random.Random(seed)
    out: list[Manifest] = []
    src = Source("bench", 1)
    for mem, cores, _ in SHAPES:
        out.append(
            Manifest(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaimTemplate",
                    "metadata": {"name": f"slice-{mem.lower()}-{cores}", "namespace": "default"},
                    "spec": {
                        "spec": {
                            "devices": {
                                "requests": [
                                    {
                                        "name": "gpu",
                                        "exactly": {
                                            "deviceClassName": "gpu.tessera.dev",
                                            "capacity": {
                                                "requests": {"memory": mem, "cores": cores}
                                            },
                                        },
                                    }
                                ]
                            }
                        }
                    },
                },
                src,
            )
        )
    weights = [w for *_, w in SHAPES]
    # One draw per claim, as n_claims calls of rng.choices(SHAPES, weights) would make.
    for i, (mem, cores, _) in enumerate(rng.choices(SHAPES, weights, k=n_claims)):
        out.append(
            Manifest(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"pod-{i:06d}", "namespace": "default"},
                    "spec": {
                        "resourceClaims": [
                            {
                                "name": "gpu",
                                "resourceClaimTemplateName": f"slice-{mem.lower()}-{cores}",
                            }
                        ],
                        "containers": [
                            {
                                "name": "app",
                                "image": "x",
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                    },
                },
                src,
            )
        )
    return out


def digest(result: SimResult) -> str:
    """sha256 of every placement (pod, container, node, device, request, consumed memory and
    cores, shareID) and every pending pod's reason, in the run's order."""
    h = hashlib.sha256()
    for p in result.placements:
        h.update(
            f"P {p.pod} {p.container} {p.node} {p.device} {p.request} {p.memory} {p.cores} {p.share_id}\n".encode()
        )
    for q in result.pending:
        h.update(f"U {q.pod} {q.reason}\n".encode())
    return h.hexdigest()


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(
    n_nodes: int, n_claims: int, seed: int, progress: bool, trace: bool = False
) -> dict[str, Any]:
    if trace:
        tracemalloc.start()
    t0 = time.perf_counter()
    c0 = _cpu()
    # The script's stand-in for reading the pods from files: generated with the cyclic collector
    # paused, as tessera.api.loader.load_files reads them. Timed apart: not Tessera's work.
    with collector_paused():
        workload = make_workload(n_claims, seed)
    t_generate = time.perf_counter() - t0
    c_generate = _cpu() - c0
    t0 = time.perf_counter()
    c0 = _cpu()
    cluster = make_cluster(n_nodes)
    sim = Simulation(cluster, workload, seed=seed)
    t_setup = time.perf_counter() - t0
    c_setup = _cpu() - c0
    done = 0
    if progress:
        with Progress(
            TextColumn("placing"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            transient=True,
        ) as bar:
            task = bar.add_task("placing", total=n_claims)

            def tick(_: str) -> None:
                nonlocal done
                done += 1
                if done % 200 == 0 or done == n_claims:
                    bar.update(task, completed=done)

            t1 = time.perf_counter()
            result = sim.run(on_pod=tick)
    else:
        t1 = time.perf_counter()
        result = sim.run()
    t_place = time.perf_counter() - t1
    c_place = _cpu() - c0 - c_setup
    peak = 0
    if trace:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return {
        "nodes": n_nodes,
        "gpus": n_nodes * 8,
        "claims": n_claims,
        "scheduled": len(result.scheduled),
        "pending": len(result.pending),
        "generate_s": round(t_generate, 2),
        "generate_cpu_s": round(c_generate, 2),
        "setup_s": round(t_setup, 2),
        "place_s": round(t_place, 2),
        "setup_cpu_s": round(c_setup, 2),
        "place_cpu_s": round(c_place, 2),
        "per_claim_ms": round(1000 * t_place / n_claims, 3),
        "digest": digest(result),
        "peak_heap_mib": round(peak / 2**20, 1) if trace else None,
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--claims", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument(
        "--trace-memory", action="store_true", help="also measure the Python heap peak (slow)"
    )
    ap.add_argument(
        "--record",
        action="store_true",
        help="record the digest of a configuration not recorded yet",
    )
    a = ap.parse_args()
    r = run(
        a.nodes,
        a.claims,
        a.seed,
        progress=not a.no_progress and sys.stderr.isatty(),
        trace=a.trace_memory,
    )
    print(json.dumps(r))
    if a.json:
        a.json.write_text(json.dumps(r, indent=2) + "\n")
    key = f"nodes={a.nodes} claims={a.claims} seed={a.seed}"
    known = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    if key not in known:
        if a.record:
            known[key] = r["digest"]
            DIGESTS.write_text(json.dumps(known, indent=2, sort_keys=True) + "\n")
            print(f"recorded the digest of {key}", file=sys.stderr)
        else:
            print(
                f"no recorded digest for {key}: answers not compared (--record adds one)",
                file=sys.stderr,
            )
    elif known[key] != r["digest"]:
        print(
            f"DIFFERENT ANSWERS: placements or pending reasons differ from the recorded run ({key}): "
            f"digest {r['digest']} != {known[key]}",
            file=sys.stderr,
        )
        sys.exit(1)
    else:
        print(f"same answers as the recorded run ({key})", file=sys.stderr)


if __name__ == "__main__":
    main()
