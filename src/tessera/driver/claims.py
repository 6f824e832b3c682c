"""The claim prepare/unprepare state machine of the node driver (:class:`ClaimPreparer`): the
kubelet's batches of claims planned, their files written, recorded in the checkpoint and
answered, and removed again; and :class:`ClaimStatusWriter`, which writes a prepared claim's
``status.devices`` in the background.

Per claim (the checkpoint's :class:`~.checkpoint.ClaimState`): none → (``preparing``, with
dynamic MIG: placements recorded, instances made) → ``prepared`` (files written, then recorded)
→ (``unpreparing``, with dynamic MIG: recorded before the instances are destroyed) → none
(files removed, then the entry). Each claim of a batch is serialized on its own lock
(:meth:`~.context.DriverContext.lock_for`); the checkpoint is written once per batch and phase.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from tessera.enforcement.limits import LimitsError
from tessera.kube.client import ApiError

from .checkpoint import ClaimEntry, ClaimState
from .context import NOT_KEPT, DriverContext, io_fault
from .instances import MigInstances
from .kubelet import ClaimRef, PrepareResult
from .locks import FileLock
from .mig import read_mig_minors
from .prepare import (
    ClaimError,
    ClaimPlan,
    NodeDevice,
    materialize,
    node_devices,
    remove_files,
    write_node_shares,
)


class ClaimStatusWriter:
    """Writes each prepared claim's ``status.devices`` (server-side apply of the status
    subresource) from a queue, on a thread of its own; failures are counted in
    ``stats.status_errors`` and logged."""

    def __init__(self, ctx: DriverContext, stop: threading.Event) -> None:
        self.ctx = ctx
        self._stop = stop
        self._q: queue.Queue[ClaimPlan | None] = queue.Queue()

    def put(self, plan: ClaimPlan) -> None:
        """Queue ``plan``'s status (nothing is written for a plan without one)."""
        self._q.put(plan)

    def close(self) -> None:
        """End :meth:`loop` (after what it is writing now)."""
        self._q.put(None)

    def loop(self) -> None:
        """Write queued statuses until :meth:`close` or the stop event."""
        cfg = self.ctx.cfg
        while True:
            plan = self._q.get()
            if plan is None or self._stop.is_set():
                return
            if not plan.status:
                continue
            obj = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {
                    "name": plan.ref.name,
                    "namespace": plan.ref.namespace,
                    "uid": plan.ref.uid,
                },
                "status": {"devices": [dict(e, data=e["data"]) for e in plan.status]},
            }
            try:
                self.ctx.client.apply_status(obj, field_manager=f"{cfg.driver}-{cfg.node_name}")
            except ApiError as e:
                self.ctx.stats.status_errors += 1
                self.ctx.log(
                    f"ResourceClaim {plan.ref.namespace}/{plan.ref.name}: status.devices not written: {e}"
                )


