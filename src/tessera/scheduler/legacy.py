"""Legacy mode's placement decision: a HAMi-style pod on nodes that register their GPUs in HAMi's
node annotation, decided by Tessera's allocator. Pure: no I/O.

The scheduler extender's ``filter``, ``prioritize`` and ``bind`` verbs (``tessera extender
--legacy``) all ask :func:`decide`. Its inputs are what a HAMi-protocol cluster holds:

* each candidate Node's ``hami.io/node-nvidia-register`` annotation (written by the device
  plugin; :func:`legacy_node` reads it with :func:`tessera.inventory.node.node_register_slices`,
  the ResourceSlices ``tessera simulate`` and ``lint`` read from it too), with each GPU's
  ``count`` (the most containers that may share it) and ``health``;
* the decisions already recorded on pods (:func:`bookings`: ``hami.io/vgpu-node`` and
  ``hami.io/vgpu-devices-allocated``; finished pods hold nothing, terminating ones still do).

The pod's HAMi requests are converted by :func:`tessera.convert.convert_pod`, as the webhook and
``tessera convert`` convert them; every booking becomes consumed capacity of its GPU (one share
per container and GPU: its memory and cores), a GPU whose ``count`` is reached or that is
unhealthy carries a ``NoSchedule`` device taint, and the allocator (:class:`tessera.allocator.Allocator`,
``tessera simulate``'s) places the claims on each node with the pod's GPU policy
(:func:`tessera.scheduler.policies.device_rank`: binpack, spread; topology tries the stricter
copies of :func:`~tessera.scheduler.policies.topology_variants` first: one NUMA node, as the
register annotation carries no NVLink links). A node that cannot take the pod says why in the
allocator's words (:mod:`tessera.scheduler.words`).

A decision is recorded on the pod in HAMi's device list (:func:`tessera.convert.hami.encode_pod_devices`):
per container (init containers first), per GPU, the memory in MiB and the cores in percent the
allocator's result consumes (a GPU allocated whole: all of its memory and 100 cores).
"""

from __future__ import annotations

import copy
import json
import random
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tessera import DEVICE_CLASS_NAME, DRIVER_NAME
from tessera.allocator import AllocatedState, AllocationError, Allocator, Features, Node
from tessera.allocator.record import NodeRecord
from tessera.api.deviceclass import device_class
from tessera.api.loader import Manifest, Source
from tessera.api.pods import pod_containers
from tessera.api.quantity import Quantity
from tessera.api.uids import uuid5_url
from tessera.convert import ContainerRequest, convert_pod, gpu_memory_sizes
from tessera.convert.hami import (
    DEVICES_ALLOCATED,
    NVIDIA_VENDOR_KEY,
    VGPU_NODE,
    ContainerDevice,
    decode_pod_devices,
)
from tessera.inventory.hami import register_sharing
from tessera.inventory.node import HAMI_CORDON, HAMI_REGISTER, node_register_slices
from tessera.scheduler.policies import (
    PodPolicy,
    device_rank,
    node_usage,
    order_nodes,
    pod_policy,
    topology_variants,
)
from tessera.scheduler.words import refusal_text

#: The device taint a GPU gets when its ``count`` of containers is reached (HAMi's
#: ``CardTimeSlicingExhausted``); its value is ``<used>/<count>``.
SHARERS_TAINT = f"{DRIVER_NAME}/sharers-full"
#: The device taint of a GPU the device plugin registers with ``health: false`` (HAMi's
#: ``CardNotHealth``).
UNHEALTHY_TAINT = f"{DRIVER_NAME}/unhealthy"
MIB = 2**20
_ZERO = Fraction(0)
#: Claim shapes a node's memo keeps (:class:`DecisionMemo`).
MAX_SHAPES = 256


@dataclass(frozen=True)
class LegacyNode:
    """A Node as legacy mode sees it: ``name``, ``labels``, the ResourceSlices of its register
    annotation (``resource.k8s.io/v1`` dicts) and, per GPU UUID, ``sharing``: ``(count,
    health)`` (:func:`tessera.inventory.hami.register_sharing`)."""

    name: str
    labels: Mapping[str, str]
    slices: list[dict[str, Any]]
    sharing: Mapping[str, tuple[int | None, bool]]
    #: What the slices and sharing were built from (the register and cordon annotations):
    #: equal keys, equal GPUs (:class:`DecisionMemo`).
    key: str = ""
    #: :func:`tessera.convert.gpu_memory_sizes` of the slices (what percentages resolve against).
    memory_sizes: tuple[int, ...] = ()


