"""Build hook: compiles the simulation's hot modules to C extensions with mypyc.

Everything else about the package is in ``pyproject.toml``. ``tessera simulate`` places claims
one by one the way kube-scheduler does; the per-pod bookkeeping and the allocator's search are
Python method calls on plain objects, and compiling these modules with mypyc (the type
checker's compiler: same source, same answers, checked types at run time) makes a fleet run
about 1.4x faster (``docs/benchmarks.md``, issue 16). The ``.py`` files stay the source of
truth; an editable install puts the compiled ``.so`` beside them (``make venv`` rebuilds them
when one changes; the test suite refuses to run against a stale one).

``TESSERA_PURE_PYTHON=1`` skips the compilation (same behaviour, slower): for a machine without
a C compiler or Python headers, and for the container image, which does not run ``simulate``.
"""

from __future__ import annotations

import os

from setuptools import setup

#: The modules compiled, relative to the repository root (also read by tests/conftest.py).
COMPILED = [
    "src/tessera/allocator/core.py",
    "src/tessera/allocator/model.py",
    "src/tessera/sim/simulate.py",
    "src/tessera/sim/reasons.py",
    "src/tessera/api/validation.py",
    "src/tessera/api/uids.py",
    "src/tessera/api/loader.py",
    "src/tessera/api/schema.py",
]


def ext_modules() -> list:  # type: ignore[type-arg]
    if os.environ.get("TESSERA_PURE_PYTHON", "") not in ("", "0"):
        return []
    from mypyc.build import mypycify

    return mypycify(COMPILED, opt_level="3", group_name="tessera_compiled")


setup(ext_modules=ext_modules())
