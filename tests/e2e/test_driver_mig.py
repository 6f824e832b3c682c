"""MIG through ``tessera driver`` (a real process) against a live control plane: dynamic MIG
published as partitionable devices, instances made at prepare and destroyed at unprepare -
exactly those the allocation names, as the fake NVML's log shows -, refusals of a dynamic-MIG
setting the node cannot have, and crashes between NVML calls recovered on restart.

The node: the corpus 8x H100 80GB HBM3; GPUs 0 and 1 in MIG mode, partitioned on demand
(``--dynamic-mig [0, 1]``); GPU 2 in MIG mode with the instances of the corpus H100 MIG capture
(3g.40gb, 2g.20gb, two 1g.10gb), which someone else made: published as static MIG devices and
never touched.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.driver.backend import LIBRARY
from tessera.enforcement.limits import read_limits
from tessera.inventory import build_resource_slices, load_inventory
from tessera.inventory.mig import DynamicMIG
from tessera.kube.workloads import apply_objects, gpu_pod, pod_claims, wait_for, wait_pod_scheduled
from tessera.localcluster.fake_nvml import as_listed, mig_minors_text

from .conftest import CORPUS, LiveCluster
from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import GIB, H100, DriverEnv, DriverProcess, allocated_claim, make_env, node_slices

pytestmark = pytest.mark.cluster

H100_MIG = (
    CORPUS
    / "inventories"
    / "nvidia_gpu_exporter__internal_captures__linux-x86_64__nvidia-h100-mig__590.48.01.capture.txt"
)
DYNAMIC = "[0, 1]"
DRIVER = "gpu.tessera.dev"


def mig_gpus() -> list[Any]:
    gpus = load_inventory(H100)
    [captured] = load_inventory(H100_MIG)
    out = []
    for g in gpus:
        if g.index in (0, 1):
            g = replace(g, mig_enabled=True)
        elif g.index == 2:
            g = replace(g, mig_enabled=True, mig_devices=captured.mig_devices)
        out.append(g)
    return out


@pytest.fixture
def mig_env(tmp_path: Path, kube_cluster: LiveCluster, fake_nvml_lib: Path) -> Iterator[DriverEnv]:
    env = make_env(tmp_path, kube_cluster, fake_nvml_lib, gpus=mig_gpus())
    # The fake NVML's instances and log live in the node's directory.
    env.nvml.update(mig_state=env.root / "mig-state", mig_log=env.root / "mig-log")
    env.set_gpus()
    (env.root / "mig-minors").write_text(mig_minors_text(8))
    yield env
    shutil.rmtree(env.root, ignore_errors=True)
    for s in kube_cluster.client.list(
        "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.nodeName={env.node}"
    ):
        kube_cluster.client.delete("resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"])
    kube_cluster.client.delete("v1", "Node", env.node)


def driver(env: DriverEnv, *extra: str) -> DriverProcess:
    return DriverProcess(
        env, "--dynamic-mig", DYNAMIC, "--mig-minors", str(env.root / "mig-minors"), *extra
    )


def mig_log(env: DriverEnv) -> list[tuple[str, str, int]]:
    """The fake NVML's log: (operation, its arguments, pid)."""
    path = env.root / "mig-log"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        head, pid = line.rsplit(" pid=", 1)
        op, rest = head.split(" ", 1)
        out.append((op, rest, int(pid)))
    return out


def foreign_instances(env: DriverEnv, path: Path | None = None) -> list[str]:
    """The gi/ci lines of GPU 2 (someone else's instances) in the fake NVML's state (or, with
    ``path``, in another file of the same format: the machine's configuration)."""
    u = env.gpus[2].uuid
    text = (path or env.root / "mig-state").read_text()
    return sorted(
        ln
        for ln in text.splitlines()
        if ln.split()[:1] in (["gi"], ["ci"]) and ln.split()[1:2] == [u]
    )


