"""tessera.convert: HAMi semantics, HAMi faults not reproduced, errors, names, CEL, API rules."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from tessera.api.quantity import Quantity
from tessera.cel import DeviceView, compile_selector, device_activation
from tessera.convert import (
    HAMI_RESOURCES,
    ContainerRequest,
    Conversion,
    ConversionError,
    convert_pod,
)
from tessera.convert.cel import cel_string

GiB = 2**30
MiB = 2**20
H100_80GB = 81559 * MiB  # corpus: gpud nvidia-smi -q, H100 80GB HBM3 "Total: 81559 MiB"
V100S_32GB = 32510 * MiB  # corpus: datakit gtx-8card, V100S-PCIE-32GB "<total>32510 MiB"

ATTRS = 'device.attributes["gpu.tessera.dev"]'
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# ---- helpers -------------------------------------------------------------------------------------
def pod(
    limits: dict[str, Any] | None = None,
    *,
    requests: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    name: str = "p",
    namespace: str | None = "ns",
    container: str = "c",
) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if limits is not None:
        res["limits"] = limits
    if requests is not None:
        res["requests"] = requests
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": container, "image": "x", "resources": res}]},
    }


def claim_request(conv: Conversion, i: int = 0) -> dict[str, Any]:
    """The single request of template i."""
    reqs = conv.templates[i]["spec"]["spec"]["devices"]["requests"]
    assert len(reqs) == 1
    return reqs[0]


TOPOLOGY = ["nvlink", "numa", "any"]


def exactly(conv: Conversion, i: int = 0) -> dict[str, Any]:
    """The request's ``exactly`` body; for a multi-GPU request (``firstAvailable`` over the
    topology levels, the same body under each name) the body of its last level."""
    r = claim_request(conv, i)
    if "exactly" in r:
        return r["exactly"]
    subs = r["firstAvailable"]
    assert [s["name"] for s in subs] in (TOPOLOGY, TOPOLOGY[:2]), subs
    bodies = [{k: v for k, v in s.items() if k != "name"} for s in subs]
    assert all(b == bodies[-1] for b in bodies)
    return bodies[-1]


def topology_constraints(numa_bind: bool = False) -> list[dict[str, Any]]:
    """The constraints of a multi-GPU request: N distinct GPUs, then one per topology level."""
    out: list[dict[str, Any]] = [{"requests": ["gpu"], "distinctAttribute": "gpu.tessera.dev/unit"}]
    if numa_bind:
        out.append({"requests": ["gpu"], "matchAttribute": "gpu.tessera.dev/numaNode"})
        return [
            *out,
            {"requests": ["gpu/nvlink"], "matchAttribute": "gpu.tessera.dev/nvlinkDomain"},
        ]
    return [
        *out,
        {"requests": ["gpu/nvlink"], "matchAttribute": "gpu.tessera.dev/nvlinkDomain"},
        {"requests": ["gpu/numa"], "matchAttribute": "gpu.tessera.dev/numaNode"},
    ]


def is_dns_label(s: str) -> bool:
    return len(s) <= 63 and bool(_LABEL.match(s))


def is_dns_subdomain(s: str) -> bool:
    return 0 < len(s) <= 253 and all(_LABEL.match(p) for p in s.split("."))


def cel_eval(expr: str, device: dict[str, Any]) -> bool:
    """Evaluate a selector in Tessera's device CEL environment (tessera.cel)."""
    view = DeviceView(
        device["driver"],
        {f"gpu.tessera.dev/{k}": v for k, v in device["attributes"]["gpu.tessera.dev"].items()},
        {
            f"gpu.tessera.dev/{k}": Quantity.parse(v)
            for k, v in device["capacity"]["gpu.tessera.dev"].items()
        },
        True,
    )
    return compile_selector(expr).evaluate(device_activation(view))


def device(**attrs: Any) -> dict[str, Any]:
    memory = attrs.pop("memory", H100_80GB)
    return {
        "driver": "gpu.tessera.dev",
        "attributes": {"gpu.tessera.dev": attrs},
        "capacity": {"gpu.tessera.dev": {"memory": memory, "cores": 100}},
    }


def assert_api_valid(conv: Conversion, original: dict[str, Any], *, stripped: bool = True) -> None:
    """Basic resource.k8s.io/v1 and core/v1 rules for everything convert_pod produced."""
    ns = (original.get("metadata") or {}).get("namespace")
    names = [t["metadata"]["name"] for t in conv.templates]
    assert len(names) == len(set(names))
    for t in conv.templates:
        assert t["apiVersion"] == "resource.k8s.io/v1"
        assert t["kind"] == "ResourceClaimTemplate"
        assert is_dns_subdomain(t["metadata"]["name"]), t["metadata"]["name"]
        assert t["metadata"].get("namespace") == ns
        devices = t["spec"]["spec"]["devices"]
        reqs = devices["requests"]
        assert 1 <= len(reqs) <= 32
        req_names = [r["name"] for r in reqs]
        assert len(req_names) == len(set(req_names)) and all(map(is_dns_label, req_names))
        refs = set(req_names)
        for r in reqs:
            assert ("exactly" in r) != ("firstAvailable" in r)
            if "exactly" in r:
                bodies = [r["exactly"]]
            else:
                bodies = r["firstAvailable"]
                assert 1 <= len(bodies) <= 8
                subs = [b["name"] for b in bodies]
                assert len(subs) == len(set(subs)) and all(map(is_dns_label, subs))
                refs.update(f"{r['name']}/{s}" for s in subs)
            for b in bodies:
                assert b["deviceClassName"] == "gpu.tessera.dev"
                assert b["allocationMode"] == "ExactCount"
                assert isinstance(b["count"], int) and 1 <= b["count"] <= 32
                sels = b.get("selectors", [])
                assert len(sels) <= 32
                for s in sels:
                    assert set(s) == {"cel"} and set(s["cel"]) == {"expression"}
                    expr = s["cel"]["expression"]
                    assert isinstance(expr, str) and 0 < len(expr) <= 10 * 1024
                    compile_selector(expr)  # raises on a syntax error
                caps = b["capacity"]["requests"]
                assert set(caps) <= {"memory", "cores"} and "cores" in caps
                for v in caps.values():
                    assert isinstance(v, str)
                    assert Quantity.parse(v).canonical() == v  # canonical, as the server stores
                cores = Quantity.parse(caps["cores"]).value
                assert cores.denominator == 1 and 0 <= cores <= 100
                if "memory" in caps:
                    mem = Quantity.parse(caps["memory"]).value
                    assert mem >= MiB and mem % MiB == 0
        constraints = devices.get("constraints", [])
        assert len(constraints) <= 32
        for c in constraints:
            kinds = {"matchAttribute", "distinctAttribute"} & set(c)
            assert len(kinds) == 1
            attr = c[kinds.pop()]
            assert attr.startswith("gpu.tessera.dev/") and attr.count("/") == 1
            assert set(c["requests"]) <= refs
    spec = conv.pod["spec"]
    rcs = spec.get("resourceClaims", [])
    rc_names = [rc["name"] for rc in rcs]
    assert len(rc_names) == len(set(rc_names)) and all(map(is_dns_label, rc_names))
    generated = {rc["resourceClaimTemplateName"] for rc in rcs if "resourceClaimTemplateName" in rc}
    assert set(names) <= generated
    for c in spec.get("initContainers", []) + spec["containers"]:
        res = c.get("resources", {})
        for part in ("limits", "requests"):
            assert not (stripped and set(res.get(part, {})) & HAMI_RESOURCES), c["name"]
        for cl in res.get("claims", []):
            assert cl["name"] in rc_names
    assert len(conv.requests) == len(conv.templates)
    for req, t in zip(conv.requests, conv.templates, strict=True):
        assert req.template_name == t["metadata"]["name"]
        assert {"name": req.claim_name, "resourceClaimTemplateName": req.template_name} in rcs


