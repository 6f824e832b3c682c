"""`tessera simulate` predicts what the real kube-scheduler does.

Each test drives the real control plane (pods created one at a time, each waited for until
the scheduler bound it or reported it unschedulable) and runs a :class:`Simulation` over the
same nodes (ResourceSlices built by ``tessera.inventory`` from corpus inventories) and the
same manifests, then compares the outcomes.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import pytest
import yaml

from tessera import DEVICE_CLASS_NAME
from tessera.api.loader import Manifest, Source
from tessera.api.quantity import Quantity
from tessera.convert import convert_pod
from tessera.kube.client import KubeClient, Obj
from tessera.kube.workloads import (
    apply_objects,
    gpu_claim_template,
    gpu_pod,
    pod_claim_names,
    pod_condition,
    wait_for,
)
from tessera.sim.cluster import SimNode
from tessera.sim.simulate import SimResult, Simulation

from .conftest import (
    A10_INVENTORY,
    A5000_INVENTORY,
    CORPUS,
    H100_INVENTORY,
    H100_TOPOLOGY,
    LiveCluster,
    StartCluster,
    corpus_node,
    inventory_of,
    sim_cluster,
)

pytestmark = pytest.mark.cluster

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
RESOURCE = "resource.k8s.io/v1"
HAMI_POD = CORPUS / "hami-pods" / "HAMi__examples_nvidia__default_use.yaml"


# ---- helpers ---------------------------------------------------------------------------


def simulate(nodes: Sequence[SimNode], objects: Sequence[Mapping[str, Any]]) -> SimResult:
    """``tessera simulate`` over ``nodes`` with ``objects`` as the manifests, in order."""
    manifests = [
        Manifest(copy.deepcopy(dict(o)), Source("e2e-workload", i + 1))
        for i, o in enumerate(objects)
    ]
    return Simulation(sim_cluster(nodes), manifests, seed=1).run()


def scheduler_part(message: str) -> str:
    """``0/N nodes are available: <per-node reasons>`` (without preemption or Tessera notes)."""
    return message.split(".", 1)[0]


def wait_verdict(
    client: KubeClient, name: str, namespace: str, timeout: float = 60.0
) -> tuple[str | None, str]:
    """Wait until the scheduler bound the pod (``(node, "")``) or reported it unschedulable
    (``(None, message)``)."""
    last: list[Obj] = []

    def check() -> tuple[str | None, str] | None:
        pod = client.get("v1", "Pod", name, namespace)
        last[:] = [pod]
        if pod.get("spec", {}).get("nodeName"):
            return str(pod["spec"]["nodeName"]), ""
        cond = pod_condition(pod)
        if cond and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
            return None, str(cond.get("message", ""))
        return None

    return wait_for(
        check,
        timeout=timeout,
        what=f"a scheduling verdict for pod {namespace}/{name}",
        last=lambda: repr(pod_condition(last[0]) if last else None),
    )


def live_allocations(client: KubeClient, namespace: str) -> dict[str, dict[str, Obj | None]]:
    """Per pod, per pod claim name: the claim's ``status.allocation`` on the API server."""
    claims = {c["metadata"]["name"]: c for c in client.list(RESOURCE, "ResourceClaim", namespace)}
    out: dict[str, dict[str, Obj | None]] = {}
    for pod in client.list("v1", "Pod", namespace):
        out[pod["metadata"]["name"]] = {
            ref: (claims[cname].get("status") or {}).get("allocation")
            for ref, cname in pod_claim_names(pod).items()
        }
    return out


def sim_allocations(result: SimResult) -> dict[str, dict[str, Obj | None]]:
    """The same map as :func:`live_allocations`, from the simulation's output objects."""
    claims = {
        (c["metadata"]["namespace"], c["metadata"]["name"]): c
        for c in result.objects
        if c.get("kind") == "ResourceClaim"
    }
    out: dict[str, dict[str, Obj | None]] = {}
    for pod in (o for o in result.objects if o.get("kind") == "Pod"):
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        refs: dict[str, Obj | None] = {}
        for pc in pod["spec"].get("resourceClaims") or []:
            cname = pc.get("resourceClaimName") or f"{name}-{pc['name']}"
            refs[pc["name"]] = (claims[(ns, cname)].get("status") or {}).get("allocation")
        out[name] = refs
    return out