def legacy_node(node: Mapping[str, Any]) -> LegacyNode:
    """A ``v1`` Node dict as a :class:`LegacyNode` (no GPUs without a register annotation).
    Raises :class:`~tessera.api.errors.ManifestError` naming the Node and
    ``metadata.annotations[hami.io/node-nvidia-register]`` when the annotation is not readable."""
    md = node.get("metadata") or {}
    name = str(md.get("name") or "")
    m = Manifest({"apiVersion": "v1", "kind": "Node", **node}, Source(f"Node {name}", 1))
    slices = node_register_slices(m)
    value = str((md.get("annotations") or {}).get(HAMI_REGISTER) or "")
    labels = {str(k): str(v) for k, v in (md.get("labels") or {}).items()}
    labels.setdefault("kubernetes.io/hostname", name)
    cordon = str((md.get("annotations") or {}).get(HAMI_CORDON) or "")
    sharing = register_sharing(value) if value else {}
    sizes = tuple(gpu_memory_sizes(slices))
    return LegacyNode(name, labels, slices, sharing, f"{value}\0{cordon}", sizes)


@dataclass(frozen=True)
class Booking:
    """One pod's recorded decision: ``pod`` (``namespace/name``), its ``uid``, the ``node``
    (``hami.io/vgpu-node``) and per container the GPUs it holds
    (``hami.io/vgpu-devices-allocated``, decoded)."""

    pod: str
    uid: str
    node: str
    containers: list[list[ContainerDevice]]
    #: The record as written (equal records, equal bookings).
    record: str = ""


def bookings(pods: Iterable[Mapping[str, Any]], warnings: list[str] | None = None) -> list[Booking]:
    """The decisions recorded on ``pods`` (``v1`` Pod dicts): pods with ``hami.io/vgpu-node``
    and ``hami.io/vgpu-devices-allocated``, but those that finished (``status.phase``
    Succeeded or Failed: they hold no GPU). A pod being deleted still holds its GPUs. A record
    that does not decode is left out, with a line in ``warnings`` naming the pod."""
    out = []
    for p in pods:
        md = p.get("metadata") or {}
        ann = md.get("annotations") or {}
        node, record = ann.get(VGPU_NODE), ann.get(DEVICES_ALLOCATED)
        if not node or record is None:
            continue
        if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        ref = f"{md.get('namespace') or 'default'}/{md.get('name')}"
        try:
            containers = decode_pod_devices(str(record))
        except ValueError as e:
            if warnings is not None:
                warnings.append(f"Pod {ref}: metadata.annotations[{DEVICES_ALLOCATED}]: {e}")
            continue
        out.append(Booking(ref, str(md.get("uid") or ""), str(node), containers, str(record)))
    return out


