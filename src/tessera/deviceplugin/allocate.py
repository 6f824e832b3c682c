"""``Allocate``: from the scheduler extender's decision on the pod to a DRA share's files.

The kubelet's ``Allocate`` names only slot IDs (:mod:`.register`); which GPUs, how much memory
and how many cores are the scheduler extender's decision, recorded on the pod in HAMi's protocol
(``../shared/reference/hami.md`` §1.5-1.7; HAMi ``pkg/device-plugin/nvidiadevice/plugin/server.go``):

1. **Which pod** (:func:`choose_pod`): among the pods on this node (``spec.nodeName``) in
   phase ``Pending`` with ``hami.io/bind-phase: allocating`` and ``hami.io/vgpu-node`` = this
   node and a container entry left in ``hami.io/vgpu-devices-to-allocate``, the one with the
   oldest ``hami.io/bind-time`` (unix seconds; the pod name breaks a tie). The kubelet admits
   one pod at a time, and the extender binds one HAMi pod per node at a time.
2. **Which container** (:func:`next_entry`): the first non-empty container entry of
   ``hami.io/vgpu-devices-to-allocate`` (pod order, init containers first: the order the
   kubelet starts them in); its device count must equal the number of IDs the kubelet asks
   for (else :class:`AllocateError`, HAMi's "device number not matched"). The entry is then
   erased (:attr:`Pending.remaining`), and once none is left ``hami.io/bind-phase`` becomes
   ``success``; on an error it becomes ``failed`` (:mod:`.plugin` writes both, and then
   releases HAMi's node lock ``hami.io/mutex.lock`` when it names the pod, as HAMi's plugin
   does).
3. **What the container gets** (:func:`plan_allocation`): exactly a DRA share's files. The
   entry is turned into the allocation a DRA scheduler with consumable capacity would have
   written for one claim (one result per device: ``device`` ``gpu-<index>``, a ``shareID``,
   ``consumedCapacity`` ``memory`` = the entry's MiB in bytes and ``cores`` = its percent) and
   planned by the node driver's own :func:`tessera.driver.prepare.plan_claim` for a claim
   whose UID is :func:`allocation_uid` (``<pod UID>-<entry index>``): the same limits file,
   usage region, enforcement library, ``/etc/ld.so.preload`` and CDI spec, in the same
   claim directory (``<state-dir>/claims/<uid>``, :mod:`tessera.enforcement.layout`), so the
   monitor reads it as it reads a DRA share's. A whole GPU (its full ``devmem`` and cores 0 or
   100) gets no limits, as in DRA mode.
4. **Who uses it** (:func:`claim_meta`): a legacy share has no ResourceClaim in the API, where
   the monitor finds a DRA share's pods and containers; the plugin writes them into the claim
   directory's ``claim.json`` (the monitor's optional metadata,
   :func:`tessera.monitor.regions.parse_claim_json`), so the monitor labels the share with its
   pod and container.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.api.errors import TesseraError
from tessera.convert.hami import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    ContainerDevice,
    decode_pod_devices,
    encode_pod_devices,
)
from tessera.driver.backend import LIBRARY
from tessera.driver.kubelet import ClaimRef
from tessera.driver.prepare import ClaimError, ClaimPlan, Layout, NodeDevice, plan_claim
from tessera.driver.prepare import node_devices as prepared_devices
from tessera.driver.publish import GpuRecord, desired_slices
from tessera.enforcement.layout import META_FILE

#: ``hami.io/bind-phase`` values (HAMi ``pkg/util/types.go``).
PHASE_ALLOCATING = "allocating"
PHASE_SUCCESS = "success"
PHASE_FAILED = "failed"
MIB = 1 << 20
#: The request name the planned allocation's results carry.
REQUEST = "gpu"
#: HAMi's node lock (a Node annotation ``<RFC3339 time>,<namespace>,<pod>``, hami.md §1.5):
#: held by the extender from its bind until the plugin's ``Allocate`` of the pod ends.
NODE_LOCK = "hami.io/mutex.lock"


class AllocateError(TesseraError, RuntimeError):
    """Why a container cannot be allocated (one line naming the pod and annotation): the
    kubelet gets it as the ``Allocate`` error and the pod fails admission."""


@dataclass(frozen=True)
class Pending:
    """The container entry an ``Allocate`` call takes: the ``pod`` (as the API server returned
    it), the entry's ``index`` in ``hami.io/vgpu-devices-to-allocate``, the container's name
    (``container``; ``""`` when the pod has fewer containers than entries), its ``devices``, the
    annotation's value without the entry (``remaining``) and whether no entry is left then
    (``done``)."""

    pod: Mapping[str, Any]
    index: int
    container: str
    devices: tuple[ContainerDevice, ...]
    remaining: str
    done: bool

    @property
    def name(self) -> str:
        """``<namespace>/<name>`` of the pod."""
        meta = self.pod.get("metadata") or {}
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    @property
    def uid(self) -> str:
        """:func:`allocation_uid` of this entry."""
        return allocation_uid(str((self.pod.get("metadata") or {}).get("uid", "")), self.index)


def allocation_uid(pod_uid: str, index: int) -> str:
    """The claim UID of a container entry: ``<pod UID>-<entry index>``, the name of its claim
    directory and CDI spec."""
    return f"{pod_uid}-{index}"


def pod_of_uid(uid: str) -> str:
    """The pod UID an :func:`allocation_uid` names."""
    return uid.rsplit("-", 1)[0]


def lock_holder(value: str | None) -> tuple[str, str] | None:
    """``(namespace, pod)`` holding HAMi's node lock ``value`` (``<time>,<namespace>,<pod>``),
    None for no lock or another shape."""
    parts = (value or "").split(",")
    if len(parts) != 3 or not all(p.strip() for p in parts):
        return None
    return parts[1].strip(), parts[2].strip()


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def _bind_time(pod: Mapping[str, Any]) -> int:
    value = _annotations(pod).get(BIND_TIME, "")
    try:
        return int(value)
    except ValueError:
        return 2**63  # unreadable: last (HAMi's plugin skips it)


def _has_entry(value: str) -> bool:
    try:
        return any(decode_pod_devices(value, what=DEVICES_TO_ALLOCATE))
    except ValueError:
        return True  # chosen, so that next_entry reports the bad value on this pod


def choose_pod(pods: Iterable[Mapping[str, Any]], node: str) -> Mapping[str, Any]:
    """The pod an ``Allocate`` on ``node`` serves (module doc, step 1), from ``pods`` (those
    the API server lists on the node). Raises :class:`AllocateError` when there is none,
    naming the node and what was looked for."""
    candidates = [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") == "Pending"
        and (p.get("spec") or {}).get("nodeName") == node
        and _annotations(p).get(BIND_PHASE) == PHASE_ALLOCATING
        and _annotations(p).get(VGPU_NODE) == node
        and _has_entry(_annotations(p).get(DEVICES_TO_ALLOCATE, ""))
    ]
    if not candidates:
        raise AllocateError(
            f"node {node}: no Pending pod on it has {BIND_PHASE}={PHASE_ALLOCATING}, "
            f"{VGPU_NODE}={node} and a container entry left in {DEVICES_TO_ALLOCATE}: the pod "
            "was not bound by the scheduler extender (schedule HAMi-style pods with its "
            "scheduler, docs/legacy.md)"
        )
    return min(
        candidates,
        key=lambda p: (_bind_time(p), str((p.get("metadata") or {}).get("name", ""))),
    )


def next_entry(pod: Mapping[str, Any], requested: int) -> Pending:
    """The first non-empty container entry of the pod's ``hami.io/vgpu-devices-to-allocate``
    for a kubelet request of ``requested`` device IDs (module doc, step 2). Raises
    :class:`AllocateError` naming the pod and annotation when the value does not decode, no
    entry is left, or the entry's device count is not ``requested``."""
    meta = pod.get("metadata") or {}
    what = f"pod {meta.get('namespace', '')}/{meta.get('name', '')}"
    value = _annotations(pod).get(DEVICES_TO_ALLOCATE, "")
    try:
        entries = decode_pod_devices(value, what=DEVICES_TO_ALLOCATE)
    except ValueError as e:
        raise AllocateError(f"{what}: {e}") from None
    index = next((i for i, devs in enumerate(entries) if devs), None)
    if index is None:
        raise AllocateError(
            f"{what}: annotation {DEVICES_TO_ALLOCATE} has no container entry left "
            f"({value!r}): every container of the pod is allocated already"
        )
    devices = entries[index]
    if len(devices) != requested:
        raise AllocateError(
            f"{what}: annotation {DEVICES_TO_ALLOCATE} container entry {index} has "
            f"{len(devices)} device(s) but the kubelet asks for {requested} of the container's "
            "nvidia.com/gpu: device number not matched (the pod's limits changed after the "
            "extender decided, or another scheduler wrote the annotation); delete the pod"
        )
    spec = pod.get("spec") or {}
    names = [
        str(c.get("name", ""))
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    ]
    rest = [[] if i == index else devs for i, devs in enumerate(entries)]
    return Pending(
        pod=pod,
        index=index,
        container=names[index] if index < len(names) else "",
        devices=tuple(devices),
        remaining=encode_pod_devices(rest),
        done=not any(rest),
    )


