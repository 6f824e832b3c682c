"""kube-scheduler's node filters that come before the DynamicResources plugin's allocation.

One decision, :func:`node_refusal`: whether a pod may use a node at all, and if not which
filter refused it. The simulation's loop and its pending reasons, ``explain``, and the
DaemonSet controller's node choice all call it, so a rule changes in one place:

1. **NodeAffinity** (``spec.nodeName``, ``spec.nodeSelector``, the required node affinity;
   :func:`pod_fits_node`); its PreFilter narrows the nodes first where every term names nodes
   by ``metadata.name`` (:func:`affinity_node_names`, a DaemonSet pod's pin).
2. **TaintToleration**: a ``NoSchedule``/``NoExecute`` taint the pod does not tolerate
   (:func:`untolerated_taint`).
3. **DynamicResources**, its first check: a claim of the pod already allocated with a
   ``status.allocation.nodeSelector`` this node does not match (KEP-4381, "resourceclaim not
   available on the node").

Node CPU, memory and pod count are not modelled.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.allocator.core import tolerates
from tessera.allocator.model import Node, node_selector_matches


class NodeFilter(enum.Enum):
    """The filter that refused a node, in the order kube-scheduler runs them."""

    #: NodeAffinity's PreFilter left the node out (every term pins nodes by name).
    AFFINITY_PREFILTER = "affinity-prefilter"
    #: NodeAffinity's Filter: nodeName, nodeSelector or the required node affinity.
    AFFINITY = "affinity"
    #: TaintToleration: a NoSchedule/NoExecute taint the pod does not tolerate.
    TAINT = "taint"
    #: DynamicResources: a claim of the pod is allocated for other nodes.
    CLAIM_ELSEWHERE = "claim-elsewhere"


@dataclass(frozen=True)
class NodeRefusal:
    """Why a pod may not use a node, before any device is looked at.

    ``filter``: which filter refused; ``taint``: the untolerated taint (``{key, value,
    effect}``) for :attr:`NodeFilter.TAINT`; ``claim``: the claim allocated elsewhere for
    :attr:`NodeFilter.CLAIM_ELSEWHERE`.
    """

    filter: NodeFilter
    taint: Mapping[str, str] | None = None
    claim: Mapping[str, Any] | None = None

    @property
    def reason(self) -> str:
        """kube-scheduler's words for this refusal in a FitError (``0/N nodes are available:
        <count> <reason>``), as its plugins write them."""
        if self.filter is NodeFilter.AFFINITY_PREFILTER:
            return "node(s) didn't satisfy plugin(s) [NodeAffinity]"
        if self.filter is NodeFilter.AFFINITY:
            return "node(s) didn't match Pod's node affinity/selector"
        if self.filter is NodeFilter.TAINT:
            return f"node(s) had untolerated taint {_taint_text(self.taint)}"
        return "resourceclaim not available on the node"

    @property
    def explanation(self) -> str:
        """The same refusal said of one node, for ``tessera explain`` (the claim allocated
        elsewhere is named)."""
        if self.filter in (NodeFilter.AFFINITY_PREFILTER, NodeFilter.AFFINITY):
            return "didn't match Pod's node affinity/selector"
        if self.filter is NodeFilter.TAINT:
            return f"had untolerated taint {_taint_text(self.taint)}"
        md = (self.claim or {}).get("metadata") or {}
        ref = f"{md.get('namespace') or 'default'}/{md.get('name') or ''}"
        return f"resourceclaim not available on the node: claim {ref} is allocated for another node"


def _taint_text(taint: Mapping[str, str] | None) -> str:
    t = taint or {}
    return f"{{{t.get('key', '')}: {t.get('value', '')}}}"


def node_refusal(
    pod: Mapping[str, Any],
    node: Node,
    taints: Sequence[Mapping[str, str]] = (),
    allocated: Sequence[Mapping[str, Any]] = (),
) -> NodeRefusal | None:
    """The first of kube-scheduler's node filters that refuses ``node`` for ``pod``, or None
    when the pod may use it (its claims still to be allocated there).

    ``pod``: a Pod dict; ``taints``: the node's ``spec.taints``; ``allocated``: the pod's
    claims that already have a ``status.allocation``. The checks, in kube-scheduler's order:
    NodeAffinity (with its PreFilter), TaintToleration, then DynamicResources' check of the
    allocated claims' ``nodeSelector``.
    """
    if not pod_fits_node(pod, node):
        names = affinity_node_names(pod)
        if names is not None and node.name not in names:
            return NodeRefusal(NodeFilter.AFFINITY_PREFILTER)
        return NodeRefusal(NodeFilter.AFFINITY)
    taint = untolerated_taint(pod, taints)
    if taint is not None:
        return NodeRefusal(NodeFilter.TAINT, taint=taint)
    for c in allocated:
        sel = ((c.get("status") or {}).get("allocation") or {}).get("nodeSelector")
        if sel is not None and not node_selector_matches(sel, node):
            return NodeRefusal(NodeFilter.CLAIM_ELSEWHERE, claim=c)
    return None


def untolerated_taint(
    pod: Mapping[str, Any], taints: Sequence[Mapping[str, str]]
) -> Mapping[str, str] | None:
    """The first NoSchedule/NoExecute node taint the pod does not tolerate (kube-scheduler's
    TaintToleration filter), or None."""
    if not taints:
        return None
    tols = (pod.get("spec") or {}).get("tolerations") or []
    for t in taints:
        if t.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
            tols, t.get("key", ""), t.get("value", ""), t["effect"]
        ):
            return t
    return None


def affinity_node_names(pod: Mapping[str, Any]) -> set[str] | None:
    """The node names NodeAffinity's PreFilter narrows scheduling to: when every term of the
    required node affinity has ``matchFields`` ``metadata.name In [...]`` (as the DaemonSet
    controller pins its pods), the union over terms of each term's intersection; None when
    some term does not name nodes (every node is a candidate)."""
    req = (((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    terms = (req or {}).get("nodeSelectorTerms") or []
    if not terms:
        return None
    out: set[str] = set()
    for t in terms:
        names: set[str] | None = None
        for r in (t or {}).get("matchFields") or []:
            if r.get("key") == "metadata.name" and r.get("operator") == "In":
                vals = {str(v) for v in r.get("values") or []}
                names = vals if names is None else names & vals
        if names is None:
            return None
        out |= names
    return out


def pod_fits_node(pod: Mapping[str, Any], node: Node) -> bool:
    """NodeAffinity's Filter: ``spec.nodeName`` (when set) is the node, every
    ``spec.nodeSelector`` label matches, and the required node affinity
    (``requiredDuringSchedulingIgnoredDuringExecution``) selects the node."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName") and spec["nodeName"] != node.name:
        return False
    for k, v in (spec.get("nodeSelector") or {}).items():
        if node.labels.get(k) != str(v):
            return False
    req = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return not (req and not node_selector_matches(req, node))
