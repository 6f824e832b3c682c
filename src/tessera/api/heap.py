"""The cyclic garbage collector kept off what a large input or a simulation builds.

Reading 500,000 pods or placing them builds millions of dicts, lists and tuples that live
until the command ends and hold no reference cycles (plain decoded JSON/YAML, and what a
simulation derives from it). CPython's cyclic collector still scans each of them several
times as it ages through the generations, and each full collection rescans the whole heap:
at 10,000 nodes and 500,000 claims that was over 8 s of a 60 s run (``docs/benchmarks.md``).
Reference counting frees all of it as before; only the search for cycles is paused.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Run the body with the cyclic collector disabled; afterwards, what it built is moved to
    the oldest generation without a scan (``gc.freeze()`` then ``gc.unfreeze()``) and the
    collector is enabled again if it was. Cycles made inside are collected later, by the next
    full collection, as any old object's would be. Nests: an inner use leaves the collector
    as the outer one set it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # young objects straight to the oldest generation: no scan of each on its way
        gc.unfreeze()
        if enabled:
            gc.enable()