def comparable(allocation: Obj | None) -> list[tuple[Any, ...]] | None:
    """What must agree per claim: request, driver, pool, device, consumed capacity, and a
    shareID that is a lower-case RFC 4122 UUID (present exactly for shares)."""
    if allocation is None:
        return None
    out = []
    for r in allocation["devices"]["results"]:
        share = r.get("shareID")
        assert share is None or UUID_RE.match(share), share
        out.append(
            (
                r["request"],
                r["driver"],
                r["pool"],
                r["device"],
                r.get("consumedCapacity"),
                share is not None,
            )
        )
    return out


def booked_per_gpu(
    allocations: Mapping[str, Mapping[str, Obj | None]],
) -> dict[tuple[str, str], tuple[Fraction, Fraction]]:
    """Memory (bytes) and cores booked per (pool, device), each claim counted once."""
    seen: set[int] = set()
    booked: dict[tuple[str, str], tuple[Fraction, Fraction]] = {}
    for refs in allocations.values():
        for alloc in refs.values():
            if alloc is None or id(alloc) in seen:
                continue
            seen.add(id(alloc))
            for r in alloc["devices"]["results"]:
                cc = r.get("consumedCapacity") or {}
                mem, cores = booked.get((r["pool"], r["device"]), (Fraction(0), Fraction(0)))
                booked[(r["pool"], r["device"])] = (
                    mem + Quantity.parse(cc.get("memory", "0")).value,
                    cores + Quantity.parse(cc.get("cores", "0")).value,
                )
    return booked


# ---- 2. one share ---------------------------------------------------------------------


def test_share_allocation_matches_simulate(kube_cluster: LiveCluster, kube_namespace: str) -> None:
    """One pod with an 8Gi / 20-core ResourceClaimTemplate. Single node: the pod is pinned
    (nodeSelector) to a node of its own, the 2x RTX A5000 of the corpus, so the placement is
    determined; ``tessera simulate`` over that node and the same two manifests must predict the
    same pool, device, consumedCapacity and a shareID."""
    client = kube_cluster.client
    ns = kube_namespace
    node = corpus_node(
        "share-a5000", A5000_INVENTORY, labels={"tessera.dev/test-node": "share-a5000"}
    )
    kube_cluster.register(inventory_of([node]))
    objects = [
        gpu_claim_template("gpu-8g-20c", namespace=ns, memory="8Gi", cores=20),
        gpu_pod(
            "worker",
            namespace=ns,
            template="gpu-8g-20c",
            node_selector={"tessera.dev/test-node": "share-a5000"},
        ),
    ]
    apply_objects(client, objects)
    assert wait_verdict(client, "worker", ns) == ("share-a5000", "")

    live = live_allocations(client, ns)["worker"]["gpu"]
    assert live is not None
    (r,) = live["devices"]["results"]
    assert (r["request"], r["driver"], r["pool"], r["device"]) == (
        "gpu",
        "gpu.tessera.dev",
        "share-a5000",
        "gpu-0",
    )
    assert r["consumedCapacity"] == {"memory": "8Gi", "cores": "20"}
    assert UUID_RE.match(r["shareID"]), r["shareID"]

    result = simulate([node], objects)
    assert result.scheduled == [f"{ns}/worker"] and result.pending == []
    predicted = sim_allocations(result)["worker"]["gpu"]
    assert comparable(predicted) == comparable(live)
    assert predicted is not None and predicted["nodeSelector"] == live["nodeSelector"]
    (p,) = result.placements
    assert (p.node, p.device, p.memory, p.cores) == (
        "share-a5000",
        "gpu.tessera.dev/share-a5000/gpu-0",
        "8Gi",
        "20",
    )
    assert p.uuid == "GPU-12345678-aaaa-bbbb-cccc-0123456789ab"


# ---- 3. fill until pending --------------------------------------------------------------


