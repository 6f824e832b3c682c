"""Hand-checked simulate scenarios: which GPU, which share, who is left pending and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tessera.api.loader import Manifest, Source, expand_workloads, load_file, parse_documents
from tessera.sim.cluster import Cluster, SimNode
from tessera.sim.simulate import PendingCause, Simulation

MiB = 2**20


def gpu_slice(
    node: str,
    mem_mib: list[int],
    product: str = "NVIDIA H100 80GB HBM3",
    nvlink: list[int] | None = None,
) -> dict[str, Any]:
    """A slice shaped exactly like tessera.inventory publishes (one device per GPU)."""
    devices: list[dict[str, Any]] = []
    for i, m in enumerate(mem_mib):
        devices.append(
            {
                "name": f"gpu-{i}",
                "allowMultipleAllocations": True,
                "attributes": {
                    "uuid": {"string": f"GPU-{node}-{i}"},
                    "index": {"int": i},
                    "productName": {"string": product},
                    "type": {"string": "gpu"},
                },
                "capacity": {
                    "memory": {
                        "value": f"{m}Mi",
                        "requestPolicy": {
                            "default": f"{m}Mi",
                            "validRange": {"min": "1Mi", "step": "1Mi"},
                        },
                    },
                    "cores": {
                        "value": "100",
                        "requestPolicy": {
                            "default": "0",
                            "validRange": {"min": "0", "max": "100", "step": "1"},
                        },
                    },
                },
            }
        )
        if nvlink is not None:
            devices[-1]["attributes"]["nvlinkDomain"] = {"int": nvlink[i]}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.tessera.dev"},
        "spec": {
            "driver": "gpu.tessera.dev",
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "nodeName": node,
            "devices": devices,
        },
    }


def cluster(*nodes: tuple[str, list[int]]) -> Cluster:
    return Cluster(
        [SimNode(n, {"kubernetes.io/hostname": n}, [gpu_slice(n, mem)]) for n, mem in nodes]
    )


def manifests(text: str) -> list[Manifest]:
    return list(
        expand_workloads(
            Manifest(o, Source("test.yaml", d)) for d, o in parse_documents(text, "test.yaml")
        )
    )


TEMPLATE_30G = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: slice-30g}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.tessera.dev
          capacity: {requests: {memory: 30Gi, cores: "20"}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 5
  template:
    spec:
      resourceClaims: [{name: gpu, resourceClaimTemplateName: slice-30g}]
      containers: [{name: app, image: x, resources: {claims: [{name: gpu}]}}]
"""


def test_fill_two_gpus_then_pending() -> None:
    # 2 GPUs of 80 GiB: 30 GiB shares fit twice per GPU (60 GiB), the 5th finds 20 GiB left at most.
    res = Simulation(cluster(("n1", [81920, 81920])), manifests(TEMPLATE_30G)).run()
    assert [(p.pod, p.device, p.memory, p.cores) for p in res.placements] == [
        ("default/web-0", "gpu.tessera.dev/n1/gpu-0", "30Gi", "20"),
        ("default/web-1", "gpu.tessera.dev/n1/gpu-0", "30Gi", "20"),
        ("default/web-2", "gpu.tessera.dev/n1/gpu-1", "30Gi", "20"),
        ("default/web-3", "gpu.tessera.dev/n1/gpu-1", "30Gi", "20"),
    ]
    assert len({p.share_id for p in res.placements}) == 4
    assert [p.pod for p in res.pending] == ["default/web-4"]
    reason = res.pending[0].reason
    assert reason.startswith("0/1 nodes are available: 1 cannot allocate all claims.")
    assert reason == (
        "0/1 nodes are available: 1 cannot allocate all claims. claim default/web-4-gpu, request gpu: needs 1 device "
        "with memory 30Gi and cores 20; 2 GPUs in the cluster match its selectors, none has room now: memory short on "
        "2 GPUs (most free: 20Gi of 80Gi, on n1/gpu-0; needs 30Gi)"
    )
    usage = {u.device: (u.memory_allocated, u.cores_allocated, u.shares) for u in res.gpus}
    assert usage == {"gpu-0": (60 * 2**30, 40, 2), "gpu-1": (60 * 2**30, 40, 2)}


def test_second_node_used_when_first_is_full() -> None:
    res = Simulation(cluster(("a", [40960]), ("b", [81920])), manifests(TEMPLATE_30G)).run()
    assert [(p.pod, p.node) for p in res.placements] == [
        ("default/web-0", "a"),
        ("default/web-1", "b"),
        ("default/web-2", "b"),
    ]
    assert [p.pod for p in res.pending] == ["default/web-3", "default/web-4"]
    assert res.pending[0].reason.startswith(
        "0/2 nodes are available: 2 cannot allocate all claims."
    )


