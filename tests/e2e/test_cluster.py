"""The real control plane accepts Tessera's ResourceSlices and the real kube-scheduler
allocates consumable GPU capacity (memory, cores) to pods' ResourceClaims."""

from __future__ import annotations

import re
import zlib

import pytest

from tessera.kube.client import ApiError
from tessera.kube.cluster import FEATURE_GATES, Inventory
from tessera.kube.workloads import (
    apply_objects,
    delete_pod,
    gpu_claim_template,
    gpu_pod,
    pod_allocations,
    pod_claims,
    wait_pod_scheduled,
    wait_pod_unschedulable,
)

from .conftest import LiveCluster

pytestmark = pytest.mark.cluster

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
RESOURCE = "resource.k8s.io/v1"


def one_gpu_node(name: str, memory: str = "81559Mi") -> Inventory:
    """A node with one GPU in the shape the driver publishes (pool = node name)."""
    inv = Inventory()
    inv.add_slice(
        {
            "apiVersion": RESOURCE,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{name}-gpu.tessera.dev"},
            "spec": {
                "driver": "gpu.tessera.dev",
                "nodeName": name,
                "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {
                        "name": "gpu-0",
                        "allowMultipleAllocations": True,
                        "attributes": {
                            "uuid": {"string": f"GPU-00000000-0000-0000-0000-{zlib.crc32(name.encode()):012d}"},
                            "productName": {"string": "NVIDIA H100 80GB HBM3"},
                            "index": {"int": 0},
                        },
                        "capacity": {
                            "memory": {"value": memory, "requestPolicy": {"default": memory, "validRange": {"min": "1Mi", "step": "1Mi"}}},
                            "cores": {"value": "100", "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}},
                        },
                    }
                ],
            },
        },
        f"test node {name}",
    )
    inv.nodes[0].labels["tessera.dev/test-node"] = name
    return inv


def test_components_healthy_with_dra_gates(kube_cluster: LiveCluster) -> None:
    st = kube_cluster.cluster.status()
    assert st.state == "running"
    assert [c.name for c in st.components] == ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]
    assert all(c.healthy and c.running for c in st.components), st.components
    version = kube_cluster.client.raw_get("/version")
    assert version["major"] == "1" and version["minor"] == "37" and version["gitVersion"].startswith("v1.37.")
    metrics = kube_cluster.client.raw_get("/metrics")
    for gate in [*FEATURE_GATES, "DRAAdminAccess", "DRAPrioritizedList", "DRAExtendedResource", "DRAResourceClaimDeviceStatus"]:
        assert f'kubernetes_feature_enabled{{name="{gate}",stage="' in metrics
        line = next(ln for ln in metrics.splitlines() if ln.startswith(f'kubernetes_feature_enabled{{name="{gate}",'))
        assert line.endswith(" 1"), line


