"""Placement policies for simulation and planning (Tessera's, beyond upstream's first fit).

A policy has two halves, as in HAMi: which **node** to try first, and which **GPU** on it.

| policy | nodes | GPUs on a node |
|---|---|---|
| ``first-fit`` | cluster order | upstream order (pool, slice, device) -- what kube-scheduler does |
| ``binpack`` | most allocated first | most allocated first |
| ``spread`` | least allocated first | least allocated first |
| ``topology`` | the best topology tier anywhere in the cluster, then most allocated first | a multi-GPU request takes, in this order of preference, GPUs of one NVLink domain and one NUMA node, of one NUMA node, of one NVLink domain, then any; single GPUs binpack |

"Allocated" is the fraction of memory plus the fraction of cores booked (0..2 per GPU; a GPU
held by a dedicated allocation counts as full). Ties keep cluster / upstream order. Under
``topology`` a placement split across NUMA nodes never ranks above one that is not, on any
node: the nodes are ranked by :func:`placement_rank` (the tier, then kube-scheduler's
``firstAvailable`` score, then the node order), and ``explain`` reports that ranking. Pods may
choose per pod with HAMi's annotations ``hami.io/node-scheduler-policy`` (binpack | spread)
and ``hami.io/gpu-scheduler-policy`` (binpack | spread | topology-aware).
"""  # noqa: E501 (a table row)

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from tessera.allocator.model import AllocatedState, Device
from tessera.api.requests import device_requests
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
        for r in device_requests(claim.get("spec")):
            for i, sub in enumerate(r.first_available):
                if sub.name in chosen:
                    score += FIRST_AVAILABLE_MAX - i
    return score


def max_prioritized_list_score(claims: Sequence[Mapping[str, Any]]) -> int:
    """The best :func:`prioritized_list_score` ``claims`` can get: every first subrequest chosen."""
    return sum(
        FIRST_AVAILABLE_MAX
        for c in claims
        for r in device_requests(c.get("spec"))
        if r.first_available
    )


def order_nodes(policy: str, node_usage: Sequence[Fraction]) -> list[int]:
    """Node indices in the order to try: ``node_usage[i]`` is node i's summed device usage."""
    idx = list(range(len(node_usage)))
    if policy == "binpack":
        idx.sort(key=lambda i: -node_usage[i])
    elif policy == "spread":
        idx.sort(key=lambda i: node_usage[i])
    return idx


#: The attributes the conversion's topology levels match (one definition: tessera.convert).
NVLINK_ATTRIBUTE, NUMA_ATTRIBUTE = TOPOLOGY_ATTRIBUTES
#: The topology policy's tiers, best first: what each multi-GPU request's GPUs share, and the
#: attributes its stricter copy of the claims matches (``matchAttribute``). A placement split
#: across NUMA nodes (tiers 2 and 3) never ranks above one that is not (tiers 0 and 1).
TOPOLOGY_TIERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("one NVLink domain and one NUMA node", (NVLINK_ATTRIBUTE, NUMA_ATTRIBUTE)),
    ("one NUMA node", (NUMA_ATTRIBUTE,)),
    ("one NVLink domain, split across NUMA nodes", (NVLINK_ATTRIBUTE,)),
    ("no shared NVLink domain or NUMA node", ()),
)


@dataclass(frozen=True, order=True)
class PlacementRank:
    """How a node's placement of a pod's claims ranks (lower is better): the topology tier
    (index into :data:`TOPOLOGY_TIERS`; 0 for a pod without multi-GPU requests or under
    another GPU policy), minus kube-scheduler's ``firstAvailable`` score
    (:func:`prioritized_list_score`), then the node's position in the policy's node order."""

    tier: int
    neg_score: int
    position: int


def placement_rank(tier: int, score: int, position: int) -> PlacementRank:
    """The one ranking of placements ``simulate`` picks by and ``explain`` reports."""
    return PlacementRank(tier, -score, position)


def node_order_text(policy: PodPolicy) -> str:
    """How the policy orders the nodes, in words (for ``explain``)."""
    return {
        "binpack": "most allocated first",
        "spread": "least allocated first",
    }.get(policy.nodes, "in cluster order")


def rank_text(policy: PodPolicy, rank: PlacementRank, multi_gpu: bool) -> str:
    """``rank`` in words: the topology tier (``topology`` with a multi-GPU request), the
    ``firstAvailable`` score where it counts, the node order."""
    parts = []
    if policy.gpus == "topology" and multi_gpu:
        parts.append(f"GPUs on {TOPOLOGY_TIERS[rank.tier][0]}")
    if rank.neg_score:
        parts.append(f"firstAvailable score {-rank.neg_score}")
    parts.append(f"node #{rank.position + 1} {node_order_text(policy)}")
    return ", ".join(parts)


def has_multi_gpu_request(claims: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a claim has an ``exactly`` request for more than one device."""
    return any(
        r.exactly is not None and r.exactly.count > 1
        for c in claims
        for r in device_requests(c.get("spec"))
    )


def topology_variants(claims: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Stricter copies of ``claims`` to try first, one per tier of :data:`TOPOLOGY_TIERS`
    (variant i is tier i): each multi-GPU request's devices constrained to match the tier's
    attributes. The last variant is the claims unchanged; without a multi-GPU request it is
    the only one. Only the search sees the copies; any allocation they yield satisfies the
    original claims too.
    """
    if not has_multi_gpu_request(claims):
        return [list(claims)]
    variants = []
    for _, attrs in TOPOLOGY_TIERS[:-1]:
        variant = []
        for c in claims:
            c2 = copy.deepcopy(c)
            devs = c2.setdefault("spec", {}).setdefault("devices", {})
            names = [
                r.name
                for r in device_requests(c2["spec"])
                if r.exactly is not None and r.exactly.count > 1
            ]
            cons = devs.setdefault("constraints", [])
            for n in names:
                for attr in attrs:
                    cons.append({"requests": [n], "matchAttribute": attr})
            variant.append(c2)
        variants.append(variant)
    variants.append(list(claims))
    return variants
