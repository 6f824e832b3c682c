"""The real kube-scheduler and DaemonSet controller against ``tessera simulate``: extended
resources served by DeviceClasses (KEP-5004) and DaemonSets.

Random differential: pods asking random amounts of extended resources (explicit names of
classes, two classes naming one resource, implicit ``deviceclass.resource.kubernetes.io/``
names, a name nothing serves; init containers and sidecars) are created one at a time on a
one-node cluster (so nothing is left to the scheduler's random tie-breaking) and each verdict
waited for; the simulation of the same objects (classes as the API server returns them, with
their creation times) must give every pod the same verdict, scheduler reason, synthesised
claim requests and devices. DaemonSet: the controller's pods, on nodes with labels and taints,
must land on the nodes (or wait on the node) the simulation expands them to.
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from tessera.api.loader import Manifest, Source
from tessera.kube.client import KubeClient, Obj
from tessera.kube.workloads import apply_objects, wait_for
from tessera.sim.cluster import SimNode
from tessera.sim.daemonset import expand_daemonsets
from tessera.sim.simulate import SimResult, Simulation

from .conftest import A10_INVENTORY, H100_INVENTORY, StartCluster, corpus_node, sim_cluster
from .test_simulate import scheduler_part, wait_verdict

pytestmark = pytest.mark.cluster

RESOURCE = "resource.k8s.io/v1"
DRIVER = 'device.driver == "gpu.tessera.dev"'


def _class(name: str, resource: str | None = None) -> Obj:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": DRIVER}}]}
    if resource:
        spec["extendedResourceName"] = resource
    return {"apiVersion": RESOURCE, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def _container(name: str, limits: Mapping[str, int], sidecar: bool = False) -> Obj:
    c: dict[str, Any] = {
        "name": name,
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"limits": {k: str(v) for k, v in limits.items()}},
    }
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def _pod(name: str, ns: str, init: list[Obj], containers: list[Obj]) -> Obj:
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "containers": containers,
    }
    if init:
        spec["initContainers"] = init
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


NAMES = (
    "example.com/h100",  # explicit name of class h100.example.com
    "example.com/shared",  # named by two classes: the newer serves it
    "deviceclass.resource.kubernetes.io/any.example.com",  # implicit only
    "deviceclass.resource.kubernetes.io/older.example.com",  # implicit of a class with a name
    "deviceclass.resource.kubernetes.io/gpu.tessera.dev",  # Tessera's own class
)


def random_pods(rng: random.Random, ns: str, n: int) -> list[Obj]:
    out = []
    for i in range(n):
        res = rng.choice(NAMES)
        init: list[Obj] = []
        containers = [_container("main", {res: rng.choice((1, 1, 1, 2))})]
        shape = rng.random()
        if shape < 0.2:
            init.append(_container("init", {res: rng.choice((1, 2, 3))}))
        elif shape < 0.3:
            init.append(_container("sidecar", {res: 1}, sidecar=True))
        elif shape < 0.4:
            containers.append(_container("second", {rng.choice(NAMES): 1}))
        elif shape < 0.45:
            containers[0]["resources"]["limits"]["example.com/nothing"] = "1"  # served by none
        out.append(_pod(f"p{i:02d}", ns, init, containers))
    return out


def _simulate(nodes: Sequence[SimNode], objects: Sequence[Mapping[str, Any]]) -> SimResult:
    manifests = [
        Manifest(copy.deepcopy(dict(o)), Source("e2e", i + 1)) for i, o in enumerate(objects)
    ]
    return Simulation(sim_cluster(nodes), manifests, seed=1).run()


def _extended_claim(client: KubeClient, pod: Obj) -> Obj | None:
    st = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    if not st.get("resourceClaimName"):
        return None
    return client.get(
        RESOURCE, "ResourceClaim", st["resourceClaimName"], pod["metadata"]["namespace"]
    )


def _shape(claim: Mapping[str, Any] | None) -> Any:
    """What must agree: the requests, and per request the devices allocated (in order)."""
    if claim is None:
        return None
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get(
        "results"
    ) or []
    return (
        [
            (r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"])
            for r in claim["spec"]["devices"]["requests"]
        ],
        [(r["request"], r["pool"], r["device"]) for r in results],
    )


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_random_extended_resources_match_the_scheduler(
    fresh_cluster: StartCluster, seed: int
) -> None:
    nodes = [corpus_node("h100", H100_INVENTORY)]
    live = fresh_cluster(nodes)
    client = live.client
    ns = "default"
    # Creation order matters for example.com/shared: the newer class serves it. A second
    # apart, so the API server's creation times (whole seconds) differ.
    apply_objects(
        client, [_class("h100.example.com", "example.com/h100"), _class("any.example.com")]
    )
    apply_objects(client, [_class("older.example.com", "example.com/shared")])
    time.sleep(1.1)
    apply_objects(client, [_class("newer.example.com", "example.com/shared")])
    classes = client.list(RESOURCE, "DeviceClass")
    rng = random.Random(seed)
    pods = random_pods(rng, ns, 12)
    verdicts: dict[str, tuple[str | None, str]] = {}
    for pod in pods:
        apply_objects(client, [pod])
        name = pod["metadata"]["name"]
        verdicts[name] = wait_verdict(client, name, ns)
    live_claims = {}
    for name in verdicts:
        p = client.get("v1", "Pod", name, ns)
        live_claims[name] = _shape(_extended_claim(client, p))

    result = _simulate(nodes, [*classes, *pods])
    sim_pods = {o["metadata"]["name"]: o for o in result.objects if o["kind"] == "Pod"}
    sim_claims = {
        (c["metadata"]["namespace"], c["metadata"]["name"]): c
        for c in result.objects
        if c["kind"] == "ResourceClaim"
    }
    pending = {p.pod.split("/")[1]: p.reason for p in result.pending}
    for name, (node, msg) in verdicts.items():
        want = (node, scheduler_part(msg) if msg else "")
        got = (
            sim_pods[name]["spec"].get("nodeName"),
            scheduler_part(pending[name]) if name in pending else "",
        )
        assert got == want, (name, pods[int(name[1:])]["spec"])
        st = sim_pods[name].get("status", {}).get("extendedResourceClaimStatus")
        sim_claim = sim_claims[(ns, st["resourceClaimName"])] if st else None
        assert _shape(sim_claim) == live_claims[name], (name, pods[int(name[1:])]["spec"])
    assert any(n is not None for n, _ in verdicts.values())


def _daemonset(ns: str, limits: Mapping[str, int]) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "probe", "namespace": ns},
        "spec": {
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"gpu": "on"},
                    "containers": [_container("main", limits)],
                },
            },
        },
    }


def test_daemonset_pods_match_the_controller_and_the_scheduler(fresh_cluster: StartCluster) -> None:
    """gpu=on nodes: an H100 node, a cordoned A10 node (its unschedulable taint is tolerated
    by every daemon pod), an H100 node with a taint the pod does not tolerate; and a node
    without the label. Two H100 devices per pod: the A10 node's pod waits there."""
    nodes = [
        corpus_node("h100-a", H100_INVENTORY, labels={"gpu": "on"}),
        corpus_node("a10-cordoned", A10_INVENTORY, labels={"gpu": "on"}),
        corpus_node("h100-reserved", H100_INVENTORY, labels={"gpu": "on"}),
        corpus_node("h100-plain", H100_INVENTORY),
    ]
    nodes[1].taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    nodes[2].taints.append({"key": "team", "value": "infer", "effect": "NoSchedule"})
    live = fresh_cluster(nodes)
    client = live.client
    ns = "default"
    ds = _daemonset(ns, {"deviceclass.resource.kubernetes.io/gpu.tessera.dev": 2})
    apply_objects(client, [ds])

    def made() -> list[Obj] | None:
        pods = client.list("v1", "Pod", ns)
        return pods if len(pods) >= 2 else None

    pods = wait_for(made, timeout=60, what="the DaemonSet's pods")
    time.sleep(2)  # the controller makes them in one sync; give a straggler the chance
    pods = client.list("v1", "Pod", ns)
    verdicts = {
        p["metadata"]["name"]: wait_verdict(client, p["metadata"]["name"], ns) for p in pods
    }
    by_target = {}
    for p in pods:
        terms = p["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        (target,) = terms[0]["matchFields"][0]["values"]
        node, msg = verdicts[p["metadata"]["name"]]
        by_target[target] = (node, scheduler_part(msg) if msg else "")
        assert [t["key"] for t in p["spec"]["tolerations"]][:6] == [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
            "node.kubernetes.io/disk-pressure",
            "node.kubernetes.io/memory-pressure",
            "node.kubernetes.io/pid-pressure",
            "node.kubernetes.io/unschedulable",
        ]
    expanded = list(
        expand_daemonsets([Manifest(copy.deepcopy(ds), Source("e2e", 1))], nodes, max_pods=100)
    )
    result = _simulate(nodes, [m.obj for m in expanded])
    pending = {p.pod.split("/")[1]: p.reason for p in result.pending}
    sim = {}
    for o in result.objects:
        if o["kind"] != "Pod":
            continue
        target = o["metadata"]["name"].removeprefix("probe-")
        name = o["metadata"]["name"]
        sim[target] = (
            o["spec"].get("nodeName"),
            scheduler_part(pending[name]) if name in pending else "",
        )
    assert sim == by_target
    assert by_target == {
        "h100-a": ("h100-a", ""),
        "a10-cordoned": (
            None,
            "0/4 nodes are available: 1 cannot allocate all claims, "
            "3 node(s) didn't satisfy plugin(s) [NodeAffinity]",
        ),
    }
    # The controller's tolerations are the simulation's.
    sim_tols = expanded[0].obj["spec"]["tolerations"]
    assert all(p["spec"]["tolerations"] == sim_tols for p in pods)
