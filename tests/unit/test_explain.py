"""tessera explain: exact reasons for pending pods, from the bundled default, corpus HAMi pods
on corpus inventories, and hand-built cases modelled on real "pod pending with DRA" reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tessera.api.loader import Manifest, Source, expand_workloads, load_files
from tessera.cli import main
from tessera.cli._common import examples_dir
from tessera.explain.explain import ExplainError, Explanation, NodeExplanation, explain, render_text
from tessera.sim.cluster import Cluster, SimNode, load_cluster


def _default(target: str) -> Explanation:
    ex = examples_dir()
    return explain(
        load_cluster(ex / "cluster.yaml"),
        list(expand_workloads(load_files([ex / "workloads"]))),
        target,
    )


def _node(exp: Explanation, name: str) -> NodeExplanation:
    return next(n for n in exp.nodes if n.node == name)


def _groups(ne: NodeExplanation) -> list[tuple[int, str]]:
    return [(g.count, g.reason) for r in ne.requests for g in r.groups]


def gpu(i: int, mem_gi: int, **attrs: Any) -> dict[str, Any]:
    a = {
        "uuid": {"string": f"GPU-{i}"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "type": {"string": "gpu"},
    }
    for k, v in attrs.items():
        a[k] = {"int": v} if isinstance(v, int) else {"string": v}
    return {
        "name": f"gpu-{i}",
        "allowMultipleAllocations": True,
        "attributes": a,
        "capacity": {
            "memory": {
                "value": f"{mem_gi}Gi",
                "requestPolicy": {
                    "default": f"{mem_gi}Gi",
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


def rslice(
    node: str, devices: list[dict[str, Any]], *, name: str | None = None, count: int = 1
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-gpu.tessera.dev"},
        "spec": {
            "driver": "gpu.tessera.dev",
            "pool": {"name": node, "generation": 1, "resourceSliceCount": count},
            "nodeName": node,
            "devices": devices,
        },
    }


def docs(text: str) -> list[Manifest]:
    return list(
        expand_workloads(
            Manifest(d, Source("case.yaml", i + 1))
            for i, d in enumerate(yaml.safe_load_all(text))
            if d
        )
    )


def claim_pod(name: str, request: str, constraints: str = "") -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
{request}
{constraints}
---
apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  resourceClaims: [{{name: gpu, resourceClaimName: {name}}}]
  containers: [{{name: c, image: x, resources: {{claims: [{{name: gpu}}]}}}}]
"""


def one_node(*devices: dict[str, Any], node: str = "n1") -> Cluster:
    return Cluster([SimNode(node, {"kubernetes.io/hostname": node}, [rslice(node, list(devices))])])


# --- bundled default -----------------------------------------------------------------------------


def test_default_too_big_memory_short_grouped_per_node() -> None:
    exp = _default("default/too-big")
    assert exp.status == "pending"
    assert [n.verdict for n in exp.nodes] == ["refused"] * 4
    h100 = _node(exp, "h100-node")
    assert (
        h100.summary
        == "cannot allocate all claims: claim default/too-big, request gpu: 0 of 8 devices fit (needs 1)"
    )
    # No GPU is that large: "never fits", not "short now" (which would suggest waiting), on
    # every node, whatever the GPUs hold now.
    assert _groups(h100) == [(8, "memory: needs 100Gi, more than the device has (81008Mi)")]
    assert exp.reason.endswith(
        "22 GPUs in the cluster match its selectors: no GPU in the cluster is that large "
        "(memory 100Gi is more than any has: the largest has 81008Mi, h100-node/gpu-0)"
    )
    assert _groups(_node(exp, "v100s-node")) == [
        (8, "memory: needs 100Gi, more than the device has (32510Mi)")
    ]
    assert _groups(_node(exp, "a100-mig-node")) == [
        (4, "memory: needs 100Gi, more than the device has (19968Mi)")
    ]


