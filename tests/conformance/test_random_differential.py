"""Random scenarios, generated here (not in the repository), run through Tessera's allocator and
the upstream Go allocator (tools/kube's harness, Kubernetes v1.37.2): both must give the same
error message or the same results in the same order (tests/conformance/compare.py).

A scenario has two nodes and one to three pools published for them in every way a slice can
target nodes (nodeName, a label selector, allNodes, perDeviceNodeSelection); shareable and
dedicated devices with and without request policies, scalar and list attributes (an empty list
now and then), shared counters, taints of every effect (on the device, or through a
DeviceTaintRule with any selector: Tessera merges the rules itself, upstream's allocator gets
the slices with them merged as kube-scheduler merges them), binding conditions; earlier
allocations (dedicated, shares, admin); now and then an invalid or incomplete pool; and one to
three claims of one to three requests: counts 1 to 4 or allocationMode All, firstAvailable,
capacity requests, selectors, admin access, tolerations that match or miss by any field,
matchAttribute / distinctAttribute over scalars and lists, class and claim configs. Feature
sets vary (upstream's stable, incubating and experimental variants all run).

500 seeds by default (about a minute); ``TESSERA_RANDOM_SEEDS=START:STOP`` explores others.
:func:`coverage` counts what the seeds exercise (``test_random_scenarios_cover_...`` keeps it
wide; the README of this directory gives the figures).
"""

from __future__ import annotations

import copy
import os
import random
from collections import Counter
from typing import Any

import pytest

from tessera.localcluster.harness import run_scenario as run_upstream

from .compare import assert_same
from .test_conformance import run_scenario

DRIVER = "gpu.example.com"
NIC = "nic.example.com"
ALL_FEATURES = [
    "AdminAccess",
    "ConsumableCapacity",
    "DeviceBindingAndStatus",
    "DeviceTaints",
    "PartitionableDevices",
    "PrioritizedList",
]
_lo, _, _hi = os.environ.get("TESSERA_RANDOM_SEEDS", "0:500").partition(":")
SEEDS = range(int(_lo), int(_hi))
NODES = [
    {"name": "node-1", "labels": {"region": "r1", "zone": "a"}},
    {"name": "node-2", "labels": {"region": "r2", "zone": "a"}},
]


def _features(rng: random.Random) -> list[str]:
    if rng.random() < 0.65:
        # All on, as in a 1.37 cluster: DRAFractionalCapacityRange too (its 1.37 default, no
        # extra draw, so the scenarios of each seed stay what they were).
        feats = [*ALL_FEATURES, "FractionalCapacityRange"]
    else:
        feats = [f for f in ALL_FEATURES if rng.random() < 0.6]
    if rng.random() < 0.2:
        feats.append("ListTypeAttributes")
    return sorted(feats)


def _capacity(rng: random.Random, multi: bool) -> dict[str, Any]:
    mem = rng.choice([8, 16, 24])
    caps: dict[str, Any] = {"memory": {"value": f"{mem}Gi"}, "cores": {"value": "100"}}
    if multi:
        kind = rng.choice(["none", "range", "values", "tessera"])
        if kind == "range":
            caps["memory"]["requestPolicy"] = {
                "default": "4Gi",
                "validRange": {"min": "2Gi", "step": "2Gi", "max": f"{mem}Gi"},
            }
        elif kind == "values":
            caps["memory"]["requestPolicy"] = {"default": "4Gi", "validValues": ["4Gi", "8Gi"]}
        elif kind == "tessera":
            caps["memory"]["requestPolicy"] = {
                "default": f"{mem}Gi",
                "validRange": {"min": "1Mi", "step": "1Mi"},
            }
            caps["cores"]["requestPolicy"] = {
                "default": "0",
                "validRange": {"min": "0", "max": "100", "step": "1"},
            }
    return caps


def _node_selection(
    rng: random.Random, obj: dict[str, Any], kinds: list[str], target: int, other: float = 0.2
) -> str:
    """Node selection of a slice (or a device): the node allocated for (``target``), or with
    probability ``other`` the other node."""
    kind = rng.choice(kinds)
    node = NODES[1 - target if rng.random() < other else target]
    if kind == "nodeName":
        obj["nodeName"] = node["name"]
    elif kind == "selector":
        obj["nodeSelector"] = {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "region", "operator": "In", "values": [node["labels"]["region"]]}
                    ]
                }
            ]
        }
    elif kind == "fieldSelector":
        obj["nodeSelector"] = {
            "nodeSelectorTerms": [
                {
                    "matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": [node["name"]]}
                    ]
                }
            ]
        }
    elif kind == "allNodes":
        obj["allNodes"] = True
    else:
        obj["perDeviceNodeSelection"] = True
    return kind


