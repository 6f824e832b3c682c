"""MIG against the real control plane (issue 14): the API server accepts what Tessera publishes
for static and dynamic MIG (KEP-4815 counter sets and consuming devices), and the real
kube-scheduler, allocating against partitionable slices, agrees with ``tessera simulate``
claim for claim on a mixed MIG workload."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tessera import DEVICE_CLASS_NAME
from tessera.convert import convert_pod, gpu_memory_sizes
from tessera.inventory import GPU, build_resource_slices, load_inventory
from tessera.inventory.mig import MIG_MODELS, DynamicMIG
from tessera.kube.client import Obj
from tessera.kube.workloads import apply_objects, gpu_pod
from tessera.sim.cluster import SimNode

from .conftest import CORPUS, DATA, H100_INVENTORY, StartCluster
from .test_simulate import (
    comparable,
    live_allocations,
    scheduler_part,
    sim_allocations,
    simulate,
    wait_verdict,
)

pytestmark = pytest.mark.cluster

MIB = 2**20
RESOURCE = "resource.k8s.io/v1"
H200_MIG = (
    CORPUS
    / "inventories"
    / "nvidia_gpu_exporter__internal_captures__linux-x86_64__nvidia-h200-mig__590.48.01.capture.txt"
)
A100_STATIC = (
    DATA.parent.parent / "data" / "mig" / "a100-pcie-40gb.2g10gb-3x1g5gb.nvidia-smi-q-x.xml"
)
ATTR = f'device.attributes["{DEVICE_CLASS_NAME}"]'


def _node(name: str, gpus: list[GPU], dynamic: DynamicMIG | None = None) -> SimNode:
    return SimNode(name, {"kubernetes.io/hostname": name, "tessera.dev/test-node": name},
                   build_resource_slices(name, gpus, dynamic_mig=dynamic), name)  # fmt: skip


def _model_gpu(i: int, product: str, mib: int) -> GPU:
    return GPU(i, f"GPU-00000000-0000-0000-0000-{i + 1:012x}", product, None, None, "590.48.01", "13.1", None, None,
               mib * MIB, mig_enabled=True)  # fmt: skip


def test_api_server_accepts_static_and_dynamic_mig_slices(fresh_cluster: StartCluster) -> None:
    """Every model's dynamic-MIG publication (counter sets, devices consuming them, the whole
    GPU consuming all) and the static layouts (the A100 of the issue, the H200 whose compute
    instances share a GPU instance) pass the real API server's validation."""
    products = [("NVIDIA A100-PCIE-40GB", 40960), ("NVIDIA A100-SXM4-80GB", 81920), ("NVIDIA A30", 24576),
                ("NVIDIA H100 80GB HBM3", 81559), ("NVIDIA H200", 143771), ("NVIDIA B200", 183359)]  # fmt: skip
    assert len(products) == len(MIG_MODELS)
    dyn = _node("dyn", [_model_gpu(i, p, m) for i, (p, m) in enumerate(products)], DynamicMIG())
    nodes = [
        dyn,
        _node("a100", load_inventory(A100_STATIC)),
        _node("h200", load_inventory(H200_MIG)),
    ]
    assert sum(len(s["spec"].get("sharedCounters") or []) for s in dyn.slices) == 6
    live = fresh_cluster(nodes)
    got = {s["metadata"]["name"]: s["spec"] for s in live.client.list(RESOURCE, "ResourceSlice")}
    for n in nodes:
        for s in n.slices:
            spec = got[s["metadata"]["name"]]
            assert spec.get("devices", []) == s["spec"].get("devices", []), s["metadata"]["name"]
            assert spec.get("sharedCounters", []) == s["spec"].get("sharedCounters", [])


def _hami(name: str, node: str, limits: dict[str, Any], mode: str | None = None) -> Obj:
    md: dict[str, Any] = {"name": name, "namespace": "default"}
    if mode:
        md["annotations"] = {"nvidia.com/vgpu-mode": mode}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": {
        "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
        "nodeSelector": {"tessera.dev/test-node": node},
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": limits}}]}}  # fmt: skip  # noqa: E501


