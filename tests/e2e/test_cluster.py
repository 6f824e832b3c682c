"""The real control plane accepts Tessera's ResourceSlices and the real kube-scheduler
allocates consumable GPU capacity (memory, cores) to pods' ResourceClaims."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tessera.kube.client import ApiError
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
from tessera.localcluster import cluster as cluster_mod
from tessera.localcluster.cluster import FEATURE_GATES, Cluster, Inventory

from .conftest import H100_SINGLE_INVENTORY, LiveCluster, corpus_node, inventory_of, session_nodes

pytestmark = pytest.mark.cluster

RESOURCE = "resource.k8s.io/v1"


def one_gpu_node(name: str) -> Inventory:
    """A node with the single H100 80GB HBM3 of a corpus capture (81080Mi published: 81559Mi
    less 479Mi driver-reserved; 100 cores), its
    slice built by tessera.inventory, labelled ``tessera.dev/test-node=<name>``."""
    node = corpus_node(name, H100_SINGLE_INVENTORY, labels={"tessera.dev/test-node": name})
    return inventory_of([node])


def test_components_healthy_with_dra_gates(kube_cluster: LiveCluster) -> None:
    st = kube_cluster.cluster.status()
    assert st.state == "running"
    assert [c.name for c in st.components] == [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ]
    assert all(c.healthy and c.running for c in st.components), st.components
    version = kube_cluster.client.raw_get("/version")
    assert (
        version["major"] == "1"
        and version["minor"] == "37"
        and version["gitVersion"].startswith("v1.37.")
    )
    metrics = kube_cluster.client.raw_get("/metrics")
    for gate in [
        *FEATURE_GATES,
        "DRAAdminAccess",
        "DRAPrioritizedList",
        "DRAExtendedResource",
        "DRAResourceClaimDeviceStatus",
    ]:
        assert f'kubernetes_feature_enabled{{name="{gate}",stage="' in metrics
        line = next(
            ln
            for ln in metrics.splitlines()
            if ln.startswith(f'kubernetes_feature_enabled{{name="{gate}",')
        )
        assert line.endswith(" 1"), line


def test_nodes_slices_and_device_class_registered(kube_cluster: LiveCluster) -> None:
    client = kube_cluster.client
    nodes = {
        n["metadata"]["name"]: n
        for n in client.list("v1", "Node", label_selector="tessera.dev/simulated-node=true")
    }
    assert {"h100-node", "a5000-node"} <= set(nodes)
    node = nodes["h100-node"]
    assert node["spec"].get("taints") is None
    assert node["status"]["allocatable"] == {"cpu": "128", "memory": "1Ti", "pods": "250"}
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    dc = client.get(RESOURCE, "DeviceClass", "gpu.tessera.dev")
    assert dc["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "gpu.tessera.dev"'}}
    ]


def test_inventory_slices_round_trip_through_api_server(kube_cluster: LiveCluster) -> None:
    """The slices tessera.inventory builds from the corpus' 8x H100 (+ NVLink topology) and
    2x A5000 inventories are accepted and stored unchanged: the server's canonical form of
    every quantity is the one Tessera writes."""
    client = kube_cluster.client
    built = {s["metadata"]["name"]: s for n in session_nodes() for s in n.slices}
    assert sorted(built) == ["a5000-node-gpu.tessera.dev", "h100-node-gpu.tessera.dev"]
    stored = {name: client.get(RESOURCE, "ResourceSlice", name) for name in built}
    for name, s in built.items():
        assert stored[name]["spec"] == s["spec"], name

    h100 = stored["h100-node-gpu.tessera.dev"]["spec"]
    assert h100["nodeName"] == "h100-node" and h100["driver"] == "gpu.tessera.dev"
    assert h100["pool"] == {"name": "h100-node", "generation": 1, "resourceSliceCount": 1}
    devs = h100["devices"]
    assert [d["name"] for d in devs] == [f"gpu-{i}" for i in range(8)]
    assert all(d["allowMultipleAllocations"] is True for d in devs)
    d0 = devs[0]
    assert d0["attributes"]["uuid"] == {"string": "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"}
    assert d0["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert d0["attributes"]["architecture"] == {"string": "Hopper"}
    assert d0["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert d0["attributes"]["driverVersion"] == {"version": "535.161.8"}
    assert d0["attributes"]["pcieBusID"] == {"string": "0000:19:00.0"}
    # NV12 between all eight GPUs: one NVLink domain; NUMA nodes from the topology.
    assert {d["attributes"]["nvlinkDomain"]["int"] for d in devs} == {0}
    assert [d["attributes"]["numaNode"]["int"] for d in devs] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert len({d["attributes"]["uuid"]["string"] for d in devs}) == 8
    for d in devs:
        assert d["capacity"] == {
            "memory": {
                "value": "81008Mi",  # 81559Mi less the 551Mi the driver reserves
                "requestPolicy": {
                    "default": "81008Mi",
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
        }

    a5000 = stored["a5000-node-gpu.tessera.dev"]["spec"]
    assert a5000["nodeName"] == "a5000-node"
    assert [d["name"] for d in a5000["devices"]] == ["gpu-0", "gpu-1"]
    assert [d["attributes"]["uuid"]["string"] for d in a5000["devices"]] == [
        "GPU-12345678-aaaa-bbbb-cccc-0123456789ab",
        "GPU-12345678-aaaa-bbbb-cccc-0123456789cd",
    ]
    assert {d["attributes"]["productName"]["string"] for d in a5000["devices"]} == {
        "NVIDIA RTX A5000"
    }
    assert [d["capacity"]["memory"]["value"] for d in a5000["devices"]] == ["24114Mi", "24114Mi"]
    assert all("nvlinkDomain" not in d["attributes"] for d in a5000["devices"])  # no topology given


def test_api_server_rejects_request_policy_without_multiple_allocations(
    kube_cluster: LiveCluster,
) -> None:
    bad = one_gpu_node("invalid-node").slices[0]
    bad["metadata"]["name"] = "invalid-slice"
    del bad["spec"]["devices"][0]["allowMultipleAllocations"]
    with pytest.raises(ApiError) as err:
        kube_cluster.client.create(bad)
    assert err.value.status == 422 and err.value.reason == "Invalid"
    assert "spec.devices[0].capacity[memory].requestPolicy" in err.value.message


@pytest.mark.parametrize(
    ("node", "memory", "cores", "fits", "full_consumed"),
    [
        # 81080Mi per GPU: three shares of 20Gi (61440Mi) fit, a fourth (81920Mi) does not.
        ("fill-memory", "20Gi", 10, 3, {"memory": "20Gi", "cores": "10"}),
        # 100 cores: two shares of 45 fit, a third (135) does not.
        ("fill-cores", "1Gi", 45, 2, {"memory": "1Gi", "cores": "45"}),
    ],
)
def test_gpu_fills_up_then_next_pod_pends(
    kube_cluster: LiveCluster,
    kube_namespace: str,
    node: str,
    memory: str,
    cores: int,
    fits: int,
    full_consumed: dict[str, str],
) -> None:
    client = kube_cluster.client
    ns = kube_namespace
    kube_cluster.register(one_gpu_node(node))
    apply_objects(client, [gpu_claim_template("share", namespace=ns, memory=memory, cores=cores)])
    share_ids = set()
    for i in range(fits):
        apply_objects(
            client,
            [
                gpu_pod(
                    f"p{i}",
                    namespace=ns,
                    template="share",
                    node_selector={"tessera.dev/test-node": node},
                )
            ],
        )
        pod = wait_pod_scheduled(client, f"p{i}", ns)
        assert pod["spec"]["nodeName"] == node
        alloc = pod_allocations(client, f"p{i}", ns)["gpu"]
        assert alloc is not None
        (result,) = alloc["devices"]["results"]
        assert (result["pool"], result["device"]) == (node, "gpu-0")
        assert result["consumedCapacity"] == full_consumed
        share_ids.add(result["shareID"])
    assert len(share_ids) == fits

    apply_objects(
        client,
        [
            gpu_pod(
                "over",
                namespace=ns,
                template="share",
                node_selector={"tessera.dev/test-node": node},
            )
        ],
    )
    message = wait_pod_unschedulable(client, "over", ns)
    assert "1 cannot allocate all claims" in message, message
    assert "didn't match Pod's node affinity/selector" in message, message
    claim = pod_claims(client, "over", ns)["gpu"]
    assert "allocation" not in claim.get("status", {})

    # Freeing one share lets the pending pod in.
    delete_pod(client, "p0", ns)
    pod = wait_pod_scheduled(client, "over", ns, timeout=90)
    assert pod["spec"]["nodeName"] == node


def test_up_moves_to_other_ports_when_one_was_taken_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports are picked free and bound a moment later: when another process takes one in
    between (other clusters on a shared machine), `up` starts the control plane again on
    other ports instead of failing."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real, picked = cluster_mod._free_ports, []

    def free_ports(n: int) -> list[int]:
        ports = real(n)
        if not picked:
            ports[2] = taken.getsockname()[1]  # kube-apiserver's
        picked.append(ports)
        return ports

    monkeypatch.setattr(cluster_mod, "_free_ports", free_ports)
    c, said = Cluster(tmp_path / "state"), []
    try:
        c.up(Inventory(), build_binaries=False, die_with_parent=True, progress=said.append)
        assert len(picked) == 2
        assert (
            "kube-apiserver could not bind its port (taken by another process meanwhile); starting the control "
            "plane again on other ports" in said
        )
        assert c.status().state == "running"
        assert c.server == f"https://127.0.0.1:{picked[1][2]}"
    finally:
        c.down()
        taken.close()
