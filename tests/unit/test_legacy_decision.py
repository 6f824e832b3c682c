"""Legacy mode's decision (``tessera.scheduler.legacy.decide``) and the extender's filter and
prioritize over it: corpus HAMi pods on Nodes whose register annotations are built from corpus
inventories, the pods already placed read from their ``-allocated`` records."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from corpus_paths import corpus_path
from hami_register import A10, A5000, H100, H100_TOPOLOGY, register_entries, register_node
from tessera.convert import convert_pod
from tessera.convert.hami import (
    DEVICES_ALLOCATED,
    VGPU_NODE,
    decode_pod_devices,
    encode_pod_devices,
)
from tessera.extender.legacy import (
    ALLOCATING_EXPIRY_SECONDS,
    LegacyExtender,
    allocating_pod,
    static_extender,
)
from tessera.scheduler.legacy import (
    SHARERS_TAINT,
    BookedPods,
    Booking,
    DecisionMemo,
    bookings,
    decide,
    legacy_node,
)

pytestmark = pytest.mark.legacy
PODS = corpus_path() / "hami-pods"


def corpus_pods(name: str) -> list[dict[str, Any]]:
    out = []
    for i, doc in enumerate(yaml.safe_load_all((PODS / name).read_text())):
        if doc and doc.get("kind") == "Pod":
            doc.setdefault("metadata", {}).setdefault("namespace", "default")
            doc["metadata"]["uid"] = f"uid-{name}-{i}"
            out.append(doc)
    return out


def pod(name: str, k: int = 0) -> dict[str, Any]:
    return corpus_pods(name)[k]


def booked(p: dict[str, Any], node: str, devices: list[Any]) -> dict[str, Any]:
    """``p`` as the extender leaves it once bound: the decision recorded on it."""
    out = copy.deepcopy(p)
    out["metadata"].setdefault("annotations", {}).update(
        {VGPU_NODE: node, DEVICES_ALLOCATED: encode_pod_devices(devices)}
    )
    out["spec"]["nodeName"] = node
    return out


def devmem(inventory: Path) -> dict[str, int]:
    return {e["id"]: e["devmem"] for e in register_entries(inventory)}


SINGLE_GPU_PODS = [
    "HAMi__examples_nvidia__default_use.yaml",
    "HAMi__examples_nvidia__use_sharing_card.yaml",
    "HAMi__examples_nvidia__use_exclusive_card.yaml",
    "HAMi__examples_nvidia__use_memory_fraction.yaml",
    "HAMi__examples_nvidia__specify_scheduling_policy.yaml",
    "HAMi__examples_nvidia__use_as_normal.yaml",
]


@pytest.mark.parametrize("name", SINGLE_GPU_PODS)
def test_the_decision_records_what_the_conversion_asks(name: str) -> None:
    """On an empty A5000 node and an H100 node, each container gets ``nvidia.com/gpu`` distinct
    registered GPUs, each with the memory the pod asks (MiB, or its percentage of the GPU's
    registered memory) and its cores, as ``tessera convert`` reads the request."""
    nodes = [
        legacy_node(register_node("a5000", A5000)),
        legacy_node(register_node("h100", H100, H100_TOPOLOGY)),
    ]
    mem = {**devmem(A5000), **devmem(H100)}
    for p in corpus_pods(name):
        requests = convert_pod(p, memory_sizes=[80 * 2**30]).requests
        d = decide(p, nodes, [])
        assert d.hami and [r.container for r in d.requests] == [r.container for r in requests]
        for fit in d.nodes:
            assert fit.fits, fit.reason
            assert fit.devices is not None
            by_container = dict(zip([r.container for r in requests], fit.devices, strict=False))
            for r in requests:
                devs = by_container[r.container]
                assert len({x.uuid for x in devs}) == len(devs) == r.gpus
                for x in devs:
                    assert x.vendor == "NVIDIA"
                    want = (
                        r.memory_mib
                        if r.memory_mib is not None
                        else mem[x.uuid] * (r.memory_percentage or 100) // 100
                    )
                    assert x.memory_mib == want
                    assert x.cores == r.cores
            # The record round-trips through HAMi's codec, one entry per container.
            text = encode_pod_devices(fit.devices)
            assert decode_pod_devices(text) == fit.devices


def test_placed_pods_consume_their_recorded_share() -> None:
    """use_sharing_card's two pods (40 % + 60 % of the memory, 60 + 40 cores) fill the one A10:
    a third pod no longer fits there, in the allocator's words; on the two-GPU A5000 node the
    first pods share one GPU (binpack) and the third goes to the other."""
    a10 = legacy_node(register_node("a10", A10))
    first, second = corpus_pods("HAMi__examples_nvidia__use_sharing_card.yaml")
    third = pod("HAMi__examples_nvidia__default_use.yaml")
    d1 = decide(first, [a10], [])
    assert d1.nodes[0].devices is not None
    b1 = booked(first, "a10", d1.nodes[0].devices)
    d2 = decide(second, [a10], bookings([b1]))
    assert d2.nodes[0].devices is not None
    assert d2.nodes[0].devices[0][0].uuid == d1.nodes[0].devices[0][0].uuid
    b2 = booked(second, "a10", d2.nodes[0].devices)
    d3 = decide(third, [a10], bookings([b1, b2]))
    fit = d3.nodes[0]
    assert not fit.fits
    assert "cores short by 30 (needs 30, 0 free of 100)" in fit.reason
    assert d3.best() is None

    a5000 = legacy_node(register_node("a5000", A5000))
    placed: list[dict[str, Any]] = []
    for p in (first, second, third):
        ann = p["metadata"].setdefault("annotations", {})
        ann["hami.io/gpu-scheduler-policy"] = "binpack"
        fit = decide(p, [a5000], bookings(placed)).nodes[0]
        assert fit.devices is not None, fit.reason
        placed.append(booked(p, "a5000", fit.devices))
    uuids = [
        decode_pod_devices(p["metadata"]["annotations"][DEVICES_ALLOCATED])[0][0].uuid
        for p in placed
    ]
    assert uuids[0] == uuids[1] != uuids[2]


def three_nodes() -> list[Any]:
    """An A10 node with 3 GPUs, an A5000 node and an H100 node with its NUMA topology."""
    return [
        legacy_node(register_node("a10", A10, count=3)),
        legacy_node(register_node("a5000", A5000)),
        legacy_node(register_node("h100", H100, H100_TOPOLOGY)),
    ]


def test_booked_pods_carried_across_changes_answer_as_the_plain_list() -> None:
    """The extender's grouping of the bookings, carried from one set to the next
    (:meth:`BookedPods.changed`: only the nodes whose bookings changed are grouped again),
    groups as a fresh one and decides as the plain list: corpus pods placed one by one
    on three nodes, the oldest placed pod deleted every third step, and the oldest still placed
    decided again each step (its own booking left out)."""
    nodes = three_nodes()
    memo = DecisionMemo()
    placed: list[dict[str, Any]] = []
    same: dict[tuple[str, str], Booking] = {}  # one object per pod version, as the extender keeps
    prev: BookedPods | None = None
    names = [*SINGLE_GPU_PODS, "HAMi__examples_nvidia__specify_card_type_to_use.yaml"] * 3
    changed_nodes = 0
    for k, name in enumerate(names):
        plain = bookings(placed)
        now = [same.setdefault((b.uid, b.record), b) for b in plain]
        if prev is None:
            grouped = BookedPods(now)
        else:
            before = [b for bs in prev.by_node.values() for b in bs]
            grouped = prev.changed(
                [b for b in now if all(b is not x for x in before)],
                [b for b in before if all(b is not x for x in now)],
            )
        full = BookedPods(plain)
        assert (grouped.by_node, grouped.keys, grouped._nodes_of) == (
            full.by_node,
            full.keys,
            full._nodes_of,
        )
        if prev is not None:
            changed_nodes += sum(grouped.keys.get(n) != prev.keys.get(n) for n in grouped.keys)
        p = pod(name)
        p["metadata"]["uid"] = f"stream-{k}"
        got = decide(p, nodes, grouped, default_policy="binpack", memo=memo)
        assert got.nodes == decide(p, nodes, plain, default_policy="binpack").nodes
        if placed:  # recorded but not bound (a bind that failed): decided again
            q = copy.deepcopy(placed[0])
            del q["spec"]["nodeName"]
            again = decide(q, nodes, grouped, default_policy="binpack", memo=memo)
            others = bookings(placed[1:])
            assert again.nodes == decide(q, nodes, others, default_policy="binpack").nodes
        best = got.best()
        if best is not None and best.devices is not None:
            placed.append(booked(p, best.node, best.devices))
        if k % 3 == 2 and placed:
            placed.pop(0)
        prev = grouped
    assert len(placed) > 3 and changed_nodes > 5


def test_the_extenders_bookings_follow_its_pods_as_a_fresh_grouping() -> None:
    """The extender carries its grouping from one generation of its pods to the next, with
    only the pods that changed regrouped: after each change of the pods (corpus pods booked on
    three nodes, one moved to another node under a new resourceVersion, one finished, one
    deleted, one listed twice, one without uid or resourceVersion) it groups as
    :class:`BookedPods` of :func:`bookings` of the pods made afresh."""
    nodes = three_nodes()
    pods: list[dict[str, Any]] = []
    gen = [0]
    ext = LegacyExtender(lambda n: None, lambda: pods, None, pods_generation=lambda: gen[0])

    def check() -> None:
        gen[0] += 1
        got = ext._bookings()
        unique = list({id(p): p for p in pods}.values())
        fresh = BookedPods(bookings(unique))
        assert (got.keys, got._nodes_of) == (fresh.keys, fresh._nodes_of)
        assert ext._bookings() is got  # the same generation: the same grouping

    placed: list[dict[str, Any]] = []
    for k, name in enumerate(SINGLE_GPU_PODS * 2):
        p = pod(name)
        p["metadata"].update(name=f"p{k}", uid=f"uid-{k}", resourceVersion=str(k + 1))
        best = decide(p, nodes, bookings(placed)).best()
        if best is not None and best.devices is not None:
            placed.append(booked(p, best.node, best.devices))
    assert len(placed) >= 6
    pods.extend(placed[:4])
    check()
    pods.extend(placed[4:])
    check()
    moved = copy.deepcopy(pods[1])
    other = next(n.name for n in nodes if n.name != moved["spec"]["nodeName"])
    moved["metadata"]["annotations"][VGPU_NODE] = other
    moved["metadata"]["resourceVersion"] = "100"
    pods[1] = moved
    check()
    done = copy.deepcopy(pods[2])
    done["status"] = {"phase": "Succeeded"}
    done["metadata"]["resourceVersion"] = "101"
    pods[2] = done
    check()
    del pods[0]
    check()
    twice = copy.deepcopy(pods[0])
    twice["metadata"].update(uid="uid-twice", resourceVersion="200")
    pods += [twice, twice]  # a new version listed twice
    check()
    anonymous = []
    for q in pods[2:4]:
        a = copy.deepcopy(q)
        del a["metadata"]["uid"], a["metadata"]["resourceVersion"]
        anonymous.append(a)
    pods += anonymous
    check()
    pods.remove(anonymous[0])
    check()
    pods.remove(anonymous[1])
    pods.remove(twice)
    pods.remove(twice)
    check()
    assert sum(len(bs) for bs in ext._bookings().by_node.values()) == len(placed) - 2


def test_the_memo_answers_as_a_fresh_decision() -> None:
    """A stream of corpus pods placed one by one on three nodes: with a :class:`DecisionMemo`
    (the extender's) every decision equals the one taken from scratch."""
    nodes = three_nodes()
    memo = DecisionMemo()
    placed: list[dict[str, Any]] = []
    names = [*SINGLE_GPU_PODS, "HAMi__examples_nvidia__specify_card_type_to_use.yaml"] * 3
    for k, name in enumerate(names):
        p = pod(name)
        p["metadata"]["uid"] = f"stream-{k}"
        fresh = decide(p, nodes, bookings(placed), default_policy="binpack")
        again = decide(p, nodes, bookings(placed), default_policy="binpack", memo=memo)
        assert again.nodes == fresh.nodes
        memoised = decide(p, nodes, bookings(placed), default_policy="binpack", memo=memo)
        assert memoised.nodes == fresh.nodes
        best = fresh.best()
        if best is not None and best.devices is not None:
            placed.append(booked(p, best.node, best.devices))
    assert len(placed) > 5


def test_finished_pods_release_terminating_pods_hold() -> None:
    a10 = legacy_node(register_node("a10", A10))
    excl = pod("HAMi__examples_nvidia__use_as_normal.yaml")
    fit = decide(excl, [a10], []).nodes[0]
    assert fit.devices is not None
    holder = booked(excl, "a10", fit.devices)
    holder["metadata"]["uid"] = "holder"
    other = pod("HAMi__examples_nvidia__default_use.yaml")
    assert not decide(other, [a10], bookings([holder])).nodes[0].fits
    terminating = copy.deepcopy(holder)
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert not decide(other, [a10], bookings([terminating])).nodes[0].fits
    for phase in ("Succeeded", "Failed"):
        done = copy.deepcopy(holder)
        done["status"] = {"phase": phase}
        assert decide(other, [a10], bookings([done])).nodes[0].fits
    # A pod's own record (same UID: bind deciding again) is not counted against it.
    own = copy.deepcopy(holder)
    own["metadata"]["uid"] = excl["metadata"]["uid"]
    assert decide(excl, [a10], bookings([own])).nodes[0].fits


def test_split_count_caps_the_sharers_of_a_gpu() -> None:
    """A GPU registered with ``count: 2`` takes two containers, however much memory is left."""
    a10 = legacy_node(register_node("a10", A10, count=2))
    small = pod("HAMi__examples_nvidia__default_use.yaml")
    placed: list[Booking] = []
    for k in range(2):
        p = copy.deepcopy(small)
        p["metadata"]["uid"] = f"small-{k}"
        fit = decide(p, [a10], placed).nodes[0]
        assert fit.devices is not None, fit.reason
        placed += bookings([booked(p, "a10", fit.devices)])
    fit = decide(small, [a10], placed).nodes[0]
    assert not fit.fits
    assert f"{SHARERS_TAINT}=2/2:NoSchedule" in fit.reason


def test_a_pods_own_containers_count_against_the_split_count() -> None:
    """default_use's container twice in one pod (two sharers of one GPU) on an A10 registered
    with ``count: 2`` that already holds one container: one slot is left, the pod needs two."""
    a10 = legacy_node(register_node("a10", A10, count=2))
    one = pod("HAMi__examples_nvidia__default_use.yaml")
    fit = decide(one, [a10], []).nodes[0]
    assert fit.devices is not None
    placed = bookings([booked(one, "a10", fit.devices)])
    two = pod("HAMi__examples_nvidia__default_use.yaml")
    two["metadata"]["uid"] = "two-containers"
    twin = copy.deepcopy(two["spec"]["containers"][0])
    twin["name"] = "twin"
    two["spec"]["containers"].append(twin)
    assert decide(two, [a10], []).nodes[0].fits
    got = decide(two, [a10], placed).nodes[0]
    assert not got.fits
    uuid = register_entries(A10)[0]["id"]
    assert got.reason == f"{uuid}: 2 of its containers need 2 sharer slots, 1 free"


def test_node_policy_binpack_and_spread() -> None:
    """specify_scheduling_policy asks node ``spread``: the empty node first; binpack (the same
    pod with the annotation changed) prefers the booked one."""
    nodes = [legacy_node(register_node(n, A5000)) for n in ("busy", "idle")]
    sharer = pod("HAMi__examples_nvidia__default_use.yaml")
    fit = decide(sharer, nodes[:1], []).nodes[0]
    assert fit.devices is not None
    placed = bookings([booked(sharer, "busy", fit.devices)])
    spread = pod("HAMi__examples_nvidia__specify_scheduling_policy.yaml")
    d = decide(spread, nodes, placed)
    assert d.policy.nodes == "spread"
    assert [f.node for f in d.fitting()] == ["idle", "busy"]
    assert d.levels() == {"idle": 0, "busy": 1}
    binpack = copy.deepcopy(spread)
    binpack["metadata"]["annotations"]["hami.io/node-scheduler-policy"] = "binpack"
    assert decide(binpack, nodes, placed).best().node == "busy"  # type: ignore[union-attr]


def test_a_multi_gpu_pod_stays_on_one_numa_node_where_it_can() -> None:
    """On the 8x H100 box (its ``topo -m``: GPUs on two NUMA nodes, carried by the register
    annotation's ``numa``), with all but one GPU of the first NUMA node taken whole, a 2-GPU
    pod gets two GPUs of the other NUMA node (the conversion's ``numa`` subrequest, which the
    allocator tries before ``any``), also under ``topology-aware``; with one GPU free per NUMA
    node it is split across them."""
    entries = register_entries(H100, H100_TOPOLOGY)
    numa = {e["id"]: e["numa"] for e in entries}
    groups = sorted({e["numa"] for e in entries})
    assert len(groups) == 2
    node = legacy_node(register_node("h100", H100, H100_TOPOLOGY))
    holder = pod("HAMi__examples_nvidia__use_as_normal.yaml")

    def hold(uuids: list[str]) -> list[Booking]:
        placed: list[dict[str, Any]] = []
        for k, u in enumerate(uuids):
            h = copy.deepcopy(holder)
            h["metadata"]["uid"] = f"holder-{k}"
            h["metadata"]["annotations"] = {"nvidia.com/use-gpuuuid": u}
            fit = decide(h, [node], bookings(placed)).nodes[0]
            assert fit.devices is not None and fit.devices[0][0].uuid == u, fit.reason
            placed.append(booked(h, "h100", fit.devices))
        return bookings(placed)

    first = [e["id"] for e in entries if e["numa"] == groups[0]]
    second = [e["id"] for e in entries if e["numa"] == groups[1]]
    two = pod("HAMi__examples_nvidia__use_memory_fraction.yaml")
    aware = copy.deepcopy(two)
    aware["metadata"]["annotations"] = {"hami.io/gpu-scheduler-policy": "topology-aware"}
    for p in (two, aware):
        fit = decide(p, [node], hold(first[:-1])).nodes[0]
        assert fit.devices is not None, fit.reason
        assert {numa[x.uuid] for x in fit.devices[0]} == {groups[1]}
    fit = decide(two, [node], hold(first[:-1] + second[:-1])).nodes[0]
    assert fit.devices is not None, fit.reason
    assert {x.uuid for x in fit.devices[0]} == {first[-1], second[-1]}


def test_filter_and_prioritize_answer_in_the_extender_protocol() -> None:
    """``filter`` keeps the nodes that fit and gives the others' reasons; ``prioritize`` scores
    the preferred node 10; a pod without HAMi requests passes every node."""
    nodes = [register_node("a10", A10), register_node("a5000", A5000)]
    excl = pod("HAMi__examples_nvidia__use_exclusive_card.yaml")  # 2 GPUs: the A10 has one
    ext = static_extender(nodes, [])
    args = {"Pod": excl, "NodeNames": ["a10", "a5000", "gone"]}
    got = ext.filter(json.loads(json.dumps(args)))
    assert got["NodeNames"] == ["a5000"]
    assert set(got["FailedNodes"]) == {"a10", "gone"}
    assert "needs 2 GPUs" in got["FailedNodes"]["a10"]
    assert got["Error"] == ""
    scores = ext.prioritize(args)
    assert scores == [
        {"Host": "a10", "Score": 0},
        {"Host": "a5000", "Score": 10},
        {"Host": "gone", "Score": 0},
    ]
    plain = {
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"containers": [{"name": "c"}]},
    }
    assert ext.filter({"pod": plain, "nodenames": ["a10"]})["NodeNames"] == ["a10"]


