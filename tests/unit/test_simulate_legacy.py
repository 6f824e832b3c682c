"""`tessera simulate` over nodes of both modes: legacy nodes described by HAMi's register
annotation (a cluster file's ``labels: {gpu.tessera.dev/mode: legacy}``, or a live Node's label),
legacy pods placed by legacy mode's decision, DRA pods by the allocator, each pod's mode shown.
The e2e differential against the running legacy mode is tests/e2e/test_simulate_legacy.py."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tessera.api.errors import ManifestError, TesseraError
from tessera.api.loader import Manifest, Source
from tessera.api.modes import MODE_LABEL, NodeModeError, labels_mode, node_mode
from tessera.cli import main
from tessera.convert.hami import DEVICES_ALLOCATED, VGPU_NODE, decode_pod_devices
from tessera.driver.guard import SecondManagerError
from tessera.driver.guard import node_mode as guard_node_mode
from tessera.inventory.hami import register_sharing, register_value
from tessera.scheduler.legacy import bookings, decide, legacy_node
from tessera.sim.cluster import load_cluster
from tessera.sim.inputs import node_from_object
from tessera.sim.simulate import Simulation

V100 = "inventories/HAMi__docs_develop_protocol__node-register-annotations.2xV100-PCIE-32GB.txt"
A10 = "inventories/gpud__nvidia-query_testdata__nvidia-smi-q.535.129.03.A10.txt"
SHARING = "hami-pods/HAMi__examples_nvidia__use_sharing_card.yaml"
DEFAULT = "hami-pods/HAMi__examples_nvidia__default_use.yaml"
LEGACY = {MODE_LABEL: "legacy"}


def write_cluster(tmp: Path, corpus: Path, nodes: list[dict[str, Any]]) -> Path:
    for n in nodes:
        if "inventory" in n:
            n["inventory"] = str(corpus / n["inventory"])
    p = tmp / "cluster.yaml"
    p.write_text(
        yaml.safe_dump({"apiVersion": "tessera.dev/v1alpha1", "kind": "Cluster", "nodes": nodes})
    )
    return p


def corpus_pods(corpus: Path, file: str, names: list[str], **spec: Any) -> list[dict[str, Any]]:
    """The corpus file's Pods, cycled over ``names``, with ``spec`` fields added."""
    docs = [
        d for d in yaml.safe_load_all((corpus / file).read_text()) if d and d.get("kind") == "Pod"
    ]
    out = []
    for i, name in enumerate(names):
        p = copy.deepcopy(docs[i % len(docs)])
        p["metadata"] = {**p["metadata"], "name": name}
        p["spec"] = {**p["spec"], **spec}
        out.append(p)
    return out


def manifests(objs: list[dict[str, Any]]) -> list[Manifest]:
    return [Manifest(o, Source("test", i + 1)) for i, o in enumerate(objs)]


def test_one_judgement_of_a_nodes_mode() -> None:
    assert labels_mode("n", {}) == "dra" and labels_mode("n", LEGACY) == "legacy"
    assert node_mode(None) == "dra"
    with pytest.raises(
        NodeModeError, match=f"Node n label {MODE_LABEL}='Legacy': must be one of dra, legacy"
    ):
        labels_mode("n", {MODE_LABEL: "Legacy"})
    # The guard's reading is this one, in its own error.
    node = {"metadata": {"name": "n", "labels": {MODE_LABEL: "x"}}}
    with pytest.raises(SecondManagerError, match=f"Node n label {MODE_LABEL}='x'"):
        guard_node_mode(node)


def test_cluster_file_legacy_nodes_are_their_register_annotation(
    corpus: Path, tmp_path: Path
) -> None:
    """``count: 2`` legacy nodes from HAMi's own annotation: each copy registers its own GPU
    UUIDs (the same copy UUIDs DRA copies get), with HAMi's count; no ResourceSlices."""
    path = write_cluster(
        tmp_path, corpus, [{"name": "v100", "count": 2, "inventory": V100, "labels": LEGACY}]
    )
    cluster = load_cluster(path)
    assert [(n.name, n.mode, n.slices) for n in cluster.nodes] == [
        ("v100-0", "legacy", []),
        ("v100-1", "legacy", []),
    ]
    original = register_value((corpus / V100).read_text())
    assert original is not None
    shared = [
        register_sharing(n.annotations["hami.io/node-nvidia-register"]) for n in cluster.nodes
    ]
    assert all(list(s.values()) == [(10, True), (10, True)] for s in shared)
    uuids = [u for s in shared for u in s]
    assert len(set(uuids)) == 4 and not set(uuids) & set(register_sharing(original[0]))
    # What the legacy decision reads from each copy: two V100s of 32 GiB.
    ln = legacy_node(cluster.nodes[1].node_object())
    assert (
        ln.memory_sizes == (32 * 2**30,)
        and len(ln.slices) == 1
        and set(ln.sharing) == set(shared[1])
    )


