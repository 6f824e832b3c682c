"""The node driver's MIG: what prepare plans for static and dynamic MIG devices (device nodes,
MIG UUIDs, limits of the shared whole GPU), which instances are the driver's own, and the NVML
calls that make and destroy instances - over the fake NVML (``native/fake``), whose log records
every creation and destruction. Machines come from real inventories (``tests/data/mig``, the
corpus 8x H100)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tessera.driver.backend import DRIVER_NATIVE, LIBRARY
from tessera.driver.checkpoint import ClaimEntry
from tessera.driver.discovery import GpuInstance, NodeGPU
from tessera.driver.kubelet import ClaimRef
from tessera.driver.mig import (
    MigSlot,
    mig_cap_nodes,
    owned,
    read_mig_minors,
    without_owned,
)
from tessera.driver.prepare import (
    ClaimError,
    ClaimPlan,
    Layout,
    NodeDevice,
    node_devices,
    plan_claim,
)
from tessera.driver.publish import GpuRecord, desired_slices
from tessera.enforcement.limits import parse_limits
from tessera.inventory import load_inventory
from tessera.inventory.mig import DynamicMIG
from tessera.localcluster.fake_nvml import as_listed, mig_minors_text, nvml_config

REPO = Path(__file__).resolve().parents[2]
A100_PCIE_MIG = REPO / "tests" / "data" / "mig" / "a100-pcie-40gb.2g10gb-3x1g5gb.nvidia-smi-q-x.xml"
H100 = "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
NODE = "n1"
SHARE = "0b0d3b4e-9f0c-4cf5-8c8e-0123456789ab"
GIB = 1 << 30
MIB = 1 << 20
REF = ClaimRef("ns", "c", "uid-1")


def _slot_1g_at_6(uuid: str) -> MigSlot:
    """The driver's slot for a 1g.5gb instance at memory slice 6 of the A100's GPU 0."""
    return MigSlot(
        "gpu-0-mig-1g5gb-6",
        uuid,
        0,
        "1g.5gb",
        6,
        1,
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
        "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    )


def claim(*results: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def result(device: str, share: str | None = None, **capacity: str) -> dict[str, Any]:
    r: dict[str, Any] = {
        "request": "gpu",
        "driver": "gpu.tessera.dev",
        "pool": NODE,
        "device": device,
    }
    if share:
        r["shareID"] = share
    if capacity:
        r["consumedCapacity"] = capacity
    return r


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    minors = tmp_path / "mig-minors"
    minors.write_text(mig_minors_text(8))
    return Layout(
        tmp_path / "state",
        tmp_path / "cdi",
        tmp_path / "root",
        Path("/opt/tessera/libtessera-enforce.so"),
        "gpu.tessera.dev",
        cdi_hook="/usr/bin/nvidia-cdi-hook",
        mig_minors=minors,
    )


def h100_devices(
    corpus: Path, dynamic: DynamicMIG
) -> tuple[list[GpuRecord], dict[str, NodeDevice]]:
    """The 8x H100 with GPUs in MIG mode published for dynamic MIG, as the driver resolves them."""
    gpus = [
        replace(g, mig_enabled=g.index < 2) for g in load_inventory(corpus / "inventories" / H100)
    ]
    records = [GpuRecord(g, g.index) for g in gpus]
    slices = desired_slices(
        NODE, "gpu.tessera.dev", records, LIBRARY, 1, 0, 60, dynamic, "--dynamic-mig"
    )
    return records, node_devices(records, slices)


def test_mig_minors_layout_matches_nvidias_example(tmp_path: Path) -> None:
    """NVIDIA's documented sample lines of /proc/driver/nvidia-caps/mig-minors."""
    (tmp_path / "m").write_text(mig_minors_text(32))
    minors = read_mig_minors(tmp_path / "m")
    assert (
        minors["gpu0/gi0/access"],
        minors["gpu0/gi0/ci0/access"],
        minors["gpu0/gi0/ci2/access"],
    ) == (3, 4, 6)
    assert (
        minors["gpu3/gi3/ci3/access"],
        minors["gpu6/gi11/ci7/access"],
        minors["gpu31/gi14/ci7/access"],
    ) == (439, 920, 4322)
    assert mig_cap_nodes(minors, 0, 5, 0) == (
        "nvidia-caps/nvidia-cap48",
        "nvidia-caps/nvidia-cap49",
    )
    assert read_mig_minors(tmp_path / "missing") == {}