def test_a_bad_register_annotation_fails_that_node_only() -> None:
    good = register_node("a10", A10)
    bad = register_node("broken", A10)
    bad["metadata"]["annotations"]["hami.io/node-nvidia-register"] = '[{"id": 5}]'
    got = static_extender([good, bad], []).filter(
        {"Pod": pod("HAMi__examples_nvidia__default_use.yaml"), "NodeNames": ["a10", "broken"]}
    )
    assert got["NodeNames"] == ["a10"]
    assert "hami.io/node-nvidia-register" in got["FailedNodes"]["broken"]


def test_shipped_legacy_scheduler_config() -> None:
    """deploy/legacy/scheduler-config.yaml: one profile, the three verbs, and managedResources
    naming every NVIDIA-family HAMi resource the conversion reads, only ``nvidia.com/gpu``
    (which the device plugin advertises) counted by kube-scheduler."""
    from tessera.convert.hami import GPU, NVIDIA

    cfg = yaml.safe_load(
        (
            Path(__file__).resolve().parents[2] / "deploy" / "legacy" / "scheduler-config.yaml"
        ).read_text()
    )
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["tessera-legacy"]
    (ext,) = cfg["extenders"]
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"]) == (
        "filter",
        "prioritize",
        "bind",
    )
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False
    managed = {m["name"]: m["ignoredByScheduler"] for m in ext["managedResources"]}
    assert set(managed) == set(NVIDIA.names())
    assert {n for n, ignored in managed.items() if not ignored} == {GPU}