def test_fill_until_pending_matches_simulate(fresh_cluster: StartCluster) -> None:
    """8Gi / 20-core shares arrive, one at a time, on a cluster of two nodes (2x RTX A5000
    and 1x A10, both from the corpus; no nodeSelector) until nothing fits. kube-scheduler
    picks among fitting nodes at random, so per-node choices are not compared; the outcome is
    order-independent here (every GPU takes 2 shares by memory: 3 x 8Gi = 24576Mi exceeds the
    A5000's 24564Mi and the A10's 23028Mi): the number scheduled, the pending pod, the
    scheduler part of its reason and the multiset of per-GPU bookings must agree."""
    nodes = [corpus_node("a5000-node", A5000_INVENTORY), corpus_node("a10-node", A10_INVENTORY)]
    live = fresh_cluster(nodes)
    client = live.client
    ns = "default"
    objects: list[Obj] = [gpu_claim_template("share", namespace=ns, memory="8Gi", cores=20)]
    apply_objects(client, objects)
    verdicts: dict[str, tuple[str | None, str]] = {}
    for i in range(10):
        pod = gpu_pod(f"p{i:02d}", namespace=ns, template="share")
        objects.append(pod)
        apply_objects(client, [pod])
        verdicts[f"p{i:02d}"] = wait_verdict(client, f"p{i:02d}", ns)
        if verdicts[f"p{i:02d}"][0] is None:
            break
    scheduled = [p for p, (node, _) in verdicts.items() if node is not None]
    pending = {p: msg for p, (node, msg) in verdicts.items() if node is None}
    assert len(scheduled) == 6 and list(pending) == ["p06"], verdicts
    assert scheduler_part(pending["p06"]) == "0/2 nodes are available: 2 cannot allocate all claims"
    assert Counter(node for node, _ in verdicts.values() if node) == {
        "a5000-node": 4,
        "a10-node": 2,
    }

    result = simulate(nodes, objects)
    assert [r.split("/")[1] for r in result.scheduled] == scheduled
    assert [(p.pod, scheduler_part(p.reason)) for p in result.pending] == [
        ("default/p06", "0/2 nodes are available: 2 cannot allocate all claims")
    ]
    live_booked = booked_per_gpu(live_allocations(client, ns))
    sim_booked = booked_per_gpu(sim_allocations(result))
    assert sorted(live_booked.values()) == sorted(sim_booked.values())
    assert (
        sorted(live_booked)
        == sorted(sim_booked)
        == [
            ("a10-node", "gpu-0"),
            ("a5000-node", "gpu-0"),
            ("a5000-node", "gpu-1"),
        ]
    )
    assert set(live_booked.values()) == {(Fraction(2 * 8 * 2**30), Fraction(40))}
    # Every share of the live cluster has its own shareID.
    share_ids = [
        r["shareID"]
        for refs in live_allocations(client, ns).values()
        for a in refs.values()
        if a
        for r in a["devices"]["results"]
    ]
    assert len(share_ids) == len(set(share_ids)) == 6


# ---- 4. a mixed workload of 50+ pods on one 8-GPU node ----------------------------------


def _template(
    name: str, ns: str, *, memory: str | None = None, cores: int | None = None, count: int = 1
) -> Obj:
    t = gpu_claim_template(name, namespace=ns, memory=memory, cores=cores)
    if count > 1:
        spec = t["spec"]["spec"]["devices"]
        spec["requests"][0]["exactly"]["count"] = count
        spec["constraints"] = [
            {"requests": ["gpu"], "distinctAttribute": f"{DEVICE_CLASS_NAME}/uuid"}
        ]
    return t


#: (template name, memory, cores, count); no memory request books the whole GPU's memory.
SHAPES: dict[str, tuple[str | None, int, int]] = {
    "s4": ("4Gi", 10, 1),
    "s8": ("8Gi", 20, 1),
    "s16": ("16Gi", 25, 1),
    "s40": ("40Gi", 50, 1),
    "whole": (None, 100, 1),
    "pair": ("20Gi", 30, 2),
}

#: Pod shapes in arrival order: 52 template pods, the HAMi pod, 2 pods on one shared claim.
ORDER: tuple[str, ...] = (
    "whole",
    "pair",
    "s40",
    "s16",
    "s8",
    "s4",
    "s4",
    "s16",
    "s8",
    "s4",
    "HAMI",
    "SHARED",
    "s8",
    "s4",
    "s16",
    "s4",
    "s4",
    "SHARED",
    "s40",
    "s8",
    "s4",
    "s4",
    "s16",
    "s8",
    "s4",
    "s40",
    "s4",
    "s8",
    "s4",
    "pair",
    "s4",
    "s16",
    "s4",
    "s8",
    "s4",
    "s4",
    "s40",
    "s4",
    "s4",
    "s8",
    "whole",
    "s16",
    "s4",
    "s4",
    "s8",
    "s4",
    "s4",
    "s4",
    "s16",
    "s4",
    "s4",
    "s8",
    "s4",
    "s4",
    "s4",
)