def test_static_mig_device_gets_its_nodes_and_mig_uuid(layout: Layout) -> None:
    """A 1g.5gb instance of the A100-PCIE-40GB (tests/data/mig): the parent's /dev/nvidia0, its
    GPU-instance and compute-instance capability nodes, its MIG UUID; dedicated: no limits."""
    [gpu] = [as_listed(g) for g in load_inventory(A100_PCIE_MIG)]
    records = [GpuRecord(gpu, 0)]
    devices = node_devices(
        records, desired_slices(NODE, "gpu.tessera.dev", records, LIBRARY, 1, 0, 60)
    )
    assert sorted(devices) == ["gpu-0-mig-13-0", "gpu-0-mig-5-0", "gpu-0-mig-7-0", "gpu-0-mig-8-0"]
    mig = next(m for m in gpu.mig_devices if m.gpu_instance_id == 13)
    minors = read_mig_minors(layout.mig_minors)
    plan = plan_claim(
        claim(result("gpu-0-mig-13-0")), REF, NODE, devices, LIBRARY, layout, mig_minors=minors
    )
    assert not plan.pending and plan.limits_text is None and plan.mig == ()
    [dev] = plan.cdi_spec["devices"]
    root = layout.dev_root / "dev"
    gi_minor, ci_minor = 3 + 13 * 9, 3 + 13 * 9 + 1
    assert dev["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": str(root / "nvidia0")},
        {
            "path": f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
            "hostPath": str(root / f"nvidia-caps/nvidia-cap{gi_minor}"),
        },
        {
            "path": f"/dev/nvidia-caps/nvidia-cap{ci_minor}",
            "hostPath": str(root / f"nvidia-caps/nvidia-cap{ci_minor}"),
        },
    ]
    assert plan.cdi_spec["containerEdits"]["env"] == [
        f"NVIDIA_VISIBLE_DEVICES={mig.uuid}",
        f"CUDA_VISIBLE_DEVICES={mig.uuid}",
    ]
    assert plan.status[0]["data"] == {
        "enforcementBackend": "none",
        "uuid": mig.uuid,
        "parentUUID": gpu.uuid,
    }
    # Without the driver's capability list the claim cannot be handed its device.
    with pytest.raises(
        ClaimError,
        match=r"results\[0\].device: gpu-0-mig-13-0: .*mig-minors has no gpu0/gi13/access",
    ):
        plan_claim(
            claim(result("gpu-0-mig-13-0")), REF, NODE, devices, LIBRARY, layout, mig_minors={}
        )


