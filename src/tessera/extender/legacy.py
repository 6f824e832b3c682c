"""Legacy mode's extender verbs: ``filter``, ``prioritize`` and ``bind`` decided by Tessera's
allocator (:func:`tessera.scheduler.legacy.decide`) over the GPUs device plugins register on
Nodes (``hami.io/node-nvidia-register``) and the decisions recorded on pods.

kube-scheduler's HTTP extender protocol (``k8s.io/kube-scheduler/extender/v1``; Go field names,
which Go's decoder matches case-insensitively):

* ``filter``: ``ExtenderArgs`` ``{"Pod", "Nodes"|"NodeNames"}`` -> ``ExtenderFilterResult``
  ``{"NodeNames" (or "Nodes"), "FailedNodes": {node: reason}, "FailedAndUnresolvableNodes",
  "Error"}``: the nodes where the pod's HAMi requests fit; the others with the allocator's reason.
* ``prioritize``: ``ExtenderArgs`` -> ``HostPriorityList`` ``[{"Host", "Score": 0..10}]``: 10
  for the nodes the decision prefers (topology tier, then the node policy), then 5, 4, ... 0.
* ``bind``: ``ExtenderBindingArgs`` ``{"PodName", "PodNamespace", "PodUID", "Node"}`` ->
  ``ExtenderBindingResult`` ``{"Error"}``. The pod, the Node and the pods booked on it
  (label ``hami.io/vgpu-node``) are read afresh from the API server and the decision taken
  again; a pod that is gone, whose UID changed or that is being deleted, or that no longer fits,
  is refused (kube-scheduler puts it back in its queue). Then the decision is written on the pod
  in one merge patch carrying the pod's ``resourceVersion`` (a pod changed meanwhile is
  refused: 409), as HAMi writes it (``hami.io/vgpu-node`` annotation and label,
  ``vgpu-time``, ``vgpu-devices-to-allocate``, ``-allocated``, ``bind-phase=allocating``,
  ``bind-time``), and the ``Binding`` is POSTed with the pod's UID as precondition. A Binding
  that fails takes the records off again (a deleted pod takes them with it). Binds to one node
  are serialised in this process, and a node takes no second HAMi pod while one bound to it
waits for its device plugin's ``Allocate`` (:func:`allocating_pod`); several replicas would
need a lock per node in the API
  (HAMi's ``hami.io/mutex.lock`` node annotation, compare-and-swap on the Node's
  resourceVersion) or leader election (``docs/legacy-extender.md``).

Filter and prioritize read Nodes and pods from informers: a pod bound a moment ago may be
missing there, which bind's fresh read catches.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tessera.api.errors import TesseraError
from tessera.api.heap import collector_paused
from tessera.convert.hami import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    VGPU_TIME,
    encode_pod_devices,
)
from tessera.extender.prioritize import MAX_PRIORITY, BadArgs, node_names
from tessera.kube.client import ApiError, KubeClient
from tessera.scheduler.legacy import (
    BookedPods,
    Booking,
    Decision,
    DecisionMemo,
    LegacyNode,
    bookings,
    decide,
    legacy_node,
)

log = logging.getLogger("tessera.extender.legacy")
_NONE: Mapping[str, Any] = {}
_MISSING: Any = object()
RECORDS = (VGPU_NODE, VGPU_TIME, DEVICES_TO_ALLOCATE, DEVICES_ALLOCATED, BIND_PHASE, BIND_TIME)


def _get(args: Mapping[str, Any], name: str) -> Any:
    """A field of a Go struct sent as JSON: its Go name or any other case of it."""
    if name in args:
        return args[name]
    low = name.lower()
    return next((v for k, v in args.items() if k.lower() == low), None)


def _pod(args: Any) -> Mapping[str, Any]:
    if not isinstance(args, Mapping):
        raise BadArgs("ExtenderArgs must be a JSON object")
    pod = _get(args, "Pod")
    if not isinstance(pod, Mapping):
        raise BadArgs("ExtenderArgs.Pod is missing")
    return pod


def _names(args: Mapping[str, Any]) -> list[str]:
    return node_names({"NodeNames": _get(args, "NodeNames"), "Nodes": _get(args, "Nodes")})


def _version(pod: Mapping[str, Any]) -> tuple[str, str]:
    md = pod.get("metadata") or {}
    return str(md.get("uid") or ""), str(md.get("resourceVersion") or "")


class NodeCache:
    """:class:`~tessera.scheduler.legacy.LegacyNode` per Node, rebuilt only when the Node's
    ``resourceVersion`` changes (the register annotation is parsed once per change)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[str, LegacyNode | TesseraError]] = {}

    def node(self, obj: Mapping[str, Any]) -> LegacyNode | TesseraError:
        md = obj.get("metadata") or {}
        name, rv = str(md.get("name") or ""), str(md.get("resourceVersion") or "")
        hit = self._nodes.get(name)  # a dict read is atomic; writes take the lock
        if hit is not None and hit[0] == rv and rv:
            return hit[1]
        got: LegacyNode | TesseraError
        try:
            got = legacy_node(obj)
        except TesseraError as e:
            got = e
        with self._lock:
            self._nodes[name] = (rv, got)
        return got