def convert(p: dict[str, Any], *, stripped: bool = True, **kw: Any) -> Conversion:
    """convert_pod + immutability + API-rule checks."""
    before = copy.deepcopy(p)
    conv = convert_pod(p, **kw)
    assert p == before, "input pod was mutated"
    assert conv.pod is not p
    assert_api_valid(conv, p, stripped=stripped)
    return conv


def test_writing_to_the_converted_pod_never_reaches_the_input() -> None:
    """convert_pod copies only what it writes (no deep copy per pod): whatever it or a caller
    (simulate's metadata/spec/status, the webhook's template renames) writes in the result
    leaves the input as it was: containers, resources, claims, resourceClaims entries."""
    p = pod(
        {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000},
        requests={"cpu": "1"},
        annotations={"a": "b"},
    )
    p["spec"]["initContainers"] = [
        {
            "name": "i",
            "image": "x",
            "resources": {"limits": {"nvidia.com/gpumem": 1000}, "claims": [{"name": "other"}]},
        }
    ]
    p["spec"]["resourceClaims"] = [{"name": "other", "resourceClaimName": "shared"}]
    before = copy.deepcopy(p)
    conv = convert(p, memory_sizes=[H100_80GB])
    out = conv.pod
    out["metadata"]["uid"] = "u"
    out["spec"]["nodeName"] = "n"
    out["status"] = {"phase": "Pending"}
    for key in ("initContainers", "containers"):
        for c in out["spec"][key]:
            c["resources"].setdefault("limits", {})["x"] = "1"
            c["resources"].setdefault("requests", {})["y"] = "1"
            c["resources"]["claims"].append({"name": "z"})
    out["spec"]["resourceClaims"].append({"name": "z"})
    assert [rc["name"] for rc in out["spec"]["resourceClaims"]] == ["other", "i-gpu", "c-gpu", "z"]
    assert p == before


# ---- HAMi's normalisation (hami.md 1.3 worked examples) ----------------------------------------
def test_bare_gpu_books_whole_memory_and_all_cores() -> None:
    conv = convert(pod({"nvidia.com/gpu": 1}))
    assert exactly(conv) == {
        "deviceClassName": "gpu.tessera.dev",
        "allocationMode": "ExactCount",
        "count": 1,
        "capacity": {"requests": {"cores": "100"}},  # no memory: the default books it all
    }
    assert conv.requests[0] == ContainerRequest(
        container="c",
        gpus=1,
        memory_mib=None,
        memory_percentage=100,
        cores=100,
        claim_name="c-gpu",
        template_name="p-c-gpu",
    )
    assert conv.requests[0].whole_memory
    assert conv.warnings == []


def test_gpumem_without_cores_is_shareable() -> None:
    conv = convert(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}))
    assert exactly(conv)["capacity"] == {"requests": {"memory": "3000Mi", "cores": "0"}}
    assert "constraints" not in conv.templates[0]["spec"]["spec"]["devices"]


def test_gpumem_alone_implies_one_gpu() -> None:
    conv = convert(pod({"nvidia.com/gpumem": 3000}))
    assert exactly(conv)["count"] == 1
    assert exactly(conv)["capacity"] == {"requests": {"memory": "3000Mi", "cores": "0"}}


@pytest.mark.parametrize(
    ("limits", "count", "caps"),
    [
        ({"nvidia.com/gpucores": 20}, 1, {"cores": "20"}),
        ({"nvidia.com/gpumem-percentage": 100}, 1, {"cores": "100"}),
    ],
)
def test_cores_or_percentage_alone_imply_one_gpu(
    limits: dict[str, Any], count: int, caps: dict[str, str]
) -> None:
    conv = convert(pod(limits))
    assert exactly(conv)["count"] == count
    assert exactly(conv)["capacity"] == {"requests": caps}


def test_two_gpus_get_distinct_uuid_constraint() -> None:
    conv = convert(pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}))
    devices = conv.templates[0]["spec"]["spec"]["devices"]
    assert devices["constraints"] == topology_constraints()
    assert exactly(conv)["count"] == 2
    assert exactly(conv)["capacity"] == {"requests": {"memory": "3000Mi", "cores": "30"}}


def test_gpumem_beats_percentage_with_warning() -> None:
    conv = convert(
        pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpumem-percentage": 50})
    )
    assert exactly(conv)["capacity"] == {"requests": {"memory": "3000Mi", "cores": "0"}}
    assert conv.requests[0].memory_mib == 3000 and conv.requests[0].memory_percentage is None
    assert conv.warnings == [
        "pod ns/p, container c: both nvidia.com/gpumem and nvidia.com/gpumem-percentage are "
        "set; nvidia.com/gpumem wins (as in HAMi)"
    ]


def test_percentage_100_with_gpumem_keeps_hami_exclusive_default() -> None:
    # HAMi's webhook checks percentage == 100 before gpumem wins: cores become 100.
    conv = convert(pod({"nvidia.com/gpumem": 2048, "nvidia.com/gpumem-percentage": 100}))
    assert exactly(conv)["capacity"] == {"requests": {"memory": "2Gi", "cores": "100"}}


