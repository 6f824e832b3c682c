"""What the device plugin advertises: the kubelet's device IDs and HAMi's node-register annotation.

* **Slots** (``ListAndWatch``): each GPU is ``split`` shareable slots of the extended resource
  ``nvidia.com/gpu`` (HAMi's ``deviceSplitCount``, default :data:`DEFAULT_SPLIT`), device IDs
  ``<GPU UUID>-<i>`` for ``i`` in ``0..split-1`` (HAMi's plugin names them so too), healthy
  while the GPU answers NVML. The kubelet counts them (the Node's capacity is slots × GPUs); which
  GPU a container gets is decided by the scheduler extender and read from the pod at
  ``Allocate`` (:mod:`.allocate`), never from the IDs.
* **Register annotation** ``hami.io/node-nvidia-register`` (HAMi ≥ 2.8, JSON; HAMi
  ``pkg/device/devices.go`` ``DeviceInfo``): per GPU ``id`` (UUID), ``index``, ``count``
  (= ``split``), ``devmem`` (MiB: the GPU's usable memory, the same a DRA share is carved
  from), ``devcore`` (100), ``type`` (``NVIDIA-<NVML name>``, unchanged when the name already
  starts with ``NVIDIA``), ``numa`` (0 when NVML gives none, as HAMi writes it), ``mode``
  (``hami-core``) and ``health``. :mod:`tessera.inventory.hami` reads it back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.inventory.hami import KEY as REGISTER_ANNOTATION
from tessera.inventory.model import GPU

#: The extended resource the kubelet is asked to advertise (HAMi's ``resourceName``).
RESOURCE = "nvidia.com/gpu"
#: HAMi's ``deviceSplitCount`` default: slots per GPU.
DEFAULT_SPLIT = 10
#: HAMi's ``devcore`` of a GPU (100 × ``deviceCoreScaling`` 1).
DEVCORE = 100
#: HAMi's ``mode`` of a GPU shared through its in-container enforcement (here: Tessera's).
MODE = "hami-core"
#: The handshake annotation HAMi's plugin refreshes with each report (``Reported <time>``).
HANDSHAKE_ANNOTATION = "hami.io/node-handshake"
MIB = 1 << 20

__all__ = [
    "DEFAULT_SPLIT",
    "HANDSHAKE_ANNOTATION",
    "REGISTER_ANNOTATION",
    "RESOURCE",
    "Slot",
    "device_type",
    "gpu_of_slot",
    "register_value",
    "slots",
]


@dataclass(frozen=True)
class Slot:
    """One device ID the kubelet counts: ``id`` (``<uuid>-<i>``), its GPU's ``uuid``, whether
    the GPU is ``healthy`` and its ``numa`` node (None: unknown)."""

    id: str
    uuid: str
    healthy: bool
    numa: int | None


def slots(gpus: Sequence[GPU], health: dict[str, bool], split: int) -> list[Slot]:
    """``split`` slots per GPU of ``gpus``, in GPU order; ``health`` by UUID (absent: healthy).
    Raises ``ValueError`` when ``split`` < 1."""
    if split < 1:
        raise ValueError(
            f"--split {split}: each GPU needs at least 1 slot (HAMi's deviceSplitCount)"
        )
    return [
        Slot(f"{g.uuid}-{i}", g.uuid, health.get(g.uuid, True), g.numa_node)
        for g in gpus
        for i in range(split)
    ]


def gpu_of_slot(slot_id: str) -> str:
    """The GPU UUID a slot ID names (``GPU-…-3`` → ``GPU-…``)."""
    return slot_id.rsplit("-", 1)[0]


def device_type(name: str) -> str:
    """HAMi's ``type`` of a GPU named ``name`` by NVML: ``NVIDIA-<name>`` unless it starts with
    ``NVIDIA`` already."""
    return name if name.startswith("NVIDIA") else f"NVIDIA-{name}"


def devmem_mib(gpu: GPU) -> int:
    """HAMi's ``devmem`` of ``gpu``: its usable memory in MiB (0 for a unified-memory GPU)."""
    return (gpu.usable_memory_bytes or 0) // MIB


def register_value(gpus: Sequence[GPU], health: dict[str, bool], split: int) -> str:
    """The ``hami.io/node-nvidia-register`` value (compact JSON) for ``gpus``; ``health`` by
    UUID (absent: healthy). Raises ``ValueError`` when ``split`` < 1."""
    if split < 1:
        raise ValueError(
            f"--split {split}: each GPU needs at least 1 slot (HAMi's deviceSplitCount)"
        )
    return json.dumps(
        [
            {
                "id": g.uuid,
                "index": g.index,
                "count": split,
                "devmem": devmem_mib(g),
                "devcore": DEVCORE,
                "type": device_type(g.product_name),
                "numa": g.numa_node if g.numa_node is not None else 0,
                "mode": MODE,
                "health": health.get(g.uuid, True),
            }
            for g in gpus
        ],
        separators=(",", ":"),
    )
