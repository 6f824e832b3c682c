"""File locks that hold between the threads of one driver and between two driver instances.

During a rolling update two ``tessera driver`` processes serve one node and share its state
directory (:mod:`tessera.driver.node`). What keeps them from corrupting it or answering from a
stale view:

* :class:`FileLock`: an exclusive ``flock(2)`` on a file, taken with a new open file per
  acquisition, so two threads of one process exclude each other exactly as two processes do.
  One per claim (``<state>/locks/<claim uid>``): a claim's prepare or unprepare runs in one
  place at a time, node-wide; the lock file is removed by the last holder when the claim has
  no checkpoint entry left. The checkpoint's read-modify-write takes another
  (``<state>/checkpoint.lock``, :mod:`tessera.driver.checkpoint`).
* :class:`InstanceLock`: every instance holds a shared lock on ``<state>/instances.lock`` while
  it runs; at start, an instance that can take it exclusively knows it is alone on the node
  (so leftovers of interrupted writes are its to remove).

Locks are advisory and released by the kernel when the process dies (``kill -9`` included).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


class FileLock:
    """An exclusive lock on ``path`` (made if missing, with its directory). Not reentrant; one
    object per acquisition (:meth:`acquire` then :meth:`release`)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, blocking: bool = True) -> bool:
        """Take the lock (waiting for it unless ``blocking`` is False); True once held, False
        when not ``blocking`` and someone else holds it. Raises ``OSError`` when the file
        cannot be made."""
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:  # its directory first (one call less when it exists)
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return False
            except BaseException:
                os.close(fd)
                raise
            # The holder we waited for may have removed the file (and another made a new one):
            # the lock is only good on the file the path names now.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._fd = fd
                return True
            os.close(fd)

    def release(self, remove: bool = False) -> None:
        """Release the lock; with ``remove``, the lock file goes first (a later acquirer makes
        a new one)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if remove:
            # A read-only or full state directory keeps the file: the next holder reuses it.
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        os.close(fd)  # closing the only descriptor of this open file releases the flock

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class InstanceLock:
    """The shared lock a running driver instance holds on ``path`` (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def join(self) -> bool:
        """Hold the lock shared from now on; True when no other instance held it (this one is
        alone on the node). Two instances that start at the same instant may both be told
        so (the exclusive probe is dropped before the shared lock is taken). Raises
        ``OSError`` when the file cannot be made."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            alone = False
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._fd = fd
        return alone

    def leave(self) -> None:
        """Release the lock (at stop)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