def test_percentage_100_with_cores_books_whole_memory_and_given_cores() -> None:
    conv = convert(
        pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100, "nvidia.com/gpucores": 30})
    )
    assert exactly(conv)["capacity"] == {"requests": {"cores": "30"}}


def test_explicit_zero_cores_with_bare_gpu() -> None:
    conv = convert(pod({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 0}))
    assert exactly(conv)["capacity"] == {"requests": {"cores": "0"}}


def test_limits_win_over_requests_and_requests_are_a_fallback() -> None:
    conv = convert(
        pod(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000},
            requests={"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 25},
        )
    )
    assert exactly(conv)["capacity"] == {"requests": {"memory": "2000Mi", "cores": "25"}}
    assert conv.warnings == [
        "pod ns/p, container c: nvidia.com/gpumem differs between limits (2000) and requests "
        "(1000); the limit is used (as HAMi does)"
    ]
    assert conv.pod["spec"]["containers"][0]["resources"] == {"claims": [{"name": "c-gpu"}]}


def test_quoted_strings_and_canonical_memory() -> None:
    conv = convert(
        pod({"nvidia.com/gpu": "2", "nvidia.com/gpumem": " 1024 ", "nvidia.com/gpucores": "30"})
    )
    assert exactly(conv)["count"] == 2
    assert exactly(conv)["capacity"] == {"requests": {"memory": "1Gi", "cores": "30"}}


def test_other_resources_stay_and_claims_are_appended() -> None:
    p = pod({"nvidia.com/gpu": 1, "cpu": "2"}, requests={"cpu": "1", "nvidia.com/gpu": 1})
    p["spec"]["containers"][0]["resources"]["claims"] = [{"name": "other"}]
    p["spec"]["resourceClaims"] = [{"name": "other", "resourceClaimName": "shared"}]
    conv = convert(p)
    assert conv.pod["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "2"},
        "requests": {"cpu": "1"},
        "claims": [{"name": "other"}, {"name": "c-gpu"}],
    }
    assert conv.pod["spec"]["resourceClaims"] == [
        {"name": "other", "resourceClaimName": "shared"},
        {"name": "c-gpu", "resourceClaimTemplateName": "p-c-gpu"},
    ]


def test_priority_is_stripped_and_recorded() -> None:
    conv = convert(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 100, "nvidia.com/priority": 0}))
    assert conv.requests[0].priority == 0
    assert conv.templates[0]["metadata"]["annotations"] == {
        "gpu.tessera.dev/hami-request": "nvidia.com/gpu=1,nvidia.com/gpumem=100,"
        "nvidia.com/gpucores=0,nvidia.com/priority=0",
        "gpu.tessera.dev/container": "c",
    }
    assert "limits" not in conv.pod["spec"]["containers"][0]["resources"]


def test_priority_alone_is_removed_with_a_warning() -> None:
    conv = convert(pod({"nvidia.com/priority": 1}))
    assert conv.templates == []
    assert conv.pod["spec"]["containers"][0]["resources"] == {}
    assert conv.warnings == [
        "pod ns/p, container c: nvidia.com/priority without a GPU request has no effect; removed"
    ]


def test_gpu_zero_alone_is_removed() -> None:
    conv = convert(pod({"nvidia.com/gpu": 0}))
    assert conv.templates == [] and conv.requests == []
    assert conv.pod["spec"]["containers"][0]["resources"] == {}
    assert conv.warnings == ["pod ns/p, container c: nvidia.com/gpu 0 asks for no GPU; removed"]


def test_init_containers_are_converted_first() -> None:
    p = pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 500}, container="main")
    p["spec"]["initContainers"] = [
        {"name": "warm", "image": "x", "resources": {"limits": {"nvidia.com/gpumem": 700}}},
        {"name": "plain", "image": "x"},
    ]
    conv = convert(p)
    assert [(r.container, r.init, r.memory_mib) for r in conv.requests] == [
        ("warm", True, 700),
        ("main", False, 500),
    ]
    assert conv.pod["spec"]["initContainers"][0]["resources"] == {"claims": [{"name": "warm-gpu"}]}
    assert conv.pod["spec"]["initContainers"][1] == {"name": "plain", "image": "x"}


def test_no_hami_resources_leaves_pod_unchanged() -> None:
    p = pod({"cpu": "1"})
    conv = convert(p)
    assert conv.pod == p and conv.templates == [] and conv.requests == [] and conv.warnings == []
    assert not conv.converted


def test_volcano_names_map_like_nvidia() -> None:
    conv = convert(
        pod(
            {
                "volcano.sh/vgpu-number": 1,
                "volcano.sh/vgpu-memory": 1024,
                "volcano.sh/vgpu-cores": 50,
            }
        )
    )
    assert exactly(conv)["capacity"] == {"requests": {"memory": "1Gi", "cores": "50"}}
    assert conv.requests[0].family == "volcano"
    assert conv.requests[0].hami_view() == (
        "volcano.sh/vgpu-number=1,volcano.sh/vgpu-memory=1024,volcano.sh/vgpu-cores=50"
    )


# ---- percentages need the cluster's memory sizes -------------------------------------------------
def test_percentage_becomes_first_available_per_memory_size() -> None:
    conv = convert(
        pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25}),
        memory_sizes=[V100S_32GB, H100_80GB, V100S_32GB],
    )
    req = claim_request(conv)
    assert req == {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "mem-0",
                "deviceClassName": "gpu.tessera.dev",
                "allocationMode": "ExactCount",
                "count": 1,
                "selectors": [
                    {
                        "cel": {
                            "expression": 'has(device.capacity["gpu.tessera.dev"].memory) && '
                            'device.capacity["gpu.tessera.dev"].memory == quantity("81559Mi")'
                        }
                    }
                ],
                # 81559 MiB x 25 % = 20389.75 MiB -> 20389 MiB
                "capacity": {"requests": {"memory": "20389Mi", "cores": "0"}},
            },
            {
                "name": "mem-1",
                "deviceClassName": "gpu.tessera.dev",
                "allocationMode": "ExactCount",
                "count": 1,
                "selectors": [
                    {
                        "cel": {
                            "expression": 'has(device.capacity["gpu.tessera.dev"].memory) && '
                            'device.capacity["gpu.tessera.dev"].memory == quantity("32510Mi")'
                        }
                    }
                ],
                # 32510 MiB x 25 % = 8127.5 MiB -> 8127 MiB
                "capacity": {"requests": {"memory": "8127Mi", "cores": "0"}},
            },
        ],
    }
    sub0 = req["firstAvailable"][0]["selectors"][0]["cel"]["expression"]
    assert cel_eval(sub0, device(memory=H100_80GB))
    assert not cel_eval(sub0, device(memory=V100S_32GB))