def test_a_node_takes_one_allocating_pod_at_a_time() -> None:
    """bind's wait (``allocating_pod``): a pod of the node still ``allocating`` holds it, until
    its plugin's Allocate ends (``success``/``failed``), it finishes, is deleted, or 5 minutes
    pass; the pod being bound does not hold it against itself."""

    def pod(name: str, phase: str = "allocating", age: int = 10, **extra: Any) -> dict[str, Any]:
        md: dict[str, Any] = {
            "namespace": "team",
            "name": name,
            "uid": f"uid-{name}",
            "annotations": {"hami.io/bind-phase": phase, "hami.io/bind-time": str(1000 - age)},
        }
        md.update(extra.pop("metadata", {}))
        return {"metadata": md, "status": {"phase": "Pending"}, **extra}

    assert allocating_pod([pod("a")], "uid-b", 1000.0) == "team/a"
    assert allocating_pod([pod("a")], "uid-a", 1000.0) is None
    assert allocating_pod([pod("a", "success"), pod("c", "failed")], "uid-b", 1000.0) is None
    assert allocating_pod([pod("a", status={"phase": "Failed"})], "uid-b", 1000.0) is None
    deleting = pod("a", metadata={"deletionTimestamp": "2026-12-04T00:00:00Z"})
    assert allocating_pod([deleting], "uid-b", 1000.0) is None
    assert allocating_pod([pod("a", age=ALLOCATING_EXPIRY_SECONDS)], "uid-b", 1000.0) is None
    assert allocating_pod([pod("a", age=ALLOCATING_EXPIRY_SECONDS - 1)], "uid-b", 1000.0)
