"""``--policy topology`` keeps its word (issue 22.6): a placement split across NUMA nodes never
ranks above an unsplit one anywhere in the cluster, and ``explain`` reports the policy's own
ranking. Nodes from the bundled 8x H100 inventory and its ``nvidia-smi topo -m`` (all eight GPUs
on one NVLink domain; GPUs 0-3 on NUMA node 0, 4-7 on NUMA node 1)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tessera.api.loader import Manifest, Source, expand_workloads, parse_documents
from tessera.cli._common import examples_dir
from tessera.explain.explain import explain, render_text
from tessera.sim.cluster import Cluster, cluster_from_dict
from tessera.sim.simulate import Simulation

EX = examples_dir()
INV = (
    EX / "inventories" / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
)
TOPO = EX / "topologies" / "litgpt__tests_test_utils__topo-m.8xGPU-NV12-10nic.txt"


def two_h100() -> Cluster:
    nodes = [
        {"name": n, "inventory": str(INV), "topology": str(TOPO)} for n in ("h100-a", "h100-b")
    ]
    doc = {"apiVersion": "tessera.dev/v1alpha1", "kind": "Cluster", "metadata": {"name": "two"}}
    return cluster_from_dict({**doc, "nodes": nodes}, EX, "two.yaml")


def busy(node: str, indices: list[int]) -> str:
    """A pod pinned to ``node`` holding 40Gi and half the cores of each GPU in ``indices``."""
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: busy-{node}}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.tessera.dev
          count: {len(indices)}
          selectors:
          - cel: {{expression: 'device.attributes["gpu.tessera.dev"].index in {indices}'}}
          capacity: {{requests: {{memory: 40Gi, cores: "50"}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: inference-{node}}}
spec:
  nodeSelector: {{kubernetes.io/hostname: {node}}}
  resourceClaims: [{{name: g, resourceClaimTemplateName: busy-{node}}}]
  containers: [{{name: c, image: x, resources: {{claims: [{{name: g}}]}}}}]
"""


TRAIN = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: four}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly:
          deviceClassName: gpu.tessera.dev
          count: 4
          capacity: {requests: {memory: 60Gi}}
---
apiVersion: v1
kind: Pod
metadata: {name: train%s}
spec:
  resourceClaims: [{name: g, resourceClaimTemplateName: four}]
  containers: [{name: c, image: x, resources: {claims: [{name: g}]}}]
"""


def docs(text: str) -> list[Manifest]:
    return list(
        expand_workloads(
            Manifest(o, Source("w.yaml", d)) for d, o in parse_documents(text, "w.yaml")
        )
    )


def devices_of(res: Any, pod: str) -> list[str]:
    return [p.device.split("/", 1)[1] for p in res.placements if p.pod == f"default/{pod}"]


def test_topology_takes_the_unsplit_node_the_default_policy_takes() -> None:
    # h100-b (second in cluster order) is busier, so the topology policy (binpack nodes) tries
    # it first; its free GPUs 0, 1, 2, 7 share the NVLink domain but span both NUMA nodes,
    # while h100-a has GPUs 0-3 on NUMA node 0. Before the fix: h100-b/gpu-0,1,2,7.
    ms = docs(busy("h100-b", [3, 4, 5, 6]) + "---" + TRAIN % "")
    want = ["h100-a/gpu-0", "h100-a/gpu-1", "h100-a/gpu-2", "h100-a/gpu-3"]
    assert devices_of(Simulation(two_h100(), ms).run(), "train") == want
    assert devices_of(Simulation(two_h100(), ms, policy="topology").run(), "train") == want


def test_explain_reports_the_topology_ranking() -> None:
    ms = docs(busy("h100-b", [3, 4, 5, 6]) + "---" + TRAIN % "")
    exp = explain(two_h100(), ms, "train", policy="topology")
    assert exp.node == "h100-a"
    assert [(n.node, n.verdict, n.summary) for n in exp.nodes] == [
        (
            "h100-b",
            "fits",
            "not chosen: GPUs on one NVLink domain, split across NUMA nodes, node #1 most allocated "
            "first (ranked below h100-a)",
        ),
        (
            "h100-a",
            "fits",
            "scheduled here: ranked first by the topology policy: GPUs on one NVLink domain and one "
            "NUMA node, node #2 most allocated first",
        ),
    ]
    assert "first node in cluster order" not in render_text(exp)
    assert "placed by Tessera's topology planning policy" in render_text(exp)
    # The default policy's account is unchanged.
    plain = explain(two_h100(), ms, "train")
    assert [(n.node, n.summary) for n in plain.nodes] == [
        ("h100-a", "scheduled here: first node in cluster order where every claim fits")
    ]


def test_hami_topology_aware_annotation_ranks_the_same_way() -> None:
    # The pod asks for the topology GPU policy itself; nodes stay in cluster order. h100-a is
    # split (GPUs 0,1,2,7 free), h100-b has 4-7 on NUMA node 1.
    train = (TRAIN % "").replace(
        "metadata: {name: train}",
        "metadata: {name: train, annotations: {hami.io/gpu-scheduler-policy: topology-aware}}",
    )
    ms = docs(busy("h100-a", [3, 4, 5, 6]) + "---" + busy("h100-b", [0, 1, 2]) + "---" + train)
    res = Simulation(two_h100(), ms).run()
    assert devices_of(res, "train") == [
        "h100-b/gpu-4",
        "h100-b/gpu-5",
        "h100-b/gpu-6",
        "h100-b/gpu-7",
    ]
    exp = explain(two_h100(), ms, "train")
    assert [(n.node, n.summary) for n in exp.nodes] == [
        (
            "h100-a",
            "not chosen: GPUs on one NVLink domain, split across NUMA nodes, node #1 in cluster order "
            "(ranked below h100-b)",
        ),
        (
            "h100-b",
            "scheduled here: ranked first by the topology policy: GPUs on one NVLink domain and one "
            "NUMA node, node #2 in cluster order",
        ),
    ]


NUMA = {i: 0 if i < 4 else 1 for i in range(8)}


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([], [3, 4, 5, 6]),
        ([1, 5], [3, 4, 5, 6]),
        ([0, 4], [1, 5]),
        ([0, 1, 4, 5], [2, 3, 6]),
        ([0, 1, 2, 3, 4], [0, 4]),
    ],
)
def test_a_split_placement_never_ranks_above_an_unsplit_one(a: list[int], b: list[int]) -> None:
    text = TRAIN % ""
    if a:
        text = busy("h100-a", a) + "---" + text
    if b:
        text = busy("h100-b", b) + "---" + text
    res = Simulation(two_h100(), docs(text), policy="topology").run()
    got = devices_of(res, "train")
    node = got[0].split("/")[0]
    numa = {NUMA[int(d.rsplit("-", 1)[1])] for d in got}
    # Whether some node had 4 GPUs with 60Gi free on one NUMA node (a busy GPU has 40Gi left).
    free = {"h100-a": set(range(8)) - set(a), "h100-b": set(range(8)) - set(b)}
    unsplit = {
        n: any(len([i for i in f if NUMA[i] == z]) >= 4 for z in (0, 1)) for n, f in free.items()
    }
    assert got, res.pending
    if any(unsplit.values()):
        assert len(numa) == 1, (node, got)
        assert unsplit[node]
    assert all(int(d.rsplit("-", 1)[1]) in free[node] for d in got)
    # Whatever the fillers, the four GPUs are distinct.
    assert len(set(got)) == 4 and not any(x == y for x, y in itertools.combinations(got, 2))
