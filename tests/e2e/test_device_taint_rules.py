"""DeviceTaintRules (KEP-5055, GA in 1.37): `tessera simulate` predicts what the real
kube-scheduler does with them (issue 22.2).

Random scenarios, generated here: one to three DeviceTaintRules (every selector form: omitted,
empty, by driver, pool, device and their combinations, matching and not; every effect) are
created on the real control plane, then pods one at a time, each with its own claim template
asking a share or a whole GPU, with tolerations that match the rules' taints by any field or
miss them. Single node (the corpus' 8x H100), so nothing is random on the scheduler's side:
the set of scheduled and pending pods, the scheduler part of each pending reason and every
claim's allocation (device, consumed capacity, tolerations copied into the result) must be
what ``tessera simulate`` predicts from the same objects; a pod the device taint eviction
controller deletes (a NoExecute taint its claim tolerates only without ``effect: NoExecute``)
is one simulate reports "scheduled on NODE, then evicted".
``TESSERA_TAINT_SEEDS=START:STOP`` explores other seeds (default 0:4).
"""

from __future__ import annotations

import copy
import json
import os
import random
import time
from typing import Any

import pytest
from click.testing import CliRunner

from tessera.cli import main
from tessera.kube.client import ApiError, KubeClient, Obj
from tessera.kube.workloads import apply_objects, gpu_claim_template, gpu_pod, wait_for

from .conftest import H100_INVENTORY, StartCluster, corpus_node
from .test_simulate import (
    comparable,
    live_allocations,
    scheduler_part,
    sim_allocations,
    simulate,
    wait_verdict,
)

pytestmark = pytest.mark.cluster

RESOURCE = "resource.k8s.io/v1"
NODE = "h100-node"
DRIVER = "gpu.tessera.dev"
KEYS = ["example.com/maintenance", "example.com/health"]
VALUES = ["planned", "xid-79", ""]
EFFECTS = ["NoSchedule", "NoExecute", "None"]
_lo, _, _hi = os.environ.get("TESSERA_TAINT_SEEDS", "0:4").partition(":")
SEEDS = range(int(_lo), int(_hi))


def _selector(rng: random.Random) -> dict[str, Any] | None:
    kind = rng.choice(["omitted", "empty", "driver", "pool", "device", "pool+device", "miss"])
    if kind == "omitted":
        return None
    if kind == "empty":
        return {}
    if kind == "driver":
        return {"driver": DRIVER}
    if kind == "pool":
        return {"driver": DRIVER, "pool": NODE} if rng.random() < 0.5 else {"pool": NODE}
    dev = {"device": f"gpu-{rng.randrange(8)}"}
    if kind == "device":
        return dev
    if kind == "pool+device":
        return {"pool": NODE, **dev}
    return rng.choice([{"driver": "nic.example.com"}, {"pool": "other-node"}, {**dev, "pool": "x"}])


def rules(rng: random.Random) -> list[Obj]:
    out = []
    for i in range(rng.randint(1, 3)):
        spec: dict[str, Any] = {
            "taint": {
                "key": rng.choice(KEYS),
                "value": rng.choice(VALUES),
                "effect": rng.choice(EFFECTS),
            }
        }
        if not spec["taint"]["value"]:
            del spec["taint"]["value"]
        sel = _selector(rng)
        if sel is not None:
            spec["deviceSelector"] = sel
        out.append(
            {
                "apiVersion": RESOURCE,
                "kind": "DeviceTaintRule",
                "metadata": {"name": f"rule-{i}"},
                "spec": spec,
            }
        )
    return out


def _toleration(rng: random.Random, taints: list[dict[str, str]]) -> dict[str, str]:
    t = rng.choice(taints) if taints else {"key": KEYS[0], "effect": "NoSchedule"}
    kind = rng.choice(["exists", "equal", "wrong-value", "wrong-effect", "all", "no-effect"])
    if kind == "all":
        return {"operator": "Exists"}
    tol: dict[str, str] = {"key": t["key"], "effect": t["effect"]}
    if kind == "exists":
        tol["operator"] = "Exists"
    elif kind == "equal":
        tol["operator"] = "Equal"
        tol["value"] = t.get("value", "")
    elif kind == "wrong-value":
        tol["value"] = "other"
    elif kind == "wrong-effect":
        tol["operator"] = "Exists"
        tol["effect"] = "NoExecute" if t["effect"] == "NoSchedule" else "NoSchedule"
    else:
        tol["operator"] = "Exists"
        del tol["effect"]
    if not tol.get("value"):
        tol.pop("value", None)
    return tol


def workload(rng: random.Random, taints: list[dict[str, str]], ns: str) -> list[tuple[Obj, Obj]]:
    """(claim template, pod) pairs, one per pod."""
    out = []
    for i in range(rng.randint(8, 12)):
        mem, cores = rng.choice(
            [("10Gi", "10"), ("20Gi", "25"), ("40Gi", "50"), (None, None), ("70Gi", None)]
        )
        name = f"p{i:02d}"
        tpl = gpu_claim_template(name, namespace=ns, memory=mem, cores=cores)
        if rng.random() < 0.6:
            tols = [_toleration(rng, taints) for _ in range(rng.randint(1, 2))]
            tpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"] = tols
        out.append((tpl, gpu_pod(name, namespace=ns, template=name)))
    return out


