"""Read (and create) a claim's shared usage region.

The layout is defined once, in ``native/include/tessera_region.h``; the constants below
mirror it and ``tests/native`` checks them against the compiled header. Everything is
little-endian and naturally aligned::

    header   1600 bytes  magic u64 | version u32 | header_size u32 | slot_size u32 |
                         slot_count u32 | gpu_count u32 | slot_high_water u32 |
                         generation u64 | context_overhead u64 | reserved 16 |
                         gpus[16] x 96 bytes
    gpu        96 bytes  uuid char[48] | memory_limit u64 | cores u32 | flags u32 |
                         pace_tat_ns u64 | launches u64 | paced_ns u64 | pace_scale u64
    slot      224 bytes  state u32 | pid i32 | pid_ns u64 | start_time u64 | generation u64 |
                         used u64[16] | contexts u32[16]
    file   230976 bytes  header + 1024 slots

A slot whose ``state`` is live belongs to a running process as long as that process holds
an open-file-description write lock on the slot's first byte; :func:`slot_alive` tests that
lock, so a reader can tell a crashed process's slot from a live one without PID namespaces
getting in the way. Reading needs no lock: each field is read whole, and the sum over slots
is what the library itself computes.
"""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.enforcement._files import write_atomic

MAGIC = 0x314E474552535354
"""``b"TSSREGN1"`` read as a little-endian u64."""
VERSION = 1
"""The region version the library writes (``TESSERA_REGION_VERSION``) and the driver creates."""
READ_VERSIONS = (1,)
"""The region versions :func:`parse_region` reads (the monitor's side of an upgrade: a region of
another version is reported for its share, never read with the wrong layout)."""
MAX_GPUS = 16
MAX_SLOTS = 1024
UUID_LEN = 48
HEADER_SIZE = 1600
GPU_SIZE = 96
SLOT_SIZE = 224
FILE_SIZE = HEADER_SIZE + MAX_SLOTS * SLOT_SIZE
LOCK_BYTE = 0
SLOT_FREE = 0
SLOT_LIVE = 1
GPU_IN_USE = 1

_HEADER = struct.Struct("<QIIIIIIQQ16x")  # 64 bytes, gpus follow at 64
_GPU = struct.Struct(f"<{UUID_LEN}sQIIQQQQ")  # 96 bytes
_SLOT = struct.Struct(f"<iiQQQ{MAX_GPUS}Q{MAX_GPUS}I")  # 224 bytes
GPUS_OFFSET = _HEADER.size

# Field offsets, as printed by native/tests/region_layout.c.
OFFSETS: dict[str, int] = {
    "h.magic": 0,
    "h.version": 8,
    "h.header_size": 12,
    "h.slot_size": 16,
    "h.slot_count": 20,
    "h.gpu_count": 24,
    "h.slot_high_water": 28,
    "h.generation": 32,
    "h.context_overhead": 40,
    "h.gpus": 64,
    "g.uuid": 0,
    "g.memory_limit": 48,
    "g.cores": 56,
    "g.flags": 60,
    "g.pace_tat_ns": 64,
    "g.launches": 72,
    "g.paced_ns": 80,
    "s.state": 0,
    "s.pid": 4,
    "s.pid_ns": 8,
    "s.start_time": 16,
    "s.generation": 24,
    "s.used": 32,
    "s.contexts": 160,
}

# struct flock on Linux x86_64/aarch64: short l_type, short l_whence, off_t l_start,
# off_t l_len, pid_t l_pid (+ padding to 32 bytes).
_FLOCK = struct.Struct("@hhxxxxqqi4x")
_F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
_F_WRLCK = getattr(fcntl, "F_WRLCK", 1)
_F_UNLCK = getattr(fcntl, "F_UNLCK", 2)


class RegionError(ValueError):
    """The file is not a usage region this module understands (magic, version or size)."""


