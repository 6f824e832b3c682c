"""Tessera's in-container enforcement: the files shared with ``libtessera-enforce.so``.

* :mod:`tessera.enforcement.limits` - the read-only limits file the driver writes per claim.
* :mod:`tessera.enforcement.region` - the claim's shared usage region the library updates and
  the monitor reads.

The C library itself lives in ``native/`` (see ``docs/enforcement.md``).
"""

from __future__ import annotations

import os

LIBRARY_NAME = "libtessera-enforce.so"


def library_path() -> str | None:
    """Path of the enforcement library installed with this package, or ``None``.

    ``make -C native package`` copies it to ``tessera/enforcement/lib/``; the driver mounts it
    into containers and names it in their ``/etc/ld.so.preload``.
    """
    p = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", LIBRARY_NAME)
    return p if os.path.isfile(p) else None
