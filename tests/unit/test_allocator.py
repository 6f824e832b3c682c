"""Allocator behaviour the conformance scenarios do not pin down on their own."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tessera.allocator import AllocatedState, AllocationError, Allocator, Features, Node

NODE = Node("node-1", {"region": "region-1"})
ALL_FEATURES = Features()


def klass(name: str = "class-a", driver: str = "driver-a") -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def rslice(
    *devices: dict[str, Any], driver: str = "driver-a", pool: str = "pool-1", **spec: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{pool}-slice"},
        "spec": {
            "driver": driver,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "nodeName": "node-1",
            "devices": list(devices),
            **spec,
        },
    }


def rclaim(*requests: dict[str, Any], ns: str | None = None, **devices: Any) -> dict[str, Any]:
    md: dict[str, Any] = {"name": "claim-0"}
    if ns:
        md["namespace"] = ns
    return {"metadata": md, "spec": {"devices": {"requests": list(requests), **devices}}}


def exact(name: str = "req-0", **kw: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "class-a", **kw}}


def allocator(
    *slices: dict[str, Any], features: Features = ALL_FEATURES, classes: list | None = None
) -> Allocator:
    cls = {c["metadata"]["name"]: c for c in (classes or [klass(), klass("class-b", "driver-b")])}
    return Allocator(list(slices), cls, AllocatedState(), features, random.Random(0))


def test_claim_reference_with_namespace() -> None:
    a = allocator(rslice({"name": "d1"}))
    with pytest.raises(
        AllocationError, match=r"^claim team-a/claim-0, request req-0: missing device class name"
    ):
        a.allocate(
            NODE, [rclaim({"name": "req-0", "exactly": {"deviceClassName": ""}}, ns="team-a")]
        )


def test_a_selector_that_does_not_compile_fails_only_when_a_device_reaches_it() -> None:
    # Upstream compiles selectors on first use (checked with the harness, Kubernetes v1.37.2):
    # no device, or only devices the class already refuses, means no error at all.
    bad = exact(selectors=[{"cel": {"expression": "nope == 1"}}])
    assert allocator().allocate(NODE, [rclaim(bad)]) is None
    assert (
        allocator(rslice({"name": "d1"}, driver="driver-b")).allocate(NODE, [rclaim(bad)]) is None
    )
    with pytest.raises(
        AllocationError,
        match=r"^claim claim-0: selector #0: CEL compile error: .*undeclared reference to 'nope'",
    ):
        allocator(rslice({"name": "d1"})).allocate(NODE, [rclaim(bad)])


def test_comprehension_variables_are_declared() -> None:
    a = allocator(rslice({"name": "d1", "attributes": {"model": {"string": "h100"}}}))
    sel = {
        "cel": {
            "expression": 'device.attributes["driver-a"].all(k, k != "x") && ["h100"].exists(m, m == '
            'device.attributes["driver-a"].model)'
        }
    }
    res = a.allocate(NODE, [rclaim(exact(selectors=[sel]))])
    assert res is not None and res[0]["devices"]["results"][0]["device"] == "d1"


def test_config_listing_an_unchosen_subrequest_is_not_widened() -> None:
    """[req-0/subReq-1, req-1] with subReq-0 chosen applies to req-1 only: not cleared."""
    a = allocator(rslice({"name": "d1"}, {"name": "d2"}))
    opaque = {"driver": "driver-a", "parameters": {"a": "b"}}
    claim = rclaim(
        {
            "name": "req-0",
            "firstAvailable": [
                {"name": "subReq-0", "deviceClassName": "class-a"},
                {"name": "subReq-1", "deviceClassName": "class-b"},
            ],
        },
        exact("req-1"),
        config=[{"requests": ["req-0/subReq-1", "req-1"], "opaque": opaque}],
    )
    res = a.allocate(NODE, [claim])
    assert res is not None
    assert res[0]["devices"]["config"] == [
        {"source": "FromClaim", "requests": ["req-0/subReq-1", "req-1"], "opaque": opaque}
    ]


def test_binds_to_node_needs_the_binding_feature() -> None:
    sl = rslice({"name": "d1", "bindsToNode": True})
    del sl["spec"]["nodeName"]
    sl["spec"]["allNodes"] = True
    on = allocator(sl).allocate(NODE, [rclaim(exact())])
    off = allocator(sl, features=Features(device_binding_and_status=False)).allocate(
        NODE, [rclaim(exact())]
    )
    assert on is not None and on[0]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0][
        "values"
    ] == ["node-1"]
    assert off is not None and "nodeSelector" not in off[0]


def test_capacity_memo_distinguishes_request_shapes() -> None:
    """The per-(device, request) consumption memo must not mix different capacity requests."""
    dev = {
        "name": "gpu",
        "allowMultipleAllocations": True,
        "capacity": {
            "memory": {
                "value": "8",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}},
            }
        },
    }
    a = allocator(rslice(dev))
    small = a.allocate(NODE, [rclaim(exact(capacity={"requests": {"memory": "2"}}))])
    big = a.allocate(NODE, [rclaim(exact(capacity={"requests": {"memory": "9"}}))])
    again = a.allocate(NODE, [rclaim(exact(capacity={"requests": {"memory": "2"}}))])
    assert small is not None and small[0]["devices"]["results"][0]["consumedCapacity"] == {
        "memory": "2"
    }
    assert big is None
    assert again == small or (
        again is not None
        and again[0]["devices"]["results"][0]["consumedCapacity"] == {"memory": "2"}
    )


def test_all_mode_without_devices_falls_through_to_next_subrequest() -> None:
    a = allocator(rslice({"name": "d1"}, driver="driver-b"))
    claim = rclaim(
        {
            "name": "req-0",
            "firstAvailable": [
                {"name": "subReq-0", "deviceClassName": "class-a", "allocationMode": "All"},
                {"name": "subReq-1", "deviceClassName": "class-b"},
            ],
        }
    )
    res = a.allocate(NODE, [claim])
    assert res is not None and [r["request"] for r in res[0]["devices"]["results"]] == [
        "req-0/subReq-1"
    ]


def test_selector_results_shared_only_between_devices_that_agree_on_named_fields() -> None:
    from tessera.allocator import Allocator
    from tessera.allocator.core import _reads, _selector_key
    from tessera.cel import compile_selector

    def dev(name: str, model: str, numa: int) -> dict:
        return {
            "name": name,
            "attributes": {
                "model": {"string": model},
                "numa": {"int": numa},
                "uuid": {"string": f"GPU-{name}"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }

    sl = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": {
            "driver": "d.example.com",
            "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "n",
            "devices": [dev("a", "H100", 0), dev("b", "H100", 1), dev("c", "A100", 0)],
        },
    }
    alloc = Allocator([sl], {})
    a, b, c = list(alloc.index.devices())
    by_model = compile_selector('device.attributes["d.example.com"].model == "H100"')
    by_numa = compile_selector('device.attributes["d.example.com"]["numa"] == 0')
    assert [alloc.matches([by_model], d, "t") for d in (a, b, c)] == [True, True, False]
    assert [alloc.matches([by_numa], d, "t") for d in (a, b, c)] == [True, False, True]
    # a and b differ only in fields by_model does not name: one key; c differs in model.
    assert _selector_key(by_model.expression, a) == _selector_key(by_model.expression, b)
    assert _selector_key(by_model.expression, a) != _selector_key(by_model.expression, c)
    assert _selector_key(by_numa.expression, a) != _selector_key(by_numa.expression, b)
    # Enumerating the attribute map may read anything: no sharing.
    assert _reads('device.attributes["d.example.com"].size() > 2') is None
    assert _reads('device.attributes["d.example.com"].exists(k, k == "x")') is None
    # The rest of the Kubernetes CEL environment that enumerates or computes keys: no sharing.
    for expr in (
        'device.attributes["d.example.com"].existsOne(k, k == "x")',
        'device.attributes["d.example.com"].transformList(k, v, v).size() > 0',
        'device.attributes["d.example.com"].transformMap(k, v, v).size() > 0',
        'device.attributes["d.example.com"].transformMapEntry(k, v, {k: v}).size() > 0',
        'cel.bind(m, device.attributes, m["d.example.com"].model == "H100")',
        'cel.bind(k, "model", device.attributes["d.example.com"][k] == "H100")',
    ):
        assert _reads(expr) is None, expr
    # String-literal keys, optional ones included, name what they read: shared.
    assert _reads('device.attributes[?"d.example.com"].model == "H100"') == {
        ("attributes", "d.example.com/model")
    }
    # A key computed by cel.bind must not let b (numa 1) share a's result (numa 0).
    computed = compile_selector(
        'cel.bind(k, "nu" + "ma", device.attributes["d.example.com"][k] == 0)'
    )
    assert [alloc.matches([computed], d, "t") for d in (a, b, c)] == [True, False, True]
