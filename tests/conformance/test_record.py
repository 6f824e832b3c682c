"""Every conformance scenario with a pending claim (no allocation, no error): the allocator's own
record of why (``Allocator.diagnose``) must agree with what the allocator decides, and
``tessera explain``'s account must be that record, device for device.

1. ``diagnose`` reaches the outcome ``allocate`` does (no allocation, no error).
2. "Fits on its own" is what the allocator does with the request alone: a claim holding only
   that request (count 1, the claim's constraints that cover it) is allocated exactly the first
   device the record says fits on its own, in search order; none when no device does.
3. ``explain_node`` shows, per request, the record's devices, the record's refusal for each
   (same check), the record's fitting devices, and the record's counts in its summary.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import pytest

from tessera.allocator import (
    AllocatedState,
    AllocationError,
    Allocator,
    Features,
    Node,
    RequestRecord,
)
from tessera.explain.explain import explain_node
from tessera.scheduler.words import refusal_text

from .test_conformance import SCENARIOS, load, run_scenario


def _pending(path: Path) -> bool:
    sc = load(path)
    exp = sc.get("expect") or {}
    return (
        bool(sc.get("claims"))
        and not exp.get("error")
        and all(r is None for r in exp.get("results") or [None])
    )


PENDING = [p for p in SCENARIOS if _pending(p)]


def _allocator(sc: dict[str, Any]) -> tuple[Allocator, Node]:
    node_d = sc.get("node") or {"name": "node-1"}
    classes = {c["metadata"]["name"]: c for c in sc.get("classes") or []}
    features = Features.from_names(sc.get("features") or [])
    state = AllocatedState.from_claims(sc.get("allocated") or [], features.consumable_capacity)
    alloc = Allocator(sc.get("slices") or [], classes, state, features, random.Random(0))
    return alloc, Node(node_d["name"], node_d.get("labels") or {})


def _alone_claim(claim: dict[str, Any], rr: RequestRecord) -> dict[str, Any]:
    """A claim holding only ``rr``'s request body, count 1, with the constraints covering it."""
    spec = claim["spec"]["devices"]
    body: dict[str, Any] = {}
    for r in spec["requests"]:
        if r["name"] != rr.parent:
            continue
        if rr.name == rr.parent:
            body = copy.deepcopy(r["exactly"])
        else:
            body = copy.deepcopy(
                next(s for s in r["firstAvailable"] if f"{r['name']}/{s['name']}" == rr.name)
            )
            body.pop("name")
    body["count"] = 1
    body["allocationMode"] = "ExactCount"
    cons = []
    for c in spec.get("constraints") or []:
        scope = c.get("requests") or []
        if not scope or rr.parent in scope or rr.name in scope:
            cons.append({k: v for k, v in c.items() if k != "requests"})
    out = copy.deepcopy(claim)
    out["spec"]["devices"] = {"requests": [{"name": "alone", "exactly": body}], "constraints": cons}
    return out


def test_there_are_pending_scenarios() -> None:
    assert len(PENDING) >= 60


@pytest.mark.parametrize("path", PENDING, ids=[p.stem for p in PENDING])
def test_record_agrees_with_the_allocator_and_explain_shows_it(path: Path) -> None:
    sc = load(path)
    claims = sc["claims"]
    err, results = run_scenario(sc)
    assert err == "" and all(r is None for r in results)

    alloc, node = _allocator(sc)
    rec = alloc.diagnose(node, claims)
    assert rec.error is None and rec.results is None  # 1.

    for rr in rec.requests:  # 2.
        if rr.all_mode:
            continue
        first = next((dr for dr in rr.devices if dr.alone is None), None)
        alone_alloc, _ = _allocator(sc)
        try:
            got = alone_alloc.allocate(node, [_alone_claim(claims[rr.claim_index], rr)])
        except AllocationError as e:
            # Only a selector that cannot be evaluated aborts; the record holds it for a device.
            assert any(
                dr.alone is not None and dr.alone.check == "cel-error" for dr in rr.devices
            ), str(e)
            continue
        if first is None:
            assert got is None, (
                f"{rr.name}: the record says nothing fits alone, the allocator placed {got}"
            )
        else:
            assert got is not None, (
                f"{rr.name}: the record says {first.device.name} fits alone, the allocator found none"
            )
            picked = got[0]["devices"]["results"][0]
            assert (picked["driver"], picked["pool"], picked["device"]) == first.id

    ne, rec2 = explain_node(alloc, node, claims, all_devices=True)  # 3.
    assert len(ne.requests) == len(rec2.requests) == len(rec.requests)
    for ron, rr in zip(ne.requests, rec2.requests, strict=True):
        assert ron.request == rr.name
        assert ron.considered == len(rr.devices)
        assert ron.fitting == ["/".join(dr.id) for dr in rr.fitting]
        assert [(v.device, v.check) for v in ron.devices] == [
            ("/".join(dr.id), dr.alone.check if dr.alone is not None else "fits")
            for dr in rr.devices
        ]
        assert sum(g.count for g in ron.groups) == len(rr.devices) - len(rr.fitting)
        assert f"request {rr.name}: {len(rr.fitting)} of {len(rr.devices)} device" in ne.summary
    assert ne.verdict == "refused" and ne.summary.startswith("cannot allocate all claims")


def test_record_names_a_capacity_amount_that_aborts() -> None:
    """A capacity request past the step arithmetic's int64 range aborts the allocation (Kubernetes
    v1.37, kubernetes PR #140442): diagnose reports the allocator's error and, on its own, the
    device it concerns (``capacity-error``) rather than raising; the device without a step
    would fit on its own."""
    path = Path(__file__).parent / "scenarios"
    sc = load(path / "consumable-capacity-range-policy-overflow-aborts-not-skip.yaml")
    alloc, node = _allocator(sc)
    rec = alloc.diagnose(node, sc.get("claims") or [])
    assert rec.error == run_scenario(sc)[0]
    assert "request 18446744073709551616 exceeds MaxInt64" in (rec.error or "")
    (rr,) = rec.requests
    by_device = {dr.device.name: dr.alone for dr in rr.devices}
    assert by_device["device-2"] is None
    bad = by_device["device-1"]
    assert bad is not None and bad.check == "capacity-error"
    assert refusal_text(bad).startswith(
        'capacity "capacity-0": capacity request cannot be represented'
    )