def checkpoint(env: DriverEnv) -> dict[str, Any]:
    """The checkpoint's claims; none while the driver has written no checkpoint yet."""
    path = env.state_dir / "checkpoint.json"
    return dict(json.loads(path.read_text())["claims"]) if path.exists() else {}


def spec_of(env: DriverEnv, uid: str) -> dict[str, Any]:
    return dict(json.loads((env.cdi_dir / f"{DRIVER}-claim_{uid}.json").read_text()))


def ref_of(claim: dict[str, Any]) -> tuple[str, str, str]:
    m = claim["metadata"]
    return (m["namespace"], m["name"], m["uid"])


def test_publishes_dynamic_gpus_as_partitionable_devices(mig_env: DriverEnv) -> None:
    env = mig_env
    d = driver(env).start()
    try:
        assert d.returncode is None, d.output
        slices = node_slices(env.client, env.node)
        want = build_resource_slices(
            env.node,
            [as_listed(g) for g in env.gpus],
            generation=1,
            dynamic_mig=DynamicMIG(gpus=(0, 1)),
            attributes={"enforcementBackend": {"string": LIBRARY}},
        )
        assert sorted((s["metadata"]["name"], s["spec"]) for s in slices) == sorted(
            (s["metadata"]["name"], s["spec"]) for s in want
        )
        devices = [dev["name"] for s in slices for dev in s["spec"].get("devices", [])]
        # 25 placements and the whole GPU for each dynamic H100; GPU 2's four instances, static.
        assert sum(n.startswith("gpu-0-mig-") for n in devices) == 25 and "gpu-0" in devices
        assert sorted(n for n in devices if n.startswith("gpu-2")) == [
            "gpu-2-mig-10-0",
            "gpu-2-mig-2-0",
            "gpu-2-mig-3-0",
            "gpu-2-mig-9-0",
        ]
        assert mig_log(env) == []  # publishing makes nothing
    finally:
        d.stop()


def _placement_claim(env: DriverEnv, ns: str, name: str, device: str) -> tuple[str, str, str]:
    """A ResourceClaim allocated directly to one of the node's devices (as the scheduler would
    write it), as ``(namespace, name, uid)``."""
    result = [{"request": "gpu", "driver": DRIVER, "pool": env.node, "device": device}]
    return ref_of(allocated_claim(env.client, ns, name, result, env.node))


def _claim_for(
    env: DriverEnv,
    ns: str,
    name: str,
    selector: str,
    memory: str | None = None,
    cores: str | None = None,
) -> dict[str, Any]:
    """A ResourceClaim with a CEL selector, allocated by kube-scheduler for a pod on the node."""
    exactly: dict[str, Any] = {
        "deviceClassName": DRIVER,
        "selectors": [{"cel": {"expression": selector}}],
    }
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory, "cores": cores or "0"}}
    env.client.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
        }
    )
    apply_objects(
        env.client,
        [
            gpu_pod(
                f"{name}-pod",
                namespace=ns,
                claim=name,
                node_selector={"kubernetes.io/hostname": env.node},
            )
        ],
    )
    wait_pod_scheduled(env.client, f"{name}-pod", ns)
    return wait_for(
        lambda: next(
            (
                c
                for c in pod_claims(env.client, f"{name}-pod", ns).values()
                if (c.get("status") or {}).get("allocation")
            ),
            None,
        ),
        timeout=30,
        what=f"claim {name} to be allocated",
    )