def test_dynamic_placement_is_pending_until_its_instance_is_made(
    corpus: Path, layout: Layout
) -> None:
    _records, devices = h100_devices(corpus, DynamicMIG(gpus=(0, 1)))
    minors = read_mig_minors(layout.mig_minors)
    c = claim(result("gpu-1-mig-1g10gb-6"))
    plan = plan_claim(c, REF, NODE, devices, LIBRARY, layout, mig_minors=minors)
    assert (
        plan.pending
        and plan.cdi_spec == {}
        and [d.device for d in plan.devices] == ["gpu-1-mig-1g10gb-6"]
    )
    [slot] = plan.mig
    uuid1 = devices["gpu-1"].record.gpu.uuid
    assert (
        slot.gpu_uuid,
        slot.gpu_index,
        slot.profile,
        slot.start,
        slot.size,
        slot.gi_profile,
        slot.ci_profile,
        slot.shared,
    ) == (
        uuid1,
        1,
        "1g.10gb",
        6,
        1,
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
        "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
        False,
    )
    made = replace(
        slot, profile_id=19, gi=11, ci=0, uuid="MIG-11111111-2222-3333-4444-555555555555"
    )
    final = plan_claim(
        c, REF, NODE, devices, LIBRARY, layout, mig_minors=minors, instances={made.key: made}
    )
    assert not final.pending and final.mig == (made,)
    caps = [n["path"] for n in final.cdi_spec["devices"][0]["containerEdits"]["deviceNodes"]]
    base = 3 + 1 * 135 + 11 * 9
    assert caps == [
        "/dev/nvidia1",
        f"/dev/nvidia-caps/nvidia-cap{base}",
        f"/dev/nvidia-caps/nvidia-cap{base + 1}",
    ]
    assert final.cdi_spec["containerEdits"]["env"][0] == f"NVIDIA_VISIBLE_DEVICES={made.uuid}"
    # The plan's record round-trips with its instance (the checkpoint keeps it).
    assert ClaimPlan.from_json(json.loads(json.dumps(final.to_json()))) == final
    assert ClaimEntry.prepared(final).mig_slots == [made]
    assert ClaimEntry.from_json(ClaimEntry.prepared(final).to_json()).mig_slots == [made]


def test_shares_of_the_whole_dynamic_gpu_are_limited_under_its_mig_uuid(
    corpus: Path, layout: Layout
) -> None:
    """The whole dynamic H100 (7g.80gb, 81152 MiB) shared: one instance for every claim; this
    claim's 8 GiB / 20 cores are written under that instance's MIG UUID; NVIDIA's per-cgroup
    limits do not cover MIG devices, so driver-native falls back to the library."""
    _records, devices = h100_devices(corpus, DynamicMIG(gpus=(0,)))
    minors = read_mig_minors(layout.mig_minors)
    c = claim(result("gpu-0", SHARE, memory="8Gi", cores="20"))
    plan = plan_claim(c, REF, NODE, devices, DRIVER_NATIVE, layout, mig_minors=minors)
    [slot] = plan.mig
    assert (slot.profile, slot.start, slot.size, slot.shared, slot.gi_profile) == (
        "7g.80gb",
        0,
        8,
        True,
        "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
    )
    made = replace(slot, profile_id=0, gi=1, ci=0, uuid="MIG-aaaaaaaa-2222-3333-4444-555555555555")
    final = plan_claim(
        c, REF, NODE, devices, DRIVER_NATIVE, layout, mig_minors=minors, instances={made.key: made}
    )
    assert [(g.uuid, g.memory, g.cores) for g in parse_limits(final.limits_text or "").gpus] == [
        (made.uuid, 8 * GIB, 20)
    ]
    assert final.region_gpus == ((made.uuid, 8 * GIB, 20),)
    assert final.backend == LIBRARY and "hooks" not in final.cdi_spec["containerEdits"]
    with pytest.raises(
        ClaimError,
        match=rf"consumedCapacity.memory: 80Gi is outside 1..{81152 * MIB} bytes, the memory of MIG device gpu-0",
    ):
        plan_claim(
            claim(result("gpu-0", SHARE, memory="80Gi", cores="20")),
            REF,
            NODE,
            devices,
            LIBRARY,
            layout,
        )


