"""Legacy mode's device plugin without a kubelet: which pod and container entry an ``Allocate``
serves, its errors, the files it plans (through the node driver's ``plan_claim``) and the
register annotation read back by Tessera's HAMi inventory reader. GPUs: the 8x H100 80GB HBM3
of a corpus inventory; pods: HAMi's own example manifests."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.convert.hami import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    ContainerDevice,
    decode_pod_devices,
    encode_pod_devices,
)
from tessera.deviceplugin.allocate import (
    AllocateError,
    allocation_uid,
    choose_pod,
    claim_meta,
    claim_meta_path,
    lock_holder,
    next_entry,
    node_devices,
    plan_allocation,
    pod_of_uid,
)
from tessera.deviceplugin.register import register_value, slots
from tessera.driver.backend import LIBRARY
from tessera.driver.prepare import Layout, NodeDevice, materialize
from tessera.driver.publish import GpuRecord
from tessera.enforcement.limits import parse_limits
from tessera.inventory import load_inventory
from tessera.inventory.hami import raw_gpus_from_hami
from tessera.monitor.regions import parse_claim_json

pytestmark = pytest.mark.legacy

NODE = "n1"
MIB = 1 << 20
H100 = "inventories/gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"


@pytest.fixture
def records(corpus: Path) -> list[GpuRecord]:
    return [GpuRecord(g, g.index) for g in load_inventory(corpus / H100)]


@pytest.fixture
def devices(records: list[GpuRecord]) -> dict[str, NodeDevice]:
    """The node's GPUs as the plugin hands them to prepare (one per whole GPU)."""
    return node_devices(NODE, "gpu.tessera.dev", records)


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(
        tmp_path / "state",
        tmp_path / "cdi",
        tmp_path / "root",
        Path("/opt/tessera/libtessera-enforce.so"),
        "gpu.tessera.dev",
    )


def hami_pod(
    corpus: Path,
    example: str,
    entries: list[list[ContainerDevice]],
    *,
    name: str = "gpu-pod",
    bind_time: int = 1000,
    phase: str = "allocating",
    node: str = NODE,
) -> dict[str, Any]:
    """A corpus HAMi pod as the API server returns it after the extender's bind."""
    pod = yaml.safe_load((corpus / "hami-pods" / example).read_text())
    pod = copy.deepcopy(pod)
    meta = pod["metadata"]
    meta.update(
        name=name,
        namespace="ns",
        uid=f"0000-{name}",
        resourceVersion="7",
        annotations={
            VGPU_NODE: node,
            DEVICES_TO_ALLOCATE: encode_pod_devices(entries),
            BIND_PHASE: phase,
            BIND_TIME: str(bind_time),
        },
    )
    pod["spec"]["nodeName"] = NODE
    pod["status"] = {"phase": "Pending"}
    return pod


def test_the_oldest_allocating_pod_of_this_node_is_chosen(
    corpus: Path, records: list[GpuRecord]
) -> None:
    gpu = records[3].gpu.uuid
    entry = [[ContainerDevice(gpu, "NVIDIA", 3000, 30)]]
    pods = [
        hami_pod(
            corpus, "HAMi__examples_nvidia__default_use.yaml", entry, name="new", bind_time=20
        ),
        hami_pod(
            corpus, "HAMi__examples_nvidia__default_use.yaml", entry, name="old", bind_time=10
        ),
        # older, but not this plugin's to serve
        hami_pod(
            corpus,
            "HAMi__examples_nvidia__default_use.yaml",
            entry,
            name="done",
            bind_time=1,
            phase="success",
        ),
        hami_pod(
            corpus,
            "HAMi__examples_nvidia__default_use.yaml",
            entry,
            name="other",
            bind_time=2,
            node="n2",
        ),
        hami_pod(
            corpus, "HAMi__examples_nvidia__default_use.yaml", [[]], name="empty", bind_time=3
        ),
    ]
    assert choose_pod(pods, NODE)["metadata"]["name"] == "old"
    with pytest.raises(
        AllocateError, match=r"node n1: no Pending pod .*hami.io/bind-phase=allocating"
    ):
        choose_pod(pods[2:], NODE)


