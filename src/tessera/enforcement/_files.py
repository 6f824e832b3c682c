"""Atomic file writes for what the driver hands to containers (limits file, usage region)."""

from __future__ import annotations

import itertools
import os

#: Numbers the temporary files of this process (with its pid: unique without random names).
_SEQ = itertools.count()


def _temporary(directory: str, prefix: str) -> tuple[int, str]:
    """A new file ``<directory>/<prefix><pid>-<n>`` (mode 0600, opened for writing) and its
    path; a name left by an earlier process with the same pid is skipped (``O_EXCL``)."""
    while True:
        tmp = os.path.join(directory, f"{prefix}{os.getpid()}-{next(_SEQ)}")
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue


def write_atomic(
    path: str, data: bytes, mode: int, prefix: str, *, sync: bool = True, size: int | None = None
) -> None:
    """Write ``data`` to ``path`` with permissions ``mode``: all of it or, on error, nothing.

    The bytes go to a temporary file beside ``path`` (``prefix`` + pid + a number), are synced
    (unless ``sync`` is False: then the rename is still atomic for every process, and a crash
    of the writer leaves the old or the new file, but a power loss may leave an empty one),
    and replace ``path`` in one rename. ``size``: the file is extended to ``size`` bytes with
    zeros that are allocated (``posix_fallocate``) but not written, so a trailing run of zeros
    costs no copy. Raises ``OSError`` for I/O errors.
    """
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = _temporary(d, prefix)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if size is not None and size > len(data):
                os.posix_fallocate(fd, 0, size)
            if sync:
                os.fsync(fd)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = path  # (fsync, fallocate: name the file the error is about)
        raise
