"""An in-memory cluster that schedules pods the way kube-scheduler's DynamicResources plugin does.

Pods are taken one at a time in input order. For each pod, its claims are resolved (a
ResourceClaimTemplate yields a claim per pod, as the resource-claim controller does; HAMi-style
requests are first converted by :mod:`tessera.convert`), then nodes are tried in cluster order
and the first node where the allocator satisfies every unallocated claim wins ("first fit";
kube-scheduler breaks score ties at random, so where several nodes fit, which one it picks is
not defined). Node CPU and memory are not modelled.

A cluster may hold nodes of Tessera's two modes (:mod:`tessera.api.modes`: the Node label
``gpu.tessera.dev/mode``). DRA-mode nodes publish ResourceSlices and take the pods the default
scheduler places (the path above); legacy-mode nodes publish none, register their GPUs in HAMi's
``hami.io/node-nvidia-register`` annotation and take only the pods of the legacy scheduler
(``spec.schedulerName`` :data:`tessera.convert.LEGACY_SCHEDULER`, or a HAMi pod in a Namespace
labelled ``gpu.tessera.dev/mode: legacy``, which the webhook converts for legacy mode with
:func:`tessera.convert.legacy_pod`). Such a pod is placed by
:func:`tessera.scheduler.legacy.decide`, the decision the scheduler extender takes, over the
legacy nodes it may use (node affinity and taints first, as kube-scheduler filters before
calling the extender) and the legacy pods placed before it; its decision is recorded on the pod
as the extender records it (HAMi's ``hami.io/vgpu-node`` and ``hami.io/vgpu-devices-allocated``).
"""

from __future__ import annotations

import copy
import difflib
import enum
import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tessera import DEVICE_CLASS_NAME, DRIVER_NAME
from tessera.allocator import (
    AllocatedState,
    AllocationError,
    Allocator,
    Features,
    Node,
    NodeAllocationError,
    NodeRecord,
    SliceIndex,
    taint_rule_from_dict,
)
from tessera.allocator.core import evicting_taint
from tessera.allocator.model import Device
from tessera.allocator.record import alternatives
from tessera.api.deviceclass import device_class, served_extended_resources, vendor_device_class
from tessera.api.errors import ManifestError
from tessera.api.heap import collector_paused
from tessera.api.loader import CLUSTER_SCOPED_KINDS, Manifest
from tessera.api.modes import MODE_DRA, MODE_LABEL, MODE_LEGACY
from tessera.api.pods import pod_claims, pod_containers
from tessera.api.quantity import Quantity
from tessera.api.requests import claim_requests, device_requests
from tessera.api.uids import uuid5_url
from tessera.api.validation import DRA_V1BETA2, check
from tessera.api.vendors import PLANNED, installed_vendors
from tessera.api.workloads import foreign_workload
from tessera.convert import LEGACY_SCHEDULER, compute_unit_sizes, gpu_memory_sizes, mentions_hami
from tessera.convert.hami import (
    DEVICES_ALLOCATED,
    VGPU_NODE,
    ContainerDevice,
    encode_pod_devices,
)
from tessera.scheduler.claims import generated_claim_name, pod_claim_name, template_claim_name
from tessera.scheduler.extended import (
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    claim_name,
    extended_requests,
    is_extended_claim,
    owned_by,
    spec_key,
)
from tessera.scheduler.legacy import (
    BookedPods,
    Booking,
    Decision,
    DecisionMemo,
    booked_state,
    decide,
    legacy_node,
)
from tessera.scheduler.nodes import node_refusal
from tessera.scheduler.policies import (
    POLICIES,
    PlacementRank,
    PodPolicy,
    device_rank,
    has_multi_gpu_request,
    max_prioritized_list_score,
    node_usage,
    order_nodes,
    placement_rank,
    pod_policy,
    prioritized_list_score,
    topology_variants,
)
from tessera.scheduler.usage import GPUUsage, gpu_usage
from tessera.sim.classmap import map_device_classes
from tessera.sim.cluster import Cluster
from tessera.sim.reasons import join_clauses, request_clauses

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
BETA2 = DRA_V1BETA2
# The NVIDIA DRA driver's DeviceClasses (k8s-dra-driver-gpu): its class, driver and attribute
# domain for full GPUs are all gpu.nvidia.com, as Tessera's are all gpu.tessera.dev.
NVIDIA_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com")


def default_device_class() -> dict[str, Any]:
    """The DeviceClass Tessera installs (:func:`tessera.api.deviceclass.device_class`)."""
    return device_class()


@dataclass(slots=True)
class _SpecFacts:
    """What a tuple of claim specs alone decides (see Simulation._spec_facts)."""

    specs: list[Any]  # kept: the ids of the memo's key stay theirs
    missing_class: MissingClass | None
    top_score: int
    signature_known: bool = False  # _signature is worked out where the scan needs it
    signature: str | None = None


@dataclass(slots=True)
class Placement:
    """One allocated device share, seen from the container that uses it.

    ``pod`` and ``claim``: ``namespace/name``; ``request``: the allocation result's request
    (``<request>/<subrequest>`` for a subrequest); ``device``: ``driver/pool/device``;
    ``uuid``/``model``: the GPU's ``uuid`` and ``productName`` attributes (None when it has
    none); ``memory``: the memory it consumes (``consumedCapacity``; the device's whole memory
    when allocated whole) as a canonical quantity of bytes (e.g. ``"10Gi"``), ``cores``: its
    percent of the GPU's SMs (``"30"``; ``"100"`` when whole), each None where the device
    publishes no such capacity; ``share_id``: the result's ``shareID`` (KEP-5075), None for a
    device allocated whole. ``mode``: ``dra`` (a claim's allocation result) or ``legacy`` (legacy
    mode's decision, :func:`tessera.scheduler.legacy.decide`: ``claim`` and ``request`` are "",
    ``memory`` and ``cores`` what HAMi's ``hami.io/vgpu-devices-allocated`` records, no
    ``share_id``).
    """

    pod: str  # namespace/name
    container: str
    claim: str  # namespace/name
    request: str
    node: str
    device: str  # driver/pool/device
    uuid: str | None
    model: str | None
    memory: str | None  # canonical quantity, bytes
    cores: str | None  # percent of SMs
    share_id: str | None
    mode: str = MODE_DRA


class PendingCause(enum.Enum):
    """What kept a pod from running, beside the words of its ``reason``."""

    #: No node may take it (kube-scheduler's FitError or PreFilter reason; claims missing).
    UNSCHEDULABLE = "unschedulable"
    #: A request names a DeviceClass that does not exist (PreFilter; no node is tried).
    MISSING_CLASS = "missing-class"
    #: The allocator stopped with an error (a CEL runtime error, a disabled feature).
    ALLOCATION_ERROR = "allocation-error"
    #: It fits, but the device taint eviction controller deletes it once bound.
    EVICTED = "evicted"


@dataclass(slots=True)
class Pending:
    """A pod left pending: ``pod`` (``namespace/name``), ``reason`` (its PodScheduled
    condition's message), the ``cause`` and the ``mode`` whose scheduler left it (``dra`` or
    ``legacy``)."""

    pod: str
    reason: str
    cause: PendingCause = PendingCause.UNSCHEDULABLE
    mode: str = MODE_DRA


@dataclass(frozen=True, slots=True)
class Unfit:
    """Why a node cannot take a pod: ``reason``, kube-scheduler's words for it in a FitError
    (``0/N nodes are available: <count> <reason>``), and ``devices``: whether the claims'
    devices decided it (the allocator found no allocation, or only invalid pools), rather than
    a node filter. Only such refusals are memoised per claim shape and explained per request
    in the pending reason."""

    reason: str
    devices: bool


