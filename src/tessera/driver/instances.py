"""The node driver's dynamic-MIG instances over their claims' lives (:class:`MigInstances`):
made at prepare after their placements are recorded (and their ids right after each is made),
destroyed at unprepare, and settled after a crash (at start, and at rescans for interrupted
prepares whose claim is gone). Only an instance whose placement and ids an entry records is
adopted or destroyed (:func:`.mig.recorded`). Every change of an instance is made under the
context's ``mig_lock``; the NVML calls are :mod:`.mig`'s."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from tessera.kube.client import ApiError

from .checkpoint import ClaimEntry, ClaimState
from .context import DYNAMIC_MIG_OPTION, STALE_PREPARE_SECONDS, DriverContext
from .kubelet import ClaimRef, PrepareResult
from .mig import MigError, MigOps, MigSlot, owned, unrecorded
from .prepare import ClaimError, ClaimPlan, NodeDevice, remove_files

#: The states whose slots hold instances a claim uses (or is about to).
HOLDING = (ClaimState.PREPARING, ClaimState.PREPARED)


class MigInstances:
    """Makes, destroys and recovers the MIG instances of the driver's claims; the checkpoint
    says which instances are the driver's (an entry records their placement and ids)."""

    def __init__(self, ctx: DriverContext) -> None:
        self.ctx = ctx

    @property
    def ops(self) -> MigOps:
        """NVML's MIG operations (asserts NVML was loaded)."""
        assert self.ctx.mig is not None
        return self.ctx.mig

    def claim_gone(self, ref: ClaimRef) -> str | None:
        """Why the claim of an interrupted prepare will never be prepared here (None: it may
        be: the API server does not say otherwise, or cannot be asked)."""
        cfg = self.ctx.cfg
        try:
            claim = self.ctx.client.get(
                "resource.k8s.io/v1", "ResourceClaim", ref.name, ref.namespace
            )
        except ApiError as e:
            return "deleted" if e.status == 404 else None
        if (claim.get("metadata") or {}).get("uid") != ref.uid:
            return "replaced by another claim of that name"
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        ) or []
        if not any(
            r.get("driver") == cfg.driver and r.get("pool") == cfg.node_name for r in results
        ):
            return "no longer allocated on this node"
        return None

    def with_record(self, uid: str, s: MigSlot) -> MigSlot:
        """``s`` (a slot of claim ``uid``) with the instance ids another claim's entry records
        for the same shared placement (the whole dynamic GPU, made by the first claim sharing
        it), when ``s`` records none; else ``s``."""
        if not s.shared or s.gi is not None:
            return s
        for u, e in self.ctx.store.entries().items():
            if u == uid or e.state not in HOLDING:
                continue
            for o in e.mig_slots:
                if o.key == s.key and o.gi is not None:
                    return replace(s, profile_id=o.profile_id, gi=o.gi, ci=o.ci, uuid=o.uuid)
        return s

    def release(self, uid: str, slots: Sequence[MigSlot]) -> tuple[list[str], list[str]]:
        """Destroy the instances of ``slots`` (the driver's, for claim ``uid``) that no other
        claim still uses (the whole dynamic GPU is shared) and that the slots record
        (:func:`.mig.recorded`). Call with ``mig_lock`` held. Returns ``(gone, left)``: what
        was destroyed (``"<profile> at slice <start> of GPU <index>"`` each) and, one line each
        (:func:`.mig.unrecorded`), the instances at the slots' placements that were left alone
        because no record names them. Raises :class:`~.mig.MigError`."""
        others = {
            s.key
            for u, e in self.ctx.store.entries().items()
            if u != uid and e.state in HOLDING
            for s in e.mig_slots
        }
        gone, left = [], []
        for s in slots:
            if s.key in others:
                continue
            s = self.with_record(uid, s)
            destroyed, foreign = self.ops.destroy(s)
            if destroyed:
                gone.append(f"{s.profile} at slice {s.start} of GPU {s.gpu_index}")
            if foreign is not None:
                left.append(unrecorded(self.ops.resolve(s), foreign))
        return gone, left

    # ---- left by a crash ---------------------------------------------------------------------
    def recover(self) -> bool:
        """At start: settle the MIG instances of checkpoint entries an earlier process left
        unfinished. ``unpreparing``: its instances are destroyed and the entry removed (the
        kubelet's retry of the unprepare then finds nothing to do). ``preparing``: when the
        claim is gone from the API server (or no longer allocated here), likewise; otherwise the
        instances it records are adopted as they are, and the kubelet's retry of the prepare
        uses them. Only instances whose placement and ids an entry records are destroyed or
        adopted (:func:`.mig.recorded`); one at a recorded placement that the entry does not
        record is left alone and logged with how to free it (the retried prepare is refused
        until then). Returns True when it destroyed anything."""
        changed = False
        for uid, listed in self.ctx.store.entries().items():
            if (
                listed.state
                not in (
                    ClaimState.PREPARING,
                    ClaimState.UNPREPARING,
                )
                or not listed.mig_slots
            ):
                continue
            lk = self.ctx.lock_for(uid)
            if not lk.acquire(blocking=False):
                continue  # another driver instance is preparing or unpreparing it right now
            try:
                changed = self._recover_one(uid) or changed
            finally:
                self.ctx.release_claims([lk])
        return changed

    def _recover_one(self, uid: str) -> bool:
        """:meth:`recover` for one entry, read again under its claim's lock (held); True when
        it destroyed an instance."""
        entry = self.ctx.store.get(uid)
        if entry is None:
            return False
        slots = entry.mig_slots
        state = entry.state
        if state not in (ClaimState.PREPARING, ClaimState.UNPREPARING) or not slots:
            return False
        assert entry.claim is not None  # a preparing or unpreparing entry names its claim
        ref = entry.claim
        why = (
            "its unprepare was interrupted"
            if state == ClaimState.UNPREPARING
            else self.claim_gone(ref)
        )
        if why is None:
            adopted, left = 0, []
            for s in slots:
                try:
                    s = self.ops.resolve(self.with_record(uid, s))
                    found, mine = self.ops.at(s)
                except MigError as e:
                    left.append(str(e))
                    continue
                if mine:
                    adopted += 1
                elif found is not None:
                    left.append(unrecorded(s, found))
            self.ctx.log(
                f"ResourceClaim {ref.namespace}/{ref.name}: prepare was interrupted; adopted "
                f"{adopted} of its {len(slots)} MIG instance(s) for the kubelet's retry"
                + "".join(f"; {line}" for line in left)
            )
            return False
        try:
            with self.ctx.mig_lock:
                gone, left = self.release(uid, slots)
        except MigError as e:
            self.ctx.log(
                f"ResourceClaim {ref.namespace}/{ref.name}: {why}; its MIG instances stay: {e}"
            )
            return False
        remove_files(uid, self.ctx.layout)
        self.ctx.store.update(drop=[uid])
        self.ctx.log(
            f"ResourceClaim {ref.namespace}/{ref.name}: {why}; destroyed its MIG instance(s): "
            f"{', '.join(gone) or 'none left'}" + "".join(f"; {line}" for line in left)
        )
        return bool(gone)

    def cleanup_stale(self) -> None:
        """At rescans: interrupted prepares older than :data:`~.context.STALE_PREPARE_SECONDS`
        whose claim is gone get their instances destroyed (the kubelet will not retry them).
        Raises :class:`~tessera.kube.client.ApiError` or ``OSError``."""
        if self.ctx.mig is None:
            return
        now = time.time()
        for uid, entry in self.ctx.store.entries().items():
            if (
                entry.state != ClaimState.PREPARING
                or now - (entry.since if entry.since is not None else now) < STALE_PREPARE_SECONDS
            ):
                continue
            lk = self.ctx.lock_for(uid)
            if not lk.acquire(blocking=False):
                continue  # a prepare or unprepare of it is running
            try:
                self._cleanup_one(uid)
            finally:
                self.ctx.release_claims([lk])

    def _cleanup_one(self, uid: str) -> None:
        """:meth:`cleanup_stale` for one entry, read again under its claim's lock (held)."""
        entry = self.ctx.store.get(uid)
        if entry is None or entry.state != ClaimState.PREPARING:
            return
        assert entry.claim is not None
        ref = entry.claim
        why = self.claim_gone(ref)
        if why is None:
            return
        try:
            with self.ctx.mig_lock:
                gone, left = self.release(uid, entry.mig_slots)
        except MigError as e:
            self.ctx.log(
                f"ResourceClaim {ref.namespace}/{ref.name}: {why}; its MIG instances stay: {e}"
            )
            return
        remove_files(uid, self.ctx.layout)
        self.ctx.store.update(drop=[uid])
        self.ctx.log(
            f"ResourceClaim {ref.namespace}/{ref.name}: {why} before its prepare finished; "
            f"destroyed its MIG instance(s): {', '.join(gone) or 'none left'}"
            + "".join(f"; {line}" for line in left)
        )

    # ---- prepare and unprepare -----------------------------------------------------------------
    def foreign_problem(self, uid: str, slots: Sequence[MigSlot]) -> str | None:
        """Why the placements of ``slots`` are taken by instances no entry records
        (:func:`.mig.unrecorded`) or by another claim's, or None. Checked before a claim's
        first intent is recorded."""
        entries = {u: e for u, e in self.ctx.store.entries().items() if u != uid}
        mine = owned(entries.values())
        shared_users = {
            s.key for e in entries.values() if e.state in HOLDING for s in e.mig_slots if s.shared
        }
        for s in slots:
            for gi in self.ops.occupied(s):
                exact = (gi.profile_id, gi.start, gi.size) == (s.profile_id, s.start, s.size)
                if s.shared and exact and s.key in shared_users:
                    continue  # the whole GPU's instance, shared with claims prepared before
                if (gi.profile_id, gi.start, gi.size) not in (mine.get(s.gpu_uuid) or set()):
                    return unrecorded(s, gi)
                return (
                    f"{s.device}: GPU {s.gpu_index} ({s.gpu_uuid}) memory slices {s.start}-{s.start + s.size - 1} "
                    f"are held by GPU instance {gi.id} (another claim's); destroy it or leave the GPU "
                    f"out of {DYNAMIC_MIG_OPTION}"
                )
        return None

    def make(
        self,
        pending: dict[str, ClaimPlan],
        fetched: dict[str, dict[str, Any]],
        devices: dict[str, NodeDevice],
        minors: dict[str, int],
        out: dict[str, PrepareResult],
    ) -> dict[str, ClaimPlan]:
        """Make the dynamic-MIG instances of ``pending`` plans (by claim UID) and plan those
        claims again with them (``fetched``: their ResourceClaims); returns the new plans by
        claim UID, errors go to ``out``. Order, for crash safety: the claim's slots are
        recorded (``preparing``: one checkpoint write for all), then the instances are made
        under ``mig_lock``, each creation step recorded (one write each) before the next - or
        found, when an interrupted attempt made and recorded them. A placement held by an
        instance the claim's entry does not record is refused (:func:`.mig.unrecorded`). A
        failure destroys what the claim holds alone and records, and removes its record."""
        if self.ctx.mig is None:
            for uid, plan in pending.items():
                out[uid] = PrepareResult(
                    error=f"ResourceClaim {plan.ref.namespace}/{plan.ref.name}: its dynamic-MIG "
                    "devices need NVML, which this driver could not load"
                )
            return {}
        resolved = self._record_intents(pending, out)
        done: dict[str, ClaimPlan] = {}
        failed: list[str] = []
        for uid, slots in resolved.items():
            ref = pending[uid].ref
            made = self._realise(uid, ref, slots, out, failed)
            if made is None:
                continue
            try:
                done[uid] = self.ctx.plan(fetched[uid], ref, devices, minors, made)
            except ClaimError as e:
                # e.g. a limits file the node's library cannot read: the instances just made
                # would stay the claim's while it is refused at every retry
                out[uid] = PrepareResult(error=str(e))
                self._undo(uid, ref, list(made.values()), failed)
        if failed:
            self.ctx.store.update(drop=failed)
        return done

    def _record_intents(
        self, pending: dict[str, ClaimPlan], out: dict[str, PrepareResult]
    ) -> dict[str, list[MigSlot]]:
        """Resolve each pending claim's slots, check their placements are free (or the
        claim's own from an interrupted attempt, whose recorded instance ids are kept) and
        record them (``preparing``, one write). Returns the slots by claim UID of those
        recorded; errors go to ``out``."""
        intents: dict[str, ClaimEntry] = {}
        resolved: dict[str, list[MigSlot]] = {}
        for uid, plan in pending.items():
            ref = plan.ref
            what = f"ResourceClaim {ref.namespace}/{ref.name}"
            try:
                slots = [self.ops.resolve(s) for s in plan.mig]
            except MigError as e:
                out[uid] = PrepareResult(error=f"{what}: {e}")
                continue
            entry = self.ctx.store.get(uid)
            prior = (
                entry.mig_slots
                if entry is not None and entry.state == ClaimState.PREPARING
                else None
            )
            if prior is not None and {s.key for s in prior} != {s.key for s in slots}:
                # Allocated again since the interrupted attempt: undo that attempt first.
                try:
                    with self.ctx.mig_lock:
                        self.release(uid, prior)
                except MigError as e:
                    out[uid] = PrepareResult(error=f"{what}: {e}")
                    continue
                prior = None
            if prior is not None:
                by_key = {p.key: p for p in prior}
                slots = [by_key[s.key] for s in slots]  # with the ids the attempt recorded
            else:
                problem = self.foreign_problem(uid, slots)
                if problem:
                    out[uid] = PrepareResult(error=f"{what}: {problem}")
                    continue
            resolved[uid] = slots
            intents[uid] = ClaimEntry.preparing(ref, slots, time.time())
        if intents:
            try:
                self.ctx.store.update(put=intents)
            except OSError as e:
                for uid in intents:
                    out[uid] = PrepareResult(
                        error=f"ResourceClaim {pending[uid].ref.namespace}/{pending[uid].ref.name}: checkpoint: {e}"
                    )
                return {}
        return resolved

    def _realise(
        self,
        uid: str,
        ref: ClaimRef,
        slots: Sequence[MigSlot],
        out: dict[str, PrepareResult],
        failed: list[str],
    ) -> dict[tuple[str, str, int], MigSlot] | None:
        """Make (or find, when its entry records them) the instances of a recorded claim's
        ``slots``, under ``mig_lock``, writing each creation step into its ``preparing`` entry
        (and the ids of a shared instance another claim made, once found); returns them by
        slot key. On a :class:`~.mig.MigError` or a failed checkpoint write the error goes to
        ``out``, what the claim holds alone and records is destroyed and its UID appended to
        ``failed`` (its record is to go; a failing undo is logged and left to the kubelet's
        retry), and None is returned."""
        what = f"ResourceClaim {ref.namespace}/{ref.name}"
        entry = self.ctx.store.get(uid)
        since = entry.since if entry is not None and entry.since is not None else time.time()
        current = list(slots)
        made: dict[tuple[str, str, int], MigSlot] = {}

        def record(i: int, s: MigSlot) -> None:
            current[i] = s
            self.ctx.store.update(put={uid: ClaimEntry.preparing(ref, current, since)})

        try:
            with self.ctx.mig_lock:
                for i, s in enumerate(slots):
                    m = self.ops.realise(
                        self.with_record(uid, s),
                        partial(record, i),
                        lambda line: self.ctx.log(f"{what}: {line}"),
                    )
                    if (m.gi, m.ci, m.uuid) != (current[i].gi, current[i].ci, current[i].uuid):
                        record(i, m)  # a shared instance another claim made: now this one's too
                    made[m.key] = m
        except (MigError, OSError) as e:
            out[uid] = PrepareResult(
                error=f"{what}: {e}" if isinstance(e, MigError) else f"{what}: checkpoint: {e}"
            )
            self._undo(uid, ref, current, failed)
            return None
        return made

    def _undo(self, uid: str, ref: ClaimRef, slots: Sequence[MigSlot], failed: list[str]) -> None:
        """A failed prepare of claim ``uid``: destroy what it holds alone of ``slots`` (the
        instances its entry records) and append it to ``failed`` (its record is to go); a
        failing undo is logged and left to the kubelet's retry."""
        what = f"ResourceClaim {ref.namespace}/{ref.name}"
        try:
            with self.ctx.mig_lock:
                _gone, left = self.release(uid, slots)
            for line in left:
                self.ctx.log(f"{what}: undoing a failed prepare: {line}")
            failed.append(uid)
        except MigError as e2:
            self.ctx.log(
                f"{what}: undoing a failed prepare: {e2} (retried with the kubelet's next call)"
            )

    def unprepare(self, ref: ClaimRef, entry: ClaimEntry) -> str:
        """Destroy the MIG instances of a claim being unprepared (recorded ``unpreparing``
        first) and remove its files and entry; returns an error line, or ''. Call with the
        claim's lock held. Raises ``OSError`` when the checkpoint cannot be written."""
        store = self.ctx.store
        slots = entry.mig_slots
        if slots and entry.state != ClaimState.UNPREPARING:
            store.update(put={ref.uid: ClaimEntry.unpreparing(ref, slots)})
        remove_files(ref.uid, self.ctx.layout)
        if slots:
            if self.ctx.mig is None:
                return f"ResourceClaim {ref.namespace}/{ref.name}: its MIG instances need NVML to be destroyed"
            try:
                with self.ctx.mig_lock:
                    _gone, left = self.release(ref.uid, slots)
            except MigError as e:
                return f"ResourceClaim {ref.namespace}/{ref.name}: {e}"
            for line in left:
                self.ctx.log(f"ResourceClaim {ref.namespace}/{ref.name}: unprepared; {line}")
        store.update(drop=[ref.uid])
        return ""