def _template(name: str, *, memory: str | None = None, cores: int | None = None, selectors: tuple[str, ...] = (),
              count: int = 1) -> Obj:  # fmt: skip
    exactly: dict[str, Any] = {"deviceClassName": DEVICE_CLASS_NAME, "count": count}
    reqs = {k: str(v) for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    if reqs:
        exactly["capacity"] = {"requests": reqs}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if count > 1:
        devices["constraints"] = [
            {"requests": ["gpu"], "distinctAttribute": f"{DEVICE_CLASS_NAME}/unit"}
        ]
    return {"apiVersion": RESOURCE, "kind": "ResourceClaimTemplate", "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": devices}}}  # fmt: skip


TEMPLATES = [
    _template("profile-2g", selectors=(f'{ATTR}.?profile.orValue("") == "2g.20gb"',)),
    _template(
        "profile-3g-pair", count=2, selectors=(f'{ATTR}.?profile.orValue("").startsWith("3g.")',)
    ),
    _template("mem-60g", memory="60Gi"),
    _template("share-16g", memory="16Gi", cores=25),
    _template("whole", selectors=(f'{ATTR}.type == "gpu"',)),
    _template("mig-any", selectors=(f'{ATTR}.type == "mig"',)),
]


def _workload() -> list[tuple[str, Obj]]:
    """(kind, pod) in arrival order: 47 pods, pinned to one node each (kube-scheduler breaks
    ties between nodes at random; within a node the allocator's first fit decides)."""
    dyn, st = "mig-dyn", "mig-static"
    pods: list[tuple[str, Obj]] = []

    def hami(name: str, node: str, limits: dict[str, Any], mode: str | None = None) -> None:
        pods.append(("hami", _hami(name, node, limits, mode)))

    def dra(name: str, node: str, template: str) -> None:
        pods.append(
            ("dra", gpu_pod(name, template=template, node_selector={"tessera.dev/test-node": node}))
        )

    g, mem = "nvidia.com/gpu", "nvidia.com/gpumem"
    hami("d01-mig9g", dyn, {g: 1, mem: 9000}, "mig")
    hami("d02-mig9g", dyn, {g: 1, mem: 9000}, "mig")
    hami("d03-mig15g", dyn, {g: 1, mem: 15000}, "mig")
    hami("d04-mig30g", dyn, {g: 1, mem: 30000}, "mig")
    dra("d05-2g", dyn, "profile-2g")
    hami("d06-mig9g", dyn, {g: 1, mem: 9000}, "mig")
    hami("d07-mig9g", dyn, {g: 1, mem: 9000}, "mig")
    for i in range(40, 45):
        hami(f"d{i}-mig9g", dyn, {g: 1, mem: 9000}, "mig")
    hami("d08-core20g", dyn, {g: 1, mem: 20000, "nvidia.com/gpucores": 30}, "hami-core")
    hami("d09-core20g", dyn, {g: 1, mem: 20000, "nvidia.com/gpucores": 30}, "hami-core")
    hami("d10-plain", dyn, {g: 1})
    hami("d11-mig-pair", dyn, {g: 2, mem: 9000}, "mig")
    dra("d12-whole", dyn, "whole")
    dra("d13-share", dyn, "share-16g")
    dra("d14-3g-pair", dyn, "profile-3g-pair")
    for i in range(15, 19):
        hami(f"d{i}-mig9g", dyn, {g: 1, mem: 9000}, "mig")
    for i in range(24, 30):
        dra(f"d{i}-share", dyn, "share-16g")
    hami("d30-core-pair", dyn, {g: 2, mem: 20000, "nvidia.com/gpucores": 20}, "hami-core")
    dra("d31-mig-any", dyn, "mig-any")
    dra("d32-whole", dyn, "whole")
    dra("d33-whole", dyn, "whole")
    hami("s01-mig15g", st, {g: 1, mem: 15000}, "mig")
    hami("s02-mig15g", st, {g: 1, mem: 15000}, "mig")
    hami("s03-mig30g", st, {g: 1, mem: 30000}, "mig")
    dra("s04-60g", st, "mem-60g")
    dra("s05-60g", st, "mem-60g")
    hami("s06-mig9g", st, {g: 1, mem: 9000}, "mig")
    hami("s07-plain", st, {g: 1})
    dra("s08-mig-any", st, "mig-any")
    for i in range(34, 40):
        hami(f"d{i}-mig4g", dyn, {g: 1, mem: 4000}, "mig")
    return pods


