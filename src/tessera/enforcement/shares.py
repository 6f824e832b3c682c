"""The node's per-GPU shares file: what the limited claims on one GPU are guaranteed.

A best-effort claim (``cores 0``) on a GPU shared with limited claims is held to what their
guarantees leave: the enforcement library reads, for each GPU, ``<dir>/<UUID>`` in the
directory the limits file's ``shares`` line names. The node driver owns the directory, writes
every file (:func:`write_shares`, atomically, mode 0444) and mounts it read-only into the
containers, so no claim writes what another claim's pacing reads. Format (ASCII lines)::

    version 1
    guaranteed <0-100>     sum of cores of the GPU's claims with 0 < cores <= 100
    best-effort <n>        number of the GPU's claims with cores 0

The C reader is ``read_shares`` in ``native/src/pacer.c``; a best-effort claim's share is
``(100 - guaranteed) / best-effort`` plus the idle time it may take (docs/enforcement.md
section 5).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from tessera.enforcement._files import write_atomic
from tessera.enforcement.limits import GpuLimit, normalise_uuid


@dataclass(frozen=True)
class GpuShares:
    """One GPU's file: ``guaranteed`` percent (0..100), ``best_effort`` claims (>= 0)."""

    guaranteed: int
    best_effort: int


def gpu_shares(claims: Iterable[Iterable[GpuLimit]]) -> dict[str, GpuShares]:
    """Per GPU UUID (normalised), the shares of the claims given (each: its limited GPUs).

    Raises ``ValueError`` naming the GPU when the guaranteed cores exceed 100 (an allocation
    the scheduler should not have made)."""
    g: dict[str, int] = {}
    n: dict[str, int] = {}
    for limits in claims:
        for lim in limits:
            u = normalise_uuid(lim.uuid) or lim.uuid
            g.setdefault(u, 0)
            n.setdefault(u, 0)
            if lim.cores == 0:
                n[u] += 1
            else:
                g[u] += lim.cores
    for u, total in g.items():
        if total > 100:
            raise ValueError(f"GPU {u}: the claims prepared on it guarantee {total} cores (> 100)")
    return {u: GpuShares(g[u], n[u]) for u in g}


def format_shares(s: GpuShares) -> str:
    """Canonical text of one GPU's file."""
    if not 0 <= s.guaranteed <= 100 or s.best_effort < 0:
        raise ValueError(f"bad shares {s}")
    return f"version 1\nguaranteed {s.guaranteed}\nbest-effort {s.best_effort}\n"


MODE = 0o444


def _has(path: str, data: bytes) -> bool:
    """Whether ``path`` is a regular file of mode :data:`MODE` holding exactly ``data``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != MODE:
            return False
        return st.st_size == len(data) and os.read(fd, len(data) + 1) == data
    finally:
        os.close(fd)


def write_shares(directory: str, shares: dict[str, GpuShares], *, sync: bool = True) -> None:
    """Write one file per GPU of ``shares`` into ``directory`` (created 0755) and remove the
    files of GPUs no longer listed. A file that already holds its text (mode 0444) is left as
    it is: one prepare changes one GPU's file, not every file of the node. Raises ``OSError``
    for I/O."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    for uuid, s in shares.items():
        path = os.path.join(directory, uuid)
        data = format_shares(s).encode()
        if not _has(path, data):
            write_atomic(path, data, MODE, ".shares.", sync=sync)
    for name in os.listdir(directory):
        if normalise_uuid(name) and name not in shares:
            os.unlink(os.path.join(directory, name))
