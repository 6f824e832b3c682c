"""Every conformance scenario, run through the upstream Go allocator (Kubernetes v1.37.2, via
tools/kube's allocator-harness), must give Tessera's answer: the same error message, or the same
allocation results in the same order (tests/conformance/compare.py says exactly how)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.localcluster.harness import run_scenario as run_upstream

from .compare import assert_same
from .test_conformance import SCENARIOS, load, run_scenario

pytestmark = pytest.mark.upstream


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_agrees_with_upstream(path: Path) -> None:
    sc = load(path)
    err, results = run_scenario(sc)
    assert_same(sc, err, results, run_upstream(path, timeout=60))


_CC = [p for p in SCENARIOS if "ConsumableCapacity" in (load(p).get("features") or [])]


@pytest.mark.parametrize("path", _CC, ids=[p.stem for p in _CC])
def test_agrees_with_upstream_with_fractional_capacity_range(path: Path) -> None:
    """The same with DRAFractionalCapacityRange on (its Kubernetes 1.37 default, and Tessera's:
    the step arithmetic in milli-units), which the scenario files leave off unless they name it."""
    sc = load(path)
    if "FractionalCapacityRange" not in sc["features"]:
        sc["features"] = [*sc["features"], "FractionalCapacityRange"]
    err, results = run_scenario(sc)
    assert_same(sc, err, results, run_upstream(sc, timeout=60))
