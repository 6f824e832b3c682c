"""Legacy mode's extender: the time of one ``filter`` plus one ``prioritize`` call for 1,000 nodes.

In process, no HTTP (:class:`tessera.extender.legacy.LegacyExtender` over fixed objects, as
its informers hold them): 1,000 Nodes whose ``hami.io/node-nvidia-register`` annotations are
built from corpus inventories (a third each 8x H100 with NUMA from its ``topo -m``, 2x RTX
A5000, 1x A10), every node already holding ``--booked`` pods of HAMi's ``default_use`` (3000
MiB, 30 cores) in ``-allocated`` records, and five corpus pod shapes (a share, a fraction of 2
GPUs, two whole GPUs, a card type, a percentage share). ``ExtenderArgs`` carry node names only
(``nodeCacheCapable: true``). The node cache is warm (one call before timing), as in a running
extender; the first call of each shape (every node parsed and decided) is printed apart. After
each timed call the pod is booked on the node the decision prefers (its record added, as bind
writes it), so the next call decides that node afresh. Prints p50/p99/max wall time
(``time.perf_counter``) per call pair over ``--rounds`` rounds of the five shapes, and the
machine's core count and load average (it may be shared).

    .venv/bin/python bench/bench_extender.py [--nodes 1000] [--rounds 20] [--booked 2] [--profile]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from corpus_paths import corpus_path  # noqa: E402
from hami_register import A10, A5000, H100, H100_TOPOLOGY, register_node  # noqa: E402
from tessera.convert.hami import DEVICES_ALLOCATED, VGPU_NODE, encode_pod_devices  # noqa: E402
from tessera.extender.legacy import static_extender  # noqa: E402
from tessera.scheduler.legacy import bookings, decide, legacy_node  # noqa: E402

PODS = corpus_path() / "hami-pods"
SHAPES = [
    "HAMi__examples_nvidia__default_use.yaml",
    "HAMi__examples_nvidia__use_memory_fraction.yaml",
    "HAMi__examples_nvidia__use_exclusive_card.yaml",
    "HAMi__examples_nvidia__specify_card_type_to_use.yaml",
    "HAMi__examples_nvidia__use_sharing_card.yaml",
]


def corpus_pod(name: str, uid: str) -> dict[str, Any]:
    doc = next(
        d for d in yaml.safe_load_all((PODS / name).read_text()) if d and d.get("kind") == "Pod"
    )
    doc["metadata"] = {**doc["metadata"], "namespace": "default", "uid": uid}
    return doc


def cluster(n: int, booked: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    kinds = [(H100, H100_TOPOLOGY), (A5000, None), (A10, None)]
    nodes, pods = [], []
    small = corpus_pod("HAMi__examples_nvidia__default_use.yaml", "")
    for i in range(n):
        inv, topo = kinds[i % len(kinds)]
        node = register_node(f"node-{i:04d}", inv, topo)
        nodes.append(node)
        ln = legacy_node(node)
        placed: list[dict[str, Any]] = []
        for k in range(booked):
            p = copy.deepcopy(small)
            p["metadata"].update(name=f"held-{i}-{k}", uid=f"held-{i}-{k}")
            fit = decide(p, [ln], bookings(placed)).nodes[0]
            assert fit.devices is not None, fit.reason
            p["metadata"]["annotations"] = {
                VGPU_NODE: ln.name,
                DEVICES_ALLOCATED: encode_pod_devices(fit.devices),
            }
            p["spec"]["nodeName"] = ln.name
            placed.append(p)
        pods += placed
    return nodes, pods


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--booked", type=int, default=2, help="pods already placed per node")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    nodes, pods = cluster(a.nodes, a.booked)
    ext = static_extender(nodes, pods)
    names = [n["metadata"]["name"] for n in nodes]
    shapes = [corpus_pod(s, f"bench-{i}") for i, s in enumerate(SHAPES)]
    cold: list[float] = []
    for p in shapes:  # warm: each node's register parsed once, each shape decided once per node
        t0 = time.perf_counter()
        got = ext.filter({"Pod": p, "NodeNames": names})
        ext.prioritize({"Pod": p, "NodeNames": got["NodeNames"]})
        cold.append(time.perf_counter() - t0)
    load = os.getloadavg()[0]
    prof = cProfile.Profile() if a.profile else None
    times: dict[str, list[float]] = {s: [] for s in SHAPES}
    fits: dict[str, int] = {}
    placed = 0
    for r in range(a.rounds):
        for s, p in zip(SHAPES, shapes, strict=True):
            p = copy.deepcopy(p)
            p["metadata"].update(name=f"stream-{r}-{s}", uid=f"stream-{r}-{s}")
            if prof:
                prof.enable()
            t0 = time.perf_counter()
            got = ext.filter({"Pod": p, "NodeNames": names})
            ext.prioritize({"Pod": p, "NodeNames": got["NodeNames"]})
            times[s].append(time.perf_counter() - t0)
            if prof:
                prof.disable()
            fits[s] = len(got["NodeNames"])
            last = ext._last
            best = last[1].best() if last is not None else None
            if best is not None and best.devices is not None:
                p["metadata"]["annotations"] = {
                    **(p["metadata"].get("annotations") or {}),
                    VGPU_NODE: best.node,
                    DEVICES_ALLOCATED: encode_pod_devices(best.devices),
                }
                pods.append(p)
                placed += 1
    every = sorted(t for ts in times.values() for t in ts)

    def q(ts: list[float], f: float) -> float:
        return sorted(ts)[min(len(ts) - 1, int(f * len(ts)))] * 1000

    print(
        f"{a.nodes} nodes, {a.booked} pods booked per node, {a.rounds} rounds ({placed} placed); "
        f"cores {os.cpu_count()}, load {load:.2f} -> {os.getloadavg()[0]:.2f}"
    )
    print(f"{'shape':55} {'fit':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for s in SHAPES:
        ts = times[s]
        print(
            f"{s:55} {fits[s]:>5} {statistics.median(ts) * 1000:8.1f} {q(ts, 0.99):8.1f} {max(ts) * 1000:8.1f}"
        )
    print(
        f"{'all':55} {'':>5} {statistics.median(every) * 1000:8.1f} {q(every, 0.99):8.1f} {every[-1] * 1000:8.1f}"
    )
    print(
        "first call per shape (cold: nodes parsed and decided): "
        + ", ".join(f"{t * 1000:.0f}" for t in cold)
        + " ms"
    )
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