def test_prepare_makes_exactly_the_allocated_instance_and_unprepare_destroys_it(
    mig_env: DriverEnv, kube_namespace: str
) -> None:
    env = mig_env
    ns = kube_namespace
    u0, u1 = env.gpus[0].uuid, env.gpus[1].uuid
    before = foreign_instances(env, env.nvml_config)
    assert len(before) == 8  # four GPU instances, one compute instance each
    d = driver(env).start()
    kubelet = env.kubelet()
    try:
        assert d.returncode is None, d.output
        # A 1g.10gb: kube-scheduler takes the first fit, GPU 0's placement at slice 6.
        c = _claim_for(
            env, ns, "small", 'device.attributes["gpu.tessera.dev"].profile == "1g.10gb"'
        )
        [res] = c["status"]["allocation"]["devices"]["results"]
        assert res["device"] == "gpu-0-mig-1g10gb-6"
        r = kubelet.prepare([ref_of(c)]).claims[c["metadata"]["uid"]]
        assert r.error == "" and [x.device_name for x in r.devices] == ["gpu-0-mig-1g10gb-6"]
        log = mig_log(env)
        assert [(op, rest.split(" uuid=")[0]) for op, rest, _ in log] == [
            ("create-gi", f"{u0} gi=1 profile=19 start=6 size=1"),
            ("create-ci", f"{u0} gi=1 ci=0 profile=0"),
        ]
        mig = log[1][1].split(" uuid=")[1]
        spec = spec_of(env, c["metadata"]["uid"])
        assert spec["containerEdits"]["env"] == [
            f"NVIDIA_VISIBLE_DEVICES={mig}",
            f"CUDA_VISIBLE_DEVICES={mig}",
        ]
        gi_cap = 3 + 0 * 135 + 1 * 9
        assert [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]] == [
            "/dev/nvidia0",
            f"/dev/nvidia-caps/nvidia-cap{gi_cap}",
            f"/dev/nvidia-caps/nvidia-cap{gi_cap + 1}",
        ]
        assert (
            kubelet.prepare([ref_of(c)]).claims[c["metadata"]["uid"]] == r
        )  # idempotent: nothing made
        assert len(mig_log(env)) == 2
        assert kubelet.unprepare([ref_of(c)]).claims[c["metadata"]["uid"]].error == ""
        assert [(op, rest) for op, rest, _ in mig_log(env)[2:]] == [
            ("destroy-ci", f"{u0} gi=1 ci=0"),
            ("destroy-gi", f"{u0} gi=1"),
        ]
        assert checkpoint(env) == {}

        # Two shares of the whole dynamic GPU 1: one 7g.80gb instance, made at the first share,
        # destroyed with the last; each share limited under that instance's MIG UUID.
        # Placements have no ``uuid`` (only ``parentUUID``): optional chaining skips them.
        whole = f'device.attributes["gpu.tessera.dev"].?uuid.orValue("") == "{u1}"'
        a = _claim_for(env, ns, "share-a", whole, "8Gi", "20")
        b = _claim_for(env, ns, "share-b", whole, "4Gi", "10")
        assert {x["status"]["allocation"]["devices"]["results"][0]["device"] for x in (a, b)} == {
            "gpu-1"
        }
        assert kubelet.prepare([ref_of(a)]).claims[a["metadata"]["uid"]].error == ""
        assert kubelet.prepare([ref_of(b)]).claims[b["metadata"]["uid"]].error == ""
        made = mig_log(env)[4:]
        assert [(op, rest.split(" uuid=")[0]) for op, rest, _ in made] == [
            ("create-gi", f"{u1} gi=1 profile=0 start=0 size=8"),
            ("create-ci", f"{u1} gi=1 ci=0 profile=4"),
        ]
        seven = made[1][1].split(" uuid=")[1]
        la = read_limits(str(env.state_dir / "claims" / a["metadata"]["uid"] / "limits"))
        lb = read_limits(str(env.state_dir / "claims" / b["metadata"]["uid"] / "limits"))
        assert [(g.uuid, g.memory, g.cores) for g in la.gpus + lb.gpus] == [
            (seven, 8 * GIB, 20),
            (seven, 4 * GIB, 10),
        ]
        assert kubelet.unprepare([ref_of(a)]).claims[a["metadata"]["uid"]].error == ""
        assert len(mig_log(env)) == 6  # b still uses it
        assert kubelet.unprepare([ref_of(b)]).claims[b["metadata"]["uid"]].error == ""
        assert [(op, rest) for op, rest, _ in mig_log(env)[6:]] == [
            ("destroy-ci", f"{u1} gi=1 ci=0"),
            ("destroy-gi", f"{u1} gi=1"),
        ]
        assert d.proc is not None and {pid for _, _, pid in mig_log(env)} == {d.proc.pid}
        assert foreign_instances(env) == before
    finally:
        kubelet.close()
        d.stop()


