"""Device health for the kubelet (KEP-4680, feature gate ``ResourceHealthStatus``; beta and on
by default since Kubernetes 1.36).

What is reported: every device this node publishes (each device of its ResourceSlices:
``pool`` = the slice's ``spec.pool.name``, ``device`` = the device's ``name``, MIG devices and
dynamic-MIG placements included), as

* ``UNHEALTHY`` with the cause in :attr:`DeviceHealth.message` when its GPU has a
  :class:`~tessera.driver.publish.Condition` (lost, vanished, a critical XID: the judgement of
  :meth:`~tessera.driver.publish.GpuRecord.condition`, the same one that puts the device taint
  ``gpu.tessera.dev/unhealthy`` on it);
* ``UNKNOWN`` when nothing watches its health (no NVML: the GPUs were read from
  ``nvidia-smi``, so neither XIDs nor lost GPUs are seen) or it names no GPU the node knows;
* ``HEALTHY`` otherwise.

:func:`health_report` makes one report from the slices the publisher built and the registry's
records, at the same instant and with the same judgement as the taints.
:class:`HealthFeed` keeps the latest one; the kubelet's ``NodeWatchResources`` stream
(:mod:`tessera.driver.kubelet`, services ``v1.DRAResourceHealth`` and
``v1alpha1.DRAResourceHealth``) sends it at once when a stream opens, again at every change,
and every :data:`REPORT_SECONDS` when nothing changed (the kubelet reads a device it has not
heard of for ``health_check_timeout_seconds``, :data:`TIMEOUT_SECONDS`, as Unknown).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .publish import GpuRecord

HEALTHY = "HEALTHY"
UNHEALTHY = "UNHEALTHY"
UNKNOWN = "UNKNOWN"
#: Seconds between two reports on a stream when nothing changed.
REPORT_SECONDS = 10.0
#: ``health_check_timeout_seconds`` of every device: three missed reports make it Unknown.
TIMEOUT_SECONDS = 30
#: Longest message the kubelet keeps (``DeviceHealth.message``; longer ones it truncates).
MAX_MESSAGE = 1024
NOT_WATCHED = (
    "GPU health is not watched: NVML could not be loaded (the GPUs were read from nvidia-smi), "
    "so XID events and lost GPUs are not seen"
)


@dataclass(frozen=True)
class DeviceHealth:
    """One device of a report: ``pool`` and ``device`` (as published), ``health``
    (:data:`HEALTHY`, :data:`UNHEALTHY` or :data:`UNKNOWN`) and ``message`` (the cause, at
    most :data:`MAX_MESSAGE` characters; '' when healthy)."""

    pool: str
    device: str
    health: str
    message: str = ""


def device_gpu(device: Mapping[str, Any]) -> str | None:
    """The UUID of the GPU a published device belongs to: its ``parentUUID`` attribute (MIG
    devices and dynamic-MIG placements), else its ``uuid`` (a whole GPU); None without
    either."""
    attrs = device.get("attributes") or {}
    for key in ("parentUUID", "uuid"):
        v = (attrs.get(key) or {}).get("string")
        if v:
            return str(v)
    return None


def health_report(
    slices: Sequence[Mapping[str, Any]],
    records: Sequence[GpuRecord],
    now: float,
    xid_recovery: float,
    *,
    watched: bool = True,
) -> tuple[DeviceHealth, ...]:
    """The health of every device of ``slices`` (ResourceSlice objects, as the publisher
    builds them), sorted by pool and device: each device's GPU (:func:`device_gpu`) judged by
    :meth:`GpuRecord.condition` at ``now`` (``time.time()`` seconds) with ``xid_recovery``
    seconds. ``watched``: whether NVML watches the GPUs (False: a GPU without a condition is
    :data:`UNKNOWN`, :data:`NOT_WATCHED`)."""
    by_uuid = {r.gpu.uuid: r for r in records}
    out: list[DeviceHealth] = []
    for s in slices:
        spec = s.get("spec") or {}
        pool = str((spec.get("pool") or {}).get("name", ""))
        for d in spec.get("devices") or []:
            name = str(d.get("name", ""))
            uuid = device_gpu(d)
            rec = by_uuid.get(uuid) if uuid else None
            if rec is None:
                out.append(
                    DeviceHealth(
                        pool,
                        name,
                        UNKNOWN,
                        f"device {name} names no GPU this node knows (attribute parentUUID or uuid: "
                        f"{uuid!r})",
                    )
                )
                continue
            c = rec.condition(now, xid_recovery)
            if c is not None:
                out.append(DeviceHealth(pool, name, UNHEALTHY, c.message[:MAX_MESSAGE]))
            elif not watched:
                out.append(DeviceHealth(pool, name, UNKNOWN, NOT_WATCHED))
            else:
                out.append(DeviceHealth(pool, name, HEALTHY))
    return tuple(sorted(out, key=lambda h: (h.pool, h.device)))


class HealthFeed:
    """The latest health report, shared by the publisher (which calls :meth:`publish` at
    every sync) and the kubelet's streams (:meth:`stream`). Thread-safe."""

    def __init__(self, period: float = REPORT_SECONDS) -> None:
        self.period = period
        self._cond = threading.Condition()
        self._report: tuple[DeviceHealth, ...] | None = None
        self._at = 0.0
        #: Bumped whenever the report changes (not when the same one is published again).
        self.version = 0
        #: While True the streams send nothing (a retired instance of a rolling update: the
        #: newest one judges; a stream that ended would make the kubelet forget the driver's
        #: health, so they stay open, silent).
        self.silenced = False

    def silence(self, on: bool) -> None:
        """Stop (``on``) or resume sending on the streams; a resumed stream sends at once."""
        with self._cond:
            if self.silenced and not on:
                self.version += 1
            self.silenced = on
            self._cond.notify_all()

    def publish(self, report: tuple[DeviceHealth, ...], at: float) -> bool:
        """Keep ``report``, judged at ``at`` (``time.time()`` seconds); True when it differs
        from the one kept (the streams are woken then)."""
        with self._cond:
            self._at = at
            if report == self._report:
                return False
            self._report = report
            self.version += 1
            self._cond.notify_all()
            return True

    def current(self) -> tuple[int, tuple[DeviceHealth, ...] | None, float]:
        """``(version, report, at)``; the report is None before the first :meth:`publish`."""
        with self._cond:
            return self.version, self._report, self._at

    def stream(
        self, active: Callable[[], bool], tick: float = 1.0
    ) -> Iterator[tuple[tuple[DeviceHealth, ...], float]]:
        """``(report, at)`` now (once there is one), at every change and every
        :attr:`period` seconds otherwise, while ``active()`` (checked every ``tick`` seconds);
        nothing while :attr:`silenced`."""
        sent = -1
        last = 0.0
        while active():
            with self._cond:
                if self.version == sent and time.monotonic() - last < self.period:
                    self._cond.wait(min(tick, self.period - (time.monotonic() - last)))
                version, report, at = self.version, self._report, self._at
            if report is None or self.silenced or not active():
                continue
            if version != sent or time.monotonic() - last >= self.period:
                sent, last = version, time.monotonic()
                yield report, at
