"""MIG on the node: the instances that allocated dynamic-MIG devices need, made and destroyed
through NVML, which of the node's instances are the driver's own, and the device nodes that
hand a MIG device to a container.

**Slots.** An allocated dynamic-MIG device (a profile placement, or the whole GPU that claims
share; :func:`tessera.inventory.mig.mig_placement`) needs one GPU instance at an exact placement
(GPU, GPU-instance profile, start memory slice) with one compute instance over all of it: a
:class:`MigSlot`. Before the driver creates anything for a claim it records the claim's slots in
its checkpoint (state ``preparing``); so every instance it makes sits at a placement a checkpoint
entry names (:func:`owned`: those placements are not published as static MIG devices). Right
after each creation step it records what NVML made in that entry (the GPU-instance id ``gi``,
then the compute-instance id ``ci`` with the MIG ``uuid``; one fsynced checkpoint write each,
before anything uses the instance). **An instance is the claim's own only when its placement
and the recorded ids match** (:func:`recorded`): only those are adopted after a crash or
destroyed. An instance at a recorded placement without a matching record - made by an operator
or MIG Manager, or by a driver killed between NVML's create and the record - is never
destroyed, reused or published: a prepare that needs the placement is refused, naming it and
the ``nvidia-smi`` commands that free it (:func:`unrecorded`). Inside a GPU instance whose id
is recorded, a compute instance that is not recorded (the kill between
``nvmlGpuInstanceCreateComputeInstance`` and its record) is destroyed and made again.

**NVML calls** (:class:`MigOps`): ``nvmlDeviceGetGpuInstanceProfileInfoV`` (the profile id of
the slot's ``NVML_GPU_INSTANCE_PROFILE_*``), ``nvmlDeviceGetGpuInstances`` +
``nvmlGpuInstanceGetInfo`` (find an instance at a placement), ``nvmlDeviceCreateGpuInstanceWith
Placement``, ``nvmlGpuInstanceGetComputeInstanceProfileInfoV`` +
``nvmlGpuInstanceCreateComputeInstance`` (one compute instance of the whole GPU instance),
``nvmlDeviceGetMigDeviceHandleByIndex`` (the new MIG device's UUID), and
``nvmlComputeInstanceDestroy`` then ``nvmlGpuInstanceDestroy``.

**Device nodes** (what NVIDIA's container toolkit gives a container for a MIG device,
``internal/platform-support/dgpu``): the parent GPU's ``/dev/nvidia<minor>`` and two capability
devices, ``/dev/nvidia-caps/nvidia-cap<N>`` for ``gpu<minor>/gi<GI>/access`` and for
``gpu<minor>/gi<GI>/ci<CI>/access``, with ``N`` read from
``/proc/driver/nvidia-caps/mig-minors`` (:func:`read_mig_minors`, :func:`mig_cap_nodes`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tessera.inventory.mig import MigPlacement

from .discovery import GpuInstance, NodeGPU, _gpu_instances, _s

if TYPE_CHECKING:
    from .checkpoint import ClaimEntry

#: Where the NVIDIA driver lists the MIG capability devices' minor numbers.
MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")


class MigError(Exception):
    """An NVML MIG operation failed; the message is one line naming the GPU and placement."""


@dataclass(frozen=True)
class MigSlot:
    """One MIG instance a claim needs: the allocated ``device`` (published name), its GPU
    (``gpu_uuid``, ``gpu_index``), the ``profile`` and placement (``start``, ``size`` in memory
    slices), the NVML constants to create it with (``gi_profile``, ``ci_profile``), ``shared``
    (the whole dynamic GPU: one instance for every claim sharing it), and once known the NVML
    GPU-instance ``profile_id`` and, once made, the instance: ``gi``, ``ci`` and the MIG ``uuid``.
    """

    device: str
    gpu_uuid: str
    gpu_index: int
    profile: str
    start: int
    size: int
    gi_profile: str
    ci_profile: str
    shared: bool = False
    profile_id: int | None = None
    gi: int | None = None
    ci: int | None = None
    uuid: str | None = None

    @classmethod
    def of(cls, device: str, p: MigPlacement) -> MigSlot:
        return cls(
            device,
            p.gpu_uuid,
            p.gpu_index,
            p.profile,
            p.start,
            p.size,
            p.gpu_instance_profile,
            p.compute_instance_profile,
            p.shared,
        )

    @property
    def key(self) -> tuple[str, str, int]:
        """``(GPU UUID, profile, start)``: the placement, the same for every claim sharing it."""
        return (self.gpu_uuid, self.profile, self.start)

    @property
    def made(self) -> bool:
        return self.uuid is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "gpuUUID": self.gpu_uuid,
            "gpuIndex": self.gpu_index,
            "profile": self.profile,
            "start": self.start,
            "size": self.size,
            "giProfile": self.gi_profile,
            "ciProfile": self.ci_profile,
            "shared": self.shared,
            "profileID": self.profile_id,
            "gi": self.gi,
            "ci": self.ci,
            "uuid": self.uuid,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MigSlot:
        return cls(
            d["device"],
            d["gpuUUID"],
            int(d["gpuIndex"]),
            d["profile"],
            int(d["start"]),
            int(d["size"]),
            d["giProfile"],
            d["ciProfile"],
            bool(d.get("shared")),
            d.get("profileID"),
            d.get("gi"),
            d.get("ci"),
            d.get("uuid"),
        )


def owned(entries: Iterable[ClaimEntry]) -> dict[str, set[tuple[int | None, int, int]]]:
    """``{GPU UUID: {(profile id, start, size)}}``: the placements of the driver's own
    instances, from its checkpoint entries (:attr:`.checkpoint.ClaimEntry.mig_slots`, any
    state; see the module doc)."""
    out: dict[str, set[tuple[int | None, int, int]]] = {}
    for e in entries:
        for s in e.mig_slots:
            out.setdefault(s.gpu_uuid, set()).add((s.profile_id, s.start, s.size))
    return out


def recorded(s: MigSlot, gi: GpuInstance, uuids: Mapping[int, str | None]) -> bool:
    """True when ``gi`` (a GPU instance at ``s``'s placement, :meth:`MigOps.find`; ``uuids``:
    the MIG UUID of each of its compute instances by id, None where NVML lists no MIG device)
    is the one ``s`` records: ``s.gi`` is its id and, when ``s`` records a compute instance,
    every compute instance in it is that one (its id and MIG UUID; none left is fine, an
    unprepare killed between the two destroys). When ``s`` records no compute instance, those
    in ``gi`` are taken for the ones a driver killed before their record made. The one test of
    "this instance is the claim's own": an instance at the placement that fails it is someone
    else's (or one a killed driver did not record) and is left alone."""
    if s.gi is None or gi.id != s.gi:
        return False
    return s.ci is None or all((c, u) == (s.ci, s.uuid) for c, u in uuids.items())