def test_placement_held_by_someone_elses_instance_is_refused(
    mig_env: DriverEnv, kube_namespace: str
) -> None:
    """An instance made by hand on a dynamic GPU after the driver started (the fake's state
    file is the GPU): a claim for an overlapping placement is refused in one line, and the
    instance is left alone."""
    env = mig_env
    d = driver(env).start()
    kubelet = env.kubelet()
    try:
        u0 = env.gpus[0].uuid
        state = env.root / "mig-state"
        wait_for(lambda: state.exists() or None, timeout=10, what="the fake NVML's state file")
        state.write_text(
            state.read_text()
            + f"gi {u0} 7 profile=19 start=3 size=1 slices=1 memory=9984 sms=16 name=1g.10gb\n"
        )
        c = allocated_claim(
            env.client,
            kube_namespace,
            "clash",
            [
                {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": env.node,
                    "device": "gpu-0-mig-4g40gb-0",
                }
            ],
            env.node,
        )
        err = kubelet.prepare([ref_of(c)]).claims[c["metadata"]["uid"]].error
        assert err == f"ResourceClaim {kube_namespace}/clash: " + unrecorded_line(
            u0, "gpu-0-mig-4g40gb-0", "4g.40gb", "0-3", 7, None
        )
        assert mig_log(env) == [] and checkpoint(env) == {}
        assert f"gi {u0} 7 profile=19 start=3" in state.read_text()
    finally:
        kubelet.close()
        d.stop()