def _device(
    rng: random.Random, n: int, driver: str, counters: bool, lists: bool, cov: Counter[str]
) -> dict[str, Any]:
    multi = rng.random() < 0.6
    d: dict[str, Any] = {
        "name": f"dev-{n}",
        "attributes": {
            "uuid": {"string": f"uuid-{n}"},
            "model": {"string": rng.choice(["a", "b"])},
            "numa": {"int": rng.choice([0, 1])},
            "driverVersion": {"version": rng.choice(["1.0.0", "1.2.0", "2.0.0"])},
        },
    }
    if rng.random() < 0.9:
        d["capacity"] = _capacity(rng, multi)
    if multi:
        d["allowMultipleAllocations"] = True
        cov["multi-allocatable device"] += 1
    if lists or rng.random() < 0.1:
        d["attributes"]["numas"] = {"ints": sorted(rng.sample([0, 1, 2], rng.randint(1, 2)))}
        d["attributes"]["models"] = {
            "strings": sorted(rng.sample(["a", "b", "c"], rng.randint(1, 3)))
        }
        cov["list attributes"] += 1
        if rng.random() < 0.08:
            d["attributes"]["models"] = {"strings": []}
            cov["empty list attribute"] += 1
    if counters and rng.random() < 0.75:
        d["consumesCounters"] = [
            {"counterSet": "cs-0", "counters": {"mem": {"value": f"{rng.choice([2, 4, 8])}Gi"}}}
        ]
        cov["device consuming counters"] += 1
    if rng.random() < 0.1:
        effect = rng.choice(["NoSchedule", "NoExecute", "None"])
        d["taints"] = [
            {"key": rng.choice(["k1", "k2"]), "value": rng.choice(["v1", "v2"]), "effect": effect}
        ]
        cov[f"taint {effect}"] += 1
    if rng.random() < 0.05:
        d["bindingConditions"] = ["ready"]
        d["bindingFailureConditions"] = ["failed"]
        cov["binding conditions"] += 1
        if rng.random() < 0.5:
            d["bindsToNode"] = True
    return d


def _toleration(rng: random.Random, cov: Counter[str]) -> dict[str, Any]:
    op = rng.choice(["Exists", "Equal"])
    t: dict[str, Any] = {"operator": op}
    key = rng.choice(["k1", "k2", ""]) if op == "Exists" else rng.choice(["k1", "k2"])
    if key:
        t["key"] = key
    if op == "Equal":
        t["value"] = rng.choice(["v1", "v2"])
    effect = rng.choice(["", "NoSchedule", "NoExecute"])
    if effect:
        t["effect"] = effect
    cov[
        f"toleration {op}{' empty key' if not key else ''}{' any effect' if not effect else ''}"
    ] += 1
    return t


def _request(
    rng: random.Random, feats: list[str], sub: bool, lists: bool, nic: bool, cov: Counter[str]
) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": "nic" if nic and rng.random() < 0.3 else "gpu"}
    if rng.random() < 0.07:
        body["allocationMode"] = "All"
        cov["allocationMode All"] += 1
    else:
        body["allocationMode"] = "ExactCount"
        body["count"] = rng.choices([1, 2, 3, 4], weights=[62, 22, 10, 6])[0]
        cov[f"count {body['count']}"] += 1
    sels = [
        f'device.attributes["{DRIVER}"].model == "a"',
        f'device.attributes["{DRIVER}"].numa == 1',
        f'has(device.capacity["{DRIVER}"].memory) && '
        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("16Gi")) >= 0',
        f'has(device.capacity["{DRIVER}"].memory) && '
        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("16Gi")) >= 0',
        f'device.attributes["{DRIVER}"].driverVersion.isGreaterThan(semver("1.1.0"))',
    ]
    if rng.random() < 0.2:  # unguarded: a device without memory is a CEL runtime error
        sels.append(f'device.capacity["{DRIVER}"].memory.compareTo(quantity("16Gi")) >= 0')
    if "ListTypeAttributes" in feats:
        sels.append(
            f'has(device.attributes["{DRIVER}"].numas) && device.attributes["{DRIVER}"].numas.includes(1)'
        )
    if body["deviceClassName"] == "gpu" and rng.random() < 0.35:
        body["selectors"] = [{"cel": {"expression": rng.choice(sels)}}]
    if "ConsumableCapacity" in feats and rng.random() < 0.55:
        reqs = {"memory": rng.choice(["1Gi", "3Gi", "4Gi", "6Gi", "10Gi"])}
        if rng.random() < 0.5:
            reqs["cores"] = rng.choice(["10", "30", "50"])
        body["capacity"] = {"requests": reqs}
        cov["capacity request"] += 1
    if not sub and "AdminAccess" in feats and rng.random() < 0.1:
        body["adminAccess"] = True
        cov["admin access"] += 1
    if rng.random() < 0.25:
        body["tolerations"] = [_toleration(rng, cov) for _ in range(rng.randint(1, 2))]
    return body