class BookedPods:
    """Bookings grouped by node, each node's in UID order, with the part of
    :class:`DecisionMemo`'s key they make (``(uid, record)`` per booking): worked out once per
    set of bookings and shared by every :func:`decide` over that set, instead of once per call.
    ``booked``: :func:`bookings`' list. Not changed once made: :meth:`changed` makes the next
    set from this one (the extender's, once per change of its informer's pods), regrouping only
    the nodes whose bookings were added or removed."""

    def __init__(self, booked: Iterable[Booking] = ()) -> None:
        self.by_node: dict[str, list[Booking]] = {}
        self.keys: dict[str, tuple[Any, ...]] = {}
        #: pod UID -> the nodes its bookings are on (one, but for a pod booked twice)
        self._nodes_of: dict[str, frozenset[str]] = {}
        grouped: dict[str, list[Booking]] = {}
        for b in booked:
            grouped.setdefault(b.node, []).append(b)
        self._regroup(grouped)

    def _regroup(self, grouped: Mapping[str, list[Booking]]) -> None:
        """Set the bookings of each node of ``grouped`` (any order; an empty list: none) and
        the nodes of their pods (call while this object is still being made)."""
        uids: set[str] = set()
        now_on: dict[str, set[str]] = {}  # pod UID -> the nodes of ``grouped`` it is booked on
        for n, bs in grouped.items():
            uids.update(b.uid for b in self.by_node.get(n, ()))
            for b in bs:
                now_on.setdefault(b.uid, set()).add(n)
            if not bs:
                self.by_node.pop(n, None)
                self.keys.pop(n, None)
                continue
            bs = sorted(bs, key=lambda b: b.uid)
            self.by_node[n] = bs
            self.keys[n] = tuple((b.uid, b.record) for b in bs)
        uids.update(now_on)
        for u in uids:
            kept = {n for n in self._nodes_of.get(u, ()) if n not in grouped}
            kept.update(now_on.get(u, ()))
            if kept:
                self._nodes_of[u] = frozenset(kept)
            else:
                self._nodes_of.pop(u, None)

    def changed(self, added: Iterable[Booking], removed: Iterable[Booking]) -> BookedPods:
        """A new set: this one with ``added`` and without ``removed`` (bookings of this set,
        matched by identity; the extender keeps one :class:`Booking` object per pod version).
        Only the nodes of those bookings are grouped again; this set is not changed (a
        decision in progress may be reading it). O(nodes) to copy the maps, O(changed) else."""
        out = BookedPods()
        out.by_node = dict(self.by_node)
        out.keys = dict(self.keys)
        out._nodes_of = dict(self._nodes_of)
        removed = list(removed)
        gone = {id(b) for b in removed}
        grouped: dict[str, list[Booking]] = {}
        for b in [*removed, *added]:
            if b.node not in grouped:
                grouped[b.node] = [x for x in self.by_node.get(b.node, ()) if id(x) not in gone]
        for b in added:
            grouped[b.node].append(b)
        out._regroup(grouped)
        return out

    def on(self, node: str, without: str = "") -> tuple[list[Booking], tuple[Any, ...]]:
        """The bookings on ``node`` in UID order and their key part; ``without``: a pod UID
        whose own booking is left out (the pod being decided again)."""
        mine = self.by_node.get(node, [])
        if without and node in self._nodes_of.get(without, ()):
            mine = [b for b in mine if b.uid != without]
            return mine, tuple((b.uid, b.record) for b in mine)
        return mine, self.keys.get(node, ())


@dataclass(frozen=True)
class NodeFit:
    """The decision on one node: ``devices`` per container of the pod (init containers first;
    empty for a container without GPUs), None when the pod does not fit, with the ``reason``;
    ``usage``: the node's booked memory plus cores fractions summed over its GPUs before the
    pod (:func:`~tessera.scheduler.policies.node_usage`); ``tier``: the topology tier reached
    (0 unless the GPU policy is ``topology``). Shared between decisions (:class:`DecisionMemo`):
    not to be modified."""

    node: str
    devices: list[list[ContainerDevice]] | None
    reason: str = ""
    usage: Fraction = Fraction(0)
    tier: int = 0

    @property
    def fits(self) -> bool:
        return self.devices is not None


@dataclass
class Decision:
    """:func:`decide`'s answer. ``requests``: the pod's HAMi requests as converted (empty: the
    pod asks for no HAMi GPU, every node fits); ``policy``; ``nodes``: one :class:`NodeFit`
    per candidate node, in the order given; ``warnings``: the conversion's and unreadable
    bookings'."""

    pod: str
    requests: list[ContainerRequest]
    policy: PodPolicy
    nodes: list[NodeFit]
    warnings: list[str] = field(default_factory=list)
    _by_name: dict[str, NodeFit] = field(default_factory=dict, repr=False, compare=False)

    @property
    def hami(self) -> bool:
        """The pod asks for HAMi GPUs."""
        return bool(self.requests)

    def fitting(self) -> list[NodeFit]:
        """The nodes that fit, best first: the lowest topology tier, then the policy's node
        order (binpack: most booked first; spread: least booked first; first-fit: as given)."""
        fits = [f for f in self.nodes if f.fits]
        order = order_nodes(self.policy.nodes, [f.usage for f in fits])
        pos = {i: k for k, i in enumerate(order)}
        return [fits[i] for i in sorted(range(len(fits)), key=lambda i: (fits[i].tier, pos[i]))]

    def levels(self) -> dict[str, int]:
        """Per fitting node, its preference level (0 best; nodes that tie share a level)."""
        out: dict[str, int] = {}
        keys: dict[tuple[int, Fraction], int] = {}
        by_usage = self.policy.nodes in ("binpack", "spread")
        for f in self.fitting():
            key = (f.tier, f.usage if by_usage else _ZERO)
            out[f.node] = keys.setdefault(key, len(keys))
        return out

    def best(self) -> NodeFit | None:
        """The node the pod goes to, or None when none fits."""
        fits = self.fitting()
        return fits[0] if fits else None

    def get(self, node: str) -> NodeFit | None:
        """The decision on ``node`` (None: not a candidate)."""
        if len(self._by_name) != len(self.nodes):
            self._by_name = {f.node: f for f in self.nodes}
        return self._by_name.get(node)