def test_default_hami_uuid_pinned_names_the_false_subexpression() -> None:
    exp = _default("hami-uuid-pinned")
    assert exp.hami == [
        "HAMi request (container ubuntu-container): 1 GPU × gpumem all of each GPU's memory, gpucores 100 — no GPU on "
        "any node matches the pod's device selectors (HAMi annotations such as nvidia.com/use-gputype or "
        "nvidia.com/use-gpuuuid)"
    ]
    v100 = _groups(_node(exp, "v100s-node"))
    assert len(v100) == 1 and v100[0][0] == 8
    sel = (
        '`(has(device.attributes["gpu.tessera.dev"].uuid) && device.attributes["gpu.tessera.dev"].uuid in '
        '["GPU-123456"]) || '
        '(has(device.attributes["gpu.tessera.dev"].parentUUID) && '
        'device.attributes["gpu.tessera.dev"].parentUUID in ["GPU-123456"])`'
    )
    assert v100[0][1].startswith(
        f'request gpu selector #0 is false: {sel} (uuid = "GPU-76098dc1-d3bc-9a1b-7ea6-f7b48837829e", '
        "no attribute gpu.tessera.dev/parentUUID; "
    )
    # MIG devices have no uuid in this inventory; their GPU's UUID (parentUUID) is not listed either.
    assert _groups(_node(exp, "a100-mig-node")) == [
        (
            4,
            f"request gpu selector #0 is false: {sel} (no attribute gpu.tessera.dev/uuid, "
            'parentUUID = "GPU-513536b6-7d19-9063-b049-1e69664bb298")',
        )
    ]


def test_default_scheduled_pod_says_where_and_why() -> None:
    exp = _default("trainer-1")
    assert exp.status == "scheduled" and exp.node == "h100-node"
    assert [n.summary for n in exp.nodes] == [
        "scheduled here: first node in cluster order where every claim fits"
    ]
    assert exp.placements[0] == (
        "claim default/trainer-1-gpus, request gpus: gpu.tessera.dev/h100-node/gpu-3 "
        "(GPU-afe9f2ed-9dd0-572c-3cd8-b42b58b3bc99, NVIDIA H100 80GB HBM3), shared: memory 40Gi of 81008Mi "
        "free, cores 50 of 100 free"
    )


def test_default_shared_claim_second_pod_and_claim_target() -> None:
    exp = _default("notebook-b")
    assert exp.node == "a5000-node"
    assert exp.nodes[0].summary == (
        "resourceclaim not available on the node: claim default/shared-notebook-gpu is allocated for another node"
    )
    assert exp.nodes[-1].summary == "scheduled here: its claims were already allocated there"
    exp2 = _default("shared-notebook-gpu")
    assert (
        exp2.target == "ResourceClaim default/shared-notebook-gpu (used by Pod default/notebook-a)"
    )
    assert exp2.node == "a5000-node"


def test_unknown_target_is_one_line_error() -> None:
    with pytest.raises(
        ExplainError,
        match=r"^'nope' is neither a pod nor a ResourceClaim of the simulation \(pods: default/inference-0, ",
    ):
        _default("nope")


# --- corpus HAMi pods on corpus inventories -----------------------------------------------------


def test_hami_percentage_two_gpus_on_one_gpu_node(corpus: Path) -> None:
    from tessera.inventory import build_resource_slices, load_inventory

    inv = corpus / "inventories" / "datakit__nvidiasmi_testdata__gtx-1card.V100-PCIE-32GB.xml"
    cl = Cluster(
        [
            SimNode(
                "v100",
                {"kubernetes.io/hostname": "v100"},
                build_resource_slices("v100", load_inventory(str(inv))),
            )
        ]
    )
    exp = explain(
        cl,
        load_files([corpus / "hami-pods" / "HAMi__examples_nvidia__use_memory_fraction.yaml"]),
        "gpu-pod",
    )
    assert exp.hami == [
        "HAMi request (container ubuntu-container): 2 GPUs × gpumem-percentage 50, gpucores 30 — no node has 2 GPUs "
        "with 50% memory and 30% cores free (most: 1 on v100)"
    ]
    # 2 GPUs: firstAvailable tries one NVLink domain, one NUMA node, then any two GPUs
    assert [r.request for r in exp.nodes[0].requests] == [
        "gpu/nvlink-mem-0",
        "gpu/numa-mem-0",
        "gpu/any-mem-0",
    ]
    r = exp.nodes[0].requests[-1]
    assert (
        r.request == "gpu/any-mem-0"
        and r.wants == "2 devices with memory 16255Mi and cores 30 (class gpu.tessera.dev)"
    )
    assert r.notes == ["needs 2 devices, 1 fit on their own"]