def test_claim_status_in_upstream_shape() -> None:
    res = Simulation(cluster(("n1", [81920])), manifests(TEMPLATE_30G)).run()
    claims = {o["metadata"]["name"]: o for o in res.objects if o["kind"] == "ResourceClaim"}
    c = claims["web-0-gpu"]
    assert c["metadata"]["annotations"] == {"resource.kubernetes.io/pod-claim-name": "gpu"}
    result = c["status"]["allocation"]["devices"]["results"][0]
    assert {k: v for k, v in result.items() if k != "shareID"} == {
        "request": "gpu",
        "driver": "gpu.tessera.dev",
        "pool": "n1",
        "device": "gpu-0",
        "consumedCapacity": {"memory": "30Gi", "cores": "20"},
    }
    assert len(result["shareID"]) == 36 and result["shareID"] == result["shareID"].lower()
    assert c["status"]["allocation"]["nodeSelector"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]
    }
    assert [r["name"] for r in c["status"]["reservedFor"]] == ["web-0"]
    pods = {o["metadata"]["name"]: o for o in res.objects if o["kind"] == "Pod"}
    assert pods["web-0"]["spec"]["nodeName"] == "n1"
    cond = pods["web-2"]["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "PodScheduled",
        "False",
        "Unschedulable",
    )


SHARED = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: shared}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.tessera.dev, capacity: {requests: {memory: 16Gi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: p1}
spec:
  resourceClaims: [{name: gpu, resourceClaimName: shared}]
  containers: [{name: c, image: x, resources: {claims: [{name: gpu}]}}]
---
apiVersion: v1
kind: Pod
metadata: {name: p2}
spec:
  resourceClaims: [{name: gpu, resourceClaimName: shared}]
  containers: [{name: c, image: x, resources: {claims: [{name: gpu}]}}]
"""


def test_shared_claim_allocated_once_reserved_twice() -> None:
    res = Simulation(cluster(("a", [24564]), ("b", [24564])), manifests(SHARED)).run()
    assert [(p.pod, p.node, p.device, p.memory, p.cores) for p in res.placements] == [
        ("default/p1", "a", "gpu.tessera.dev/a/gpu-0", "16Gi", "0"),
        ("default/p2", "a", "gpu.tessera.dev/a/gpu-0", "16Gi", "0"),
    ]
    claim = next(o for o in res.objects if o["kind"] == "ResourceClaim")
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["p1", "p2"]
    assert {u.device + "@" + u.node: u.shares for u in res.gpus} == {"gpu-0@a": 1, "gpu-0@b": 0}


def test_hami_pods_from_corpus(corpus: Path) -> None:
    ms = list(
        expand_workloads(
            load_file(corpus / "hami-pods" / "HAMi__examples_nvidia__default_use.yaml")
        )
    )
    res = Simulation(cluster(("h100", [81559, 81559])), ms).run()
    assert [(p.pod, p.container, p.device, p.memory, p.cores) for p in res.placements] == [
        ("default/gpu-pod", "ubuntu-container", "gpu.tessera.dev/h100/gpu-0", "3000Mi", "30"),
    ]


def test_hami_bare_gpu_takes_whole_gpu_never_pending_for_memory(corpus: Path) -> None:
    text = """
apiVersion: v1
kind: Pod
metadata: {name: whole-1}
spec:
  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: whole-2}
spec:
  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: whole-3}
spec:
  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]