def node_devices(node: str, driver: str, records: Sequence[GpuRecord]) -> dict[str, NodeDevice]:
    """The node's whole GPUs as the node driver would publish and resolve them
    (:func:`~tessera.driver.publish.desired_slices` read back by
    :func:`tessera.driver.prepare.node_devices`): ``gpu-<index>``, shareable, with their usable
    memory (what ``devmem`` advertises, :func:`.register.register_value`). MIG devices are left
    out (legacy mode hands out whole GPUs' shares). The devices hold ``records`` themselves, so
    a GPU's health as :class:`~tessera.driver.publish.GpuRecord` has it now is what prepare
    sees: the result stays right while the same records are rescanned."""
    slices = desired_slices(node, driver, list(records), LIBRARY, 1, time.time(), 0)
    return {
        name: d
        for name, d in prepared_devices(records, slices).items()
        if d.mig is None and d.placement is None
    }


def allocation(
    pending: Pending, node: str, driver: str, devices: Mapping[str, NodeDevice]
) -> dict[str, Any]:
    """The ResourceClaim (``resource.k8s.io/v1`` shape, as :func:`~tessera.driver.prepare.plan_claim`
    reads it) a DRA scheduler with consumable capacity would have allocated for the entry:
    ``metadata.uid`` = :attr:`Pending.uid`, one result per device. Raises
    :class:`AllocateError` for a UUID that is not one of ``devices``' GPUs."""
    by_uuid = {d.record.gpu.uuid: d for d in devices.values()}
    meta = pending.pod.get("metadata") or {}
    results = []
    for j, dev in enumerate(pending.devices):
        nd = by_uuid.get(dev.uuid)
        if nd is None:
            raise AllocateError(
                f"pod {pending.name}: annotation {DEVICES_TO_ALLOCATE} container entry "
                f"{pending.index} names GPU {dev.uuid}, which is not a GPU of node {node} "
                f"(GPUs: {', '.join(sorted(by_uuid)) or 'none'}); delete the pod so that the "
                "extender decides again"
            )
        results.append(
            {
                "request": REQUEST,
                "driver": driver,
                "pool": node,
                "device": nd.name,
                "shareID": f"{pending.uid}-{j}",
                "consumedCapacity": {
                    "memory": str(dev.memory_mib * MIB),
                    "cores": str(dev.cores),
                },
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "namespace": meta.get("namespace", ""),
            "name": meta.get("name", ""),
            "uid": pending.uid,
        },
        "status": {"allocation": {"devices": {"results": results}}},
    }


