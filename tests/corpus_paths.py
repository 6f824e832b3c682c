"""Where the corpus of real inputs is: ``$TESSERA_CORPUS``, else ``../shared/corpus`` beside the repo."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def corpus_path() -> Path:
    """The corpus folder's path (not checked: callers fail, never skip, when it is missing)."""
    env = os.environ.get("TESSERA_CORPUS")
    return Path(env) if env else REPO.parent / "shared" / "corpus"
