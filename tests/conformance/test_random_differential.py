"""Random scenarios, generated here (not in the repository), run through Tessera's allocator and
the upstream Go allocator (tools/kube's harness, Kubernetes v1.37.2): both must agree.

Each scenario has one node with a few pools of shareable and dedicated devices (consumable
capacity with and without request policies, attributes to select and constrain on), some
earlier allocations, and a few claims mixing counts, capacity requests, selectors,
firstAvailable and constraints. The only construct left out is distinctAttribute within one
request of count 3 or more, where Tessera deliberately differs (tests/conformance/README.md).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from tessera.kube.harness import run_scenario as run_upstream

from .test_conformance import normalize, run_scenario

pytestmark = pytest.mark.upstream

DRIVER = "gpu.example.com"
FEATURES = ["AdminAccess", "ConsumableCapacity", "DeviceBindingAndStatus", "DeviceTaints", "PartitionableDevices", "PrioritizedList"]
# 500 scenarios by default (about 20 s); TESSERA_RANDOM_SEEDS=START:STOP explores others.
_lo, _, _hi = os.environ.get("TESSERA_RANDOM_SEEDS", "0:500").partition(":")
SEEDS = range(int(_lo), int(_hi))


def _capacity(rng: random.Random, multi: bool) -> dict[str, Any]:
    mem = rng.choice([8, 16, 24])
    caps: dict[str, Any] = {"memory": {"value": f"{mem}Gi"}, "cores": {"value": "100"}}
    if multi:
        kind = rng.choice(["none", "range", "values", "tessera"])
        if kind == "range":
            caps["memory"]["requestPolicy"] = {"default": "4Gi", "validRange": {"min": "2Gi", "step": "2Gi", "max": f"{mem}Gi"}}
        elif kind == "values":
            caps["memory"]["requestPolicy"] = {"default": "4Gi", "validValues": ["4Gi", "8Gi"]}
        elif kind == "tessera":
            caps["memory"]["requestPolicy"] = {"default": f"{mem}Gi", "validRange": {"min": "1Mi", "step": "1Mi"}}
            caps["cores"]["requestPolicy"] = {"default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}
    return caps


def _request(rng: random.Random, name: str, sub: bool) -> dict[str, Any]:
    count = rng.choice([1, 1, 1, 2])
    body: dict[str, Any] = {"deviceClassName": "gpu", "count": count}
    sel = rng.choice(
        [
            None,
            f'device.attributes["{DRIVER}"].model == "a"',
            f'device.attributes["{DRIVER}"].numa == 1',
            f'device.capacity["{DRIVER}"].memory.compareTo(quantity("16Gi")) >= 0',
            f'device.attributes["{DRIVER}"].driverVersion.isGreaterThan(semver("1.1.0"))',
        ]
    )
    if sel:
        body["selectors"] = [{"cel": {"expression": sel}}]
    if rng.random() < 0.6:
        reqs = {"memory": rng.choice(["1Gi", "3Gi", "4Gi", "6Gi", "10Gi"])}
        if rng.random() < 0.5:
            reqs["cores"] = rng.choice(["10", "30", "50"])
        body["capacity"] = {"requests": reqs}
    if not sub and rng.random() < 0.15:
        body["adminAccess"] = True
    if rng.random() < 0.2:
        body["tolerations"] = [{"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}]
    return {"name": name, **body}


def scenario(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    slices = []
    n = 0
    for p in range(rng.choice([1, 2])):
        devices = []
        for _ in range(rng.randint(1, 4)):
            multi = rng.random() < 0.7
            d: dict[str, Any] = {
                "name": f"dev-{n}",
                "attributes": {
                    "uuid": {"string": f"uuid-{n}"},
                    "model": {"string": rng.choice(["a", "b"])},
                    "numa": {"int": rng.choice([0, 1])},
                    "driverVersion": {"version": rng.choice(["1.0.0", "1.2.0", "2.0.0"])},
                },
                "capacity": _capacity(rng, multi),
            }
            if multi:
                d["allowMultipleAllocations"] = True
            if rng.random() < 0.1:
                d["taints"] = [{"key": "maintenance", "value": "true", "effect": "NoSchedule"}]
            devices.append(d)
            n += 1
        slices.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"slice-{p}"},
                "spec": {
                    "driver": DRIVER,
                    "pool": {"name": f"pool-{p}", "generation": 1, "resourceSliceCount": 1},
                    "nodeName": "node-1",
                    "devices": devices,
                },
            }
        )
    all_devices = [(s["spec"]["pool"]["name"], d) for s in slices for d in s["spec"]["devices"]]
    allocated = []
    for i, (pool, d) in enumerate(rng.sample(all_devices, k=min(len(all_devices), rng.randint(0, 2)))):
        res: dict[str, Any] = {"request": "req", "driver": DRIVER, "pool": pool, "device": d["name"]}
        if d.get("allowMultipleAllocations"):
            res["shareID"] = f"00000000-0000-4000-8000-{i:012d}"
            res["consumedCapacity"] = {"memory": rng.choice(["2Gi", "4Gi", "8Gi"]), "cores": rng.choice(["0", "50"])}
        allocated.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"earlier-{i}", "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "req", "exactly": {"deviceClassName": "gpu"}}]}},
                "status": {"allocation": {"devices": {"results": [res]}}},
            }
        )
    claims = []
    for c in range(rng.randint(1, 3)):
        requests = []
        for r in range(rng.randint(1, 2)):
            if rng.random() < 0.25:
                requests.append(
                    {
                        "name": f"req-{r}",
                        "firstAvailable": [_request(rng, f"sub-{s}", sub=True) for s in range(rng.randint(1, 3))],
                    }
                )
            else:
                body = _request(rng, "x", sub=False)
                body.pop("name")
                requests.append({"name": f"req-{r}", "exactly": body})
        constraints = []
        if rng.random() < 0.3:
            constraints.append({"matchAttribute": f"{DRIVER}/numa"})
        if rng.random() < 0.3:
            constraints.append({"distinctAttribute": f"{DRIVER}/uuid"})
        spec: dict[str, Any] = {"devices": {"requests": requests}}
        if constraints:
            spec["devices"]["constraints"] = constraints
        claims.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"claim-{c}", "namespace": "default"},
                "spec": spec,
            }
        )
    return {
        "name": f"random-{seed}",
        "features": FEATURES,
        "node": {"name": "node-1", "labels": {}},
        "classes": [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "gpu"},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            }
        ],
        "slices": slices,
        "allocated": allocated,
        "claims": claims,
    }


@pytest.mark.parametrize("seed", SEEDS)
def test_random_scenario_agrees_with_upstream(seed: int) -> None:
    sc = scenario(seed)
    err, results = run_scenario(sc)
    up = run_upstream(sc, timeout=60)
    up_err = up.get("error") or ""
    assert bool(err) == bool(up_err), f"tessera error {err!r}, upstream error {up_err!r}"
    if err:
        return
    up_results = up.get("results") or [None] * len(results)
    assert [normalize(r) for r in results] == [normalize(r) for r in up_results]


def test_random_scenarios_exercise_both_outcomes() -> None:
    """The generator is not degenerate: some scenarios allocate, some do not."""
    outcomes = {run_scenario(scenario(s))[1][0] is None for s in SEEDS}
    assert outcomes == {True, False}