def test_own_instances_are_the_placements_the_checkpoint_names() -> None:
    """Only a GPU instance at a placement a checkpoint entry names (GPU, profile id, start,
    size) is the driver's; an instance elsewhere, or of another profile there, is someone
    else's and stays published."""
    from tessera.inventory import GPU
    from tessera.inventory.model import MigDevice

    slot = MigSlot(
        "gpu-0-mig-1g10gb-6",
        "GPU-a",
        0,
        "1g.10gb",
        6,
        1,
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE",
        "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
        profile_id=19,
    )
    mine = owned([ClaimEntry.preparing(ClaimRef("ns", "c", "u"), [slot], 0.0)])
    assert mine == {"GPU-a": {(19, 6, 1)}}
    migs = (
        MigDevice(0, "MIG-x", "1g.10gb", 9984 * MIB, 16, 3, 0),
        MigDevice(1, "MIG-y", "1g.10gb", 9984 * MIB, 16, 4, 0),
        MigDevice(2, "MIG-z", "1g.10gb+me", 9984 * MIB, 16, 5, 0),
    )
    gpu = GPU(
        0,
        "GPU-a",
        "NVIDIA H100 80GB HBM3",
        None,
        "9.0",
        None,
        None,
        None,
        None,
        80 * GIB,
        True,
        migs,
    )
    ng = NodeGPU(
        gpu, 0, (), (GpuInstance(3, 19, 6, 1), GpuInstance(4, 19, 5, 1), GpuInstance(5, 20, 4, 1))
    )
    assert [m.gpu_instance_id for m in without_owned(ng, mine).gpu.mig_devices] == [4, 5]


