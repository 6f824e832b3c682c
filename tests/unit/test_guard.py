"""The node driver's guard against a second manager of the node's GPUs
(``tessera.driver.guard``): Node objects, ResourceSlices and device plugin sockets that show
each kind of other manager, built from real inputs (HAMi's node annotations, the NVIDIA DRA
driver's published devices, Tessera's own slices of a real inventory)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.driver.guard import (
    MODE_LABEL,
    OVERRIDE_LABEL,
    SecondManagerError,
    Sign,
    check_node,
    discovered_uuids,
    mode_signs,
    node_mode,
    node_signs,
    refusal,
    slice_signs,
    socket_signs,
)
from tessera.inventory import build_resource_slices, load_inventory
from tessera.kube.client import ApiError

HAMI_ANNOTATIONS_FILE = (
    "inventories/HAMi__docs_develop_protocol__node-register-annotations.2xV100-PCIE-32GB.txt"
)
NVIDIA_FULL_GPU = "dra-manifests/dra-driver-nvidia-gpu__docs_reference_resourceslice-attributes__full-gpu-A100-PCIE-40GB.fragment.yaml"  # noqa: E501
NVIDIA_MIG = "dra-manifests/dra-driver-nvidia-gpu__docs_reference_resourceslice-attributes__mig-1g.5gb.fragment.yaml"
A5000 = "inventories/telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"


def hami_annotations(corpus: Path) -> dict[str, str]:
    """HAMi's node annotations as its docs show them (``key: value`` lines)."""
    out = {}
    for line in (corpus / HAMI_ANNOTATIONS_FILE).read_text().splitlines():
        key, _, value = line.partition(": ")
        out[key] = value
    return out


def node(
    name: str = "gpu-1",
    allocatable: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", **(allocatable or {})}
        },
    }