"""
    res = Simulation(cluster(("n", [32510, 24564])), manifests(text)).run()
    # Each books all memory of whichever GPU it gets, and 100 cores (HAMi's exclusive default).
    assert [(p.pod, p.device, p.memory, p.cores) for p in res.placements] == [
        ("default/whole-1", "gpu.tessera.dev/n/gpu-0", "32510Mi", "100"),
        ("default/whole-2", "gpu.tessera.dev/n/gpu-1", "24564Mi", "100"),
    ]
    assert [p.pod for p in res.pending] == ["default/whole-3"]


def _bundled() -> Cluster:
    from tessera.cli._common import examples_dir
    from tessera.sim.cluster import load_cluster

    return load_cluster(examples_dir() / "cluster.yaml")


def test_foreign_device_classes_leave_only_their_pods_pending(corpus: Path) -> None:
    # The NVIDIA DRA driver's quickstart (class gpu.nvidia.com), the example driver's NIC demo
    # (net.example.com) and a HAMi pod, in one run: kube-scheduler leaves the first two pending
    # (PreFilter: "request r: device class c does not exist") and schedules the HAMi pod.
    dra = corpus / "dra-manifests"
    ms = list(
        expand_workloads(
            load_file(dra / "k8s-dra-driver-gpu__demo_specs_quickstart_v1__gpu-test1.yaml")
        )
    )
    ms += list(
        expand_workloads(
            load_file(dra / "dra-example-driver__demo_examples__net-consumable-capacity.yaml")
        )
    )
    ms += list(
        expand_workloads(
            load_file(corpus / "hami-pods" / "HAMi__examples_nvidia__default_use.yaml")
        )
    )
    sim = Simulation(_bundled(), ms)
    res = sim.run()
    assert [(p.pod, p.node, p.memory, p.cores) for p in res.placements] == [
        ("default/gpu-pod", "h100-node", "3000Mi", "30"),
    ]
    nvidia = (
        "0/4 nodes are available: request gpu: device class gpu.nvidia.com does not exist. (gpu.nvidia.com is the "
        "NVIDIA DRA driver's class: --class-map gpu.nvidia.com=gpu.tessera.dev runs these requests on Tessera's GPUs, "
        "or add the DeviceClass and the driver's ResourceSlices)"
    )
    nic = (
        "0/4 nodes are available: request nic: device class net.example.com does not exist. (known: gpu.tessera.dev; "
        "add the DeviceClass, or map it with --class-map net.example.com=CLASS)"
    )
    assert [(p.pod, p.reason) for p in res.pending] == [
        ("gpu-test1/pod1", nvidia),
        ("gpu-test1/pod2", nvidia),
        ("net-consumable-capacity/pod0", nic),
        ("net-consumable-capacity/pod1", nic),
    ]
    assert [p.cause for p in res.pending] == [PendingCause.MISSING_CLASS] * 4
    assert (
        sum(
            "DeviceClass 'gpu.nvidia.com' does not exist: pods using it stay pending" in w
            for w in res.warnings
        )
        == 1
    )
    assert (
        sum(
            "DeviceClass 'net.example.com' does not exist: pods using it stay pending" in w
            for w in res.warnings
        )
        == 2
    )


def test_class_map_runs_nvidia_driver_claims_on_tessera_gpus(corpus: Path) -> None:
    f = corpus / "dra-manifests" / "k8s-dra-driver-gpu__demo_specs_quickstart_v1__gpu-test1.yaml"
    ms = list(expand_workloads(load_file(f)))
    res = Simulation(_bundled(), ms, class_map={"gpu.nvidia.com": "gpu.tessera.dev"}).run()
    # Each claim names no capacity: it books a whole GPU's memory (the request policy's
    # default), so the two pods get one H100 each.
    assert [(p.pod, p.device, p.memory, p.cores) for p in res.placements] == [
        ("gpu-test1/pod1", "gpu.tessera.dev/h100-node/gpu-0", "81008Mi", "0"),
        ("gpu-test1/pod2", "gpu.tessera.dev/h100-node/gpu-1", "81008Mi", "0"),
    ]
    assert res.pending == []
    assert any(
        w.endswith(
            "ResourceClaimTemplate gpu-test1/single-gpu: --class-map: gpu.nvidia.com -> gpu.tessera.dev"
        )
        for w in res.warnings
    )
    # The input manifests are untouched.
    tmpl = next(m for m in ms if m.kind == "ResourceClaimTemplate")
    assert (
        tmpl.obj["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
        == "gpu.nvidia.com"
    )


def test_class_map_rewrites_the_driver_domain_in_selectors() -> None:
    from tessera.sim.classmap import map_device_classes

    text = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: a100}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-80GB"'}
"""
    notes: list[str] = []
    out = map_device_classes(manifests(text), {"gpu.nvidia.com": "gpu.tessera.dev"}, notes)
    exactly = out[0].obj["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly == {
        "deviceClassName": "gpu.tessera.dev",
        "selectors": [
            # The NVIDIA class's own selector comes first: its full GPUs only.
            {
                "cel": {
                    "expression": "device.driver == 'gpu.tessera.dev' && "
                    "device.attributes['gpu.tessera.dev'].type == 'gpu'"
                }
            },
            {
                "cel": {
                    "expression": 'device.attributes["gpu.tessera.dev"].productName == "NVIDIA A100-SXM4-80GB"'
                }
            },
        ],
    }
    assert notes == [
        "test.yaml (document 1): ResourceClaim default/a100: --class-map: gpu.nvidia.com -> gpu.tessera.dev"
    ]


def test_typo_in_device_class_suggests_the_known_one() -> None:
    text = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: c}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.tesera.dev}
---
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  resourceClaims: [{name: gpu, resourceClaimName: c}]
  containers: [{name: c, image: x, resources: {claims: [{name: gpu}]}}]
"""
    res = Simulation(cluster(("n", [1024])), manifests(text)).run()
    assert [(p.pod, p.reason) for p in res.pending] == [
        (
            "default/p",
            "0/1 nodes are available: request gpu: device class gpu.tesera.dev does not exist. (did you mean "
            "gpu.tessera.dev?)",
        )
    ]
    assert res.warnings == [
        "test.yaml (document 1): ResourceClaim default/c: spec.devices.requests[0].exactly.deviceClassName: "
        "DeviceClass 'gpu.tesera.dev' does not exist: pods using it stay pending (did you mean gpu.tessera.dev?)"
    ]


def test_v1beta2_is_read_as_v1_with_a_note(corpus: Path) -> None:
    dra = corpus / "dra-manifests"
    ms = list(load_file(dra / "kubernetes-website__examples_dra__deviceclass.yaml"))
    ms += list(
        load_file(
            dra
            / "kubernetes__scheduler_perf_dra_templates__resourceclaimtemplate-consumablecapacity.yaml"
        )
    )
    sim = Simulation(cluster(("n", [1024])), ms)
    assert sorted(sim.classes) == ["example-device-class", "gpu.tessera.dev"]
    assert sim.warnings[:2] == [
        f"{dra / 'kubernetes-website__examples_dra__deviceclass.yaml'} (document 1): DeviceClass example-device-class: "
        "resource.k8s.io/v1beta2 is read as resource.k8s.io/v1 (the same shape)",
        f"{dra / 'kubernetes__scheduler_perf_dra_templates__resourceclaimtemplate-consumablecapacity.yaml'} "
        "(document 1): "
        "ResourceClaimTemplate default/test-claim-template: resource.k8s.io/v1beta2 is read as "
        "resource.k8s.io/v1 (the same shape)",
    ]


def pods(*shapes: tuple[str, str, str], annotations: dict[str, str] | None = None) -> str:
    """Pods with one inline-template claim each: (name, memory, count)."""
    docs = []
    for name, mem, count in shapes:
        docs.append(f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}}}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {{deviceClassName: gpu.tessera.dev, count: {count}, capacity: {{requests: {{memory: {mem}}}}}}}
      constraints: [{{distinctAttribute: gpu.tessera.dev/uuid}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, annotations: {annotations or {}}}}
spec:
  resourceClaims: [{{name: gpu, resourceClaimTemplateName: {name}}}]
  containers: [{{name: c, image: x, resources: {{claims: [{{name: gpu}}]}}}}]
""")
    return "---".join(docs)