@pytest.mark.parametrize(
    ("entry", "field", "words"),
    [
        (
            {"inventory": A10},
            "nodes[0].inventory",
            "HAMi's hami.io/node-nvidia-register annotation",
        ),
        ({"slices": "s.yaml"}, "nodes[0].slices", "publishes no ResourceSlices"),
        (
            {"inventory": V100, "topology": "t.txt"},
            "nodes[0].topology",
            "publishes no ResourceSlices",
        ),
        ({}, "nodes[0]", "needs 'inventory'"),
    ],
)
def test_cluster_file_legacy_node_errors(
    corpus: Path, tmp_path: Path, entry: dict[str, Any], field: str, words: str
) -> None:
    path = write_cluster(tmp_path, corpus, [{"name": "n", "labels": LEGACY, **entry}])
    with pytest.raises(ManifestError) as e:
        load_cluster(path)
    assert e.value.field == field and words in str(e.value), str(e.value)


def test_cluster_file_mode_label_must_be_a_mode(corpus: Path, tmp_path: Path) -> None:
    path = write_cluster(
        tmp_path, corpus, [{"name": "n", "inventory": A10, "labels": {MODE_LABEL: "DRA"}}]
    )
    with pytest.raises(ManifestError) as e:
        load_cluster(path)
    assert (
        e.value.field == f"nodes[0].labels[{MODE_LABEL}]"
        and "must be one of dra, legacy" in str(e.value)
    )


def test_live_node_labelled_legacy_keeps_its_annotations(corpus: Path) -> None:
    found = register_value((corpus / V100).read_text())
    assert found is not None
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "g1",
            "labels": LEGACY,
            "annotations": {"hami.io/node-nvidia-register": found[0]},
        },
    }
    n = node_from_object(Manifest(node, Source("nodes.yaml", 1)))
    assert (
        n.mode == "legacy"
        and n.slices == []
        and n.annotations == {"hami.io/node-nvidia-register": found[0]}
    )
    # Without the label the same Node is planned in DRA mode: its annotation as its inventory.
    plain = copy.deepcopy(node)
    plain["metadata"]["labels"] = {}
    assert len(node_from_object(Manifest(plain, Source("nodes.yaml", 1))).slices) == 1
    bad = copy.deepcopy(node)
    bad["metadata"]["labels"] = {MODE_LABEL: "both"}
    with pytest.raises(ManifestError) as e:
        node_from_object(Manifest(bad, Source("nodes.yaml", 1)))
    assert e.value.field == f"metadata.labels[{MODE_LABEL}]" and "Node g1" in str(e.value)


