"""UUID texts made without ``uuid.UUID`` objects: the simulation makes one or more per pod,
claim and GPU of a fleet. Same text as the :mod:`uuid` module's. Pure: no I/O."""

from __future__ import annotations

import hashlib
import uuid

_VERSION_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))
_URL_NAMESPACE = uuid.NAMESPACE_URL.bytes


def uuid_text(n: int, version: int) -> str:
    """``str(uuid.UUID(int=n, version=version))`` for a 128-bit ``n``: the RFC 4122 variant
    and the version bits set."""
    h = "%032x" % ((n & _VERSION_CLEAR) | (0x8000 << 48) | (version << 76))
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def uuid5_url(name: str) -> str:
    """``str(uuid.uuid5(uuid.NAMESPACE_URL, name))``."""
    digest = hashlib.sha1(_URL_NAMESPACE + name.encode("utf-8"), usedforsecurity=False).digest()
    return uuid_text(int.from_bytes(digest[:16], "big"), 5)