def unrecorded(s: MigSlot, gi: GpuInstance) -> str:
    """The one line refusing ``s``'s placement, held by ``gi`` that no record names as the
    claim's (:func:`recorded` is False): the device, GPU, memory slices, the GPU-instance and
    compute-instance ids, and the ``nvidia-smi`` commands that free it."""
    cis = [c[0] for c in gi.compute_instances]
    held = f"GPU instance {gi.id}" + (
        f" (compute instance{'s' if len(cis) > 1 else ''} {', '.join(map(str, cis))})"
        if cis
        else ""
    )
    fix = "; ".join(
        [f"nvidia-smi mig -i {s.gpu_index} -gi {gi.id} -ci {c} -dci" for c in cis]
        + [f"nvidia-smi mig -i {s.gpu_index} -gi {gi.id} -dgi"]
    )
    return (
        f"{s.device}: GPU {s.gpu_index} ({s.gpu_uuid}) {s.profile} at memory slices "
        f"{s.start}-{s.start + s.size - 1} is held by {held}, which the checkpoint does not "
        "record as this claim's (made by someone else, or by a driver killed before it recorded "
        f"it); it is left alone: destroy it ({fix}) or free the placement, and the next prepare "
        "makes the claim's own"
    )


def is_owned(
    gpu_uuid: str, gi: GpuInstance, mine: Mapping[str, set[tuple[int | None, int, int]]]
) -> bool:
    places = mine.get(gpu_uuid) or set()
    return (gi.profile_id, gi.start, gi.size) in places


def without_owned(ng: NodeGPU, mine: Mapping[str, set[tuple[int | None, int, int]]]) -> NodeGPU:
    """``ng`` without the MIG devices of the driver's own GPU instances: what is left is what
    someone else made (published as static MIG devices, or refused on a dynamic-MIG GPU)."""
    ours = {gi.id for gi in ng.instances if is_owned(ng.gpu.uuid, gi, mine)}
    if not ours:
        return ng
    gpu = replace(
        ng.gpu, mig_devices=tuple(m for m in ng.gpu.mig_devices if m.gpu_instance_id not in ours)
    )
    return replace(ng, gpu=gpu)


