"""The node driver's slice publishing and health loop: who publishes (:class:`PublishLease`, a
rolling update's newest instance) and :class:`Rescanner` - rescans of the GPUs (health, GPUs
coming and going, XID events) republished when anything changed, interrupted prepares whose
claim is gone cleaned up, and every prepared claim's charge reconciled with NVML."""

from __future__ import annotations

import threading
from pathlib import Path

from tessera.enforcement._files import write_atomic
from tessera.enforcement.layout import REGION_FILE, claims_dir
from tessera.inventory.errors import SliceBuildError
from tessera.inventory.slices import publication_warnings
from tessera.kube.client import ApiError

from .context import DriverContext
from .discovery import DiscoveryError, Inventory, NodeGPU, discover_nvml, discover_smi, probe
from .instances import MigInstances
from .mig import owned, without_owned


def foreign_only(ctx: DriverContext, inv: Inventory) -> list[NodeGPU]:
    """The discovered GPUs without the MIG devices of the driver's own instances."""
    mine = owned(ctx.store.entries().values())
    return [without_owned(ng, mine) for ng in inv.gpus] if mine else list(inv.gpus)


def warn_publication(ctx: DriverContext) -> None:
    """Log, once each, what the slices leave out (a MIG-mode GPU without instances...)."""
    for line in publication_warnings(
        [r.gpu for r in ctx.registry.snapshot()],
        f"node {ctx.cfg.node_name}",
        ctx.cfg.dynamic_mig,
    ):
        if line not in ctx.warned:
            ctx.warned.add(line)
            ctx.log(f"warning: {line}")


class PublishLease:
    """``<state>/publisher``: the one driver instance of the node that publishes its
    ResourceSlices and rescans (the newest: it writes its id there at start)."""

    def __init__(self, ctx: DriverContext, path: Path, instance_id: str) -> None:
        self.ctx = ctx
        self.path = path
        self.instance_id = instance_id
        #: Another instance publishes now: this one only answers the kubelet until it stops.
        self.retired = False

    def holder(self) -> str | None:
        """The id the file names, None without one."""
        try:
            return self.path.read_text().strip() or None
        except FileNotFoundError:
            return None

    def claim(self) -> None:
        """Name this instance as the node's publisher in ``<state>/publisher``."""
        write_atomic(str(self.path), (self.instance_id + "\n").encode(), 0o644, ".publisher.")
        self.retired = False

    def release(self) -> None:
        """At stop: remove ``<state>/publisher`` when it names this instance (an older one
        still running then publishes again)."""
        if self.holder() == self.instance_id:
            self.path.unlink(missing_ok=True)

    def publishes(self) -> bool:
        """Whether this instance publishes now: ``<state>/publisher`` names it, or names nobody
        (then it claims it). Logs the hand-over when another instance took it. Raises
        ``OSError``."""
        holder = self.holder()
        if holder is None:
            self.claim()
            self.ctx.log("no other instance publishes: publishing again")
            return True
        if holder == self.instance_id:
            return True
        if not self.retired:
            self.retired = True
            self.ctx.log(
                f"driver instance {holder} now publishes this node's ResourceSlices: this one "
                "stops publishing and rescanning, and answers the kubelet until it stops"
            )
        return False