def plan_allocation(
    pending: Pending, node: str, devices: Mapping[str, NodeDevice], backend: str, layout: Layout
) -> ClaimPlan:
    """The files and CDI devices of the entry (module doc, step 3): the node driver's plan for
    :func:`allocation` over ``devices`` (the node's, :func:`node_devices`). Raises
    :class:`AllocateError` naming the pod, the annotation and the entry (prepare's own reason
    appended) when the entry cannot be prepared (memory above the GPU's, cores above 100, a
    lost GPU)."""
    meta = pending.pod.get("metadata") or {}
    ref = ClaimRef(str(meta.get("namespace", "")), str(meta.get("name", "")), pending.uid)
    claim = allocation(pending, node, layout.driver, devices)
    try:
        return plan_claim(claim, ref, node, devices, backend, layout)
    except ClaimError as e:
        raise AllocateError(
            f"pod {pending.name}: annotation {DEVICES_TO_ALLOCATE} container entry "
            f"{pending.index} cannot be prepared ({encode_pod_devices([list(pending.devices)])!r}, "
            f"MiB and percent per GPU): {e}"
        ) from None


def claim_meta(
    pending: Pending,
    plan: ClaimPlan,
    node: str,
    devices: Mapping[str, NodeDevice],
    layout: Layout,
) -> dict[str, Any] | None:
    """The claim directory's ``claim.json`` for the entry (module doc, step 4), version 1::

        {"version": 1, "uid": "<pod UID>-<i>", "namespace": ..., "name": "<pod>",
         "driver": ..., "pool": "<node>", "devices": [{"uuid": "GPU-...", "device": "gpu-2"}],
         "pods": [{"namespace": ..., "name": "<pod>", "uid": "<pod UID>",
                   "containers": ["<container>"]}]}

    ``devices`` names each GPU of the entry as ``devices`` (the node's, :func:`node_devices`)
    does (``gpu-<index>``);
    ``containers`` is empty when the pod has fewer containers than entries. ``None`` when the
    plan has no claim directory (a whole GPU: no limits file, no region)."""
    if plan.limits_text is None:
        return None
    meta = pending.pod.get("metadata") or {}
    names = {d.record.gpu.uuid: n for n, d in devices.items()}
    return {
        "version": 1,
        "uid": plan.ref.uid,
        "namespace": plan.ref.namespace,
        "name": plan.ref.name,
        "driver": layout.driver,
        "pool": node,
        "devices": [{"uuid": d.uuid, "device": names.get(d.uuid, "")} for d in pending.devices],
        "pods": [
            {
                "namespace": str(meta.get("namespace", "")),
                "name": str(meta.get("name", "")),
                "uid": str(meta.get("uid", "")),
                "containers": [pending.container] if pending.container else [],
            }
        ],
    }


def claim_meta_path(plan: ClaimPlan, layout: Layout) -> str:
    """Where :func:`claim_meta` goes: ``<state-dir>/claims/<uid>/claim.json``."""
    return str(layout.claim_dir(plan.ref.uid) / META_FILE)