def placed(res: Any) -> list[tuple[str, str]]:
    return [(p.pod.split("/")[1], p.device.split("/", 1)[1]) for p in res.placements]


GPU_POLICY_PODS = pods(("p1", "40Gi", "1"), ("p2", "60Gi", "1"), ("p3", "10Gi", "1"))


def test_gpu_policies_first_fit_binpack_spread() -> None:
    c = cluster(("n", [81920, 81920, 81920]))
    ms = manifests(GPU_POLICY_PODS)
    # first-fit: p3 goes to the first GPU with room (gpu-0: 40Gi used).
    assert placed(Simulation(c, ms).run()) == [
        ("p1", "n/gpu-0"),
        ("p2", "n/gpu-1"),
        ("p3", "n/gpu-0"),
    ]
    # binpack: the most booked GPU that fits (gpu-1: 60 of 80Gi).
    assert placed(Simulation(c, ms, policy="binpack").run()) == [
        ("p1", "n/gpu-0"),
        ("p2", "n/gpu-1"),
        ("p3", "n/gpu-1"),
    ]
    # spread: the least booked GPU (gpu-2, empty); p2 also avoids gpu-0.
    assert placed(Simulation(c, ms, policy="spread").run()) == [
        ("p1", "n/gpu-0"),
        ("p2", "n/gpu-1"),
        ("p3", "n/gpu-2"),
    ]


def test_node_policies() -> None:
    c = cluster(("a", [81920]), ("b", [81920]))
    ms = manifests(pods(("p1", "10Gi", "1"), ("p2", "10Gi", "1"), ("p3", "10Gi", "1")))
    assert placed(Simulation(c, ms).run()) == [
        ("p1", "a/gpu-0"),
        ("p2", "a/gpu-0"),
        ("p3", "a/gpu-0"),
    ]
    assert placed(Simulation(c, ms, policy="spread").run()) == [
        ("p1", "a/gpu-0"),
        ("p2", "b/gpu-0"),
        ("p3", "a/gpu-0"),
    ]


def test_hami_annotations_choose_the_policy_per_pod() -> None:
    c = cluster(("a", [81920]), ("b", [81920]))
    ann = {"hami.io/node-scheduler-policy": "spread"}
    ms = manifests(pods(("p1", "10Gi", "1")) + "---" + pods(("p2", "10Gi", "1"), annotations=ann))
    assert placed(Simulation(c, ms).run()) == [("p1", "a/gpu-0"), ("p2", "b/gpu-0")]


def test_topology_keeps_a_pair_in_one_nvlink_domain() -> None:
    # gpu-0/1 form NVLink domain 0, gpu-2/3 domain 2; gpu-1 is nearly full.
    c = Cluster([SimNode("n", {}, [gpu_slice("n", [81920] * 4, nvlink=[0, 0, 2, 2])])])
    ms = manifests(pods(("filler", "75Gi", "1"), ("pair", "20Gi", "2")))
    first_fit = placed(Simulation(c, ms).run())
    assert first_fit == [
        ("filler", "n/gpu-0"),
        ("pair", "n/gpu-1"),
        ("pair", "n/gpu-2"),
    ]  # crosses domains
    topo = placed(Simulation(c, ms, policy="topology").run())
    assert topo == [("filler", "n/gpu-0"), ("pair", "n/gpu-2"), ("pair", "n/gpu-3")]
    res = Simulation(c, ms, policy="topology").run()
    claim = next(
        o
        for o in res.objects
        if o["kind"] == "ResourceClaim" and o["metadata"]["name"] == "pair-gpu"
    )
    assert claim["spec"]["devices"]["constraints"] == [
        {"distinctAttribute": "gpu.tessera.dev/uuid"}
    ]  # spec untouched


def test_whole_gpus_mode_books_every_device_whole() -> None:
    c = cluster(("n", [81920, 81920]))
    ms = manifests(pods(("p1", "10Gi", "1"), ("p2", "10Gi", "1"), ("p3", "90Gi", "1")))
    res = Simulation(c, ms, whole_gpus=True).run()
    assert [(p.pod, p.device, p.memory, p.cores) for p in res.placements] == [
        ("default/p1", "gpu.tessera.dev/n/gpu-0", "80Gi", "100"),
        ("default/p2", "gpu.tessera.dev/n/gpu-1", "80Gi", "100"),
    ]
    # A memory request stays a requirement: no 80 GiB GPU satisfies 90Gi.
    assert [p.pod for p in res.pending] == ["default/p3"]