def test_hami_card_type_selector_shows_device_value(corpus: Path) -> None:
    from tessera.inventory import build_resource_slices, load_inventory

    inv = corpus / "inventories" / "gpud__nvidia-query_testdata__nvidia-smi-q.535.129.03.A10.txt"
    cl = Cluster(
        [
            SimNode(
                "a10",
                {"kubernetes.io/hostname": "a10"},
                build_resource_slices("a10", load_inventory(str(inv))),
            )
        ]
    )
    exp = explain(
        cl,
        load_files([corpus / "hami-pods" / "HAMi__examples_nvidia__specify_card_type_to_use.yaml"]),
        "gpu-pod",
    )
    # 2 GPUs: the same selector on each topology level of the firstAvailable list
    assert _groups(exp.nodes[0]) == [
        (
            1,
            f"request gpu/{level} selector #0 is false: "
            '`device.attributes["gpu.tessera.dev"].productName.lowerAscii().contains("a100") || '
            'device.attributes["gpu.tessera.dev"].productName.lowerAscii().contains("v100")` (productName = '
            '"NVIDIA A10")',
        )
        for level in ("nvlink", "numa", "any")
    ]
    assert exp.nodes[0].hami == [
        "HAMi request (container ubuntu-container): 2 GPUs × gpumem all of each GPU's memory, gpucores 100 — "
        "no GPU on a10 matches the pod's device selectors"
    ]


# --- cases modelled on real "pending with DRA" reports ------------------------------------------


CAP = "        deviceClassName: gpu.tessera.dev\n"


def test_typo_attribute_is_a_cel_runtime_error_that_aborts_scheduling() -> None:
    req = (
        CAP
        + '        selectors: [{cel: {expression: \'device.attributes["gpu.tessera.dev"].productname == "H100"\'}}]'
    )
    exp = explain(one_node(gpu(0, 80)), docs(claim_pod("typo", req)), "typo")
    ne = exp.nodes[0]
    assert ne.verdict == "error"
    assert ne.summary == (
        "allocation error: claim default/typo: selector #0 on device gpu.tessera.dev/n1/gpu-0: CEL runtime error: "
        "no such key: productname (hint: guard the lookup with has(...) so devices without it do not match)"
    )
    assert _groups(ne) == [
        (
            1,
            "request gpu selector #0: CEL runtime error: no such key: productname (guard the lookup "
            "with has(...)); this aborts scheduling of the pod",
        )
    ]
    assert exp.notes[0].startswith(
        "an allocator error (not 'no room') stops scheduling of the pod on every node"
    )


def test_class_selector_that_excludes_everything() -> None:
    cls = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: nvidia}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.nvidia.com" && device.allowMultipleAllocations'}