def test_percentage_rounds_down_to_whole_mib_of_odd_byte_sizes() -> None:
    size = 24 * GiB + 12345  # not a whole MiB
    conv = convert(pod({"nvidia.com/gpumem-percentage": 33}), memory_sizes=[size])
    sub = claim_request(conv)["firstAvailable"][0]
    assert sub["capacity"]["requests"]["memory"] == f"{(size * 33 // 100) // MiB}Mi" == "8110Mi"
    assert sub["selectors"][0]["cel"]["expression"].endswith(f'quantity("{size}")')


def test_more_than_eight_sizes_keeps_the_eight_largest() -> None:
    sizes = [(8 + i) * GiB for i in range(10)]
    conv = convert(pod({"nvidia.com/gpumem-percentage": 50}), memory_sizes=sizes)
    subs = claim_request(conv)["firstAvailable"]
    assert [s["capacity"]["requests"]["memory"] for s in subs] == [
        "8704Mi",
        "8Gi",
        "7680Mi",
        "7Gi",
        "6656Mi",
        "6Gi",
        "5632Mi",
        "5Gi",
    ]
    assert conv.warnings == [
        "pod ns/p, container c: only the 8 largest GPU memory sizes are candidates "
        "(firstAvailable holds 8); not tried: 9Gi, 8Gi"
    ]


def test_percentage_without_memory_sizes_is_an_error() -> None:
    with pytest.raises(ConversionError) as e:
        convert_pod(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}))
    assert str(e.value) == (
        "pod ns/p, container c: nvidia.com/gpumem-percentage 50 needs the cluster's GPU memory "
        "sizes to become a byte request: give the cluster's nodes (`tessera convert --cluster "
        "FILE` or --node NAME=INVENTORY), or write nvidia.com/gpumem in MiB instead"
    )
    assert (e.value.pod, e.value.container, e.value.field) == (
        "ns/p",
        "c",
        "nvidia.com/gpumem-percentage",
    )


def test_percentage_100_needs_no_memory_sizes() -> None:
    conv = convert(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100}))
    assert exactly(conv)["capacity"] == {"requests": {"cores": "100"}}


# ---- HAMi faults that are NOT reproduced -------------------------------------------------------
def test_percentage_zero_never_books_zero_bytes() -> None:
    conv = convert(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 0}))
    assert exactly(conv)["capacity"] == {"requests": {"cores": "100"}}
    assert conv.requests[0].memory_percentage == 100
    assert conv.warnings == [
        "pod ns/p, container c: nvidia.com/gpumem-percentage 0 is treated as unset: the claim "
        "books each GPU's whole memory (never 0 bytes)"
    ]


def test_gpumem_zero_books_whole_memory() -> None:
    conv = convert(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": "0", "nvidia.com/gpucores": 10}))
    assert exactly(conv)["capacity"] == {"requests": {"cores": "10"}}
    assert len(conv.warnings) == 1 and "nvidia.com/gpumem 0 is treated as unset" in conv.warnings[0]


def test_gpumem_annotations_are_reported_not_silently_ignored() -> None:
    conv = convert(
        pod(
            {"nvidia.com/gpu": 1},
            annotations={"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"},
        )
    )
    # The annotations do not change the claim (as in HAMi) ...
    assert exactly(conv)["capacity"] == {"requests": {"cores": "100"}}
    # ... but each one is named in a warning.
    assert conv.warnings == [
        "pod ns/p: annotation nvidia.com/gpucores is ignored (HAMi ignores it too): "
        "nvidia.com/gpucores is a container resource; move it to the container's resources.limits",
        "pod ns/p: annotation nvidia.com/gpumem is ignored (HAMi ignores it too): "
        "nvidia.com/gpumem is a container resource; move it to the container's resources.limits",
    ]


def test_gpumem_annotation_without_resources_still_warns() -> None:
    conv = convert(pod({"cpu": 1}, annotations={"nvidia.com/gpumem": "3000"}))
    assert conv.templates == []
    assert len(conv.warnings) == 1 and "annotation nvidia.com/gpumem is ignored" in conv.warnings[0]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("1Gi", "nvidia.com/gpumem is in MiB: write 1024, not 1Gi"),
        ("3000Mi", "nvidia.com/gpumem is in MiB: write 3000, not 3000Mi"),
        ("1Ki", "nvidia.com/gpumem is in MiB: write a number such as 1024, not 1Ki"),
    ],
)
def test_gpumem_with_units_is_refused(raw: str, message: str) -> None:
    with pytest.raises(ConversionError) as e:
        convert_pod(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": raw}))
    assert str(e.value) == (
        f"pod ns/p, container c: {message} (HAMi would read the suffixed quantity as that many MiB)"
    )


@pytest.mark.parametrize(
    ("raw", "mib"), [("3k", 3000), ("2e3", 2000), ("40k", 40000), ("1024", 1024)]
)
def test_gpumem_in_canonical_decimal_notation_is_that_many_mib(raw: str, mib: int) -> None:
    """The API server stores ``nvidia.com/gpumem: 3000`` as the canonical Quantity ``3k``:
    that is what the webhook receives, and it means 3000 MiB (HAMi reads Value() too)."""
    conv = convert(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": raw}))
    assert conv.requests[0].memory_mib == mib
    assert (
        exactly(conv)["capacity"]["requests"]["memory"]
        == Quantity.from_int(mib * MiB, "BinarySI").canonical()
    )


# ---- invalid values: one error per kind ----------------------------------------------------------
@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            {"nvidia.com/gpumem": -5},
            "nvidia.com/gpumem -5 is negative; write a whole number of MiB such as 3000",
        ),
        (
            {"nvidia.com/gpu": "-1"},
            "nvidia.com/gpu '-1' is negative; write a whole number of physical GPUs such as 1",
        ),
        (
            {"nvidia.com/gpu": "1.5"},
            "nvidia.com/gpu '1.5' is fractional; write a whole number of physical GPUs such as 1",
        ),
        (
            {"nvidia.com/gpucores": 12.5},
            "nvidia.com/gpucores 12.5 is fractional; write a whole percentage 0-100 such as 30",
        ),
        (
            {"nvidia.com/gpu": "500m"},
            "nvidia.com/gpu '500m' is fractional; write a whole number of physical GPUs such as 1",
        ),
        (
            {"nvidia.com/gpumem": "lots"},
            "nvidia.com/gpumem 'lots' is not a number; write a whole number of MiB such as 3000",
        ),
        (
            {"nvidia.com/gpu": True},
            "nvidia.com/gpu True is not a number; write a whole number of physical GPUs such as 1",
        ),
        (
            {"nvidia.com/gpucores": "1Ki"},
            "nvidia.com/gpucores '1Ki' has a unit suffix or exponent; write a whole percentage "
            "0-100 such as 30",
        ),
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpucores": "1k"},
            "nvidia.com/gpucores 1000 is over 100: it is a percentage 0-100 of each GPU's "
            "compute (HAMi clamps it silently); write 100 or less",
        ),
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150},
            "nvidia.com/gpucores 150 is over 100: it is a percentage 0-100 of each GPU's "
            "compute (HAMi clamps it silently); write 100 or less",
        ),
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 120},
            "nvidia.com/gpumem-percentage 120 is over 100: it is a percentage 1-100 of each "
            "GPU's memory; write 100 or less",
        ),
        (
            {"nvidia.com/gpu": 0, "nvidia.com/gpumem": 1000},
            "nvidia.com/gpu is 0 but nvidia.com/gpumem is set; ask nvidia.com/gpu: 1 or more, "
            "or remove nvidia.com/gpumem",
        ),
        (
            {"nvidia.com/gpu": 33},
            "nvidia.com/gpu 33 is over 32: a ResourceClaim allocates at most 32 devices; ask for "
            "32 or fewer",
        ),
        (
            {"nvidia.com/gpumem": 2**31},
            "nvidia.com/gpumem 2147483648 is out of range: at most 2147483647 MiB per GPU",
        ),
        (
            {"nvidia.com/gpu": 1, "volcano.sh/vgpu-memory": 100},
            "asks for both nvidia.com/* and volcano.sh/vgpu-* GPU resources; use one spelling",
        ),
        (
            {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 101},
            "volcano.sh/vgpu-cores 101 is over 100: it is a percentage 0-100 of each GPU's "
            "compute (HAMi clamps it silently); write 100 or less",
        ),
    ],
)
def test_invalid_values(limits: dict[str, Any], message: str) -> None:
    with pytest.raises(ConversionError) as e:
        convert_pod(pod(limits))
    assert str(e.value) == f"pod ns/p, container c: {message}"
    assert "\n" not in str(e.value)
    assert isinstance(e.value, ValueError)