def test_mixed_cluster_places_each_pod_in_its_mode(corpus: Path, tmp_path: Path) -> None:
    """A DRA A10 and two legacy V100 pairs; six sharing-card pods (in turn 40 % / 60 cores and
    60 % / 40 cores), the even ones (40 %) given the legacy scheduler. Legacy pods land on V100s only, each as
    legacy mode's decision says against the pods before it (the extender's function, over the
    records simulate writes on its pods); DRA pods on the A10 only, until it is full."""
    path = write_cluster(
        tmp_path,
        corpus,
        [
            {"name": "a10", "inventory": A10},
            {"name": "v100", "count": 2, "inventory": V100, "labels": LEGACY},
        ],
    )
    cluster = load_cluster(path)
    pods = corpus_pods(corpus, SHARING, [f"p{i}" for i in range(6)])
    for p in pods[::2]:
        p["spec"]["schedulerName"] = "tessera-legacy"
    sim = Simulation(cluster, manifests(pods))
    result = sim.run()
    assert result.modes == {f"default/p{i}": ("legacy" if i % 2 == 0 else "dra") for i in range(6)}
    placed = {p.pod.split("/")[1]: (p.mode, p.node) for p in result.placements}
    assert placed == {
        "p0": ("legacy", "v100-0"),
        "p1": ("dra", "a10"),
        "p2": ("legacy", "v100-0"),
        "p4": ("legacy", "v100-1"),
    }
    # Two 60 % shares do not fit on one A10, and the DRA pods may not use the V100s.
    assert [(p.pod, p.mode) for p in result.pending] == [
        ("default/p3", "dra"),
        ("default/p5", "dra"),
    ]
    assert result.pending[0].reason.startswith(
        "0/3 nodes are available: 3 cannot allocate all claims."
    )
    # Each legacy pod as decide() places it given the records on the pods simulate placed before.
    out = {o["metadata"]["name"]: o for o in result.objects if o.get("kind") == "Pod"}
    nodes = [legacy_node(n.node_object()) for n in cluster.nodes if n.mode == "legacy"]
    before: list[dict[str, Any]] = []
    for p in pods[::2]:
        got = out[p["metadata"]["name"]]
        best = decide(p, nodes, bookings(before)).best()
        assert best is not None and got["spec"]["nodeName"] == best.node
        ann = got["metadata"]["annotations"]
        assert ann[VGPU_NODE] == best.node == got["metadata"]["labels"][VGPU_NODE]
        assert decode_pod_devices(ann[DEVICES_ALLOCATED]) == best.devices
        rows = [
            (x.uuid, x.memory, x.cores)
            for x in result.placements
            if x.pod.endswith("/" + p["metadata"]["name"])
        ]
        assert rows == [(d.uuid, f"{d.memory_mib}Mi", str(d.cores)) for d in best.devices[0]]
        before.append(got)
    # The GPU table holds the legacy GPUs too, with what legacy mode booked on them.
    legacy_gpus = {
        (u.node, u.device): (u.shares, u.cores_allocated)
        for u in result.gpus
        if u.node.startswith("v100")
    }
    assert legacy_gpus == {
        ("v100-0", "gpu-0"): (1, 60),
        ("v100-0", "gpu-1"): (1, 60),
        ("v100-1", "gpu-0"): (1, 60),
        ("v100-1", "gpu-1"): (0, 0),
    }


def test_a_pods_mode_without_nodes_says_so(corpus: Path, tmp_path: Path) -> None:
    dra_only = load_cluster(write_cluster(tmp_path, corpus, [{"name": "a10", "inventory": A10}]))
    pod = corpus_pods(corpus, DEFAULT, ["legacy-pod"], schedulerName="tessera-legacy")
    result = Simulation(dra_only, manifests(pod)).run()
    (pend,) = result.pending
    assert pend.mode == "legacy" and pend.reason.startswith(
        "0/1 nodes are available: no node is in legacy mode (label gpu.tessera.dev/mode=legacy)"
    )

    legacy_only = load_cluster(
        write_cluster(tmp_path, corpus, [{"name": "v100", "inventory": V100, "labels": LEGACY}])
    )
    idle = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "idle"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    result = Simulation(
        legacy_only, manifests([*corpus_pods(corpus, DEFAULT, ["dra-pod"]), idle])
    ).run()
    (pend,) = result.pending
    assert pend.mode == "dra" and pend.reason.startswith(
        "0/1 nodes are available: no node is in DRA mode (all 1 are labelled gpu.tessera.dev/mode=legacy"
    )
    assert result.scheduled == ["default/idle"]