---"""
    req = "        deviceClassName: nvidia\n"
    exp = explain(one_node(gpu(0, 80), gpu(1, 80)), docs(cls + claim_pod("c", req)), "c")
    assert _groups(exp.nodes[0]) == [
        (2, 'class nvidia selector #0 is false: `device.driver == "gpu.nvidia.com"`')
    ]


def test_capacity_short_by_how_much_after_another_pod() -> None:
    first = claim_pod("big", CAP + "        capacity: {requests: {memory: 60Gi, cores: '50'}}")
    second = claim_pod("next", CAP + "        capacity: {requests: {memory: 30Gi, cores: '60'}}")
    exp = explain(one_node(gpu(0, 80)), docs(first + "---" + second), "next")
    assert _groups(exp.nodes[0]) == [
        (
            1,
            "memory short by 10Gi (needs 30Gi, 20Gi free of 80Gi); cores short by 10 (needs 60, 50 free of 100)",
        )
    ]


def test_policy_violation_cores_over_max() -> None:
    exp = explain(
        one_node(gpu(0, 80)),
        docs(claim_pod("c", CAP + "        capacity: {requests: {cores: '150'}}")),
        "c",
    )
    assert _groups(exp.nodes[0]) == [(1, "cores: 150 is over the request policy's maximum 100")]


def test_taint_without_toleration() -> None:
    d = gpu(0, 80)
    d["taints"] = [{"key": "gpu.tessera.dev/maintenance", "value": "true", "effect": "NoSchedule"}]
    exp = explain(one_node(d), docs(claim_pod("c", CAP)), "c")
    assert _groups(exp.nodes[0]) == [
        (
            1,
            "taint gpu.tessera.dev/maintenance=true:NoSchedule not tolerated: add a toleration to request gpu",
        )
    ]


def test_incomplete_pool() -> None:
    s = rslice("n1", [gpu(0, 80)], count=2)
    cl = Cluster([SimNode("n1", {"kubernetes.io/hostname": "n1"}, [s])])
    exp = explain(cl, docs(claim_pod("c", CAP)), "c")
    assert exp.nodes[0].pools == [
        "pool gpu.tessera.dev/n1 is incomplete: 1 of resourceSliceCount 2 slices published at generation 1; "
        "none of its devices is allocated until all are published"
    ]
    assert (
        exp.nodes[0].summary
        == "cannot allocate all claims: claim default/c, request gpu: 0 of 0 devices fit (needs 1)"
    )


def test_match_attribute_across_two_gpus_without_nvlink() -> None:
    req = CAP + "        count: 2\n        capacity: {requests: {memory: 40Gi}}"
    cons = (
        "    constraints:\n    - matchAttribute: gpu.tessera.dev/nvlinkDomain\n    - distinctAttribute: "
        "gpu.tessera.dev/uuid"
    )
    exp = explain(
        one_node(gpu(0, 80, nvlinkDomain=0), gpu(1, 80, nvlinkDomain=1)),
        docs(claim_pod("pair", req, cons)),
        "pair",
    )
    ne = exp.nodes[0]
    assert ne.requests[0].fitting == ["gpu.tessera.dev/n1/gpu-0", "gpu.tessera.dev/n1/gpu-1"]
    # Both fit on their own; the allocator's search refused gpu-1 beside gpu-0.
    assert ne.requests[0].notes == [
        "gpu-1: fits on its own, refused beside the other picks: constraint #0 matchAttribute "
        "gpu.tessera.dev/nvlinkDomain: nvlinkDomain = 1 differs from the devices picked before it (gpu-0: 0)"
    ]


def test_constraint_attribute_missing_and_all_devices_table() -> None:
    req = CAP + "        count: 2"
    cons = "    constraints:\n    - matchAttribute: gpu.tessera.dev/nvlinkDomain"
    exp = explain(
        one_node(gpu(0, 80), gpu(1, 80, nvlinkDomain=0)),
        docs(claim_pod("p", req, cons)),
        "p",
        all_devices=True,
    )
    ne = exp.nodes[0]
    assert _groups(ne) == [
        (
            1,
            "has no attribute gpu.tessera.dev/nvlinkDomain, which constraint #0 (matchAttribute) needs",
        )
    ]
    assert [(v.device, v.check) for v in ne.requests[0].devices] == [
        ("gpu.tessera.dev/n1/gpu-0", "constraint"),
        ("gpu.tessera.dev/n1/gpu-1", "fits"),
    ]
    assert "    gpu  gpu-1  fits: fits on its own" in render_text(exp)


# --- CLI ------------------------------------------------------------------------------------------


def test_cli_explain_json_and_table() -> None:
    r = CliRunner().invoke(main, ["explain", "default/too-big", "-o", "json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["status"] == "pending" and data["nodes"][1]["node"] == "v100s-node"
    r2 = CliRunner().invoke(main, ["explain", "too-big"])
    assert r2.exit_code == 0
    assert "v100s-node: refused — cannot allocate all claims" in r2.output
    assert "memory: needs 100Gi, more than the device has (32510Mi)" in r2.output


def test_cli_explain_unknown_exits_2() -> None:
    r = CliRunner().invoke(main, ["explain", "missing-pod"])
    assert r.exit_code == 2
    assert r.output.startswith("tessera: error: 'missing-pod' is neither a pod nor a ResourceClaim")


# --- reasons name every capacity consumed, and never contradict themselves -----------------------


GTX1080TI_CSV = """\
index, uuid, name, memory.total [MiB], pci.bus_id, driver_version, compute_cap, mig.mode.current
0, GPU-5d2a8e1c-1f0b-7c43-9e1a-3b8f2d6c4a10, NVIDIA GeForce GTX 1080 Ti, 11264 MiB, 00000000:01:00.0, 535.161.08, 6.1, [N/A]
"""  # noqa: E501

HAMI_ON_1080TI = """
apiVersion: v1
kind: Pod
metadata: {name: share}
spec:
  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 3000}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: whole}
