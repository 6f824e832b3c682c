"""Build hook: compiles the simulation's hot modules to C extensions with mypyc.

Everything else about the package is in ``pyproject.toml``. ``tessera simulate`` places claims
one by one the way kube-scheduler does; the per-pod bookkeeping and the allocator's search are
Python calls on plain objects, and compiling the modules listed in ``compiled-modules.txt``
with mypyc (mypy's compiler: the same source, the same answers, annotated types checked at run
time) makes a fleet run about 1.4x faster (``docs/benchmarks.md``). The ``.py`` files stay the
source: an editable install puts each compiled ``.so`` beside its ``.py`` (``make venv``
rebuilds them when one changes; the test suite refuses to run against a stale one).

``TESSERA_PURE_PYTHON=1`` skips the compilation (the same behaviour, slower): for a machine
without a C compiler or Python headers, and for the container image, which does not simulate.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from setuptools import setup

HERE = Path(__file__).resolve().parent


def compiled_modules() -> list[str]:
    """The paths in ``compiled-modules.txt`` (comments and blank lines skipped)."""
    lines = (HERE / "compiled-modules.txt").read_text().splitlines()
    return [s for line in lines if (s := line.split("#", 1)[0].strip())]


def ext_modules() -> list[Any]:
    if os.environ.get("TESSERA_PURE_PYTHON", "") not in ("", "0"):
        return []
    from mypyc.build import mypycify

    # mypy's cache of its own, not the project's .mypy_cache: that one is written by `make lint`
    # in the venv, where every library is installed and typed, and would make a local build
    # differ from a fresh one (the isolated build env has no library but PyYAML's stubs).
    os.environ["MYPY_CACHE_DIR"] = str(HERE / "build" / "mypyc-cache")
    return list(mypycify(compiled_modules(), opt_level="3", group_name="tessera_compiled"))


setup(ext_modules=ext_modules())
