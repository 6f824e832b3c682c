"""Every conformance scenario, run through the upstream Go allocator (Kubernetes v1.37.2, via
tools/kube's allocator-harness), must give Tessera's answer: same error (both or neither), and
the same allocation results compared as upstream's own tests compare them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.kube.harness import run_scenario as run_upstream

from .test_conformance import SCENARIOS, load, normalize, run_scenario

pytestmark = pytest.mark.upstream


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_agrees_with_upstream(path: Path) -> None:
    sc = load(path)
    err, results = run_scenario(sc)
    up = run_upstream(path, timeout=60)
    up_err = up.get("error") or ""
    assert bool(err) == bool(up_err), f"tessera error {err!r}, upstream error {up_err!r}"
    if err:
        return
    up_results = up.get("results") or [None] * len(results)
    assert [normalize(r) for r in results] == [normalize(r) for r in up_results]
