"""What an enforcement library reads, learnt from its file without loading it.

The library (``native/src/limits.c``) carries an ELF section, ``.tessera_formats``
(``TESSERA_FORMATS_SECTION`` in ``tessera_limits.h``), holding one line per file format it
reads; today ``limits <min>..<max>\\n``, the limits file versions it parses. The node driver
reads the section from the library it hands to containers (``--library``, the file the chart's
init container installs on the host) before it writes a claim's limits file, and refuses a
claim whose file that library could not read (:func:`tessera.driver.prepare.plan_claim`).

Nothing is loaded or run: the library is an ``LD_PRELOAD`` interposer whose constructors would
act on the driver's own process, and the file may be another build (another architecture, an
older release) than the driver's. A library without the section is one built before the limits
file versions were made explicit: it reads version 1 only.
"""

from __future__ import annotations

import os
import re
import struct
import threading
from dataclasses import dataclass

from tessera.enforcement.limits import MIN_VERSION

SECTION = ".tessera_formats"
"""Name of the ELF section (``TESSERA_FORMATS_SECTION``)."""
_MAX_SECTION = 4096
_LIMITS_LINE = re.compile(r"limits (\d{1,9})\.\.(\d{1,9})")


class LibraryError(ValueError):
    """The file is not an enforcement library whose formats can be read (names the file)."""


@dataclass(frozen=True)
class LibraryFormats:
    """The formats the library at ``path`` reads.

    ``limits``: the limits file versions it parses, ascending (``(1, 2)``); ``marked``: False
    when the file has no ``.tessera_formats`` section (a library built before it: ``limits``
    is then ``(1,)``).
    """

    path: str
    limits: tuple[int, ...]
    marked: bool

    def describe(self) -> str:
        """The versions in words, for errors: ``"limits file versions 1..2"``, or for an
        unmarked library ``"limits file version 1 only (it predates versioned limits files)"``."""
        if not self.marked:
            return "limits file version 1 only (it predates versioned limits files)"
        lo, hi = self.limits[0], self.limits[-1]
        return f"limits file version {lo} only" if lo == hi else f"limits file versions {lo}..{hi}"


def _section(data: bytes, path: str) -> bytes | None:
    """The bytes of :data:`SECTION` in the ELF image ``data``, or None when it has none. Raises
    :class:`LibraryError` for a file that is not a well-formed ELF shared object."""
    if data[:4] != b"\x7fELF":
        raise LibraryError(f"{path}: not an ELF file (no \\x7fELF header)")
    cls, enc = data[4], data[5]
    if cls not in (1, 2) or enc not in (1, 2):
        raise LibraryError(f"{path}: unknown ELF class {cls} or data encoding {enc}")
    end = "<" if enc == 1 else ">"
    if cls == 2:
        shoff, shentsize, shnum, shstrndx = (
            struct.unpack_from(end + "Q", data, 0x28)[0],
            *struct.unpack_from(end + "HHH", data, 0x3A),
        )
        entry = struct.Struct(end + "IIQQQQIIQQ")
    else:
        shoff, shentsize, shnum, shstrndx = (
            struct.unpack_from(end + "I", data, 0x20)[0],
            *struct.unpack_from(end + "HHH", data, 0x2E),
        )
        entry = struct.Struct(end + "IIIIIIIIII")
    if shoff == 0 or shnum == 0:
        return None  # no section headers (stripped to the bone): treated as unmarked
    if shentsize != entry.size or shoff + shnum * shentsize > len(data) or shstrndx >= shnum:
        raise LibraryError(f"{path}: ELF section headers out of the file (truncated?)")
    headers = [entry.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names_at, names_size = headers[shstrndx][4], headers[shstrndx][5]
    names = data[names_at : names_at + names_size]
    for h in headers:
        name_end = names.find(b"\0", h[0])
        if name_end < 0 or names[h[0] : name_end] != SECTION.encode():
            continue
        offset, size = h[4], h[5]
        if size > _MAX_SECTION or offset + size > len(data):
            raise LibraryError(f"{path}: section {SECTION} is out of the file or too large")
        return data[offset : offset + size]
    return None


def _parse(path: str, raw: bytes | None) -> LibraryFormats:
    if raw is None:
        return LibraryFormats(path, (MIN_VERSION,), marked=False)
    text = raw.split(b"\0", 1)[0].decode("ascii", "replace")
    for line in text.splitlines():
        m = _LIMITS_LINE.fullmatch(line.strip())
        if m:
            lo, hi = int(m[1]), int(m[2])
            if not 1 <= lo <= hi:
                break
            return LibraryFormats(path, tuple(range(lo, hi + 1)), marked=True)
    raise LibraryError(
        f"{path}: section {SECTION} is {text!r}, with no 'limits <min>..<max>' line: not a "
        "Tessera enforcement library, or a damaged one"
    )


_cache: dict[str, tuple[tuple[int, int, int, int], LibraryFormats]] = {}
_cache_lock = threading.Lock()


def library_formats(path: str | os.PathLike[str]) -> LibraryFormats:
    """What the enforcement library at ``path`` reads (its ``.tessera_formats`` section).

    Read again whenever the file changed (device, inode, modification time or size differ:
    the chart's init container replaces the library on the host at every driver start, and
    two driver instances may share it in a rolling update); unchanged, the last answer is
    returned without reading. Raises ``OSError`` when the file cannot be read and
    :class:`LibraryError` when it is not an ELF file or its section is malformed.
    """
    p = os.fspath(path)
    st = os.stat(p)
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    with _cache_lock:
        hit = _cache.get(p)
    if hit is not None and hit[0] == key:
        return hit[1]
    with open(p, "rb") as f:
        data = f.read()
    formats = _parse(p, _section(data, p))
    with _cache_lock:
        _cache[p] = (key, formats)
    return formats