def test_reason_names_the_capacity_that_is_short() -> None:
    text = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: busy}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.tessera.dev, capacity: {requests: {memory: 8Gi, cores: "60"}}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: busy}
spec:
  replicas: 2
  template:
    spec:
      resourceClaims: [{name: gpu, resourceClaimTemplateName: busy}]
      containers: [{name: c, image: x, resources: {claims: [{name: gpu}]}}]
"""
    res = Simulation(cluster(("n", [81920])), manifests(text)).run()
    assert [p.pod for p in res.pending] == ["default/busy-1"]
    # Memory is not short (72Gi free): only cores are named, with the numbers that block.
    assert res.pending[0].reason.endswith(
        "claim default/busy-1-gpu, request gpu: needs 1 device with memory 8Gi and cores 60; 1 GPU in the cluster "
        "matches its selectors, none has room now: cores short on n/gpu-0: 40 free of 100, needs 60"
    )


def test_invalid_pool_on_one_node_is_that_node_only() -> None:
    # Node a publishes its pool in two slices that both hold a device "gpu-0": the pool is
    # invalid (duplicate device name), so the allocator returns upstream's per-node error
    # (ErrFailedAllocationOnNode). kube-scheduler takes it as node a's reason and goes on to b.
    bad = [gpu_slice("a", [81920]), gpu_slice("a", [81920])]
    for i, sl in enumerate(bad):
        sl["metadata"]["name"] = f"a-gpu.tessera.dev-{i}"
        sl["spec"]["pool"]["resourceSliceCount"] = 2
    c = Cluster([SimNode("a", {}, bad), SimNode("b", {}, [gpu_slice("b", [81920])])])
    res = Simulation(c, manifests(TEMPLATE_30G)).run()
    assert [(p.pod, p.node, p.device) for p in res.placements] == [
        ("default/web-0", "b", "gpu.tessera.dev/b/gpu-0"),
        ("default/web-1", "b", "gpu.tessera.dev/b/gpu-0"),
    ]
    assert [p.pod for p in res.pending] == ["default/web-2", "default/web-3", "default/web-4"]
    assert res.pending[0].reason == (
        "0/2 nodes are available: 1 cannot allocate all claims, 1 invalid resource pools were encountered. "
        "claim default/web-2-gpu, request gpu: needs 1 device with memory 30Gi and cores 20; 1 GPU in the cluster "
        "matches its selectors, none has room now: memory short on b/gpu-0: 20Gi free of 80Gi, needs 30Gi"
    )


GENERIC_CLASS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu}
spec:
  selectors: [{cel: {expression: 'device.driver == "gpu.example.com"'}}]
"""


def generic_slice(
    node: str, devices: list[dict[str, Any]], counters: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """A pool of ``gpu.example.com`` devices on ``node`` (and its counter set, if any)."""
    n = 2 if counters else 1
    out = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-devices"},
            "spec": {
                "driver": "gpu.example.com",
                "pool": {"name": node, "generation": 1, "resourceSliceCount": n},
                "nodeName": node,
                "devices": devices,
            },
        }
    ]
    if counters:
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-counters"},
                "spec": {
                    "driver": "gpu.example.com",
                    "pool": {"name": node, "generation": 1, "resourceSliceCount": n},
                    "nodeName": node,
                    "sharedCounters": [
                        {"name": "cs", "counters": {k: {"value": v} for k, v in counters.items()}}
                    ],
                },
            }
        )
    return out


def gdev(
    name: str,
    numa: int,
    *,
    mem: str | None = None,
    counter: str | None = None,
    multi: bool = True,
    kind: str = "gpu",
) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": name,
        "attributes": {"numa": {"int": numa}, "kind": {"string": kind}},
    }
    if multi:
        d["allowMultipleAllocations"] = True
    if mem:
        d["capacity"] = {"memory": {"value": mem}}
    if counter:
        d["consumesCounters"] = [{"counterSet": "cs", "counters": {"mem": {"value": counter}}}]
    return d


def test_all_mode_constraint_error_keeps_the_pod_off_every_node() -> None:
    # Node a: gpu-1 (numa 1) and gpu-2 (numa 2, filled by the first pod); node b: one numa-1 GPU.
    # The second pod wants all GPUs of a node with 2Gi each, on one numa node. On node a,
    # Kubernetes v1.37.2 checks the constraint before gpu-2's remaining capacity: an error, which
    # aborts the pod's scheduling attempt on every node. It stays pending; it does not go to b.
    c = Cluster(
        [
            SimNode(
                "a",
                {},
                generic_slice("a", [gdev("gpu-1", 1, mem="4Gi"), gdev("gpu-2", 2, mem="4Gi")]),
            ),
            SimNode("b", {}, generic_slice("b", [gdev("gpu-1", 1, mem="4Gi")])),
        ]
    )
    text = (
        GENERIC_CLASS
        + """---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: filler}
spec:
  devices:
    requests:
    - name: g
      exactly:
        deviceClassName: gpu
        selectors: [{cel: {expression: 'device.attributes["gpu.example.com"].numa == 2'}}]
        capacity: {requests: {memory: 4Gi}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: all}
spec:
  devices:
    requests:
    - name: g
      exactly: {deviceClassName: gpu, allocationMode: All, capacity: {requests: {memory: 2Gi}}}
    constraints: [{matchAttribute: gpu.example.com/numa}]
"""
        + "".join(
            f"""---
apiVersion: v1
kind: Pod
metadata: {{name: {n}}}
spec:
  resourceClaims: [{{name: g, resourceClaimName: {n}}}]
  containers: [{{name: c, image: x, resources: {{claims: [{{name: g}}]}}}}]
"""
            for n in ("filler", "all")
        )
    )
    res = Simulation(c, manifests(text)).run()
    assert [(p.pod, p.device) for p in res.placements] == [
        ("default/filler", "gpu.example.com/a/gpu-2")
    ]
    assert [(p.pod, p.reason) for p in res.pending] == [
        (
            "default/all",
            "allocation error: claim default/all, request g: cannot add device gpu.example.com/a/gpu-2 because a claim "
            "constraint would not be satisfied",
        )
    ]


