"""Placement policies for simulation and planning (Tessera's, beyond upstream's first fit).

A policy has two halves, as in HAMi: which **node** to try first, and which **GPU** on it.

| policy | nodes | GPUs on a node |
|---|---|---|
| ``first-fit`` | cluster order | upstream order (pool, slice, device) -- what kube-scheduler does |
| ``binpack`` | most allocated first | most allocated first |
| ``spread`` | least allocated first | least allocated first |
| ``topology`` | most allocated first | a multi-GPU request first tries GPUs of one NVLink domain, then of one NUMA node, then any; single GPUs binpack |

"Allocated" is the fraction of memory plus the fraction of cores booked (0..2 per GPU; a GPU
held by a dedicated allocation counts as full). Ties keep cluster / upstream order. Pods may
choose per pod with HAMi's annotations ``hami.io/node-scheduler-policy`` (binpack | spread)
and ``hami.io/gpu-scheduler-policy`` (binpack | spread | topology-aware).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from tessera.allocator.model import AllocatedState, Device
from tessera.convert.convert import TOPOLOGY_ATTRIBUTES

POLICIES = ("first-fit", "binpack", "spread", "topology")
NODE_POLICY_ANNOTATION = "hami.io/node-scheduler-policy"
GPU_POLICY_ANNOTATION = "hami.io/gpu-scheduler-policy"

#: kube-scheduler's weight for one allocated firstAvailable subrequest at index 0
#: (``resourceapi.FirstAvailableDeviceRequestMaxSize``); index i scores 8 - i.
FIRST_AVAILABLE_MAX = 8


@dataclass(frozen=True)
class PodPolicy:
    """The node order and GPU order one pod is placed with."""

    nodes: str  # first-fit | binpack | spread
    gpus: str  # first-fit | binpack | spread | topology


def pod_policy(default: str, annotations: Mapping[str, Any]) -> PodPolicy:
    """The policy for a pod: the run's ``default`` overridden by HAMi's pod annotations.

    Unknown annotation values are ignored (the run's default applies), as the webhook warns.
    """
    base = PodPolicy(
        nodes="binpack" if default == "topology" else default,
        gpus=default,
    )
    node = str(annotations.get(NODE_POLICY_ANNOTATION, "")).strip()
    gpu = str(annotations.get(GPU_POLICY_ANNOTATION, "")).strip().split(",")[0].strip()
    nodes = node if node in ("binpack", "spread") else base.nodes
    gpus = {"binpack": "binpack", "spread": "spread", "topology-aware": "topology"}.get(
        gpu, base.gpus
    )
    return PodPolicy(nodes, gpus)


def device_usage(state: AllocatedState, d: Device) -> Fraction:
    """Fraction of memory plus fraction of cores booked on ``d`` (dedicated: 2)."""
    if d.id in state.dedicated:
        return Fraction(2)
    agg = state.aggregated.get(d.id)
    if not agg:
        return Fraction(0)
    used = Fraction(0)
    for name in ("memory", "cores"):
        cap = d.capacity.get(name)
        if cap is not None and cap.value.value > 0:
            used += Fraction(agg.get(name, 0)) / cap.value.value
    return used


def device_rank(policy: str, state: AllocatedState) -> Callable[[Device], Any] | None:
    """The allocator's ``device_rank`` for a GPU policy; None keeps upstream order."""
    if policy in ("binpack", "topology"):
        return lambda d: -device_usage(state, d)
    if policy == "spread":
        return lambda d: device_usage(state, d)
    return None


def node_usage(state: AllocatedState, slices: Iterable[Any]) -> Fraction:
    """A node's usage for binpack/spread: :func:`device_usage` summed over the devices of its
    slices (``tessera.allocator`` slices, e.g. ``SliceIndex.by_node[node]``). One judgement for
    ``tessera simulate`` and the scheduler extender (``tessera extender``)."""
    return sum((device_usage(state, d) for sl in slices for d in sl.devices), Fraction(0))


def prioritized_list_score(
    claims: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]]
) -> int:
    """kube-scheduler's DynamicResources node score (v1.37 ``computeScore``): for each claim and
    each of its ``firstAvailable`` requests, ``8 - i`` where i is the index of the subrequest
    its allocation ``results`` (one ``AllocationResult`` per claim) chose. Claims without
    ``firstAvailable`` score 0. A node where earlier (preferred) alternatives fit scores higher."""
    score = 0
    for claim, res in zip(claims, results, strict=True):
        chosen = {r.get("request") for r in (res.get("devices") or {}).get("results") or []}
        for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            for i, sub in enumerate(r.get("firstAvailable") or []):
                if f"{r.get('name')}/{sub.get('name')}" in chosen:
                    score += FIRST_AVAILABLE_MAX - i
    return score


def max_prioritized_list_score(claims: Sequence[Mapping[str, Any]]) -> int:
    """The best :func:`prioritized_list_score` ``claims`` can get: every first subrequest chosen."""
    return sum(
        FIRST_AVAILABLE_MAX
        for c in claims
        for r in ((c.get("spec") or {}).get("devices") or {}).get("requests") or []
        if r.get("firstAvailable")
    )


def order_nodes(policy: str, node_usage: Sequence[Fraction]) -> list[int]:
    """Node indices in the order to try: ``node_usage[i]`` is node i's summed device usage."""
    idx = list(range(len(node_usage)))
    if policy == "binpack":
        idx.sort(key=lambda i: -node_usage[i])
    elif policy == "spread":
        idx.sort(key=lambda i: node_usage[i])
    return idx


def topology_variants(claims: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Stricter copies of ``claims`` to try first: multi-GPU requests kept on one NVLink domain,
    then on one NUMA node. The last variant is the claims unchanged. Only the search sees the
    copies; any allocation they yield satisfies the original claims too.
    """
    multi = [
        r.get("name")
        for c in claims
        for r in ((c.get("spec") or {}).get("devices") or {}).get("requests") or []
        if int((r.get("exactly") or {}).get("count") or 1) > 1
    ]
    if not multi:
        return [list(claims)]
    variants = []
    for attr in TOPOLOGY_ATTRIBUTES:
        variant = []
        for c in claims:
            c2 = copy.deepcopy(c)
            devs = c2.setdefault("spec", {}).setdefault("devices", {})
            names = [
                r.get("name")
                for r in devs.get("requests") or []
                if int((r.get("exactly") or {}).get("count") or 1) > 1
            ]
            cons = devs.setdefault("constraints", [])
            for n in names:
                cons.append({"requests": [n], "matchAttribute": attr})
            variant.append(c2)
        variants.append(variant)
    variants.append(list(claims))
    return variants