@dataclass(frozen=True)
class RegionGpu:
    """One GPU entry of the region.

    ``index``: position in the region's GPU table (the index of ``used`` in every slot);
    ``memory_limit``: bytes; ``cores``: percent 0..100; ``used``: bytes charged by the
    claim's live processes (sum over slots, dead slots excluded when liveness was checked);
    ``launches``: launches seen by the pacer; ``paced_ns``: total ns launches were delayed.
    """

    index: int
    uuid: str
    memory_limit: int
    cores: int
    used: int
    launches: int
    paced_ns: int


@dataclass(frozen=True)
class RegionSlot:
    """One live process slot.

    ``pid`` is in the owner's PID namespace (``pid_ns`` is that namespace's inode number);
    ``start_time`` is in clock ticks since boot; ``used`` and ``contexts`` have one entry per
    region GPU index (bytes, counts); ``alive`` is ``None`` when liveness was not checked.
    """

    index: int
    pid: int
    pid_ns: int
    start_time: int
    generation: int
    used: tuple[int, ...]
    contexts: tuple[int, ...]
    alive: bool | None


@dataclass(frozen=True)
class RegionSnapshot:
    """A consistent-enough copy of a region: header fields, GPU entries and live slots."""

    version: int
    generation: int
    context_overhead: int
    slot_high_water: int
    gpus: tuple[RegionGpu, ...]
    slots: tuple[RegionSlot, ...]

    def used(self, uuid: str) -> int:
        """Bytes the claim uses on GPU ``uuid`` (compared case-insensitively); 0 if absent."""
        for g in self.gpus:
            if g.uuid.lower() == uuid.lower():
                return g.used
        return 0


def slot_offset(index: int) -> int:
    """Byte offset of slot ``index`` (0..1023) in the file; also its liveness-lock byte."""
    return HEADER_SIZE + index * SLOT_SIZE


def _held_by_other(fd: int, offset: int) -> bool:
    req = _FLOCK.pack(_F_WRLCK, os.SEEK_SET, offset, 1, 0)
    res = fcntl.fcntl(fd, _F_OFD_GETLK, req)
    return bool(_FLOCK.unpack(res)[0] != _F_UNLCK)