def test_backtracking_releases_a_shared_devices_counters() -> None:
    # One node, a counter set of 8Gi. gpu-1 (numa 0) and gpu-2 (numa 1) are shareable and take
    # 4Gi of it each; nic-3 (numa 1, dedicated) takes 4Gi. The pod's claim wants a GPU and the
    # NIC on one numa node: the search first takes gpu-1, finds the NIC on the other numa node,
    # and backtracks. Kubernetes v1.37.2 gives gpu-1's counters back, so gpu-2 + nic-3 fit in
    # 8Gi; the second pod then shares gpu-2 (its counters are already paid).
    c = Cluster(
        [
            SimNode(
                "n",
                {},
                generic_slice(
                    "n",
                    [
                        gdev("gpu-1", 0, counter="4Gi"),
                        gdev("gpu-2", 1, counter="4Gi"),
                        gdev("nic-3", 1, counter="4Gi", multi=False, kind="nic"),
                    ],
                    counters={"mem": "8Gi"},
                ),
            )
        ]
    )
    nic = 'device.attributes["gpu.example.com"].kind == "nic"'
    gpu = 'device.attributes["gpu.example.com"].kind == "gpu"'
    text = (
        GENERIC_CLASS
        + f"""---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: pair}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {{deviceClassName: gpu, selectors: [{{cel: {{expression: '{gpu}'}}}}]}}
    - name: nic
      exactly: {{deviceClassName: gpu, selectors: [{{cel: {{expression: '{nic}'}}}}]}}
    constraints: [{{matchAttribute: gpu.example.com/numa}}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: numa1}}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {{deviceClassName: gpu, selectors: [{{cel: {{expression: '{gpu} && device.attributes["gpu.example.com"].numa == 1'}}}}]}}
"""  # noqa: E501
        + "".join(
            f"""---
apiVersion: v1
kind: Pod
metadata: {{name: {n}}}
spec:
  resourceClaims: [{{name: g, resourceClaimName: {n}}}]
  containers: [{{name: c, image: x, resources: {{claims: [{{name: g}}]}}}}]
"""
            for n in ("pair", "numa1")
        )
    )
    res = Simulation(c, manifests(text)).run()
    assert [(p.pod, p.request, p.device, p.share_id is not None) for p in res.placements] == [
        ("default/pair", "gpu", "gpu.example.com/n/gpu-2", True),
        ("default/pair", "nic", "gpu.example.com/n/nic-3", False),
        ("default/numa1", "gpu", "gpu.example.com/n/gpu-2", True),
    ]
    assert res.pending == []


def test_binpack_node_order_is_most_booked_first() -> None:
    # a and c get 10Gi each, b (pinned by node selector) 40Gi: binpack then tries b first (half
    # booked), spread the least booked node that fits (a and c tie at 1/8: cluster order), and
    # first fit cluster order.
    c = Cluster(
        [
            SimNode(n, {"kubernetes.io/hostname": n}, [gpu_slice(n, [81920])])
            for n in ("a", "b", "c")
        ]
    )
    pinned = pods(("pin", "40Gi", "1")).replace(
        "spec:\n  resourceClaims",
        "spec:\n  nodeSelector: {kubernetes.io/hostname: b}\n  resourceClaims",
    )
    ms = manifests(
        pods(("p1", "10Gi", "1"))
        + "---"
        + pinned
        + "---"
        + pods(("p3", "10Gi", "1"), ("p4", "10Gi", "1"))
    )
    assert placed(Simulation(c, ms).run()) == [
        ("p1", "a/gpu-0"),
        ("pin", "b/gpu-0"),
        ("p3", "a/gpu-0"),
        ("p4", "a/gpu-0"),
    ]
    assert placed(Simulation(c, ms, policy="binpack").run()) == [
        ("p1", "a/gpu-0"),
        ("pin", "b/gpu-0"),
        ("p3", "b/gpu-0"),
        ("p4", "b/gpu-0"),
    ]
    assert placed(Simulation(c, ms, policy="spread").run()) == [
        ("p1", "a/gpu-0"),
        ("pin", "b/gpu-0"),
        ("p3", "c/gpu-0"),
        ("p4", "a/gpu-0"),
    ]