def test_the_first_non_empty_container_entry_is_taken_and_erased(
    corpus: Path, records: list[GpuRecord]
) -> None:
    a, b = records[0].gpu.uuid, records[1].gpu.uuid
    entries = [
        [],
        [ContainerDevice(a, "NVIDIA", 3000, 30)],
        [ContainerDevice(b, "NVIDIA", 2000, 0)],
    ]
    pod = hami_pod(corpus, "HAMi__examples_nvidia__default_use.yaml", entries)
    pod["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
    pod["spec"]["containers"].append({"name": "second", "image": "busybox"})
    first = next_entry(pod, 1)
    assert (first.index, first.container, first.devices) == (
        1,
        "ubuntu-container",
        (entries[1][0],),
    )
    assert decode_pod_devices(first.remaining) == [[], [], entries[2]]
    assert not first.done
    pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE] = first.remaining
    second = next_entry(pod, 1)
    assert (second.index, second.container, second.done) == (2, "second", True)
    assert second.remaining == ";;;"
    assert pod_of_uid(second.uid) == "0000-gpu-pod" and second.uid == allocation_uid(
        "0000-gpu-pod", 2
    )
    pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE] = second.remaining
    with pytest.raises(AllocateError, match=r"pod ns/gpu-pod: .* no container entry left"):
        next_entry(pod, 1)


def test_a_device_count_other_than_the_kubelets_is_refused(
    corpus: Path, records: list[GpuRecord]
) -> None:
    two = [ContainerDevice(r.gpu.uuid, "NVIDIA", 3000, 30) for r in records[:2]]
    pod = hami_pod(corpus, "HAMi__examples_nvidia__default_use.yaml", [two])
    with pytest.raises(
        AllocateError,
        match=r"pod ns/gpu-pod: .*container entry 0 has 2 device\(s\) but the kubelet asks for 1 "
        r".*device number not matched",
    ):
        next_entry(pod, 1)
    pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE] = "GPU-x,NVIDIA,lots,30:;"
    with pytest.raises(
        AllocateError, match=r"pod ns/gpu-pod: hami\.io/vgpu-devices-to-allocate: container entry 0"
    ):
        next_entry(pod, 1)


def test_a_share_gets_the_dra_share_files(
    corpus: Path, records: list[GpuRecord], devices: dict[str, NodeDevice], layout: Layout
) -> None:
    gpu = records[5].gpu
    pod = hami_pod(
        corpus,
        "HAMi__examples_nvidia__default_use.yaml",
        [[ContainerDevice(gpu.uuid, "NVIDIA", 3000, 30)]],
    )
    plan = plan_allocation(next_entry(pod, 1), NODE, devices, LIBRARY, layout)
    assert plan.ref.uid == "0000-gpu-pod-0"
    assert plan.limits_text is not None
    [limit] = parse_limits(plan.limits_text).gpus
    assert (limit.uuid, limit.memory, limit.cores) == (gpu.uuid, 3000 * MIB, 30)
    assert plan.region_gpus == ((gpu.uuid, 3000 * MIB, 30),)
    assert [d.device for d in plan.devices] == ["gpu-5"]
    [cdi_id] = [i for d in plan.devices for i in d.cdi_device_ids]
    assert cdi_id == "gpu.tessera.dev/claim=0000-gpu-pod-0-0-gpu-5"
    mounts = {m["containerPath"]: m["hostPath"] for m in plan.cdi_spec["containerEdits"]["mounts"]}
    assert mounts["/etc/tessera/limits"] == str(layout.claim_dir(plan.ref.uid) / "limits")
    assert mounts["/etc/ld.so.preload"] == str(layout.preload_file)
    materialize(plan, layout)
    assert (layout.claim_dir(plan.ref.uid) / "limits").read_text() == plan.limits_text
    assert layout.cdi_path(plan.ref.uid).is_file()