def _uuid_of(slices: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, str, str]]:
    out = {}
    for s in slices:
        spec = s.get("spec") or {}
        for d in spec.get("devices") or []:
            u = ((d.get("attributes") or {}).get("uuid") or {}).get("string")
            if u:
                out[str(u)] = (str(spec.get("driver")), str(spec["pool"]["name"]), str(d["name"]))
    return out


def _node_state(
    node: LegacyNode, booked: Sequence[Booking]
) -> tuple[AllocatedState, list[dict[str, Any]], dict[tuple[str, str, str], str], dict[str, int]]:
    """The node's bookings as consumed capacity, its slices with the closed GPUs tainted,
    device id -> UUID, and per UUID the containers booked on it."""
    ids = _uuid_of(node.slices)
    state = AllocatedState()
    used: dict[str, int] = {}
    for b in booked:
        for c, devs in enumerate(b.containers):
            for j, d in enumerate(devs):
                did = ids.get(d.uuid)
                if did is None:
                    continue  # a GPU the node no longer registers
                used[d.uuid] = used.get(d.uuid, 0) + 1
                state.add_result(
                    {
                        "driver": did[0],
                        "pool": did[1],
                        "device": did[2],
                        "request": "gpu",
                        "shareID": uuid5_url(f"tessera-legacy/{b.uid}/{c}/{j}"),
                        "consumedCapacity": {
                            "memory": f"{d.memory_mib}Mi",
                            "cores": str(d.cores),
                        },
                    }
                )
    closed: dict[str, dict[str, str]] = {}
    for u, (count, healthy) in node.sharing.items():
        if not healthy:
            closed[u] = {"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"}
        elif count is not None and used.get(u, 0) >= count:
            closed[u] = {
                "key": SHARERS_TAINT,
                "value": f"{used[u]}/{count}",
                "effect": "NoSchedule",
            }
    slices = node.slices
    if closed:
        slices = copy.deepcopy(node.slices)
        for s in slices:
            for d in (s.get("spec") or {}).get("devices") or []:
                du = str(((d.get("attributes") or {}).get("uuid") or {}).get("string"))
                if du in closed:
                    d.setdefault("taints", []).append(dict(closed[du]))
    return state, slices, {v: k for k, v in ids.items()}, used


def booked_state(node: LegacyNode, booked: Sequence[Booking]) -> AllocatedState:
    """The bookings of ``booked`` on ``node`` as consumed capacity of its GPUs (one share per
    container and GPU: its memory and cores), as :func:`decide` counts them; GPUs the node no
    longer registers are left out. For per-GPU usage (:func:`tessera.scheduler.usage.gpu_usage`
    over ``node.slices``)."""
    return _node_state(node, [b for b in booked if b.node == node.name])[0]


def _claims(pod: Mapping[str, Any], templates: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    md = pod.get("metadata") or {}
    name = md.get("name") or md.get("generateName") or "pod"
    out = []
    for t in templates:
        tmd = t.get("metadata") or {}
        out.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {
                    "name": f"{name}-{tmd.get('name')}",
                    "namespace": md.get("namespace") or "default",
                },
                "spec": (t.get("spec") or {}).get("spec") or {},
            }
        )
    return out


def _container_devices(
    pod: Mapping[str, Any],
    requests: Sequence[ContainerRequest],
    results: Sequence[Mapping[str, Any]],
    uuid_of: Mapping[tuple[str, str, str], str],
    whole: Mapping[tuple[str, str, str], int],
) -> list[list[ContainerDevice]]:
    by_container = {r.container: res for r, res in zip(requests, results, strict=True)}
    out: list[list[ContainerDevice]] = []
    for c in pod_containers(pod):
        res = by_container.get(c.name)
        devs = []
        for r in ((res or {}).get("devices") or {}).get("results") or []:
            did = (str(r["driver"]), str(r["pool"]), str(r["device"]))
            cc = r.get("consumedCapacity")
            if cc:
                mem = Quantity.parse(cc.get("memory", "0")).value_int() // MIB
                cores = Quantity.parse(cc.get("cores", "0")).value_int()
            else:  # allocated whole
                mem, cores = whole.get(did, 0), 100
            devs.append(
                ContainerDevice(uuid_of.get(did, r["device"]), NVIDIA_VENDOR_KEY, mem, cores)
            )
        out.append(devs)
    return out