def test_namespace_labelled_legacy_sends_hami_pods_to_legacy_mode(
    corpus: Path, tmp_path: Path
) -> None:
    """The webhook's legacy conversion for a Namespace labelled gpu.tessera.dev/mode=legacy: its
    HAMi pods get the legacy scheduler and keep their requests; another namespace's become claims.
    The legacy pods that fit nowhere are pending with each legacy node's reason."""
    cluster = load_cluster(
        write_cluster(
            tmp_path,
            corpus,
            [
                {"name": "a10", "inventory": A10},
                {"name": "v100", "inventory": V100, "labels": LEGACY},
            ],
        )
    )
    ns = [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": n, "labels": LEGACY if n == "old" else {}},
        }
        for n in ("old", "new")
    ]
    pods = []
    for n in ("old", "new"):
        for p in corpus_pods(corpus, SHARING, [f"{n}-{i}" for i in range(5)]):
            p["metadata"]["namespace"] = n
            pods.append(p)
    sim = Simulation(cluster, manifests([*ns, *pods]))
    sim.record_choices = True
    result = sim.run()
    assert {r: m for r, m in result.modes.items()} == {
        **{f"old/old-{i}": "legacy" for i in range(5)},
        **{f"new/new-{i}": "dra" for i in range(5)},
    }
    out = {o["metadata"]["name"]: o for o in result.objects if o.get("kind") == "Pod"}
    assert out["old-0"]["spec"]["schedulerName"] == "tessera-legacy"
    assert (
        out["old-0"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"]
        == 40
    )
    assert "resourceClaims" not in out["old-0"]["spec"] and "resourceClaims" in out["new-0"]["spec"]
    assert {p.node for p in result.placements if p.pod.startswith("old/")} == {"v100"}
    assert {p.node for p in result.placements if p.pod.startswith("new/")} == {"a10"}
    legacy_pending = [p for p in result.pending if p.mode == "legacy"]
    assert [p.pod for p in legacy_pending] == ["old/old-4"]
    (fit,) = sim.legacy_decisions["old/old-4"].nodes
    assert not fit.fits and legacy_pending[0].reason == (
        f"0/2 nodes are available: 1 {fit.reason}, 1 node(s) in DRA mode (label {MODE_LABEL} not legacy)."
    )


def test_cli_table_and_json_say_each_pods_mode(corpus: Path, tmp_path: Path) -> None:
    path = write_cluster(
        tmp_path,
        corpus,
        [{"name": "a10", "inventory": A10}, {"name": "v100", "inventory": V100, "labels": LEGACY}],
    )
    pods = corpus_pods(corpus, SHARING, ["l0", "d0"])
    pods[0]["spec"]["schedulerName"] = "tessera-legacy"
    f = tmp_path / "pods.yaml"
    f.write_text(yaml.safe_dump_all(pods))
    r = CliRunner().invoke(main, ["simulate", "--cluster", str(path), str(f)])
    assert r.exit_code == 0, r.stderr
    rows = {
        line.split()[0]: line.split()
        for line in r.stdout.splitlines()
        if line.startswith("default/")
    }
    assert rows["default/l0"][:3] == ["default/l0", "ubuntu-container", "legacy"]
    assert rows["default/l0"][3].startswith("v100/gpu-") and rows["default/l0"][-1] == "-"
    assert rows["default/d0"][:4] == ["default/d0", "ubuntu-container", "dra", "a10/gpu-0"]
    assert re.search(r"^POD\s+CONTAINER\s+MODE\s+DEVICE", r.stdout, re.M)
    r = CliRunner().invoke(main, ["simulate", "--cluster", str(path), str(f), "-o", "json"])
    assert r.exit_code == 0, r.stderr
    items = {o["metadata"]["name"]: o for o in json.loads(r.stdout)["items"] if o["kind"] == "Pod"}
    assert items["l0"]["metadata"]["annotations"][VGPU_NODE] == "v100"
    assert items["l0"]["spec"]["nodeName"] == "v100" and items["d0"]["spec"]["nodeName"] == "a10"
    assert "resourceClaims" in items["d0"]["spec"] and VGPU_NODE not in (
        items["d0"]["metadata"].get("annotations") or {}
    )


def test_an_unreadable_mode_label_is_bad_input(corpus: Path) -> None:
    from tessera.sim.cluster import Cluster, SimNode

    with pytest.raises(TesseraError, match="must be one of dra, legacy"):
        Simulation(Cluster([SimNode("n", {MODE_LABEL: "x"})]), [])


def test_explain_a_legacy_pod_per_node(corpus: Path, tmp_path: Path) -> None:
    """explain reports what legacy mode's decision said at the pod's turn: the DRA node takes
    no legacy pod, the chosen V100 node, and for a pod that fits nowhere each legacy node's
    reason (the same words as its pending reason)."""
    from tessera.explain.explain import explain

    cluster = load_cluster(
        write_cluster(
            tmp_path,
            corpus,
            [
                {"name": "a10", "inventory": A10},
                {"name": "v100", "inventory": V100, "labels": LEGACY},
            ],
        )
    )
    pods = corpus_pods(corpus, SHARING, [f"p{i}" for i in range(5)], schedulerName="tessera-legacy")
    exp = explain(cluster, manifests(pods), "default/p0")
    assert exp.status == "scheduled" and exp.node == "v100"
    assert [(n.node, n.verdict) for n in exp.nodes] == [("a10", "refused"), ("v100", "fits")]
    assert "in DRA mode" in exp.nodes[0].summary and exp.nodes[1].summary == "scheduled here"
    (line,) = exp.placements
    assert line.startswith("container ubuntu-container: ") and "memory 13107Mi, cores 60" in line
    late = explain(cluster, manifests(pods), "default/p4")
    assert late.status == "pending"
    refused = late.nodes[1]
    assert refused.verdict == "refused" and refused.summary in late.reason