def test_the_monitor_reads_who_uses_a_share(
    corpus: Path, records: list[GpuRecord], devices: dict[str, NodeDevice], layout: Layout
) -> None:
    """No ResourceClaim names a legacy share's pod: claim.json does, in the monitor's form."""
    gpu = records[5].gpu
    pod = hami_pod(
        corpus,
        "HAMi__examples_nvidia__default_use.yaml",
        [[ContainerDevice(gpu.uuid, "NVIDIA", 3000, 30)]],
    )
    pending = next_entry(pod, 1)
    plan = plan_allocation(pending, NODE, devices, LIBRARY, layout)
    doc = claim_meta(pending, plan, NODE, devices, layout)
    assert doc is not None
    meta = parse_claim_json(json.dumps(doc), claim_meta_path(plan, layout), "")
    [ref] = meta.pods
    assert (meta.uid, meta.namespace, meta.name) == (plan.ref.uid, "ns", "gpu-pod")
    assert (ref.namespace, ref.name, ref.uid, ref.containers) == (
        "ns",
        "gpu-pod",
        "0000-gpu-pod",
        ("ubuntu-container",),
    )
    assert dict(meta.devices) == {gpu.uuid.lower(): "gpu-5"}
    assert claim_meta_path(plan, layout) == str(layout.claim_dir(plan.ref.uid) / "claim.json")
    full = (gpu.usable_memory_bytes or 0) // MIB
    whole = next_entry(
        hami_pod(
            corpus,
            "HAMi__examples_nvidia__use_exclusive_card.yaml",
            [[ContainerDevice(gpu.uuid, "NVIDIA", full, 100)]],
        ),
        1,
    )
    whole_plan = plan_allocation(whole, NODE, devices, LIBRARY, layout)
    assert claim_meta(whole, whole_plan, NODE, devices, layout) is None  # no claim directory


def test_a_whole_gpu_gets_no_limits_and_bad_entries_name_the_pod(
    corpus: Path, records: list[GpuRecord], devices: dict[str, NodeDevice], layout: Layout
) -> None:
    gpu = records[0].gpu
    full = (gpu.usable_memory_bytes or 0) // MIB
    whole = hami_pod(
        corpus,
        "HAMi__examples_nvidia__use_exclusive_card.yaml",
        [[ContainerDevice(gpu.uuid, "NVIDIA", full, 100)]],
    )
    plan = plan_allocation(next_entry(whole, 1), NODE, devices, LIBRARY, layout)
    assert plan.limits_text is None
    assert f"NVIDIA_VISIBLE_DEVICES={gpu.uuid}" in plan.cdi_spec["containerEdits"]["env"]
    too_much = hami_pod(
        corpus,
        "HAMi__examples_nvidia__default_use.yaml",
        [[ContainerDevice(gpu.uuid, "NVIDIA", full + 1, 30)]],
    )
    with pytest.raises(
        AllocateError,
        match=rf"pod ns/gpu-pod: .*entry 0 cannot be prepared .*consumedCapacity.memory.*outside 1\.\.{full * MIB}",
    ):
        plan_allocation(next_entry(too_much, 1), NODE, devices, LIBRARY, layout)
    stranger = hami_pod(
        corpus,
        "HAMi__examples_nvidia__default_use.yaml",
        [[ContainerDevice("GPU-00000000-0000-0000-0000-000000000000", "NVIDIA", 3000, 30)]],
    )
    with pytest.raises(
        AllocateError,
        match="names GPU GPU-00000000-0000-0000-0000-000000000000, which is not a GPU of node n1",
    ):
        plan_allocation(next_entry(stranger, 1), NODE, devices, LIBRARY, layout)


def test_the_register_annotation_reads_back_as_the_gpus(records: list[GpuRecord]) -> None:
    gpus = [r.gpu for r in records]
    health = {gpus[2].uuid: False}
    raws = raw_gpus_from_hami(register_value(gpus, health, 10), "node n1")
    assert [(r.index, r.uuid, r.product_name, r.memory) for r in raws] == [
        (g.index, g.uuid, g.product_name, str((g.usable_memory_bytes or 0) // MIB)) for g in gpus
    ]
    ids = slots(gpus, health, 10)
    assert len(ids) == 80 and len({s.id for s in ids}) == 80
    assert ids[21].id == f"{gpus[2].uuid}-1" and not ids[21].healthy and ids[0].healthy


def test_the_node_lock_names_its_pod() -> None:
    # the format of ../shared/reference/hami.md §1.5: "<RFC3339 time>,<namespace>,<pod>"
    assert lock_holder("2026-12-04T01:43:25Z,ns,gpu-pod") == ("ns", "gpu-pod")
    assert lock_holder("2026-12-04T01:43:25Z") is None
    assert lock_holder(None) is None