class LegacyExtender:
    """The three verbs over a cluster's state. ``nodes(name)`` and ``pods()`` read the
    informers (filter, prioritize); ``client`` (None: bind refuses) is bind's fresh read and
    its writes. ``default_policy``: for pods without HAMi's policy annotations (``first-fit``,
    ``binpack``, ``spread``, ``topology``). ``now``: unix seconds for ``vgpu-time`` and
    ``bind-time``. ``pods_generation`` (optional): changes whenever ``pods()`` would answer
    differently (:attr:`tessera.kube.watch.Informer.generation`); while it stays, the bookings
    of the last call are reused."""

    def __init__(
        self,
        nodes: Callable[[str], Mapping[str, Any] | None],
        pods: Callable[[], Sequence[Mapping[str, Any]]],
        client: KubeClient | None,
        default_policy: str = "first-fit",
        now: Callable[[], float] = time.time,
        pods_generation: Callable[[], Any] | None = None,
    ) -> None:
        self.nodes = nodes
        self.pods = pods
        self.pods_generation = pods_generation
        self.client = client
        self.default_policy = default_policy
        self.now = now
        self.cache = NodeCache()
        self.memo = DecisionMemo()
        #: (informer generation, each pod version's booking or None, their grouping) of the
        #: last call: the next call's base
        self._booked: tuple[Any, dict[tuple[Any, Any], Booking | None], BookedPods] | None = None
        self._booked_lock = threading.Lock()
        self._last: tuple[tuple[str, str], Decision] | None = None
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    # ---- filter and prioritize ------------------------------------------------------------
    def _decide(
        self, pod: Mapping[str, Any], names: Sequence[str], objs: Sequence[Mapping[str, Any]]
    ) -> tuple[Decision, dict[str, str]]:
        """The decision over the nodes that read, and the reason of each that did not."""
        failed: dict[str, str] = {}
        known: list[LegacyNode] = []
        by_name = {str((o.get("metadata") or {}).get("name")): o for o in objs}
        for n in names:
            obj = by_name.get(n)
            if obj is None:
                failed[n] = "the extender has not seen this Node yet"
                continue
            got = self.cache.node(obj)
            if isinstance(got, TesseraError):
                failed[n] = str(got)
            else:
                known.append(got)
        # The cyclic collector would rescan the memo's many objects mid-call (tessera.api.heap).
        with collector_paused():
            booked = self._bookings()
            return (
                decide(pod, known, booked, default_policy=self.default_policy, memo=self.memo),
                failed,
            )

    def _bookings(self) -> BookedPods:
        """:func:`bookings` of the informer's pods, grouped by node (:class:`BookedPods`), once
        per generation of the informer: each pod version's record is decoded once, and the
        last call's grouping is carried over with only the pods that changed since (added,
        changed or gone) regrouped."""
        gen = self.pods_generation() if self.pods_generation is not None else None
        with self._booked_lock:
            last = self._booked
        if gen is not None and last is not None and last[0] == gen:
            return last[2]
        known = last[1] if last is not None else {}
        seen: dict[tuple[Any, Any], Booking | None] = {}
        added: list[Booking] = []
        new = 0  # versions not in ``known``
        for p in self.pods():
            md = p.get("metadata") or _NONE
            key = (md.get("uid"), md.get("resourceVersion"))
            if not (key[0] and key[1]):
                key = (None, id(p))  # (a pod dict made without them: known while it lives)
            elif key in seen:
                continue  # the same pod version listed twice: one booking
            b = known.get(key, _MISSING)
            if b is _MISSING:
                new += 1
                warnings: list[str] = []
                got = bookings([p], warnings)
                for w in warnings:
                    log.warning("%s", w)
                b = got[0] if got else None
                if b is not None:
                    added.append(b)
            seen[key] = b
        if last is None:
            grouped = BookedPods(b for b in seen.values() if b is not None)
        else:
            # Each pod version seen is a key of ``seen``: the versions of ``known`` not in it
            # are gone (a pod whose version changed is one gone and one added).
            removed = (
                [b for k, b in known.items() if b is not None and k not in seen]
                if len(seen) - new < len(known)
                else []
            )
            grouped = last[2].changed(added, removed)
        with self._booked_lock:
            self._booked = (gen, seen, grouped)  # the three together: the next call's base
        return grouped

    def _node_objects(self, args: Mapping[str, Any], names: Sequence[str]) -> list[Any]:
        nodes = _get(args, "Nodes")
        if isinstance(nodes, Mapping) and isinstance(nodes.get("items"), list):
            return [n for n in nodes["items"] if isinstance(n, Mapping)]
        return [o for o in (self.nodes(n) for n in names) if o is not None]

    def filter(self, args: Any) -> dict[str, Any]:
        """The reply to one ``filter`` call. Raises :class:`BadArgs` for a malformed body."""
        pod = _pod(args)
        names = _names(args)
        try:
            decision, failed = self._decide(pod, names, self._node_objects(args, names))
        except TesseraError as e:
            return {"NodeNames": [], "FailedNodes": {}, "Error": str(e)}
        self._last = (_version(pod), decision)
        if not decision.hami:
            fits = list(names)
            failed = {}
        else:
            fits = [f.node for f in decision.nodes if f.fits]
            failed.update({f.node: f.reason for f in decision.nodes if not f.fits})
        out: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": {}, "Error": ""}
        nodes = _get(args, "Nodes")
        if _get(args, "NodeNames") is None and isinstance(nodes, Mapping):
            keep = set(fits)
            items = [
                n for n in nodes.get("items") or [] if (n.get("metadata") or {}).get("name") in keep
            ]
            out["Nodes"] = {"items": items}
        else:
            out["NodeNames"] = fits
        return out

    def prioritize(self, args: Any) -> list[dict[str, Any]]:
        """The reply to one ``prioritize`` call (:meth:`Decision.levels`: level 0 scores 10,
        level k scores ``max(0, 6 - k)``, a node that does not fit 0)."""
        pod = _pod(args)
        names = _names(args)
        last = self._last
        if (
            last is not None
            and last[0] == _version(pod)
            and all(last[1].get(n) is not None for n in names)
        ):
            decision = last[1]  # the filter call of this scheduling cycle decided it
        else:
            try:
                decision, _ = self._decide(pod, names, self._node_objects(args, names))
            except TesseraError:
                return [{"Host": n, "Score": 0} for n in names]
        levels = decision.levels() if decision.hami else {}
        return [
            {
                "Host": n,
                "Score": (MAX_PRIORITY if levels[n] == 0 else max(0, 6 - levels[n]))
                if n in levels
                else 0,
            }
            for n in names
        ]

    # ---- bind -------------------------------------------------------------------------------
    def _node_lock(self, node: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(node, threading.Lock())

    def bind(self, args: Any) -> dict[str, str]:
        """The reply to one ``bind`` call: ``{"Error": ""}`` once bound, else the reason.
        Raises :class:`BadArgs` for a malformed body."""
        if not isinstance(args, Mapping):
            raise BadArgs("ExtenderBindingArgs must be a JSON object")
        name, ns = _get(args, "PodName"), _get(args, "PodNamespace")
        uid, node = _get(args, "PodUID"), _get(args, "Node")
        if not all(isinstance(v, str) and v for v in (name, ns, node)):
            raise BadArgs("ExtenderBindingArgs needs PodName, PodNamespace and Node")
        if self.client is None:
            return {"Error": "the extender has no API client to bind with"}
        with self._node_lock(str(node)):
            try:
                err = self._bind(self.client, str(name), str(ns), str(uid or ""), str(node))
            except ApiError as e:
                err = f"binding {ns}/{name} to {node}: {e}"
            except TesseraError as e:
                err = f"binding {ns}/{name} to {node}: {e}"
        if err:
            log.warning("bind %s/%s to %s refused: %s", ns, name, node, err)
        else:
            log.info("bound %s/%s to %s", ns, name, node)
        return {"Error": err}

    def _bind(self, client: KubeClient, name: str, ns: str, uid: str, node: str) -> str:
        try:
            pod = client.get("v1", "Pod", name, ns)
        except ApiError as e:
            if e.status == 404:
                return f"pod {ns}/{name} was deleted"
            raise
        md = pod.get("metadata") or {}
        if uid and md.get("uid") != uid:
            return f"pod {ns}/{name} is another pod now (UID {md.get('uid')}, not {uid})"
        if md.get("deletionTimestamp"):
            return f"pod {ns}/{name} is being deleted"
        if (pod.get("spec") or {}).get("nodeName"):
            return f"pod {ns}/{name} is already bound to {pod['spec']['nodeName']}"
        node_obj = client.get("v1", "Node", node)
        booked_pods = client.list("v1", "Pod", label_selector=f"{VGPU_NODE}={node}")
        decision = decide(
            pod, [legacy_node(node_obj)], bookings(booked_pods), default_policy=self.default_policy
        )
        fit = decision.nodes[0]
        if decision.hami and fit.devices is None:
            return f"pod {ns}/{name} no longer fits on {node}: {fit.reason}"
        if decision.hami:
            waiting = allocating_pod(booked_pods, str(md.get("uid", "")), self.now())
            if waiting:
                return (
                    f"node {node} is still allocating pod {waiting} ({BIND_PHASE}=allocating): "
                    "one HAMi pod per node until its device plugin's Allocate ends; "
                    "decided again next time"
                )
        path = client.collection_path("v1", "Pod", ns) + f"/{name}"
        if decision.hami:
            assert fit.devices is not None
            devices = encode_pod_devices(fit.devices)
            now = str(int(self.now()))
            records = {
                VGPU_NODE: node,
                VGPU_TIME: now,
                DEVICES_TO_ALLOCATE: devices,
                DEVICES_ALLOCATED: devices,
                BIND_PHASE: "allocating",
                BIND_TIME: now,
            }
            patch = {
                "metadata": {
                    "resourceVersion": md.get("resourceVersion"),
                    "labels": {VGPU_NODE: node},
                    "annotations": records,
                }
            }
            try:
                client.request(
                    "PATCH",
                    path,
                    body=patch,
                    content_type="application/merge-patch+json",
                    what=f"Pod {ns}/{name}",
                )
            except ApiError as e:
                if e.status == 409:
                    return f"pod {ns}/{name} changed since it was read; decided again next time"
                if e.status == 404:
                    return f"pod {ns}/{name} was deleted"
                raise
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "uid": md.get("uid")},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            client.request("POST", path + "/binding", body=binding, what=f"Pod {ns}/{name} binding")
        except ApiError as e:
            if decision.hami and e.status != 404:
                self._unbook(client, path, ns, name)
            return f"pod {ns}/{name}: Binding to {node} failed: {e.message or e.reason}"
        return ""

    def _unbook(self, client: KubeClient, path: str, ns: str, name: str) -> None:
        """Take the records off a pod whose Binding failed (best effort: logged)."""
        patch = {
            "metadata": {
                "labels": {VGPU_NODE: None},
                "annotations": dict.fromkeys(RECORDS),
            }
        }
        try:
            client.request(
                "PATCH",
                path,
                body=patch,
                content_type="application/merge-patch+json",
                what=f"Pod {ns}/{name}",
            )
        except ApiError as e:
            log.warning("pod %s/%s: cannot take its records off: %s", ns, name, e)