def test_mixed_workload_matches_simulate(fresh_cluster: StartCluster) -> None:
    """55 pods of several claim shapes (4Gi/10, 8Gi/20, 16Gi/25, 40Gi/50, whole GPU, a 2-GPU
    claim with distinct uuids, a HAMi pod from the corpus converted by convert_pod, one claim
    shared by two pods) arrive one at a time on a single node with the corpus' 8x H100 and its
    NVLink topology. Single node, so nothing is random: within the node the allocator's
    first fit in pool/slice/device order decides, and the exact device and consumed capacity
    of every claim, the set of scheduled and pending pods and the scheduler part of each
    pending reason must be what ``tessera simulate`` predicts."""
    nodes = [corpus_node("h100-node", H100_INVENTORY, H100_TOPOLOGY)]
    memory_sizes = [81008 * 2**20]  # published: 81559 MiB less the 551 MiB driver-reserved
    live = fresh_cluster(nodes)
    client = live.client
    ns = "default"

    templates = [
        _template(name, ns, memory=mem, cores=cores, count=count)
        for name, (mem, cores, count) in SHAPES.items()
    ]
    shared_claim: Obj = {
        "apiVersion": RESOURCE,
        "kind": "ResourceClaim",
        "metadata": {"name": "shared", "namespace": ns},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": DEVICE_CLASS_NAME,
                            "capacity": {"requests": {"memory": "12Gi", "cores": "15"}},
                        },
                    }
                ]
            }
        },
    }
    hami_pod = yaml.safe_load(HAMI_POD.read_text())
    hami_pod["metadata"]["namespace"] = ns
    conversion = convert_pod(hami_pod, memory_sizes=memory_sizes, source=str(HAMI_POD))
    (hami_template,) = conversion.templates
    assert hami_template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"][
        "requests"
    ] == {
        "memory": "3000Mi",
        "cores": "30",
    }
    apply_objects(client, [*templates, shared_claim, *conversion.templates])

    # What simulate reads: the same templates and claim, and the HAMi pod as the user wrote
    # it (simulate converts it itself); the API server gets the converted pod.
    sim_objects: list[Obj] = [*templates, shared_claim]
    verdicts: dict[str, tuple[str | None, str]] = {}
    shared_users = 0
    for i, shape in enumerate(ORDER):
        if shape == "HAMI":
            name = hami_pod["metadata"]["name"]
            live_pod, sim_pod = conversion.pod, hami_pod
        elif shape == "SHARED":
            name = f"shared-{shared_users}"
            shared_users += 1
            live_pod = sim_pod = gpu_pod(name, namespace=ns, claim="shared")
        else:
            name = f"p{i:02d}-{shape}"
            live_pod = sim_pod = gpu_pod(name, namespace=ns, template=shape)
        sim_objects.append(sim_pod)
        apply_objects(client, [live_pod])
        verdicts[name] = wait_verdict(client, name, ns)

    assert len(verdicts) == 55
    result = simulate(nodes, sim_objects)
    live_scheduled = [p for p, (node, _) in verdicts.items() if node is not None]
    live_pending = {p: scheduler_part(msg) for p, (node, msg) in verdicts.items() if node is None}
    assert [r.split("/")[1] for r in result.scheduled] == live_scheduled
    assert {p.pod.split("/")[1]: scheduler_part(p.reason) for p in result.pending} == live_pending
    assert set(live_pending.values()) == {"0/1 nodes are available: 1 cannot allocate all claims"}
    # The workload fills the node part-way: some pods of every size class pend, later
    # smaller ones still fit.
    # (36 scheduled, 19 pending: the second 2-GPU claim pends while smaller shares after it
    # still fit; the last whole GPU finds no empty GPU.)
    assert (len(live_scheduled), len(live_pending)) == (36, 19), live_pending
    assert {"p29-pair", "p40-whole"} <= set(live_pending) and "gpu-pod" in live_scheduled
    assert {"shared-0", "shared-1"} <= set(live_scheduled)

    live_allocs = live_allocations(client, ns)
    sim_allocs = sim_allocations(result)
    assert sorted(live_allocs) == sorted(sim_allocs)
    for pod, refs in live_allocs.items():
        assert {ref: comparable(a) for ref, a in refs.items()} == {
            ref: comparable(a) for ref, a in sim_allocs[pod].items()
        }, pod
    # The shared claim: one allocation, reserved for both pods.
    shared = client.get(RESOURCE, "ResourceClaim", "shared", ns)
    assert sorted(r["name"] for r in shared["status"]["reservedFor"]) == ["shared-0", "shared-1"]
    # The 2-GPU claims got two different GPUs each.
    for pod, refs in live_allocs.items():
        if pod.endswith("-pair") and refs["gpu"] is not None:
            devices = [r["device"] for r in refs["gpu"]["devices"]["results"]]
            assert len(devices) == 2 and len(set(devices)) == 2, (pod, devices)
    # Per-GPU bookings: identical on both sides, and never above capacity.
    live_booked = booked_per_gpu(live_allocs)
    assert live_booked == booked_per_gpu(sim_allocs)
    for mem, cores in live_booked.values():
        assert mem <= 81008 * 2**20 and cores <= 100


