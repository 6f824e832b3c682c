"""The driver's checkpoint: which claims this node has prepared, with what content.

One JSON file, ``<state>/checkpoint.json``, replaced atomically (temporary file, fsync,
rename) on every change, so after a crash or ``kill -9`` at any instant it holds either the
state before a change or after it, never a mix::

    {"version": 1, "claims": {"<claim uid>": {"state": "preparing" | "prepared",
                                              "plan": <ClaimPlan JSON>}}}

Write-ahead rule (what makes restarts safe):

* prepare records the claim's plan as ``preparing`` *before* writing any of its files, then
  ``prepared`` after; a retried prepare of a claim already in the checkpoint re-writes the
  *recorded* plan (so a claim is never prepared twice with different content, even if the
  node's GPUs changed in between);
* unprepare removes the files *before* dropping the entry, so a file always belongs to an
  entry and a retried unprepare finishes the job.

Files that no entry covers (a temporary file of an interrupted write) are removed at start.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from tessera.enforcement._files import write_atomic

PREPARING = "preparing"
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
        self.claims: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            try:
                doc = json.loads(self.path.read_text())
            except (OSError, ValueError) as e:
                raise CheckpointError(f"{self.path}: not valid JSON ({e}); move it away to start with an empty state") from e
            if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("claims"), dict):
                raise CheckpointError(f"{self.path}: not a version {VERSION} Tessera driver checkpoint")
            self.claims = doc["claims"]

    def get(self, uid: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self.claims.get(uid)
            return dict(entry) if entry is not None else None

    def uids(self) -> list[str]:
        with self._lock:
            return list(self.claims)

    def update(self, put: dict[str, dict[str, Any]] | None = None, drop: list[str] | None = None) -> None:
        """Set entries ``put`` and remove ``drop``, then write the file once (atomically).
        Raises ``OSError`` (the in-memory state is rolled back)."""
        with self._lock:
            before = dict(self.claims)
            for uid, entry in (put or {}).items():
                self.claims[uid] = entry
            for uid in drop or []:
                self.claims.pop(uid, None)
            if self.claims == before and self.path.is_file():
                return
            data = json.dumps({"version": VERSION, "claims": self.claims}, sort_keys=True).encode()
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(str(self.path), data, 0o600, ".checkpoint.")
            except OSError:
                self.claims = before
                raise