def test_nodes_slices_and_device_class_registered(kube_cluster: LiveCluster) -> None:
    client = kube_cluster.client
    nodes = {n["metadata"]["name"]: n for n in client.list("v1", "Node", label_selector="tessera.dev/simulated-node=true")}
    assert {"gpu-node-1", "gpu-node-2"} <= set(nodes)
    node = nodes["gpu-node-1"]
    assert node["spec"].get("taints") is None
    assert node["status"]["allocatable"] == {"cpu": "128", "memory": "1Ti", "pods": "250"}
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"

    stored = client.get(RESOURCE, "ResourceSlice", "gpu-node-1-gpu.tessera.dev")
    assert stored["spec"]["nodeName"] == "gpu-node-1"
    assert stored["spec"]["pool"] == {"name": "gpu-node-1", "generation": 1, "resourceSliceCount": 1}
    dev = stored["spec"]["devices"][0]
    assert dev["name"] == "gpu-0" and dev["allowMultipleAllocations"] is True
    assert dev["capacity"]["memory"] == {
        "value": "81559Mi",
        "requestPolicy": {"default": "81559Mi", "validRange": {"min": "1Mi", "step": "1Mi"}},
    }
    assert dev["capacity"]["cores"] == {
        "value": "100",
        "requestPolicy": {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}},
    }
    assert dev["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}

    dc = client.get(RESOURCE, "DeviceClass", "gpu.tessera.dev")
    assert dc["spec"]["selectors"] == [{"cel": {"expression": 'device.driver == "gpu.tessera.dev"'}}]


def test_api_server_rejects_request_policy_without_multiple_allocations(kube_cluster: LiveCluster) -> None:
    bad = one_gpu_node("invalid-node").slices[0]
    bad["metadata"]["name"] = "invalid-slice"
    del bad["spec"]["devices"][0]["allowMultipleAllocations"]
    with pytest.raises(ApiError) as err:
        kube_cluster.client.create(bad)
    assert err.value.status == 422 and err.value.reason == "Invalid"
    assert "spec.devices[0].capacity[memory].requestPolicy" in err.value.message


def test_pod_claim_template_gets_consumable_share(kube_cluster: LiveCluster, kube_namespace: str) -> None:
    client = kube_cluster.client
    ns = kube_namespace
    apply_objects(client, [gpu_claim_template("gpu-8g-20c", namespace=ns, memory="8Gi", cores=20)])
    apply_objects(client, [gpu_pod("worker", namespace=ns, template="gpu-8g-20c", node_selector={"kubernetes.io/hostname": "gpu-node-1"})])

    pod = wait_pod_scheduled(client, "worker", ns)
    assert pod["spec"]["nodeName"] == "gpu-node-1"
    claims = pod_claims(client, "worker", ns)
    assert list(claims) == ["gpu"]
    claim = claims["gpu"]
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    allocation = claim["status"]["allocation"]
    results = allocation["devices"]["results"]
    assert len(results) == 1
    r = results[0]
    assert (r["request"], r["driver"], r["pool"], r["device"]) == ("gpu", "gpu.tessera.dev", "gpu-node-1", "gpu-0")
    assert r["consumedCapacity"] == {"memory": "8Gi", "cores": "20"}
    assert UUID_RE.match(r["shareID"]), r["shareID"]
    assert allocation["nodeSelector"]["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-1"]}]}
    ]
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "worker", "uid": pod["metadata"]["uid"]}
    ]


@pytest.mark.parametrize(
    ("node", "memory", "cores", "fits", "full_consumed"),
    [
        # 81559Mi per GPU: three shares of 20Gi (61440Mi) fit, a fourth (81920Mi) does not.
        ("fill-memory", "20Gi", 10, 3, {"memory": "20Gi", "cores": "10"}),
        # 100 cores: two shares of 45 fit, a third (135) does not.
        ("fill-cores", "1Gi", 45, 2, {"memory": "1Gi", "cores": "45"}),
    ],
)
def test_gpu_fills_up_then_next_pod_pends(
    kube_cluster: LiveCluster, kube_namespace: str, node: str, memory: str, cores: int, fits: int, full_consumed: dict[str, str]
) -> None:
    client = kube_cluster.client
    ns = kube_namespace
    kube_cluster.register(one_gpu_node(node))
    apply_objects(client, [gpu_claim_template("share", namespace=ns, memory=memory, cores=cores)])
    share_ids = set()
    for i in range(fits):
        apply_objects(client, [gpu_pod(f"p{i}", namespace=ns, template="share", node_selector={"tessera.dev/test-node": node})])
        pod = wait_pod_scheduled(client, f"p{i}", ns)
        assert pod["spec"]["nodeName"] == node
        alloc = pod_allocations(client, f"p{i}", ns)["gpu"]
        assert alloc is not None
        (result,) = alloc["devices"]["results"]
        assert (result["pool"], result["device"]) == (node, "gpu-0")
        assert result["consumedCapacity"] == full_consumed
        share_ids.add(result["shareID"])
    assert len(share_ids) == fits

    apply_objects(client, [gpu_pod("over", namespace=ns, template="share", node_selector={"tessera.dev/test-node": node})])
    message = wait_pod_unschedulable(client, "over", ns)
    assert "1 cannot allocate all claims" in message, message
    assert "didn't match Pod's node affinity/selector" in message, message
    claim = pod_claims(client, "over", ns)["gpu"]
    assert "allocation" not in claim.get("status", {})

    # Freeing one share lets the pending pod in.
    delete_pod(client, "p0", ns)
    pod = wait_pod_scheduled(client, "over", ns, timeout=90)
    assert pod["spec"]["nodeName"] == node
