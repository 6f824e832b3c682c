"""How Tessera's answers are compared with the upstream Go allocator's (the harness's), for
``test_upstream_parity.py`` and ``test_random_differential.py``. Stricter than the scenario
files' own comparison (``test_conformance.py``, which follows upstream's ``RunTestAllocator``):

* errors: the same message, byte for byte, except the CEL library's own wording after
  ``CEL compile error: `` / ``CEL runtime error: ``, where Tessera (cel-python) and upstream
  (cel-go) word things differently: there the text before that marker must be equal and
  Tessera's CEL message (without its hint) must appear in upstream's. Deliberate: cel-go prints
  ``compilation failed: ERROR: <input>:1:1: ...`` with a source excerpt, and its "no such key"
  hint recommends ``.?``/``orValue()``, which cel-python cannot evaluate; Tessera's hint
  recommends ``has()``.
* results: claim by claim, and inside a claim device result by device result **in allocation
  order** (shareIDs by presence, quantities by value, node selectors ignoring term order).
  One upstream rendering is reproduced before comparing: ``Quantity.String()`` of a DecimalSI
  value past 10^18 whose exponent has no SI suffix drops the exponent (10^21 is written
  ``"1"``, kubernetes v1.37.2: ``CanonicalizeBytes`` ignores the failed suffix lookup), so the
  harness prints such a ``consumedCapacity`` that way; Tessera writes the value (``1000E``).
  A live cluster would store upstream's text.
  Except where upstream's ``stable`` variant runs (no ConsumableCapacity,
  DeviceBindingAndStatus or ListTypeAttributes feature): it visits pools in Go map order, which
  changes from run to run, and tries permutations rather than combinations, so its answer is
  one of several and may change between runs. There a claim's device results are compared as a
  multiset (the scenario files, whose answers do not depend on the order), and for generated
  scenarios (``exact=False``) only whether the claims were allocated. Tessera always answers as
  the incubating variant does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tessera.api.quantity import Quantity

from .test_conformance import normalize

CEL_MARKERS = ("CEL compile error: ", "CEL runtime error: ")
# Features that make upstream pick its incubating (or experimental) variant.
_NOT_STABLE = {"ConsumableCapacity", "DeviceBindingAndStatus", "ListTypeAttributes"}


def same_error(tessera: str, upstream: str) -> bool:
    """Whether two allocator errors say the same thing (see the module docstring)."""
    if tessera == upstream:
        return True
    for marker in CEL_MARKERS:
        if marker in tessera and marker in upstream:
            t_head, _, t_cel = tessera.partition(marker)
            u_head, _, u_cel = upstream.partition(marker)
            core = t_cel.split(" (hint:", 1)[0]
            return t_head == u_head and bool(core) and core in u_cel
    return False


def ordered(features: Sequence[str]) -> bool:
    """Whether upstream's device results come in a deterministic order for these features."""
    return bool(_NOT_STABLE & set(features))


def go_string(text: str) -> str:
    """``text`` as upstream's ``Quantity.String()`` renders its value: the same but for a
    DecimalSI value whose canonical exponent is past 18 (no SI suffix), whose exponent Go drops."""
    q = Quantity.parse(text, beyond_int64=True)
    if q.format != "DecimalSI" or q.value.denominator != 1 or abs(q.value) < 10**21:
        return text
    m, e = abs(int(q.value)), 0
    while m % 10 == 0:
        m, e = m // 10, e + 1
    while e % 3:
        m, e = m * 10, e - 1
    if e <= 18:
        return text
    return f"{'-' if q.value < 0 else ''}{m}"


def _as_upstream_prints(result: dict[str, Any] | None) -> dict[str, Any] | None:
    if result is None:
        return None
    devs = dict(result.get("devices") or {})
    rs = []
    for r in devs.get("results") or []:
        if r.get("consumedCapacity"):
            r = {
                **r,
                "consumedCapacity": {k: go_string(v) for k, v in r["consumedCapacity"].items()},
            }
        rs.append(r)
    devs["results"] = rs
    return {**result, "devices": devs}


def assert_same(
    sc: dict[str, Any], err: str, results: list[Any], up: dict[str, Any], exact: bool = True
) -> None:
    """Tessera's ``(err, results)`` for scenario ``sc`` against the harness output ``up``."""
    up_err = up.get("error") or ""
    assert same_error(err, up_err), f"tessera error {err!r}, upstream error {up_err!r}"
    if err or up_err:
        return
    up_results = up.get("results") or [None] * len(results)
    results = [_as_upstream_prints(r) for r in results]
    strict = ordered(sc.get("features") or [])
    if not strict and not exact:
        assert [r is None for r in results] == [r is None for r in up_results]
        return
    assert [normalize(r, strict) for r in results] == [normalize(r, strict) for r in up_results]
