"""The driver's checkpoint: which claims this node has prepared, with what content.

One JSON file, ``<state>/checkpoint.json``, replaced atomically (temporary file, fsync,
rename) on every change, so after a crash or ``kill -9`` at any instant it holds either the
state before a change or after it, never a mix::

    {"version": 1, "claims": {"<claim uid>": {"state": "prepared", "plan": <ClaimPlan JSON>}}}

An entry's ``state`` is ``prepared`` (the claim's files exist and were answered to the kubelet),
or, for a claim with dynamic-MIG instances (:mod:`tessera.driver.mig`), ``preparing`` (written
before any instance is created, with the claim and its ``slots``: the placements the driver is
about to make, so that after a crash they are known as its own) or ``unpreparing`` (written
before its instances are destroyed).

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
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from tessera.enforcement._files import write_atomic

PREPARED = "prepared"
VERSION = 1


class CheckpointError(ValueError):
    """The checkpoint file exists but is not one this driver wrote (names the file)."""


class Checkpoint:
    """The claims of the checkpoint at ``path``, loaded at construction.

    Thread-safe: :meth:`update` applies several changes and writes the file once.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._seq = 0
        self._done = 0
        self._writing = False
        self._pending: list[tuple[int, dict[str, dict[str, Any]], list[str]]] = []
        self._failed: dict[int, OSError] = {}
        self.claims: dict[str, dict[str, Any]] = {}
        self._encoded: dict[str, str] = {}
        if self.path.is_file():
            try:
                doc = json.loads(self.path.read_text())
            except (OSError, ValueError) as e:
                raise CheckpointError(
                    f"{self.path}: not valid JSON ({e}); move it away to start with an empty state"
                ) from e
            if (
                not isinstance(doc, dict)
                or doc.get("version") != VERSION
                or not isinstance(doc.get("claims"), dict)
            ):
                raise CheckpointError(
                    f"{self.path}: not a version {VERSION} Tessera driver checkpoint"
                )
            self.claims = doc["claims"]
            self._encoded = {
                u: json.dumps(e, sort_keys=True, separators=(",", ":"))
                for u, e in self.claims.items()
            }

    def get(self, uid: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self.claims.get(uid)
            return dict(entry) if entry is not None else None

    def uids(self) -> list[str]:
        with self._lock:
            return list(self.claims)

    def entries(self) -> dict[str, dict[str, Any]]:
        """A snapshot of every entry, by claim UID."""
        with self._lock:
            return dict(self.claims)

    def update(
        self, put: dict[str, dict[str, Any]] | None = None, drop: list[str] | None = None
    ) -> None:
        """Set entries ``put`` and remove ``drop``; return once that is on disk.

        Callers that arrive while a write is in progress are committed together by the next
        write. Raises ``OSError`` when the write failed (nothing of it is applied).
        """
        with self._cond:
            self._seq += 1
            ticket = self._seq
            self._pending.append((ticket, put or {}, drop or []))
            while True:
                if ticket in self._failed:
                    raise self._failed.pop(ticket)
                if self._done >= ticket:
                    return
                if not self._writing:
                    break
                self._cond.wait()
            self._writing = True
            batch, self._pending = self._pending, []
        claims = dict(self.claims)
        encoded = dict(self._encoded)
        for _, p, d in batch:
            for uid, entry in p.items():
                claims[uid] = entry
                encoded[uid] = json.dumps(entry, sort_keys=True, separators=(",", ":"))
            for uid in d:
                claims.pop(uid, None)
                encoded.pop(uid, None)
        error: OSError | None = None
        try:
            # Entries are encoded once, when they are put: a write only joins strings.
            body = ",".join(f"{json.dumps(uid)}:{encoded[uid]}" for uid in sorted(encoded))
            data = f'{{"claims":{{{body}}},"version":{VERSION}}}\n'.encode()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(str(self.path), data, 0o600, ".checkpoint.")
        except OSError as e:
            error = e
        with self._cond:
            self._writing = False
            if error is None:
                self.claims = claims
                self._encoded = encoded
            else:
                for t, _, _ in batch:
                    self._failed[t] = error
            self._done = (
                max(self._done, max(t for t, _, _ in batch)) if error is None else self._done
            )
            self._cond.notify_all()
            if ticket in self._failed:
                raise self._failed.pop(ticket)