def slot_alive(path: str, index: int) -> bool:
    """True when the process owning slot ``index`` of the region at ``path`` is alive.

    Tests the slot's open-file-description lock (Linux >= 3.15). Raises ``OSError``.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _held_by_other(fd, slot_offset(index))
    finally:
        os.close(fd)


def parse_region(data: bytes, alive: Sequence[bool | None] | None = None) -> RegionSnapshot:
    """Decode a region image (``FILE_SIZE`` bytes).

    ``alive``: optional liveness per slot index (``None`` entries = unknown); slots known dead
    are left out of the snapshot and of the ``used`` sums. Raises :class:`RegionError`: the
    magic first, then a version newer than :data:`READ_VERSIONS` (named as such, whatever the
    file's size: a newer layout may be larger), then the size, version and layout.
    """
    if len(data) >= 12:
        magic, version = struct.unpack_from("<QI", data, 0)
        if magic != MAGIC:
            raise RegionError(f"bad magic {magic:#x}")
        reads = ", ".join(map(str, READ_VERSIONS))
        if version > max(READ_VERSIONS):
            raise RegionError(
                f"region version {version} is newer than this reader's (versions {reads}): a "
                "newer driver and enforcement library made it; upgrade the monitor"
            )
    if len(data) != FILE_SIZE:
        raise RegionError(f"region is {len(data)} bytes, expected {FILE_SIZE}")
    (magic, version, header_size, slot_size, slot_count, gpu_count, hw, generation, overhead) = (
        _HEADER.unpack_from(data, 0)
    )
    if version not in READ_VERSIONS:
        raise RegionError(
            f"region version {version} is not one this reader reads "
            f"({', '.join(map(str, READ_VERSIONS))})"
        )
    if (header_size, slot_size, slot_count) != (HEADER_SIZE, SLOT_SIZE, MAX_SLOTS):
        raise RegionError(f"unsupported region layout (version {version})")
    gpu_count = min(gpu_count, MAX_GPUS)
    hw = min(hw, MAX_SLOTS)
    slots: list[RegionSlot] = []
    for i in range(hw):
        vals = _SLOT.unpack_from(data, slot_offset(i))
        if vals[0] != SLOT_LIVE:
            continue
        a = alive[i] if alive is not None and i < len(alive) else None
        if a is False:
            continue
        slots.append(
            RegionSlot(
                index=i,
                pid=vals[1],
                pid_ns=vals[2],
                start_time=vals[3],
                generation=vals[4],
                used=tuple(vals[5 : 5 + MAX_GPUS]),
                contexts=tuple(vals[5 + MAX_GPUS :]),
                alive=a,
            )
        )
    gpus: list[RegionGpu] = []
    for g in range(gpu_count):
        (uuid, limit, cores, _flags, _tat, launches, paced, _r) = _GPU.unpack_from(
            data, GPUS_OFFSET + g * GPU_SIZE
        )
        gpus.append(
            RegionGpu(
                index=g,
                uuid=uuid.split(b"\0", 1)[0].decode("ascii", "replace"),
                memory_limit=limit,
                cores=cores,
                used=sum(s.used[g] for s in slots),
                launches=launches,
                paced_ns=paced,
            )
        )
    return RegionSnapshot(
        version=version,
        generation=generation,
        context_overhead=overhead,
        slot_high_water=hw,
        gpus=tuple(gpus),
        slots=tuple(slots),
    )


def read_region(path: str, check_liveness: bool = True) -> RegionSnapshot:
    """Read the region file at ``path``.

    With ``check_liveness`` each live slot's lock is tested (one ``fcntl`` per slot) and the
    slots of dead processes are excluded, as the library would reclaim them. Raises
    :class:`RegionError` for a foreign or truncated file and ``OSError`` for I/O errors.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = b""
        while len(data) < FILE_SIZE:
            chunk = os.pread(fd, FILE_SIZE - len(data), len(data))
            if not chunk:
                break
            data += chunk
        alive: list[bool | None] | None = None
        if check_liveness and len(data) == FILE_SIZE:
            hw = min(struct.unpack_from("<I", data, OFFSETS["h.slot_high_water"])[0], MAX_SLOTS)
            alive = [_held_by_other(fd, slot_offset(i)) for i in range(hw)]
        return parse_region(data, alive)
    finally:
        os.close(fd)


def create_region(
    path: str,
    gpus: Sequence[tuple[str, int, int]],
    context_overhead: int = 0,
    mode: int = 0o666,
    *,
    sync: bool = True,
) -> None:
    """Create an empty region at ``path`` (what the driver does at NodePrepareResources).

    ``gpus``: up to 16 ``(uuid, memory_limit_bytes, cores_percent)``. Written to a temporary
    file and renamed into place, so a process of the claim never maps a half-written region.
    ``sync=False`` skips the fsync (see ``write_atomic``). Raises ``ValueError`` for more than
    16 GPUs or a UUID longer than 47 bytes, ``OSError``.
    """
    if len(gpus) > MAX_GPUS:
        raise ValueError(f"at most {MAX_GPUS} GPUs per region")
    buf = bytearray(HEADER_SIZE)  # the slots are allocated zeros (write_atomic's size)
    _HEADER.pack_into(
        buf, 0, MAGIC, VERSION, HEADER_SIZE, SLOT_SIZE, MAX_SLOTS, len(gpus), 0, 0, context_overhead
    )
    for i, (uuid, limit, cores) in enumerate(gpus):
        raw = uuid.encode("ascii")
        if len(raw) >= UUID_LEN:
            raise ValueError(f"GPU UUID too long: {uuid!r}")
        _GPU.pack_into(buf, GPUS_OFFSET + i * GPU_SIZE, raw, limit, cores, GPU_IN_USE, 0, 0, 0, 0)
    # The slots are all zero: only the header is written, the rest is allocated zeros.
    write_atomic(path, bytes(buf), mode, ".region.", sync=sync, size=FILE_SIZE)
