"""The driver's checkpoint: which claims this node has prepared, with what content.

One JSON file, ``<state>/checkpoint.json``, replaced atomically (temporary file, fsync,
rename) on every change, so after a crash or ``kill -9`` at any instant it holds either the
state before a change or after it, never a mix::

    {"version": 1, "claims": {"<claim uid>": {"state": "prepared", "plan": <ClaimPlan JSON>}}}

Each entry is a :class:`ClaimEntry` (:meth:`ClaimEntry.from_json` and :meth:`ClaimEntry.to_json`
are its one reader and writer). Its ``state`` is ``prepared`` (the claim's files exist and were
answered to the kubelet; the entry holds its whole ``plan``), or, for a claim with dynamic-MIG
instances (:mod:`tessera.driver.mig`), ``preparing`` (written before any instance is created,
with the ``claim``, ``since`` and its ``slots``: the placements the driver is about to make, so
that after a crash they are known as its own) or ``unpreparing`` (written before its instances
are destroyed, with the ``claim`` and ``slots``). The format is version 1's as it was before
entries were typed; an entry read is written back as it was read. A file with a state, key or
value this driver does not know is refused (:class:`CheckpointError`, naming the entry and the
field).

Versions (:data:`FIELDS_BY_VERSION`): a version's keys never change; a new key of an entry or
of its plan comes with a new version. The driver reads every version it knows and writes its
own (:data:`VERSION`); a file of a newer version (a newer driver's, found on a rollback) refuses
the start with one line: roll forward, or drain the node and remove the file. No entry is ever
dropped or read without a key it has.

Rules (what makes restarts safe):

* prepare writes a claim's files first (each atomically), then records the claim and its
  whole plan; unprepare removes the files, then the entry. So an entry always has its files
  (or had: a crash may interrupt an unprepare, which the kubelet retries), and a file without
  an entry belongs to a prepare whose answer never reached the kubelet;
* at start, files no entry covers and temporary files of interrupted writes are removed, and
  every entry's files are written again from the *recorded* plan where they are missing or
  differ. A retried prepare of a recorded claim uses the recorded plan too, so a claim is
  never prepared twice with different content, even if the node's GPUs changed in between;
* the checkpoint is the only file synced to disk (the others are re-derived from it).

Concurrent updates are committed together (group commit): one write serves every caller that
arrived while the previous write was in progress.

Two driver instances may share the file (a rolling update, :mod:`tessera.driver.locks`): each
write holds ``checkpoint.lock`` (beside the file) and applies its changes to the file as it is
on disk then, never to this process's older copy, so neither instance loses the other's
entries. The lock file also holds the checkpoint's generation (a decimal number, bumped by
every write after its rename); every read first loads the file again when the generation or
the file's inode, modification time or size differ from what this process last read or
wrote. Callers serialize the changes of one claim themselves (the driver's claim locks).
"""

from __future__ import annotations

import enum
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tessera.enforcement._files import write_atomic

from .kubelet import ClaimRef
from .locks import FileLock
from .mig import MigSlot
from .prepare import ClaimPlan

VERSION = 1
"""The checkpoint version this driver writes: the newest of :data:`FIELDS_BY_VERSION`."""

#: The versions this driver reads, with the keys an entry (``claims["<uid>"]``) and its
#: ``plan`` may have in each. The rule (docs/install.md, "Supported skew"): a version's keys
#: never change. A new key of an entry or of a plan comes with a new version (a new row here,
#: :data:`VERSION` bumped), so that an older driver, on a rollback, refuses the file with one
#: line instead of reading it without the new key (and writing it back without it). A reader
#: of version N reads every version up to N; a file of a newer version refuses the start.
FIELDS_BY_VERSION: dict[int, tuple[frozenset[str], frozenset[str]]] = {
    1: (
        frozenset({"state", "plan", "claim", "slots", "since"}),
        frozenset(
            {
                "namespace",
                "name",
                "uid",
                "backend",
                "devices",
                "limits",
                "regionGPUs",
                "cdiSpec",
                "status",
                "digest",
                "mig",
            }
        ),
    ),
}


class ClaimState(enum.StrEnum):
    """An entry's ``state`` (written as its value)."""

    #: Written before a claim's dynamic-MIG instances are created, with their ``slots``.
    PREPARING = "preparing"
    #: The claim's files exist and were answered to the kubelet.
    PREPARED = "prepared"
    #: Written before a claim's dynamic-MIG instances are destroyed.
    UNPREPARING = "unpreparing"