def read_mig_minors(path: Path = MIG_MINORS) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors`` as ``{capability: minor}`` (lines such as
    ``gpu0/gi1/ci0/access 13``); empty when the file does not exist (no MIG-capable driver)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def mig_cap_nodes(
    minors: Mapping[str, int], parent_minor: int, gi: int, ci: int
) -> tuple[str, str]:
    """The two capability device nodes of MIG device ``(gi, ci)`` of the GPU with device minor
    ``parent_minor``, relative to ``/dev``: ``nvidia-caps/nvidia-cap<N>`` for the GPU instance and
    for the compute instance. Raises ``KeyError`` naming the capability ``minors`` lacks."""
    caps = (f"gpu{parent_minor}/gi{gi}/access", f"gpu{parent_minor}/gi{gi}/ci{ci}/access")
    nodes = []
    for cap in caps:
        if cap not in minors:
            raise KeyError(cap)
        nodes.append(f"nvidia-caps/nvidia-cap{minors[cap]}")
    return nodes[0], nodes[1]


class MigOps:
    """MIG instances through NVML (``nvml``: the ``pynvml`` module after ``nvmlInit``)."""

    def __init__(self, nvml: object) -> None:
        self.nvml: Any = nvml

    def _where(self, s: MigSlot) -> str:
        return f"GPU {s.gpu_index} ({s.gpu_uuid}) {s.profile} at memory slice {s.start}"

    def _handle(self, s: MigSlot) -> Any:
        n = self.nvml
        try:
            return n.nvmlDeviceGetHandleByUUID(s.gpu_uuid.encode())
        except n.NVMLError as e:
            raise MigError(f"{self._where(s)}: {e}") from e

    def resolve(self, s: MigSlot) -> MigSlot:
        """``s`` with its NVML GPU-instance ``profile_id``. Raises :class:`MigError`."""
        if s.profile_id is not None:
            return s
        n = self.nvml
        h = self._handle(s)
        try:
            info = n.nvmlDeviceGetGpuInstanceProfileInfo(h, getattr(n, s.gi_profile))
        except (n.NVMLError, AttributeError) as e:
            raise MigError(f"{self._where(s)}: {s.gi_profile}: {e}") from e
        return replace(s, profile_id=int(info.id))

    def instances(self, gpu_uuid: str) -> list[GpuInstance]:
        """The GPU instances of a GPU now."""
        n = self.nvml
        h = n.nvmlDeviceGetHandleByUUID(gpu_uuid.encode())
        return _gpu_instances(n, h)[0]

    def find(self, s: MigSlot) -> GpuInstance | None:
        """The GPU instance at ``s``'s placement (profile, start, size), or None."""
        for gi in self.instances(s.gpu_uuid):
            if (gi.profile_id, gi.start, gi.size) == (s.profile_id, s.start, s.size):
                return gi
        return None

    def occupied(self, s: MigSlot) -> list[GpuInstance]:
        """GPU instances whose memory slices overlap ``s``'s placement."""
        return [
            gi
            for gi in self.instances(s.gpu_uuid)
            if gi.start < s.start + s.size and s.start < gi.start + gi.size
        ]

    def _mig_uuid(self, h: Any, gi: int, ci: int) -> str:
        n = self.nvml
        for i in range(int(n.nvmlDeviceGetMaxMigDeviceCount(h))):
            try:
                m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except n.NVMLError:
                continue
            if (int(n.nvmlDeviceGetGpuInstanceId(m)), int(n.nvmlDeviceGetComputeInstanceId(m))) == (
                gi,
                ci,
            ):
                return _s(n.nvmlDeviceGetUUID(m))
        raise MigError(f"GPU instance {gi} compute instance {ci}: NVML lists no MIG device for it")

    def _uuid_of(self, h: Any, gi: int, ci: int) -> str | None:
        """The MIG UUID of compute instance ``ci`` of GPU instance ``gi`` (None: NVML lists
        no MIG device for it)."""
        try:
            return self._mig_uuid(h, gi, ci)
        except MigError:
            return None

    def at(self, s: MigSlot) -> tuple[GpuInstance | None, bool]:
        """The GPU instance at ``s``'s placement (None when there is none) and whether it is the
        one ``s`` records (:func:`recorded`). Raises :class:`MigError`."""
        s = self.resolve(s)
        h = self._handle(s)
        try:
            found = self.find(s)
            return found, found is not None and recorded(s, found, self._uuids(h, found))
        except self.nvml.NVMLError as e:
            raise MigError(f"{self._where(s)}: {e}") from e

    def _uuids(self, h: Any, gi: GpuInstance) -> dict[int, str | None]:
        """The MIG UUID of each compute instance of ``gi``, by compute-instance id."""
        return {c: self._uuid_of(h, gi.id, c) for c, _p, _u in gi.compute_instances}

    def realise(
        self,
        s: MigSlot,
        record: Callable[[MigSlot], None],
        note: Callable[[str], None] = lambda _line: None,
    ) -> MigSlot:
        """Make ``s`` exist and return it with ``gi``, ``ci`` and the MIG ``uuid``: the GPU
        instance at its placement (created when none is there; one there is used only when
        :func:`recorded`) and one compute instance over all of it (the recorded one - its id
        and MIG UUID are the slot's -, else created). ``record`` is called with the slot right
        after each creation step - GPU instance (``gi``), then compute instance (``ci`` and
        ``uuid``) - and must put it on disk before it returns (an exception from it propagates,
        the instance stays). A compute instance in the recorded GPU instance that the slot
        does not record is destroyed first (``note`` gets a line saying so). Raises
        :class:`MigError`: NVML failed, or the placement is held by an instance the slot does
        not record (:func:`unrecorded`; left alone)."""
        n = self.nvml
        s = self.resolve(s)
        h = self._handle(s)
        where = self._where(s)
        try:
            found = self.find(s)
            uuids = self._uuids(h, found) if found is not None else {}
            if found is not None and not recorded(s, found, uuids):
                raise MigError(unrecorded(s, found))
            if found is None:
                pl = n.c_nvmlGpuInstancePlacement_t()
                pl.start, pl.size = s.start, s.size
                gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, s.profile_id, ctypes.byref(pl))
                s = replace(s, gi=int(n.nvmlGpuInstanceGetInfo(gi).id), ci=None, uuid=None)
                record(s)
            else:
                gi = n.nvmlDeviceGetGpuInstanceById(h, found.id)
            assert s.gi is not None
            if s.ci in uuids and s.uuid is not None and uuids[s.ci] == s.uuid:
                return s
            for ci_id, uuid in uuids.items():
                n.nvmlComputeInstanceDestroy(n.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id))
                note(
                    f"{where}: destroyed compute instance {ci_id} ({uuid or 'no MIG device'}) of "
                    f"the claim's GPU instance {s.gi}, which the checkpoint did not record (made "
                    "by a driver killed before it recorded it)"
                )
            cinfo = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, getattr(n, s.ci_profile), n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            ci = n.nvmlGpuInstanceCreateComputeInstance(gi, cinfo.id)
            ci_id = int(n.nvmlComputeInstanceGetInfo(ci).id)
            s = replace(s, ci=ci_id, uuid=self._mig_uuid(h, s.gi, ci_id))
            record(s)
            return s
        except n.NVMLError as e:
            raise MigError(f"{where}: {e}") from e

    def destroy(self, s: MigSlot) -> tuple[bool, GpuInstance | None]:
        """Destroy the GPU instance ``s`` records (:func:`recorded`) with every compute
        instance in it. Returns ``(destroyed, left)``: ``destroyed`` True when something was
        destroyed (nothing at the placement is fine); ``left`` the instance at the placement
        that ``s`` does not record, untouched (None when there is none). Raises
        :class:`MigError` (``In use`` while processes run on it)."""
        n = self.nvml
        s = self.resolve(s)
        h = self._handle(s)
        try:
            found = self.find(s)
            if found is None:
                return False, None
            if not recorded(s, found, self._uuids(h, found)):
                return False, found
            gi = n.nvmlDeviceGetGpuInstanceById(h, found.id)
            for ci_id, _p, _u in found.compute_instances:
                try:
                    n.nvmlComputeInstanceDestroy(n.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id))
                except n.NVMLError as e:
                    if getattr(e, "value", None) != n.NVML_ERROR_NOT_FOUND:
                        raise
            n.nvmlGpuInstanceDestroy(gi)
            return True, None
        except n.NVMLError as e:
            raise MigError(f"{self._where(s)}: destroying it: {e}") from e
