"""What NodePrepareResources computes for a claim (``tessera.driver.prepare.plan_claim``), on the
GPUs of a real inventory (8x H100 80GB HBM3), and the driver's checkpoint and proto build step."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tessera.driver.backend import DRIVER_NATIVE, LIBRARY, BackendChoice, detect
from tessera.driver.checkpoint import Checkpoint, CheckpointError, ClaimEntry, ClaimState
from tessera.driver.kubelet import ClaimRef
from tessera.driver.prepare import (
    ClaimError,
    ClaimPlan,
    Layout,
    NodeDevice,
    materialize,
    node_devices,
    plan_claim,
    plan_stale,
    remove_files,
    write_node_shares,
)
from tessera.driver.protos import kubelet_version
from tessera.driver.publish import GpuRecord, desired_slices
from tessera.enforcement.limits import parse_limits
from tessera.inventory import load_inventory

NODE = "n1"
SHARE = "0b0d3b4e-9f0c-4cf5-8c8e-0123456789ab"
GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture
def devices(corpus: Path) -> dict[str, NodeDevice]:
    """The published devices of the 8x H100 node, as the driver resolves them."""
    gpus = load_inventory(
        corpus
        / "inventories"
        / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
    )
    records = [GpuRecord(g, g.index) for g in gpus]
    return node_devices(
        records, desired_slices(NODE, "gpu.tessera.dev", records, LIBRARY, 1, 0, 60)
    )


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(
        tmp_path / "state",
        tmp_path / "cdi",
        tmp_path / "root",
        Path("/opt/tessera/libtessera-enforce.so"),
        "gpu.tessera.dev",
        cdi_hook="/usr/bin/nvidia-cdi-hook",
    )


def claim(*results: dict[str, Any], uid: str = "uid-1") -> dict[str, Any]:
    return {
        "metadata": {"name": "c", "namespace": "ns", "uid": uid},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def share(
    device: str, memory: str | None, cores: str | None, request: str = "gpu", share_id: str = SHARE
) -> dict[str, Any]:
    r: dict[str, Any] = {
        "request": request,
        "driver": "gpu.tessera.dev",
        "pool": NODE,
        "device": device,
        "shareID": share_id,
    }
    cap = {}
    if memory is not None:
        cap["memory"] = memory
    if cores is not None:
        cap["cores"] = cores
    r["consumedCapacity"] = cap
    return r


REF = ClaimRef("ns", "c", "uid-1")


def test_a_share_gets_exact_limits(devices: dict[str, NodeDevice], layout: Layout) -> None:
    plan = plan_claim(claim(share("gpu-3", "8Gi", "20")), REF, NODE, devices, LIBRARY, layout)
    uuid = devices["gpu-3"].record.gpu.uuid
    assert plan.limits_text == (
        f"version 1\nclaim ns/c uid-1\nregion /run/tessera/region\ncontext-overhead {512 * MIB}\n"
        "shares /run/tessera/shares\n"
        f"gpu {uuid} memory {8 * GIB} cores 20\n"
    )
    assert plan.region_gpus == ((uuid, 8 * GIB, 20),)
    [dev] = plan.devices
    assert (dev.request_names, dev.pool, dev.device, dev.share_id) == (
        ("gpu",),
        NODE,
        "gpu-3",
        SHARE,
    )
    assert dev.cdi_device_ids == ("gpu.tessera.dev/claim=uid-1-0-gpu-3",)
    assert plan.cdi_spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia3", "hostPath": str(layout.dev_root / "dev" / "nvidia3")}
    ]
    assert plan.status[0]["data"] == {
        "enforcementBackend": LIBRARY,
        "uuid": uuid,
        "memory": str(8 * GIB),
        "cores": 20,
        "limitsFile": "/etc/tessera/limits",
    }


def test_subrequest_names_are_stripped_and_two_gpus_are_listed_in_order(
    devices: dict[str, NodeDevice], layout: Layout
) -> None:
    plan = plan_claim(
        claim(share("gpu-1", "4Gi", "0", "big/small"), share("gpu-0", "2Gi", "50", "other")),
        REF,
        NODE,
        devices,
        LIBRARY,
        layout,
    )
    assert [d.request_names for d in plan.devices] == [("big",), ("other",)]
    u1, u0 = devices["gpu-1"].record.gpu.uuid, devices["gpu-0"].record.gpu.uuid
    assert [(g.uuid, g.memory, g.cores) for g in parse_limits(plan.limits_text or "").gpus] == [
        (u1, 4 * GIB, 0),
        (u0, 2 * GIB, 50),
    ]
    assert plan.cdi_spec["containerEdits"]["env"][:2] == [
        f"NVIDIA_VISIBLE_DEVICES={u1},{u0}",
        f"CUDA_VISIBLE_DEVICES={u1},{u0}",
    ]


def test_whole_gpu_and_admin_access_have_no_limits(
    devices: dict[str, NodeDevice], layout: Layout
) -> None:
    full = devices["gpu-0"].record.gpu.usable_memory_bytes
    whole = plan_claim(claim(share("gpu-0", str(full), "0")), REF, NODE, devices, LIBRARY, layout)
    assert (
        whole.limits_text is None
        and whole.backend == "none"
        and "mounts" not in whole.cdi_spec["containerEdits"]
    )
    admin = {**share("gpu-0", "1Gi", "10"), "adminAccess": True}
    plan = plan_claim(claim(admin), REF, NODE, devices, LIBRARY, layout)
    assert plan.limits_text is None and plan.status[0]["data"]["enforcementBackend"] == "none"


def test_whole_and_admin_devices_beside_a_share_are_listed_unlimited(
    devices: dict[str, NodeDevice], layout: Layout
) -> None:
    """The library refuses a visible GPU in no line of the limits file (a second claim's), so
    the claim's own whole and adminAccess devices are written as ``unlimited`` lines."""
    full = devices["gpu-2"].record.gpu.usable_memory_bytes
    dedicated = share("gpu-5", str(full), "0", "ded")
    plan = plan_claim(
        claim(
            share("gpu-1", "4Gi", "30"),
            share("gpu-2", str(full), "100", "whole"),
            {**share("gpu-4", "1Gi", "10", "admin"), "adminAccess": True},
            dedicated,
        ),
        REF,
        NODE,
        devices,
        LIBRARY,
        layout,
    )
    u = {n: devices[f"gpu-{n}"].record.gpu.uuid for n in (1, 2, 4, 5)}
    # 'unlimited' lines are version 2's (a share alone stays version 1, test above)
    assert plan.limits_text == (
        f"version 2\nclaim ns/c uid-1\nregion /run/tessera/region\ncontext-overhead {512 * MIB}\n"
        "shares /run/tessera/shares\n"
        f"gpu {u[1]} memory {4 * GIB} cores 30\n"
        f"unlimited {u[2]}\nunlimited {u[4]}\nunlimited {u[5]}\n"
    )
    assert parse_limits(plan.limits_text).unlimited == (u[2], u[4], u[5])
    assert plan.region_gpus == ((u[1], 4 * GIB, 30),)


@pytest.mark.parametrize(
    "result,message",
    [
        (
            {**share("gpu-0", "1Gi", "1"), "pool": "other-node"},
            "allocated to pool(s) other-node, not to this node 'n1'",
        ),
        (
            {**share("gpu-0", "1Gi", "1"), "driver": "nic.example.com"},
            "has no result of driver gpu.tessera.dev (drivers: nic.example.com)",
        ),
        (share("gpu-9", "1Gi", "1"), "'gpu-9' is not a device of node n1"),
        (
            share("gpu-0", "81Gi", "1"),
            "consumedCapacity.memory: 81Gi is outside 1..84943044608 bytes",
        ),
        (share("gpu-0", "1Gi", "101"), "consumedCapacity.cores: 101 is above 100"),
        (share("gpu-0", "1.5", "1"), "is not a whole, non-negative number"),
        (
            {
                **share("gpu-0", "1Gi", "1"),
                "consumedCapacity": {"memory": "1Gi", "gpu.tessera.dev/bandwidth": "1"},
            },
            "'gpu.tessera.dev/bandwidth' is not a capacity of GPU",
        ),
    ],
)
def test_bad_allocations_are_claim_errors(
    devices: dict[str, NodeDevice], layout: Layout, result: dict[str, Any], message: str
) -> None:
    with pytest.raises(
        ClaimError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    ):
        plan_claim(claim(result), REF, NODE, devices, LIBRARY, layout)


def test_allocations_prepare_cannot_enforce_are_refused_not_prepared_whole(
    devices: dict[str, NodeDevice], layout: Layout
) -> None:
    """An allocator without consumable capacity (KAI up to v0.17) hands a shared GPU to a claim
    with no shareID and no consumedCapacity: before, prepare gave that claim the whole GPU
    (no limits file) while other claims held shares of it. And a shareID on a device that is
    dedicated in today's slices comes from a slice version the driver no longer publishes."""
    stable = {
        k: v
        for k, v in share("gpu-3", None, None).items()
        if k not in ("shareID", "consumedCapacity")
    }
    u3 = devices["gpu-3"].record.gpu.uuid
    with pytest.raises(ClaimError) as e:
        plan_claim(claim(stable), REF, NODE, devices, LIBRARY, layout)
    assert str(e.value).startswith(
        "ResourceClaim ns/c: status.allocation.devices.results[0].shareID: missing, but gpu-3 "
        f"(GPU {u3}) is shared (published with allowMultipleAllocations)"
    )
    assert "KAI up to v0.17" in str(e.value) and "\n" not in str(e.value)
    no_memory = share("gpu-3", None, "10")
    with pytest.raises(
        ClaimError, match=r"results\[0\]\.consumedCapacity: has no memory for share"
    ):
        plan_claim(claim(no_memory), REF, NODE, devices, LIBRARY, layout)
    # The same GPU once it is dedicated (a MIG-mode GPU's instance, a unified-memory GPU):
    # what an allocation from the older, shared slice carries is refused.
    dedicated = {n: replace(d, shareable=False) for n, d in devices.items()}
    with pytest.raises(
        ClaimError,
        match=r"results\[0\]\.shareID: gpu-3 \(GPU .*\) is not shared in the ResourceSlice this node publishes now",
    ):
        plan_claim(claim(share("gpu-3", "4Gi", "10")), REF, NODE, dedicated, LIBRARY, layout)
    # Admin access is handed the device without limits, share or not.
    admin = {**stable, "adminAccess": True}
    assert plan_claim(claim(admin), REF, NODE, devices, LIBRARY, layout).limits_text is None
    # A device the slices no longer have names that in its error.
    with pytest.raises(
        ClaimError, match="allocated from a ResourceSlice this driver no longer publishes"
    ):
        plan_claim(claim(share("gpu-8", "4Gi", "10")), REF, NODE, devices, LIBRARY, layout)


def test_replaced_or_unallocated_claims(devices: dict[str, NodeDevice], layout: Layout) -> None:
    with pytest.raises(ClaimError, match="the claim was replaced"):
        plan_claim(
            claim(share("gpu-0", "1Gi", "1"), uid="other"), REF, NODE, devices, LIBRARY, layout
        )
    with pytest.raises(ClaimError, match="not allocated"):
        plan_claim(
            {"metadata": {"uid": "uid-1"}, "status": {}}, REF, NODE, devices, LIBRARY, layout
        )


def test_driver_native_uses_nvidias_hook_and_falls_back_for_unequal_memory(
    devices: dict[str, NodeDevice], layout: Layout
) -> None:
    plan = plan_claim(claim(share("gpu-2", "8Gi", "20")), REF, NODE, devices, DRIVER_NATIVE, layout)
    uuid = devices["gpu-2"].record.gpu.uuid
    edits = plan.cdi_spec["containerEdits"]
    assert edits["hooks"] == [
        {
            "hookName": "createRuntime",
            "path": "/usr/bin/nvidia-cdi-hook",
            "args": [
                "nvidia-cdi-hook",
                "apply-cuda-memory-limits",
                "--driver-root",
                "/",
                "--gpu-id",
                uuid,
            ],
        }
    ]
    assert edits["env"][2:] == [
        "TESSERA_ENFORCEMENT_BACKEND=driver-native",
        "NVIDIA_GPU_MEMORY_REQUEST=8192",
        "NVIDIA_GPU_MEMORY_LIMIT=8192",
    ]
    assert plan.backend == DRIVER_NATIVE
    # NVIDIA's hook takes one memory value per container: unequal shares fall back to the library.
    mixed = plan_claim(
        claim(share("gpu-2", "8Gi", "20"), share("gpu-3", "4Gi", "20", "b")),
        REF,
        NODE,
        devices,
        DRIVER_NATIVE,
        layout,
    )
    assert mixed.backend == LIBRARY and "hooks" not in mixed.cdi_spec["containerEdits"]
    assert {e["data"]["enforcementBackend"] for e in mixed.status} == {LIBRARY}


def test_backend_detection(tmp_path: Path) -> None:
    assert detect("library", None, "615.1", ["GPU-x"], "/h") == BackendChoice(
        LIBRARY, "--enforcement-backend library"
    )
    assert (
        detect("auto", None, "550.54.15", ["GPU-x"], "/h").reason
        == "driver 550.54.15 is older than r615"
    )
    assert (
        detect("auto", None, "615.20.01", ["GPU-x"], "/h").reason == "no NVML (nvidia-smi fallback)"
    )


def test_materialize_is_idempotent_and_remove_takes_everything(
    devices: dict[str, NodeDevice], layout: Layout
) -> None:
    plan = plan_claim(claim(share("gpu-3", "8Gi", "20")), REF, NODE, devices, LIBRARY, layout)
    materialize(plan, layout)
    files = [
        layout.cdi_path("uid-1"),
        layout.claim_dir("uid-1") / "limits",
        layout.claim_dir("uid-1") / "region",
    ]
    stamps = [p.stat().st_mtime_ns for p in files]
    materialize(ClaimPlan.from_json(json.loads(json.dumps(plan.to_json()))), layout)
    assert [p.stat().st_mtime_ns for p in files] == stamps
    assert json.loads(layout.cdi_path("uid-1").read_text()) == plan.cdi_spec
    remove_files("uid-1", layout)
    assert not any(p.exists() for p in files)
    remove_files("uid-1", layout)


def tiny_plan(uid: str, digest: str = "") -> ClaimPlan:
    """A plan with nothing in it: what the checkpoint's storage tests record."""
    return ClaimPlan(ClaimRef("ns", uid, uid), LIBRARY, (), None, (), {}, digest=digest)


def test_checkpoint_round_trip_and_refuses_foreign_files(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    a, b = ClaimEntry.prepared(tiny_plan("a")), ClaimEntry.prepared(tiny_plan("b"))
    cp.update(put={"a": a, "b": b})
    cp.update(drop=["a"])
    assert Checkpoint(tmp_path / "checkpoint.json").claims == {"b": b}
    assert json.loads((tmp_path / "checkpoint.json").read_text())["claims"] == {
        "b": {"state": "prepared", "plan": tiny_plan("b").to_json()}
    }
    (tmp_path / "bad.json").write_text('{"version": 0, "claims": {}}')
    with pytest.raises(CheckpointError, match="not a version 1 Tessera driver checkpoint"):
        Checkpoint(tmp_path / "bad.json")
    # A state this driver does not know (a newer driver's) is refused, naming the entry.
    (tmp_path / "newer.json").write_text(
        '{"version": 1, "claims": {"u1": {"state": "prepared"}, "u2": {"state": "paused"}}}'
    )
    with pytest.raises(
        CheckpointError,
        match=r"newer.json: claims\['u2'\].state: 'paused' is not one of prepared, preparing, unpreparing",
    ):
        Checkpoint(tmp_path / "newer.json")
    again = Checkpoint(tmp_path / "checkpoint.json")
    entry = again.get("b")
    assert entry is not None and entry.state is ClaimState.PREPARED and entry.plan == b.plan


CHECKPOINTS = Path(__file__).resolve().parents[1] / "data" / "checkpoints"


@pytest.mark.parametrize("name", sorted(p.name for p in CHECKPOINTS.glob("v1-*.json")))
def test_checkpoints_written_before_claim_entry_load_unchanged(tmp_path: Path, name: str) -> None:
    """Checkpoints the driver wrote before entries were typed (real runs, see the data's
    README) load with every field, and a write of another entry leaves theirs byte for byte."""
    raw = (CHECKPOINTS / name).read_text()
    doc = json.loads(raw)
    path = tmp_path / "checkpoint.json"
    path.write_text(raw)
    cp = Checkpoint(path)
    assert sorted(cp.uids()) == sorted(doc["claims"])
    for uid, want in doc["claims"].items():
        entry = cp.get(uid)
        assert entry is not None and entry.state == want["state"]
        assert entry.to_json() == want  # the one writer writes what the old code wrote
        ref = entry.ref
        assert ref is not None and ref.uid == uid
        if entry.state is ClaimState.PREPARED:
            assert entry.plan is not None and entry.plan.to_json() == want["plan"]
            assert entry.mig_slots == list(entry.plan.mig)
        else:
            assert entry.plan is None and entry.since == want.get("since")
            assert [s.to_json() for s in entry.mig_slots] == want["slots"]
    cp.update(put={"other": ClaimEntry.prepared(tiny_plan("other"))})
    cp.update(drop=["other"])
    assert path.read_text() == raw


def test_recorded_instance_ids_are_in_the_slot_keys_the_older_driver_wrote() -> None:
    """The instance ids a ``preparing`` entry records now (the real driver's, see the data's
    README) travel in the keys of the slots the driver wrote before it recorded them (null
    there): no new field, so an older driver reads the entry (rollback) and the version stays 1."""
    new = json.loads((CHECKPOINTS / "v1-preparing-gi-recorded.json").read_text())
    old = json.loads((CHECKPOINTS / "v1-preparing.json").read_text())
    [new_entry], [old_entry] = new["claims"].values(), old["claims"].values()
    assert new["version"] == old["version"] == 1
    assert sorted(new_entry) == sorted(old_entry)
    [new_slot], [old_slot] = new_entry["slots"], old_entry["slots"]
    assert sorted(new_slot) == sorted(old_slot)
    assert (old_slot["gi"], new_slot["gi"], new_slot["ci"]) == (None, 1, None)


def test_checkpoint_refuses_an_entry_with_a_field_it_does_not_know(tmp_path: Path) -> None:
    doc = json.loads((CHECKPOINTS / "v1-unpreparing-and-prepared-mig.json").read_text())
    uid = sorted(doc["claims"])[0]
    cases = [
        ("paused", {"state": "paused"}, "state: 'paused' is not one of"),
        ("extra", {"owner": "someone"}, "owner: not a field of a version 1 checkpoint entry"),
        ("badsince", {"since": "yesterday"}, "since: not a valid since"),
        ("badslots", {"slots": [{"device": "x"}]}, "slots: not a valid slots"),
    ]
    for name, change, want in cases:
        bad = json.loads(json.dumps(doc))
        bad["claims"][uid].update(change)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(CheckpointError) as info:
            Checkpoint(path)
        assert f"{path}: claims[{uid!r}].{want}" in str(info.value), str(info.value)
        assert str(info.value).endswith(
            "(written by another driver version?); restore the driver version that wrote "
            "it, or move the file away to start with an empty state"
        )
    # A prepared entry without its plan, a preparing one without its claim.
    for name, entry, field in [
        ("noplan", {"state": "prepared"}, "plan"),
        ("noclaim", {"state": "preparing", "slots": []}, "claim"),
    ]:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"version": 1, "claims": {"u": entry}}))
        with pytest.raises(CheckpointError, match=rf"claims\['u'\]\.{field}: missing"):
            Checkpoint(path)


