"""The fake NVML's machine description (``native/fake/fake_nvml_config.h``) written from real
inventories: GPUs, NUMA nodes and NVLink domains from a ``topo -m``, MIG profiles (the
``tessera.inventory.mig`` tables) and existing MIG instances, and the MIG state, log and crash
point. Used by the driver's tests and by ``make demo`` (fake GPUs on a machine without one)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.inventory import GPU

#: NVML GPU-instance profile ids by profile constant, as ``nvidia-smi mig -lgip`` lists them on
#: A100/H100 (7g: 0, 4g: 5, 3g: 9, 2g: 14, 1g with two memory slices: 15, 1g: 19, 1g+me: 20);
#: the fake NVML reports whatever its configuration says.
GI_PROFILE_IDS = {
    "NVML_GPU_INSTANCE_PROFILE_7_SLICE": 0,
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE": 5,
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE": 9,
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE": 14,
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2": 15,
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE": 19,
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1": 20,
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1": 6,
}
CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}  # compute slices -> NVML_COMPUTE_INSTANCE_PROFILE_*


def mig_uuid(gpu_uuid: str, gi: int, ci: int) -> str:
    """A stand-in MIG UUID for an instance whose inventory has none (``nvidia-smi -q -x`` prints
    none; a masked capture hides them)."""
    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{gpu_uuid}/{gi}/{ci}"))


def _gi_profile(g: GPU, m: Any) -> Any:
    """The table profile of a MIG device's GPU instance: by the name ``nvidia-smi -L`` printed
    (``1c.3g.71gb`` is a compute instance of a ``3g.71gb``), else by its memory and SMs."""
    from tessera.inventory.mig import mig_model_for

    model = mig_model_for(g.product_name, g.memory_bytes)
    assert model is not None, g.product_name
    if m.profile:
        name = m.profile.split(".", 1)[1] if m.profile.split(".", 1)[0].endswith("c") else m.profile
        p = model.profile(name)
        assert p is not None, m.profile
        return p
    fits = [
        p
        for p in model.profiles
        if not p.media_extensions and p.memory_mib * (1 << 20) <= m.memory_bytes
    ]
    exact = [p for p in fits if p.multiprocessors == m.sm_count]
    return max(exact or fits, key=lambda p: p.memory_mib)


def mig_lines(g: GPU) -> list[str]:
    """The fake NVML's MIG statements for GPU ``g`` in MIG mode: its model's GPU-instance
    profiles (``tessera.inventory.mig`` tables) and its existing instances (``g.mig_devices``,
    placed at the first free placement of their profile: inventories do not say where)."""
    import pynvml

    from tessera.inventory.mig import mig_model_for, nvml_gpu_instance_profile

    model = mig_model_for(g.product_name, g.memory_bytes)
    if model is None:
        return []
    out = []
    for p in model.profiles:
        const = nvml_gpu_instance_profile(p)
        out.append(
            f"migprofile {g.uuid} const={getattr(pynvml, const)} id={GI_PROFILE_IDS[const]} name={p.name} "
            f"slices={p.compute_slices} memslices={p.memory_slices} memory={p.memory_mib} "
            f"sms={p.multiprocessors or 0} starts={','.join(map(str, p.starts))}"
        )
    gis: dict[int, list[Any]] = {}
    for m in g.mig_devices:
        gis.setdefault(m.gpu_instance_id, []).append(m)
    profiles = {gi_id: _gi_profile(g, cis[0]) for gi_id, cis in gis.items()}

    def place(todo: list[int], used: frozenset[int]) -> dict[int, int] | None:
        # Placements that fit together (a small search: at most 7 GPU instances).
        if not todo:
            return {}
        p = profiles[todo[0]]
        for s in p.starts:
            span = frozenset(range(s, s + p.memory_slices))
            rest = None if used & span else place(todo[1:], used | span)
            if rest is not None:
                return {todo[0]: s, **rest}
        return None

    starts = place(sorted(gis, key=lambda i: -profiles[i].memory_slices), frozenset())
    assert starts is not None, f"GPU {g.index}: its MIG instances fit no placement of the tables"
    for gi_id, cis in sorted(gis.items()):
        p = profiles[gi_id]
        start = starts[gi_id]
        const = nvml_gpu_instance_profile(p)
        out.append(
            f"gi {g.uuid} {gi_id} profile={GI_PROFILE_IDS[const]} start={start} size={p.memory_slices} "
            f"slices={p.compute_slices} memory={cis[0].memory_bytes >> 20} sms={p.multiprocessors or 0} "
            f"name={p.name}"
        )
        for m in cis:
            name = m.profile or p.name
            k = int(name.split("c.", 1)[0]) if "c." in name else p.compute_slices
            out.append(
                f"ci {g.uuid} {gi_id} {m.compute_instance_id} profile={CI_PROFILE[k]} slices={k} "
                f"sms={m.sm_count or 0} uuid={m.uuid or mig_uuid(g.uuid, gi_id, m.compute_instance_id)} "
                f"name={name}"
            )
    return out


def as_listed(g: GPU) -> GPU:
    """``g`` as this fake machine shows it: its MIG devices with the UUID and profile name
    ``nvidia-smi -L`` prints (``-q -x`` has neither; a masked capture hides the UUIDs, and the
    fake machine has real ones: :func:`mig_uuid`), and its GPU UUID a real one."""
    from dataclasses import replace

    migs = tuple(
        replace(
            m,
            uuid=m.uuid or mig_uuid(g.uuid, m.gpu_instance_id, m.compute_instance_id),
            profile=m.profile or _gi_profile(g, m).name,
        )
        for m in g.mig_devices
    )
    return replace(g, mig_devices=migs, uuid_synthesized=False)


def nvml_config(
    gpus: Sequence[GPU],
    *,
    driver_version: str | None = None,
    memory_limits: bool = False,
    lost: Sequence[str] = (),
    gone: Sequence[str] = (),
    xids: Sequence[tuple[int, str, int]] = (),
    topology: Any = None,
    mig_state: Path | None = None,
    mig_log: Path | None = None,
    crash_after: tuple[str, int] | None = None,
) -> str:
    """The fake NVML's node description (native/fake/fake_nvml_config.h) for ``gpus``: with
    ``topology`` (``nvidia-smi topo -m``) each GPU's NUMA node and NVLink domain; for a GPU in
    MIG mode its profiles and instances (:func:`mig_lines`); ``mig_state`` / ``mig_log`` /
    ``crash_after`` (operation, count) as the fake's ``mig-state``, ``mig-log`` and
    ``mig-crash-after``."""
    drv = driver_version or (gpus[0].driver_version if gpus else "550.54.15")
    cuda = gpus[0].cuda_version if gpus and gpus[0].cuda_version else "12.2"
    major, minor = (int(x) for x in cuda.split(".")[:2])
    lines = [
        f"driver-version {drv}",
        f"cuda-version {major * 1000 + minor * 10}",
        f"memory-limits {'yes' if memory_limits else 'no'}",
    ]
    domains = topology.nvlink_domains() if topology is not None else {}
    for g in gpus:
        if g.uuid in gone:
            continue
        parts = [
            f"gpu {g.uuid}",
            f'name="{g.product_name}"',
            f"memory={g.memory_bytes}",
            f"minor={g.index}",
        ]
        if g.memory_reserved_bytes:
            parts.append(f"reserved={g.memory_reserved_bytes}")
        if g.pcie_bus_id:
            parts.append(f"pci={g.pcie_bus_id}")
        if g.cuda_compute_capability:
            parts.append(f"cc={g.cuda_compute_capability}")
        if g.mig_enabled:
            parts.append("mig=1")
        if g.uuid in lost:
            parts.append("health=lost")
        numa = (
            g.numa_node
            if g.numa_node is not None
            else (topology.numa.get(g.index) if topology is not None else None)
        )
        if numa is not None:
            parts.append(f"numa={numa}")
        if g.index in domains:
            parts.append(f"nvlink={domains[g.index] + 1}")
        lines.append(" ".join(parts))
        if g.mig_enabled:
            lines += mig_lines(g)
    lines += [f"xid {i} {u} {code}" for i, u, code in xids]
    if mig_state is not None:
        lines.append(f"mig-state {mig_state}")
    if mig_log is not None:
        lines.append(f"mig-log {mig_log}")
    if crash_after is not None:
        lines.append(f"mig-crash-after {crash_after[0]} {crash_after[1]}")
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def mig_minors_text(gpus: int) -> str:
    """``/proc/driver/nvidia-caps/mig-minors`` of a machine with ``gpus`` GPUs, as the NVIDIA
    driver lays it out (MIG User Guide, "Device Nodes and Capabilities": ``config 1``,
    ``monitor 2``, then per GPU minor 15 GPU instances of 8 compute instances each:
    ``gpu0/gi0/access 3``, ``gpu0/gi0/ci0/access 4`` ... ``gpu0/gi1/access 12``)."""
    lines = ["config 1", "monitor 2"]
    minor = 3
    for g in range(gpus):
        for gi in range(15):
            lines.append(f"gpu{g}/gi{gi}/access {minor}")
            minor += 1
            for ci in range(8):
                lines.append(f"gpu{g}/gi{gi}/ci{ci}/access {minor}")
                minor += 1
    return "\n".join(lines) + "\n"
