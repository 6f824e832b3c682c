"""DaemonSets as their controller expands them: one pod per eligible node.

Kubernetes' DaemonSet controller (``pkg/controller/daemon``) runs a pod on a node when the
pod template's ``nodeName`` (if any) is that node, its ``nodeSelector`` and required node
affinity match the node, and the node has no NoSchedule/NoExecute taint the pod does not
tolerate, counting the tolerations the controller adds to every daemon pod
(``AddOrUpdateDaemonPodTolerations``): ``node.kubernetes.io/not-ready`` and
``unreachable`` (NoExecute), ``disk-pressure``, ``memory-pressure``, ``pid-pressure`` and
``unschedulable`` (NoSchedule), and ``network-unavailable`` (NoSchedule) for a
``hostNetwork`` pod. Each pod it makes is pinned to its node by replacing the required node
affinity's terms with ``matchFields: metadata.name In [<node>]``, and kube-scheduler then
schedules it like any pod (its claims must fit there).

Pods are named ``<daemonset>-<node>`` (the controller uses ``generateName``), in node order,
at the DaemonSet's place in the input. Pure code over the simulation's nodes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from tessera.allocator.model import Node
from tessera.api.errors import ManifestError
from tessera.api.loader import Manifest, object_name, template_with_spec
from tessera.api.uids import uuid5_url
from tessera.api.validation import is_dns_subdomain
from tessera.api.workloads import pod_template
from tessera.scheduler.nodes import node_refusal
from tessera.sim.cluster import SimNode

#: The tolerations the DaemonSet controller adds to every daemon pod, in its order
#: (``k8s.io/kubernetes/pkg/controller/daemon/util.AddOrUpdateDaemonPodTolerations``).
DAEMON_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
#: Added only for a ``hostNetwork`` pod.
HOST_NETWORK_TOLERATION = {
    "key": "node.kubernetes.io/network-unavailable",
    "operator": "Exists",
    "effect": "NoSchedule",
}


def _same_toleration(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """``v1.Toleration.MatchToleration``: same key, operator, value and effect."""
    return all((a.get(k) or "") == (b.get(k) or "") for k in ("key", "value", "effect")) and (
        a.get("operator") or "Equal"
    ) == (b.get("operator") or "Equal")


def daemon_tolerations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod spec's tolerations with the controller's added, as
    ``AddOrUpdateTolerationInPodSpec`` does: a toleration matching one of them is replaced by
    it, else it is appended. A new list."""
    out = [dict(t) for t in spec.get("tolerations") or [] if isinstance(t, dict)]
    adds = list(DAEMON_TOLERATIONS)
    if spec.get("hostNetwork") is True:
        adds.append(HOST_NETWORK_TOLERATION)
    for add in adds:
        hits = [i for i, t in enumerate(out) if _same_toleration(t, add)]
        if any(out[i] == add for i in hits):
            continue
        if hits:
            for i in hits:
                out[i] = dict(add)
        else:
            out.append(dict(add))
    return out


def pin_to_node(affinity: Any, node: str) -> dict[str, Any]:
    """``ReplaceDaemonSetPodNodeNameNodeAffinity``: the required node affinity's terms become
    one term ``matchFields: metadata.name In [node]``; everything else is kept. A new dict."""
    out: dict[str, Any] = copy.deepcopy(affinity) if isinstance(affinity, dict) else {}
    na = out.get("nodeAffinity")
    if not isinstance(na, dict):
        na = out["nodeAffinity"] = {}
    req = na.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not isinstance(req, dict):
        req = na["requiredDuringSchedulingIgnoredDuringExecution"] = {}
    req["nodeSelectorTerms"] = [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    ]
    return out


def eligible(template_spec: dict[str, Any], node: SimNode) -> bool:
    """Whether the DaemonSet controller runs a pod of this template on ``node``
    (``nodeShouldRunDaemonPod``: nodeName, nodeSelector and required node affinity through
    :func:`tessera.scheduler.nodes.node_refusal`, taints against the daemon tolerations)."""
    probe = {"spec": {**template_spec, "tolerations": daemon_tolerations(template_spec)}}
    return node_refusal(probe, Node(node.name, node.labels), node.taints) is None


def _pod_name(base: str, node: str) -> str:
    name = f"{base}-{node}"
    if is_dns_subdomain(name):
        return name
    return f"{base[:200]}-{uuid5_url(f'tessera-sim/daemonset/{base}/{node}')[:8]}"


def expand_daemonsets(
    manifests: Iterable[Manifest],
    nodes: Sequence[SimNode],
    *,
    max_pods: int,
    notes: list[str] | None = None,
) -> Iterator[Manifest]:
    """Every manifest, each DaemonSet replaced by its pods on ``nodes`` (module docstring).
    A DaemonSet no node is eligible for is said in ``notes``. More than ``max_pods`` Pods in
    all is a :class:`ManifestError` naming the DaemonSet, raised before any of its pods."""
    listed = list(manifests)
    pods = sum(1 for m in listed if m.kind == "Pod")
    for m in listed:
        if m.kind != "DaemonSet":
            yield m
            continue
        raw, tpath = pod_template(m.obj, "DaemonSet")
        template = template_with_spec(m, raw, tpath)
        spec = template["spec"]
        targets = [n for n in nodes if eligible(spec, n)]
        if pods + len(targets) > max_pods:
            raise ManifestError(
                f"{len(targets):,} pods (one per eligible node) would bring the input to "
                f"{pods + len(targets):,}, over the limit of {max_pods:,}: raise the limit with --max-pods",
                file=m.source.file,
                doc=m.source.doc,
                obj=m.ref(),
            )
        pods += len(targets)
        if not targets and notes is not None:
            notes.append(
                f"{m.source}: {m.ref()}: no node is eligible (node selector, node affinity or "
                "untolerated taints): the DaemonSet makes no pod"
            )
        base = object_name(m.obj) or "daemonset"
        ns = (m.obj.get("metadata") or {}).get("namespace")
        for node in targets:
            md = copy.deepcopy(template.get("metadata") or {})
            md.pop("generateName", None)
            md["name"] = _pod_name(base, node.name)
            if ns:
                md["namespace"] = ns
            pod_spec = copy.deepcopy(spec)
            pod_spec["tolerations"] = daemon_tolerations(spec)
            pod_spec["affinity"] = pin_to_node(spec.get("affinity"), node.name)
            yield Manifest(
                {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": pod_spec},
                m.source,
                owner=m.ref(),
                extra={"template": tpath, "validated": m.extra.get("validated", False)},
            )