def _share_id(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012d}"


def scenario(seed: int, cov: Counter[str] | None = None) -> dict[str, Any]:
    rng = random.Random(seed)
    cov = cov if cov is not None else Counter()
    feats = _features(rng)
    lists = "ListTypeAttributes" in feats
    target = 0 if rng.random() < 0.75 else 1
    slices: list[dict[str, Any]] = []
    n = 0
    visible: list[tuple[str, str, dict[str, Any]]] = []  # (driver, pool, device)
    for p in range(rng.randint(1, 3)):
        driver = DRIVER if p == 0 or rng.random() < 0.7 else NIC
        pool = f"pool-{p}"
        counters = rng.random() < 0.35
        n_slices = rng.choice([1, 1, 2])
        sel_spec: dict[str, Any] = {}
        kind = _node_selection(
            rng,
            sel_spec,
            ["nodeName", "nodeName", "selector", "fieldSelector", "allNodes", "perDevice"],
            target,
            0.0 if p == 0 else 0.3,
        )
        cov[f"pool by {kind}"] += 1
        count = n_slices + (1 if counters else 0)
        if rng.random() < 0.03:
            count += 1  # one slice missing: the pool is incomplete
            cov["incomplete pool"] += 1
        pool_slices = []
        for s in range(n_slices):
            devices = []
            for _ in range(rng.randint(2, 6)):
                dv = _device(rng, n, driver, counters, lists, cov)
                if kind == "perDevice":
                    _node_selection(rng, dv, ["nodeName", "selector", "allNodes"], target)
                devices.append(dv)
                visible.append((driver, pool, dv))
                n += 1
            spec = {
                "driver": driver,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": count},
                **sel_spec,
                "devices": devices,
            }
            pool_slices.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"slice-{p}-{s}"},
                    "spec": spec,
                }
            )
        if counters:
            cov["shared counters"] += 1
            cspec = {
                "driver": driver,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": count},
                **sel_spec,
                "sharedCounters": [
                    {"name": "cs-0", "counters": {"mem": {"value": f"{rng.choice([4, 8, 12])}Gi"}}}
                ],
            }
            if kind == "perDevice":
                cspec.pop("perDeviceNodeSelection")
                cspec["allNodes"] = True
            pool_slices.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"slice-{p}-c"},
                    "spec": cspec,
                }
            )
        if rng.random() < 0.04 and len(pool_slices[0]["spec"]["devices"]) > 0 and n_slices == 2:
            pool_slices[1]["spec"]["devices"][0]["name"] = pool_slices[0]["spec"]["devices"][0][
                "name"
            ]
            cov["invalid pool (duplicate device)"] += 1
        slices.extend(pool_slices)
    allocated = []
    for i, (driver, pool, dv) in enumerate(
        rng.sample(visible, k=min(len(visible), rng.randint(0, 3)))
    ):
        res: dict[str, Any] = {
            "request": "req",
            "driver": driver,
            "pool": pool,
            "device": dv["name"],
        }
        r = rng.random()
        if dv.get("allowMultipleAllocations") and r < 0.7:
            res["shareID"] = _share_id(i)
            if dv.get("capacity"):
                res["consumedCapacity"] = {
                    "memory": rng.choice(["2Gi", "4Gi", "8Gi"]),
                    "cores": rng.choice(["0", "50"]),
                }
            cov["earlier share"] += 1
        elif r < 0.85:
            res["adminAccess"] = True
            cov["earlier admin result"] += 1
        else:
            cov["earlier dedicated"] += 1
        allocated.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"earlier-{i}", "namespace": "default"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "req", "exactly": {"deviceClassName": "gpu"}}]
                    }
                },
                "status": {"allocation": {"devices": {"results": [res]}}},
            }
        )
    claims = []
    nic = any(drv == NIC for drv, _, _ in visible)
    for c in range(rng.choices([1, 2, 3], weights=[55, 30, 15])[0]):
        requests = []
        names: list[str] = []
        for r in range(rng.choices([1, 2, 3], weights=[55, 30, 15])[0]):
            if "PrioritizedList" in feats and rng.random() < 0.25:
                subs = [
                    {"name": f"sub-{s}", **_request(rng, feats, True, lists, nic, cov)}
                    for s in range(rng.randint(1, 3))
                ]
                requests.append({"name": f"req-{r}", "firstAvailable": subs})
                names += [f"req-{r}/{s['name']}" for s in subs]
                cov["firstAvailable"] += 1
            else:
                requests.append(
                    {"name": f"req-{r}", "exactly": _request(rng, feats, False, lists, nic, cov)}
                )
            names.append(f"req-{r}")
        constraints = []
        options = [
            ("matchAttribute", f"{DRIVER}/numa"),
            ("distinctAttribute", f"{DRIVER}/uuid"),
            ("distinctAttribute", f"{DRIVER}/model"),
        ]
        if lists or rng.random() < 0.2:
            options += [
                ("matchAttribute", f"{DRIVER}/numas"),
                ("distinctAttribute", f"{DRIVER}/models"),
            ]
        for kind_, attr in options:
            if rng.random() < 0.12 and (kind_ == "matchAttribute" or "ConsumableCapacity" in feats):
                con: dict[str, Any] = {kind_: attr}
                if rng.random() < 0.4:
                    con["requests"] = sorted(set(rng.sample(names, k=rng.randint(1, len(names)))))
                constraints.append(con)
                cov[f"{kind_} {attr.rpartition('/')[2]}"] += 1
        spec: dict[str, Any] = {"devices": {"requests": requests}}
        if constraints:
            spec["devices"]["constraints"] = constraints
        if rng.random() < 0.15:
            spec["devices"]["config"] = [
                {
                    "requests": sorted(set(rng.sample(names, k=1))),
                    "opaque": {"driver": DRIVER, "parameters": {"claim": c}},
                }
            ]
            cov["claim config"] += 1
        claims.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"claim-{c}", "namespace": "default"},
                "spec": spec,
            }
        )
    gpu_class: dict[str, Any] = {
        "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
    }
    if rng.random() < 0.2:
        gpu_class["config"] = [{"opaque": {"driver": DRIVER, "parameters": {"class": "gpu"}}}]
        cov["class config"] += 1
    node = NODES[target]
    # Drawn last, so that the rest of every seed's scenario is what it was before rules.
    rules = _taint_rules(rng, visible, cov) if rng.random() < 0.3 else []
    return {
        "name": f"random-{seed}",
        "features": feats,
        "node": node,
        **({"taintRules": rules} if rules else {}),
        "classes": [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "gpu"},
                "spec": gpu_class,
            },
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "nic"},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{NIC}"'}}]},
            },
        ],
        "slices": slices,
        "allocated": allocated,
        "claims": claims,
    }