#: The DynamicResources plugin's reason where the claims find no allocation on the node.
CANNOT_ALLOCATE = Unfit("cannot allocate all claims", devices=True)


@dataclass(frozen=True, slots=True)
class MissingClass:
    """A request naming a DeviceClass that does not exist (PreFilter's validateDeviceClass):
    the request's name (``<request>/<subrequest>`` for a subrequest) and the class."""

    request: str
    device_class: str

    @property
    def reason(self) -> str:
        """kube-scheduler's words for it."""
        return f"request {self.request}: device class {self.device_class} does not exist"


@dataclass(frozen=True, slots=True)
class _Outcome:
    """One pod's scheduling attempt: the ``node`` it was placed on, or None with the
    ``reason`` (its PodScheduled condition's message) and ``cause`` it stays pending for;
    ``claims``: ``(pod claim name, claim)`` for the claims it resolved."""

    node: str | None
    reason: str
    claims: list[tuple[str, dict[str, Any]]]
    cause: PendingCause = PendingCause.UNSCHEDULABLE


class _NotBetter:
    """_try_node's answer when only tiers no better than the best so far fit (not a refusal)."""


_NOT_BETTER = _NotBetter()


@dataclass(slots=True)
class Choice:
    """How the scan chose a pod's node (kept with ``Simulation.record_choices``, for
    ``explain``): the pod's policy, whether topology tiers ranked it, the nodes not tried
    because they are known not to fit (the first ``skipped`` in cluster order), the node
    indices tried in order, and the rank (:func:`~tessera.scheduler.policies.placement_rank`) of
    each node where the claims fit. The chosen node is the one of lowest rank."""

    policy: PodPolicy
    tiers: bool
    skipped: int
    examined: list[int]
    fits: dict[int, PlacementRank]


@dataclass
class SimResult:
    """What :meth:`Simulation.run` returns: one :class:`Placement` per allocated device share,
    one :class:`Pending` per pod left pending (input order), per GPU its usage
    (:class:`~tessera.scheduler.usage.GPUUsage`: memory in bytes, cores in percent), every
    object as the API server would hold it afterwards (``objects``: classes, slices, taint
    rules, templates, claims with ``status.allocation``, pods with ``spec.nodeName`` and
    conditions), the input ``warnings`` and the ``scheduled`` pods' ``namespace/name``;
    ``modes``: per pod (``namespace/name``) the mode whose scheduler took it, ``dra`` or
    ``legacy``."""

    placements: list[Placement]
    pending: list[Pending]
    gpus: list[GPUUsage]
    objects: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    scheduled: list[str] = field(default_factory=list)
    modes: dict[str, str] = field(default_factory=dict)


def _pod_uid(ref: str) -> str:
    return uuid5_url(f"tessera-sim/pod/{ref}")


def _claim_uid(ref: str) -> str:
    return uuid5_url(f"tessera-sim/claim/{ref}")


def _ns(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "default")


def _name(obj: dict[str, Any]) -> str:
    md = obj.get("metadata") or {}
    return str(md.get("name") or md.get("generateName") or "")


def _dup(m: Manifest, message: str) -> ManifestError:
    return ManifestError(
        message, file=m.source.file, doc=m.source.doc, obj=m.ref(), field="metadata.name"
    )


def _check_selectors(m: Manifest) -> None:
    """CEL selectors must compile and be within the cost limit, as the API server checks on create."""
    from tessera.cel import CelCompileError, CelCostError, check_selector

    spec = m.obj.get("spec") or {}
    places: list[tuple[str, Any]] = []
    if m.kind == "DeviceClass":
        places.append(("spec.selectors", spec.get("selectors")))
    else:
        base = "spec.spec" if m.kind == "ResourceClaimTemplate" else "spec"
        for r in claim_requests(m.obj):
            for alt in r.alternatives:
                places.append((f"{base}.{alt.field}.selectors", alt.selectors))
    for where, sels in places:
        for k, sel in enumerate(sels or []):
            expr = ((sel or {}).get("cel") or {}).get("expression")
            if not isinstance(expr, str):
                continue
            try:
                check_selector(expr)
            except CelCostError as e:
                raise ManifestError(
                    f"Forbidden: {e} ({e.detail}): bound the iterations (fewer or smaller lists)",
                    file=m.source.file,
                    doc=m.source.doc,
                    obj=m.ref(),
                    field=f"{where}[{k}].cel.expression",
                ) from None
            except CelCompileError as e:
                raise ManifestError(
                    f"CEL compile error: {e}",
                    file=m.source.file,
                    doc=m.source.doc,
                    obj=m.ref(),
                    field=f"{where}[{k}].cel.expression",
                ) from None


def _fresh_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """A new pod dict sharing its content with ``pod`` but for the levels a run writes to
    (``metadata``, ``spec``, ``status``)."""
    return {**pod, "metadata": dict(pod.get("metadata") or {}), "spec": dict(pod.get("spec") or {})}


#: The pod claim name under which a pod's synthesised extended-resource claim travels with
#: its other claims (upstream's in-memory name of that claim; not a valid claim name).
EXTENDED_POD_CLAIM = "<extended-resources>"