class ClaimPreparer:
    """NodePrepareResources and NodeUnprepareResources of the driver (see the module doc)."""

    def __init__(
        self, ctx: DriverContext, instances: MigInstances, status: ClaimStatusWriter
    ) -> None:
        self.ctx = ctx
        self.instances = instances
        self.status = status
        self._devices_cache: tuple[object, int, dict[str, NodeDevice]] | None = None
        self._minors_cache: tuple[float, dict[str, int]] | None = None
        #: Held while the shares files are written: each writer reads the checkpoint after
        #: taking it, so the last one writes what the last committed change left.
        self._shares_lock = threading.Lock()
        #: The checkpoint change the shares files were last written from (all before it too).
        self._shares_covered = 0
        #: The lanes of this process for planning and writing claims' files (the API reads
        #: before them and the checkpoint write after them stay concurrent):
        #: ``cfg.prepare_lanes`` calls' work at a time (1: one, as the upstream Go helper,
        #: ``kubeletplugin.Serialize``, serializes its calls), instead of every handler's
        #: claims interleaved on one interpreter; 0: no lane.
        lanes = ctx.cfg.prepare_lanes
        self._lane: contextlib.AbstractContextManager[Any] = (
            threading.BoundedSemaphore(lanes) if lanes > 0 else contextlib.nullcontext()
        )

    def read_claim(self, ref: ClaimRef) -> dict[str, Any]:
        """GET the ResourceClaim (the kubelet only sends namespace, name, uid); the time it
        took goes to ``stats.api_read`` (seconds). Raises :class:`~tessera.kube.client.ApiError`."""
        t0 = time.perf_counter()
        try:
            return self.ctx.client.get(
                "resource.k8s.io/v1", "ResourceClaim", ref.name, ref.namespace
            )
        finally:
            self.ctx.stats.api_read.append(time.perf_counter() - t0)

    def _devices(self) -> dict[str, NodeDevice]:
        """The node's published devices as prepare needs them (rebuilt when the slices or
        the registry change)."""
        publisher, registry = self.ctx.publisher, self.ctx.registry
        assert publisher is not None
        key = (publisher.published, registry.version)
        c = self._devices_cache
        if c is None or c[0] is not key[0] or c[1] != key[1]:
            c = (key[0], key[1], node_devices(registry.snapshot(), publisher.published))
            self._devices_cache = c
        return c[2]

    def _mig_minors(self) -> dict[str, int]:
        """``/proc/driver/nvidia-caps/mig-minors`` (read again when it changes)."""
        layout = self.ctx.layout
        try:
            mtime = layout.mig_minors.stat().st_mtime
        except OSError:
            return {}
        c = self._minors_cache
        if c is None or c[0] != mtime:
            c = (mtime, read_mig_minors(layout.mig_minors))
            self._minors_cache = c
        return c[1]

    @staticmethod
    def _claim_error(ref: ClaimRef, e: ApiError) -> PrepareResult:
        return PrepareResult(
            error=f"ResourceClaim {ref.namespace}/{ref.name}: {e.reason or 'error'}: {e.message}"
        )

    # ---- prepare ---------------------------------------------------------------------------
    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        """NodePrepareResources for a batch of claims; one result per claim UID (an error
        line, or the devices to answer).

        Per claim: the recorded plan when the checkpoint has one, else a new plan from the
        ResourceClaim; a claim with dynamic-MIG devices first gets its instances
        (:meth:`~.instances.MigInstances.make`); its files are written, then new claims are
        recorded (one checkpoint write for the batch, shared with concurrent batches), then the
        answer is given. Times per claim go to ``stats`` (seconds).
        """
        store = self.ctx.store
        out: dict[str, PrepareResult] = {}
        fetched: dict[str, dict[str, Any]] = {}
        for ref in claims:
            entry = store.get(ref.uid)
            if entry is not None and entry.state == ClaimState.PREPARED:
                continue  # prepared before: the recorded plan is used
            try:
                fetched[ref.uid] = self.read_claim(ref)
            except ApiError as e:
                out[ref.uid] = self._claim_error(ref, e)
        todo = [r for r in claims if r.uid not in out]
        locks = self._lock_claims(todo, out)
        todo = [r for r in todo if r.uid not in out]
        new: dict[str, ClaimEntry] = {}
        plans: dict[str, ClaimPlan] = {}
        stats = self.ctx.stats
        try:
            w0 = time.perf_counter()
            with self._lane:
                t0 = time.perf_counter()
                pending, devices, minors = self._plan(todo, fetched, out, plans, new)
                self._write_files(plans, new, out)
            lane = t0 - w0
            if pending:
                # Dynamic MIG: the instances are made outside the lane (NVML and checkpoint
                # writes of their own), then their claims' files are written in it.
                made = self.instances.make(pending, fetched, devices, minors, out)
                made_new = {uid: ClaimEntry.prepared(plan) for uid, plan in made.items()}
                w1 = time.perf_counter()
                with self._lane:
                    lane += time.perf_counter() - w1
                    self._write_files(made, made_new, out)
                plans.update(made)
                new.update(made_new)
            t1 = time.perf_counter()
            if new:
                self._record(plans, new, fetched, out)
            for uid, plan in plans.items():
                out[uid] = PrepareResult(devices=plan.devices)
            t2 = time.perf_counter()
            n = max(1, len(todo))
            stats.lane_wait.extend([lane / n] * len(todo))
            stats.prepare.extend([(t2 - w0 - lane) / n] * len(todo))
            stats.prepare_work.extend([(t1 - w0 - lane) / n] * len(todo))
            stats.checkpoint_wait.extend([(t2 - t1) / n] * len(todo))
        finally:
            self.ctx.release_claims(locks)
        for uid in new:
            if uid in plans:
                self.status.put(plans[uid])
        return out

    def _lock_claims(
        self, todo: Sequence[ClaimRef], out: dict[str, PrepareResult]
    ) -> list[FileLock]:
        """Take the lock of each claim of ``todo`` (in UID order); one that cannot be taken
        (a read-only or full state directory) fails its claim in ``out``, the others go on."""
        locks = []
        for u in sorted({r.uid for r in todo}):
            lk = self.ctx.lock_for(u)
            try:
                lk.acquire()
            except OSError as e:
                ref = next(r for r in todo if r.uid == u)
                out[u] = PrepareResult(
                    error=f"ResourceClaim {ref.namespace}/{ref.name}: its lock: {io_fault(e)}{NOT_KEPT}"
                )
                continue
            locks.append(lk)
        return locks

    def _plan(
        self,
        todo: Sequence[ClaimRef],
        fetched: dict[str, dict[str, Any]],
        out: dict[str, PrepareResult],
        plans: dict[str, ClaimPlan],
        new: dict[str, ClaimEntry],
    ) -> tuple[dict[str, ClaimPlan], dict[str, NodeDevice], dict[str, int]]:
        """Plan each claim of ``todo`` (locks held): into ``plans`` (by UID) its recorded
        plan, or a new one (also into ``new``, to be recorded); errors go to ``out``. Returns
        the plans still waiting for their dynamic-MIG instances (by UID), with the node's
        devices and MIG minors they were planned with (for :meth:`~.instances.MigInstances.make`)."""
        store = self.ctx.store
        devices = self._devices()
        minors = self._mig_minors() if any(d.mig or d.placement for d in devices.values()) else {}
        pending: dict[str, ClaimPlan] = {}
        for ref in todo:
            entry = store.get(ref.uid)
            if entry is not None and entry.state == ClaimState.PREPARED and entry.plan:
                plans[ref.uid] = entry.plan
                continue
            if entry is not None and entry.state == ClaimState.UNPREPARING:
                err = self.instances.unprepare(ref, entry)  # finish it before preparing again
                if err:
                    out[ref.uid] = PrepareResult(error=err)
                    continue
            if ref.uid not in fetched:  # recorded when we looked, unprepared since
                try:
                    fetched[ref.uid] = self.read_claim(ref)
                except ApiError as e:
                    out[ref.uid] = self._claim_error(ref, e)
                    continue
            try:
                plan = self.ctx.plan(fetched[ref.uid], ref, devices, minors)
            except ClaimError as e:
                out[ref.uid] = PrepareResult(error=str(e))
                continue
            if plan.pending:
                pending[ref.uid] = plan
                continue
            plans[ref.uid] = plan
            new[ref.uid] = ClaimEntry.prepared(plan)
        return pending, devices, minors

    def _write_files(
        self,
        plans: dict[str, ClaimPlan],
        new: dict[str, ClaimEntry],
        out: dict[str, PrepareResult],
    ) -> None:
        """Write each planned claim's files; a claim whose files cannot be written leaves
        ``plans`` (and ``new``) with its error in ``out``."""
        for uid, plan in list(plans.items()):
            try:
                materialize(plan, self.ctx.layout)
            except LimitsError as e:
                # A recorded plan of a newer driver (a rollback): nothing was written.
                new.pop(uid, None)
                out[uid] = PrepareResult(
                    error=f"ResourceClaim {plan.ref.namespace}/{plan.ref.name}: its recorded "
                    f"limits file is not one this driver writes ({e}); roll forward to the "
                    "driver that prepared it, or delete its pods so that it is prepared again"
                )
                del plans[uid]
                continue
            except OSError as e:
                recorded = new.pop(uid, None) is None
                if not recorded:
                    # Not recorded: nothing of it may stay (each file was written whole or
                    # not at all; those written before the fault go too).
                    self._remove_quietly(uid)
                out[uid] = PrepareResult(
                    error=f"ResourceClaim {plan.ref.namespace}/{plan.ref.name}: writing its "
                    f"files: {io_fault(e)}"
                    + (
                        "; it stays prepared, and its files are written again at the "
                        "kubelet's retry"
                        if recorded
                        else NOT_KEPT
                    )
                )
                plans.pop(uid)

    def _record(
        self,
        plans: dict[str, ClaimPlan],
        new: dict[str, ClaimEntry],
        fetched: dict[str, dict[str, Any]],
        out: dict[str, PrepareResult],
    ) -> None:
        """Record the ``new`` claims (one checkpoint write), then the node's shares files;
        when the write fails, nothing of them stays (files removed, errors in ``out``)."""
        change: int | None = None
        try:
            change = self.ctx.store.update(put=new)
        except OSError as e:
            for uid in new:
                self._remove_quietly(uid)
                plans.pop(uid, None)
                out[uid] = PrepareResult(
                    error=f"ResourceClaim {fetched[uid]['metadata'].get('namespace')}/"
                    f"{fetched[uid]['metadata'].get('name')}: recording it in the "
                    f"checkpoint: {io_fault(e)}{NOT_KEPT}"
                )
        self.write_shares(change)

    def _remove_quietly(self, uid: str) -> None:
        """Remove the files of a claim whose prepare failed; a removal that fails too (a
        read-only directory) is logged, and start-up or the next prepare removes them."""
        try:
            remove_files(uid, self.ctx.layout)
        except OSError as e:
            self.ctx.log(f"claim {uid}: removing the files of a failed prepare: {io_fault(e)}")

    # ---- unprepare -------------------------------------------------------------------------
    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources: remove each claim's files, then its checkpoint entry; one
        error line (or '') per claim UID. A claim with dynamic-MIG instances is recorded
        ``unpreparing`` first, and its instances are destroyed (those of the whole GPU only with
        its last share) before the entry goes. Raises ``OSError`` when the checkpoint cannot be
        written."""
        store = self.ctx.store
        out: dict[str, str] = {}
        locks = [self.ctx.lock_for(u) for u in sorted({r.uid for r in claims})]
        for lk in locks:
            lk.acquire()
        try:
            gone = []
            for ref in claims:
                entry = store.get(ref.uid)
                if entry is not None and entry.mig_slots:
                    out[ref.uid] = self.instances.unprepare(ref, entry)
                    continue
                try:
                    remove_files(ref.uid, self.ctx.layout)
                except OSError as e:
                    out[ref.uid] = (
                        f"ResourceClaim {ref.namespace}/{ref.name}: removing its files: {e}"
                    )
                    continue
                gone.append(ref.uid)
                out[ref.uid] = ""
            if gone:
                self.write_shares(store.update(drop=gone))
        finally:
            self.ctx.release_claims(locks)
        return out

    def write_shares(self, change: int | None = None) -> None:
        """The node's per-GPU shares files, from every prepared claim in the checkpoint (what
        best-effort tenants are held to); a failure is logged, pacing then keeps the last.

        ``change``: the checkpoint change (:meth:`~.checkpoint.Checkpoint.update`'s number)
        the files must reflect; when a concurrent caller already wrote them from that change
        or a later one, nothing is written again (one write per wave of concurrent claims).
        None: written from the checkpoint as it is now."""
        layout = self.ctx.layout
        store = self.ctx.store
        with self._shares_lock:
            if change is not None and self._shares_covered >= change:
                return
            covered = store.committed  # entries() below hold every change up to it
            plans = [
                e.plan
                for e in store.entries().values()
                if e.state == ClaimState.PREPARED and e.plan
            ]
            try:
                write_node_shares(layout, plans)
                self._shares_covered = max(self._shares_covered, covered)
            except (OSError, ValueError) as e:
                self.ctx.log(f"warning: writing the GPU shares files in {layout.shares_dir}: {e}")