def test_mig_devices_under_binpack_and_spread() -> None:
    # The bundled A100 in MIG mode (4 dedicated MIG devices, 19968Mi each) and the dual A5000
    # (shareable, 24564Mi each). A MIG device allocated whole counts as full (usage 2), so after
    # the first 16Gi pod lands on a MIG device, binpack keeps the next ones on the MIG node
    # (next free MIG device), spread sends them to the emptiest node, then GPU.
    from tessera.cli._common import examples_dir
    from tessera.inventory import build_resource_slices, load_inventory

    inv = examples_dir() / "inventories"
    c = Cluster(
        [
            SimNode(
                "mig",
                {},
                build_resource_slices(
                    "mig", load_inventory(inv / "telegraf__nvidia_smi_testdata__a100-sxm4-v12.xml")
                ),
            ),
            SimNode(
                "a5000",
                {},
                build_resource_slices(
                    "a5000",
                    load_inventory(inv / "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"),
                ),
            ),
        ]
    )
    # One GPU each (no distinctAttribute on uuid: these MIG devices publish none).
    text = pods(("p1", "16Gi", "1"), ("p2", "16Gi", "1"), ("p3", "16Gi", "1"), ("p4", "4Gi", "1"))
    ms = manifests(
        text.replace("      constraints: [{distinctAttribute: gpu.tessera.dev/uuid}]\n", "")
    )
    assert placed(Simulation(c, ms).run()) == [
        ("p1", "mig/gpu-0-mig-3-0"),
        ("p2", "mig/gpu-0-mig-4-0"),
        ("p3", "mig/gpu-0-mig-5-0"),
        ("p4", "mig/gpu-0-mig-6-0"),
    ]
    assert placed(Simulation(c, ms, policy="binpack").run()) == [
        ("p1", "mig/gpu-0-mig-3-0"),
        ("p2", "mig/gpu-0-mig-4-0"),
        ("p3", "mig/gpu-0-mig-5-0"),
        ("p4", "mig/gpu-0-mig-6-0"),
    ]
    assert placed(Simulation(c, ms, policy="spread").run()) == [
        ("p1", "mig/gpu-0-mig-3-0"),
        ("p2", "a5000/gpu-0"),
        ("p3", "a5000/gpu-1"),
        ("p4", "a5000/gpu-0"),
    ]


def test_reason_separates_too_small_from_full_now_and_not_together() -> None:
    # n1: an 80Gi GPU holding 60Gi, and a 16Gi GPU. A 30Gi share can never fit the 16Gi GPU
    # and does not fit the 80Gi one now. Three 10Gi shares on distinct GPUs: both GPUs fit one
    # on their own, three are needed. Two 17Gi requests of one claim: each fits gpu-0 on its own
    # (20Gi free), not both.
    c = cluster(("n1", [81920, 16384]))
    two = """---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: two}
spec:
  devices:
    requests:
    - {name: a, exactly: {deviceClassName: gpu.tessera.dev, capacity: {requests: {memory: 17Gi}}}}
    - {name: b, exactly: {deviceClassName: gpu.tessera.dev, capacity: {requests: {memory: 17Gi}}}}
---
apiVersion: v1
kind: Pod
metadata: {name: two}
spec:
  resourceClaims: [{name: g, resourceClaimName: two}]
  containers: [{name: c, image: x, resources: {claims: [{name: g}]}}]
"""
    text = (
        TEMPLATE_30G.replace("memory: 30Gi", "memory: 60Gi").replace("replicas: 5", "replicas: 1")
        + "---"
        + pods(("big", "30Gi", "1"), ("pair", "10Gi", "3"))
        + two
    )
    res = Simulation(c, manifests(text)).run()
    assert [(p.pod, p.device) for p in res.placements] == [
        ("default/web-0", "gpu.tessera.dev/n1/gpu-0")
    ]
    reasons = {p.pod: p.reason.split(". ", 1)[1] for p in res.pending}
    assert reasons == {
        "default/big": (
            "claim default/big-gpu, request gpu: needs 1 device with memory 30Gi; 2 GPUs in the cluster match its "
            "selectors: 1 GPU can never hold it (memory 30Gi is more than any of them has: the largest has 16Gi, "
            "n1/gpu-1); memory short on n1/gpu-0: 20Gi free of 80Gi, needs 30Gi"
        ),
        "default/pair": (
            "claim default/pair-gpu, request gpu: needs 3 devices with memory 10Gi; 2 GPUs in the cluster match its "
            "selectors: 2 GPUs fit on their own, 3 needed"
        ),
        "default/two": (
            "claim default/two, request a: needs 1 device with memory 17Gi; 2 GPUs in the cluster match its selectors: "
            "1 GPU can never hold it (memory 17Gi is more than any of them has: the largest has 16Gi, n1/gpu-1); "
            "1 GPU fits on its own, but not together with the rest of the pod (no combination of them fits); "
            "claim default/two, request b: needs 1 device with memory 17Gi; 2 GPUs in the cluster match its selectors: "
            "1 GPU can never hold it (memory 17Gi is more than any of them has: the largest has 16Gi, n1/gpu-1); "
            "1 GPU fits on its own, but not together with the rest of the pod: memory short by 14Gi (needs 17Gi, "
            "3Gi free of 80Gi, 17Gi of it picked by this pod's other requests)"
        ),
    }


