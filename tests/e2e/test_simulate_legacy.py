"""`tessera simulate` over a cluster with nodes of both modes predicts the running legacy mode.

The live side is test_legacy_extender's (:func:`~.test_legacy_extender.start_legacy`): a fresh
control plane whose legacy Nodes carry HAMi's ``hami.io/node-nvidia-register`` annotation (built
from corpus inventories, or HAMi's own annotation from its protocol docs), the label
``gpu.tessera.dev/mode: legacy`` and ``nvidia.com/gpu`` slots; the real kube-scheduler with
``deploy/legacy/scheduler-config.yaml`` and ``tessera extender --legacy``; in the mixed case also
a DRA node publishing ResourceSlices, served by the control plane's default kube-scheduler.
Corpus HAMi pods (``../shared/corpus/hami-pods``) are created one at a time, each waited for
until bound or unschedulable. The simulation reads the same cluster the way ``tessera simulate
--kubeconfig`` does (:func:`tessera.cli._common.load_inputs`, before any pod exists) with the
same pods as manifests; its placements (node and GPU UUIDs per container) and its pending set
must equal what was bound and recorded.

Ties: kube-scheduler breaks equal scores at random. Both sides run the ``binpack`` policy
(``tessera extender --default-node-policy binpack``, ``Simulation(policy="binpack")``): the
extender's prioritize scores the node the decision prefers 10 and the next 5, which outweighs
the default plugins (deploy/legacy/scheduler-config.yaml, weight 5). Before each legacy pod the
test asserts, with :func:`tessera.scheduler.legacy.decide` over the live Nodes and bookings,
that at most one node is preferred (binpack ranks by booked usage, so the first pods are pinned
to distinct nodes with a nodeSelector, giving the empty nodes distinct usage); DRA pods have one
DRA node. So every answer compared here is defined.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_register import A10, A5000, register_node
from tessera.api.modes import MODE_LABEL, MODE_LEGACY
from tessera.api.pods import pod_containers
from tessera.cli._common import load_inputs
from tessera.convert import LEGACY_SCHEDULER, convert_pod, gpu_memory_sizes, legacy_pod
from tessera.convert.hami import DEVICES_ALLOCATED, decode_pod_devices
from tessera.inventory.hami import register_value
from tessera.kube.client import KubeClient
from tessera.kube.workloads import pod_claim_names
from tessera.scheduler.legacy import bookings, decide, legacy_node
from tessera.sim.simulate import SimResult, Simulation

from .conftest import CORPUS, StartCluster, corpus_node, temp_namespace
from .test_legacy_extender import PODS, Legacy, _allocated, start_legacy
from .test_simulate import wait_verdict

pytestmark = [pytest.mark.cluster, pytest.mark.legacy]

V100_REGISTER = (
    CORPUS
    / "inventories"
    / "HAMi__docs_develop_protocol__node-register-annotations.2xV100-PCIE-32GB.txt"
)
DEFAULT = "HAMi__examples_nvidia__default_use.yaml"  # 1 GPU, 3000 MiB, 30 cores
SHARING = "HAMi__examples_nvidia__use_sharing_card.yaml"  # [0] 40 % / 60 cores, [1] 60 % / 40
EXCLUSIVE = "HAMi__examples_nvidia__use_exclusive_card.yaml"  # 2 GPUs whole
FRACTION = "HAMi__examples_nvidia__use_memory_fraction.yaml"  # 2 GPUs, 50 % / 30 cores each
NORMAL = "HAMi__examples_nvidia__use_as_normal.yaml"  # [0], [1]: 1 GPU whole
#: The policy of both sides (module docstring).
POLICY = "binpack"
#: What is compared per pod: its node and, per container, the GPU UUIDs it got.
Placed = dict[str, tuple[str, dict[str, list[str]]]]


def legacy_mode_node(name: str, inventory: Path) -> dict[str, Any]:
    """A Node of legacy mode: the register annotation of a corpus inventory, the mode label."""
    n = register_node(name, inventory)
    n["metadata"]["labels"][MODE_LABEL] = MODE_LEGACY
    return n


def v100_node() -> dict[str, Any]:
    """A Node of legacy mode registering HAMi's own annotation value (HAMi's protocol docs:
    2x V100-PCIE-32GB, ``count`` 10 each)."""
    found = register_value(V100_REGISTER.read_text())
    assert found is not None, V100_REGISTER
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "v100-node",
            "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": "v100-node", MODE_LABEL: MODE_LEGACY},
            "annotations": {"hami.io/node-nvidia-register": found[0]},
        },
        "status": {"capacity": {"nvidia.com/gpu": "20"}},
    }


def corpus_pod(file: str, k: int, name: str, ns: str, pin: str | None = None) -> dict[str, Any]:
    """The ``k``-th Pod of a corpus file, renamed, in ``ns``, unchanged otherwise (``pin``: a
    ``kubernetes.io/hostname`` nodeSelector)."""
    docs = [
        d for d in yaml.safe_load_all((PODS / file).read_text()) if d and d.get("kind") == "Pod"
    ]
    pod = copy.deepcopy(docs[k])
    pod["metadata"] = {**pod["metadata"], "name": name, "namespace": ns}
    pod["spec"]["terminationGracePeriodSeconds"] = 0
    if pin:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": pin}
    return pod


def simulate(
    h: Legacy, tmp: Path, objects: Sequence[Mapping[str, Any]]
) -> tuple[Simulation, SimResult]:
    """``tessera simulate --kubeconfig <live> --policy binpack <objects>`` (read before any pod
    of ``objects`` exists on the live cluster), with the legacy decisions recorded."""
    path = tmp / "workloads.yaml"
    path.write_text(yaml.safe_dump_all(list(objects), sort_keys=False))
    cluster, loaded = load_inputs((str(path),), None, (), kubeconfig=str(h.kubeconfig), warnings=[])
    sim = Simulation(cluster, loaded, policy=POLICY)
    sim.record_choices = True
    return sim, sim.run()


def sim_outcome(result: SimResult) -> tuple[Placed, set[str]]:
    placed: Placed = {}
    for p in result.placements:
        name = p.pod.split("/", 1)[1]
        node, by_container = placed.setdefault(name, (p.node, {}))
        assert node == p.node and p.uuid, p
        by_container.setdefault(p.container, []).append(p.uuid)
    return placed, {p.pod.split("/", 1)[1] for p in result.pending}


def live_outcome(client: KubeClient, pods: Sequence[Mapping[str, Any]]) -> tuple[Placed, set[str]]:
    """What was bound and recorded: a legacy pod's GPUs from HAMi's
    ``hami.io/vgpu-devices-allocated`` (per container, init containers first), a DRA pod's from
    its claims' allocations and the ResourceSlices' ``uuid`` attributes."""
    uuid_of: dict[tuple[str, str, str], str] = {}
    for s in client.list("resource.k8s.io/v1", "ResourceSlice"):
        for d in s["spec"].get("devices") or []:
            u = ((d.get("attributes") or {}).get("uuid") or {}).get("string")
            if u:
                uuid_of[(s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"])] = u
    placed: Placed = {}
    pending: set[str] = set()
    for want in pods:
        md = want["metadata"]
        pod = client.get("v1", "Pod", md["name"], md["namespace"])
        node = pod["spec"].get("nodeName")
        if not node:
            pending.add(md["name"])
            continue
        by_container: dict[str, list[str]] = {}
        ann = pod["metadata"].get("annotations") or {}
        if pod["spec"].get("schedulerName") == LEGACY_SCHEDULER:
            for c, devs in zip(
                pod_containers(pod), decode_pod_devices(ann[DEVICES_ALLOCATED]), strict=True
            ):
                if devs:
                    by_container[c.name] = [d.uuid for d in devs]
        else:
            claims = pod_claim_names(pod)
            for c in pod["spec"]["containers"]:
                for ref in (c.get("resources") or {}).get("claims") or []:
                    claim = client.get(
                        "resource.k8s.io/v1", "ResourceClaim", claims[ref["name"]], md["namespace"]
                    )
                    for r in claim["status"]["allocation"]["devices"]["results"]:
                        by_container.setdefault(c["name"], []).append(
                            uuid_of[(r["driver"], r["pool"], r["device"])]
                        )
        placed[md["name"]] = (node, by_container)
    return placed, pending


def run_live(h: Legacy, pods: Sequence[dict[str, Any]], legacy: set[str]) -> dict[str, str]:
    """Create ``pods`` one at a time as the webhook admits them (those named in ``legacy``:
    :func:`tessera.convert.legacy_pod`, the schedulerName of legacy mode; the others:
    :func:`tessera.convert.convert_pod` into claims), each waited for; returns the
    unschedulable ones' messages. Before a legacy pod, asserts that the extender's decision
    prefers at most one node (the premise of comparing placements, module docstring)."""
    client = h.client
    sizes = gpu_memory_sizes(client.list("resource.k8s.io/v1", "ResourceSlice"))
    messages: dict[str, str] = {}
    for pod in pods:
        md = pod["metadata"]
        name, ns = md["name"], md["namespace"]
        if name in legacy:
            obj = legacy_pod(pod).pod
            assert obj["spec"]["schedulerName"] == LEGACY_SCHEDULER, obj["spec"]
            if not pod["spec"].get("nodeSelector"):
                objs = [client.get("v1", "Node", n["metadata"]["name"]) for n in h.nodes]
                decision = decide(
                    obj, [legacy_node(o) for o in objs], bookings(h.booked()), default_policy=POLICY
                )
                levels = decision.levels()
                top = [n for n, level in levels.items() if level == 0]
                assert len(top) <= 1, (name, levels, messages)
            client.create(obj)
        else:
            conv = convert_pod(pod, memory_sizes=sizes)
            for t in conv.templates:
                client.create(t)
            client.create(conv.pod)
        node, message = wait_verdict(client, name, ns, timeout=90)
        if node is None:
            messages[name] = message
        elif name in legacy:
            _allocated(h, ns, name)
    return messages


def test_legacy_nodes_fill_as_simulate_predicts(
    fresh_cluster: StartCluster, tmp_path: Path
) -> None:
    """Three legacy nodes (a corpus A10, a corpus 2x A5000, HAMi's own 2x V100 annotation) and
    fourteen corpus HAMi pods with spec.schedulerName tessera-legacy, binpack: the V100 node
    fills, then the A5000 node, then the A10 takes a whole-GPU pod; two-whole-GPU, whole-GPU and
    3000 MiB pods that come after stay pending. Simulate's placements and pending set are the
    live ones, and each legacy node's reason in simulate's pending reason is in the scheduler's
    message."""
    nodes = [legacy_mode_node("a10-node", A10), legacy_mode_node("a5000-node", A5000), v100_node()]
    with (
        start_legacy(
            fresh_cluster, tmp_path, nodes, extender_args=[f"--default-node-policy={POLICY}"]
        ) as h,
        temp_namespace(h.client) as ns,
    ):
        steps = [
            (DEFAULT, 0, "pin-a5000", "a5000-node"),
            (SHARING, 0, "pin-v100", "v100-node"),
            (SHARING, 1, "share-60"),
            (DEFAULT, 0, "d1"),
            (EXCLUSIVE, 0, "two-whole"),
            (FRACTION, 0, "fraction"),
            (DEFAULT, 0, "d2"),
            (DEFAULT, 0, "d3"),
            (DEFAULT, 0, "d4"),
            (NORMAL, 0, "whole-1"),
            (NORMAL, 1, "whole-2"),
            (SHARING, 0, "share-40"),
            (DEFAULT, 0, "d5"),
            (DEFAULT, 0, "d6"),
        ]
        pods = []
        for file, k, name, *pin in steps:
            pod = corpus_pod(file, k, name, ns, *pin)
            pod["spec"]["schedulerName"] = LEGACY_SCHEDULER  # as the webhook sets it
            pods.append(pod)
        sim, result = simulate(h, tmp_path, pods)
        assert set(result.modes.values()) == {"legacy"}
        messages = run_live(h, pods, {p["metadata"]["name"] for p in pods})
        live_placed, live_pending = live_outcome(h.client, pods)
        sim_placed, sim_pending = sim_outcome(result)
        assert sim_placed == live_placed
        assert sim_pending == live_pending == {"two-whole", "whole-2", "d5", "d6"}
        # Every node took pods, the V100 node and the A5000 node more than one.
        per_node = [n for n, _ in live_placed.values()]
        assert {n: per_node.count(n) for n in set(per_node)} == {
            "v100-node": 5,
            "a5000-node": 4,
            "a10-node": 1,
        }
        for name in sorted(live_pending):
            decision = sim.legacy_decisions[f"{ns}/{name}"]
            reasons = [f.reason for f in decision.nodes if not f.fits]
            assert len(reasons) == 3 and all(r in messages[name] for r in reasons), (
                name,
                reasons,
                messages[name],
            )


def test_mixed_cluster_dra_and_legacy_pods_as_simulate_predicts(
    fresh_cluster: StartCluster, tmp_path: Path
) -> None:
    """One DRA node (a corpus A10, ResourceSlices, the default scheduler) and two legacy nodes
    (2x A5000, HAMi's 2x V100). HAMi pods in a namespace labelled gpu.tessera.dev/mode=legacy
    go to legacy mode (the webhook's legacy conversion gives them tessera-legacy), those of
    another namespace become claims: DRA pods fill the A10 (a 4th 30-core share and a 40-core
    one stay pending), legacy pods the A5000 and V100 nodes (a two-GPU 50 % pod finds no room).
    Simulate reads the live Nodes and slices, is given the Namespace objects and the pods as
    written, and predicts each pod's mode, node, GPUs and the pending set."""
    nodes = [legacy_mode_node("a5000-node", A5000), v100_node()]
    dra = [corpus_node("a10-node", A10)]
    with (
        start_legacy(
            fresh_cluster,
            tmp_path,
            nodes,
            dra_nodes=dra,
            extender_args=[f"--default-node-policy={POLICY}"],
        ) as h,
        temp_namespace(h.client) as dra_ns,
        temp_namespace(h.client) as legacy_ns,
    ):
        client = h.client
        client.request(
            "PATCH",
            f"/api/v1/namespaces/{legacy_ns}",
            body={"metadata": {"labels": {MODE_LABEL: MODE_LEGACY}}},
            content_type="application/merge-patch+json",
        )
        steps = [
            (DEFAULT, 0, "d1", dra_ns),
            (DEFAULT, 0, "pin-a5000", legacy_ns, "a5000-node"),
            (SHARING, 0, "share-40", legacy_ns),
            (DEFAULT, 0, "d2", dra_ns),
            (EXCLUSIVE, 0, "two-whole", legacy_ns),
            (DEFAULT, 0, "d3", dra_ns),
            (FRACTION, 0, "fraction", legacy_ns),
            (DEFAULT, 0, "d4", dra_ns),
            (DEFAULT, 0, "late", legacy_ns),
            (SHARING, 1, "share-60", dra_ns),
        ]
        pods = [corpus_pod(f, k, name, ns_, *pin) for f, k, name, ns_, *pin in steps]
        legacy = {p["metadata"]["name"] for p in pods if p["metadata"]["namespace"] == legacy_ns}
        namespaces = [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": legacy_ns, "labels": {MODE_LABEL: MODE_LEGACY}},
            },
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": dra_ns}},
        ]
        sim, result = simulate(h, tmp_path, [*namespaces, *pods])
        assert result.modes == {
            f"{p['metadata']['namespace']}/{p['metadata']['name']}": (
                "legacy" if p["metadata"]["name"] in legacy else "dra"
            )
            for p in pods
        }
        messages = run_live(h, pods, legacy)
        live_placed, live_pending = live_outcome(client, pods)
        sim_placed, sim_pending = sim_outcome(result)
        assert sim_placed == live_placed
        assert sim_pending == live_pending == {"fraction", "d4", "share-60"}
        assert {n for name, (n, _) in live_placed.items() if name not in legacy} == {"a10-node"}
        assert {n for name, (n, _) in live_placed.items() if name in legacy} == {
            "a5000-node",
            "v100-node",
        }
        # The pending DRA pods: the default scheduler's words are simulate's.
        for p in result.pending:
            name = p.pod.split("/", 1)[1]
            if p.mode == "dra":
                assert messages[name].split(".", 1)[0] == p.reason.split(".", 1)[0], (
                    messages[name],
                    p.reason,
                )
            else:
                decision = sim.legacy_decisions[p.pod]
                assert all(f.reason in messages[name] for f in decision.nodes if not f.fits)


def test_legacy_profile_with_dynamic_resources_beside_dra_refuses_hami_pods(
    fresh_cluster: StartCluster, tmp_path: Path
) -> None:
    """Why the shipped legacy profile (and the chart's) disables the DynamicResources plugin: with
    Tessera's DeviceClass present (it serves nvidia.com/gpu), the plugin refuses the legacy
    nodes for the HAMi requests no DeviceClass serves and no node advertises (gpumem, gpucores)
    before the extender is asked, though legacy mode's decision (simulate's) places the pod."""
    nodes = [legacy_mode_node("a5000-node", A5000)]
    dra = [corpus_node("a10-node", A10)]
    with (
        start_legacy(fresh_cluster, tmp_path, nodes, dra_nodes=dra, dynamic_resources=True) as h,
        temp_namespace(h.client) as ns,
    ):
        pod = corpus_pod(DEFAULT, 0, "gpumem", ns, "a5000-node")
        pod["spec"]["schedulerName"] = LEGACY_SCHEDULER
        _, result = simulate(h, tmp_path, [pod])
        assert [p.node for p in result.placements] == ["a5000-node"]
        h.client.create(pod)
        node, message = wait_verdict(h.client, "gpumem", ns, timeout=90)
        assert node is None and "1 cannot fit resource" in message, message
