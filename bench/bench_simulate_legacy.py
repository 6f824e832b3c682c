"""Benchmark: ``tessera simulate`` placing HAMi pods on legacy-mode nodes one by one.

Nodes are legacy-mode nodes (label ``gpu.tessera.dev/mode: legacy``) whose inventory is HAMi's
own ``hami.io/node-nvidia-register`` annotation (2x V100 32GB, from HAMi's protocol document in
the corpus), one cluster-file entry with ``count: N``. Pods are HAMi's example pods, cycled in a
fixed order (a 3000 MiB / 30 % share, a 50 % memory fraction, a whole card, a card type), each
sent to the legacy scheduler (``spec.schedulerName: tessera-legacy``). Each pod is decided by
legacy mode's decision (:func:`tessera.scheduler.legacy.decide`, the extender's) over every
legacy node and the pods booked before it. Prints the placement's wall time, the placed and
pending counts, the machine's load and a digest of the answers (pod, node, devices), which must
not change with a speed-up.

    .venv/bin/python bench/bench_simulate_legacy.py --nodes 1000 --pods 5000
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from corpus_paths import corpus_path  # noqa: E402
from tessera.api.loader import Manifest, Source  # noqa: E402
from tessera.api.modes import MODE_LABEL  # noqa: E402
from tessera.sim.cluster import load_cluster  # noqa: E402
from tessera.sim.simulate import Simulation  # noqa: E402

CORPUS = corpus_path()
V100 = "inventories/HAMi__docs_develop_protocol__node-register-annotations.2xV100-PCIE-32GB.txt"
PODS = [
    "HAMi__examples_nvidia__default_use.yaml",
    "HAMi__examples_nvidia__use_memory_fraction.yaml",
    "HAMi__examples_nvidia__use_exclusive_card.yaml",
    "HAMi__examples_nvidia__specify_card_type_to_use.yaml",
]


def shapes() -> list[dict[str, Any]]:
    out = []
    for name in PODS:
        docs = yaml.safe_load_all((CORPUS / "hami-pods" / name).read_text())
        out.append(next(d for d in docs if d and d.get("kind") == "Pod"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pods", type=int, default=5000)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-simulate-legacy-"))
    entry = {
        "name": "v100",
        "count": a.nodes,
        "inventory": str(CORPUS / V100),
        "labels": {MODE_LABEL: "legacy"},
    }
    doc = {"apiVersion": "tessera.dev/v1alpha1", "kind": "Cluster", "nodes": [entry]}
    (tmp / "cluster.yaml").write_text(yaml.safe_dump(doc))
    cluster = load_cluster(tmp / "cluster.yaml")
    kinds = shapes()
    pods = []
    for i in range(a.pods):
        p = copy.deepcopy(kinds[i % len(kinds)])
        p["metadata"] = {**p["metadata"], "name": f"p{i:05d}"}
        p["spec"] = {**p["spec"], "schedulerName": "tessera-legacy"}
        pods.append(Manifest(p, Source("bench", i + 1)))
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = Simulation(cluster, pods).run()
    wall = time.perf_counter() - t0
    h = hashlib.sha256()
    for pl in result.placements:
        h.update(f"{pl.pod} {pl.container} {pl.node} {pl.uuid} {pl.memory} {pl.cores}\n".encode())
    for pe in result.pending:
        h.update(f"{pe.pod} {pe.reason}\n".encode())
    print(
        f"{a.nodes} legacy nodes, {a.pods} pods: {wall:.2f} s "
        f"({wall / max(1, a.pods) * 1000:.2f} ms per pod), placed {len(result.scheduled)}, "
        f"pending {len(result.pending)}; cores {os.cpu_count()}, load {load:.2f} -> "
        f"{os.getloadavg()[0]:.2f}; digest {h.hexdigest()[:16]}"
    )


if __name__ == "__main__":
    main()
