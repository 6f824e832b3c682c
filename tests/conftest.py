"""Shared test fixtures: the corpus of real inputs lives in ../shared/corpus beside the repo."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def corpus_path() -> Path:
    """Where the corpus should be: ``$TESSERA_CORPUS``, else ``../shared/corpus`` beside the repo."""
    env = os.environ.get("TESSERA_CORPUS")
    return Path(env) if env else REPO.parent / "shared" / "corpus"


def corpus_dir() -> Path:
    """The corpus folder; raises if it is missing (tests fail, never skip, without it)."""
    p = corpus_path()
    if not p.is_dir():
        raise RuntimeError(f"corpus not found at {p}: set TESSERA_CORPUS to the shared/corpus folder")
    return p


@pytest.fixture(scope="session")
def corpus() -> Path:
    return corpus_dir()
