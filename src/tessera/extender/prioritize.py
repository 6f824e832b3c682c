"""The ``prioritize`` verb of kube-scheduler's HTTP extender protocol (``k8s.io/kube-scheduler/extender/v1``).

Request: ``ExtenderArgs`` ``{"Pod": {...}, "Nodes": {"items": [...]}}`` or, with
``nodeCacheCapable: true``, ``{"Pod": {...}, "NodeNames": [...]}``. Reply: ``HostPriorityList``
``[{"Host": name, "Score": 0..10}]`` (``MaxExtenderPriority`` = 10); kube-scheduler adds
``Score x weight x 10`` to each node's total.

Scores follow :func:`tessera.scheduler.policies.order_nodes` over :func:`~tessera.scheduler.policies.node_usage`
(what ``tessera simulate`` tries first is what scores highest): the nodes at the policy's best
usage score 10, the next usage level 5, then 4, 3, ... 0. A pod without a node policy (and no
``--default-node-policy``) scores 0 everywhere, leaving the choice to the scheduler.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from tessera.allocator import SliceIndex
from tessera.allocator.model import AllocatedState
from tessera.scheduler.policies import node_usage, order_nodes, pod_policy

MAX_PRIORITY = 10
#: Node policies (HAMi's ``hami.io/node-scheduler-policy`` values; ``first-fit``: no opinion).
NODE_POLICIES = ("first-fit", "binpack", "spread")


class BadArgs(ValueError):
    """The body is not an ExtenderArgs (HTTP 400)."""


class UsageView:
    """Per node, the usage of its devices (:func:`~tessera.scheduler.policies.node_usage`) from
    ResourceSlices and allocated ResourceClaims. ``source`` returns ``(generation, slices,
    claims)``; usage is recomputed only when the generation changes."""

    def __init__(
        self,
        source: Callable[[], tuple[Any, Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]]],
    ) -> None:
        self.source = source
        self._lock = threading.Lock()
        self._generation: Any = None
        self._usage: dict[str, Fraction] = {}

    @classmethod
    def static(
        cls, slices: Sequence[Mapping[str, Any]], claims: Sequence[Mapping[str, Any]]
    ) -> UsageView:
        return cls(lambda: (0, slices, claims))

    def usage(self) -> dict[str, Fraction]:
        """Node name -> summed device usage (memory fraction + cores fraction per device)."""
        with self._lock:
            gen, slices, claims = self.source()
            if gen != self._generation or self._generation is None:
                index = SliceIndex(list(slices))
                state = AllocatedState.from_claims(
                    c for c in claims if (c.get("status") or {}).get("allocation")
                )
                self._usage = {
                    node: node_usage(state, sl) for node, sl in index.by_node.items() if node
                }
                self._generation = gen
            return dict(self._usage)


def node_names(args: Mapping[str, Any]) -> list[str]:
    """The candidate nodes of an ExtenderArgs, in the order given."""
    names = args.get("NodeNames")
    if isinstance(names, list):
        return [str(n) for n in names]
    nodes = args.get("Nodes")
    if isinstance(nodes, Mapping):
        return [
            str((n.get("metadata") or {}).get("name"))
            for n in nodes.get("items") or []
            if isinstance(n, Mapping)
        ]
    raise BadArgs("ExtenderArgs has neither NodeNames nor Nodes.items")


def scores(
    policy: str, usage: Mapping[str, Fraction], names: Sequence[str]
) -> list[dict[str, Any]]:
    """``HostPriorityList`` for ``names`` under ``policy`` (``first-fit``/``binpack``/``spread``)."""
    if policy not in ("binpack", "spread"):
        return [{"Host": n, "Score": 0} for n in names]
    values = [usage.get(n, Fraction(0)) for n in names]
    order = order_nodes(policy, values)
    level_of: dict[Fraction, int] = {}
    for i in order:
        level_of.setdefault(values[i], len(level_of))
    out = []
    for n, v in zip(names, values, strict=True):
        level = level_of[v]
        out.append({"Host": n, "Score": MAX_PRIORITY if level == 0 else max(0, 6 - level)})
    return out


def prioritize(
    args: Any, view: UsageView, default_policy: str = "first-fit"
) -> list[dict[str, Any]]:
    """The reply to one ``prioritize`` call. Raises :class:`BadArgs` for a malformed body."""
    if not isinstance(args, Mapping):
        raise BadArgs("ExtenderArgs must be a JSON object")
    pod = args.get("Pod")
    if not isinstance(pod, Mapping):
        raise BadArgs("ExtenderArgs.Pod is missing")
    names = node_names(args)
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if not isinstance(annotations, Mapping):
        annotations = {}
    policy = pod_policy(default_policy, annotations).nodes
    if policy not in ("binpack", "spread"):
        return scores("first-fit", {}, names)
    return scores(policy, view.usage(), names)