def test_kubelet_version_comes_from_go_mod() -> None:
    go_mod = Path(__file__).resolve().parents[2] / "tools" / "kube" / "go.mod"
    assert kubelet_version(go_mod) == "v0.37.2"


def test_generated_stubs_serve_the_kubelets_method_paths() -> None:
    from tessera.driver.kubelet import stubs

    reg_pb2, _, dra_pb2, _ = stubs()
    assert (
        dra_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name
        == "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    )
    assert [m.name for m in dra_pb2.DESCRIPTOR.services_by_name["DRAPlugin"].methods] == [
        "NodePrepareResources",
        "NodeUnprepareResources",
    ]
    assert (
        reg_pb2.DESCRIPTOR.services_by_name["Registration"].full_name
        == "pluginregistration.Registration"
    )


def test_generated_health_stubs_serve_the_services_the_kubelet_picks() -> None:
    """The kubelet v1.37.2 (pkg/kubelet/cm/dra/plugin: healthServicesSupportedByKubelet) picks
    ``v1.DRAResourceHealth``, else ``v1alpha1.DRAResourceHealth``: the names in
    ``supported_versions`` must be the generated services' full names."""
    from tessera.driver.kubelet import HEALTH_SERVICES, health_stubs

    stubs = health_stubs()
    assert (
        list(stubs)
        == list(HEALTH_SERVICES)
        == [
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
    )
    for name, (pb2, _grpc) in stubs.items():
        svc = pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"]
        assert svc.full_name == name
        [m] = svc.methods
        assert (m.name, m.server_streaming) == ("NodeWatchResources", True)
        assert pb2.HealthStatus.Name(2) == "UNHEALTHY"


def test_checkpoint_group_commit_applies_every_concurrent_update(tmp_path: Path) -> None:
    import threading

    cp = Checkpoint(tmp_path / "checkpoint.json")
    writes = []
    import tessera.driver.checkpoint as mod

    real = mod.write_atomic

    def counting(*a: Any, **kw: Any) -> None:
        writes.append(1)
        real(*a, **kw)

    changes: list[int] = []

    def update(i: int) -> None:
        changes.append(cp.update(put={f"u{i}": ClaimEntry.prepared(tiny_plan(f"u{i}", str(i)))}))

    mod.write_atomic = counting  # type: ignore[assignment]
    try:
        threads = [threading.Thread(target=update, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        mod.write_atomic = real  # type: ignore[assignment]
    on_disk = json.loads((tmp_path / "checkpoint.json").read_text())["claims"]
    assert on_disk == {
        f"u{i}": {"state": "prepared", "plan": tiny_plan(f"u{i}", str(i)).to_json()}
        for i in range(50)
    }
    assert 1 <= len(writes) <= 50
    # each update has its own change number, and every one is committed
    assert sorted(changes) == list(range(1, 51)) and cp.committed == 50


def test_a_reader_during_this_process_write_waits_for_it_instead_of_reading_the_file(
    tmp_path: Path,
) -> None:
    """A get() that finds the file replaced by this process's own write in progress (renamed,
    its result not yet taken in) waits for that write instead of reading and decoding the whole
    file again (it did, with every concurrent prepare: a quarter of their time at 100 claims)."""
    import threading
    import time

    import tessera.driver.checkpoint as mod

    path = tmp_path / "checkpoint.json"
    cp = Checkpoint(path)
    cp.update(put={"a": ClaimEntry.prepared(tiny_plan("a"))})
    renamed = threading.Event()
    real_write, real_read = mod.write_atomic, Checkpoint._read
    reads: list[int] = []

    def slow_after_rename(*a: Any, **kw: Any) -> None:
        real_write(*a, **kw)
        renamed.set()
        time.sleep(0.2)  # the file is new, the write not finished

    def counted_read(self: Checkpoint) -> Any:
        reads.append(1)
        return real_read(self)

    mod.write_atomic = slow_after_rename  # type: ignore[assignment]
    Checkpoint._read = counted_read  # type: ignore[method-assign]
    try:
        writer = threading.Thread(
            target=cp.update, kwargs={"put": {"b": ClaimEntry.prepared(tiny_plan("b"))}}
        )
        writer.start()
        assert renamed.wait(10)
        got = cp.get("b")  # during the write: answered from its result
        writer.join()
    finally:
        mod.write_atomic = real_write  # type: ignore[assignment]
        Checkpoint._read = real_read  # type: ignore[method-assign]
    assert got == ClaimEntry.prepared(tiny_plan("b"))
    assert reads == []
    assert sorted(json.loads(path.read_text())["claims"]) == ["a", "b"]


def _config(policy: Any, requests: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {
        "source": "FromClaim",
        "opaque": {
            "driver": "gpu.tessera.dev",
            "parameters": {
                "apiVersion": "gpu.tessera.dev/v1alpha1",
                "kind": "ComputeConfig",
                "policy": policy,
                **extra,
            },
        },
    }
    if requests is not None:
        c["requests"] = requests
    return c


def test_the_opaque_config_selects_the_policy_per_request(
    devices: dict[str, NodeDevice], layout: Layout
) -> None:
    c = claim(share("gpu-1", "4Gi", "30", "a"), share("gpu-2", "4Gi", "20", "b"))
    c["status"]["allocation"]["devices"]["config"] = [
        {**_config("work-conserving"), "source": "FromClass"},  # the DeviceClass's default
        _config("strict", ["b"]),  # the claim's, for request b only
    ]
    plan = plan_claim(c, REF, NODE, devices, LIBRARY, layout)
    lim = parse_limits(plan.limits_text or "")
    assert [(g.cores, g.policy) for g in lim.gpus] == [(30, "work-conserving"), (20, "strict")]
    assert "cores 30 policy work-conserving\n" in (plan.limits_text or "")
    assert lim.shares == "/run/tessera/shares"
    mounts = {m["containerPath"]: m for m in plan.cdi_spec["containerEdits"]["mounts"]}
    assert mounts["/run/tessera/shares"]["hostPath"] == str(layout.shares_dir)
    assert "ro" in mounts["/run/tessera/shares"]["options"]


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            _config("fast"),
            "ResourceClaim ns/c: status.allocation.devices.config[0].opaque.parameters.policy: "
            "'fast' is not one of strict, work-conserving",
        ),
        (
            _config("strict", weight=2),
            "ResourceClaim ns/c: status.allocation.devices.config[0].opaque.parameters: "
            "unknown field(s) weight (it has policy)",
        ),
    ],
)
def test_a_bad_opaque_config_is_a_clear_claim_error(
    devices: dict[str, NodeDevice], layout: Layout, cfg: dict[str, Any], message: str
) -> None:
    c = claim(share("gpu-1", "4Gi", "30"))
    c["status"]["allocation"]["devices"]["config"] = [cfg]
    with pytest.raises(ClaimError) as e:
        plan_claim(c, REF, NODE, devices, LIBRARY, layout)
    assert str(e.value) == message


def test_another_drivers_config_is_ignored(devices: dict[str, NodeDevice], layout: Layout) -> None:
    c = claim(share("gpu-1", "4Gi", "30"))
    c["status"]["allocation"]["devices"]["config"] = [
        {"opaque": {"driver": "other.example.com", "parameters": {"policy": 7}}}
    ]
    plan = plan_claim(c, REF, NODE, devices, LIBRARY, layout)
    assert parse_limits(plan.limits_text or "").gpus[0].policy == "strict"


def test_the_node_shares_files_sum_the_prepared_guarantees(
    devices: dict[str, NodeDevice], layout: Layout
) -> None:
    plans = [
        plan_claim(
            claim(share("gpu-1", "4Gi", c), uid=u),
            ClaimRef("ns", "c", u),
            NODE,
            devices,
            LIBRARY,
            layout,
        )
        for u, c in (("u1", "30"), ("u2", "20"), ("u3", "0"))
    ]
    write_node_shares(layout, plans)
    uuid = devices["gpu-1"].record.gpu.uuid
    text = (layout.shares_dir / uuid).read_text()
    assert text == "version 1\nguaranteed 50\nbest-effort 1\n"
    other = plan_claim(
        claim(share("gpu-2", "4Gi", "10"), uid="u4"),
        ClaimRef("ns", "c", "u4"),
        NODE,
        devices,
        LIBRARY,
        layout,
    )
    inode = (layout.shares_dir / uuid).stat().st_ino
    write_node_shares(layout, [*plans, other])  # gpu-1's file holds its text: left as it is
    assert (layout.shares_dir / uuid).stat().st_ino == inode
    uuid2 = devices["gpu-2"].record.gpu.uuid
    assert (layout.shares_dir / uuid2).read_text() == "version 1\nguaranteed 10\nbest-effort 0\n"
    write_node_shares(layout, plans[:2])  # u3 (best-effort) unprepared: gpu-1's file changes
    assert (layout.shares_dir / uuid).read_text() == "version 1\nguaranteed 50\nbest-effort 0\n"
    assert not (layout.shares_dir / uuid2).exists()
    assert oct((layout.shares_dir / uuid).stat().st_mode & 0o777) == "0o444"
    write_node_shares(layout, plans[:0])  # every claim unprepared: the file goes
    assert not (layout.shares_dir / uuid).exists()


def test_a_recorded_plan_is_stale_when_its_gpu_moved_or_vanished(
    devices: dict[str, NodeDevice], layout: Layout
) -> None:
    """After a reboot the checkpoint's plan is checked against NVML: the GPU by UUID, its device
    minor (the spec names /dev/nvidia<minor>), and MIG devices by UUID."""
    plan = plan_claim(claim(share("gpu-3", "4Gi", "10")), REF, NODE, devices, LIBRARY, layout)
    u3 = devices["gpu-3"].record.gpu.uuid
    now = {r.record.gpu.uuid: (r.record.minor, frozenset()) for r in devices.values()}
    assert plan_stale(plan, now) is None
    assert plan_stale(ClaimPlan.from_json(plan.to_json()), now) is None
    moved = {**now, u3: (4, frozenset())}
    assert plan_stale(plan, moved) == (
        f"GPU {u3} (gpu-3) is /dev/nvidia4 now, not /dev/nvidia3 as recorded (its index moved)"
    )
    gone = {k: v for k, v in now.items() if k != u3}
    assert plan_stale(plan, gone) == f"GPU {u3} (gpu-3) is gone from this node"