def whole_gpu_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The claim spec as the device-plugin model would serve it: every device whole.

    Capacity requests are replaced by ``cores: 100`` and no memory request, so each device
    books all of its memory (the request policy's default) and all of its cores; a memory
    request stays as a selector (the device must have at least that much).
    """
    out = copy.deepcopy(spec)
    for r in device_requests(out):
        for alt in r.alternatives:
            sub = alt.body  # the copy's own dict: rewritten in place
            mem = (alt.capacity_requests or {}).get("memory")
            if mem is not None:
                cap = f'device.capacity["{DRIVER_NAME}"].memory'
                expr = f'has({cap}) && {cap}.compareTo(quantity("{Quantity.parse(mem).canonical()}")) >= 0'
                sub.setdefault("selectors", []).append({"cel": {"expression": expr}})
            sub["capacity"] = {"requests": {"cores": "100"}}
    return out


def _signature(claims: Sequence[dict[str, Any]]) -> str | None:
    """A key for "these claim specs", or None where a failure may not be permanent.

    Capacity on a node only shrinks during a simulation, so an unsatisfiable set of specs stays
    unsatisfiable; except with allocationMode All, whose device set shrinks with it.
    """
    specs = [c.get("spec") or {} for c in claims]
    text = json.dumps(specs, sort_keys=True)
    if '"All"' in text:
        return None
    return text


_NO_NODE_CONSTRAINTS = json.dumps([None, None, None])


class Simulation:
    """Holds the cluster state; :meth:`run` schedules pods and returns a :class:`SimResult`.

    ``cluster``: the nodes and their ResourceSlices, in scheduling order; ``manifests``: the
    workloads, claims, templates, DeviceClasses and DeviceTaintRules, as loaded (pods are
    scheduled in their order). ``seed``: the allocator's random choices (upstream's are random);
    ``features``: the allocator's feature gates (1.37 defaults); ``policy``: the node and GPU
    order (``first-fit``, ``binpack``, ``spread``, ``topology``; HAMi's annotations override it
    per pod); ``whole_gpus``: serve every claim with whole devices (the device-plugin model);
    ``class_map``: DeviceClass renames (another driver's class -> Tessera's). Raises
    :class:`~tessera.api.errors.ManifestError` for input the API server would refuse (a
    duplicate name included), naming the object and field; ``ValueError`` for an unknown
    ``policy``.
    """

    def __init__(
        self,
        cluster: Cluster,
        manifests: Sequence[Manifest],
        *,
        seed: int = 0,
        features: Features | None = None,
        policy: str = "first-fit",
        whole_gpus: bool = False,
        class_map: Mapping[str, str] | None = None,
    ) -> None:
        with collector_paused():  # tessera.api.heap: the index holds no cycles
            self._setup(cluster, manifests, seed, features, policy, whole_gpus, class_map)

    def _setup(
        self,
        cluster: Cluster,
        manifests: Sequence[Manifest],
        seed: int,
        features: Features | None,
        policy: str,
        whole_gpus: bool,
        class_map: Mapping[str, str] | None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(
                f"unknown placement policy {policy!r}: use one of {', '.join(POLICIES)}"
            )
        self.warnings: list[str] = []
        if class_map:
            manifests = map_device_classes(manifests, class_map, self.warnings)
        self.policy = policy
        self.whole_gpus = whole_gpus
        self.cluster = cluster
        self.nodes = [Node(n.name, n.labels) for n in cluster.nodes]
        self.taints = {n.name: n.taints for n in cluster.nodes if n.taints}
        #: Per node name its mode (:attr:`~tessera.sim.cluster.SimNode.mode`): legacy-mode
        #: nodes publish no ResourceSlices; their GPUs are legacy mode's (:attr:`legacy_nodes`).
        self.node_modes = {n.name: n.mode for n in cluster.nodes}
        self.legacy_nodes = [
            legacy_node(n.node_object()) for n in cluster.nodes if n.mode == MODE_LEGACY
        ]
        self._node_index = {n.name: i for i, n in enumerate(self.nodes)}
        #: Namespaces (input Namespace objects) whose label :data:`MODE_LABEL` is ``legacy``:
        #: the webhook converts their HAMi pods for legacy mode.
        self.legacy_namespaces: set[str] = set()
        #: Legacy mode's decisions so far (the extender's bookings), grouped by node and
        #: carried from one placement to the next.
        self._legacy_grouped = BookedPods()
        self._legacy_memo = DecisionMemo()
        self._legacy_devices: dict[str, tuple[str, str | None]] | None = None  # by GPU UUID
        #: With ``record_choices``: each legacy pod's :class:`~tessera.scheduler.legacy.Decision`.
        self.legacy_decisions: dict[str, Decision] = {}
        self.classes: dict[str, dict[str, Any]] = {}
        self.templates: dict[tuple[str, str], dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: list[Manifest] = []
        #: DeviceTaintRules (API objects), merged into the devices they select.
        self.taint_rules: list[dict[str, Any]] = []
        slices = [s for n in cluster.nodes if n.mode != MODE_LEGACY for s in n.slices]
        slice_names = {_name(s): s for s in slices}
        seen: dict[tuple[str, str, str], Manifest] = {}
        for m in manifests:
            check(m)
            kind = m.kind
            if m.obj.get("apiVersion") == BETA2:
                self.warnings.append(
                    f"{m.source}: {m.ref()}: {BETA2} is read as resource.k8s.io/v1 (the same shape)"
                )
            if kind == "ResourceSlice":
                # Identical slices (e.g. simulate's own -o yaml fed back beside --cluster) are
                # the same object; a different slice under a published name is an error.
                prior = slice_names.get(m.name)
                if prior is not None and prior.get("spec") == m.obj.get("spec"):
                    continue
                if prior is not None:
                    raise _dup(
                        m,
                        "a ResourceSlice of this name is already published (by a cluster node or an earlier file)",
                    )
                slice_names[m.name] = m.obj
                slices.append(m.obj)
                continue
            if (
                kind == "DeviceClass"
                and m.name == DEVICE_CLASS_NAME
                and m.obj.get("spec") == default_device_class()["spec"]
            ):
                continue
            key = (kind, m.namespace if kind not in CLUSTER_SCOPED_KINDS else "", m.name)
            if kind in (
                "DeviceClass",
                "DeviceTaintRule",
                "ResourceClaimTemplate",
                "ResourceClaim",
                "Pod",
            ):
                if key in seen:
                    raise _dup(
                        m,
                        f"duplicate {kind} name (first in {seen[key].source}): names must be unique",
                    )
                seen[key] = m
                if kind not in ("Pod", "DeviceTaintRule"):  # no CEL selectors in these
                    _check_selectors(m)
            if kind == "DeviceClass":
                self.classes[m.name] = m.obj
            elif kind == "DeviceTaintRule":
                self.taint_rules.append(m.obj)
            elif kind == "ResourceClaimTemplate":
                self.templates[(m.namespace, m.name)] = m.obj
            elif kind == "ResourceClaim":
                claim = copy.deepcopy(m.obj)
                # As the API server stores it: in a namespace (messages name it ns/name).
                claim.setdefault("metadata", {}).setdefault("namespace", m.namespace)
                if whole_gpus and not (claim.get("status") or {}).get("allocation"):
                    claim["spec"] = whole_gpu_spec(claim.get("spec") or {})
                self.claims[(m.namespace, m.name)] = claim
            elif kind == "Pod":
                self.pods.append(m)
            elif kind == "Namespace":
                if ((m.obj.get("metadata") or {}).get("labels") or {}).get(
                    MODE_LABEL
                ) == MODE_LEGACY:
                    self.legacy_namespaces.add(m.name)
            else:
                self.warnings.append(
                    f"{m.source}: {m.ref()}: "
                    + (foreign_workload(m.obj) or f"kind {kind} is not simulated; ignored")
                )
        self.classes.setdefault(DEVICE_CLASS_NAME, default_device_class())
        # Another vendor's driver publishing devices installs its DeviceClass too: a cluster
        # whose nodes publish such devices has it unless the input gives its own.
        drivers = {str((s.get("spec") or {}).get("driver")) for s in slices}
        for v in PLANNED:
            if v.driver in drivers and v.device_class not in self.classes:
                self.classes[v.device_class] = vendor_device_class(v)
        #: The vendors whose HAMi requests become claims for their drivers (their DeviceClass
        #: exists: tessera.api.vendors.installed_vendors), and the Hygon cards' compute units.
        self.vendors = installed_vendors(set(self.classes))
        #: Extended resource name -> the DeviceClass kube-scheduler serves it from (KEP-5004).
        self.served = served_extended_resources(self.classes.values())
        self._extended_specs: dict[str, dict[str, Any]] = {}
        # Synthesised claims given as input, by namespace and owner UID (findExtendedResourceClaim).
        self._extended_given: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for (cns, _), c in self.claims.items():
            if is_extended_claim(c):
                for o in (c.get("metadata") or {}).get("ownerReferences") or []:
                    if isinstance(o, dict) and o.get("uid"):
                        self._extended_given.setdefault((cns, str(o["uid"])), []).append(c)
        #: Pending pods' synthesised claims (kube-scheduler makes them only when it binds):
        #: by pod ``namespace/name``, for explain.
        self.extended_pending: dict[str, dict[str, Any]] = {}
        self.slices = slices
        self.index = SliceIndex(slices, [taint_rule_from_dict(r) for r in self.taint_rules])
        # Without DRAConsumableCapacity kube-scheduler counts every result as dedicated.
        self.state = AllocatedState(
            consumable_capacity=(features or Features()).consumable_capacity
        )
        for c in self.claims.values():
            self.state.add_claim(c)
        # Allocations are only ever added here, never released, so a node that cannot satisfy
        # a set of claim specs now never will: per pod shape, the first node still worth trying.
        self._cursor: dict[str | None, tuple[int, dict[Unfit, int]]] = {}
        self._unsat: list[dict[str, Unfit]] = [{} for _ in self.nodes]
        self._node_usage: list[Fraction] = [Fraction(0) for _ in self.nodes]
        self._usage_stale: set[int] = set()
        self._placed = 0
        self._tier = 0  # the topology tier _try_node reached
        #: With ``record_choices`` (explain sets it), each scheduled pod's :class:`Choice`.
        self.record_choices = False
        self.choices: dict[str, Choice] = {}
        #: Claims of the pods scheduled so far (placed or not): progress output's claims per second.
        self.claims_seen = 0
        # Pending pods whose claims fit on no node: explained once the run is over (against
        # the final state, which is what a user asks about), once per distinct claim shape.
        self._to_explain: dict[
            str, tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]
        ] = {}
        self._reasons: dict[str, tuple[list[tuple[int, str, str]], list[str]]] = {}
        self._facts: dict[tuple[int, ...], _SpecFacts] = {}
        self._devices: dict[tuple[str, str, str], Device] | None = None  # by id, built on first use
        self._spec_texts: dict[tuple[int, ...], tuple[list[Any], str]] = {}
        # Specs are never modified once a claim exists (template claims share the template's).
        self.allocator = Allocator(
            self.index, self.classes, self.state, features, random.Random(seed), frozen_specs=True
        )
        # GPU memory sizes for HAMi's gpumem-percentage (the same function as `tessera convert`).
        self.memory_sizes = gpu_memory_sizes(self.slices)
        self.compute_units = compute_unit_sizes(self.slices)
        self._check_classes(manifests)
        self._warn_evicted()

    def _warn_evicted(self) -> None:
        """A claim already allocated on a device tainted ``NoExecute`` (by its slice or a
        DeviceTaintRule), whose result does not tolerate the taint: in the cluster the device
        taint eviction controller (KEP-5055) evicts the pods using it. The simulation keeps the
        allocation; one warning per claim names the device, the taint and the rule."""
        if not any(t.effect == "NoExecute" for d in self.index.devices() for t in d.taints):
            return
        for c in self.claims.values():
            why = self.eviction([c])
            if why is not None:
                md = c.get("metadata") or {}
                self.warnings.append(
                    f"ResourceClaim {md.get('namespace', 'default')}/{md.get('name', '')}: {why} "
                    "(the simulation keeps the allocation)"
                )

    def eviction(self, claims: Sequence[Mapping[str, Any]]) -> str | None:
        """Why the device taint eviction controller evicts the pods using ``claims`` (their
        ``status.allocation``): the first result on a device with a ``NoExecute`` taint its
        tolerations do not stop (:func:`~tessera.allocator.core.evicting_taint`), in words;
        None when nothing evicts them."""
        for c in claims:
            alloc = (c.get("status") or {}).get("allocation") or {}
            for r in (alloc.get("devices") or {}).get("results") or []:
                d = self._device(str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
                hit = evicting_taint(d.taints, r.get("tolerations") or []) if d else None
                if hit is None or d is None:
                    continue
                t, seconds = hit
                rule = f" (DeviceTaintRule {t.rule})" if t.rule else ""
                when = (
                    ""
                    if seconds is None
                    else f" after the toleration's tolerationSeconds ({seconds} s)"
                )
                return (
                    f"device {'/'.join(d.id)} has taint {t.text()}{rule} and no toleration with "
                    "effect NoExecute for it: the device taint eviction controller evicts the pods "
                    f"using it{when}"
                )
        return None

    def _check_classes(self, manifests: Iterable[Manifest]) -> None:
        """A request naming a DeviceClass the simulation lacks is not bad input: kube-scheduler
        leaves the pods that use it pending (``request r: device class c does not exist``) and
        schedules the others. Warn once per claim or template, with a hint."""
        for m in manifests:
            if m.kind not in ("ResourceClaim", "ResourceClaimTemplate"):
                continue
            base = "spec.spec" if m.kind == "ResourceClaimTemplate" else "spec"
            for r in claim_requests(m.obj):
                for alt in r.alternatives:
                    cls = alt.device_class_name
                    if cls and cls not in self.classes:
                        self.warnings.append(
                            f"{m.source}: {m.ref()}: {base}.{alt.field}.deviceClassName: "
                            f"DeviceClass {cls!r} does not exist: pods using it stay pending{self.class_hint(cls)}"
                        )

    def class_hint(self, cls: str) -> str:
        """What to do about a missing DeviceClass ``cls`` ("" when nothing useful to say)."""
        if cls in NVIDIA_CLASSES:
            return (
                f" ({cls} is the NVIDIA DRA driver's class: --class-map {cls}={DEVICE_CLASS_NAME} runs these requests "
                "on Tessera's GPUs, or add the DeviceClass and the driver's ResourceSlices)"
            )
        close = difflib.get_close_matches(cls, list(self.classes), n=1)
        if close:
            return f" (did you mean {close[0]}?)"
        return (
            f" (known: {', '.join(sorted(self.classes))}; add the DeviceClass, or map it with --class-map "
            f"{cls}=CLASS)"
        )

    def missing_class(self, claims: Sequence[dict[str, Any]]) -> MissingClass | None:
        """PreFilter's check (validateDeviceClass): the first request of ``claims`` whose class
        does not exist, or None."""
        for c in claims:
            for r in device_requests(c.get("spec")):
                for alt in r.alternatives:
                    cls = alt.device_class_name
                    if cls and cls not in self.classes:
                        return MissingClass(alt.name, cls)
        return None

    # ------------------------------------------------------------------------------------------
    def run(self, on_pod: Callable[[str], None] | None = None) -> SimResult:
        """Schedule every pod in input order. ``on_pod(ref)`` is called after each (progress)."""
        from tessera.convert import Conversion, ConversionError, convert_pod
        from tessera.convert.hami import GPUMEM_PERCENTAGE, VOLCANO_MEMORY_PERCENTAGE

        _PERCENTAGES = (GPUMEM_PERCENTAGE, VOLCANO_MEMORY_PERCENTAGE)

        placements: list[Placement] = []
        pending: list[Pending] = []
        scheduled: list[str] = []
        modes: dict[str, str] = {}
        default_policy = pod_policy(self.policy, {})  # a pod without annotations
        out_pods: list[dict[str, Any]] = []
        out_templates: list[dict[str, Any]] = list(self.templates.values())
        # What a run creates and keeps (pods, claims, results) holds no reference cycles: the
        # cyclic collector is paused for the run (tessera.api.heap) instead of scanning an ever
        # larger heap (a quarter of the run's time at 50,000 pods); refcounting frees what the
        # run drops.
        with collector_paused():
            for m in self.pods:
                legacy = self.legacy_conversion(m)
                mode = MODE_DRA if legacy is None else MODE_LEGACY
                if legacy is not None:
                    conv = legacy
                else:
                    try:
                        if mentions_hami(m.obj):
                            conv = convert_pod(
                                m.obj,
                                memory_sizes=self.memory_sizes,
                                source=str(m.source),
                                served=self.served,
                                vendors=self.vendors,
                                compute_units=self.compute_units,
                            )
                        else:  # nothing to convert: a copy of the levels the run writes to
                            conv = Conversion(
                                pod=_fresh_pod(m.obj), templates=[], warnings=[], requests=[]
                            )
                    except ConversionError as e:
                        if self.memory_sizes or e.field not in _PERCENTAGES:
                            raise
                        # No device of the cluster publishes memory, so a percentage is of nothing: the pod
                        # stays as written and pending for its unserved HAMi resources, as without Tessera.
                        self.warnings.append(
                            f"{m.source}: {m.ref()}: {e.field}: no GPU of the cluster publishes "
                            "memory; left unconverted"
                        )
                        conv = Conversion(
                            pod=copy.deepcopy(m.obj), templates=[], warnings=[], requests=[]
                        )
                pod = conv.pod  # a new dict: convert_pod never returns its input
                self.warnings.extend(conv.warnings)  # convert_pod already names the source
                for t in conv.templates:
                    key = (_ns(t), _name(t))
                    if key not in self.templates:
                        self.templates[key] = t
                        out_templates.append(t)
                ref = f"{_ns(pod)}/{_name(pod)}"
                md = pod.setdefault("metadata", {})
                md.setdefault("namespace", _ns(pod))
                md.setdefault("uid", _pod_uid(ref))
                annotations = (pod.get("metadata") or {}).get("annotations")
                policy = pod_policy(self.policy, annotations) if annotations else default_policy
                modes[ref] = mode
                if mode == MODE_LEGACY:
                    outcome, devices = self._schedule_legacy(pod, ref)
                else:
                    outcome, devices = self._schedule(pod, ref, policy), None
                node, reason, claims = outcome.node, outcome.reason, outcome.claims
                generated = self._claim_statuses(pod)
                if node is None:
                    pending.append(Pending(ref, reason, outcome.cause, mode))
                    pod["status"] = {
                        "phase": "Pending",
                        "conditions": [
                            {
                                "type": "PodScheduled",
                                "status": "False",
                                "reason": "Unschedulable",
                                "message": reason,
                            }
                        ],
                    }
                else:
                    pod.setdefault("spec", {})["nodeName"] = node
                    pod["status"] = {
                        "phase": "Pending",
                        "conditions": [{"type": "PodScheduled", "status": "True"}],
                    }
                    scheduled.append(ref)
                    if devices is not None:
                        placements.extend(self._legacy_placements(pod, ref, node, devices))
                    else:
                        placements.extend(self._placements(pod, ref, node, claims))
                if generated:
                    pod["status"]["resourceClaimStatuses"] = generated
                ext = next((c for pc, c in claims if pc == EXTENDED_POD_CLAIM), None)
                if ext is not None:
                    self._record_extended(pod, ref, ext, node is not None)
                out_pods.append(pod)
                if on_pod is not None:
                    on_pod(ref)
            self._add_explanations(pending, out_pods)
            gpus = self._gpu_usage()
        objects: list[dict[str, Any]] = []
        objects.extend(self.classes.values())
        objects.extend(self.slices)
        objects.extend(self.taint_rules)
        objects.extend(out_templates)
        objects.extend(self.claims.values())
        objects.extend(out_pods)
        return SimResult(placements, pending, gpus, objects, self.warnings, scheduled, modes)

    def _extended_claim(
        self, pod: dict[str, Any], requests: list[dict[str, Any]]
    ) -> tuple[dict[str, Any] | None, str | None]:
        """The claim kube-scheduler synthesises for the pod's served extended resources
        (:mod:`tessera.scheduler.extended`): the one it made in an earlier cycle (a pod read from a
        cluster or from simulate's output: ``status.extendedResourceClaimStatus``, else an
        annotated claim the pod owns), else a new one, not yet stored. An earlier claim still
        unallocated is upstream's stale claim: the pod waits (reason returned)."""
        ns = _ns(pod)
        st = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
        found = self.claims.get((ns, str(st.get("resourceClaimName", "")))) if st else None
        if found is None:
            uid = (pod.get("metadata") or {}).get("uid")
            found = next(
                (c for c in self._extended_given.get((ns, str(uid)), ()) if owned_by(c, pod)),
                None,
            )
        if found is not None:
            if (found.get("status") or {}).get("allocation"):
                return found, None
            n = len(self.nodes)
            return None, f"0/{n} nodes are available: {n} cannot schedule extended resource claim."
        key = spec_key(requests)
        spec = self._extended_specs.get(key)
        if spec is None:  # one spec object per shape: the allocator memoises per spec
            spec = {"devices": {"requests": requests}}
            if self.whole_gpus:
                spec = whole_gpu_spec(spec)
            self._extended_specs[key] = spec
        name = claim_name(_name(pod), pod["metadata"]["uid"])
        claim = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {
                "name": name,
                "namespace": ns,
                "uid": _claim_uid(f"{ns}/{name}"),
                "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": _name(pod),
                        "uid": pod["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": spec,
        }
        return claim, None

    def _record_extended(
        self, pod: dict[str, Any], ref: str, claim: dict[str, Any], bound: bool
    ) -> None:
        """After the pod's turn: a bound pod's synthesised claim is kept (as kube-scheduler
        creates it at PreBind) and named in ``status.extendedResourceClaimStatus``; a pending
        pod's is only remembered for explain."""
        if not bound:
            self.extended_pending[ref] = claim
            return
        self.claims[(_ns(claim), _name(claim))] = claim
        pod["status"]["extendedResourceClaimStatus"] = {
            "resourceClaimName": _name(claim),
            "requestMappings": extended_requests(pod, self.served).mappings,
        }

    def extended_claim_of(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """The synthesised extended-resource claim of ``pod`` (a pod of the run's result):
        the one its status names, or a pending pod's remembered one; None without."""
        md = pod.get("metadata") or {}
        ns = str(md.get("namespace") or "default")
        st = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
        if st.get("resourceClaimName"):
            return self.claims.get((ns, str(st["resourceClaimName"])))
        return self.extended_pending.get(f"{ns}/{md.get('name') or md.get('generateName') or ''}")

    def _claim_statuses(self, pod: dict[str, Any]) -> list[dict[str, str]]:
        """``status.resourceClaimStatuses`` as the resource-claim controller sets it: the claim
        made from each template entry (kept from a pod read from a cluster)."""
        out: list[dict[str, str]] = []
        ns = _ns(pod)
        for pc in pod_claims(pod):
            if not pc.template_name:
                continue
            name = pod_claim_name(pod, pc, simulated=True)
            if name is not None and (ns, name) in self.claims:
                out.append({"name": pc.name, "resourceClaimName": name})
        return out

    def _resolve_claims(
        self, pod: dict[str, Any], ref: str
    ) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
        """``[(pod claim name, claim)]`` for the pod, creating template claims; or a reason."""
        out: list[tuple[str, dict[str, Any]]] = []
        ns = _ns(pod)
        for pc in pod_claims(pod):
            pcname = pc.name
            if pc.claim_name:
                key = (ns, pc.claim_name)
                claim = self.claims.get(key)
                if claim is None:
                    return [], f'resourceclaim "{key[1]}" not found'
                out.append((pcname, claim))
            elif pc.template_name:
                tkey = (ns, pc.template_name)
                generated = generated_claim_name(pod, pcname)
                if generated and (ns, generated) in self.claims:
                    # The claim controller already made it (a pod read from a cluster): the
                    # scheduler only needs the claim, as here.
                    out.append((pcname, self.claims[(ns, generated)]))
                    continue
                tmpl = self.templates.get(tkey)
                if tmpl is None:
                    return [], f'resourceclaimtemplate "{tkey[1]}" not found'
                cname = generated or template_claim_name(_name(pod), pcname)
                key = (ns, cname)
                claim = self.claims.get(key)
                if claim is None:
                    tspec = tmpl.get("spec") or {}
                    tmd = (
                        tspec.get("metadata") or {}
                    )  # only its labels and annotations are read, copied
                    annotations = dict(tmd.get("annotations") or {})
                    annotations[POD_CLAIM_NAME_ANNOTATION] = pcname
                    claim = {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceClaim",
                        "metadata": {
                            "name": cname,
                            "namespace": ns,
                            "uid": _claim_uid(f"{ns}/{cname}"),
                            "labels": dict(tmd.get("labels") or {}),
                            "annotations": annotations,
                            "ownerReferences": [
                                {
                                    "apiVersion": "v1",
                                    "kind": "Pod",
                                    "name": _name(pod),
                                    "uid": pod["metadata"]["uid"],
                                    "controller": True,
                                    "blockOwnerDeletion": True,
                                }
                            ],
                        },
                        # Shared with the template and never mutated (specs are immutable).
                        "spec": whole_gpu_spec(tspec.get("spec") or {})
                        if self.whole_gpus
                        else tspec.get("spec") or {},
                    }
                    if not claim["metadata"]["labels"]:
                        del claim["metadata"]["labels"]
                    self.claims[key] = claim
                out.append((pcname, claim))
        return out, None

    def _schedule(self, pod: dict[str, Any], ref: str, policy: PodPolicy) -> _Outcome:
        """The pod placed on a node (``_Outcome(node, "", claims)``) or left pending
        (``_Outcome(None, reason, claims, cause)``)."""
        ext = extended_requests(pod, self.served)
        if ext.unserved:
            n = len(self.nodes)
            # kube-scheduler's FitError: "N reason" strings, sorted as strings.
            parts = ", ".join(sorted(f"{n} Insufficient {r}" for r in ext.unserved))
            return _Outcome(None, f"0/{n} nodes are available: {parts}.", [])
        claims, reason = self._resolve_claims(pod, ref)
        if not reason and ext.requests:
            special, reason = self._extended_claim(pod, ext.requests)
            if special is not None:
                claims.append((EXTENDED_POD_CLAIM, special))
        self.claims_seen += len(claims)
        if reason:
            return _Outcome(None, reason, [])
        todo = [c for _, c in claims if not (c.get("status") or {}).get("allocation")]
        done = [c for _, c in claims if (c.get("status") or {}).get("allocation")]
        if todo and self.legacy_nodes and len(self.legacy_nodes) == len(self.nodes):
            n = len(self.nodes)
            msg = (
                f"0/{n} nodes are available: no node is in DRA mode (all {n} are labelled "
                f"{MODE_LABEL}={MODE_LEGACY}: they publish no ResourceSlices for the pod's claims); "
                f"a node without the label (or {MODE_LABEL}={MODE_DRA}) serves DRA mode, or give "
                f"the pod spec.schedulerName {LEGACY_SCHEDULER} for legacy mode."
            )
            return _Outcome(None, msg, claims)
        specs = self._spec_facts(todo)
        missing = specs.missing_class
        if missing is not None:
            hint = self.class_hint(missing.device_class)
            msg = f"0/{len(self.nodes)} nodes are available: {missing.reason}.{hint}"
            return _Outcome(None, msg, claims, PendingCause.MISSING_CLASS)
        for c in done:
            rf = (c.get("status") or {}).get("reservedFor") or []
            if len(rf) >= 256 and not any(r.get("name") == _name(pod) for r in rf):
                return _Outcome(None, "resourceclaim in use", claims)
        n_total = len(self.nodes)
        if not specs.signature_known:
            specs.signature, specs.signature_known = _signature(todo), True
        sig = specs.signature
        # Nodes already proven unable to take this pod shape are skipped as a prefix: the scan
        # resumes at the first node not yet proven (failures are permanent, see _signature).
        key = None
        if sig is not None and not done and policy.nodes == "first-fit":
            spec = pod.get("spec") or {}
            where = (spec.get("nodeName"), spec.get("nodeSelector"), spec.get("affinity"))
            key = sig + (
                _NO_NODE_CONSTRAINTS
                if where == (None, None, None)
                else json.dumps(list(where), sort_keys=True)
            )
        start, counts = self._cursor.get(key, (0, {})) if key else (0, {})
        counts = dict(counts)
        prefix = key is not None
        if policy.nodes != "first-fit":
            for j in self._usage_stale:
                self._node_usage[j] = node_usage(
                    self.state, self.index.by_node.get(self.nodes[j].name, [])
                )
            self._usage_stale.clear()
        order = (
            range(start, n_total)
            if policy.nodes == "first-fit"
            else order_nodes(policy.nodes, self._node_usage)
        )
        # kube-scheduler scores the nodes that fit; its DynamicResources plugin prefers nodes where
        # an earlier firstAvailable subrequest fits (prioritized_list_score), which decides among
        # otherwise equal nodes. With first-fit, the scan goes on past the first fit only while a
        # better score is still possible; other node policies take their first fit.
        top = specs.top_score
        # The topology GPU policy ranks placements by tier (TOPOLOGY_TIERS) before anything
        # else: the scan goes on past a fit while a better tier is possible, trying only the
        # stricter tiers on the nodes after it.
        tiers = policy.gpus == "topology" and has_multi_gpu_request(todo)
        best: tuple[PlacementRank, int, list[dict[str, Any]]] | None = None
        examined: list[int] = []
        fits: dict[int, PlacementRank] = {}
        for pos, i in enumerate(order):
            node = self.nodes[i]
            examined.append(i)
            # Node affinity and taints are the scheduler's first filters: a node the pod does not
            # select (or whose taint it does not tolerate) says so even when the claims' shape is
            # known not to fit there.
            known = self._unsat[i].get(sig) if sig is not None else None
            if (
                known is not None
                and node_refusal(pod, node, self.taints.get(node.name, ()), done) is None
            ):
                why: Unfit | _NotBetter | AllocationError | list[dict[str, Any]] = known
            else:
                why = self._try_node(
                    pod, node, todo, done, policy, best[0].tier if best and tiers else None
                )
                if isinstance(why, _NotBetter):
                    continue
                if isinstance(why, NodeAllocationError):
                    # Upstream's ErrFailedAllocationOnNode: this node's reason, not the pod's.
                    why = Unfit(str(why), devices=True)
                if isinstance(why, Unfit) and why.devices and sig is not None:
                    self._unsat[i][sig] = why
            if isinstance(why, AllocationError):
                return _Outcome(
                    None, f"allocation error: {why}", claims, PendingCause.ALLOCATION_ERROR
                )
            if isinstance(why, list):
                # Other node policies take their first fit: the score counts under first-fit.
                score = prioritized_list_score(todo, why) if top else 0  # no firstAvailable: 0
                first_fit = policy.nodes == "first-fit"
                rank = placement_rank(self._tier if tiers else 0, score if first_fit else 0, pos)
                fits[i] = rank
                if best is None:
                    if key is not None:
                        self._cursor[key] = (i, dict(counts))
                    prefix = False
                if best is None or rank < best[0]:
                    best = (rank, i, why)
                if best[0].tier == 0 and (score >= top or not first_fit):
                    break
                continue
            assert isinstance(why, Unfit)  # _NOT_BETTER went on above
            counts[why] = counts.get(why, 0) + 1
            if prefix and key is not None:
                self._cursor[key] = (i + 1, dict(counts))
        if self.record_choices:
            self.choices[ref] = Choice(policy, tiers, start if key else 0, examined, fits)
        if best is not None:
            _, i, results = best
            node = self.nodes[i]
            why_evicted = self.eviction([{"status": {"allocation": res}} for res in results] + done)
            if why_evicted is not None:
                # kube-scheduler binds the pod, the eviction controller deletes it: it never
                # runs, and its template claims go with it (nothing stays allocated).
                msg = f"scheduled on {node.name}, then evicted: {why_evicted}"
                return _Outcome(None, msg, claims, PendingCause.EVICTED)
            for c, res in zip(todo, results, strict=True):
                c["status"] = {"allocation": res}
                self.state.add_claim(c)
            self._placed += 1
            self._usage_stale.add(i)  # recomputed only when a policy orders nodes by usage
            uid = pod["metadata"]["uid"]
            for c in todo + done:
                rf = c.setdefault("status", {}).setdefault("reservedFor", [])
                if not any(r.get("resource") == "pods" and r.get("uid") == uid for r in rf):
                    rf.append({"resource": "pods", "name": _name(pod), "uid": uid})
            return _Outcome(node.name, "", claims)
        # kube-scheduler's FitError: "N reason" strings, sorted as strings.
        parts = ", ".join(sorted(f"{v} {k.reason}" for k, v in counts.items()))
        msg = (
            f"0/{n_total} nodes are available: {parts}."
            if parts
            else f"0/{n_total} nodes are available."
        )
        if any(k.devices for k in counts):
            self._to_explain[ref] = (pod, todo, done)
        return _Outcome(None, msg, claims)

    # ---- legacy mode ---------------------------------------------------------------------
    def legacy_conversion(self, m: Manifest) -> Any:
        """The pod ``m`` as legacy mode takes it (a :class:`~tessera.convert.Conversion` whose
        pod the run may write to), or None when the default scheduler takes it (DRA mode). A
        pod is legacy mode's when its ``spec.schedulerName`` is
        :data:`~tessera.convert.LEGACY_SCHEDULER`, or when it asks for HAMi GPUs in a Namespace
        labelled ``gpu.tessera.dev/mode: legacy`` (:attr:`legacy_namespaces`) and the webhook's
        legacy conversion (:func:`tessera.convert.legacy_pod`) gives it that scheduler. Raises
        :class:`~tessera.convert.ConversionError` for requests the webhook refuses."""
        from tessera.convert import Conversion, legacy_pod

        spec = m.obj.get("spec") or {}
        if spec.get("schedulerName") == LEGACY_SCHEDULER:
            return Conversion(pod=_fresh_pod(m.obj))
        if m.namespace not in self.legacy_namespaces or not mentions_hami(m.obj):
            return None
        sizes = sorted({s for n in self.legacy_nodes for s in n.memory_sizes}, reverse=True)
        conv = legacy_pod(m.obj, memory_sizes=sizes, source=str(m.source))
        if (conv.pod.get("spec") or {}).get("schedulerName") != LEGACY_SCHEDULER:
            self.warnings.extend(conv.warnings)  # another scheduler kept: not legacy mode's
            return None
        return Conversion(pod=_fresh_pod(conv.pod), warnings=list(conv.warnings))

    def _schedule_legacy(
        self, pod: dict[str, Any], ref: str
    ) -> tuple[_Outcome, list[list[ContainerDevice]] | None]:
        """Legacy mode's scheduler for ``pod``: kube-scheduler's node filters
        (:func:`~tessera.scheduler.nodes.node_refusal`), then legacy mode's decision
        (:func:`tessera.scheduler.legacy.decide`, the extender's) over the legacy nodes left
        and the legacy pods booked so far. Returns the outcome and, when placed, the GPUs per
        container (pod containers' order; the pod's HAMi records are written on it and its
        booking kept). A pod asking for no HAMi GPU goes to the first node its filters leave."""
        n_total = len(self.nodes)
        if not self.legacy_nodes:
            msg = (
                f"0/{n_total} nodes are available: no node is in legacy mode (label "
                f"{MODE_LABEL}={MODE_LEGACY}), the only nodes the scheduler {LEGACY_SCHEDULER} "
                "places pods on; label a node so, or leave spec.schedulerName unset for DRA mode."
            )
            return _Outcome(None, msg, []), None
        counts: dict[str, int] = {}
        candidates = []
        for ln in self.legacy_nodes:
            node = self.nodes[self._node_index[ln.name]]
            refusal = node_refusal(pod, node, self.taints.get(ln.name, ()))
            if refusal is not None:
                counts[refusal.reason] = counts.get(refusal.reason, 0) + 1
            else:
                candidates.append(ln)
        decision = decide(
            pod,
            candidates,
            self._legacy_grouped,
            default_policy=self.policy,
            memo=self._legacy_memo,
        )
        self.warnings.extend(decision.warnings)
        if self.record_choices:
            self.legacy_decisions[ref] = decision
        if not decision.hami:
            for node in self.nodes:
                if node_refusal(pod, node, self.taints.get(node.name, ())) is None:
                    return _Outcome(node.name, "", []), []
        best = decision.best() if decision.hami else None
        if best is not None and best.devices is not None:
            devices = [list(c) for c in best.devices]
            record = encode_pod_devices(devices)
            uid = str(pod["metadata"]["uid"])
            booking = Booking(ref, uid, best.node, devices, record)
            self._legacy_grouped = self._legacy_grouped.changed([booking], [])
            md = pod["metadata"]
            md["annotations"] = {
                **(md.get("annotations") or {}),
                VGPU_NODE: best.node,
                DEVICES_ALLOCATED: record,
            }
            md["labels"] = {**(md.get("labels") or {}), VGPU_NODE: best.node}
            return _Outcome(best.node, "", []), devices
        for f in decision.nodes:
            if not f.fits:
                counts[f.reason] = counts.get(f.reason, 0) + 1
        others = n_total - len(self.legacy_nodes)
        if others:
            counts[f"node(s) in DRA mode (label {MODE_LABEL} not {MODE_LEGACY})"] = others
        parts = ", ".join(sorted(f"{v} {k}" for k, v in counts.items()))
        return _Outcome(None, f"0/{n_total} nodes are available: {parts}.", []), None

    def _legacy_placements(
        self, pod: dict[str, Any], ref: str, node: str, devices: list[list[ContainerDevice]]
    ) -> list[Placement]:
        """One :class:`Placement` (``mode`` ``legacy``) per container and GPU of a legacy
        decision: the device the node's register annotation publishes for the GPU's UUID."""
        if self._legacy_devices is None:
            self._legacy_devices = {}
            for ln in self.legacy_nodes:
                for sl in ln.slices:
                    spec = sl.get("spec") or {}
                    for d in spec.get("devices") or []:
                        attrs = d.get("attributes") or {}
                        u = (attrs.get("uuid") or {}).get("string")
                        if u:
                            model = (attrs.get("productName") or {}).get("string")
                            did = f"{spec.get('driver')}/{spec['pool']['name']}/{d['name']}"
                            self._legacy_devices[str(u)] = (did, model)
        out = []
        for ctr, devs in zip(pod_containers(pod), devices, strict=False):
            for d in devs:
                did, model = self._legacy_devices.get(d.uuid, (d.uuid, None))
                out.append(
                    Placement(
                        pod=ref,
                        container=ctr.name,
                        claim="",
                        request="",
                        node=node,
                        device=did,
                        uuid=d.uuid,
                        model=model,
                        memory=Quantity.parse(f"{d.memory_mib}Mi").canonical(),
                        cores=str(d.cores),
                        share_id=None,
                        mode=MODE_LEGACY,
                    )
                )
        return out

    def _spec_facts(self, claims: Sequence[dict[str, Any]]) -> _SpecFacts:
        """What the claims' specs alone decide (:func:`_signature`, :meth:`missing_class`,
        :func:`max_prioritized_list_score`), memoised per tuple of spec objects: a claim made
        from a template shares the template's spec, and specs are never modified here."""
        ids = tuple(id(c.get("spec")) for c in claims)
        got = self._facts.get(ids)
        if got is None:
            got = _SpecFacts(
                [c.get("spec") for c in claims],
                self.missing_class(claims),
                max_prioritized_list_score(claims),
            )
            self._facts[ids] = got
        return got

    def _add_explanations(self, pending: list[Pending], pods: list[dict[str, Any]]) -> None:
        # The records are many small objects on top of a large, settled heap (every pod and
        # claim of the run): run() keeps the cyclic collector off that heap meanwhile.
        by_ref = {f"{_ns(p)}/{_name(p)}": p for p in pods}
        for pend in pending:
            what = self._to_explain.get(pend.pod)
            if not what:
                continue
            pend.reason = f"{pend.reason} {self.explain_claims(*what)}"
            by_ref[pend.pod]["status"]["conditions"][0]["message"] = pend.reason

    def _try_node(
        self,
        pod: dict[str, Any],
        node: Node,
        todo: list[dict[str, Any]],
        done: list[dict[str, Any]],
        policy: PodPolicy,
        below_tier: int | None = None,
    ) -> Unfit | _NotBetter | AllocationError | list[dict[str, Any]]:
        """The allocation results of ``todo`` on ``node`` (one per claim, nothing recorded yet);
        else why the node cannot take the pod (or the allocator's error). Under the topology GPU policy the tier reached
        is left in ``self._tier``; ``below_tier``: try only the tiers better than it, and
        return :data:`_NOT_BETTER` when none fits."""
        refusal = node_refusal(pod, node, self.taints.get(node.name, ()), done)
        if refusal is not None:
            return Unfit(refusal.reason, devices=False)
        rank = device_rank(policy.gpus, self.state)
        variants = topology_variants(todo) if policy.gpus == "topology" else [todo]
        if below_tier is not None:
            variants = variants[:below_tier]
        results = None
        try:
            for tier, variant in enumerate(variants):
                # The stricter variants are copies made for this try: not memoised.
                transient = any(v is not c for v, c in zip(variant, todo, strict=True))
                results = self.allocator.allocate(node, variant, rank, transient=transient)
                if results is not None:
                    self._tier = tier
                    break
        except AllocationError as e:
            return e
        if results is None:
            return _NOT_BETTER if below_tier is not None else CANNOT_ALLOCATE
        return list(results)

    # ------------------------------------------------------------------------------------------
    def node_records(
        self,
        pod: dict[str, Any],
        claims: Sequence[dict[str, Any]],
        done: Sequence[dict[str, Any]] = (),
    ) -> list[NodeRecord]:
        """The allocator's record (:meth:`Allocator.diagnose`) for ``claims`` on every node the
        pod may use (:func:`tessera.scheduler.nodes.node_refusal`: node affinity, taints, where
        its already-allocated claims are available), against the current state."""
        out = []
        for node in self.nodes:
            if node_refusal(pod, node, self.taints.get(node.name, ()), done) is not None:
                continue
            # The search is known to fail here: each device on its own first, and the search's
            # account only where every request has enough devices that fit on their own.
            rec = self.allocator.diagnose(node, claims, search=False)
            if rec.requests and all(
                any(len(rr.fitting) >= max(rr.count, 1) for rr in alts)
                for alts in alternatives(rec.requests).values()
            ):
                rec = self.allocator.diagnose(node, claims)
            out.append(rec)
        return out

    def explain_claims(
        self,
        pod: dict[str, Any],
        claims: Sequence[dict[str, Any]],
        done: Sequence[dict[str, Any]] = (),
    ) -> str:
        """Why ``claims`` fit on none of the nodes the pod may use, per request: read from the
        allocator's record of each such node (:mod:`tessera.sim.reasons`). Memoised per claim
        shape and node constraints (claim names are filled in per pod)."""
        spec = pod.get("spec") or {}
        # The claims' specs as JSON (a JSON value ends where it ends: the key is unambiguous),
        # memoised per spec objects like _signature; then what else decides the answer.
        ids = tuple(id(c.get("spec")) for c in claims)
        specs = self._spec_texts.get(ids)
        if specs is None:
            specs = self._spec_texts[ids] = (
                [c.get("spec") for c in claims],
                json.dumps([c.get("spec") for c in claims], sort_keys=True, default=str),
            )
        key = specs[1] + json.dumps(
            [
                [c.get("status") for c in done],
                spec.get("nodeName"),
                spec.get("nodeSelector"),
                spec.get("affinity"),
                spec.get("tolerations"),
            ],
            sort_keys=True,
            default=str,
        )
        entry = self._reasons.get(key)
        if entry is None:
            records = self.node_records(pod, claims, done)
            entry = (request_clauses(records, len(self.nodes)), self._incomplete_pools(records))
            self._reasons[key] = entry
        clauses, pools = entry
        text = join_clauses(clauses, [f"{_ns(c)}/{_name(c)}" for c in claims])
        if pools:
            text += f"; devices of incomplete pools are never allocated: {', '.join(pools)}"
        return text

    def _incomplete_pools(self, records: Sequence[NodeRecord]) -> list[str]:
        """``driver/pool (incomplete: 2 of resourceSliceCount 3 slices at generation 1)`` for each
        pool the allocator skipped as incomplete on the nodes of ``records`` (dra-spec: a pool
        whose newest generation has fewer slices than ``resourceSliceCount``)."""
        out = []
        for name in sorted({p for r in records for p in r.incomplete_pools}):
            driver, pool = name.split("/", 1)
            have, want, gen = self.index.pool_publication(driver, pool)
            out.append(
                f"{name} (incomplete: {have} of resourceSliceCount {want} slices at generation {gen})"
            )
        return out

    # ------------------------------------------------------------------------------------------
    def _device(self, driver: str, pool: str, name: str) -> Device | None:
        if self._devices is None:
            # The first slice's device of each id, as the scan over the pool's slices finds it.
            self._devices = {}
            for d in self.index.devices():
                self._devices.setdefault(d.id, d)
        return self._devices.get((driver, pool, name))

    def _placements(
        self, pod: dict[str, Any], ref: str, node: str, claims: list[tuple[str, dict[str, Any]]]
    ) -> list[Placement]:
        by_pc = dict(claims)
        out: list[Placement] = []
        for ctr in pod_containers(pod):
            for rc in ctr.claims:
                claim = by_pc.get(rc.name)
                if claim is None:
                    continue
                for r in claim["status"]["allocation"]["devices"]["results"]:
                    if rc.request and r["request"].split("/")[0] != rc.request:
                        continue
                    out.append(self._placement(ref, ctr.name, claim, r, node))
        ext = by_pc.get(EXTENDED_POD_CLAIM)
        if ext is not None:  # containers map to its requests (status.extendedResourceClaimStatus)
            for m in extended_requests(pod, self.served).mappings:
                for r in ext["status"]["allocation"]["devices"]["results"]:
                    if r["request"] == m["requestName"]:
                        out.append(self._placement(ref, m["containerName"], ext, r, node))
        return out

    def _placement(
        self, ref: str, container: str, claim: dict[str, Any], r: dict[str, Any], node: str
    ) -> Placement:
        """One allocation result ``r`` of ``claim`` as a row for ``container``."""
        d = self._device(r["driver"], r["pool"], r["device"])
        attrs = d.attributes if d else {}
        cc = r.get("consumedCapacity") or {}
        return Placement(
            pod=ref,
            container=container,
            claim=f"{_ns(claim)}/{_name(claim)}",
            request=r["request"],
            node=node,
            device=f"{r['driver']}/{r['pool']}/{r['device']}",
            uuid=attrs.get(f"{r['driver']}/uuid"),
            model=attrs.get(f"{r['driver']}/productName"),
            memory=cc.get("memory")
            if cc
            else (d.capacity["memory"].value.canonical() if d and "memory" in d.capacity else None),
            cores=cc.get("cores") if cc else ("100" if d and "cores" in d.capacity else None),
            share_id=r.get("shareID"),
        )

    def _gpu_usage(self) -> list[GPUUsage]:
        """Per GPU its usage: DRA nodes' from the claims' allocations, then legacy nodes' from
        legacy mode's bookings (:func:`tessera.scheduler.legacy.booked_state`)."""
        out = gpu_usage(self.index, self.state, {n.name for n in self.cluster.nodes})
        for ln in self.legacy_nodes:
            state = booked_state(ln, self._legacy_grouped.on(ln.name)[0])
            out.extend(gpu_usage(SliceIndex(ln.slices), state, {ln.name}))
        return out