def test_accepted_boundaries() -> None:
    # The largest values accepted, one below the refused ones above: 32 GPUs of 2^31-1 MiB each,
    # in every topology alternative.
    conv = convert(pod({"nvidia.com/gpu": 32, "nvidia.com/gpumem": 2**31 - 1}))
    devs = conv.templates[0]["spec"]["spec"]["devices"]
    assert [
        (s["name"], s["count"], s["capacity"]) for s in devs["requests"][0]["firstAvailable"]
    ] == [
        (name, 32, {"requests": {"memory": "2147483647Mi", "cores": "0"}})
        for name in ("nvlink", "numa", "any")
    ]
    assert devs["constraints"][0] == {
        "requests": ["gpu"],
        "distinctAttribute": "gpu.tessera.dev/unit",
    }
    assert (conv.requests[0].gpus, conv.requests[0].memory_mib) == (32, 2**31 - 1)


def test_invalid_value_in_requests_is_caught_too() -> None:
    with pytest.raises(ConversionError, match=r"nvidia.com/gpumem 'x' is not a number"):
        convert_pod(pod({"nvidia.com/gpu": 1}, requests={"nvidia.com/gpumem": "x"}))


def test_error_names_source_and_workload() -> None:
    p = pod({"nvidia.com/gpucores": 200})
    del p["metadata"]["name"]
    p["metadata"]["generateName"] = "web-7d9f8-"
    with pytest.raises(ConversionError) as e:
        convert_pod(p, source="deploy.yaml")
    assert str(e.value).startswith("deploy.yaml: pod ns/web-7d9f8-*, container c: ")


