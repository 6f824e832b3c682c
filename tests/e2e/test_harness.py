"""The upstream-allocator harness (tools/kube/cmd/allocator-harness) on small scenarios.

Needs the Go build (tools/kube/build.sh), hence the ``cluster`` marker."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.localcluster import build
from tessera.localcluster.harness import HarnessError, run_scenario

pytestmark = pytest.mark.cluster

DATA = Path(__file__).parent / "data"

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
ALL = [
    "ConsumableCapacity",
    "PartitionableDevices",
    "PrioritizedList",
    "AdminAccess",
    "DeviceTaints",
    "DeviceBindingAndStatus",
]
GPU_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.tessera.dev"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.tessera.dev"'}}]},
}


@pytest.fixture(scope="module", autouse=True)
def _built() -> None:
    try:
        build.ensure_built()
    except build.BuildError as e:
        pytest.fail(f"cannot build the allocator harness: {e}")


def gpu_slice(node: str, memory: str = "80Gi") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-slice"},
        "spec": {
            "driver": "gpu.tessera.dev",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": "gpu-0",
                    "allowMultipleAllocations": True,
                    "capacity": {
                        "memory": {
                            "value": memory,
                            "requestPolicy": {
                                "default": memory,
                                "validRange": {"min": "1Mi", "step": "1Mi"},
                            },
                        },
                        "cores": {
                            "value": "100",
                            "requestPolicy": {
                                "default": "0",
                                "validRange": {"min": "0", "max": "100", "step": "1"},
                            },
                        },
                    },
                }
            ],
        },
    }


def claim(name: str, memory: str, cores: str | None = None) -> dict[str, Any]:
    requests = {"memory": memory} | ({"cores": cores} if cores is not None else {})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.tessera.dev",
                            "capacity": {"requests": requests},
                        },
                    }
                ]
            }
        },
    }


def allocated(name: str, node: str, memory: str, cores: str) -> dict[str, Any]:
    c = claim(name, memory, cores)
    c["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": "gpu.tessera.dev",
                        "pool": node,
                        "device": "gpu-0",
                        "shareID": "11111111-2222-4333-8444-555555555555",
                        "consumedCapacity": {"memory": memory, "cores": cores},
                    }
                ]
            }
        }
    }
    return c


def base(**kw: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "name": "t",
        "features": ALL,
        "node": {"name": "node-1", "labels": {}},
        "classes": [GPU_CLASS],
        "slices": [gpu_slice("node-1")],
        "allocated": [],
        "claims": [],
    }
    s.update(kw)
    return s


def test_allocate_consumable_share() -> None:
    out = run_scenario(base(name="share", claims=[claim("a", "8Gi", "20"), claim("b", "10000Mi")]))
    assert out["name"] == "share" and out["error"] == ""
    a, b = out["results"]
    (ra,) = a["devices"]["results"]
    assert {k: v for k, v in ra.items() if k != "shareID"} == {
        "request": "gpu",
        "driver": "gpu.tessera.dev",
        "pool": "node-1",
        "device": "gpu-0",
        "consumedCapacity": {"memory": "8Gi", "cores": "20"},
    }
    assert UUID_RE.match(ra["shareID"])
    assert a["nodeSelector"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
        ]
    }
    # cores unrequested -> policy default 0.
    assert b["devices"]["results"][0]["consumedCapacity"] == {"memory": "10000Mi", "cores": "0"}
    assert b["devices"]["results"][0]["shareID"] != ra["shareID"]


def test_allocated_state_counts_existing_shares() -> None:
    # 80Gi GPU, 76Gi already consumed by another claim: 8Gi does not fit, 4Gi does.
    pre = [allocated("old", "node-1", "76Gi", "10")]
    assert run_scenario(base(allocated=pre, claims=[claim("a", "8Gi")]))["results"] == [None]
    out = run_scenario(base(allocated=pre, claims=[claim("a", "4Gi", "90")]))
    assert out["results"][0]["devices"]["results"][0]["consumedCapacity"] == {
        "memory": "4Gi",
        "cores": "90",
    }
    out = run_scenario(base(allocated=pre, claims=[claim("a", "4Gi", "91")]))
    assert out["results"] == [None]


def test_allocator_error_when_feature_off() -> None:
    # DeviceBindingAndStatus needs the incubating allocator, which rejects capacity
    # requests while ConsumableCapacity is off.
    out = run_scenario(base(features=["DeviceBindingAndStatus"], claims=[claim("a", "8Gi")]))
    assert out["results"] == [None]
    assert (
        out["error"]
        == "claim default/a, request gpu: has capacity requests, but the DRAConsumableCapacity feature is disabled"
    )


def test_stable_allocator_ignores_capacity_requests() -> None:
    # With only stable features, NewAllocator picks "stable", which knows nothing of
    # consumable capacity: the whole device is allocated, no shareID, no consumedCapacity.
    out = run_scenario(base(features=["PartitionableDevices"], claims=[claim("a", "8Gi")]))
    assert out["error"] == ""
    assert out["results"][0]["devices"] == {
        "results": [
            {"request": "gpu", "driver": "gpu.tessera.dev", "pool": "node-1", "device": "gpu-0"}
        ]
    }


def test_defaulting_can_be_disabled() -> None:
    # Without the API server's defaulting, allocationMode stays empty.
    out = run_scenario(base(claims=[claim("a", "8Gi")]), defaults=False)
    assert out["error"] == "claim default/a, request gpu: unsupported count mode "


def test_place_mode_first_fit_over_nodes() -> None:
    scenario = base(
        name="place",
        nodes=[{"name": "node-1"}, {"name": "node-2"}],
        slices=[gpu_slice("node-1"), gpu_slice("node-2", "40Gi")],
        claims=[
            claim("a", "50Gi"),
            claim("b", "30Gi"),
            claim("c", "30Gi"),
            claim("d", "20Gi"),
            claim("e", "50Gi"),
        ],
    )
    del scenario["node"]
    out = run_scenario(scenario, mode="place")
    assert out["error"] == ""
    assert [p["node"] for p in out["placements"]] == ["node-1", "node-1", "node-2", None, None]
    assert [p["nodesTried"] for p in out["placements"]] == [1, 1, 2, 2, 2]
    assert out["placed"] == 3
    assert [p["claim"] for p in out["placements"]] == [
        "default/a",
        "default/b",
        "default/c",
        "default/d",
        "default/e",
    ]
    assert out["results"][2]["devices"]["results"][0]["pool"] == "node-2"
    assert out["results"][3] is None
    assert all(p["seconds"] >= 0 for p in out["placements"]) and out["totalSeconds"] >= 0


def test_invalid_scenarios_name_the_field() -> None:
    with pytest.raises(
        HarnessError, match=r'features\[0\]: unknown allocator feature "DRAConsumableCapacity"'
    ):
        run_scenario(base(features=["DRAConsumableCapacity"]))
    bad = base(claims=[claim("a", "1Gi")])
    bad["claims"][0]["spec"]["devices"]["requests"][0]["exactly"]["capacty"] = {}
    with pytest.raises(HarnessError, match=r'claims\[0\]: json: unknown field "capacty"'):
        run_scenario(bad)
    pre = copy.deepcopy(base(allocated=[claim("x", "1Gi")]))
    with pytest.raises(
        HarnessError, match=r"allocated\[0\] \(claim default/x\): status.allocation is missing"
    ):
        run_scenario(pre)


def test_scenario_file_matches_its_expectation() -> None:
    path = DATA / "harness" / "range-policy.yaml"
    expect = yaml.safe_load(path.read_text())["expect"]["results"]
    out = run_scenario(path)
    assert out["name"] == "range-policy-rounding" and out["error"] == ""
    for result in out["results"]:
        for r in result["devices"]["results"]:
            assert UUID_RE.match(r["shareID"])
            r["shareID"] = "*"
    assert out["results"] == expect
    # A third claim of 3 would need 4 more: 2 + 4 + 4 > 8.
    scenario = yaml.safe_load(path.read_text())
    scenario["claims"].append(
        copy.deepcopy(scenario["claims"][1])
        | {"metadata": {"name": "claim-2", "namespace": "default"}}
    )
    assert run_scenario(scenario)["results"] == [None, None, None]