spec:
  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]
---
apiVersion: v1
kind: Pod
metadata: {name: half-cores}
spec:
  containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpucores: 50}}}]
"""


def test_default_memory_is_named_as_the_blocker_on_a_1080ti() -> None:
    # One GTX 1080 Ti (11264 MiB) from an `nvidia-smi --query-gpu` CSV; a 3000 MiB share is
    # placed first. `gpu: 1` and `gpu: 1, gpucores: 50` name no memory, so each books the whole
    # memory (the request policy's default): both pending, and the reason says memory is what is
    # short (cores are not: 100 of 100 are free), with the numbers.
    from tessera.inventory import build_resource_slices, parse_inventory
    from tessera.sim.simulate import Simulation

    gpus = parse_inventory(GTX1080TI_CSV, "gtx1080ti.csv")
    cl = Cluster([SimNode("n", {"kubernetes.io/hostname": "n"}, build_resource_slices("n", gpus))])
    res = Simulation(cl, docs(HAMI_ON_1080TI)).run()
    assert [(p.pod, p.memory, p.cores) for p in res.placements] == [
        ("default/share", "3000Mi", "0")
    ]
    whole, half = (
        f"0/1 nodes are available: 1 cannot allocate all claims. claim default/{p}-c-gpu, request gpu: needs 1 device "
        f"with cores {c} and memory 11Gi (all of it: the request names no memory, so the request policy's default "
        "applies); 1 GPU in the cluster matches its selectors, none has room now: memory short on n/gpu-0: 8264Mi free "
        "of 11Gi, needs 11Gi"
        for p, c in (("whole", 100), ("half-cores", 50))
    )
    assert [(p.pod, p.reason) for p in res.pending] == [
        ("default/whole", whole),
        ("default/half-cores", half),
    ]
    exp = explain(cl, docs(HAMI_ON_1080TI), "half-cores")
    assert _groups(exp.nodes[0]) == [
        (
            1,
            "memory short by 3000Mi (needs 11Gi, policy default: the request names no memory, 8264Mi free of 11Gi)",
        )
    ]
    assert (
        exp.nodes[0].requests[0].wants
        == "1 device with cores 50 and memory 11Gi (all of it: the request names no memory, so the request "
        "policy's default applies) (class gpu.tessera.dev)"
    )


def test_device_whose_shared_counters_are_used_up_does_not_fit_on_its_own() -> None:
    # A partitionable GPU: one 8Gi counter set; "full" (8Gi of it) is held by an earlier claim,
    # "half" (4Gi) is free by itself but its counters are used up: it does not fit on its own.
    slices = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "n1-devices"},
            "spec": {
                "driver": "gpu.example.com",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 2},
                "nodeName": "n1",
                "devices": [
                    {
                        "name": "full",
                        "consumesCounters": [
                            {"counterSet": "gpu-0", "counters": {"mem": {"value": "8Gi"}}}
                        ],
                    },
                    {
                        "name": "half",
                        "consumesCounters": [
                            {"counterSet": "gpu-0", "counters": {"mem": {"value": "4Gi"}}}
                        ],
                    },
                ],
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": "n1-counters"},
            "spec": {
                "driver": "gpu.example.com",
                "pool": {"name": "n1", "generation": 1, "resourceSliceCount": 2},
                "nodeName": "n1",
                "sharedCounters": [{"name": "gpu-0", "counters": {"mem": {"value": "8Gi"}}}],
            },
        },
    ]
    cl = Cluster([SimNode("n1", {"kubernetes.io/hostname": "n1"}, slices)])
    text = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: part}
spec:
  selectors: [{cel: {expression: 'device.driver == "gpu.example.com"'}}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: earlier}
spec:
  devices:
    requests: [{name: g, exactly: {deviceClassName: part}}]
status:
  allocation:
    devices:
      results: [{request: g, driver: gpu.example.com, pool: n1, device: full}]
---""" + claim_pod("want", "        deviceClassName: part\n")
    exp = explain(cl, docs(text), "want", all_devices=True)
    ne = exp.nodes[0]
    assert [(v.device, v.check) for v in ne.requests[0].devices] == [
        ("gpu.example.com/n1/full", "in-use"),
        ("gpu.example.com/n1/half", "counters"),
    ]
    assert _groups(ne) == [
        (1, "in use: allocated whole (dedicated) to claim default/earlier"),
        (
            1,
            "shared counter gpu-0/mem used up: the device needs 4Gi, 0 of 8Gi left (8Gi held by earlier allocations)",
        ),
    ]
    assert ne.requests[0].fitting == []
    assert exp.reason.endswith(
        "claim default/want, request gpu: needs 1 device; 2 devices in the cluster match its selectors, none has room "
        "now: 1 device in use (allocated whole to another claim); 1 device with shared counters used up "
        "(n1/gpu-0: mem 0 of 8Gi left)"
    )