# ---- 5. a mixed node: Tessera's GPUs and HAMi's Ascend NPUs ------------------------------


def test_mixed_node_gpu_and_npu_shares_match_simulate(
    kube_cluster: LiveCluster, kube_namespace: str
) -> None:
    """One node with the corpus' 2x RTX A5000 (Tessera's slices) and the 8x Ascend 910B3 of a
    real ``npu-smi info`` capture (the slices HAMi's Ascend driver publishes, built by
    ``tessera.inventory.vendor_devices``), the driver's DeviceClass, and HAMi's own
    ``job-910B3`` example plus a container asking a GPU share and an NPU share, converted by
    ``convert_pod``: the real kube-scheduler's allocations (device, consumed capacity, shareID)
    must be what ``tessera simulate`` predicts from the unconverted pods. The node is tainted so
    that no other test's pod lands on it."""
    from pathlib import Path

    from tessera.api.deviceclass import vendor_device_class
    from tessera.api.vendors import ASCEND
    from tessera.convert import gpu_memory_sizes
    from tessera.inventory.vendor_devices import load_vendor_inventory, vendor_resource_slices

    repo = Path(__file__).resolve().parents[2]
    npu_smi = (
        repo
        / "src/tessera/examples/vendor-inventories"
        / "ms-swift__npu-support__npu-smi-info.8xAscend910B3.txt"
    )
    client = kube_cluster.client
    ns = kube_namespace
    name = "mixed-a5000-npu"
    base = corpus_node(name, A5000_INVENTORY, labels={"tessera.dev/test-node": name})
    taint = {"key": "tessera.dev/test-node", "value": name, "effect": "NoSchedule"}
    node = SimNode(
        name,
        base.labels,
        [*base.slices, *vendor_resource_slices(name, load_vendor_inventory(npu_smi))],
        base.source,
        [taint],
    )
    kube_cluster.register(inventory_of([node]))
    hami = yaml.safe_load(
        (repo / "tests/data/vendors/hami-examples/ascend/job-910B3.yaml").read_text()
    )
    both = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-and-npu"},
        "spec": {
            "containers": [
                {
                    "name": "pipeline",
                    "image": "busybox",
                    "resources": {
                        "limits": {
                            "nvidia.com/gpu": 1,
                            "nvidia.com/gpumem": 16000,
                            "nvidia.com/gpucores": 50,
                            "huawei.com/Ascend910B3": 1,
                            "huawei.com/Ascend910B3-memory": 30000,
                        }
                    },
                }
            ]
        },
    }
    pods = []
    for p in (hami, both):
        p = copy.deepcopy(p)
        p["metadata"]["namespace"] = ns
        p["spec"]["nodeSelector"] = {"tessera.dev/test-node": name}
        p["spec"]["tolerations"] = [{**taint, "operator": "Equal"}]
        pods.append(p)
    cls = vendor_device_class(ASCEND)
    client.create(cls)
    try:
        live_objects: list[Obj] = []
        for p in pods:
            conv = convert_pod(p, memory_sizes=gpu_memory_sizes(base.slices), vendors=("ascend",))
            assert conv.warnings == []
            live_objects += [*conv.templates, conv.pod]
        apply_objects(client, live_objects)
        for p in pods:
            assert wait_verdict(client, p["metadata"]["name"], ns) == (name, "")
        live = live_allocations(client, ns)

        result = simulate([node], [cls, *pods])
        assert result.pending == []
        predicted = sim_allocations(result)
        for p in pods:
            pname = p["metadata"]["name"]
            assert {k: comparable(v) for k, v in predicted[pname].items()} == {
                k: comparable(v) for k, v in live[pname].items()
            }
        placed = sorted(
            (p.pod.split("/")[1], p.device, p.memory, p.cores) for p in result.placements
        )
        assert placed == [
            ("ascend910b3-job", f"ascend.project-hami.io/{name}/npu-0-0", "16Gi", "25"),
            ("gpu-and-npu", f"ascend.project-hami.io/{name}/npu-0-0", "32Gi", "50"),
            ("gpu-and-npu", f"gpu.tessera.dev/{name}/gpu-0", "16000Mi", "50"),
        ]
    finally:
        client.delete("resource.k8s.io/v1", "DeviceClass", cls["metadata"]["name"])