def test_privileged_container_is_refused() -> None:
    p = pod({"nvidia.com/gpu": 1})
    p["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ConversionError, match=r"container c: a privileged container sees every"):
        convert_pod(p)


def test_preset_node_name_is_refused() -> None:
    p = pod({"nvidia.com/gpu": 1})
    p["spec"]["nodeName"] = "n1"
    with pytest.raises(ConversionError) as e:
        convert_pod(p)
    assert str(e.value) == (
        "pod ns/p: spec.nodeName is preset, so the scheduler never allocates the GPU claims "
        "(HAMi denies it too); use a nodeSelector instead"
    )


def test_workload_instead_of_pod_is_refused() -> None:
    with pytest.raises(
        ConversionError, match=r"kind Deployment is not a Pod; pass its pod template"
    ):
        convert_pod({"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {}}})


@pytest.mark.parametrize("sizes", [[0], [-1], [True], [1.5e9], ["80Gi"]])
def test_bad_memory_sizes_are_refused(sizes: list[Any]) -> None:
    with pytest.raises(ConversionError, match=r"memory_sizes must be GPU memory sizes in bytes"):
        convert_pod(pod({"nvidia.com/gpu": 1}), memory_sizes=sizes)


def test_malformed_limits_are_refused() -> None:
    p = pod({"nvidia.com/gpu": 1})
    p["spec"]["containers"][0]["resources"]["requests"] = ["nvidia.com/gpu"]
    with pytest.raises(ConversionError) as e:
        convert_pod(p)
    assert str(e.value) == "pod ns/p, container c: resources.requests must be a map"


def test_claim_name_collision_is_refused() -> None:
    p = pod({"nvidia.com/gpu": 1})
    p["spec"]["resourceClaims"] = [{"name": "c-gpu", "resourceClaimName": "mine"}]
    with pytest.raises(ConversionError, match=r"already has a resource claim named c-gpu"):
        convert_pod(p)


# ---- annotations -> selectors and constraints --------------------------------------------------
def selectors_of(conv: Conversion) -> list[str]:
    return [s["cel"]["expression"] for s in exactly(conv).get("selectors", [])]


def test_use_uuid_list_is_trimmed_and_matches_exactly() -> None:
    conv = convert(
        pod({"nvidia.com/gpu": 1}, annotations={"nvidia.com/use-gpuuuid": " GPU-a , ,GPU-b,GPU-a"})
    )
    items = '["GPU-a", "GPU-b"]'
    assert selectors_of(conv) == [
        f"(has({ATTRS}.uuid) && {ATTRS}.uuid in {items}) || "
        f"(has({ATTRS}.parentUUID) && {ATTRS}.parentUUID in {items})"
    ]
    assert cel_eval(selectors_of(conv)[0], device(uuid="GPU-b"))
    assert not cel_eval(selectors_of(conv)[0], device(uuid="GPU-c"))
    # HAMi compares the physical GPU's UUID in MIG mode too: a MIG device of GPU-a matches.
    assert cel_eval(selectors_of(conv)[0], device(type="mig", parentUUID="GPU-a"))
    assert not cel_eval(selectors_of(conv)[0], device(type="mig", parentUUID="GPU-c"))


def test_nouse_uuid_excludes() -> None:
    conv = convert(pod({"nvidia.com/gpu": 1}, annotations={"nvidia.com/nouse-gpuuuid": "GPU-a"}))
    assert selectors_of(conv) == [
        f'!((has({ATTRS}.uuid) && {ATTRS}.uuid in ["GPU-a"]) || '
        f'(has({ATTRS}.parentUUID) && {ATTRS}.parentUUID in ["GPU-a"]))'
    ]
    assert not cel_eval(selectors_of(conv)[0], device(uuid="GPU-a"))
    assert cel_eval(selectors_of(conv)[0], device(uuid="GPU-b"))
    assert not cel_eval(selectors_of(conv)[0], device(type="mig", parentUUID="GPU-a"))


def test_volcano_uuid_annotations_convert_as_hamis_deny_wins() -> None:
    # Issue 22 item 5: Volcano's own spellings (comma lists, spaces around entries); a UUID in
    # both lists is denied (volcano's gpuUUIDFilter: the allow list, then not the deny list).
    conv = convert(
        pod(
            {"volcano.sh/vgpu-number": 1},
            annotations={
                "volcano.sh/vgpu-use-gpuuuid": " GPU-a , GPU-b ,",
                "volcano.sh/vgpu-nouse-gpuuuid": "GPU-b",
            },
        )
    )
    assert conv.warnings == []
    sels = selectors_of(conv)
    assert len(sels) == 2
    both = f"({sels[0]}) && ({sels[1]})"
    assert cel_eval(both, device(uuid="GPU-a"))
    assert not cel_eval(both, device(uuid="GPU-b"))  # deny wins
    assert not cel_eval(both, device(uuid="GPU-c"))
    assert cel_eval(both, device(type="mig", parentUUID="GPU-a"))
    # the same selectors HAMi's spelling gives
    hami = convert(
        pod(
            {"nvidia.com/gpu": 1},
            annotations={
                "nvidia.com/use-gpuuuid": "GPU-a,GPU-b",
                "nvidia.com/nouse-gpuuuid": "GPU-b",
            },
        )
    )
    assert selectors_of(hami) == sels


@pytest.mark.parametrize(
    ("key", "warning"),
    [
        (
            "nvidia.com/use-gpuuid",
            "annotation nvidia.com/use-gpuuid is not one Tessera reads (did you mean "
            "nvidia.com/use-gpuuuid?); ignored",
        ),
        (
            "volcano.sh/vgpu-use-gputype",
            "annotation volcano.sh/vgpu-use-gputype is not one Tessera reads (did you mean "
            "volcano.sh/vgpu-use-gpuuuid?); ignored",
        ),
        (
            "volcano.sh/vgpu-podgroup-policy",
            "annotation volcano.sh/vgpu-podgroup-policy is not converted: Tessera does not keep "
            "the pods of one PodGroup on distinct GPUs; ignored",
        ),
        (
            "hami.io/use-xpu-uuid",
            "annotation hami.io/use-xpu-uuid selects another vendor's devices (HAMi's XPU); ignored",
        ),
    ],
)
def test_selection_annotations_tessera_does_not_read_are_warned(key: str, warning: str) -> None:
    conv = convert(pod({"nvidia.com/gpu": 1}, annotations={key: "spread"}))
    assert conv.warnings == [f"pod ns/p: {warning}"]
    assert selectors_of(conv) == []


def test_scheduler_records_are_not_warned_about() -> None:
    records = {"hami.io/vgpu-node": "n1", "volcano.sh/vgpu-ids-new": "GPU-a,NVIDIA,3000,0:"}
    assert convert(pod({"nvidia.com/gpu": 1}, annotations=records)).warnings == []


def test_empty_uuid_annotation_is_no_constraint() -> None:
    conv = convert(pod({"nvidia.com/gpu": 1}, annotations={"nvidia.com/use-gpuuuid": " , "}))
    assert selectors_of(conv) == []
    assert conv.warnings == [
        "pod ns/p: annotation nvidia.com/use-gpuuuid is empty: no constraint applied"
    ]


@pytest.mark.parametrize(
    ("product", "use", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100", True),
        ("NVIDIA A100-SXM4-80GB", "A10", True),  # HAMi: substring, so A10 matches A100
        ("NVIDIA A10", "A100", False),
        ("Tesla V100S-PCIE-32GB", "A100,V100", True),
        ("NVIDIA RTX A5000", "A100,V100", False),
        ("Tesla V100S-PCIE-32GB", "NVIDIA-Tesla V100S", True),  # HAMi's "NVIDIA-<name>" type
        ("NVIDIA H100 80GB HBM3", "h100 80gb", True),
    ],
)
def test_use_gputype_is_case_insensitive_substring(product: str, use: str, expected: bool) -> None:
    conv = convert(pod({"nvidia.com/gpu": 1}, annotations={"nvidia.com/use-gputype": use}))
    (expr,) = selectors_of(conv)
    assert cel_eval(expr, device(productName=product)) is expected


@pytest.mark.parametrize(
    ("product", "expected"),
    [
        ("NVIDIA GeForce GTX 1080 Ti", False),
        ("NVIDIA GeForce RTX 2080", False),
        ("NVIDIA GeForce RTX 4090", True),
    ],
)
def test_nouse_gputype_excludes_every_listed_substring(product: str, expected: bool) -> None:
    conv = convert(
        pod({"nvidia.com/gpu": 1}, annotations={"nvidia.com/nouse-gputype": "1080,2080"})
    )
    (expr,) = selectors_of(conv)
    assert expr == (
        f'!has({ATTRS}.productName) || (!{ATTRS}.productName.lowerAscii().contains("1080") && '
        f'!{ATTRS}.productName.lowerAscii().contains("2080"))'
    )
    assert cel_eval(expr, device(productName=product)) is expected


def test_cel_literals_are_escaped() -> None:
    nasty = 'GPU-"x\\" || true || "\n\t\x01'
    conv = convert(pod({"nvidia.com/gpu": 1}, annotations={"nvidia.com/use-gpuuuid": nasty}))
    (expr,) = selectors_of(conv)
    literal = '["GPU-\\"x\\\\\\" || true || \\"\\n\\t\\u0001"]'
    assert (
        expr
        == f"(has({ATTRS}.uuid) && {ATTRS}.uuid in {literal}) || (has({ATTRS}.parentUUID) && {ATTRS}.parentUUID "
        f"in {literal})"
    )
    assert cel_eval(expr, device(uuid=nasty.strip()))
    assert not cel_eval(expr, device(uuid="GPU-other"))
    assert cel_string("é\x7f") == '"é\\u007f"'


def test_vgpu_mode_mig_selects_mig_devices() -> None:
    # A whole MIG device per GPU asked: an existing instance, or a profile placement of a
    # dynamic-MIG GPU; nothing is dropped, so nothing to warn about.
    conv = convert(pod({"nvidia.com/gpu": 1}, annotations={"nvidia.com/vgpu-mode": "mig"}))
    assert selectors_of(conv) == [f'has({ATTRS}.type) && {ATTRS}.type == "mig"']
    assert conv.warnings == []


def test_vgpu_mode_hami_core_selects_whole_gpus() -> None:
    conv = convert(pod({"nvidia.com/gpu": 1}, annotations={"nvidia.com/vgpu-mode": "hami-core"}))
    assert selectors_of(conv) == [f'has({ATTRS}.type) && {ATTRS}.type == "gpu"']


def test_vgpu_mode_mps_is_warned_and_ignored() -> None:
    conv = convert(pod({"nvidia.com/gpu": 1}, annotations={"volcano.sh/vgpu-mode": "mps"}))
    assert selectors_of(conv) == []
    assert conv.warnings == [
        "pod ns/p: annotation volcano.sh/vgpu-mode 'mps': mps is not supported by Tessera; "
        "mps is ignored"
    ]


def test_vgpu_mode_unknown_is_an_error() -> None:
    with pytest.raises(ConversionError) as e:
        convert_pod(pod({"nvidia.com/gpu": 1}, annotations={"nvidia.com/vgpu-mode": "fast"}))
    assert str(e.value) == (
        "pod ns/p: annotation nvidia.com/vgpu-mode 'fast' names no mode; write hami-core or mig"
    )


def test_numa_bind_with_several_gpus_matches_numa_node() -> None:
    conv = convert(pod({"nvidia.com/gpu": 2}, annotations={"nvidia.com/numa-bind": "true"}))
    assert conv.templates[0]["spec"]["spec"]["devices"]["constraints"] == topology_constraints(
        numa_bind=True
    )
    # the last level ("numa") has no constraint of its own: the whole request is NUMA-bound
    assert [s["name"] for s in claim_request(conv)["firstAvailable"]] == ["nvlink", "numa"]


@pytest.mark.parametrize(("gpus", "value"), [(1, "true"), (2, "false"), (2, "0")])
def test_numa_bind_without_effect(gpus: int, value: str) -> None:
    conv = convert(pod({"nvidia.com/gpu": gpus}, annotations={"nvidia.com/numa-bind": value}))
    constraints = conv.templates[0]["spec"]["spec"]["devices"].get("constraints", [])
    assert all(c.get("requests") != ["gpu"] or "matchAttribute" not in c for c in constraints)
    assert constraints == (topology_constraints() if gpus > 1 else [])


def test_numa_bind_not_boolean_is_an_error() -> None:
    with pytest.raises(ConversionError) as e:
        convert_pod(pod({"nvidia.com/gpu": 2}, annotations={"nvidia.com/numa-bind": "yes"}))
    assert str(e.value) == (
        'pod ns/p: annotation nvidia.com/numa-bind \'yes\' is not a boolean; write "true" or "false"'
    )


def test_bad_annotation_on_pod_without_gpu_is_only_a_warning() -> None:
    conv = convert(pod({"cpu": 1}, annotations={"nvidia.com/numa-bind": "yes"}))
    assert conv.templates == []
    assert conv.warnings == [
        "pod ns/p: annotation nvidia.com/numa-bind 'yes' is not a boolean; write \"true\" or "
        '"false" (ignored: no container asks for a GPU)'
    ]


def test_scheduler_policies_are_carried_through() -> None:
    ann = {
        "hami.io/node-scheduler-policy": "spread",
        "hami.io/gpu-scheduler-policy": "binpack,numa",
    }
    conv = convert(pod({"nvidia.com/gpu": 1}, annotations=ann))
    assert conv.node_scheduler_policy == "spread"
    assert conv.gpu_scheduler_policy == "binpack,numa"
    assert conv.pod["metadata"]["annotations"] == ann


def test_scoring_weights_are_reported_unsupported() -> None:
    conv = convert(
        pod(
            {"nvidia.com/gpu": 1},
            annotations={"hami.io/device-scoring-weights": "slot=1,core=1,memory=1"},
        )
    )
    assert conv.warnings == [
        "pod ns/p: annotation hami.io/device-scoring-weights is not supported by Tessera and is ignored"
    ]


def test_selector_annotations_without_gpu_warn() -> None:
    conv = convert(pod({"cpu": 1}, annotations={"nvidia.com/use-gputype": "A100"}))
    assert conv.templates == []
    assert conv.warnings == [
        "pod ns/p: HAMi annotations have no effect: no container asks for a GPU"
    ]


def test_webhook_ignore_label_leaves_pod_alone() -> None:
    p = pod({"nvidia.com/gpu": 1})
    p["metadata"]["labels"] = {"hami.io/webhook": "ignore"}
    conv = convert(p, stripped=False)
    assert conv.pod == p and conv.templates == []
    assert conv.warnings == [
        "pod ns/p: label hami.io/webhook=ignore: left unconverted, as HAMi would"
    ]


# ---- unsupported HAMi-ish resources are reported, never silent --------------------------------
@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("nvidia.com/mig-3g.20gb", " is a MIG-profile resource, not converted (left unchanged)"),
        ("volcano.sh/gpu-memory", " belongs to Volcano's gpu-share plugin, not converted"),
        ("nvidia.com/gpumem-percent", " is not a resource Tessera converts (left unchanged)"),
        (
            "cambricon.com/vmlu",
            " is a HAMi resource of a vendor without a DRA driver in Tessera's vendor table "
            "(left unchanged); converted are NVIDIA's, Ascend NPUs, Hygon DCUs",
        ),
        (
            "hygon.com/dcunum",
            ": the cluster has no DRA driver dra.hygon.com for Hygon DCUs (no DeviceClass "
            "dra.hygon.com); left unchanged (tessera convert: --vendor hygon says it is installed)",
        ),
    ],
)
def test_unsupported_resources_are_warned_and_kept(name: str, fragment: str) -> None:
    conv = convert(pod({name: 1, "nvidia.com/gpu": 1}))
    assert conv.pod["spec"]["containers"][0]["resources"]["limits"] == {name: 1}
    assert len(conv.templates) == 1
    assert len(conv.warnings) == 1
    assert conv.warnings[0].startswith(f"pod ns/p, container c: {name}{fragment}")


# ---- names ---------------------------------------------------------------------------------------
def test_names_from_generate_name_and_owner() -> None:
    p = pod({"nvidia.com/gpu": 1})
    del p["metadata"]["name"]
    p["metadata"]["generateName"] = "web-7d9f8-"
    assert convert(p).templates[0]["metadata"]["name"] == "web-7d9f8-c-gpu"
    del p["metadata"]["generateName"]
    p["metadata"]["ownerReferences"] = [
        {"kind": "Other", "name": "not-me"},
        {"kind": "Job", "name": "train", "controller": True},
    ]
    conv = convert(p)
    assert conv.templates[0]["metadata"]["name"] == "train-c-gpu"
    assert conv.warnings == []


def test_unnamed_pod_gets_content_hash_name() -> None:
    p = pod({"nvidia.com/gpu": 1})
    del p["metadata"]["name"]
    a, b = convert(p), convert(copy.deepcopy(p))
    name = a.templates[0]["metadata"]["name"]
    assert re.fullmatch(r"pod-[0-9a-f]{10}-c-gpu", name)
    assert b.templates[0]["metadata"]["name"] == name  # deterministic
    assert len(a.warnings) == 1 and "has no name, generateName or owner" in a.warnings[0]


def test_long_names_are_shortened_with_a_hash() -> None:
    long_pod = "a" * 240
    long_ctr = "b" * 63
    conv = convert(pod({"nvidia.com/gpu": 1}, name=long_pod, container=long_ctr))
    tname = conv.templates[0]["metadata"]["name"]
    claim = conv.requests[0].claim_name
    assert len(tname) == 253 and re.search(r"-[0-9a-f]{8}$", tname)
    assert len(claim) == 63 and re.search(r"-[0-9a-f]{8}$", claim)
    other = convert(pod({"nvidia.com/gpu": 1}, name=long_pod, container="b" * 62 + "c"))
    assert other.templates[0]["metadata"]["name"] != tname  # distinct inputs, distinct names


def test_invalid_characters_in_wrapped_names_are_cleaned() -> None:
    conv = convert(pod({"nvidia.com/gpu": 1}, name="My_Workload"))
    assert re.fullmatch(r"my-workload-c-gpu-[0-9a-f]{8}", conv.templates[0]["metadata"]["name"])


def test_template_is_namespaced_like_the_pod() -> None:
    assert (
        "namespace"
        not in convert(pod({"nvidia.com/gpu": 1}, namespace=None)).templates[0]["metadata"]
    )
    assert convert(pod({"nvidia.com/gpu": 1})).templates[0]["metadata"]["namespace"] == "ns"


# ---- the API-rule checker itself must be able to fail ----------------------------------------
@pytest.mark.parametrize(
    "breakage",
    [
        lambda t: t["metadata"].__setitem__("name", "Bad_Name"),
        lambda t: t["spec"]["spec"]["devices"]["requests"].extend([{"name": "x"}] * 32),
        lambda t: t["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][0].__setitem__(
            "selectors", [{"cel": {"expression": 42}}]
        ),
        lambda t: t["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"][1]["capacity"][
            "requests"
        ].__setitem__("memory", "1024Mi"),  # not canonical
        lambda t: t["spec"]["spec"]["devices"]["constraints"][1].__setitem__(
            "requests", ["gpu/nvlink-x"]
        ),  # names no subrequest
        lambda t: t["spec"]["spec"]["devices"]["constraints"][0].__setitem__(
            "distinctAttribute", "uuid"
        ),
    ],
)
def test_api_rule_checker_catches_violations(breakage: Any) -> None:
    p = pod({"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1024})
    conv = convert_pod(p)
    assert_api_valid(conv, p)
    breakage(conv.templates[0])
    with pytest.raises(AssertionError):
        assert_api_valid(conv, p)


def test_mig_allocations_with_a_number_of_5000_digits_is_a_warning() -> None:
    # json.loads refuses an integer over 4300 digits with a ValueError that is no JSONDecodeError.
    raw = '[{"containerIndex": ' + "1" * 5000 + ', "profile": "1g.10gb"}]'
    conv = convert(pod({"nvidia.com/gpu": 1}, annotations={"hami.io/vgpu-mig-allocations": raw}))
    assert conv.warnings == [
        "pod ns/p: annotation hami.io/vgpu-mig-allocations is not JSON (a number too long or "
        "nesting too deep); ignored"
    ]


# ---- HAMi's GPU_CORE_UTILIZATION_POLICY ------------------------------------------------------------
@pytest.mark.parametrize(
    ("env", "policy"),
    [
        (None, "work-conserving"),
        ("default", "work-conserving"),
        ("FORCE", None),
        ("disable", "work-conserving"),
    ],
)
def test_the_core_policy_maps_to_the_opaque_config(env: str | None, policy: str | None) -> None:
    p = pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30})
    if env is not None:
        p["spec"]["containers"][0]["env"] = [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": env}]
    conv = convert_pod(p)
    devices = conv.templates[0]["spec"]["spec"]["devices"]
    if policy is None:  # force: a hard cap, Tessera's default (strict): no config
        assert "config" not in devices
    else:
        [cfg] = devices["config"]
        assert cfg["requests"] == ["gpu"] and cfg["opaque"]["driver"] == "gpu.tessera.dev"
        assert cfg["opaque"]["parameters"]["policy"] == policy
    assert conv.requests[0].policy == (policy or "strict")
    assert any("disable" in w for w in conv.warnings) == (env == "disable")


def test_no_config_without_a_share_to_pace() -> None:
    conv = convert_pod(pod({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}))  # cores 0
    assert "config" not in conv.templates[0]["spec"]["spec"]["devices"]