#: Runs in a child (NVML stays loaded in a process): the driver's NVML operations on the fake.
#: A step's ``slot`` is a slot's JSON, or the name of an earlier step whose result slot it takes
#: (``clear``: those of its ids set to null first). ``realise`` gives the slot, the records it
#: asked for (one per creation step) and its notes; ``destroy`` gives (destroyed, the GPU
#: instance id left alone).
OPS = """
import json, sys
from dataclasses import asdict
from tessera.driver.discovery import load_nvml
from tessera.driver.mig import MigOps, MigSlot, MigError
ops = MigOps(load_nvml(sys.argv[1]))
out = {}
for step in json.loads(sys.argv[2]):
    raw = step["slot"]
    raw = dict(out[raw]["slot"]) if isinstance(raw, str) else raw
    raw.update({k: None for k in step.get("clear", [])})
    s = MigSlot.from_json(raw)
    try:
        if step["op"] == "realise":
            recs, notes = [], []
            m = ops.realise(s, lambda x: recs.append(x.to_json()), notes.append)
            out[step["name"]] = {"slot": m.to_json(), "records": recs, "notes": notes}
        elif step["op"] == "destroy":
            done, left = ops.destroy(s)
            out[step["name"]] = [done, None if left is None else left.id]
        elif step["op"] == "occupied":
            out[step["name"]] = [asdict(g) for g in ops.occupied(ops.resolve(s))]
    except MigError as e:
        out[step["name"]] = "error: " + str(e)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.fail("needs make and gcc to build the fake NVML")
    b = tmp_path_factory.mktemp("fake-nvml")
    r = subprocess.run(
        ["make", "-C", str(REPO / "native"), f"BUILD={b}", "fake"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return b / "fake" / "libnvidia-ml.so.1"


def _ops(nvml_lib: Path, cfg: Path, steps: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
    r = subprocess.run(
        [sys.executable, "-c", OPS, str(nvml_lib), json.dumps(steps)],
        capture_output=True,
        text=True,
        env={**os.environ, "FAKE_NVML_CONFIG": str(cfg)},
        timeout=60,
    )
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else {"stderr": r.stderr})


def _state_lines(state: Path, uuid: str) -> list[str]:
    return sorted(
        ln
        for ln in state.read_text().splitlines()
        if ln.split()[:2] in (["gi", uuid], ["ci", uuid])
    )


def test_instances_are_made_and_destroyed_exactly_and_others_are_left(
    nvml_lib: Path, tmp_path: Path
) -> None:
    """On the A100-PCIE-40GB (2g.10gb + three 1g.5gb that someone else made, tests/data/mig):
    the driver's 1g.5gb at slice 6 is one GPU instance and one compute instance, each recorded
    right after it is made; a second call with that record finds it instead of making another;
    a slot without the record finds it someone else's and is refused (nothing made or
    destroyed); a placement over someone else's instance is refused by NVML; destroy takes only
    the recorded instance; the other instances are never touched."""
    [gpu] = load_inventory(A100_PCIE_MIG)
    state, log = tmp_path / "mig-state", tmp_path / "mig-log"
    cfg = tmp_path / "nvml.cfg"
    cfg.write_text(nvml_config([gpu], mig_state=state, mig_log=log))
    before = sorted((m.gpu_instance_id, m.compute_instance_id) for m in gpu.mig_devices)
    free = _slot_1g_at_6(gpu.uuid)
    taken = replace(free, start=0, device="gpu-0-mig-1g5gb-0")  # the 2g.10gb is at slices 0-1
    rc, out = _ops(
        nvml_lib,
        cfg,
        [
            {"name": "made", "op": "realise", "slot": free.to_json()},
            {"name": "again", "op": "realise", "slot": "made"},
            {"name": "stranger", "op": "realise", "slot": free.to_json()},
            {"name": "not-mine", "op": "destroy", "slot": free.to_json()},
            {"name": "taken", "op": "realise", "slot": taken.to_json()},
            {"name": "occupied", "op": "occupied", "slot": taken.to_json()},
        ],
    )
    assert rc == 0, out
    made = MigSlot.from_json(out["made"]["slot"])
    assert (
        (made.profile_id, made.gi, made.ci) == (19, 1, 0)
        and made.uuid
        and made.uuid.startswith("MIG-")
    )
    # One record per creation step: the GPU instance's id, then the compute instance's.
    assert out["made"]["records"] == [
        replace(made, ci=None, uuid=None).to_json(),
        made.to_json(),
    ]
    assert out["again"] == {"slot": out["made"]["slot"], "records": [], "notes": []}
    assert out["stranger"] == (
        f"error: gpu-0-mig-1g5gb-6: GPU 0 ({gpu.uuid}) 1g.5gb at memory slices 6-6 is held by GPU "
        "instance 1 (compute instance 0), which the checkpoint does not record as this claim's "
        "(made by someone else, or by a driver killed before it recorded it); it is left alone: "
        "destroy it (nvidia-smi mig -i 0 -gi 1 -ci 0 -dci; nvidia-smi mig -i 0 -gi 1 -dgi) or "
        "free the placement, and the next prepare makes the claim's own"
    )
    assert out["not-mine"] == [False, 1]
    assert (
        out["taken"]
        == f"error: GPU 0 ({gpu.uuid}) 1g.5gb at memory slice 0: Insufficient resources"
    )
    assert [(g["id"], g["start"], g["size"]) for g in out["occupied"]] == [(5, 0, 2)]
    lines = [ln.rsplit(" pid=", 1)[0] for ln in log.read_text().splitlines()]
    assert lines == [
        f"create-gi {gpu.uuid} gi=1 profile=19 start=6 size=1",
        f"create-ci {gpu.uuid} gi=1 ci=0 profile=0 uuid={made.uuid}",
    ]
    rc, out = _ops(
        nvml_lib,
        cfg,
        [
            {"name": "gone", "op": "destroy", "slot": made.to_json()},
            {"name": "twice", "op": "destroy", "slot": made.to_json()},
        ],
    )
    assert rc == 0 and out == {"gone": [True, None], "twice": [False, None]}
    lines = [ln.rsplit(" pid=", 1)[0] for ln in log.read_text().splitlines()]
    assert lines[2:] == [f"destroy-ci {gpu.uuid} gi=1 ci=0", f"destroy-gi {gpu.uuid} gi=1"]
    left = sorted(
        (int(ln.split()[2]), int(ln.split()[3]))
        for ln in state.read_text().splitlines()
        if ln.startswith("ci ")
    )
    assert left == before


def test_an_unrecorded_compute_instance_in_the_recorded_gpu_instance_is_made_again(
    nvml_lib: Path, tmp_path: Path
) -> None:
    """The kill between creating the compute instance and recording it: the slot records the
    GPU instance's id but no compute instance. The compute instance found in that GPU instance
    is destroyed and made again (recorded once); the GPU instance is kept. A slot recording a
    GPU instance id other than the one at the placement (an operator destroyed the driver's and
    made their own there), or the recorded GPU-instance id with a compute instance whose MIG UUID
    is not the recorded one, is refused, and destroy leaves that instance alone."""
    [gpu] = load_inventory(A100_PCIE_MIG)
    state, log = tmp_path / "mig-state", tmp_path / "mig-log"
    cfg = tmp_path / "nvml.cfg"
    cfg.write_text(nvml_config([gpu], mig_state=state, mig_log=log))
    slot = _slot_1g_at_6(gpu.uuid)
    rc, out = _ops(
        nvml_lib,
        cfg,
        [
            {"name": "made", "op": "realise", "slot": slot.to_json()},
            {"name": "again", "op": "realise", "slot": "made", "clear": ["ci", "uuid"]},
        ],
    )
    assert rc == 0, out
    first, again = (MigSlot.from_json(out[k]["slot"]) for k in ("made", "again"))
    assert (again.gi, again.ci) == (1, 0) and again.uuid != first.uuid
    assert out["again"]["records"] == [again.to_json()]
    assert out["again"]["notes"] == [
        f"GPU 0 ({gpu.uuid}) 1g.5gb at memory slice 6: destroyed compute instance 0 "
        f"({first.uuid}) of the claim's GPU instance 1, which the checkpoint did not record "
        "(made by a driver killed before it recorded it)"
    ]
    lines = [ln.rsplit(" pid=", 1)[0].split(" uuid=")[0] for ln in log.read_text().splitlines()]
    assert lines[2:] == [
        f"destroy-ci {gpu.uuid} gi=1 ci=0",
        f"create-ci {gpu.uuid} gi=1 ci=0 profile=0",
    ]
    # Someone else's GPU instance 1 at the placement now, where the slot records GPU instance
    # 4; or GPU instance 1 with a compute instance whose MIG UUID is not the recorded one (the
    # driver's instance was destroyed and someone made one with the same ids).
    mine = _state_lines(state, gpu.uuid)
    other_gi = {**again.to_json(), "gi": 4}
    other_uuid = {**again.to_json(), "uuid": first.uuid}
    rc, out = _ops(
        nvml_lib,
        cfg,
        [
            {"name": "realise", "op": "realise", "slot": other_gi},
            {"name": "destroy", "op": "destroy", "slot": other_gi},
            {"name": "realise-uuid", "op": "realise", "slot": other_uuid},
            {"name": "destroy-uuid", "op": "destroy", "slot": other_uuid},
        ],
    )
    assert rc == 0, out
    for k in ("realise", "realise-uuid"):
        assert str(out[k]).startswith(
            f"error: gpu-0-mig-1g5gb-6: GPU 0 ({gpu.uuid}) 1g.5gb at memory slices 6-6 is held "
            "by GPU instance 1 (compute instance 0), which the checkpoint does not record"
        )
    assert out["destroy"] == out["destroy-uuid"] == [False, 1]
    assert len(log.read_text().splitlines()) == 4 and _state_lines(state, gpu.uuid) == mine


def test_fake_nvml_kills_the_process_at_the_configured_point(
    nvml_lib: Path, tmp_path: Path
) -> None:
    """``mig-crash-after create-gi``: the caller dies by SIGKILL right after the GPU instance
    exists (in the state file and the log), before it can make the compute instance."""
    [gpu] = load_inventory(A100_PCIE_MIG)
    state, log = tmp_path / "mig-state", tmp_path / "mig-log"
    cfg = tmp_path / "nvml.cfg"
    cfg.write_text(nvml_config([gpu], mig_state=state, mig_log=log, crash_after=("create-gi", 1)))
    slot = _slot_1g_at_6(gpu.uuid)
    rc, _ = _ops(nvml_lib, cfg, [{"name": "made", "op": "realise", "slot": slot.to_json()}])
    assert rc == -9  # before the record of the GPU instance could be asked for
    assert [ln.split()[0] for ln in log.read_text().splitlines()] == ["create-gi"]
    assert f"gi {gpu.uuid} 1 profile=19 start=6 size=1" in state.read_text()