def test_simulate_and_explain_state_the_same_cores_for_a_pending_pod() -> None:
    # Issue 22.11: 9 whole devices on the bundled cluster (H100s, V100Ss, A5000s: cores
    # default 0; the A100's 4 static MIG instances: cores 100, no policy) fit on no node.
    # simulate said "cores 100 (all of it on 4 of the 22 devices ...)", explain "cores 0"
    # (its line came from the first node's record only).
    from tessera.sim.simulate import Simulation

    ex = examples_dir()
    text = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: big}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {deviceClassName: gpu.tessera.dev, count: 9}
---
apiVersion: v1
kind: Pod
metadata: {name: train}
spec:
  resourceClaims: [{name: g, resourceClaimName: big}]
  containers: [{name: c, image: x, resources: {claims: [{name: g}]}}]
"""
    cluster = load_cluster(ex / "cluster.yaml")
    res = Simulation(cluster, docs(text)).run()
    cores = (
        "cores 100 (all of it on 4 of the 22 devices that have it, 0 on the others: "
        "the request names no cores, so the request policy's default applies)"
    )
    assert cores in res.pending[0].reason
    exp = explain(cluster, docs(text), "train")
    assert exp.wants == {
        "claim default/big, request gpus": "9 devices with all of the device's memory (the request "
        f"names no memory, so the request policy's default applies) and {cores} (class gpu.tessera.dev)"
    }
    assert "  claim default/big, request gpus wants 9 devices with" in render_text(exp)
    assert "cores 0" not in render_text(exp)


def test_more_than_three_shortfalls_name_the_least_short_device() -> None:
    """Four GPUs short by four different amounts are one group, which names the device the
    request misses by the least (read from the record's amounts, not from the words)."""
    taken = [
        claim_pod(
            f"p{gi}", CAP + f"        capacity: {{requests: {{memory: {gi}Gi, cores: '10'}}}}"
        )
        for gi in (70, 65, 60, 55)
    ]
    want = claim_pod("want", CAP + "        capacity: {requests: {memory: 30Gi, cores: '10'}}")
    exp = explain(
        one_node(gpu(0, 80), gpu(1, 80), gpu(2, 80), gpu(3, 80)),
        docs("---".join([*taken, want])),
        "want",
    )
    assert _groups(exp.nodes[0]) == [
        (
            4,
            "memory short (needs 30Gi); the least short: gpu-3: "
            "memory short by 5Gi (needs 30Gi, 25Gi free of 80Gi)",
        )
    ]
