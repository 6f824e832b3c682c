"""Shared test fixtures: the corpus of real inputs lives in ../shared/corpus beside the repo."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from corpus_paths import corpus_path

REPO = Path(__file__).resolve().parents[1]


def corpus_dir() -> Path:
    """The corpus folder; raises if it is missing (tests fail, never skip, without it)."""
    p = corpus_path()
    if not p.is_dir():
        raise RuntimeError(
            f"corpus not found at {p}: set TESSERA_CORPUS to the shared/corpus folder"
        )
    return p


@pytest.fixture(scope="session")
def corpus() -> Path:
    return corpus_dir()


def stale_compiled_modules(repo: Path = REPO) -> list[str]:
    """The modules of ``compiled-modules.txt`` that import as a compiled ``.so`` older than their
    ``.py`` (edited since ``make venv``), and the compiled ``.so`` under ``src/`` of a module no
    longer listed: either way the tests would run code that is not the source."""
    listed = {
        line.split("#", 1)[0].strip()
        for line in (repo / "compiled-modules.txt").read_text().splitlines()
    } - {""}
    out = []
    for rel in sorted(listed):
        module = rel.removeprefix("src/").removesuffix(".py").replace("/", ".")
        spec = importlib.util.find_spec(module)
        origin = Path(spec.origin) if spec is not None and spec.origin else None
        if origin is None or origin.suffix != ".so":
            continue  # not compiled (TESSERA_PURE_PYTHON=1)
        if (repo / rel).stat().st_mtime > origin.stat().st_mtime:
            out.append(f"{module} ({origin.name} is older than {rel})")
    for so in sorted((repo / "src" / "tessera").rglob("*.cpython-*.so")):
        rel = so.relative_to(repo).as_posix().split(".cpython-")[0] + ".py"
        if rel not in listed:
            out.append(f"{rel} is not in compiled-modules.txt but {so.name} is there")
    return out


def pytest_sessionstart(session: pytest.Session) -> None:
    stale = stale_compiled_modules()
    if stale:
        pytest.exit(
            "compiled modules do not match their source: "
            + "; ".join(stale)
            + ". Run `make venv` to rebuild them (or `make clean`, or install with TESSERA_PURE_PYTHON=1)",
            returncode=2,
        )
