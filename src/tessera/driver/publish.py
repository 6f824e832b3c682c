"""The node's GPUs as ResourceSlices in the API server: what is published and when it changes.

* **Registry** (:class:`GpuRegistry`): every GPU this node has shown, by UUID, with the device
  index it was first published under, persisted in ``<state>/gpus.json``. Device names
  (``gpu-<index>``) therefore never move: when a GPU disappears, NVML renumbers the others but
  their published names and the allocations that name them stay right.
* **Health**: a GPU that NVML reports lost, that is gone from NVML, or that raised a critical
  XID stays published, with the device taint ``gpu.tessera.dev/unhealthy`` (value ``lost``,
  ``missing`` or ``xid-<code>``, effect ``NoSchedule``; KEP-5055 DRADeviceTaints) instead of
  vanishing, so the scheduler stops placing new claims on it and running claims keep naming a
  real device. The taint goes when the GPU answers again (``lost``/``missing``) or when it has
  answered for ``xid_recovery`` seconds without a new critical XID.
* **Publishing** (:class:`Publisher`): the slices come from
  :func:`tessera.inventory.build_resource_slices` (the code path ``tessera simulate`` uses);
  pool = node name; ``pool.generation`` is bumped on every change and only then;
  ``resourceSliceCount`` is the number of slices; slices of this driver and node that are no
  longer wanted are deleted; nothing is written for another node or driver.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tessera.enforcement._files import write_atomic
from tessera.inventory import GPU, build_resource_slices
from tessera.inventory.errors import SliceBuildError
from tessera.inventory.mig import DynamicMIG, dynamic_mig_models
from tessera.inventory.model import MigDevice
from tessera.kube.client import ApiError, KubeClient

from .discovery import XID_MEANINGS, NodeGPU
from .resourcehealth import HealthFeed, health_report

TAINT_KEY = "gpu.tessera.dev/unhealthy"
TAINT_EFFECT = "NoSchedule"
FIELD_MANAGER = "tessera-driver"
BACKEND_ATTRIBUTE = "enforcementBackend"
#: GPU fields the registry does not keep (NVML discovery leaves them at their defaults).
_NOT_SAVED = frozenset({"mig_model"})
_GPU_FIELDS = frozenset(f.name for f in fields(GPU)) - _NOT_SAVED


@dataclass(frozen=True)
class Condition:
    """Why a GPU is unhealthy: ``value``, the value of its device taint :data:`TAINT_KEY`
    (``lost``, ``missing``, ``xid-<code>``: a label value, at most 63 characters), and
    ``message``, the cause in words for the kubelet's health report (one line, well under the
    1024 characters KEP-4680 allows)."""

    value: str
    message: str


@dataclass
class GpuRecord:
    """A GPU the node has shown: ``gpu`` (its ``index`` is the published one; its MIG devices
    those the driver did not make), ``minor``, ``health`` (``ok``/``lost``/``missing``), the last
    critical ``xid`` and when it came (``xid_at``, ``time.time()``), ``ok_since`` (when it last
    started answering) and ``nvlink``, the UUIDs of the GPUs it reaches over NVLink."""

    gpu: GPU
    minor: int | None
    health: str = "ok"
    xid: int | None = None
    xid_at: float | None = None
    ok_since: float = field(default_factory=time.time)
    nvlink: tuple[str, ...] = ()

    def condition(self, now: float, xid_recovery: float) -> Condition | None:
        """Why this GPU is unhealthy at ``now`` (``time.time()`` seconds), or ``None`` when it
        is healthy: the node's one health judgement. Both the device taint of the published
        slices (:func:`desired_slices`) and the health reported to the kubelet
        (:func:`tessera.driver.resourcehealth.health_report`, KEP-4680) come from it.

        Unhealthy while NVML reports the GPU lost or no longer lists it, and for
        ``xid_recovery`` seconds after its last critical XID (counted from when it answered
        again, if it was lost meanwhile)."""
        if self.health == "lost":
            return Condition(
                "lost",
                f"GPU {self.gpu.uuid} is lost: NVML answers GPU_IS_LOST (it fell off the bus, "
                "XID 79); healthy again once NVML answers for it",
            )
        if self.health != "ok":
            return Condition(
                self.health,
                f"GPU {self.gpu.uuid} vanished: NVML no longer lists it ({self.health}); "
                "healthy again once NVML lists it",
            )
        if (
            self.xid is not None
            and self.xid_at is not None
            and now - max(self.xid_at, self.ok_since) < xid_recovery
        ):
            at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.xid_at))
            return Condition(
                f"xid-{self.xid}",
                f"GPU {self.gpu.uuid}: XID {self.xid} ({XID_MEANINGS.get(self.xid, 'critical XID')}) "
                f"at {at}; healthy again after {xid_recovery:g} s without a new critical XID",
            )
        return None

    def taint_value(self, now: float, xid_recovery: float) -> str | None:
        """The taint value this GPU should carry now (:meth:`condition`'s ``value``), or
        ``None`` when healthy."""
        c = self.condition(now, xid_recovery)
        return c.value if c is not None else None


class GpuRegistry:
    """GPUs by UUID with stable indices, persisted as JSON at ``path`` (atomic replace)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.records: dict[str, GpuRecord] = {}
        self.version = 0  # bumped on every change
        self._lock = threading.Lock()
        if self.path.is_file():
            for d in json.loads(self.path.read_text()).get("gpus", []):
                g = {k: v for k, v in d["gpu"].items() if k in _GPU_FIELDS}
                g["mig_devices"] = tuple(MigDevice(**m) for m in g.get("mig_devices") or ())
                self.records[g["uuid"]] = GpuRecord(
                    gpu=GPU(**g),
                    minor=d.get("minor"),
                    health=d.get("health", "ok"),
                    xid=d.get("xid"),
                    xid_at=d.get("xid_at"),
                    ok_since=d.get("ok_since", time.time()),
                    nvlink=tuple(d.get("nvlink") or ()),
                )

    def save(self) -> None:
        doc = {
            "version": 1,
            "gpus": [
                {
                    "gpu": {k: v for k, v in asdict(r.gpu).items() if k not in _NOT_SAVED},
                    "minor": r.minor,
                    "health": r.health,
                    "xid": r.xid,
                    "xid_at": r.xid_at,
                    "ok_since": r.ok_since,
                    "nvlink": list(r.nvlink),
                }
                for r in sorted(self.records.values(), key=lambda r: r.gpu.index)
            ],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(str(self.path), (json.dumps(doc, indent=1) + "\n").encode(), 0o644, ".gpus.")

    def update(
        self, seen: list[NodeGPU], health: Mapping[str, str], now: float | None = None
    ) -> bool:
        """Merge a discovery pass: ``seen`` GPUs (NVML order) and the ``health`` of known UUIDs
        that were not seen (``lost``/``missing``). Returns True when anything changed."""
        now = time.time() if now is None else now
        changed = False
        with self._lock:
            used = {r.gpu.index for r in self.records.values()}
            for ng in seen:
                rec = self.records.get(ng.gpu.uuid)
                if rec is None:
                    index = ng.gpu.index
                    while index in used:
                        index += 1
                    used.add(index)
                    self.records[ng.gpu.uuid] = GpuRecord(
                        replace(ng.gpu, index=index), ng.minor, ok_since=now, nvlink=ng.nvlink
                    )
                    changed = True
                    continue
                fresh = replace(ng.gpu, index=rec.gpu.index)
                if fresh != rec.gpu or ng.minor != rec.minor or ng.nvlink != rec.nvlink:
                    rec.gpu, rec.minor, rec.nvlink = fresh, ng.minor, ng.nvlink
                    changed = True
                if rec.health != "ok":
                    rec.health, rec.ok_since = "ok", now
                    changed = True
            seen_ids = {ng.gpu.uuid for ng in seen}
            for uuid, rec in self.records.items():
                if uuid in seen_ids:
                    continue
                h = health.get(uuid, "missing")
                if h == "ok":
                    continue
                if rec.health != h:
                    rec.health = h
                    changed = True
            if changed:
                self.version += 1
                self.save()
        return changed

    def record_xid(self, uuid: str, xid: int, now: float | None = None) -> bool:
        """Note a critical XID on ``uuid``; True when the GPU is known."""
        with self._lock:
            rec = self.records.get(uuid)
            if rec is None:
                return False
            rec.xid, rec.xid_at = xid, time.time() if now is None else now
            self.version += 1
            self.save()
            return True

    def snapshot(self) -> list[GpuRecord]:
        with self._lock:
            return sorted((replace(r) for r in self.records.values()), key=lambda r: r.gpu.index)

    def by_device(self) -> dict[str, GpuRecord]:
        """``{device name: record}`` for the published devices (``gpu-<index>``)."""
        return {f"gpu-{r.gpu.index}": r for r in self.snapshot()}


def nvlink_domains(records: list[GpuRecord]) -> dict[int, int]:
    """``{published index: domain}`` for :func:`build_resource_slices` (``nvlinkDomain``): the
    GPUs joined by NVLink, keyed by what NVML reports - each record's peers are UUIDs
    (``NVML_P2P_CAPS_INDEX_NVLINK``) - and named by the smallest published index of each
    connected set. The published indices need not be ``0..n-1``: a gap (GPU 2 fell off the bus,
    GPUs 0, 1 and 3 are left) changes nothing. A peer that is not a record does not count;
    GPUs without an NVLink peer are absent."""
    index = {r.gpu.uuid: r.gpu.index for r in records}
    parent = {i: i for i in index.values()}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    linked: set[int] = set()
    for r in records:
        for p in r.nvlink:
            if p in index and p != r.gpu.uuid:
                a, b = find(index[r.gpu.uuid]), find(index[p])
                linked.update((index[r.gpu.uuid], index[p]))
                if a != b:
                    parent[max(a, b)] = min(a, b)
    return {i: find(i) for i in sorted(linked)}


def check_dynamic_mig(gpus: list[GPU], dynamic: DynamicMIG | None, where: str) -> None:
    """Refuse a dynamic-MIG setting this node's GPUs cannot have, in one line: what
    :func:`~tessera.inventory.mig.dynamic_mig_models` refuses (a GPU the node lacks, one that is
    not MIG-capable or has no profile table, one holding MIG instances the driver did not make,
    an unknown profile) and, what only the driver refuses, a GPU whose MIG mode is off: the
    driver makes instances, it does not switch modes (that needs the GPU idle, and on Ampere a
    reset). ``tessera simulate`` only warns there: it plans a node whose operator will enable it.
    Raises :class:`~tessera.inventory.errors.SliceBuildError`."""
    if dynamic is None:
        return
    models = dynamic_mig_models(gpus, dynamic, where)
    for g in sorted(gpus, key=lambda g: g.index):
        if g.index in models and not g.mig_enabled:
            raise SliceBuildError(
                f"GPU {g.index} ({g.uuid}, {g.product_name}) is set for dynamic MIG but its MIG mode "
                f"is disabled: enable it (nvidia-smi -i {g.index} -mig 1; on Ampere GPUs this takes "
                "effect after a GPU reset) and restart the driver, or leave the GPU out of dynamicMIG",
                source=where,
                field="dynamicMIG",
            )


def desired_slices(
    node: str,
    driver: str,
    records: list[GpuRecord],
    backend: str,
    generation: int,
    now: float,
    xid_recovery: float,
    dynamic_mig: DynamicMIG | None = None,
    where: str | None = None,
) -> list[dict[str, Any]]:
    """The slices for ``records`` (through :func:`build_resource_slices`, with the operator's
    ``dynamic_mig`` setting and the GPUs' NVLink peers) with taints for unhealthy GPUs and the
    ``enforcementBackend`` attribute on every device. Raises
    :class:`~tessera.inventory.errors.SliceBuildError` for a ``dynamic_mig`` the node cannot
    have (``where`` starts its message)."""
    taints: dict[str, list[dict[str, str]]] = {}
    for r in records:
        v = r.taint_value(now, xid_recovery)
        if v is not None:
            taints[r.gpu.uuid] = [{"key": TAINT_KEY, "value": v, "effect": TAINT_EFFECT}]
    if dynamic_mig is not None:
        check_dynamic_mig([r.gpu for r in records], dynamic_mig, where or f"node {node!r}")
    return build_resource_slices(
        node,
        [r.gpu for r in records],
        driver=driver,
        generation=generation,
        taints=taints,
        attributes={BACKEND_ATTRIBUTE: {"string": backend}},
        dynamic_mig=dynamic_mig,
        where=where,
        nvlink_domains=nvlink_domains(records),
    )


def _comparable(spec: Mapping[str, Any]) -> Any:
    """A slice spec without what the publisher does not decide (generation, timeAdded)."""
    s = json.loads(json.dumps(spec))
    s.get("pool", {}).pop("generation", None)
    for d in s.get("devices") or []:
        for t in d.get("taints") or []:
            t.pop("timeAdded", None)
    return s


class Publisher:
    """Keeps this node's ResourceSlices equal to the registry's GPUs.

    ``client``: API client; ``node``/``driver``: names. ``health``: where every sync leaves
    the devices' health for the kubelet (:func:`~tessera.driver.resourcehealth.health_report`
    of the slices it built, at the same instant: KEP-4680), ``health_watched`` whether NVML
    watches the GPUs (False: healthy-looking devices are reported Unknown). :meth:`sync` is
    safe to call from several threads.
    """

    def __init__(
        self,
        client: KubeClient,
        node: str,
        driver: str,
        registry: GpuRegistry,
        backend: str,
        *,
        xid_recovery: float = 60.0,
        dynamic_mig: DynamicMIG | None = None,
        dynamic_where: str | None = None,
        log: Callable[[str], None] | None = None,
        health: HealthFeed | None = None,
        health_watched: bool = True,
    ) -> None:
        self.client = client
        self.health = health
        self.health_watched = health_watched
        self.node = node
        self.driver = driver
        self.registry = registry
        self.backend = backend
        self.xid_recovery = xid_recovery
        self.dynamic_mig = dynamic_mig
        self.dynamic_where = dynamic_where
        self.generation: int | None = None
        self.published: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._log = log or (lambda _m: None)

    def _ours(self) -> list[dict[str, Any]]:
        items = self.client.list(
            "resource.k8s.io/v1",
            "ResourceSlice",
            field_selector=f"spec.nodeName={self.node},spec.driver={self.driver}",
        )
        return [
            s
            for s in items
            if s.get("spec", {}).get("nodeName") == self.node
            and s.get("spec", {}).get("driver") == self.driver
        ]

    def sync(self, now: float | None = None) -> bool:
        """Publish if what should be published differs from what is; return True if it wrote.

        The health report (``health``) is left first, before any API call, so the kubelet
        hears of a fault even while the API server is unreachable.

        Raises :class:`ApiError` when the API server refuses (the message names the field),
        :class:`~tessera.inventory.errors.SliceBuildError` when the GPUs do not fit the
        dynamic-MIG setting (nothing is written or reported then).
        """
        now = time.time() if now is None else now
        with self._lock:
            records = self.registry.snapshot()
            want = desired_slices(
                self.node,
                self.driver,
                records,
                self.backend,
                0,
                now,
                self.xid_recovery,
                self.dynamic_mig,
                self.dynamic_where,
            )
            if self.health is not None:
                self.health.publish(
                    health_report(
                        want, records, now, self.xid_recovery, watched=self.health_watched
                    ),
                    now,
                )
            existing = self._ours()
            current_gen = max(
                (int(s["spec"]["pool"].get("generation", 0)) for s in existing), default=0
            )
            have = {s["metadata"]["name"]: _comparable(s["spec"]) for s in existing}
            wanted = {s["metadata"]["name"]: _comparable(s["spec"]) for s in want}
            if have == wanted:
                for s in want:
                    s["spec"]["pool"]["generation"] = current_gen
                self.generation = current_gen
                self.published = want
                return False
            gen = current_gen + 1
            for s in want:
                s["spec"]["pool"]["generation"] = gen
            for s in want:
                self.client.apply(s, field_manager=FIELD_MANAGER)
            names = {s["metadata"]["name"] for s in want}
            for s in existing:
                name = s["metadata"]["name"]
                if name not in names:
                    try:
                        self.client.delete("resource.k8s.io/v1", "ResourceSlice", name)
                    except ApiError as e:
                        self._log(f"deleting stale ResourceSlice {name}: {e}")
            self.generation = gen
            self.published = want
            tainted = sorted(r.gpu.uuid for r in records if r.taint_value(now, self.xid_recovery))
            self._log(
                f"published {len(want)} ResourceSlice(s), generation {gen}"
                + (f", tainted: {', '.join(tainted)}" if tainted else "")
            )
            return True

    def next_change(self, now: float | None = None) -> float | None:
        """Seconds until an XID taint expires (so the caller re-syncs then), or ``None``."""
        now = time.time() if now is None else now
        waits = [
            r.xid_at + self.xid_recovery - now
            for r in self.registry.snapshot()
            if r.health == "ok" and r.xid_at is not None and r.taint_value(now, self.xid_recovery)
        ]
        return max(0.0, min(waits)) if waits else None
