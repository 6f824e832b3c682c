"""Benchmark Tessera against the upstream Go allocator on the same placements.

Builds the cluster and claims of bench_simulate.py (8x H100 nodes, fractional claims drawn with a
fixed seed), writes them as one conformance scenario, and places the claims one by one, first
fit over the nodes in order:

* upstream: ``tools/kube/bin/allocator-harness -mode place`` (k8s.io/dynamic-resource-allocation
  structured allocator of Kubernetes v1.37.2; a fresh allocator per claim, nodes tried in order);
* Tessera, ``allocator``: the same loop over :class:`tessera.allocator.Allocator` (no memo);
* Tessera, ``simulate``: :class:`tessera.sim.simulate.Simulation`, which skips nodes already
  proven full for a claim shape (same answer, see Simulation._signature).

It checks that all three place every claim on the same node and device, and prints seconds and
ms per claim for each.

    .venv/bin/python bench/bench_vs_upstream.py --nodes 100 --claims 2000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from bench_simulate import make_cluster, make_workload

from tessera.allocator import AllocatedState, Allocator, Node
from tessera.sim.simulate import Simulation, default_device_class

# tools/kube's build, or prebuilt binaries in $TESSERA_KUBE_BIN (as for the tests).
HARNESS = (
    Path(os.environ["TESSERA_KUBE_BIN"])
    if os.environ.get("TESSERA_KUBE_BIN")
    else Path(__file__).resolve().parents[1] / "tools" / "kube" / "bin"
) / "allocator-harness"
FEATURES = [
    "AdminAccess",
    "ConsumableCapacity",
    "DeviceBindingAndStatus",
    "DeviceTaints",
    "PartitionableDevices",
    "PrioritizedList",
]


def claims_of(workload: list[Any]) -> list[dict[str, Any]]:
    """One ResourceClaim per pod, from its template, as the resource-claim controller makes."""
    templates = {
        m.obj["metadata"]["name"]: m.obj for m in workload if m.kind == "ResourceClaimTemplate"
    }
    out = []
    for m in workload:
        if m.kind != "Pod":
            continue
        pc = m.obj["spec"]["resourceClaims"][0]
        t = templates[pc["resourceClaimTemplateName"]]
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"{m.obj['metadata']['name']}-gpu", "namespace": "default"},
                "spec": t["spec"]["spec"],
            }
        )
    return out


def key(result: dict[str, Any] | None) -> Any:
    if result is None:
        return None
    return [
        (r["pool"], r["device"], tuple(sorted((r.get("consumedCapacity") or {}).items())))
        for r in result["devices"]["results"]
    ]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--claims", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--skip-naive", action="store_true", help="skip Tessera's memo-less allocator loop"
    )
    a = ap.parse_args()
    if not HARNESS.exists():
        sys.exit(f"{HARNESS} is missing: build it with tools/kube/build.sh")

    cluster = make_cluster(a.nodes)
    workload = make_workload(a.claims, a.seed)
    claims = claims_of(workload)
    slices = [s for n in cluster.nodes for s in n.slices]
    scenario = {
        "name": f"bench-{a.nodes}x8-{a.claims}",
        "features": FEATURES,
        "nodes": [{"name": n.name, "labels": n.labels} for n in cluster.nodes],
        "classes": [default_device_class()],
        "slices": slices,
        "claims": claims,
    }
    report: dict[str, Any] = {"nodes": a.nodes, "gpus": 8 * a.nodes, "claims": a.claims}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(scenario, f)
        f.flush()
        t0 = time.perf_counter()
        out = subprocess.run(
            [str(HARNESS), "-mode", "place", f.name], capture_output=True, text=True, check=True
        )
        wall = time.perf_counter() - t0
    up = json.loads(out.stdout)
    report["upstream_place_s"] = round(up["totalSeconds"], 2)
    report["upstream_wall_s"] = round(wall, 2)
    report["upstream_per_claim_ms"] = round(1000 * up["totalSeconds"] / a.claims, 3)
    up_keys = [(p["node"], key(p["result"])) for p in up["placements"]]

    if not a.skip_naive:
        state = AllocatedState()
        alloc = Allocator(
            slices, {"gpu.tessera.dev": default_device_class()}, state, rng=random.Random(0)
        )
        nodes = [Node(n.name, n.labels) for n in cluster.nodes]
        t0 = time.perf_counter()
        naive = []
        for c in claims:
            placed = (None, None)
            for node in nodes:
                res = alloc.allocate(node, [c])
                if res is not None:
                    c2 = dict(c, status={"allocation": res[0]})
                    state.add_claim(c2)
                    placed = (node.name, key(res[0]))
                    break
            naive.append(placed)
        t = time.perf_counter() - t0
        report["tessera_allocator_s"] = round(t, 2)
        report["tessera_allocator_per_claim_ms"] = round(1000 * t / a.claims, 3)
        report["allocator_agrees"] = naive == up_keys

    sim = Simulation(cluster, workload, seed=a.seed)
    t0 = time.perf_counter()
    res = sim.run()
    t = time.perf_counter() - t0
    report["tessera_simulate_s"] = round(t, 2)
    report["tessera_simulate_per_claim_ms"] = round(1000 * t / a.claims, 3)
    by_claim = {
        o["metadata"]["name"]: (
            o["status"]["allocation"]["devices"]["results"][0]["pool"]
            if o.get("status", {}).get("allocation")
            else None,
            key(o.get("status", {}).get("allocation")),
        )
        for o in res.objects
        if o["kind"] == "ResourceClaim"
    }
    report["simulate_agrees"] = [by_claim[c["metadata"]["name"]] for c in claims] == up_keys
    report["placed"] = up["placed"]
    report["ratio_upstream_over_simulate"] = round(report["upstream_place_s"] / max(t, 1e-9), 2)
    print(json.dumps(report))
    if not report["simulate_agrees"] or report.get("allocator_agrees") is False:
        print(
            "DIFFERENT ANSWERS: Tessera placed claims differently from the upstream allocator",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
