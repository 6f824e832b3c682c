"""tessera.api.requests: the one walk of a claim spec's exactly/firstAvailable requests."""

from __future__ import annotations

import yaml

from corpus_paths import corpus_path
from tessera.api.requests import claim_requests, device_requests


def test_a_prioritized_list_template_from_the_corpus() -> None:
    """NVIDIA's and the upstream examples write firstAvailable; the view names each subrequest
    as the allocation results do (``<request>/<subrequest>``) with its field path."""
    docs = []
    for path in sorted((corpus_path() / "dra-manifests").rglob("*.yaml")):
        try:
            docs.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict))
        except yaml.YAMLError:
            continue
    with_fa = [
        d
        for d in docs
        if d.get("kind") in ("ResourceClaim", "ResourceClaimTemplate")
        and "firstAvailable" in yaml.safe_dump(d)
    ]
    assert with_fa, "the corpus has claims with firstAvailable"
    for d in with_fa:
        spec = d["spec"]["spec"] if d["kind"] == "ResourceClaimTemplate" else d["spec"]
        raw = spec["devices"]["requests"]
        views = claim_requests(d)
        assert [r.name for r in views] == [r["name"] for r in raw]
        for r, v in zip(raw, views, strict=True):
            if "firstAvailable" in r:
                assert v.exactly is None
                assert [a.name for a in v.alternatives] == [
                    f"{r['name']}/{s['name']}" for s in r["firstAvailable"]
                ]
                assert [a.field for a in v.alternatives] == [
                    f"devices.requests[{v.index}].firstAvailable[{j}]"
                    for j in range(len(r["firstAvailable"]))
                ]
                assert [a.device_class_name for a in v.alternatives] == [
                    s["deviceClassName"] for s in r["firstAvailable"]
                ]
            else:
                assert v.alternatives == (v.exactly,) and v.exactly is not None
                assert v.exactly.device_class_name == r["exactly"]["deviceClassName"]


def test_fields_defaults_and_malformed_parts() -> None:
    spec = {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.tessera.dev",
                        "count": 2,
                        "capacity": {"requests": {"memory": "10Gi", "cores": "30"}},
                        "tolerations": [{"key": "k", "operator": "Exists"}],
                    },
                },
                "not a request",
                {
                    "name": "any",
                    "firstAvailable": [
                        {"name": "big", "deviceClassName": "a", "allocationMode": "All"},
                        7,
                        {"name": "small", "deviceClassName": "b", "capacity": {}},
                    ],
                },
            ]
        }
    }
    gpu, anyreq = device_requests(spec)
    assert (gpu.name, gpu.index, anyreq.index) == ("gpu", 0, 2)
    ex = gpu.exactly
    assert ex is not None and ex.position is None and ex.field == "devices.requests[0].exactly"
    assert ex.count == 2 and ex.allocation_mode == "ExactCount" and not ex.admin_access
    assert ex.capacity_requests == {"memory": "10Gi", "cores": "30"}
    assert ex.tolerations == [{"key": "k", "operator": "Exists"}] and ex.selectors == []
    big, small = anyreq.alternatives
    assert (big.name, big.position, big.count, big.allocation_mode) == ("any/big", 0, 1, "All")
    assert big.capacity_requests is None and small.capacity_requests == {}
    assert (small.name, small.field) == ("any/small", "devices.requests[2].firstAvailable[2]")
    assert device_requests(None) == [] == device_requests({"devices": {"requests": "x"}})
    template = {"kind": "ResourceClaimTemplate", "spec": {"spec": spec}}
    assert claim_requests(template) == device_requests(spec)