class EntryError(ValueError):
    """An entry of the file that is not one this driver writes: ``field`` names the entry's
    key at fault (``state``, ``plan``, an unknown key...), ``detail`` says what is wrong."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail


@dataclass(frozen=True)
class ClaimEntry:
    """One claim's checkpoint entry: the one reader (:meth:`from_json`) and writer
    (:meth:`to_json`) of ``claims["<uid>"]`` in the file.

    * ``state``: the :class:`ClaimState`;
    * ``plan``: the claim's whole recorded :class:`~.prepare.ClaimPlan` (``prepared``; none in
      the other states);
    * ``claim``: the claim (namespace, name, uid) of a ``preparing`` or ``unpreparing`` entry
      (a ``prepared`` one names it in its plan);
    * ``slots``: the dynamic-MIG placements of a ``preparing`` or ``unpreparing`` entry
      (:class:`~.mig.MigSlot`; a ``prepared`` one has them in ``plan.mig``);
    * ``since``: when a ``preparing`` entry was written (seconds since the epoch, ``time.time()``).

    The JSON keys are those names; a key is written only when it has a value (a ``prepared``
    entry is ``{"state": "prepared", "plan": {...}}``, as version 1 always wrote it).
    """

    state: ClaimState
    plan: ClaimPlan | None = None
    claim: ClaimRef | None = None
    slots: tuple[MigSlot, ...] | None = None
    since: float | None = None

    #: The keys an entry may have (any other is refused at read), in the order errors list them.
    FIELDS: ClassVar[tuple[str, ...]] = ("state", "plan", "claim", "slots", "since")

    @classmethod
    def prepared(cls, plan: ClaimPlan) -> ClaimEntry:
        """The entry of a prepared claim: its whole plan."""
        return cls(ClaimState.PREPARED, plan=plan)

    @classmethod
    def preparing(cls, ref: ClaimRef, slots: Iterable[MigSlot], since: float) -> ClaimEntry:
        """The entry written before a claim's dynamic-MIG instances are made: the claim, the
        placements about to be made and ``since`` (``time.time()``, seconds)."""
        return cls(ClaimState.PREPARING, claim=ref, slots=tuple(slots), since=since)

    @classmethod
    def unpreparing(cls, ref: ClaimRef, slots: Iterable[MigSlot]) -> ClaimEntry:
        """The entry written before a claim's dynamic-MIG instances are destroyed."""
        return cls(ClaimState.UNPREPARING, claim=ref, slots=tuple(slots))

    @property
    def ref(self) -> ClaimRef | None:
        """The claim: from the plan of a prepared entry, else ``claim`` (None when neither)."""
        return self.plan.ref if self.plan is not None else self.claim

    @property
    def mig_slots(self) -> list[MigSlot]:
        """The MIG slots the entry names, in any state: ``slots`` when recorded, else the
        plan's instances (none for a claim without dynamic MIG)."""
        if self.slots is not None:
            return list(self.slots)
        return list(self.plan.mig) if self.plan is not None else []

    def to_json(self) -> dict[str, Any]:
        """The entry as written in the file (keys with no value left out)."""
        out: dict[str, Any] = {"state": self.state.value}
        if self.since is not None:
            out["since"] = self.since
        if self.claim is not None:
            c = self.claim
            out["claim"] = {"namespace": c.namespace, "name": c.name, "uid": c.uid}
        if self.slots is not None:
            out["slots"] = [s.to_json() for s in self.slots]
        if self.plan is not None:
            out["plan"] = self.plan.to_json()
        return out

    @classmethod
    def from_json(cls, d: Any, version: int = VERSION) -> ClaimEntry:
        """Read one entry of a file of ``version`` (one of :data:`FIELDS_BY_VERSION`). Raises
        :class:`EntryError` naming the field at fault: an entry that is not an object, or whose
        ``state`` is not a :class:`ClaimState` (``state``), a key that version does not have
        (that key; ``plan`` for a key of the plan), a value of the wrong shape (its key), or a
        state without what it needs (``plan`` for ``prepared``; ``claim`` and ``slots``
        otherwise)."""
        entry_keys, plan_keys = FIELDS_BY_VERSION[version]
        known = ", ".join(sorted(s.value for s in ClaimState))
        if not isinstance(d, Mapping):
            raise EntryError("state", f"{d!r} is not one of {known}")
        try:
            state = ClaimState(str(d.get("state")))
        except ValueError:
            raise EntryError("state", f"{d.get('state')!r} is not one of {known}") from None
        for key in d:
            if key not in entry_keys:
                raise EntryError(
                    str(key),
                    f"not a field of a version {version} checkpoint entry "
                    f"({', '.join(f for f in cls.FIELDS if f in entry_keys)})",
                )
        plan_raw = d.get("plan")
        if isinstance(plan_raw, Mapping):
            extra = sorted(str(k) for k in plan_raw if k not in plan_keys)
            if extra:
                raise EntryError(
                    "plan", f"{', '.join(extra)}: not a field of a version {version} plan"
                )
        plan = _field(d, "plan", ClaimPlan.from_json)
        claim = _field(
            d, "claim", lambda c: ClaimRef(str(c["namespace"]), str(c["name"]), str(c["uid"]))
        )
        slots = _field(d, "slots", lambda raw: tuple(MigSlot.from_json(s) for s in raw))
        since = _field(d, "since", float)
        if state is ClaimState.PREPARED and plan is None:
            raise EntryError("plan", "missing: a prepared entry records its plan")
        if state is not ClaimState.PREPARED:
            for name, value in (("claim", claim), ("slots", slots)):
                if value is None:
                    raise EntryError(name, f"missing: a {state.value} entry records it")
        return cls(state, plan=plan, claim=claim, slots=slots, since=since)


