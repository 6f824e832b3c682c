"""Fixtures for the native enforcement-library tests.

The session builds the library, the fake ``libcuda.so.1``/``libnvidia-ml.so.1`` and the C
test programs with ``make -C native`` into a temporary build directory (plain and
AddressSanitizer builds). A missing C compiler is a failure, not a skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from native_helpers import NATIVE, Build

from tessera.enforcement.limits import LIMITS_PATH


def _make(*args: str) -> None:
    cc = os.environ.get("CC", "gcc")
    if shutil.which(cc) is None:
        pytest.fail(f"C compiler {cc!r} not found: the native tests need gcc (apt-get install gcc)")
    if shutil.which("make") is None:
        pytest.fail("make not found: the native tests need it")
    r = subprocess.run(["make", "-C", str(NATIVE), *args], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"make {' '.join(args)} failed:\n{r.stdout}\n{r.stderr}")


@pytest.fixture(scope="session")
def build_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.path.exists(LIMITS_PATH):
        pytest.fail(f"{LIMITS_PATH} exists on this machine; the tests need the env fallback")
    return tmp_path_factory.mktemp("native-build")


@pytest.fixture(scope="session")
def plain(build_root: Path) -> Build:
    b = build_root / "plain"
    _make(f"BUILD={b}", "test-programs")
    return Build(b, b / "libtessera-enforce.so", b / "fake", b / "bin")


@pytest.fixture(scope="session")
def asan(build_root: Path) -> Build:
    b = build_root / "plain"
    _make(f"BUILD={b}", "asan")
    a = b / "asan"
    cc = os.environ.get("CC", "gcc")
    rt = subprocess.run(
        [cc, "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not os.path.isabs(rt):
        pytest.fail(f"{cc} has no AddressSanitizer runtime (libasan.so)")
    return Build(a, a / "libtessera-enforce.so", a / "fake", a / "bin", (rt,))


@pytest.fixture(params=["plain", "asan"])
def anybuild(request: pytest.FixtureRequest) -> Build:
    b: Build = request.getfixturevalue(request.param)
    return b


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test started; killed at teardown if still running."""
    ps: list[subprocess.Popen[str]] = []
    yield ps
    for p in ps:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