def nvidia_slice(devices: list[dict[str, Any]], node_name: str = "gpu-1") -> dict[str, Any]:
    """A ResourceSlice of the NVIDIA DRA driver (driver gpu.nvidia.com) with these devices."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node_name}-gpu.nvidia.com-x7k2p"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


# ---- Node objects ------------------------------------------------------------------------


def test_device_plugin_resources_in_allocatable() -> None:
    assert node_signs(node(allocatable={"nvidia.com/gpu": "8"})) == [
        Sign("device-plugin", "Node gpu-1 status.allocatable nvidia.com/gpu: 8")
    ]
    # HAMi's device plugin advertises split replicas: 2 GPUs x deviceSplitCount 10.
    assert [
        s.detail
        for s in node_signs(
            node(allocatable={"nvidia.com/gpu": "20", "nvidia.com/gpumem": "65536"})
        )
    ] == [
        "Node gpu-1 status.allocatable nvidia.com/gpu: 20",
        "Node gpu-1 status.allocatable nvidia.com/gpumem: 65536",
    ]
    assert [s.detail for s in node_signs(node(allocatable={"nvidia.com/mig-1g.10gb": "7"}))] == [
        "Node gpu-1 status.allocatable nvidia.com/mig-1g.10gb: 7"
    ]
    assert [s.detail for s in node_signs(node(allocatable={"volcano.sh/vgpu-number": "40"}))] == [
        "Node gpu-1 status.allocatable volcano.sh/vgpu-number: 40"
    ]
    assert [s.detail for s in node_signs(node(allocatable={"nvidia.com/gpu.shared": "4"}))] == [
        "Node gpu-1 status.allocatable nvidia.com/gpu.shared: 4"
    ]


def test_a_stopped_device_plugin_leaves_zero_and_other_resources_do_not_count() -> None:
    # The kubelet keeps a resource at 0 after its device plugin went away.
    assert node_signs(node(allocatable={"nvidia.com/gpu": "0"})) == []
    assert (
        node_signs(
            node(allocatable={"amd.com/gpu": "8", "example.com/nic": "2", "hugepages-2Mi": "1Gi"})
        )
        == []
    )


def test_hami_node_annotations(corpus: Path) -> None:
    ann = hami_annotations(corpus)
    signs = node_signs(node(annotations=ann))
    assert signs == [
        Sign("hami", "Node gpu-1 annotation hami.io/node-nvidia-register"),
        Sign("hami", "Node gpu-1 annotation hami.io/node-handshake-nvidia"),
    ]
    # MLU-only annotations are not a manager of NVIDIA GPUs.
    mlu = {k: v for k, v in ann.items() if "mlu" in k}
    assert mlu and node_signs(node(annotations=mlu)) == []


# ---- ResourceSlices of other DRA drivers ----------------------------------------------------


def test_another_dra_driver_publishing_the_same_gpu(corpus: Path) -> None:
    full = yaml.safe_load((corpus / NVIDIA_FULL_GPU).read_text())
    mig = yaml.safe_load((corpus / NVIDIA_MIG).read_text())
    uuid = full[0]["attributes"]["uuid"]["string"]
    assert uuid == "GPU-2fa81118-5a5f-aa66-7660-471eed407181"
    # This node's GPU is the one NVIDIA's driver published (UUIDs compare without case).
    assert slice_signs([nvidia_slice(full)], [uuid.lower()]) == [
        Sign(
            "dra-driver",
            "DRA driver gpu.nvidia.com publishes GPU-2fa81118-5a5f-aa66-7660-471eed407181 "
            "(ResourceSlice gpu-1-gpu.nvidia.com-x7k2p)",
        )
    ]
    # A MIG device of it names the GPU in parentUUID.
    assert [s.detail for s in slice_signs([nvidia_slice(mig)], [uuid])] == [
        "DRA driver gpu.nvidia.com publishes GPU-2fa81118-5a5f-aa66-7660-471eed407181 (ResourceSlice "
        "gpu-1-gpu.nvidia.com-x7k2p)"
    ]
    # ... or its own MIG UUID, when this node discovered that MIG device.
    assert [
        s.detail
        for s in slice_signs([nvidia_slice(mig)], ["MIG-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"])
    ] == [
        "DRA driver gpu.nvidia.com publishes MIG-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d (ResourceSlice "
        "gpu-1-gpu.nvidia.com-x7k2p)"
    ]
    # Other GPUs: nothing in common.
    assert slice_signs([nvidia_slice(full)], ["GPU-00000000-0000-0000-0000-000000000000"]) == []


def test_hami_dra_driver_and_qualified_attributes(corpus: Path) -> None:
    gpus = load_inventory(corpus / A5000)
    # HAMi's DRA driver (hami-core-gpu.project-hami.io) publishes one device per GPU with
    # attribute uuid (docs: hami.md section 4); a qualified name counts the same.
    devices = [
        {
            "name": f"hami-gpu-{g.index}",
            "attributes": {
                "type": {"string": "hami-gpu"},
                "hami-core-gpu.project-hami.io/uuid": {"string": g.uuid},
            },
        }
        for g in gpus
    ]
    s = nvidia_slice(devices)
    s["spec"]["driver"] = "hami-core-gpu.project-hami.io"
    found = slice_signs([s], discovered_uuids(gpus))
    assert len(found) == 1 and found[0].kind == "dra-driver"
    assert found[0].detail == (
        f"DRA driver hami-core-gpu.project-hami.io publishes {', '.join(sorted(g.uuid for g in gpus))} "
        "(ResourceSlice gpu-1-gpu.nvidia.com-x7k2p)"
    )


def test_tessera_own_slices_are_not_another_manager(corpus: Path) -> None:
    gpus = load_inventory(corpus / A5000)
    own = build_resource_slices("gpu-1", gpus)
    assert own and all(s["spec"]["driver"] == "gpu.tessera.dev" for s in own)
    assert slice_signs(own, discovered_uuids(gpus)) == []


# ---- device plugin sockets ----------------------------------------------------------------


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes: a short directory.
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _listen(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(1)
    return s


def test_served_nvidia_socket_is_a_sign(plugin_dir: Path) -> None:
    kubelet = _listen(plugin_dir / "kubelet.sock")
    plugin = _listen(plugin_dir / "nvidia-gpu.sock")
    other = _listen(plugin_dir / "sriov-nic.sock")
    try:
        assert socket_signs(plugin_dir) == [
            Sign(
                "device-plugin-socket",
                f"device plugin socket {plugin_dir / 'nvidia-gpu.sock'} is served",
            )
        ]
    finally:
        for s in (kubelet, plugin, other):
            s.close()


def test_leftover_socket_file_and_missing_dir_are_not(plugin_dir: Path) -> None:
    stale = _listen(plugin_dir / "nvidia-gpu.sock")
    stale.close()  # the file stays, nobody listens: a stopped plugin's leftover
    assert (plugin_dir / "nvidia-gpu.sock").exists()
    (plugin_dir / "nvidia-mig.sock").write_text("not a socket")
    assert socket_signs(plugin_dir) == []
    assert socket_signs(plugin_dir / "absent") == []


def test_refusal_is_one_line_naming_every_sign_and_the_override() -> None:
    msg = refusal(
        "gpu-1",
        [
            Sign("device-plugin", "Node gpu-1 status.allocatable nvidia.com/gpu: 8"),
            Sign("hami", "Node gpu-1 annotation hami.io/node-nvidia-register"),
        ],
    )
    assert "\n" not in msg
    assert msg.startswith(
        "node gpu-1 already has another manager of its NVIDIA GPUs: "
        "Node gpu-1 status.allocatable nvidia.com/gpu: 8; Node gpu-1 annotation hami.io/node-nvidia-register."
    )
    assert f"label it {OVERRIDE_LABEL}=true" in msg and "docs/install.md" in msg


def test_own_socket_is_not_a_sign(plugin_dir: Path) -> None:
    """The device plugin's own socket is left out; another NVIDIA plugin's still counts."""
    own = _listen(plugin_dir / "nvidia-tessera.sock")
    other = _listen(plugin_dir / "nvidia-gpu.sock")
    try:
        assert [s.detail for s in socket_signs(plugin_dir, own="nvidia-tessera.sock")] == [
            f"device plugin socket {plugin_dir / 'nvidia-gpu.sock'} is served"
        ]
    finally:
        own.close()
        other.close()


def test_the_mode_label_gives_a_node_to_one_of_tesseras_two_modes() -> None:
    """No label: the DRA node driver's; ``legacy``: the device plugin's; each one's mode sign
    names the label and how to move the node; any other value is refused naming it."""
    plain, legacy = node(), node(labels={MODE_LABEL: "legacy"})
    assert node_mode(plain) == "dra" and node_mode(None) == "dra"
    assert node_mode(legacy) == "legacy"
    assert mode_signs(plain, "dra") == [] and mode_signs(legacy, "legacy") == []
    [to_legacy] = mode_signs(legacy, "dra")
    assert to_legacy.kind == "tessera-mode"
    assert to_legacy.detail == (
        f"Node gpu-1 label {MODE_LABEL}=legacy gives its GPUs to Tessera's device plugin and "
        "scheduler extender; drain the node and set the label to dra to move it "
        "(docs/legacy.md, 'Moving a node')"
    )
    [to_dra] = mode_signs(plain, "legacy")
    assert f"{MODE_LABEL}=dra (unset) gives its GPUs to Tessera's DRA node driver" in to_dra.detail
    with pytest.raises(SecondManagerError, match=f"Node gpu-1 label {MODE_LABEL}='DRA': must be"):
        node_mode(node(labels={MODE_LABEL: "DRA"}))


class _NoDRA:
    """An API server that serves no resource.k8s.io (a cluster without DRA): the Node is read,
    the ResourceSlice list answers 404 as kube-apiserver does for an API it does not serve."""

    def __init__(self, the_node: dict[str, Any]) -> None:
        self.node = the_node

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Any:
        assert (api_version, kind, name) == ("v1", "Node", "gpu-1")
        return self.node

    def list(self, api_version: str, kind: str, *args: Any, **kwargs: Any) -> Any:
        raise ApiError(
            "list", f"{kind}s", 404, "NotFound", "the server could not find the requested resource"
        )


def test_legacy_mode_starts_where_resource_slices_are_not_served(tmp_path: Path) -> None:
    """The device plugin (mode legacy) on a node labelled legacy starts where the API server
    serves no ResourceSlices (no DRA driver can publish its GPUs there) and logs it; the DRA
    node driver (mode dra) is refused, naming the list it could not make."""
    said: list[str] = []
    client: Any = _NoDRA(node(labels={MODE_LABEL: "legacy"}))
    signs = check_node(
        client, "gpu-1", ["GPU-1"], device_plugin_dir=tmp_path, mode="legacy", log=said.append
    )
    assert signs == []
    assert said == ["resource.k8s.io/v1 is not served: no DRA driver can publish this node's GPUs"]
    dra: Any = _NoDRA(node())
    with pytest.raises(SecondManagerError, match=r"list ResourceSlices: .*404"):
        check_node(dra, "gpu-1", ["GPU-1"], device_plugin_dir=tmp_path)