def _taint_rules(
    rng: random.Random, visible: list[tuple[str, str, dict[str, Any]]], cov: Counter[str]
) -> list[dict[str, Any]]:
    """One or two DeviceTaintRules (KEP-5055): selectors omitted, empty, or by driver, pool and
    device (of a published device, or of none), taints of every effect."""
    out = []
    for i in range(rng.randint(1, 2)):
        driver, pool, dev = rng.choice(visible)
        kind = rng.choice(
            ["omitted", "empty", "driver", "pool", "device", "driver+pool+device", "miss"]
        )
        sel: dict[str, Any] | None = {
            "omitted": None,
            "empty": {},
            "driver": {"driver": driver},
            "pool": {"pool": pool},
            "device": {"device": dev.get("name")},
            "driver+pool+device": {"driver": driver, "pool": pool, "device": dev.get("name")},
            "miss": {"driver": driver, "pool": "pool-9"},
        }[kind]
        effect = rng.choice(["NoSchedule", "NoExecute", "None"])
        spec: dict[str, Any] = {
            "taint": {
                "key": rng.choice(["k1", "k2"]),
                "value": rng.choice(["v1", "v2"]),
                "effect": effect,
            }
        }
        if sel is not None:
            spec["deviceSelector"] = sel
        cov[f"taint rule {kind}"] += 1
        cov[f"taint rule {effect}"] += 1
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceTaintRule",
                "metadata": {"name": f"rule-{i}"},
                "spec": spec,
            }
        )
    return out