def test_mixed_mig_workload_matches_simulate(fresh_cluster: StartCluster) -> None:
    """47 pods on two nodes: ``mig-dyn`` (the corpus' 8x H100, GPUs 0-2 published for
    dynamic MIG: 25 placements and the whole GPU each, counter sets ``gpu-0``..``gpu-2``; GPUs 3-7
    plain shareable GPUs) and ``mig-static`` (the corpus H200 in MIG mode: 1g.18gb x2, 2g.35gb,
    and a 3g.71gb GPU instance split into 1c + 2c compute instances sharing its memory through
    counter ``gi-2-memory``). HAMi pods with ``vgpu-mode: mig`` (gpumem picks the profile),
    ``hami-core`` shares, plain ``gpu: 1``, ``gpu: 2``; DRA claims naming a profile, 60Gi, a
    whole GPU, shares, two 3g instances. Pods are pinned to a node each (the scheduler breaks
    node ties at random), so within a node the allocator decides and every claim's device and
    consumed capacity, the scheduled and pending pods, and the scheduler part of each pending
    reason must be what ``tessera simulate`` predicts."""
    h100s = load_inventory(H100_INVENTORY)
    nodes = [
        _node("mig-dyn", h100s, DynamicMIG(gpus=(0, 1, 2))),
        _node("mig-static", load_inventory(H200_MIG)),
    ]
    sizes = gpu_memory_sizes([s for n in nodes for s in n.slices])
    live = fresh_cluster(nodes)
    client = live.client
    apply_objects(client, copy.deepcopy(TEMPLATES))
    workload = _workload()
    assert len(workload) == 47
    sim_objects: list[Obj] = [copy.deepcopy(t) for t in TEMPLATES]
    verdicts: dict[str, tuple[str | None, str]] = {}
    for kind, pod in workload:
        name = pod["metadata"]["name"]
        sim_objects.append(copy.deepcopy(pod))
        if kind == "hami":  # what the webhook applies; simulate converts the original itself
            conv = convert_pod(copy.deepcopy(pod), memory_sizes=sizes)
            apply_objects(client, [*conv.templates, conv.pod])
        else:
            apply_objects(client, [pod])
        verdicts[name] = wait_verdict(client, name, "default")

    result = simulate(nodes, sim_objects)
    live_scheduled = [p for p, (node, _) in verdicts.items() if node is not None]
    live_pending = {p: scheduler_part(msg) for p, (node, msg) in verdicts.items() if node is None}
    assert [r.split("/")[1] for r in result.scheduled] == live_scheduled
    assert {p.pod.split("/")[1]: scheduler_part(p.reason) for p in result.pending} == live_pending
    live_allocs, sim_allocs = live_allocations(client, "default"), sim_allocations(result)
    assert sorted(live_allocs) == sorted(sim_allocs)
    for pod_name in live_allocs:
        for ref, alloc in live_allocs[pod_name].items():
            assert comparable(sim_allocs[pod_name][ref]) == comparable(alloc), (pod_name, ref)

    # What the allocation is, not only that both agree:
    devices = {
        p: [r["device"] for a in refs.values() if a for r in a["devices"]["results"]]
        for p, refs in live_allocs.items()
    }
    assert devices["d01-mig9g"] == [
        "gpu-0-mig-1g10gb-6"
    ]  # smallest profile, highest placement first
    assert devices["d03-mig15g"] == ["gpu-0-mig-1g20gb-2"]  # 1g.20gb: slices 6-7 and 4-5 are taken
    assert devices["d04-mig30g"] == ["gpu-1-mig-3g40gb-4"]  # no 3g placement left on gpu-0
    assert devices["d05-2g"] == ["gpu-0-mig-2g20gb-0"]
    assert devices["d08-core20g"] == [
        "gpu-3"
    ]  # hami-core: a whole GPU to share; gpus 0-2 hold placements
    assert devices["d11-mig-pair"] == [
        "gpu-2-mig-1g10gb-3",
        "gpu-2-mig-1g10gb-2",
    ]  # two instances, one GPU
    assert devices["s01-mig15g"] == ["gpu-0-mig-9-0"] and devices["s03-mig30g"] == ["gpu-0-mig-3-0"]
    assert devices["s04-60g"] == ["gpu-0-mig-2-0"]
    # the second 60Gi claim: the other compute instance of the same GPU instance shares its memory
    assert "s05-60g" in live_pending and live_pending["s05-60g"].startswith(
        "0/2 nodes are available: 1 cannot allocate all claims"
    )
    assert (len(live_scheduled), len(live_pending)) == (29, 18), (live_scheduled, live_pending)
