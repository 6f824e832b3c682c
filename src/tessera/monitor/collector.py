"""The Prometheus collector: one scrape = the region directory, NVML and the cached API view.

Each scrape reads every usage region (liveness checked, so a killed process's memory is gone
from the very next scrape), samples NVML, and takes the allocation view the API refresher
last fetched. Identities are joined by GPU UUID and claim UID:

* a GPU's index and model come from NVML, else from its ResourceSlice; its pool and device
  name from the ResourceSlice, else from the claim's ``claim.json``;
* a claim's namespace and name come from ``claim.json`` or its limits file, else from the API;
  its pods and containers from ``claim.json``, else from the API (``status.reservedFor``).

The same claim gets the same labels on its region series and its allocation series, so the
two can be compared without ``on()``/``ignoring()``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tessera import DRIVER_NAME
from tessera.monitor.allocation import AllocationView, ClaimInfo
from tessera.monitor.metrics import HAMI_ZONE, METRICS
from tessera.monitor.nvml import GpuSample
from tessera.monitor.regions import PodRef, RegionDir, ShareMeta, ShareReading


class ApiSource(Protocol):
    """Where the collector gets allocation figures: ``(view or None, up, last success time)``."""

    def snapshot(self) -> tuple[AllocationView | None, bool, float]: ...


@dataclass(frozen=True)
class _Gpu:
    uuid: str
    index: str = ""
    model: str = ""
    pool: str = ""
    device: str = ""


@dataclass(frozen=True)
class _Claim:
    uid: str
    namespace: str
    name: str
    pod_namespace: str
    pods: str
    containers: str
    container_indexes: str
    meta: ShareMeta | None


def _join(items: Sequence[str]) -> str:
    seen: list[str] = []
    for i in items:
        if i and i not in seen:
            seen.append(i)
    return ",".join(seen)


def _claim(uid: str, meta: ShareMeta | None, info: ClaimInfo | None) -> _Claim:
    ns = (meta.namespace if meta else "") or (info.namespace if info else "")
    name = (meta.name if meta else "") or (info.name if info else "")
    pods: Sequence[PodRef] = (meta.pods if meta else ()) or (info.pods if info else ())
    return _Claim(
        uid=uid,
        namespace=ns,
        name=name,
        pod_namespace=_join([p.namespace for p in pods]) or (ns if pods else ""),
        pods=_join([p.name for p in pods]),
        containers=_join([c for p in pods for c in p.containers]),
        container_indexes=_join([str(i) for p in pods for i in p.container_indexes]),
        meta=meta,
    )


class TesseraCollector(Collector):
    """Collector for a :class:`~prometheus_client.registry.CollectorRegistry`.

    ``nvml``: a callable returning the GPUs' samples (None with ``--no-nvml``); ``api``: the
    allocation view's source (None with ``--no-api``); ``log``: where one-line problems go
    (each is logged when it appears or changes, not at every scrape).
    """

    def __init__(
        self,
        node: str,
        regions: RegionDir,
        nvml: Callable[[], list[GpuSample]] | None = None,
        api: ApiSource | None = None,
        log: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.node = node
        self.regions = regions
        self.nvml = nvml
        self.api = api
        self.log = log
        self._reported: dict[str, str] = {}
        self._lock = threading.Lock()

    def _report(self, key: str, message: str | None) -> None:
        with self._lock:
            if message is None:
                self._reported.pop(key, None)
                return
            if self._reported.get(key) == message:
                return
            self._reported[key] = message
        self.log(message)

    def describe(self) -> list[Metric]:
        return []  # no describe-time collection: the registry must not read regions at register()

    def collect(self) -> Iterator[Metric]:
        t0 = time.perf_counter()
        scrape = _Scrape(self.node)
        samples: list[GpuSample] = []
        if self.nvml is not None:
            try:
                samples = self.nvml()
                scrape.add("tessera_monitor_nvml_up", [self.node], 1)
                self._report("nvml", None)
            except Exception as e:  # a failing driver must not take the share figures down
                scrape.add("tessera_monitor_nvml_up", [self.node], 0)
                self._report("nvml", f"NVML query failed: {e}")
        view: AllocationView | None = None
        if self.api is not None:
            view, up, last = self.api.snapshot()
            scrape.add("tessera_monitor_api_up", [self.node], 1 if up else 0)
            if last:
                scrape.add("tessera_monitor_api_last_success_timestamp_seconds", [self.node], last)
        try:
            readings = self.regions.read()
            self._report("region-dir", None)
        except OSError as e:
            readings = []
            self._report(
                "region-dir",
                f"cannot list --region-dir {self.regions.path}: {e.strerror or e}",
            )
        scrape.identify(view, samples, readings)
        scrape.regions(readings, self._report)
        if view is not None:
            scrape.allocations(view)
        scrape.devices(samples)
        scrape.add(
            "tessera_monitor_collect_duration_seconds", [self.node], time.perf_counter() - t0
        )
        yield from scrape.families()


class _Scrape:
    """One collection: the metric families (:data:`METRICS`) being filled, and the GPUs and
    claims met so far, identified from every source (the API server's view, NVML, the regions'
    ``claim.json``)."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.fams: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for m in METRICS:
            cls = CounterMetricFamily if m.kind == "counter" else GaugeMetricFamily
            self.fams[m.name] = cls(m.name, m.help, labels=list(m.labels))
        self.gpus: dict[str, _Gpu] = {}
        self.metas: dict[str, ShareMeta] = {}
        self.infos: Mapping[str, ClaimInfo] = {}
        self.claims: dict[str, _Claim] = {}

    def identify(
        self,
        view: AllocationView | None,
        samples: Sequence[GpuSample],
        readings: Sequence[ShareReading],
    ) -> None:
        """The GPUs by UUID (lower case; NVML's name and index win over the API's), the
        regions' metadata and the API's claims by claim UID."""
        if view is not None:
            for va in view.gpus:
                if va.uuid:
                    self.gpus[va.uuid.lower()] = _Gpu(
                        va.uuid, va.index, va.model, va.pool, va.device
                    )
        for s in samples:
            prior = self.gpus.get(s.uuid.lower())
            self.gpus[s.uuid.lower()] = _Gpu(
                s.uuid,
                str(s.index),
                s.name or (prior.model if prior else ""),
                prior.pool if prior else "",
                prior.device if prior else "",
            )
        self.metas = {r.meta.uid: r.meta for r in readings}
        self.infos = view.claims if view is not None else {}

    def claim_of(self, uid: str) -> _Claim:
        c = self.claims.get(uid)
        if c is None:
            c = self.claims[uid] = _claim(uid, self.metas.get(uid), self.infos.get(uid))
        return c

    def gpu_of(self, uuid: str, c: _Claim) -> _Gpu:
        g = self.gpus.get(uuid.lower())
        if g is not None and (g.pool or c.meta is None):
            return g
        meta = c.meta
        dev = meta.devices.get(uuid.lower(), "") if meta else ""
        base = g or _Gpu(uuid)
        return _Gpu(
            base.uuid,
            base.index,
            base.model,
            base.pool or (meta.pool if meta else ""),
            base.device or dev,
        )

    def share_labels(self, c: _Claim, g: _Gpu) -> list[str]:
        driver = c.meta.driver if c.meta and c.meta.driver else DRIVER_NAME
        return [
            self.node,
            g.uuid,
            driver,
            g.pool,
            g.device,
            c.namespace,
            c.name,
            c.uid,
            c.pod_namespace,
            c.pods,
            c.containers,
        ]

    def claim_labels(self, c: _Claim) -> list[str]:
        return [self.node, c.namespace, c.name, c.uid, c.pod_namespace, c.pods, c.containers]

    def gpu_labels(self, g: _Gpu) -> list[str]:
        return [self.node, g.uuid, g.index, g.model, g.pool, g.device]

    def add(self, name: str, labels: list[str], value: float) -> None:
        self.fams[name].add_metric(labels, value)

    def families(self) -> Iterator[Metric]:
        """The families with samples, in :data:`METRICS` order."""
        for f in self.fams.values():
            if f.samples:
                yield f

    def regions(
        self, readings: Sequence[ShareReading], report: Callable[[str, str | None], None]
    ) -> None:
        """Each share's usage region: its figures under Tessera's and HAMi's names."""
        for r in readings:
            c = self.claim_of(r.meta.uid)
            if r.meta_error:
                report(f"meta:{r.path}", f"{r.meta_error}")
            else:
                report(f"meta:{r.path}", None)
            if r.snapshot is None:
                self.add("tessera_share_region_readable", self.claim_labels(c), 0)
                report(f"region:{r.path}", f"{r.error}")
                continue
            report(f"region:{r.path}", None)
            snap = r.snapshot
            self.add("tessera_share_region_readable", self.claim_labels(c), 1)
            self.add("tessera_share_processes", self.claim_labels(c), len(snap.slots))
            for rg in snap.gpus:
                g = self.gpu_of(rg.uuid, c)
                sl = self.share_labels(c, g)
                contexts = sum(s.contexts[rg.index] for s in snap.slots)
                self.add("tessera_share_memory_used_bytes", sl, rg.used)
                self.add("tessera_share_memory_limit_bytes", sl, rg.memory_limit)
                self.add("tessera_share_cores_ratio", sl, rg.cores / 100)
                self.add("tessera_share_kernel_launches_total", sl, rg.launches)
                self.add("tessera_share_paced_seconds_total", sl, rg.paced_ns / 1e9)
                self.add("tessera_share_contexts", sl, contexts)
                hl = [c.pod_namespace, c.pods, c.containers, str(rg.index), g.uuid, HAMI_ZONE]
                ctx_bytes = contexts * snap.context_overhead
                self.add("hami_vgpu_memory_used_bytes", hl, rg.used)
                self.add("hami_vgpu_memory_limit_bytes", hl, rg.memory_limit)
                self.add("hami_container_device_memory_bytes", hl, rg.used)
                self.add("hami_vgpu_memory_context_bytes", hl, ctx_bytes)
                self.add("hami_vgpu_memory_buffer_bytes", hl, max(rg.used - ctx_bytes, 0))

    def allocations(self, view: AllocationView) -> None:
        """What the API server allocated: per share and per GPU."""
        for a in view.shares:
            c = self.claim_of(a.claim_uid)
            g = self.gpus.get(a.uuid.lower()) or _Gpu(a.uuid, pool=a.pool, device=a.device)
            sl = self.share_labels(c, g)
            hl = [c.pod_namespace, self.node, c.pods, c.container_indexes, g.uuid, HAMI_ZONE]
            if a.memory is not None:
                self.add("tessera_share_memory_allocated_bytes", sl, float(a.memory))
                self.add("hami_vgpu_memory_allocated_bytes", hl, float(a.memory))
            if a.cores is not None:
                self.add("tessera_share_cores_allocated_ratio", sl, float(a.cores) / 100)
                self.add("hami_vgpu_core_allocated_ratio", hl, float(a.cores))
        for ga in view.gpus:
            g = self.gpus.get(ga.uuid.lower()) or _Gpu(
                ga.uuid, ga.index, ga.model, ga.pool, ga.device
            )
            gl = self.gpu_labels(g)
            hl = [self.node, g.uuid, g.index, g.model, HAMI_ZONE]
            cores_cap = "" if ga.cores_capacity is None else str(int(ga.cores_capacity))
            if ga.memory_capacity is not None:
                self.add("tessera_gpu_memory_capacity_bytes", gl, float(ga.memory_capacity))
                self.add("hami_gpu_memory_limit_bytes", hl, float(ga.memory_capacity))
                if ga.memory_capacity:
                    self.add(
                        "hami_node_gpu_memory_allocated_ratio",
                        hl,
                        float(ga.memory_allocated / ga.memory_capacity),
                    )
                self.add(
                    "hami_node_gpu_overview",
                    [
                        self.node,
                        g.uuid,
                        g.index,
                        g.model,
                        cores_cap,
                        str(int(ga.memory_capacity)),
                        HAMI_ZONE,
                    ],
                    float(ga.memory_allocated),
                )
            self.add("tessera_gpu_memory_allocated_bytes", gl, float(ga.memory_allocated))
            self.add(
                "hami_gpu_memory_allocated_bytes",
                [self.node, g.uuid, g.index, g.model, cores_cap, HAMI_ZONE],
                float(ga.memory_allocated),
            )
            if ga.cores_capacity is not None:
                self.add("tessera_gpu_cores_allocated_ratio", gl, float(ga.cores_allocated) / 100)
                self.add("hami_gpu_core_allocated_ratio", hl, float(ga.cores_allocated))
                self.add("hami_gpu_core_limit_ratio", hl, float(ga.cores_capacity))
            self.add("tessera_gpu_shares", gl, ga.shares)
            self.add("hami_gpu_shared_count", hl, ga.shares)
            self.add("tessera_gpu_dedicated", gl, 1 if ga.dedicated else 0)

    def devices(self, samples: Sequence[GpuSample]) -> None:
        """What NVML says of each GPU."""
        for s in samples:
            g = self.gpus[s.uuid.lower()]
            gl = self.gpu_labels(g)
            self.add("tessera_gpu_memory_total_bytes", gl, s.memory_total)
            self.add("tessera_gpu_memory_used_bytes", gl, s.memory_used)
            self.add(
                "hami_host_gpu_memory_used_bytes",
                [self.node, g.index, g.uuid, g.model, HAMI_ZONE],
                s.memory_used,
            )
            if s.utilization_gpu is not None:
                self.add("tessera_gpu_utilization_ratio", gl, s.utilization_gpu / 100)
                self.add(
                    "hami_host_gpu_utilization_ratio",
                    [self.node, g.index, g.uuid, g.model, HAMI_ZONE],
                    s.utilization_gpu,
                )
            if s.utilization_memory is not None:
                self.add("tessera_gpu_memory_utilization_ratio", gl, s.utilization_memory / 100)
                self.add(
                    "hami_host_gpu_memory_controller_utilization_ratio",
                    [g.index, g.uuid, g.model, HAMI_ZONE],
                    s.utilization_memory,
                )