def with_rules_merged(sc: dict[str, Any]) -> dict[str, Any]:
    """The scenario as kube-scheduler's allocator sees it (``ListWithDeviceTaintRules``): each
    rule's taint appended to the taints of every device its selector selects (an omitted
    selector selects none, an empty one all), and no rules. Written here, independently of
    ``tessera.allocator``'s ``TaintRule``."""
    rules = sc.get("taintRules") or []
    if not rules:
        return sc
    out = copy.deepcopy({k: v for k, v in sc.items() if k != "taintRules"})
    for sl in out.get("slices") or []:
        spec = sl["spec"]
        for d in spec.get("devices") or []:
            for r in rules:
                sel = r["spec"].get("deviceSelector")
                if sel is None:
                    continue
                want = {
                    "driver": spec["driver"],
                    "pool": spec["pool"]["name"],
                    "device": d.get("name"),
                }
                if all(sel.get(k) in (None, "", v) for k, v in want.items()):
                    d.setdefault("taints", []).append(dict(r["spec"]["taint"]))
    return out


def coverage(seeds: range) -> tuple[Counter[str], Counter[str]]:
    """(constructs: in how many seeds each appears, outcomes: allocated / none / error counts)."""
    constructs: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for s in seeds:
        cov: Counter[str] = Counter()
        sc = scenario(s, cov)
        constructs.update(set(cov))
        for f in sc["features"]:
            constructs[f"feature {f}"] += 1
        if len(sc["features"]) < len(ALL_FEATURES) and "ListTypeAttributes" not in sc["features"]:
            constructs["some features off"] += 1
        err, results = run_scenario(sc)
        outcomes[
            "error" if err else "allocated" if results and results[0] is not None else "none"
        ] += 1
    return constructs, outcomes


@pytest.mark.upstream
@pytest.mark.parametrize("seed", SEEDS)
def test_random_scenario_agrees_with_upstream(seed: int) -> None:
    sc = scenario(seed)
    err, results = run_scenario(sc)
    assert_same(sc, err, results, run_upstream(with_rules_merged(sc), timeout=60), exact=False)


def test_random_scenarios_cover_every_construct_and_outcome() -> None:
    """The generator is not degenerate: most scenarios allocate, some do not, some error, and
    every construct it knows appears in many of them."""
    seeds = range(0, 500)
    constructs, outcomes = coverage(seeds)
    assert outcomes["allocated"] >= 200 and outcomes["none"] >= 50 and outcomes["error"] >= 10, (
        outcomes
    )
    for name in (
        "allocationMode All",
        "count 3",
        "count 4",
        "firstAvailable",
        "shared counters",
        "device consuming counters",
        "list attributes",
        "empty list attribute",
        "binding conditions",
        "taint NoSchedule",
        "taint NoExecute",
        "taint None",
        "taint rule omitted",
        "taint rule empty",
        "taint rule driver",
        "taint rule pool",
        "taint rule device",
        "taint rule driver+pool+device",
        "taint rule miss",
        "taint rule NoSchedule",
        "taint rule NoExecute",
        "taint rule None",
        "toleration Exists",
        "toleration Equal",
        "toleration Exists empty key",
        "admin access",
        "earlier share",
        "earlier dedicated",
        "earlier admin result",
        "pool by perDevice",
        "pool by selector",
        "pool by fieldSelector",
        "pool by allNodes",
        "incomplete pool",
        "invalid pool (duplicate device)",
        "matchAttribute numa",
        "distinctAttribute uuid",
        "matchAttribute numas",
        "distinctAttribute models",
        "claim config",
        "class config",
        "feature ListTypeAttributes",
        "some features off",
    ):
        assert constructs[name] >= 10, (name, constructs[name])