class Rescanner:
    """The background rescans (:meth:`loop`, woken early by ``wake``: an XID, a slice change
    due) while this instance publishes, until ``stop``."""

    def __init__(
        self,
        ctx: DriverContext,
        instances: MigInstances,
        lease: PublishLease,
        stop: threading.Event,
        wake: threading.Event,
    ) -> None:
        self.ctx = ctx
        self.instances = instances
        self.lease = lease
        self._stop = stop
        self._wake = wake

    def on_xid(self, uuid: str, xid: int) -> None:
        """An XID event of GPU ``uuid``: recorded (taints it), and a rescan woken."""
        if self.ctx.registry.record_xid(uuid, xid):
            self.ctx.log(f"GPU {uuid}: XID {xid}")
            self._wake.set()

    def on_presence(self, absent: dict[str, str]) -> None:
        """The GPUs that do not answer NVML changed (``{uuid: lost|missing}``, from the XID
        watcher's probes): a rescan woken, which records and publishes it."""
        self.ctx.log(
            "GPUs not answering NVML: "
            + (", ".join(f"{u} ({h})" for u, h in sorted(absent.items())) or "none")
        )
        self._wake.set()

    def rescan(self) -> None:
        """One discovery + health pass, then publish if anything changed."""
        ctx = self.ctx
        assert ctx.publisher is not None
        try:
            with ctx.mig_lock:  # no instance made or destroyed while NVML is read
                inv = (
                    discover_nvml(ctx.nvml)
                    if ctx.nvml is not None
                    else discover_smi(ctx.cfg.nvidia_smi)
                )
                gpus = foreign_only(ctx, inv)
        except DiscoveryError as e:
            ctx.log(f"rescan: {e}")
            return
        seen = {g.gpu.uuid for g in inv.gpus}
        health = {
            r.gpu.uuid: (probe(ctx.nvml, r.gpu.uuid) if ctx.nvml is not None else "missing")
            for r in ctx.registry.snapshot()
            if r.gpu.uuid not in seen
        }
        ctx.registry.update(gpus, health)
        try:
            ctx.publisher.sync()
        except ApiError as e:
            ctx.log(f"publishing: {e}")
        except SliceBuildError as e:
            if str(e) not in ctx.warned:
                ctx.warned.add(str(e))
                ctx.log(f"not publishing the change: {e}")
        warn_publication(ctx)
        try:
            self.instances.cleanup_stale()
        except (ApiError, OSError) as e:
            ctx.log(f"checking interrupted prepares: {e}")
        self.reconcile()

    def reconcile(self) -> None:
        """Reconcile every prepared claim's charge with NVML's per-process figures
        (:mod:`tessera.enforcement.reconcile`): write into each claim directory's
        ``driver/usage`` what its processes hold beyond their charges and each live slot's
        host pid (:func:`~tessera.enforcement.reconcile.reconcile_claim`). Needs NVML and the
        host's PID namespace (the chart runs the driver with ``hostPID``); without NVML it does
        nothing. A claim whose region cannot be read is skipped."""
        ctx = self.ctx
        if ctx.nvml is None:
            return
        from tessera.enforcement.reconcile import nvml_per_process, reconcile_claim
        from tessera.enforcement.region import RegionError, read_region

        try:
            figures = nvml_per_process(ctx.nvml)
        except Exception as e:
            ctx.log(f"reconcile: NVML per-process figures: {e}")
            return
        root = claims_dir(ctx.cfg.state_dir)
        for d in sorted(root.iterdir()) if root.is_dir() else []:
            region = d / REGION_FILE
            if not region.is_file():
                continue
            try:
                reconcile_claim(d, read_region(str(region)), figures)
            except (RegionError, OSError) as e:
                ctx.log(f"reconcile: claim {d.name}: {e}")

    def loop(self) -> None:
        """Rescan every ``rescan_seconds`` (sooner when a slice change is due or ``wake`` is
        set) while this instance publishes, until ``stop``."""
        ctx = self.ctx
        while not self._stop.is_set():
            assert ctx.publisher is not None
            wait = ctx.cfg.rescan_seconds
            nxt = ctx.publisher.next_change()
            if nxt is not None:
                wait = min(wait, nxt + 0.05)
            self._wake.wait(wait)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                publishing = self.lease.publishes()
            except OSError as e:
                ctx.log(f"{self.lease.path}: {e.strerror or e}; rescanning anyway")
                publishing = True
            if ctx.publisher.health is not None:
                # Only the instance that judges the GPUs tells the kubelet about them.
                ctx.publisher.health.silence(not publishing)
            if publishing:
                self.rescan()
