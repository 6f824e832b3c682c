"""What the node driver settles at start before it serves (:class:`StartupReconciler`): claims
whose recorded plan a reboot made stale, and the files of claims the checkpoint does not
record (or records, but whose files are missing or differ)."""

from __future__ import annotations

import dataclasses
import time

from tessera.enforcement.layout import claims_dir
from tessera.enforcement.limits import LimitsError

from .checkpoint import ClaimEntry, ClaimState
from .context import DriverContext, DriverStartError
from .discovery import Inventory
from .locks import FileLock
from .prepare import materialize, plan_stale, remove_files


class StartupReconciler:
    """The start-up reconciliation of the checkpoint with the GPUs and the files on disk."""

    def __init__(self, ctx: DriverContext) -> None:
        self.ctx = ctx

    # ---- what a reboot took away ----------------------------------------------------------
    def reconcile_claims(self, inv: Inventory) -> None:
        """At start: check every prepared claim's recorded plan against the GPUs and MIG
        devices NVML lists now (:func:`~.prepare.plan_stale`). A stale plan (a GPU gone or at
        another minor, a MIG instance gone: a reboot) is never answered again: its files are
        removed and its entry dropped, so the kubelet's next prepare plans the claim afresh from
        its allocation (a vanished GPU then fails it in one line); a claim with dynamic-MIG
        slots keeps them as a ``preparing`` entry (the placements stay the driver's), and the
        retry makes its instances again. One checkpoint write; each claim under its lock (one
        another instance holds is left alone). Raises :class:`~.context.DriverStartError` when
        the checkpoint cannot be written."""
        ctx = self.ctx
        gpus = {
            ng.gpu.uuid: (ng.minor, frozenset(m.uuid for m in ng.gpu.mig_devices if m.uuid))
            for ng in inv.gpus
        }
        put: dict[str, ClaimEntry] = {}
        drop: list[str] = []
        locks: list[FileLock] = []
        try:
            for uid, entry in sorted(ctx.store.entries().items()):
                if entry.state != ClaimState.PREPARED or entry.plan is None:
                    continue
                plan = entry.plan
                why = plan_stale(plan, gpus)
                if why is None:
                    continue
                lk = ctx.lock_for(uid)
                if not lk.acquire(blocking=False):
                    continue
                locks.append(lk)
                remove_files(uid, ctx.layout)
                ref = plan.ref
                # Placements on a GPU that is gone hold nothing any more (and NVML could not
                # destroy them at unprepare): only those on present GPUs stay recorded.
                kept = [m for m in plan.mig if m.gpu_uuid in gpus]
                if kept:
                    put[uid] = ClaimEntry.preparing(
                        ref,
                        [dataclasses.replace(m, gi=None, ci=None, uuid=None) for m in kept],
                        time.time(),
                    )
                else:
                    drop.append(uid)
                ctx.log(
                    f"ResourceClaim {ref.namespace}/{ref.name}: its recorded plan is stale: {why}; "
                    "removed its files and prepared state: the kubelet's next prepare plans it "
                    "again from its allocation"
                    + (" (its MIG placements stay recorded and are made again)" if kept else "")
                )
            if put or drop:
                try:
                    ctx.store.update(put=put, drop=drop)
                except OSError as e:
                    raise DriverStartError(
                        f"--state-dir {ctx.cfg.state_dir}: checkpoint: {e.strerror or e}"
                    ) from e
        finally:
            ctx.release_claims(locks)

    # ---- files left by a crash -----------------------------------------------------------
    def reconcile_files(self, alone: bool) -> None:
        """At start: remove the files of claims the checkpoint does not record as prepared,
        and write a recorded claim's files again where they are missing or differ. Each claim
        is handled under its lock, and skipped while another driver instance holds it (it is
        being prepared or unprepared there). Temporary files of interrupted writes are removed
        only when no other instance runs (``alone``): another's may be in flight."""
        ctx = self.ctx
        # Only prepared claims have files; an interrupted prepare writes them again.
        known = {u for u, e in ctx.store.entries().items() if e.state == ClaimState.PREPARED}
        removed = self._remove_leftovers(known, alone)
        if removed:
            ctx.log(f"removed leftovers not in the checkpoint: {', '.join(sorted(removed))}")
        repaired = []
        for uid in sorted(known):
            lk = ctx.lock_for(uid)
            if not lk.acquire(blocking=False):
                continue
            try:
                entry = ctx.store.get(uid)
                if (
                    entry is not None
                    and entry.state == ClaimState.PREPARED
                    and entry.plan is not None
                    and materialize(entry.plan, ctx.layout)
                ):
                    repaired.append(uid)
            except LimitsError as e:
                # Recorded by a newer driver (a rollback): its files are left as they are; its
                # running containers keep them (docs/install.md, "Supported skew").
                ctx.log(
                    f"recorded claim {uid}: its limits file is not one this driver writes again "
                    f"({e}); its files are left as they are: roll forward to the driver that "
                    "prepared it, or delete its pods so that it is prepared again"
                )
            finally:
                ctx.release_claims([lk])
        if repaired:
            ctx.log(f"rewrote the files of recorded claims: {', '.join(sorted(repaired))}")

    def _remove_leftovers(self, known: set[str], alone: bool) -> list[str]:
        """Remove the CDI specs and claim directories of claims not in ``known`` (each under
        its claim's lock, read again there) and, when ``alone``, temporary files of
        interrupted writes. Returns what it removed (file names, ``claim <uid>``)."""
        ctx = self.ctx
        cfg = ctx.cfg
        removed = []
        prefix = f"{cfg.driver}-claim_"
        leftovers: set[str] = set()
        if cfg.cdi_dir.is_dir():
            for p in cfg.cdi_dir.iterdir():
                if p.name.startswith(".tessera-cdi."):
                    if alone:
                        p.unlink(missing_ok=True)
                        removed.append(p.name)
                elif (
                    p.name.startswith(prefix)
                    and p.name.endswith(".json")
                    and p.name[len(prefix) : -5] not in known
                ):
                    leftovers.add(p.name[len(prefix) : -5])
        claims = claims_dir(cfg.state_dir)
        if claims.is_dir():
            for d in claims.iterdir():
                if d.name not in known:
                    leftovers.add(d.name)
                elif alone:
                    for f in d.iterdir():
                        if f.name.startswith("."):
                            f.unlink(missing_ok=True)
        for uid in sorted(leftovers):
            lk = ctx.lock_for(uid)
            if not lk.acquire(blocking=False):
                continue
            try:
                entry = ctx.store.get(uid)
                if entry is None or entry.state != ClaimState.PREPARED:
                    remove_files(uid, ctx.layout)
                    removed.append(f"claim {uid}")
            finally:
                ctx.release_claims([lk])
        if alone:
            for f in cfg.state_dir.glob(".*"):
                if f.is_file() and f.name.split(".")[1] in (
                    "checkpoint",
                    "gpus",
                    "preload",
                    "publisher",
                ):
                    f.unlink(missing_ok=True)
        return removed
