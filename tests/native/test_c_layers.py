"""The layers of the C library (native/src/core.h): the file graph of its objects is acyclic
and no file calls into a layer above its own (``make -C native check``,
native/tools/c_layers.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from native_helpers import NATIVE

pytestmark = pytest.mark.native


def _c_layers():
    spec = importlib.util.spec_from_file_location("c_layers", NATIVE / "tools" / "c_layers.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["c_layers"] = mod
    spec.loader.exec_module(mod)
    return mod


LAYERS = [("core", ["log", "core"]), ("feature", ["pool"]), ("interposition", ["hooks"])]


def _graph(*edges: tuple[str, str]) -> dict[str, dict[str, set[str]]]:
    g: dict[str, dict[str, set[str]]] = {n: defaultdict(set) for _, fs in LAYERS for n in fs}
    for a, b in edges:
        g[a][b].add("sym")
    return g


def test_library_layers(tmp_path: Path) -> None:
    r = subprocess.run(
        ["make", "-C", str(NATIVE), "check", f"BUILD={tmp_path}", f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "acyclic, no call up a layer" in r.stdout


def test_check_fails_on_a_back_edge() -> None:
    c = _c_layers()
    down = [("hooks", "pool"), ("hooks", "core"), ("pool", "core"), ("core", "log")]
    assert c.problems(_graph(*down), LAYERS) == []
    up = c.problems(_graph(*down, ("core", "pool")), LAYERS)
    assert any("core (core) calls up into pool (feature)" in p for p in up)
    assert any(p.startswith("cycle: ") for p in up)
    # a cycle inside one layer is refused too
    same = c.problems(_graph(*down, ("log", "core")), LAYERS)
    assert same == ["cycle: core -> log -> core"]
    # and a file in no layer
    g = _graph(*down)
    g["stray"] = defaultdict(set)
    assert c.problems(g, LAYERS) == ["stray.o is in no layer (add it to one in native/Makefile)"]
