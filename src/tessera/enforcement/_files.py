"""Atomic file writes for what the driver hands to containers (limits file, usage region)."""

from __future__ import annotations

import os
import tempfile


def write_atomic(
    path: str, data: bytes, mode: int, prefix: str, *, sync: bool = True, size: int | None = None
) -> None:
    """Write ``data`` to ``path`` with permissions ``mode``: all of it or, on error, nothing.

    The bytes go to a temporary file beside ``path`` (named ``prefix`` + random), are synced
    (unless ``sync`` is False: then the rename is still atomic for every process, and a crash
    of the writer leaves the old or the new file, but a power loss may leave an empty one),
    and replace ``path`` in one rename. ``size``: the file is extended to ``size`` bytes with
    zeros that are allocated (``posix_fallocate``) but not written, so a trailing run of zeros
    costs no copy. Raises ``OSError`` for I/O errors.
    """
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if size is not None and size > len(data):
                os.posix_fallocate(f.fileno(), 0, size)
            if sync:
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = path  # (fsync, fallocate: name the file the error is about)
        raise