def _reason(
    rec: NodeRecord, requests: Sequence[ContainerRequest], uuid_of: Mapping[Any, str]
) -> str:
    """Why the claims do not fit, per container, in the allocator's words."""
    if rec.error:
        return rec.error
    parts = []
    for rr in rec.requests:
        container = (
            requests[rr.claim_index].container if rr.claim_index < len(requests) else rr.claim
        )
        refused = [d for d in rr.devices if d.alone is not None]
        if not rr.devices:
            parts.append(f"container {container}: no GPU registered")
        elif refused:
            each = "; ".join(
                f"{uuid_of.get(d.id, d.id[2])}: {refusal_text(d.alone)}"
                for d in refused
                if d.alone is not None
            )
            parts.append(
                f"container {container}: {len(refused)} of {len(rr.devices)} GPUs cannot take "
                f"it ({each})"
            )
        if len(rr.devices) - len(refused) < rr.count:
            if not refused:
                parts.append(f"container {container}: needs {rr.count} GPUs")
        elif not refused or rr.count > 1:
            parts.append(
                f"container {container}: {len(rr.devices) - len(refused)} GPUs fit one by one "
                f"but not {rr.count} together"
            )
    # firstAvailable alternatives (one per GPU memory size) often say the same: once each.
    return "; ".join(dict.fromkeys(parts)) or "cannot allocate all claims"


@dataclass
class _NodeState:
    """One node's GPUs with its bookings consumed: the allocator over them and what decisions
    on it worked out, per claim shape."""

    allocator: Allocator
    state: AllocatedState
    uuid_of: dict[tuple[str, str, str], str]
    whole: dict[tuple[str, str, str], int]
    usage: Fraction
    #: Per GPU UUID with a ``count``: the sharer slots still free.
    free_slots: dict[str, int]
    fits: dict[str, NodeFit] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)  # the allocator: one caller


class DecisionMemo:
    """What :func:`decide` worked out per node, kept while the node's GPUs (:attr:`LegacyNode.key`)
    and the bookings on it stay the same; a pod of a shape already decided there (the same
    claim specs, containers and GPU policy) is answered from it. Safe across threads. Holds at
    most ``max_nodes`` nodes (then starts afresh)."""

    def __init__(self, max_nodes: int = 100_000) -> None:
        self.max_nodes = max_nodes
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[Any, _NodeState]] = {}

    def get(self, name: str, key: Any) -> _NodeState | None:
        hit = self._nodes.get(name)  # a dict read is atomic; writes take the lock
        return hit[1] if hit is not None and hit[0] == key else None

    def put(self, name: str, key: Any, st: _NodeState) -> None:
        with self._lock:
            if len(self._nodes) >= self.max_nodes:
                self._nodes.clear()
            self._nodes[name] = (key, st)


def _prepare(n: LegacyNode, booked: Sequence[Booking], features: Features | None) -> _NodeState:
    state, slices, uuid_of, used = _node_state(n, booked)
    allocator = Allocator(
        slices, {DEVICE_CLASS_NAME: device_class()}, state, features, random.Random(0)
    )
    mine = allocator.index.by_node.get(n.name, [])
    whole = {
        d.id: d.capacity["memory"].value.value_int() // MIB
        for sl in mine
        for d in sl.devices
        if "memory" in d.capacity
    }
    free = {u: c - used.get(u, 0) for u, (c, _) in n.sharing.items() if c is not None}
    return _NodeState(allocator, state, uuid_of, whole, node_usage(state, mine), free)