def _field(d: Mapping[str, Any], key: str, read: Callable[[Any], Any]) -> Any:
    """``read(d[key])``, None when ``d`` has no ``key``; a value ``read`` cannot take raises
    :class:`EntryError` naming ``key``."""
    if key not in d:
        return None
    try:
        return read(d[key])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        what = f"missing {e}" if isinstance(e, KeyError) else str(e)
        raise EntryError(key, f"not a valid {key} ({what})") from None


#: How a refusal of an entry ends.
ANOTHER_VERSION = (
    " (written by another driver version?); restore the driver version that wrote it, or move "
    "the file away to start with an empty state"
)


def _encode(doc: Any) -> str:
    """An entry's text in the file (sorted keys, no spaces)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


class CheckpointError(ValueError):
    """The checkpoint file exists but is not one this driver wrote (names the file)."""


class Checkpoint:
    """The claims of the checkpoint at ``path``, loaded at construction and again whenever
    another process replaced the file.

    Thread-safe and safe between processes: :meth:`update` applies several changes and writes
    the file once. Raises :class:`CheckpointError` at construction for a file that is not a
    checkpoint.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.stem + ".lock")
        #: (generation, inode, mtime ns, size) of what ``claims`` was read from or written as
        self._key: tuple[int, int, int, int] | None = None
        self._gen_fd: int | None = None
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._seq = 0
        self._done = 0
        self._writing = False
        self._pending: list[tuple[int, dict[str, ClaimEntry], list[str]]] = []
        self._failed: dict[int, OSError] = {}
        self.claims: dict[str, ClaimEntry] = {}
        self._encoded: dict[str, str] = {}
        key = self._disk_key()
        loaded = self._read()
        if loaded is not None:
            self.claims, self._encoded = loaded
            self._key = key

    def _generation(self) -> int:
        """The generation in the lock file (0 before the first write of this driver version)."""
        if self._gen_fd is None:
            try:
                self._gen_fd = os.open(self.lock_path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                return 0
        text = os.pread(self._gen_fd, 32, 0).strip()
        return int(text) if text.isdigit() else 0

    def _disk_key(self) -> tuple[int, int, int, int] | None:
        """What identifies the file's content now (generation first, then the file), or None
        when there is no file."""
        gen = self._generation()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (gen, st.st_ino, st.st_mtime_ns, st.st_size)

    def _read(self) -> tuple[dict[str, ClaimEntry], dict[str, str]] | None:
        """The file's claims and their encodings; None when there is no file. Raises
        :class:`CheckpointError`."""
        try:
            with open(self.path, "rb") as f:
                text = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CheckpointError(f"{self.path}: cannot read ({e.strerror or e})") from e
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise CheckpointError(
                f"{self.path}: not valid JSON ({e}); move it away to start with an empty state"
            ) from e
        version = doc.get("version") if isinstance(doc, dict) else None
        if (
            isinstance(version, int)
            and not isinstance(version, bool)
            and version > max(FIELDS_BY_VERSION)
        ):
            raise CheckpointError(
                f"{self.path}: version {version} is newer than this driver reads (versions "
                f"{', '.join(map(str, sorted(FIELDS_BY_VERSION)))}): a newer driver wrote it; roll "
                "forward to that driver, or drain the node (no prepared claims left) and remove "
                "the file to start with an empty state"
            )
        if (
            not isinstance(doc, dict)
            or version not in FIELDS_BY_VERSION
            or isinstance(version, bool)
            or not isinstance(doc.get("claims"), dict)
        ):
            raise CheckpointError(f"{self.path}: not a version {VERSION} Tessera driver checkpoint")
        assert isinstance(version, int)
        raw: dict[str, Any] = doc["claims"]
        known = {s.value for s in ClaimState}
        # Every entry's state first (a newer driver's state is named whatever else it has).
        for uid, entry in raw.items():
            if not isinstance(entry, dict) or entry.get("state") not in known:
                state = entry.get("state") if isinstance(entry, dict) else entry
                raise CheckpointError(
                    f"{self.path}: claims[{uid!r}].state: {state!r} is not one of "
                    f"{', '.join(sorted(known))}{ANOTHER_VERSION}"
                )
        claims: dict[str, ClaimEntry] = {}
        for uid, entry in raw.items():
            try:
                claims[uid] = ClaimEntry.from_json(entry, version)
            except EntryError as e:
                raise CheckpointError(
                    f"{self.path}: claims[{uid!r}].{e.field}: {e.detail}{ANOTHER_VERSION}"
                ) from e
        # Entries read are written back as they were read (not as this driver would write them).
        encoded = {u: _encode(e) for u, e in raw.items()}
        return claims, encoded

    def _refresh(self) -> None:
        """Load the file again if another process wrote it (call with ``_lock`` held).

        While a write of this process is in progress, a changed file is most likely that
        write's own rename (its fsync is already done then): instead of reading and decoding
        the whole file again, wait for the write to end, since it sets its merged result (which
        also holds any other process's write made before it took the file lock), then look
        again."""
        key = self._disk_key()
        while key != self._key and self._writing:
            self._cond.wait()
            key = self._disk_key()
        if key == self._key:
            return
        loaded = self._read()
        self.claims, self._encoded = loaded if loaded is not None else ({}, {})
        self._key = key

    def get(self, uid: str) -> ClaimEntry | None:
        """Claim ``uid``'s entry as the file has it now, or None."""
        with self._lock:
            self._refresh()
            return self.claims.get(uid)

    def uids(self) -> list[str]:
        """The claim UIDs of every entry."""
        with self._lock:
            self._refresh()
            return list(self.claims)

    def entries(self) -> dict[str, ClaimEntry]:
        """A snapshot of every entry, by claim UID."""
        with self._lock:
            self._refresh()
            return dict(self.claims)

    @property
    def committed(self) -> int:
        """The number of the last change of this process that is on disk (see :meth:`update`):
        what :meth:`entries` returns from now on holds every change up to it."""
        with self._lock:
            return self._done

    def update(
        self, put: Mapping[str, ClaimEntry] | None = None, drop: list[str] | None = None
    ) -> int:
        """Set entries ``put`` and remove ``drop``; return once that is on disk.

        Callers that arrive while a write is in progress are committed together by the next
        write. Returns the change's number (1, 2, ... in this process; :attr:`committed` is at
        least that from now on). Raises ``OSError`` when the write failed (nothing of it is
        applied).
        """
        with self._cond:
            self._seq += 1
            ticket = self._seq
            self._pending.append((ticket, dict(put or {}), drop or []))
            while True:
                if ticket in self._failed:
                    raise self._failed.pop(ticket)
                if self._done >= ticket:
                    return ticket
                if not self._writing:
                    break
                self._cond.wait()
            self._writing = True
            batch, self._pending = self._pending, []
            claims = dict(self.claims)
            encoded = dict(self._encoded)
            key = self._key
        error: OSError | None = None
        lock = FileLock(self.lock_path)
        try:
            lock.acquire()  # (makes the directory when it is missing)
            try:
                # Under the lock, the file is the truth: another instance may have written it.
                if self._disk_key() != key:
                    loaded = self._read()
                    claims, encoded = (
                        ({}, {}) if loaded is None else (dict(loaded[0]), dict(loaded[1]))
                    )
                for _, p, d in batch:
                    for uid, entry in p.items():
                        claims[uid] = entry
                        encoded[uid] = _encode(entry.to_json())
                    for uid in d:
                        claims.pop(uid, None)
                        encoded.pop(uid, None)
                # Entries are encoded once, when they are put: a write only joins strings.
                body = ",".join(f"{json.dumps(uid)}:{encoded[uid]}" for uid in sorted(encoded))
                data = f'{{"claims":{{{body}}},"version":{VERSION}}}\n'.encode()
                write_atomic(str(self.path), data, 0o600, ".checkpoint.")
                gen = self._generation() + 1
                if self._gen_fd is None:
                    self._gen_fd = os.open(self.lock_path, os.O_RDWR | os.O_CLOEXEC)
                os.pwrite(self._gen_fd, f"{gen:020d}\n".encode(), 0)
                key = self._disk_key()
            finally:
                lock.release()
        except CheckpointError as e:
            error = OSError(str(e))
        except OSError as e:
            error = e
        with self._cond:
            self._writing = False
            if error is None:
                self.claims = claims
                self._encoded = encoded
                self._key = key
            else:
                for t, _, _ in batch:
                    self._failed[t] = error
            self._done = (
                max(self._done, max(t for t, _, _ in batch)) if error is None else self._done
            )
            self._cond.notify_all()
            if ticket in self._failed:
                raise self._failed.pop(ticket)
            return ticket