def _tolerations(alloc: Obj | None) -> list[list[dict[str, Any]]] | None:
    """The tolerations of each result, as the API server stores them (operator defaulted)."""
    if alloc is None:
        return None
    return [
        [{"operator": "Equal", **t} for t in r.get("tolerations") or []]
        for r in alloc["devices"]["results"]
    ]


@pytest.mark.parametrize("seed", SEEDS)
def test_device_taint_rules_match_the_scheduler(fresh_cluster: StartCluster, seed: int) -> None:
    rng = random.Random(seed)
    nodes = [corpus_node(NODE, H100_INVENTORY)]
    live = fresh_cluster(nodes)
    client = live.client
    ns = "default"
    rule_objs = rules(rng)
    apply_objects(client, copy.deepcopy(rule_objs))
    # The scheduler reads rules through an informer: give it a moment to see them.
    time.sleep(3)
    taints = [r["spec"]["taint"] for r in rule_objs]
    sim_objects: list[Obj] = list(copy.deepcopy(rule_objs))
    verdicts: dict[str, tuple[str | None, str]] = {}
    for tpl, pod in workload(rng, taints, ns):
        name = pod["metadata"]["name"]
        apply_objects(client, [tpl, pod])
        sim_objects += [tpl, pod]
        # What simulate expects of this pod decides how long to watch it: a pod it predicts
        # evicted must disappear (and its claim with it) before the next pod comes.
        expect = simulate(nodes, sim_objects)
        evicted = any(p.pod == f"{ns}/{name}" and EVICTED in p.reason for p in expect.pending)
        verdicts[name] = _verdict(client, name, ns, evicted)
    result = simulate(nodes, sim_objects)
    live_scheduled = [p for p, (node, _) in verdicts.items() if node is not None]
    live_pending = {p: scheduler_part(msg) for p, (node, msg) in verdicts.items() if node is None}
    context = f"seed {seed}: rules {[r['spec'] for r in rule_objs]}"
    assert [r.split("/")[1] for r in result.scheduled] == live_scheduled, context
    assert {
        p.pod.split("/")[1]: EVICTED if EVICTED in p.reason else scheduler_part(p.reason)
        for p in result.pending
    } == live_pending, context
    live_allocs = live_allocations(client, ns)
    sim_allocs = sim_allocations(result)
    for pod, refs in live_allocs.items():
        assert {ref: comparable(a) for ref, a in refs.items()} == {
            ref: comparable(a) for ref, a in sim_allocs[pod].items()
        }, (context, pod)
        assert {ref: _tolerations(a) for ref, a in refs.items()} == {
            ref: _tolerations(a) for ref, a in sim_allocs[pod].items()
        }, (context, pod)


EVICTED = ", then evicted: "


def _verdict(client: KubeClient, name: str, ns: str, evicted: bool) -> tuple[str | None, str]:
    """The scheduler's verdict; for a pod simulate predicts evicted, ``(None, EVICTED)`` once
    the eviction controller deleted it and its generated claim is gone (or the verdict, if the
    pod stays)."""
    try:
        node, msg = wait_verdict(client, name, ns)
    except ApiError as e:
        if e.status != 404:
            raise
        return None, EVICTED  # deleted before the verdict was read
    if not evicted or node is None:
        return node, msg

    def gone() -> bool | None:
        try:
            client.get("v1", "Pod", name, ns)
            return None
        except ApiError as e:
            if e.status != 404:
                raise
        try:
            client.get(RESOURCE, "ResourceClaim", f"{name}-gpu", ns)
            return None
        except ApiError as e:
            if e.status != 404:
                raise
        return True

    try:
        wait_for(gone, timeout=30, what=f"the eviction of pod {ns}/{name}")
    except Exception:
        return node, msg
    return None, EVICTED


def test_live_mode_reads_the_clusters_rules(fresh_cluster: StartCluster) -> None:
    """`simulate --kubeconfig` reads the cluster's DeviceTaintRules: the pod the real scheduler
    left pending because of a rule is pending in the simulation, for that rule."""
    nodes = [corpus_node(NODE, H100_INVENTORY)]
    live = fresh_cluster(nodes)
    client = live.client
    fence = {
        "apiVersion": RESOURCE,
        "kind": "DeviceTaintRule",
        "metadata": {"name": "fence"},
        "spec": {
            "deviceSelector": {"driver": DRIVER},
            "taint": {"key": KEYS[0], "value": "planned", "effect": "NoSchedule"},
        },
    }
    apply_objects(client, [fence])
    time.sleep(3)
    apply_objects(
        client,
        [gpu_claim_template("t", memory="10Gi", cores="10"), gpu_pod("blocked", template="t")],
    )
    node, msg = wait_verdict(client, "blocked", "default")
    assert (
        node is None
        and scheduler_part(msg) == "0/1 nodes are available: 1 cannot allocate all claims"
    )
    r = CliRunner().invoke(main, ["simulate", "--kubeconfig", str(live.kubeconfig), "-o", "json"])
    assert r.exit_code == 0, r.output
    items = json.loads(r.stdout)["items"]
    assert [o["metadata"]["name"] for o in items if o["kind"] == "DeviceTaintRule"] == ["fence"]
    (pod,) = [o for o in items if o["kind"] == "Pod"]
    msg = pod["status"]["conditions"][0]["message"]
    assert (
        "8 GPUs tainted example.com/maintenance=planned:NoSchedule (DeviceTaintRule fence) (not tolerated)"
        in msg
    ), msg
