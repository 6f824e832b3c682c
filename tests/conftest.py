"""Shared test fixtures: the corpus of real inputs lives in ../shared/corpus beside the repo."""

from __future__ import annotations

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