def decide(
    pod: Mapping[str, Any],
    nodes: Sequence[LegacyNode],
    booked: Sequence[Booking] | BookedPods,
    *,
    default_policy: str = "first-fit",
    features: Features | None = None,
    memo: DecisionMemo | None = None,
) -> Decision:
    """Where ``pod`` (a ``v1`` Pod dict with HAMi resources) fits among ``nodes`` given the
    pods already ``booked`` (:func:`bookings`, or a :class:`BookedPods` of them kept across
    calls; the pod's own booking, by UID, is left out),
    and on which GPUs (see the module docstring). ``default_policy``: ``first-fit``,
    ``binpack``, ``spread`` or ``topology`` for pods without HAMi's policy annotations
    (:func:`~tessera.scheduler.policies.pod_policy`). ``memo``: what earlier calls worked out
    (the same answer, sooner).

    Raises :class:`~tessera.convert.ConversionError` for requests the webhook would refuse
    (naming the container and field)."""
    md = pod.get("metadata") or {}
    ref = f"{md.get('namespace') or 'default'}/{md.get('name') or md.get('generateName')}"
    policy = pod_policy(default_policy, md.get("annotations") or {})
    uid = str(md.get("uid") or "")
    sizes = sorted({m for n in nodes for m in n.memory_sizes}, reverse=True)
    conv = convert_pod(dict(pod), memory_sizes=sizes, source=f"Pod {ref}")
    if not conv.converted:
        return Decision(ref, [], policy, [NodeFit(n.name, []) for n in nodes], conv.warnings)
    claims = _claims(pod, conv.templates)
    shape = json.dumps(
        [policy.gpus, [r.container for r in conv.requests], [c["spec"] for c in claims]],
        sort_keys=True,
        default=str,
    )
    grouped = booked if isinstance(booked, BookedPods) else BookedPods(booked)
    variants = topology_variants(claims) if policy.gpus == "topology" else [claims]
    fits = []
    for n in nodes:
        mine, part = grouped.on(n.name, uid)  # in UID order, the pod's own left out: memo key
        key = (n.key, part)
        st = memo.get(n.name, key) if memo is not None and n.key else None
        if st is None:
            st = _prepare(n, mine, features)
            if memo is not None and n.key:
                memo.put(n.name, key, st)
        fit = st.fits.get(shape)  # a dict read is atomic; the allocator takes the lock
        if fit is None:
            with st.lock:
                fit = st.fits.get(shape)
                if fit is None:
                    devices, reason, tier = _try(
                        st, n, pod, conv.requests, claims, variants, policy
                    )
                    fit = NodeFit(
                        n.name,
                        None if devices is None else [list(c) for c in devices],
                        reason,
                        st.usage,
                        tier,
                    )
                    if len(st.fits) >= MAX_SHAPES:
                        st.fits.clear()  # shapes seldom repeated (a UUID list per pod): afresh
                    st.fits[shape] = fit
        fits.append(fit)
    return Decision(ref, list(conv.requests), policy, fits, conv.warnings)


def _try(
    st: _NodeState,
    n: LegacyNode,
    pod: Mapping[str, Any],
    requests: Sequence[ContainerRequest],
    claims: list[dict[str, Any]],
    variants: list[list[dict[str, Any]]],
    policy: PodPolicy,
) -> tuple[tuple[tuple[ContainerDevice, ...], ...] | None, str, int]:
    """The claims on one node: (devices per container, "", tier) or (None, reason, 0)."""
    node = Node(n.name, dict(n.labels))
    rank = device_rank(policy.gpus, st.state)
    results, tier = None, 0
    try:
        for k, variant in enumerate(variants):
            results = st.allocator.allocate(node, variant, rank, transient=variant is not claims)
            if results is not None:
                tier = k
                break
    except AllocationError as e:
        return None, f"allocation error: {e}", 0
    if results is None:
        rec = st.allocator.diagnose(node, claims, rank)
        return None, _reason(rec, requests, st.uuid_of), 0
    devices = _container_devices(pod, requests, results, st.uuid_of, st.whole)
    # Each container takes one slot of each GPU it uses; the taints closed the GPUs with no slot
    # left, not those the pod's own containers would overfill (the allocator knows no slots).
    mine: dict[str, int] = {}
    for c in devices:
        for d in c:
            mine[d.uuid] = mine.get(d.uuid, 0) + 1
    over = [
        f"{u}: {k} of its containers need {k} sharer slots, {st.free_slots[u]} free"
        for u, k in mine.items()
        if u in st.free_slots and k > st.free_slots[u]
    ]
    if over:
        return None, "; ".join(over), 0
    return tuple(tuple(c) for c in devices), "", tier