def test_no_corpus_dra_manifest_stops_on_a_device_class(corpus: Path) -> None:
    # 32 of the corpus's DRA manifests name classes Tessera does not have (gpu.nvidia.com,
    # gpu.example.com, net.example.com, ...): none of them may stop the run any more. What still
    # stops is bad input of other kinds (templates, fragments, v1beta1/v1alpha shapes).
    from tessera.api.errors import TesseraError
    from tessera.api.loader import load_files

    cl = _bundled()
    ran = 0
    for f in sorted((corpus / "dra-manifests").iterdir()):
        try:
            ms = list(expand_workloads(load_files([f])))
            res = Simulation(cl, ms).run()
        except TesseraError as e:
            assert "DeviceClass" not in str(e) and "device class" not in str(e), str(e)
            continue
        ran += 1
        for p in res.pending:
            if "does not exist" in p.reason:
                assert p.reason.startswith("0/4 nodes are available: request "), p.reason
    assert ran == 44


def _bundled_workload(copies: int) -> list[Manifest]:
    """The bundled example workloads, their pods repeated ``copies`` times under new names (the
    claim templates and classes once): many pods of the same claim shapes."""
    examples = Path(__file__).resolve().parents[2] / "src" / "tessera" / "examples" / "workloads"
    loaded = [m for f in sorted(examples.glob("*.yaml")) for m in expand_workloads(load_file(f))]
    out = [m for m in loaded if m.kind != "Pod"]
    for k in range(copies):
        for m in loaded:
            if m.kind == "Pod":
                obj = {
                    **m.obj,
                    "metadata": {**m.obj["metadata"], "name": f"{m.obj['metadata']['name']}-{k}"},
                }
                out.append(Manifest(obj, m.source))
    return out


def test_memoised_preparations_give_the_same_answers(monkeypatch: Any) -> None:
    # The simulation's allocator memoises claim preparations and selectability per spec
    # (frozen_specs): the answers are those of an allocator that prepares every claim afresh,
    # placements, shareIDs and pending reasons included, under every placement policy.
    from tessera.allocator import Allocator
    from tessera.sim import simulate as sim_mod
    from tessera.sim.cluster import load_cluster

    bundled = load_cluster(
        Path(__file__).resolve().parents[2] / "src" / "tessera" / "examples" / "cluster.yaml"
    )

    def answers(policy: str) -> list[Any]:
        res = Simulation(bundled, _bundled_workload(6), seed=3, policy=policy).run()
        return [
            [(p.pod, p.container, p.device, p.memory, p.cores, p.share_id) for p in res.placements],
            [(p.pod, p.reason) for p in res.pending],
        ]

    memoised = {p: answers(p) for p in ("first-fit", "binpack", "topology")}
    assert memoised["first-fit"][0] and memoised["first-fit"][1]  # some placed, some pending

    class Fresh(Allocator):
        def __init__(self, *a: Any, **kw: Any) -> None:
            kw["frozen_specs"] = False
            super().__init__(*a, **kw)

    monkeypatch.setattr(sim_mod, "Allocator", Fresh)
    for policy, got in memoised.items():
        assert answers(policy) == got, policy


def test_first_available_alternatives_refused_alike_are_said_once() -> None:
    """A firstAvailable request whose alternatives are refused for the same reason says it once
    (a converted 4-GPU HAMi pod had three identical clauses: nvlink, numa, any); alternatives
    refused differently keep their own clause."""
    c = cluster(("n1", [81920, 81920]))
    claim = """---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: alt}
spec:
  devices:
    requests:
    - name: gpu
      firstAvailable:
      - {name: eight, deviceClassName: gpu.tessera.dev, count: 8, capacity: {requests: {memory: 10Gi}}}
      - {name: eight-again, deviceClassName: gpu.tessera.dev, count: 8, capacity: {requests: {memory: 10Gi}}}
      - {name: huge, deviceClassName: gpu.tessera.dev, capacity: {requests: {memory: 100Gi}}}
---
apiVersion: v1
kind: Pod
metadata: {name: alt}
spec:
  resourceClaims: [{name: g, resourceClaimName: alt}]
  containers: [{name: c, image: x, resources: {claims: [{name: g}]}}]
---
apiVersion: v1
kind: Pod
metadata: {name: hami}
spec:
  containers:
  - name: c
    image: x
    resources: {limits: {nvidia.com/gpu: 4, nvidia.com/gpumem: 200000}}
"""
    res = Simulation(c, manifests(claim)).run()
    reasons = {p.pod: p.reason.split(". ", 1)[1] for p in res.pending}
    assert reasons == {
        "default/alt": (
            "claim default/alt, request gpu (alternatives eight, eight-again): needs 8 devices with memory 10Gi; "
            "2 GPUs in the cluster match its selectors: 2 GPUs fit on their own, 8 needed; "
            "claim default/alt, request gpu/huge: needs 1 device with memory 100Gi; 2 GPUs in the cluster match its "
            "selectors: no GPU in the cluster is that large (memory 100Gi is more than any has: the largest has "
            "80Gi, n1/gpu-0)"
        ),
        "default/hami": (
            "claim default/hami-c-gpu, request gpu (every firstAvailable alternative: nvlink, numa, any): needs 4 "
            "devices with memory 200000Mi and cores 0; 2 GPUs in the cluster match its selectors: no GPU in the "
            "cluster is that large (memory 200000Mi is more than any has: the largest has 80Gi, n1/gpu-0)"
        ),
    }
