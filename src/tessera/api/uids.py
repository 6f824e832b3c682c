"""UUID texts made without ``uuid.UUID`` objects: the simulation makes one or more per pod,
claim and GPU of a fleet. Same text as the :mod:`uuid` module's. Pure: no I/O."""

from __future__ import annotations

import hashlib
import uuid

_VERSION_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))
# sha1 over the namespace's bytes, copied for each name (uuid5 hashes namespace + name).
_URL_PREFIX = hashlib.sha1(uuid.NAMESPACE_URL.bytes, usedforsecurity=False)


def uuid_text(n: int, version: int) -> str:
    """``str(uuid.UUID(int=n, version=version))`` for a 128-bit ``n``: the RFC 4122 variant
    and the version bits set."""
    h = "%032x" % ((n & _VERSION_CLEAR) | (0x8000 << 48) | (version << 76))
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uuid5_url(name: str) -> str:
    """``str(uuid.uuid5(uuid.NAMESPACE_URL, name))``."""
    h = _URL_PREFIX.copy()
    h.update(name.encode("utf-8"))
    b = bytearray(h.digest()[:16])
    b[6] = (b[6] & 0x0F) | 0x50  # version 5
    b[8] = (b[8] & 0x3F) | 0x80  # RFC 4122 variant
    x = b.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"