@pytest.mark.parametrize(
    "setting,inventory,message",
    [
        (
            "[3]",
            None,
            "--dynamic-mig: dynamicMIG: GPU 3 ({u3}, NVIDIA H100 80GB HBM3) is set for dynamic MIG but its MIG "
            "mode is disabled: enable it (nvidia-smi -i 3 -mig 1; on Ampere GPUs this takes effect after a GPU "
            "reset) and restart the driver, or leave the GPU out of dynamicMIG",
        ),
        (
            "[2]",
            None,
            "--dynamic-mig: dynamicMIG: GPU 2 (NVIDIA H100 80GB HBM3) is marked for dynamic MIG but already "
            "holds 4 MIG instance(s) the node driver did not make: destroy them (nvidia-smi mig -dci; "
            "nvidia-smi mig -dgi) or leave the GPU static",
        ),
        (
            "[9]",
            None,
            "--dynamic-mig: dynamicMIG: no GPU 9 on this node (its GPUs: 0, 1, 2, 3, 4, 5, 6, 7, or their UUIDs)",
        ),
        (
            "{gpus: [0], profiles: [1g.5gb]}",
            None,
            "--dynamic-mig: dynamicMIG.profiles: profile '1g.5gb' does not exist on this node's dynamic MIG "
            "GPUs (H100 80GB); "
            "their profiles: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        ),
        (
            "true",
            "A5000",
            "--dynamic-mig: dynamicMIG: dynamic MIG is set for every GPU but no GPU of the node is "
            "MIG-capable (NVIDIA RTX A5000); Tessera has MIG tables for A100 40GB, A100 80GB, A30, H100 80GB, "
            "H200 141GB, B200 180GB",
        ),
        ("{gpus: [0], size: 3}", None, "--dynamic-mig: unknown key(s) size; use gpus and profiles"),
    ],
)
def test_a_dynamic_mig_setting_the_node_cannot_have_is_refused_in_one_line(
    tmp_path: Path,
    kube_cluster: LiveCluster,
    fake_nvml_lib: Path,
    setting: str,
    inventory: str | None,
    message: str,
) -> None:
    from .driverkit import A5000

    if inventory:
        env = make_env(tmp_path, kube_cluster, fake_nvml_lib, A5000)
    else:
        env = make_env(tmp_path, kube_cluster, fake_nvml_lib, gpus=mig_gpus())
    try:
        d = DriverProcess(env, "--dynamic-mig", setting).start()
        assert d.proc is not None
        d.proc.wait(timeout=30)
        assert d.returncode == 2
        assert d.output.strip().splitlines()[-1] == "tessera: error: " + message.format(
            u3=env.gpus[3].uuid if len(env.gpus) > 3 else ""
        )
        assert node_slices(env.client, env.node) == []
    finally:
        shutil.rmtree(env.root, ignore_errors=True)
        env.client.delete("v1", "Node", env.node)


# ---- crashes between NVML calls ---------------------------------------------------------------


def unrecorded_line(
    gpu: str, device: str, profile: str, slices: str, gi: int, ci: int | None, index: int = 0
) -> str:
    """The refusal of a placement held by an instance the checkpoint does not record as the
    claim's (``ci``: its compute instance, or None)."""
    held = f"GPU instance {gi}" + (f" (compute instance {ci})" if ci is not None else "")
    fix = (f"nvidia-smi mig -i {index} -gi {gi} -ci {ci} -dci; " if ci is not None else "") + (
        f"nvidia-smi mig -i {index} -gi {gi} -dgi"
    )
    return (
        f"{device}: GPU {index} ({gpu}) {profile} at memory slices {slices} is held by "
        f"{held}, which the checkpoint does not record as this claim's (made by someone else, or "
        f"by a driver killed before it recorded it); it is left alone: destroy it ({fix}) or free "
        "the placement, and the next prepare makes the claim's own"
    )


def drop_instance(env: DriverEnv, gpu: str, gi: int) -> None:
    """What ``nvidia-smi mig -dci`` and ``-dgi`` do to GPU instance ``gi`` (and its compute
    instances) of ``gpu``: its lines go from the fake NVML's state file (the GPU)."""
    state = env.root / "mig-state"
    keep = [
        ln
        for ln in state.read_text().splitlines()
        if not (ln.split()[:1] in (["gi"], ["ci"]) and ln.split()[1:3] == [gpu, str(gi)])
    ]
    state.write_text("".join(f"{ln}\n" for ln in keep))


def _crash_during(env: DriverEnv, op: str, call: Any) -> int:
    """Start the driver with the fake NVML's kill point after ``op``, make ``call``; the driver
    dies there (SIGKILL). Returns the dead process's pid."""
    env.set_gpus(crash_after=(op, 1))
    d = driver(env).start()
    assert d.returncode is None and d.proc is not None, d.output
    with pytest.raises(grpc.RpcError):
        call()
    d.proc.wait(timeout=30)
    assert d.returncode == -9, d.output
    env.set_gpus()
    return d.proc.pid


def test_a_crash_between_nvml_calls_is_recovered_on_restart(
    mig_env: DriverEnv, kube_namespace: str
) -> None:
    """SIGKILL right after a GPU instance is made (before the checkpoint records it), right
    after the compute instance (the GPU instance recorded, the compute instance not), and in the
    middle of an unprepare; then a restart. Every kill point ends in adoption of what the
    checkpoint records or in a clear refusal: the GPU instance it does not record is left alone
    and the prepare refused, naming it and the nvidia-smi commands, until it is destroyed; in
    the recorded GPU instance, the unrecorded compute instance is made again; one whose claim
    was deleted meanwhile is destroyed (it is recorded); an interrupted unprepare's is
    destroyed. GPU 2's instances, which the driver did not make, are never touched."""
    env = mig_env
    ns = kube_namespace
    u0, u1 = env.gpus[0].uuid, env.gpus[1].uuid
    before = foreign_instances(env, env.nvml_config)
    kubelet = env.kubelet()

    def claim(name: str, device: str) -> tuple[str, str, str]:
        return ref_of(
            allocated_claim(
                env.client,
                ns,
                name,
                [{"request": "gpu", "driver": DRIVER, "pool": env.node, "device": device}],
                env.node,
            )
        )

    x, y, z = (
        claim("x", "gpu-0-mig-1g10gb-6"),
        claim("y", "gpu-0-mig-2g20gb-0"),
        claim("z", "gpu-1-mig-3g40gb-4"),
    )
    try:
        # 1. Killed after create-gi, before its record: the claim is "preparing" with its
        #    placement recorded but no GPU-instance id. The instance is not adopted: the retry is
        #    refused, naming it, and nothing is destroyed; once the operator destroys it, the next
        #    retry makes the claim's own.
        dead = _crash_during(env, "create-gi", lambda: kubelet.prepare([x], timeout=20))
        assert [(op, pid) for op, _, pid in mig_log(env)] == [("create-gi", dead)]
        [slot] = checkpoint(env)[x[2]]["slots"]
        assert checkpoint(env)[x[2]]["state"] == "preparing" and slot["gi"] is None
        line = unrecorded_line(u0, "gpu-0-mig-1g10gb-6", "1g.10gb", "6-6", 1, None)
        d = driver(env).start()
        assert d.returncode is None and d.proc is not None, d.output
        assert (
            f"ResourceClaim {ns}/x: prepare was interrupted; adopted 0 of its 1 MIG instance(s) "
            f"for the kubelet's retry; {line}" in d.output
        )
        assert kubelet.prepare([x]).claims[x[2]].error == f"ResourceClaim {ns}/x: {line}"
        assert kubelet.prepare([x]).claims[x[2]].error == f"ResourceClaim {ns}/x: {line}"
        assert len(mig_log(env)) == 1 and x[2] not in checkpoint(env)
        drop_instance(env, u0, 1)  # the operator: nvidia-smi mig -i 0 -gi 1 -dgi
        r = kubelet.prepare([x]).claims[x[2]]
        assert r.error == ""
        log = mig_log(env)
        assert [(op, rest.split(" uuid=")[0], pid) for op, rest, pid in log[1:]] == [
            ("create-gi", f"{u0} gi=1 profile=19 start=6 size=1", d.proc.pid),
            ("create-ci", f"{u0} gi=1 ci=0 profile=0", d.proc.pid),
        ]
        assert checkpoint(env)[x[2]]["state"] == "prepared"
        assert (
            spec_of(env, x[2])["containerEdits"]["env"][0]
            == f"NVIDIA_VISIBLE_DEVICES={log[2][1].split(' uuid=')[1]}"
        )
        d.stop()

        # 2. Killed after create-ci, before its record: the GPU instance is recorded (and
        #    adopted), the compute instance in it is not: the retry destroys it and makes the
        #    claim's own (recorded), and uses that.
        dead = _crash_during(env, "create-ci", lambda: kubelet.prepare([y], timeout=20))
        assert [(op, pid) for op, _, pid in mig_log(env)[3:]] == [
            ("create-gi", dead),
            ("create-ci", dead),
        ]
        [slot] = checkpoint(env)[y[2]]["slots"]
        assert (slot["gi"], slot["ci"], slot["uuid"]) == (2, None, None)
        d = driver(env).start()
        assert d.returncode is None and d.proc is not None, d.output
        assert (
            f"ResourceClaim {ns}/y: prepare was interrupted; adopted 1 of its 1 MIG instance(s) "
            "for the kubelet's retry\n" in d.output
        )
        assert kubelet.prepare([y]).claims[y[2]].error == ""
        again = mig_log(env)[5:]
        assert [(op, rest.split(" uuid=")[0], pid) for op, rest, pid in again] == [
            ("destroy-ci", f"{u0} gi=2 ci=0", d.proc.pid),
            ("create-ci", f"{u0} gi=2 ci=0 profile=1", d.proc.pid),
        ]
        made = again[1][1].split(" uuid=")[1]
        assert spec_of(env, y[2])["containerEdits"]["env"][0] == f"NVIDIA_VISIBLE_DEVICES={made}"
        d.stop()

        # 3. Killed after create-ci, and the claim is deleted before the driver is back: its
        #    recorded GPU instance is destroyed at start (with the compute instance in it), and
        #    its record goes.
        dead = _crash_during(env, "create-ci", lambda: kubelet.prepare([z], timeout=20))
        env.client.delete("resource.k8s.io/v1", "ResourceClaim", "z", ns)
        d = driver(env).start()
        assert d.returncode is None and d.proc is not None, d.output
        assert [(op, rest, pid) for op, rest, pid in mig_log(env)[9:]] == [
            ("destroy-ci", f"{u1} gi=1 ci=0", d.proc.pid),
            ("destroy-gi", f"{u1} gi=1", d.proc.pid),
        ]
        assert (
            f"ResourceClaim {ns}/z: deleted; destroyed its MIG instance(s): 3g.40gb at slice 4 of GPU 1"
            in d.output
        )
        assert sorted(checkpoint(env)) == sorted([x[2], y[2]])
        d.stop()

        # 4. Killed in an unprepare, between destroying the compute instance and the GPU
        #    instance: the restart destroys the rest; the kubelet's retry finds nothing to do.
        dead = _crash_during(env, "destroy-ci", lambda: kubelet.unprepare([x], timeout=20))
        assert [(op, pid) for op, _, pid in mig_log(env)[11:]] == [("destroy-ci", dead)]
        assert checkpoint(env)[x[2]]["state"] == "unpreparing"
        d = driver(env).start()
        assert d.returncode is None and d.proc is not None, d.output
        assert [(op, rest, pid) for op, rest, pid in mig_log(env)[12:]] == [
            ("destroy-gi", f"{u0} gi=1", d.proc.pid)
        ]
        assert kubelet.unprepare([x]).claims[x[2]].error == ""
        assert len(mig_log(env)) == 13 and sorted(checkpoint(env)) == [y[2]]
        assert not (env.cdi_dir / f"{DRIVER}-claim_{x[2]}.json").exists()
        assert kubelet.unprepare([y]).claims[y[2]].error == ""
        assert [op for op, _, _ in mig_log(env)[13:]] == ["destroy-ci", "destroy-gi"]
        d.stop()
        # Someone else's instances: never in the log, still there.
        assert all(env.gpus[2].uuid not in rest for _, rest, _ in mig_log(env))
        assert foreign_instances(env) == before
        assert checkpoint(env) == {}
    finally:
        kubelet.close()


#: The MIG UUID of the compute instance an operator makes by hand in the tests below.
THEIRS = "MIG-0badc0de-0000-4000-8000-000000000001"
CHECKPOINTS = Path(__file__).resolve().parents[1] / "data" / "checkpoints"


def _gpu0_lines(env: DriverEnv) -> list[str]:
    u0 = env.gpus[0].uuid
    text = (env.root / "mig-state").read_text()
    return sorted(ln for ln in text.splitlines() if ln.split()[:1] in (["gi"], ["ci"]) and u0 in ln)


def test_an_operators_instance_at_a_recorded_placement_is_left_alone_and_refused(
    mig_env: DriverEnv, kube_namespace: str
) -> None:
    """The driver is killed after making claim x's compute instance (its GPU instance 1 is
    recorded); meanwhile an operator destroys that instance and makes their own at the same
    placement (GPU instance 5, compute instance 0). On restart the operator's instance is not
    adopted: the log and every prepare retry name it and the nvidia-smi commands, nothing is
    destroyed, no CDI spec is written."""
    env = mig_env
    ns = kube_namespace
    u0 = env.gpus[0].uuid
    kubelet = env.kubelet()
    x = _placement_claim(env, ns, "x", "gpu-0-mig-1g10gb-6")
    try:
        _crash_during(env, "create-ci", lambda: kubelet.prepare([x], timeout=20))
        [slot] = checkpoint(env)[x[2]]["slots"]
        assert (slot["start"], slot["gi"], slot["ci"]) == (6, 1, None)
        drop_instance(env, u0, 1)
        state = env.root / "mig-state"
        state.write_text(
            state.read_text()
            + f"gi {u0} 5 profile=19 start=6 size=1 slices=1 memory=9984 sms=16 name=1g.10gb\n"
            + f"ci {u0} 5 0 profile=0 slices=1 sms=16 uuid={THEIRS} name=1g.10gb\n"
        )
        theirs = _gpu0_lines(env)
        made = len(mig_log(env))
        d = driver(env).start()
        assert d.returncode is None, d.output
        line = unrecorded_line(u0, "gpu-0-mig-1g10gb-6", "1g.10gb", "6-6", 5, 0)
        assert (
            f"ResourceClaim {ns}/x: prepare was interrupted; adopted 0 of its 1 MIG instance(s) "
            f"for the kubelet's retry; {line}" in d.output
        )
        for _ in range(2):  # the first retry with the record, the next without
            assert kubelet.prepare([x]).claims[x[2]].error == f"ResourceClaim {ns}/x: {line}"
        assert len(mig_log(env)) == made and _gpu0_lines(env) == theirs
        assert x[2] not in checkpoint(env)
        assert not (env.cdi_dir / f"{DRIVER}-claim_{x[2]}.json").exists()
        d.stop()
    finally:
        kubelet.close()


def test_an_older_drivers_preparing_entry_adopts_nothing_after_an_upgrade(
    mig_env: DriverEnv, kube_namespace: str
) -> None:
    """The ``preparing`` entry the driver before instance ids were recorded wrote after its
    SIGKILL at create-gi (tests/data/checkpoints/v1-preparing.json, its slots as written; only
    the claim is this test's), with that GPU instance still there: the upgraded driver loads
    it, adopts nothing and refuses the retry naming the instance; once it is destroyed, the
    retry makes the claim's own."""
    env = mig_env
    ns = kube_namespace
    u0 = env.gpus[0].uuid
    doc = json.loads((CHECKPOINTS / "v1-preparing.json").read_text())
    [entry] = doc["claims"].values()
    [slot] = entry["slots"]
    assert (slot["gpuUUID"], slot["device"], slot["gi"]) == (u0, "gpu-0-mig-1g10gb-6", None)
    kubelet = env.kubelet()
    x = _placement_claim(env, ns, "x", "gpu-0-mig-1g10gb-6")
    try:
        entry.update(claim={"namespace": ns, "name": x[1], "uid": x[2]}, since=time.time())
        env.state_dir.mkdir(parents=True, exist_ok=True)
        (env.state_dir / "checkpoint.json").write_text(
            json.dumps({"version": doc["version"], "claims": {x[2]: entry}})
        )
        state = env.root / "mig-state"
        d = driver(env).start()  # writes the fake's state file
        assert d.returncode is None, d.output
        d.stop()
        state.write_text(
            state.read_text()
            + f"gi {u0} 1 profile=19 start=6 size=1 slices=1 memory=9984 sms=16 name=1g.10gb\n"
        )
        d = driver(env).start()
        assert d.returncode is None and d.proc is not None, d.output
        line = unrecorded_line(u0, "gpu-0-mig-1g10gb-6", "1g.10gb", "6-6", 1, None)
        assert (
            f"ResourceClaim {ns}/x: prepare was interrupted; adopted 0 of its 1 MIG instance(s) "
            f"for the kubelet's retry; {line}" in d.output
        )
        assert kubelet.prepare([x]).claims[x[2]].error == f"ResourceClaim {ns}/x: {line}"
        assert mig_log(env) == []
        drop_instance(env, u0, 1)
        assert kubelet.prepare([x]).claims[x[2]].error == ""
        assert [(op, rest.split(" uuid=")[0], pid) for op, rest, pid in mig_log(env)] == [
            ("create-gi", f"{u0} gi=1 profile=19 start=6 size=1", d.proc.pid),
            ("create-ci", f"{u0} gi=1 ci=0 profile=0", d.proc.pid),
        ]
        assert checkpoint(env)[x[2]]["state"] == "prepared"
        d.stop()
    finally:
        kubelet.close()