#: Seconds after its ``hami.io/bind-time`` a pod still ``allocating`` no longer holds its node
#: (HAMi's node lock expires after 5 minutes).
ALLOCATING_EXPIRY_SECONDS = 300


def allocating_pod(booked: Sequence[Mapping[str, Any]], uid: str, now: float) -> str | None:
    """``<namespace>/<name>`` of a pod of ``booked`` (a node's booked pods) other than ``uid``
    whose decision the node's device plugin has not taken yet: ``Pending``, not being deleted,
    ``hami.io/bind-phase: allocating`` and bound less than :data:`ALLOCATING_EXPIRY_SECONDS`
    ago; None when there is none.

    The kubelet's ``Allocate`` names no pod: the device plugin takes the decision of the
    node's one allocating pod (:func:`tessera.deviceplugin.allocate.choose_pod`). Two of them
    on one node at once, and the plugin could hand a container the other pod's share (the
    kubelet admits pods in its own order), so bind waits for the first, as HAMi's node lock
    (``hami.io/mutex.lock``) makes it wait."""
    for p in booked:
        md = p.get("metadata") or {}
        ann = md.get("annotations") or {}
        if (
            str(md.get("uid", "")) == uid
            or md.get("deletionTimestamp")
            or (p.get("status") or {}).get("phase", "Pending") != "Pending"
            or ann.get(BIND_PHASE) != "allocating"
        ):
            continue
        try:
            bound = int(ann.get(BIND_TIME, ""))
        except ValueError:
            continue
        if now - bound < ALLOCATING_EXPIRY_SECONDS:
            return f"{md.get('namespace', '')}/{md.get('name', '')}"
    return None


def static_extender(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    default_policy: str = "first-fit",
) -> LegacyExtender:
    """A :class:`LegacyExtender` over fixed objects (no bind): for tests and the benchmark.
    ``pods`` may be appended to (its length is the pods' generation), not changed otherwise."""
    by_name = {str((n.get("metadata") or {}).get("name")): n for n in nodes}
    return LegacyExtender(
        by_name.get, lambda: pods, None, default_policy, pods_generation=lambda: len(pods)
    )


__all__ = ["Booking", "LegacyExtender", "NodeCache", "allocating_pod", "static_extender"]
