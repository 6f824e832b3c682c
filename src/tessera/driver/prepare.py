"""NodePrepareResources for one claim: from its allocation to the files a container gets.

:func:`plan_claim` is pure: it reads the ResourceClaim's ``status.allocation``, keeps the
results of this driver in this node's pool, checks them against the node's GPUs and computes
everything prepare writes (a :class:`ClaimPlan`): the limits file text, the usage region's
GPU table and the CDI spec. :func:`materialize` writes a plan's files, each atomically
(temporary file + rename), and :func:`remove_files` takes them away; both are idempotent.

Per result (``status.allocation.devices.results[]``, KEP-4381 / KEP-5075):

* another driver's result is ignored (a claim may hold devices of several drivers); a claim
  with no result of this driver, or whose results of this driver are in another pool (another
  node), is an error for that claim;
* the device must be one of this node's published devices (``gpu-<index>``, a static MIG
  device ``gpu-<index>-mig-<gi>-<ci>``, a dynamic-MIG placement ``gpu-<index>-mig-<profile>-<start>``);
* ``consumedCapacity`` may only name ``memory`` (bytes, at most the device's memory) and
  ``cores`` (0..100); anything else is an error for the claim;
* ``adminAccess: true`` gets the device and no limits;
* a whole device (its full memory and ``cores`` 0 or 100, or a dedicated device without
  ``shareID``: every MIG instance) gets no limits;
* otherwise the device gets ``memory`` bytes and ``cores`` percent in the limits file, under
  the UUID the container sees (a GPU's, or a MIG device's: the whole dynamic-MIG GPU that
  claims share is one MIG instance), with the compute policy its request's opaque
  configuration selects (:func:`compute_policies`; ``strict`` by default).

A claim with at least one limited device gets the limits file (read-only at
``/etc/tessera/limits``; its whole and ``adminAccess`` devices are listed there as
``unlimited``, since the library refuses a GPU the file does not name), its usage region
(read-write), the enforcement library and an ``/etc/ld.so.preload`` naming it. Every claim
gets its devices' nodes (a GPU's
``/dev/nvidia<minor>``; for a MIG device also its two ``/dev/nvidia-caps`` nodes), the control
device nodes that exist, and ``NVIDIA_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES`` listing the
UUIDs it sees (MIG UUIDs for MIG devices) in result order.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera import CONFIG_API_VERSION, CONFIG_KIND
from tessera.api.quantity import Quantity, QuantityError
from tessera.enforcement._files import write_atomic
from tessera.enforcement.layout import (
    CONTAINER_DRIVER_DIR,
    CONTAINER_LIBRARY_DIR,
    CONTAINER_REGION,
    CONTAINER_SHARES,
    DRIVER_DIR,
    LD_SO_PRELOAD,
    LIMITS_FILE,
    PRELOAD_FILE,
    REGION_FILE,
    SHARES_SUBDIR,
    claim_dir,
)
from tessera.enforcement.library import LibraryError, library_formats
from tessera.enforcement.limits import (
    DEFAULT_CONTEXT_OVERHEAD,
    LIMITS_PATH,
    MAX_UNLIMITED,
    POLICIES,
    GpuLimit,
    Limits,
    format_limits,
    new_statements,
    normalise_uuid,
    parse_limits,
    required_version,
)
from tessera.enforcement.region import FILE_SIZE, MAGIC, create_region
from tessera.enforcement.shares import gpu_shares, write_shares
from tessera.inventory.mig import MigPlacement, mig_placement
from tessera.inventory.model import MigDevice

from .backend import DRIVER_NATIVE, LIBRARY
from .kubelet import ClaimRef, PreparedDevice
from .mig import MIG_MINORS, MigSlot, mig_cap_nodes
from .publish import GpuRecord

CDI_VERSION = "0.6.0"
CDI_CLASS = "claim"
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
MIB = 1 << 20


class ClaimError(Exception):
    """Why one claim cannot be prepared (one line; it becomes that claim's gRPC ``error``)."""


@dataclass(frozen=True)
class Layout:
    """Where prepare puts things on the host, and what it mounts from there.

    ``state_dir``: the driver's state (``claims/<uid>/{limits,region}``, ``ld.so.preload``,
    checkpoint); ``cdi_dir``: the CDI spec directory the runtime reads (``/var/run/cdi``);
    ``dev_root``: the host directory holding ``dev/nvidia*`` (``/``; a CPU-only test node
    points it at stand-in device nodes); ``library``: host path of ``libtessera-enforce.so``;
    ``driver_root``: the NVIDIA driver root for ``nvidia-cdi-hook``; ``cdi_hook``: its path;
    ``nvidia_cdi_kind``: when set (``nvidia.com/gpu``), each GPU device also gets the CDI id
    ``<kind>=<UUID>`` so NVIDIA's own spec (``nvidia-ctk cdi generate
    --device-name-strategy=uuid``) injects the driver's user-space libraries; ``mig_minors``:
    the NVIDIA driver's list of MIG capability devices (``/proc/driver/nvidia-caps/mig-minors``);
    ``context_overhead``: the bytes each CUDA context is charged of a share's ``memory``, written
    into every limits file (``context-overhead``; :data:`~tessera.enforcement.limits.DEFAULT_CONTEXT_OVERHEAD`).
    """

    state_dir: Path
    cdi_dir: Path
    dev_root: Path
    library: Path | None
    driver: str
    driver_root: str = "/"
    cdi_hook: str | None = None
    nvidia_cdi_kind: str | None = None
    mig_minors: Path = MIG_MINORS
    context_overhead: int = DEFAULT_CONTEXT_OVERHEAD

    def claim_dir(self, uid: str) -> Path:
        return claim_dir(self.state_dir, uid)

    def cdi_path(self, uid: str) -> Path:
        # Transient per-claim spec: <vendor>-<class>_<id>.json (CDI naming convention).
        return self.cdi_dir / f"{self.driver}-{CDI_CLASS}_{uid}.json"

    @property
    def preload_file(self) -> Path:
        return self.state_dir / PRELOAD_FILE

    @property
    def shares_dir(self) -> Path:
        """The node's per-GPU shares files (:mod:`tessera.enforcement.shares`)."""
        return self.state_dir / SHARES_SUBDIR

    @property
    def cdi_kind(self) -> str:
        return f"{self.driver}/{CDI_CLASS}"


@dataclass(frozen=True)
class ClaimPlan:
    """Everything prepare writes for one claim, and what it answers the kubelet.

    ``limits_text`` is ``None`` when no GPU of the claim is limited; ``region_gpus`` lists
    ``(uuid, memory bytes, cores)`` for the region; ``cdi_spec`` is the spec's JSON object;
    ``status`` the ``status.devices`` entries to publish; ``digest`` a SHA-256 of all of it;
    ``mig`` the dynamic-MIG instances the claim uses (:class:`~.mig.MigSlot`).
    """

    ref: ClaimRef
    backend: str
    devices: tuple[PreparedDevice, ...]
    limits_text: str | None
    region_gpus: tuple[tuple[str, int, int], ...]
    cdi_spec: dict[str, Any]
    status: tuple[dict[str, Any], ...] = ()
    digest: str = field(default="")
    mig: tuple[MigSlot, ...] = ()

    @property
    def pending(self) -> bool:
        """A dynamic-MIG instance of the claim is not made yet: nothing to write or answer."""
        return any(not s.made for s in self.mig)

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.ref.namespace,
            "name": self.ref.name,
            "uid": self.ref.uid,
            "backend": self.backend,
            "devices": [
                {
                    "requestNames": list(d.request_names),
                    "pool": d.pool,
                    "device": d.device,
                    "cdiDeviceIDs": list(d.cdi_device_ids),
                    "shareID": d.share_id,
                }
                for d in self.devices
            ],
            "limits": self.limits_text,
            "regionGPUs": [list(g) for g in self.region_gpus],
            "cdiSpec": self.cdi_spec,
            "status": list(self.status),
            "digest": self.digest,
            **({"mig": [m.to_json() for m in self.mig]} if self.mig else {}),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ClaimPlan:
        return cls(
            ref=ClaimRef(d["namespace"], d["name"], d["uid"]),
            backend=d["backend"],
            devices=tuple(
                PreparedDevice(
                    tuple(x["requestNames"]),
                    x["pool"],
                    x["device"],
                    tuple(x["cdiDeviceIDs"]),
                    x.get("shareID"),
                )
                for x in d["devices"]
            ),
            limits_text=d["limits"],
            region_gpus=tuple((str(g[0]), int(g[1]), int(g[2])) for g in d["regionGPUs"]),
            cdi_spec=d["cdiSpec"],
            status=tuple(d.get("status") or ()),
            digest=d["digest"],
            mig=tuple(MigSlot.from_json(m) for m in d.get("mig") or ()),
        )


def _digest(plan: ClaimPlan) -> str:
    body = plan.to_json()
    body.pop("digest")
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def compute_policies(alloc: Mapping[str, Any], driver: str, what: str) -> dict[str, str]:
    """The compute policy of each request, from ``status.allocation.devices.config`` (KEP-4381
    opaque device configuration: the DeviceClass's entries first, then the claim's; a later
    entry overrides an earlier one; an entry without ``requests`` applies to every request).

    Returns ``{request name: policy}``, ``""`` for every request an entry without
    ``requests`` covers. A parameter object is ``{"apiVersion": "gpu.tessera.dev/v1alpha1",
    "kind": "ComputeConfig", "policy": "strict" | "work-conserving"}``. Other drivers'
    entries are ignored. Raises :class:`ClaimError` naming the entry and field.
    """
    out: dict[str, str] = {}
    for i, c in enumerate((alloc.get("devices") or {}).get("config") or []):
        opaque = c.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        where = f"{what}: status.allocation.devices.config[{i}].opaque.parameters"
        p = opaque.get("parameters")
        if not isinstance(p, Mapping):
            raise ClaimError(f"{where}: expected an object with apiVersion {CONFIG_API_VERSION}")
        if p.get("apiVersion") != CONFIG_API_VERSION or p.get("kind") != CONFIG_KIND:
            raise ClaimError(
                f"{where}: apiVersion/kind is {p.get('apiVersion')!r}/{p.get('kind')!r}; "
                f"write apiVersion {CONFIG_API_VERSION}, kind {CONFIG_KIND}"
            )
        extra = sorted(set(p) - {"apiVersion", "kind", "policy"})
        if extra:
            raise ClaimError(f"{where}: unknown field(s) {', '.join(extra)} (it has policy)")
        value = p.get("policy", POLICIES[0])
        if value not in POLICIES:
            raise ClaimError(f"{where}.policy: {value!r} is not one of {', '.join(POLICIES)}")
        policy = str(value)
        for req in c.get("requests") or [""]:
            if req == "":
                out = dict.fromkeys(out, policy)
            out[str(req).split("/", 1)[0]] = policy
    return out


def _bytes(value: Any, where: str) -> int:
    try:
        q = Quantity.parse(value)
    except QuantityError as e:
        raise ClaimError(f"{where}: {e}") from e
    if not q.is_integer() or q.sign() < 0:
        raise ClaimError(f"{where}: {value!r} is not a whole, non-negative number")
    return q.value_int()


@dataclass(frozen=True)
class NodeDevice:
    """A published device of this node, as prepare needs it: ``name``; ``record``, the GPU (a
    MIG device's parent); ``memory``, the bytes of its ``memory`` capacity (None: it publishes
    none, a unified-memory GPU); ``mig``, the existing MIG device it is (static MIG);
    ``placement``, the instance to create for it (dynamic MIG, :func:`mig_placement`);
    ``shareable``, published with ``allowMultipleAllocations`` (KEP-5075: claims share it, each
    allocation has a ``shareID`` and a ``consumedCapacity``)."""

    name: str
    record: GpuRecord
    memory: int | None
    mig: MigDevice | None = None
    placement: MigPlacement | None = None
    shareable: bool = False


def node_devices(
    records: Sequence[GpuRecord], slices: Iterable[Mapping[str, Any]]
) -> dict[str, NodeDevice]:
    """``{device name: NodeDevice}`` for the devices of ``slices`` (as the node publishes them)
    whose GPU is one of ``records``."""
    by_uuid = {r.gpu.uuid: r for r in records}
    out: dict[str, NodeDevice] = {}
    for s in slices:
        for d in (s.get("spec") or {}).get("devices") or []:
            attrs = d.get("attributes") or {}
            parent = (attrs.get("parentUUID") or attrs.get("uuid") or {}).get("string")
            rec = by_uuid.get(parent or "")
            if rec is None:
                continue
            cap = ((d.get("capacity") or {}).get("memory") or {}).get("value")
            memory = Quantity.parse(cap).value_int() if cap is not None else None
            mig: MigDevice | None = None
            gi, ci = (
                (attrs.get("gpuInstanceID") or {}).get("int"),
                (attrs.get("computeInstanceID") or {}).get("int"),
            )
            if gi is not None and ci is not None:
                mig = next(
                    (
                        m
                        for m in rec.gpu.mig_devices
                        if (m.gpu_instance_id, m.compute_instance_id) == (gi, ci)
                    ),
                    None,
                )
            out[d["name"]] = NodeDevice(
                d["name"],
                rec,
                memory,
                mig,
                mig_placement(d),
                bool(d.get("allowMultipleAllocations")),
            )
    return out


#: Where the schedulers whose allocations prepare can enforce are listed.
SCHEDULERS_DOC = "docs/driver.md, 'Schedulers'"


def check_sharing(
    result: Mapping[str, Any], dev: NodeDevice, where: str, thing: str, driver: str
) -> None:
    """Refuse an allocation result that prepare could not enforce as allocated (KEP-5075).

    A device published with ``allowMultipleAllocations`` is shared: an allocator with
    consumable capacity (``DRAConsumableCapacity``) gives every result on it a ``shareID`` and
    a ``consumedCapacity`` listing each capacity. A result without them comes from an allocator
    with the upstream stable feature set (KAI up to v0.17), which counts the device as free
    while other claims hold shares of it: preparing it whole would hand out a GPU that is not
    this claim's, so it is refused. A ``shareID`` or ``consumedCapacity`` on a device published
    dedicated now means the claim was allocated from a slice this driver no longer publishes
    (the GPU went into MIG mode, the dynamic-MIG setting changed): refused too. An
    ``adminAccess`` result is exempt (it gets the device without limits by design).

    ``where``: the result's field path; ``thing``: the device as errors name it. Raises
    :class:`ClaimError`.
    """
    if result.get("adminAccess"):
        return
    share = result.get("shareID")
    consumed = result.get("consumedCapacity") or {}
    if dev.shareable:
        if share is None:
            raise ClaimError(
                f"{where}.shareID: missing, but {dev.name} ({thing}) is shared (published with "
                "allowMultipleAllocations): the allocation was made without consumable capacity "
                "(DRAConsumableCapacity; e.g. KAI up to v0.17), which does not count the other "
                "claims' shares of this GPU; refused rather than prepared whole. Allocate it with "
                f"a scheduler that has consumable capacity ({SCHEDULERS_DOC})"
            )
        keys = {k.split("/", 1)[1] if k.startswith(driver + "/") else k for k in consumed}
        if dev.memory is not None and "memory" not in keys:
            raise ClaimError(
                f"{where}.consumedCapacity: has no memory for share {share} of {dev.name} "
                f"({thing}): an allocator with consumable capacity lists every capacity of a "
                "shared device; refused rather than prepared with all of its memory "
                f"({SCHEDULERS_DOC})"
            )
    elif share is not None or consumed:
        what = "shareID" if share is not None else "consumedCapacity"
        raise ClaimError(
            f"{where}.{what}: {dev.name} ({thing}) is not shared in the ResourceSlice this node "
            "publishes now: the claim was allocated from a version of it this driver no longer "
            "publishes; delete the claim (and its pod) so that it is allocated again"
        )


def _results_here(
    claim: Mapping[str, Any], ref: ClaimRef, node: str, driver: str, what: str
) -> tuple[Mapping[str, Any], list[tuple[int, Mapping[str, Any]]]]:
    """The claim's ``status.allocation`` and its results of ``driver`` on ``node``, each with
    its index in ``status.allocation.devices.results``. Raises :class:`ClaimError` when the
    claim is not the one the kubelet asked for (UID), not allocated, or has no such result."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise ClaimError(
            f"{what}: uid is {meta.get('uid')!r}, the kubelet asked for {ref.uid!r}: the claim was replaced"
        )
    alloc = (claim.get("status") or {}).get("allocation")
    if not alloc:
        raise ClaimError(f"{what}: status.allocation is empty: the claim is not allocated")
    results = ((alloc.get("devices") or {}).get("results")) or []
    ours = [(i, r) for i, r in enumerate(results) if r.get("driver") == driver]
    if not ours:
        drivers = sorted({str(r.get("driver")) for r in results})
        raise ClaimError(
            f"{what}: status.allocation.devices.results has no result of driver {driver} (drivers: "
            f"{', '.join(drivers) or 'none'})"
        )
    here = [(i, r) for i, r in ours if r.get("pool") == node]
    if not here:
        pools = sorted({str(r.get("pool")) for _, r in ours})
        raise ClaimError(
            f"{what}: allocated to pool(s) {', '.join(pools)}, not to this node {node!r}"
        )
    return alloc, here


def _consumed(
    consumed: Mapping[str, Any],
    full: int | None,
    driver: str,
    field_path: str,
    thing: str,
    gpu_uuid: str,
) -> tuple[int, int]:
    """``(memory bytes, cores percent)`` a result's ``consumedCapacity`` (KEP-5075) books on a
    device of ``full`` bytes (None: a unified-memory GPU, published whole without a memory
    capacity): the whole memory and 0 cores where it names none. Raises :class:`ClaimError`
    naming ``field_path`` for an amount outside the device or a capacity it does not have."""
    mem = full or 0
    cores = 0
    for cap, value in consumed.items():
        key = cap.split("/", 1)[1] if cap.startswith(driver + "/") else cap
        if key == "memory" and full is None:
            raise ClaimError(
                f"{field_path}.consumedCapacity: 'memory' is not a capacity of GPU {gpu_uuid} (unified "
                "memory: it is published whole)"
            )
        if key == "memory":
            mem = _bytes(value, f"{field_path}.consumedCapacity.memory")
            if mem < 1 or mem > (full or 0):
                raise ClaimError(
                    f"{field_path}.consumedCapacity.memory: {value} is outside 1..{full} bytes, the memory "
                    f"of {thing}"
                )
        elif key == "cores":
            cores = _bytes(value, f"{field_path}.consumedCapacity.cores")
            if cores > 100:
                raise ClaimError(f"{field_path}.consumedCapacity.cores: {value} is above 100")
        else:
            raise ClaimError(
                f"{field_path}.consumedCapacity: {cap!r} is not a capacity of {thing} (it has memory and cores)"
            )
    return mem, cores


def plan_claim(
    claim: Mapping[str, Any],
    ref: ClaimRef,
    node: str,
    devices: Mapping[str, NodeDevice],
    backend: str,
    layout: Layout,
    *,
    mig_minors: Mapping[str, int] | None = None,
    instances: Mapping[tuple[str, str, int], MigSlot] | None = None,
) -> ClaimPlan:
    """The plan for ``claim`` (a ``resource.k8s.io/v1`` ResourceClaim dict as the API server
    returned it) on ``node``, whose published devices are ``devices`` (:func:`node_devices`).

    MIG devices: a static one is handed out as itself (its MIG UUID, the parent's device node
    and its two capability nodes from ``mig_minors``, :func:`~.mig.read_mig_minors`); a
    dynamic one needs its instance (:class:`~.mig.MigSlot`): with ``instances`` (made slots by
    :attr:`~.mig.MigSlot.key`) missing it, the plan lists its slots in ``mig`` and is
    :attr:`ClaimPlan.pending` (no files, no answer): the caller makes the instances and plans
    again with them. A share of a MIG device is limited under its MIG UUID.

    Raises :class:`ClaimError` with a one-line reason naming the claim and field.
    """
    what = f"ResourceClaim {ref.namespace}/{ref.name}"
    driver = layout.driver
    alloc, here = _results_here(claim, ref, node, driver, what)
    policies = compute_policies(alloc, driver, what)
    prepared: list[PreparedDevice] = []
    limits: dict[str, GpuLimit] = {}
    unlimited: list[str] = []  # whole and adminAccess devices: the claim's, not limited
    visible_order: list[str] = []
    status: list[dict[str, Any]] = []
    per_device_nodes: list[tuple[str, list[str]]] = []
    slots: dict[tuple[str, str, int], MigSlot] = {}
    mig_limited = False
    for i, r in here:
        field_path = f"{what}: status.allocation.devices.results[{i}]"
        name = str(r.get("device"))
        dev = devices.get(name)
        if dev is None:
            raise ClaimError(
                f"{field_path}.device: {name!r} is not a device of node {node} (devices: "
                f"{', '.join(sorted(devices)) or 'none'}): "
                "allocated from a ResourceSlice this driver no longer publishes; delete the claim "
                "(and its pod) so that it is allocated again"
            )
        rec = dev.record
        if rec.health == "missing":
            raise ClaimError(
                f"{field_path}.device: GPU {rec.gpu.uuid} ({name}) is gone from this node"
            )
        gpu = rec.gpu
        is_mig = dev.mig is not None or dev.placement is not None
        thing = f"MIG device {name} of GPU {gpu.uuid}" if is_mig else f"GPU {gpu.uuid}"
        consumed = r.get("consumedCapacity") or {}
        check_sharing(r, dev, field_path, thing, driver)
        full = dev.memory
        mem, cores = _consumed(consumed, full, driver, field_path, thing, gpu.uuid)
        # Which device the container sees: the GPU, an existing MIG device, or the instance
        # made for this placement (None until it is made).
        visible: str | None = gpu.uuid
        gi_ci: tuple[int, int] | None = None
        if dev.placement is not None:
            slot = MigSlot.of(name, dev.placement)
            made = (instances or {}).get(slot.key)
            slots.setdefault(slot.key, made or slot)
            visible = made.uuid if made is not None else None
            if made is not None and made.gi is not None and made.ci is not None:
                gi_ci = (made.gi, made.ci)
        elif dev.mig is not None:
            m = dev.mig
            visible = m.uuid or f"MIG-{gpu.uuid}/{m.gpu_instance_id}/{m.compute_instance_id}"
            gi_ci = (m.gpu_instance_id, m.compute_instance_id)
        admin = bool(r.get("adminAccess"))
        share = r.get("shareID")
        whole = share is None or full is None or (mem >= full and cores in (0, 100))
        request = str(r.get("request", ""))
        cdi_name = f"{ref.uid}-{i}-{name}"
        ids = [f"{layout.cdi_kind}={cdi_name}"]
        if layout.nvidia_cdi_kind:
            # NVIDIA's spec (nvidia-ctk cdi generate) names existing MIG devices by their UUID;
            # an instance made now is not in it: its parent GPU's entry brings the libraries.
            ids.append(
                f"{layout.nvidia_cdi_kind}={gpu.uuid if dev.placement is not None else visible}"
            )
        prepared.append(
            PreparedDevice(
                request_names=(request.split("/", 1)[0],),
                pool=node,
                device=name,
                cdi_device_ids=tuple(ids),
                share_id=share,
            )
        )
        if visible is None:
            continue  # planned again once the instance exists
        nodes: list[str] = [f"nvidia{rec.minor}"] if rec.minor is not None else []
        if gi_ci is not None and rec.minor is not None:
            try:
                nodes += list(mig_cap_nodes(mig_minors or {}, rec.minor, *gi_ci))
            except KeyError as e:
                raise ClaimError(
                    f"{field_path}.device: {name}: {layout.mig_minors} has no {e.args[0]} (the NVIDIA "
                    "driver's MIG capability devices: is its nvidia-caps support loaded?)"
                ) from None
        per_device_nodes.append((cdi_name, nodes))
        if visible not in visible_order:
            visible_order.append(visible)
        limited = not admin and not whole
        if limited:
            prev = limits.get(visible)
            req = request.split("/", 1)[0]
            policy = policies.get(req, policies.get("", POLICIES[0]))
            # Two shares of one device in one claim: the container may use both (strict if
            # either is).
            limits[visible] = GpuLimit(
                visible,
                mem + (prev.memory if prev else 0),
                min(100, cores + (prev.cores if prev else 0)),
                POLICIES[0] if prev and POLICIES[0] in (prev.policy, policy) else policy,
            )
            mig_limited = mig_limited or is_mig
        elif visible not in unlimited:
            unlimited.append(visible)
        claim_backend = backend if limited else "none"
        data: dict[str, Any] = {"enforcementBackend": claim_backend, "uuid": visible}
        if is_mig:
            data["parentUUID"] = gpu.uuid
        if limited:
            data.update({"memory": str(mem), "cores": cores, "limitsFile": LIMITS_PATH})
        entry: dict[str, Any] = {"driver": driver, "pool": node, "device": name, "data": data}
        if share:
            entry["shareID"] = share
        status.append(entry)

    mig = tuple(slots.values())
    if any(not s.made for s in mig):
        return ClaimPlan(
            ref=ref,
            backend=backend,
            devices=tuple(prepared),
            limits_text=None,
            region_gpus=(),
            cdi_spec={},
            mig=mig,
        )
    gpu_limits = tuple(limits.values())
    claim_backend = backend
    if backend == DRIVER_NATIVE and (len({g.memory for g in gpu_limits}) > 1 or mig_limited):
        # NVIDIA's hook takes one memory value for every GPU of the container, and NVIDIA's
        # per-cgroup memory limits do not apply to MIG devices.
        claim_backend = LIBRARY
        for st in status:
            if st["data"]["enforcementBackend"] == DRIVER_NATIVE:
                st["data"]["enforcementBackend"] = LIBRARY
    limits_text = None
    if gpu_limits:
        value = Limits(
            region=CONTAINER_REGION,
            gpus=gpu_limits,
            # each CUDA context is charged this much of the share's memory
            context_overhead=layout.context_overhead,
            claim=f"{ref.namespace}/{ref.name}",
            claim_uid=ref.uid,
            shares=CONTAINER_SHARES,
            # The library refuses a visible GPU in no line of the file (a second claim's):
            # the claim's own whole devices are listed. A MIG name without a UUID form is
            # left out (the library could not match it anyway).
            unlimited=tuple(
                u for u in unlimited if u not in limits and normalise_uuid(u) is not None
            )[:MAX_UNLIMITED],
        )
        limits_text = format_limits(value)
    spec = _cdi_spec(ref, layout, visible_order, per_device_nodes, gpu_limits, claim_backend)
    plan = ClaimPlan(
        ref=ref,
        backend=claim_backend if gpu_limits else "none",
        devices=tuple(prepared),
        limits_text=limits_text,
        region_gpus=tuple((g.uuid, g.memory, g.cores) for g in gpu_limits),
        cdi_spec=spec,
        status=tuple(status),
        mig=mig,
    )
    return ClaimPlan(**{**plan.__dict__, "digest": _digest(plan)})


def check_library_reads(plan: ClaimPlan, layout: Layout) -> None:
    """Refuse a plan whose limits file the node's enforcement library (``layout.library``)
    could not read: the container would get a file its library refuses, and fail closed at its
    first CUDA call. The file is in the lowest version that expresses the claim
    (:func:`~tessera.enforcement.limits.required_version`); what the library reads comes from
    its file (:func:`~tessera.enforcement.library.library_formats`, read again whenever the
    file changed: another driver instance's start may have replaced it). Nothing to check for a
    plan without limits or a layout without a library.

    Raises :class:`ClaimError` naming the claim, the statement that needs the newer version,
    the library's path and the versions it reads, and the fix; or naming the library when it
    cannot be read.
    """
    if plan.limits_text is None or layout.library is None:
        return
    what = f"ResourceClaim {plan.ref.namespace}/{plan.ref.name}"
    try:
        formats = library_formats(layout.library)
    except OSError as e:
        raise ClaimError(
            f"{what}: cannot read the enforcement library {layout.library} "
            f"({e.strerror or e}): is --library the file the chart installs?"
        ) from e
    except LibraryError as e:
        raise ClaimError(f"{what}: {e}") from e
    limits = _parsed_limits(plan.limits_text)
    need = required_version(limits)
    if need in formats.limits:
        return
    statements = ", ".join(f"'{s}'" for s in new_statements(limits, formats.limits[-1]))
    raise ClaimError(
        f"{what}: its limits file needs version {need} for its {statements} line(s) (the "
        "claim's whole or adminAccess devices beside a share), but the enforcement library "
        f"{formats.path} reads {formats.describe()}; upgrade the node's enforcement library to "
        "this driver's (the chart's init container installs it at start; docs/install.md, "
        "'Supported skew')"
    )


def _cdi_spec(
    ref: ClaimRef,
    layout: Layout,
    visible: Sequence[str],
    device_nodes: Sequence[tuple[str, list[str]]],
    limits: Sequence[GpuLimit],
    backend: str,
) -> dict[str, Any]:
    uuids = ",".join(visible)
    edits: dict[str, Any] = {
        "env": [f"NVIDIA_VISIBLE_DEVICES={uuids}", f"CUDA_VISIBLE_DEVICES={uuids}"],
    }
    ctl = [
        {"path": f"/dev/{n}", "hostPath": str(layout.dev_root / "dev" / n)}
        for n in CONTROL_DEVICES
        if (layout.dev_root / "dev" / n).exists()
    ]
    if ctl:
        edits["deviceNodes"] = ctl
    if limits:
        cdir = layout.claim_dir(ref.uid)
        mounts = [
            {
                "hostPath": str(cdir / LIMITS_FILE),
                "containerPath": LIMITS_PATH,
                "type": "bind",
                "options": ["ro", "nosuid", "nodev", "bind"],
            },
            {
                "hostPath": str(cdir / REGION_FILE),
                "containerPath": CONTAINER_REGION,
                "type": "bind",
                "options": ["rw", "nosuid", "nodev", "bind"],
            },
            # what the claim holds beyond its charges, by NVML's per-process figures: written
            # only by this driver (NodeDriver.reconcile), read-only in the container; a
            # directory, so that a replaced file is seen there
            {
                "hostPath": str(cdir / DRIVER_DIR),
                "containerPath": CONTAINER_DRIVER_DIR,
                "type": "bind",
                "options": ["ro", "nosuid", "nodev", "bind"],
            },
            {  # the node's per-GPU shares, which best-effort tenants are held to
                "hostPath": str(layout.shares_dir),
                "containerPath": CONTAINER_SHARES,
                "type": "bind",
                "options": ["ro", "nosuid", "nodev", "noexec", "bind"],
            },
        ]
        if layout.library is not None:
            lib_in = f"{CONTAINER_LIBRARY_DIR}/{layout.library.name}"
            mounts += [
                {
                    "hostPath": str(layout.library),
                    "containerPath": lib_in,
                    "type": "bind",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                },
                {
                    "hostPath": str(layout.preload_file),
                    "containerPath": LD_SO_PRELOAD,
                    "type": "bind",
                    "options": ["ro", "nosuid", "nodev", "bind"],
                },
            ]
        edits["mounts"] = mounts
        edits["env"].append(f"TESSERA_ENFORCEMENT_BACKEND={backend}")
        if backend == DRIVER_NATIVE and layout.cdi_hook:
            mib = max(1, limits[0].memory // MIB)
            edits["env"] += [f"NVIDIA_GPU_MEMORY_REQUEST={mib}", f"NVIDIA_GPU_MEMORY_LIMIT={mib}"]
            args = [
                "nvidia-cdi-hook",
                "apply-cuda-memory-limits",
                "--driver-root",
                layout.driver_root,
            ]
            for g in limits:
                args += ["--gpu-id", g.uuid]
            edits["hooks"] = [{"hookName": "createRuntime", "path": layout.cdi_hook, "args": args}]
    devices = []
    for name, nodes in device_nodes:
        dev_edits: dict[str, Any] = {}
        if nodes:
            dev_edits["deviceNodes"] = [
                {"path": f"/dev/{n}", "hostPath": str(layout.dev_root / "dev" / n)} for n in nodes
            ]
        else:
            dev_edits["env"] = [f"TESSERA_DEVICE={name}"]  # CDI needs at least one edit
        devices.append({"name": name, "containerEdits": dev_edits})
    return {
        "cdiVersion": CDI_VERSION,
        "kind": layout.cdi_kind,
        "annotations": {
            "tessera.dev/claim": f"{ref.namespace}/{ref.name}",
            "tessera.dev/claim-uid": ref.uid,
        },
        "devices": devices,
        "containerEdits": edits,
    }


def plan_stale(
    plan: ClaimPlan, gpus: Mapping[str, tuple[int | None, frozenset[str]]]
) -> str | None:
    """Why a recorded (checkpointed) plan no longer matches the node, or None when it does.

    ``gpus``: the GPUs NVML lists now, ``{GPU UUID: (device minor, UUIDs of its MIG devices)}``.
    A plan is stale when a GPU it hands out is gone (vanished, or replaced by another UUID), when
    its GPU's device node moved (another minor after a reboot: the CDI spec names the old
    ``/dev/nvidia<N>``), or when a MIG device it names does not exist (dynamic instances are gone
    after a reboot; the recorded MIG UUID would be stale: NVIDIA's DRA driver #951). Each
    reason is one line naming the device and what changed.
    """
    gpu_of: dict[str, str] = {}
    for e in plan.status:
        data = e.get("data") or {}
        device = str(e.get("device"))
        gpu = str(data.get("parentUUID") or data.get("uuid") or "")
        gpu_of[device] = gpu
        if gpu not in gpus:
            return f"GPU {gpu} ({device}) is gone from this node"
        mig = str(data.get("uuid") or "")
        # (a MIG name without a UUID, GPU/gi/ci, cannot be checked)
        if data.get("parentUUID") and "/" not in mig and mig not in gpus[gpu][1]:
            return (
                f"MIG device {data.get('uuid')} ({device} of GPU {gpu}) no longer exists "
                "(its instance was destroyed, e.g. by a reboot)"
            )
    prefix = f"{plan.ref.uid}-"
    for d in plan.cdi_spec.get("devices") or []:
        name = str(d.get("name", ""))
        device = name[len(prefix) :].split("-", 1)[-1] if name.startswith(prefix) else ""
        owner = gpu_of.get(device)
        if owner is None:
            continue
        minor = gpus[owner][0]
        for n in (d.get("containerEdits") or {}).get("deviceNodes") or []:
            tail = str(n.get("path", "")).removeprefix("/dev/nvidia")
            if tail.isdigit() and minor is not None and int(tail) != minor:
                return (
                    f"GPU {owner} ({device}) is /dev/nvidia{minor} now, not /dev/nvidia{tail} as "
                    "recorded (its index moved)"
                )
    return None


def _region_ok(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
        return (
            len(head) == 8
            and int.from_bytes(head, "little") == MAGIC
            and path.stat().st_size == FILE_SIZE
        )
    except OSError:
        return False


def cdi_bytes(spec: Mapping[str, Any]) -> bytes:
    """The CDI spec file's bytes: compact JSON (C encoder), keys sorted, one final newline."""
    return (json.dumps(spec, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _directory(path: Path, mode: int = 0o777) -> None:
    """Make directory ``path`` (and its parents) unless it exists: one ``stat`` when it does.
    Raises ``OSError``."""
    if not os.path.isdir(path):
        path.mkdir(mode=mode, parents=True, exist_ok=True)


def _new_directory(path: str) -> bool:
    """Make directory ``path`` (and its parents); True when it was made now, False when it
    existed. Raises ``OSError``."""
    try:
        os.mkdir(path)
    except FileExistsError:
        return False
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            os.mkdir(path)
        except FileExistsError:
            return False
    return True


def materialize(plan: ClaimPlan, layout: Layout) -> bool:
    """Write the plan's files that are missing or differ: usage region (kept when a valid one
    exists: processes may already use it), limits file (0444, the recorded text), CDI spec
    (last). Each write is atomic (not synced: the checkpoint, which is, can re-derive them);
    calling it again with the same plan changes nothing. Returns True when it wrote anything.
    Raises ``OSError``, and :class:`~tessera.enforcement.limits.LimitsError` before writing
    anything when the plan's limits text does not parse (a plan recorded by a newer driver,
    in a limits file version this one does not read)."""
    wrote = False
    if plan.limits_text is not None:
        data = plan.limits_text.encode("ascii")
        # The recorded text is written as it is (the version it was written in: a container of
        # the claim may have read it already), once the readers' parser accepts it.
        _parsed_limits(plan.limits_text)
        _directory(layout.shares_dir)  # mounted by the CDI spec
        cdir = str(layout.claim_dir(plan.ref.uid))
        # A claim directory made now holds nothing yet: its files need no looking at.
        fresh = _new_directory(cdir)
        if fresh:
            os.mkdir(os.path.join(cdir, DRIVER_DIR), 0o755)
        else:
            _directory(Path(cdir, DRIVER_DIR), 0o755)
        region = os.path.join(cdir, REGION_FILE)
        if fresh or not _region_ok(Path(region)):
            create_region(region, list(plan.region_gpus), sync=False)
            wrote = True
        limits = Path(cdir, LIMITS_FILE)
        if fresh or not (limits.is_file() and limits.read_bytes() == data):
            write_atomic(str(limits), data, 0o444, ".limits.", sync=False)
            wrote = True
    _directory(layout.cdi_dir)
    spec = cdi_bytes(plan.cdi_spec)
    path = layout.cdi_path(plan.ref.uid)
    if not (path.is_file() and path.read_bytes() == spec):
        # The temporary name has no .json/.yaml suffix: the runtime never loads a half spec.
        write_atomic(str(path), spec, 0o644, ".tessera-cdi.", sync=False)
        wrote = True
    return wrote


def write_node_shares(layout: Layout, plans: Iterable[ClaimPlan]) -> None:
    """Write the node's per-GPU shares files (:mod:`tessera.enforcement.shares`) from the
    limits of every prepared claim (``plans``), and remove those of GPUs no claim limits.
    Raises ``OSError``, and ``ValueError`` when a GPU's claims guarantee more than 100 cores."""
    write_shares(
        str(layout.shares_dir),
        gpu_shares(_parsed_limits(p.limits_text).gpus for p in plans if p.limits_text),
        sync=False,
    )


@functools.lru_cache(maxsize=4096)
def _parsed_limits(limits_text: str) -> Limits:
    """A plan's limits text parsed (once per text: every prepare checks its own and sums the
    shares of every prepared claim; :class:`Limits` is frozen, so one value serves all).
    Raises ``LimitsError``."""
    return parse_limits(limits_text)


def remove_files(uid: str, layout: Layout) -> None:
    """Remove a claim's CDI spec, then its limits file and region. Idempotent."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(layout.cdi_path(uid))
    shutil.rmtree(layout.claim_dir(uid), ignore_errors=True)


def write_preload(layout: Layout) -> None:
    """The host file mounted as the container's ``/etc/ld.so.preload``: one line naming the
    library's container path."""
    if layout.library is None:
        return
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    data = f"{CONTAINER_LIBRARY_DIR}/{layout.library.name}\n".encode()
    if not (layout.preload_file.is_file() and layout.preload_file.read_bytes() == data):
        write_atomic(str(layout.preload_file), data, 0o444, ".preload.")
