"""The previous release's sources, built from git, for the upgrade-skew tests
(docs/install.md, "Supported skew").

:data:`PREVIOUS` is the last commit before limits file versions were explicit: its library reads
limits file version 1 (with ``unlimited``, which it added inside version 1) and has no
``.tessera_formats`` section; its writer put ``unlimited`` lines in version 1 files.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PREVIOUS = "3ae3dd1"
"""The last commit whose library and writer put ``unlimited`` inside limits file version 1."""


def build_previous(tmp: Path, *paths: str) -> Path:
    """Extract ``native`` and ``paths`` (repository paths) of :data:`PREVIOUS` under ``tmp``
    and build its enforcement library; returns the library's path
    (``tmp/build/libtessera-enforce.so``). Skips the test where the clone has no such commit
    (no git, or a shallow clone); fails with make's output when the build fails."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("no git history here: the previous release cannot be built")
    have = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], capture_output=True
    )
    if have.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} is not in this clone (shallow?)")
    tar = subprocess.run(
        ["git", "-C", str(REPO), "archive", PREVIOUS, "native", *paths],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar, check=True)
    r = subprocess.run(
        ["make", "-C", str(tmp / "native"), f"BUILD={tmp / 'build'}", "lib"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp / "build" / "libtessera-enforce.so"
