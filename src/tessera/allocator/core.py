"""The structured allocator: upstream ``k8s.io/dynamic-resource-allocation/structured``
(incubating variant, Kubernetes 1.37 default features) re-implemented in Python.

:meth:`Allocator.allocate` answers, for one node and the claims of one pod, what upstream
``Allocate(ctx, node, claims)`` answers: one ``AllocationResult`` per claim, ``None`` when the
claims cannot be satisfied on this node, or an :class:`AllocationError`. Search order, pruning,
consumable capacity, counters, taints, constraints and result shape follow dra-spec.md sections
2 and 4; the section numbers are cited where each rule is implemented.
"""

from __future__ import annotations

import functools
import math
import random
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tessera.allocator.model import (
    AllocatedState,
    Capacity,
    Device,
    DeviceID,
    Node,
    Slice,
    UnsupportedAttribute,
    device_on_node,
    node_selector_matches,
    slice_from_dict,
)
from tessera.api.quantity import Quantity
from tessera.cel import (
    CelCompileError,
    CelRuntimeError,
    CompiledSelector,
    SemverValue,
    compile_selector,
)

MAX_RESULTS_PER_CLAIM = 32


@functools.lru_cache(maxsize=4096)
def _parse_quantity(v: str | int) -> Quantity:
    """Quantity.parse for capacity requests, which repeat across claims and calls (Quantity is immutable)."""
    return Quantity.parse(v)


class AllocationError(Exception):
    """Upstream returns an error (not "unsatisfiable"): the pod is retried, never placed.

    ``str()`` uses upstream's message forms (dra-spec.md 4.9).
    """


class _MaxSizeExceeded(Exception):
    """Internal signal: the claim would need more than 32 results (dra-spec.md 4.4)."""


@dataclass(frozen=True)
class Features:
    """``structured.Features``: which optional allocator features are on (1.37 defaults)."""

    admin_access: bool = True
    prioritized_list: bool = True
    partitionable_devices: bool = True
    device_taints: bool = True
    consumable_capacity: bool = True
    device_binding_and_status: bool = True
    list_type_attributes: bool = False

    @classmethod
    def from_names(cls, names: Iterable[str]) -> Features:
        """From the names used in conformance scenarios (``ConsumableCapacity``, ...)."""
        s = set(names)
        return cls(
            admin_access="AdminAccess" in s,
            prioritized_list="PrioritizedList" in s,
            partitionable_devices="PartitionableDevices" in s,
            device_taints="DeviceTaints" in s,
            consumable_capacity="ConsumableCapacity" in s,
            device_binding_and_status="DeviceBindingAndStatus" in s,
            list_type_attributes="ListTypeAttributes" in s,
        )


# ---------------------------------------------------------------------------------------------
# Pools (dra-spec.md 4.2)


@dataclass
class Pool:
    driver: str
    name: str
    slices: list[Slice]  # device slices targeting the node, sorted by slice name
    counters: dict[str, dict[str, Fraction]]  # counter set -> counter -> published value
    complete: bool = True
    invalid: str | None = None
    has_binding_conditions: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.driver, self.name)


class SliceIndex:
    """All published slices, indexed for per-node pool gathering."""

    def __init__(self, slices: Iterable[Slice | Mapping[str, Any]]) -> None:
        self.slices: list[Slice] = [s if isinstance(s, Slice) else slice_from_dict(dict(s)) for s in slices]
        self.by_node: dict[str, list[Slice]] = {}
        self.unpinned: list[Slice] = []
        self.by_pool: dict[tuple[str, str], list[Slice]] = {}
        for s in self.slices:
            if s.node_name:
                self.by_node.setdefault(s.node_name, []).append(s)
            else:
                self.unpinned.append(s)
            self.by_pool.setdefault((s.driver, s.pool), []).append(s)

    def devices(self) -> Iterable[Device]:
        for s in self.slices:
            yield from s.devices


def _slice_on_node(s: Slice, node: Node) -> bool:
    if s.node_name:
        return s.node_name == node.name
    if s.all_nodes:
        return True
    if s.node_selector is not None:
        return node_selector_matches(s.node_selector, node)
    if s.per_device_node_selection:
        return any(device_on_node(d, node) for d in s.devices)
    # A slice holding only shared counters, with no node selection of its own.
    return False


def gather_pools(index: SliceIndex, node: Node, features: Features) -> list[Pool]:
    """The pools visible from ``node``, in allocation order (dra-spec.md 4.2)."""
    relevant: dict[tuple[str, str], list[Slice]] = {}
    for s in index.by_node.get(node.name, []) + index.unpinned:
        if not features.partitionable_devices and (s.per_device_node_selection or s.shared_counters):
            continue
        if not _slice_on_node(s, node):
            continue
        relevant.setdefault((s.driver, s.pool), []).append(s)
    pools: list[Pool] = []
    for key, sl in relevant.items():
        gen = max(s.generation for s in sl)
        cur = [s for s in sl if s.generation == gen]
        complete = True
        all_of_pool = index.by_pool.get(key, [])
        if len(cur) != cur[0].slice_count:
            if any(s.generation > gen for s in all_of_pool):
                continue  # obsolete: a newer generation exists
            if len([s for s in all_of_pool if s.generation == gen]) != cur[0].slice_count:
                complete = False
        counters: dict[str, dict[str, Fraction]] = {}
        invalid: str | None = None
        for s in all_of_pool:
            if s.generation != gen or not features.partitionable_devices:
                continue
            for cs, cvals in s.shared_counters.items():
                if cs in counters:
                    invalid = f"duplicate counter set {cs}"
                counters[cs] = cvals
        device_slices = sorted((s for s in cur if s.devices), key=lambda s: s.name)
        # Validity covers every slice of the pool at this generation, including slices that
        # target other nodes (case partitionable-devices-validation-error-on-non-targeting-slice).
        seen: set[str] = set()
        for s in all_of_pool:
            if s.generation != gen or not s.devices:
                continue
            if not features.partitionable_devices and s.per_device_node_selection:
                continue
            for d in s.devices:
                if d.name in seen:
                    invalid = f"duplicate device name {d.name}"
                seen.add(d.name)
                if features.partitionable_devices:
                    for cs, cvals in d.consumes_counters:
                        if cs not in counters or any(c not in counters[cs] for c in cvals):
                            invalid = f"device {d.name} consumes unknown counters of set {cs}"
        has_bc = any(d.binding_conditions and device_on_node(d, node) for s in device_slices for d in s.devices)
        pools.append(Pool(key[0], key[1], device_slices, counters, complete, invalid, has_bc))
    pools.sort(key=lambda p: p.key)
    if features.device_binding_and_status:
        pools.sort(key=lambda p: p.has_binding_conditions)
    return pools


# ---------------------------------------------------------------------------------------------
# Consumable capacity arithmetic (dra-spec.md 2.2, 2.3)


def consumed_amount(cap: Capacity, requested: Quantity | None) -> Quantity:
    """``calculateConsumedCapacity`` for one capacity of a device."""
    pol = cap.policy
    if requested is None:
        if pol is not None and pol.default is not None:
            return pol.default
        return cap.value
    if pol is None:
        return requested
    if pol.range_min is not None:
        if requested.value < pol.range_min.value:
            return pol.range_min
        if pol.range_step is None:
            return requested
        scale, mn, step = pol.scale, pol.min_units, pol.step_units
        ru = math.ceil(requested.value * scale) if scale != 1 else math.ceil(requested.value)
        n = mn - ((mn - ru) // step) * step  # min + ceil((requested - min) / step) * step
        return Quantity(Fraction(n, scale) if scale != 1 else Fraction(n), requested.format)
    if pol.valid_values:
        for v in sorted(pol.valid_values, key=lambda q: q.value):
            if v.value >= requested.value:
                return v
        return requested
    return requested


def violates_policy(cap: Capacity, amount: Quantity) -> bool:
    pol = cap.policy
    if pol is None:
        return False
    if pol.default is not None and amount.value == pol.default.value:
        return False
    if pol.range_min is not None:
        if pol.range_max is not None and amount.value > pol.range_max.value:
            return True
        if pol.range_step is not None:
            au = math.ceil(amount.value * pol.scale) if pol.scale != 1 else math.ceil(amount.value)
            return (au - pol.min_units) % pol.step_units != 0
        return False
    if pol.valid_values:
        return all(v.value != amount.value for v in pol.valid_values)
    return False


# ---------------------------------------------------------------------------------------------
# Requests


@dataclass
class RequestData:
    """One request (or one firstAvailable subrequest) ready for the search."""

    claim_index: int
    name: str  # "req" or "req/sub"
    parent: str
    class_name: str
    class_selectors: list[CompiledSelector]
    selectors: list[CompiledSelector]
    all_mode: bool
    count: int
    admin: bool
    tolerations: list[dict[str, Any]]
    capacity: dict[str, Quantity]
    cap_key: str  # capacity requests as a string: memo key for _Search._consumption
    raw: dict[str, Any]
    all_devices: list[Device] = field(default_factory=list)
    sub_index: int = -1


@dataclass
class ClaimData:
    claim: Mapping[str, Any]
    ref: str  # namespace/name
    requests: list[list[RequestData]]  # per request: [exactly] or its subrequests
    constraints: list[_Constraint]
    results: list[dict[str, Any]] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)
    picked_dedicated: set[DeviceID] = field(default_factory=set)


class _Constraint:
    """matchAttribute / distinctAttribute over the requests in scope (dra-spec.md 4.5, 2.6).

    Values are compared as sets of (type, value) keys: a scalar is a one-element set, a list
    attribute (DRAListTypeAttributes on) the set of its items. ``match`` keeps the running
    intersection (must stay non-empty), ``distinct`` the union of what was seen (each new
    device must be disjoint from it). Both are stacks, undone in reverse order by the search,
    so backtracking restores the running intersection (upstream PR #140326).

    Deliberate difference (scenario tessera-r2-distinct-count-3-within-one-request):
    upstream remembers one distinct value per request name, so inside one request of count
    >= 3 it only compares with the previous device; Tessera compares with every device in
    scope.
    """

    __slots__ = ("attribute", "distinct", "lists", "scope", "seen", "stack")

    def __init__(self, attribute: str, requests: Sequence[str], distinct: bool, lists: bool) -> None:
        self.attribute = attribute
        self.scope = frozenset(requests)
        self.distinct = distinct
        self.lists = lists
        self.stack: list[frozenset[tuple[str, Any]]] = []
        self.seen: frozenset[tuple[str, Any]] = frozenset()

    def covers(self, request: str) -> bool:
        if not self.scope:
            return True
        return request in self.scope or request.split("/", 1)[0] in self.scope

    def _keys(self, d: Device) -> frozenset[tuple[str, Any]] | None:
        v = d.attributes.get(self.attribute, _MISSING)
        if v is _MISSING or isinstance(v, UnsupportedAttribute):
            return None
        if isinstance(v, list):
            if not self.lists:
                return None  # list attributes are not understood without DRAListTypeAttributes
            return frozenset(_attr_key(x) for x in v)
        return frozenset((_attr_key(v),))

    def add(self, request: str, d: Device) -> bool:
        if not self.covers(request):
            return True
        keys = self._keys(d)
        if keys is None:
            return False
        if self.distinct:
            if self.seen & keys:
                return False
            self.seen = self.seen | keys
            self.stack.append(keys)
            return True
        new = self.stack[-1] & keys if self.stack else keys
        if not new:
            return False
        self.stack.append(new)
        return True

    def remove(self, request: str, d: Device) -> None:
        if not self.covers(request):
            return
        keys = self.stack.pop()
        if self.distinct:
            self.seen = self.seen - keys


_MISSING = object()


def _attr_key(v: Any) -> tuple[str, Any]:
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int):
        return ("int", v)
    if isinstance(v, str):
        return ("string", v)
    if isinstance(v, SemverValue):
        return ("version", v.text)
    return (type(v).__name__, repr(v))


def tolerates(tols: Sequence[Mapping[str, Any]], key: str, value: str, effect: str) -> bool:
    """Whether any toleration matches the taint ``key=value:effect`` (dra-spec.md 1.4)."""
    for t in tols:
        te = t.get("effect") or ""
        if te and te != effect:
            continue
        tk = t.get("key") or ""
        op = t.get("operator") or "Equal"
        if not tk:
            if op == "Exists":
                return True
            continue
        if tk != key:
            continue
        if op == "Exists" or (t.get("value") or "") == value:
            return True
    return False


# ---------------------------------------------------------------------------------------------
# The allocator


class Allocator:
    """Allocates claims on one node at a time, against slices, classes and an allocated state.

    ``classes`` maps DeviceClass name to its object. ``state`` is read, never changed: the
    caller records results it commits (``AllocatedState.add_claim``). ``rng`` makes shareIDs
    reproducible (upstream draws random UUIDs; only their presence matters).
    """

    def __init__(
        self,
        slices: SliceIndex | Iterable[Slice | Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        state: AllocatedState | None = None,
        features: Features | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.index = slices if isinstance(slices, SliceIndex) else SliceIndex(slices)
        self.classes = classes
        self.state = state or AllocatedState()
        self.features = features or Features()
        self.rng = rng or random.Random()
        self._pools_cache: dict[tuple[str, tuple[tuple[str, str], ...]], list[Pool]] = {}
        self._sel_cache: dict[tuple[str, int], bool | CelRuntimeError] = {}
        self._sig_cache: dict[tuple[Any, ...], bool | CelRuntimeError] = {}
        self._lists = self.features.list_type_attributes
        self._cap_memo: dict[tuple[int, str], tuple[tuple[str, Fraction, Fraction, str], ...] | None] = {}

    # ---- public ----------------------------------------------------------------------------
    def pools(self, node: Node) -> list[Pool]:
        key = (node.name, tuple(sorted(node.labels.items())))
        p = self._pools_cache.get(key)
        if p is None:
            p = gather_pools(self.index, node, self.features)
            self._pools_cache[key] = p
        return p

    def allocate(
        self,
        node: Node,
        claims: Sequence[Mapping[str, Any]],
        device_rank: Callable[[Device], Any] | None = None,
    ) -> list[dict[str, Any]] | None:
        """Allocate ``claims`` (ResourceClaim dicts, in order) on ``node``.

        Returns one AllocationResult dict per claim, or ``None`` if unsatisfiable here.
        Raises :class:`AllocationError` for what upstream reports as an error.

        ``device_rank`` (Tessera's placement policies, not upstream) re-orders the candidate
        devices: they are tried in ascending rank, ties kept in upstream's pool, slice and
        device order. ``None`` is upstream's first fit.
        """
        return _Search(self, node, claims, device_rank).run()

    # ---- selectors ----------------------------------------------------------------------------
    def matches(self, sels: Sequence[CompiledSelector], d: Device, owner: str) -> bool:
        """Whether ``d`` passes every selector; a CEL runtime error raises AllocationError.

        Results are memoised per (expression, device), and across devices that agree on every
        field the expression can read (see :func:`_reads`): 8 identical GPUs but for their
        UUIDs evaluate ``device.driver == "x"`` once.
        """
        for i, sel in enumerate(sels):
            key = (sel.expression, id(d))
            r = self._sel_cache.get(key)
            if r is None:
                skey = _selector_key(sel.expression, d)
                r = self._sig_cache.get(skey) if skey is not None else None
                if r is None:
                    try:
                        r = sel.evaluate(d.activation(self._lists))
                    except CelRuntimeError as e:
                        r = e
                    if skey is not None:
                        self._sig_cache[skey] = r
                self._sel_cache[key] = r
            if isinstance(r, CelRuntimeError):
                hint = ""
                if "no such key" in str(r):
                    hint = " (hint: guard the lookup with has(...) so devices without it do not match)"
                raise AllocationError(
                    f"{owner}: selector #{i} on device {'/'.join(d.id)}: CEL runtime error: {r}{hint}"
                )
            if not r:
                return False
        return True


# Expressions that may read fields they do not name (map enumeration, computed keys): their
# results are memoised per device only.
_ENUMERATES = re.compile(
    r"\b(size|all|exists|exists_one|map|filter)\s*\(|\bin\s+device\b|"
    r"device\s*\.\s*(attributes|capacity)\s*(\[\s*[^\"'\s]|\.|\s*\)|$)"
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\'')


@functools.lru_cache(maxsize=4096)
def _reads(expression: str) -> frozenset[str] | None:
    """The words an expression names (identifiers and string literals), or None if it may
    read device fields without naming them."""
    if _ENUMERATES.search(expression):
        return None
    literals = {a or b for a, b in _LITERAL.findall(expression)}
    return frozenset(_IDENT.findall(expression)) | literals


def _selector_key(expression: str, d: Device) -> tuple[Any, ...] | None:
    """A key under which devices give the same result for ``expression``: the driver, the
    multi-allocation flag, and the values of the attributes and capacities it names."""
    words = _reads(expression)
    if words is None:
        return None

    def named(k: str) -> bool:
        return k in words or k.rpartition("/")[2] in words

    attrs = tuple(sorted((k, f"{type(v).__name__}:{v!r}") for k, v in d.attributes.items() if named(k)))
    caps = tuple(sorted((k, c.value.value) for k, c in d.capacity.items() if named(k)))
    return (expression, d.driver, d.allow_multiple, attrs, caps)


def _compile_all(sels: Any, owner: str) -> list[CompiledSelector]:
    out = []
    for i, s in enumerate(sels or []):
        expr = ((s or {}).get("cel") or {}).get("expression")
        if not expr:
            raise AllocationError(f"{owner}, selector #{i}: CEL expression empty (unsupported selector type?)")
        try:
            out.append(compile_selector(expr))
        except CelCompileError as e:
            raise AllocationError(f"{owner}: selector #{i}: CEL compile error: {e}") from None
    return out


class _Search:
    def __init__(
        self,
        alloc: Allocator,
        node: Node,
        claims: Sequence[Mapping[str, Any]],
        device_rank: Callable[[Device], Any] | None = None,
    ) -> None:
        self.a = alloc
        self.f = alloc.features
        self.st = alloc.state
        self.node = node
        self.claims_in = claims
        self.pools = alloc.pools(node)
        # Dedicated picks in this call, counted: an admin request may pick a device another
        # claim of the call already holds, and undoing it must not free the other pick.
        self.allocating: dict[DeviceID, int] = {}
        self.cap_in_call: dict[DeviceID, dict[str, Fraction]] = {}
        self.counters_in_call: dict[tuple[str, str], dict[str, dict[str, Fraction]]] = {}
        self._available: dict[tuple[str, str], dict[str, dict[str, Fraction]]] = {}
        self.claims: list[ClaimData] = []
        self.invalid_seen = any(p.invalid for p in self.pools)
        # Candidate devices in search order: pools, slices, devices (dra-spec.md 4.4), from
        # complete and valid pools only; a placement policy may re-rank them (stable sort).
        self.order: list[tuple[Pool, Device]] = [
            (pool, d)
            for pool in self.pools
            if pool.complete and not pool.invalid
            for sl in pool.slices
            for d in sl.devices
        ]
        if device_rank is not None:
            self.order.sort(key=lambda pd: device_rank(pd[1]))

    # ---- preparation (dra-spec.md 4.3) ------------------------------------------------------
    def _request(self, ci: int, ref: str, name: str, parent: str, r: Mapping[str, Any], admin_ok: bool) -> RequestData:
        # Upstream names a subrequest by its own name ("subrequest subReq-0"), not "req/sub".
        what = f"claim {ref}, subrequest {name.split('/', 1)[1]}" if "/" in name else f"claim {ref}, request {name}"
        if r.get("capacity") and not self.f.consumable_capacity:
            raise AllocationError(f"{what}: has capacity requests, but the DRAConsumableCapacity feature is disabled")
        admin = bool(r.get("adminAccess")) if admin_ok else False
        if admin and not self.f.admin_access:
            raise AllocationError(f"{what}: admin access is requested, but the feature is disabled")
        cls_name = r.get("deviceClassName") or ""
        if not cls_name:
            raise AllocationError(f"{what}: missing device class name (unsupported request type?)")
        cls = self.a.classes.get(cls_name)
        if cls is None:
            raise AllocationError(
                f"{what}: could not retrieve device class {cls_name}: deviceclass.resource.k8s.io \"{cls_name}\" not found"
            )
        mode = r.get("allocationMode") or "ExactCount"
        if mode not in ("ExactCount", "All"):
            raise AllocationError(f"{what}: unsupported count mode {mode}")
        caps = {k: _parse_quantity(v) for k, v in ((r.get("capacity") or {}).get("requests") or {}).items()}
        cap_key = ";".join(f"{k}={caps[k].value}" for k in sorted(caps))
        rd = RequestData(
            claim_index=ci,
            name=name,
            parent=parent,
            class_name=cls_name,
            class_selectors=_compile_all((cls.get("spec") or {}).get("selectors"), f"class {cls_name}"),
            selectors=_compile_all(r.get("selectors"), f"claim {ref}"),
            all_mode=mode == "All",
            count=int(r.get("count") or 1) if mode == "ExactCount" else 0,
            admin=admin,
            tolerations=list(r.get("tolerations") or []),
            capacity=caps,
            cap_key=cap_key,
            raw=dict(r),
        )
        if rd.all_mode:
            for p in self.pools:
                if not p.complete:
                    raise AllocationError(
                        f"{what}: asks for all devices, but resource pool {p.driver}/{p.name} is currently being updated"
                    )
                if p.invalid:
                    raise AllocationError(
                        f"{what}: asks for all devices, but resource pool {p.driver}/{p.name} is currently invalid"
                    )
            for p in self.pools:
                for s in p.slices:
                    for d in s.devices:
                        if not device_on_node(d, self.node):
                            continue
                        if not self._selectable(rd, d, ref):
                            continue
                        # Kubernetes v1.37.2 (checked with tools/kube's harness): the All set
                        # drops devices the request can never fit, not those that earlier
                        # allocations filled; those make the request fail (dra-spec.md 2.7).
                        if self.f.consumable_capacity and not self._capacity_fits(rd, d, in_call=False, existing=False):
                            continue
                        rd.all_devices.append(d)
            rd.count = len(rd.all_devices)
        return rd

    def _prepare(self) -> None:
        for ci, claim in enumerate(self.claims_in):
            md = claim.get("metadata") or {}
            # klog.KObj: "namespace/name", or just "name" for an object without a namespace.
            name = md.get("name") or md.get("generateName") or ""
            ref = f"{md['namespace']}/{name}" if md.get("namespace") else name
            devices = (claim.get("spec") or {}).get("devices") or {}
            reqs: list[list[RequestData]] = []
            min_total = 0
            for r in devices.get("requests") or []:
                name = r.get("name", "")
                if r.get("firstAvailable"):
                    if not self.f.prioritized_list:
                        raise AllocationError(
                            f"claim {ref}, request {name}: has subrequests, but the DRAPrioritizedList feature is disabled"
                        )
                    subs = [
                        self._request(ci, ref, f"{name}/{s.get('name', '')}", name, s, admin_ok=False)
                        for s in r["firstAvailable"]
                    ]
                    for j, s in enumerate(subs):
                        s.sub_index = j
                    reqs.append(subs)
                    min_total += min(s.count for s in subs)
                else:
                    exact = r.get("exactly") or {}
                    rd = self._request(ci, ref, name, name, exact, admin_ok=True)
                    reqs.append([rd])
                    min_total += rd.count
            if min_total > MAX_RESULTS_PER_CLAIM:
                raise AllocationError(
                    f"claim {ref}: number of requested devices {min_total} exceeds the claim limit of {MAX_RESULTS_PER_CLAIM}"
                )
            cons: list[_Constraint] = []
            for i, c in enumerate(devices.get("constraints") or []):
                if c.get("matchAttribute"):
                    cons.append(_Constraint(c["matchAttribute"], c.get("requests") or [], False, self.f.list_type_attributes))
                elif c.get("distinctAttribute") and self.f.consumable_capacity:
                    cons.append(_Constraint(c["distinctAttribute"], c.get("requests") or [], True, self.f.list_type_attributes))
                else:
                    raise AllocationError(f"claim {ref}, constraint #{i}: empty constraint (unsupported constraint type?)")
            self.claims.append(ClaimData(claim, ref, reqs, cons))

    # ---- checks -----------------------------------------------------------------------------
    def _selectable(self, rd: RequestData, d: Device, ref: str) -> bool:
        if d.binding_conditions and not self.f.device_binding_and_status:
            return False
        if not self.a.matches(rd.class_selectors, d, f"class {rd.class_name}"):
            return False
        return self.a.matches(rd.selectors, d, f"claim {ref}")

    def _multi(self, d: Device) -> bool:
        return d.allow_multiple and self.f.consumable_capacity

    def _in_use(self, rd: RequestData, d: Device, cd: ClaimData) -> bool:
        if rd.admin:
            return d.id in cd.picked_dedicated
        if self._multi(d):
            return d.id in self.st.dedicated
        return d.id in self.st.dedicated or d.id in self.allocating

    def _consumption(self, rd: RequestData, d: Device) -> tuple[tuple[str, Fraction, Fraction, str], ...] | None:
        """What ``rd`` would consume of each capacity of ``d``: (name, amount, published value,
        amount as a result string); None if ``d`` lacks a requested capacity or an amount
        violates its policy (dra-spec.md 2.2, 2.3). Depends only on the request's capacity
        requests and the device, so it is memoised for the allocator's lifetime."""
        key = (id(d), rd.cap_key)
        memo = self.a._cap_memo
        if key in memo:
            return memo[key]
        out: tuple[tuple[str, Fraction, Fraction, str], ...] | None = None
        if all(k in d.capacity for k in rd.capacity):
            items = []
            for k, cap in d.capacity.items():
                amount = consumed_amount(cap, rd.capacity.get(k))
                if violates_policy(cap, amount):
                    break
                items.append((k, amount.value, cap.value.value, Quantity(amount.value, cap.value.format).canonical()))
            else:
                out = tuple(items)
        memo[key] = out
        return out

    def _capacity_fits(self, rd: RequestData, d: Device, *, in_call: bool, existing: bool = True) -> bool:
        use = self._consumption(rd, d)
        if use is None:
            return False
        prior = self.st.aggregated.get(d.id) if self._multi(d) and existing else None
        pending = self.cap_in_call.get(d.id) if in_call else None
        for k, amount, total, _ in use:
            if prior:
                amount = amount + prior.get(k, 0)
            if pending:
                amount = amount + pending.get(k, 0)
            if amount > total:
                return False
        return True

    def _available_counters(self, pool_key: tuple[str, str], counters: dict[str, dict[str, Fraction]]) -> dict[str, dict[str, Fraction]]:
        av = self._available.get(pool_key)
        if av is None:
            av = {cs: dict(v) for cs, v in counters.items()}
            for s in self.a.index.by_pool.get(pool_key, []):
                for d in s.devices:
                    if d.consumes_counters and self.st.is_allocated(d.id):
                        for cs, cvals in d.consumes_counters:
                            for c, v in cvals.items():
                                if cs in av and c in av[cs]:
                                    av[cs][c] -= v
            self._available[pool_key] = av
        return av

    # ---- allocateDevice (dra-spec.md 4.4 steps 1-6) -----------------------------------------
    def _allocate_device(self, cd: ClaimData, rd: RequestData, d: Device, pool: Pool, must: bool) -> Any:
        """Try to add ``d`` for ``rd``; return an undo callable, or None if it cannot be added."""
        multi = self._multi(d)
        if self._in_use(rd, d, cd):
            return None
        if d.consumes_counters and not self.f.partitionable_devices:
            return None
        counter_charge: list[tuple[str, str, Fraction]] = []
        if d.consumes_counters:
            # A share placed earlier (any earlier cycle: an aggregated entry exists even for a
            # share without consumedCapacity; or this call) already paid the counters.
            in_use_cap = d.id in self.st.aggregated or d.id in self.cap_in_call
            if not (multi and in_use_cap):
                avail = self._available_counters(pool.key, pool.counters)
                used = self.counters_in_call.setdefault(pool.key, {})
                for cs, cvals in d.consumes_counters:
                    for c, v in cvals.items():
                        have = max(avail.get(cs, {}).get(c, Fraction(0)), Fraction(0))
                        if used.get(cs, {}).get(c, Fraction(0)) + v > have:
                            return None
                for cs, cvals in d.consumes_counters:
                    for c, v in cvals.items():
                        used.setdefault(cs, {})[c] = used.get(cs, {}).get(c, Fraction(0)) + v
                        counter_charge.append((cs, c, v))
        if self.f.device_taints:
            for t in d.taints:
                if t.effect in ("NoSchedule", "NoExecute") and not tolerates(rd.tolerations, t.key, t.value, t.effect):
                    self._uncharge(pool, counter_charge)
                    return None
        added: list[_Constraint] = []
        for con in cd.constraints:
            if not con.add(rd.name, d):
                for a in added:
                    a.remove(rd.name, d)
                self._uncharge(pool, counter_charge)
                if must:
                    raise AllocationError(
                        f"claim {cd.ref}, request {rd.name}: cannot add device {'/'.join(d.id)} because a claim constraint would not be satisfied"
                    )
                return None
            added.append(con)
        result: dict[str, Any] = {"request": rd.name, "driver": d.driver, "pool": d.pool, "device": d.name}
        if rd.admin:
            result["adminAccess"] = True
        if rd.tolerations:
            result["tolerations"] = [dict(t) for t in rd.tolerations]
        if d.binding_conditions and self.f.device_binding_and_status:
            result["bindingConditions"] = list(d.binding_conditions)
            result["bindingFailureConditions"] = list(d.binding_failure_conditions)
        cap_added: dict[str, Fraction] = {}
        if multi:
            result["shareID"] = str(uuid.UUID(int=self.a.rng.getrandbits(128), version=4))
            if d.capacity:
                consumed = {}
                for k, amount, _, text in self._consumption(rd, d) or ():
                    consumed[k] = text
                    cap_added[k] = amount
                result["consumedCapacity"] = consumed
            entry = self.cap_in_call.setdefault(d.id, {})
            for k, v in cap_added.items():
                entry[k] = entry.get(k, Fraction(0)) + v
        else:
            self.allocating[d.id] = self.allocating.get(d.id, 0) + 1
            cd.picked_dedicated.add(d.id)
        # A multi-allocatable device is never "in use" within the call, not even for admin
        # requests of the same claim (Kubernetes v1.37.2, checked with the harness).
        cd.results.append(result)
        cd.devices.append(d)

        def undo() -> None:
            cd.results.pop()
            cd.devices.pop()
            if multi:
                entry = self.cap_in_call.get(d.id, {})
                for k, v in cap_added.items():
                    entry[k] -= v
                # Upstream keeps the (possibly empty) entry and the counter charge of a
                # multi-allocatable device on undo (dra-spec.md 2.5 quirks): mirror it.
            else:
                left = self.allocating[d.id] - 1
                if left:
                    self.allocating[d.id] = left
                else:
                    del self.allocating[d.id]
                cd.picked_dedicated.discard(d.id)
                self._uncharge(pool, counter_charge)
            for con in reversed(added):
                con.remove(rd.name, d)

        return undo

    def _uncharge(self, pool: Pool, charge: list[tuple[str, str, Fraction]]) -> None:
        used = self.counters_in_call.get(pool.key, {})
        for cs, c, v in charge:
            used[cs][c] -= v

    # ---- the search (dra-spec.md 4.4) ------------------------------------------------------
    def run(self) -> list[dict[str, Any]] | None:
        self._prepare()
        if not self.claims:
            return []
        try:
            ok = self._claim(0)
        except _MaxSizeExceeded:
            ok = False
        if not ok:
            if self.invalid_seen:
                raise AllocationError("invalid resource pools were encountered")
            return None
        return [self._result(cd) for cd in self.claims]

    def _claim(self, ci: int) -> bool:
        if ci >= len(self.claims):
            return True
        return self._req(ci, 0)

    def _req(self, ci: int, ri: int) -> bool:
        cd = self.claims[ci]
        if ri >= len(cd.requests):
            return self._claim(ci + 1)
        alts = cd.requests[ri]
        if len(alts) == 1 and alts[0].sub_index < 0:
            return self._slot(cd, ci, ri, alts[0], 0, -1)
        exceeded = 0
        for rd in alts:
            try:
                if self._slot(cd, ci, ri, rd, 0, -1):
                    return True
            except _MaxSizeExceeded:
                exceeded += 1
        if exceeded == len(alts):
            raise _MaxSizeExceeded()
        return False

    def _slot(self, cd: ClaimData, ci: int, ri: int, rd: RequestData, di: int, start: int) -> bool:
        if rd.all_mode and not rd.all_devices:
            return False  # All needs at least one device (dra-spec.md 4.6)
        if di >= rd.count:
            return self._req(ci, ri + 1)
        if len(cd.results) + (rd.count - di) > MAX_RESULTS_PER_CLAIM:
            raise _MaxSizeExceeded()
        if rd.all_mode:
            d = rd.all_devices[di]
            pool = next(p for p in self.pools if p.key == (d.driver, d.pool))
            if self.f.consumable_capacity and not self._capacity_fits(rd, d, in_call=True):
                return False
            undo = self._allocate_device(cd, rd, d, pool, must=True)
            if undo is None:
                return False
            try:
                if self._slot(cd, ci, ri, rd, di + 1, start):
                    return True
            except _MaxSizeExceeded:
                undo()
                raise
            undo()
            return False
        # Combination pruning: the next device of the same request comes after the previous one.
        order = self.order
        for k in range(start + 1, len(order)):
            pool, d = order[k]
            if not device_on_node(d, self.node):
                continue
            if self._in_use(rd, d, cd):
                continue
            if not self._selectable(rd, d, cd.ref):
                continue
            if self.f.consumable_capacity and not self._capacity_fits(rd, d, in_call=True):
                continue
            undo = self._allocate_device(cd, rd, d, pool, must=False)
            if undo is None:
                continue
            try:
                if self._slot(cd, ci, ri, rd, di + 1, k):
                    return True
            except _MaxSizeExceeded:
                undo()  # the firstAvailable parent may still try another subrequest
                raise
            undo()
        return False

    # ---- result (dra-spec.md 4.8) -----------------------------------------------------------
    def _result(self, cd: ClaimData) -> dict[str, Any]:
        alloc: dict[str, Any] = {"devices": {"results": [dict(r) for r in cd.results]}}
        config = self._config(cd)
        if config:
            alloc["devices"]["config"] = config
        ns = self._node_selector(cd.devices)
        if ns is not None:
            alloc["nodeSelector"] = ns
        return alloc

    def _node_selector(self, devices: Sequence[Device]) -> dict[str, Any] | None:
        for d in devices:
            if d.node_name or (d.binds_to_node and self.f.device_binding_and_status):
                return {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [self.node.name]}]}
                    ]
                }
        exprs: list[dict[str, Any]] = []
        fields: list[dict[str, Any]] = []
        for d in devices:
            if d.node_selector:
                term = (d.node_selector.get("nodeSelectorTerms") or [{}])[0]
                for e in term.get("matchExpressions") or []:
                    if e not in exprs:
                        exprs.append(e)
                for e in term.get("matchFields") or []:
                    if e not in fields:
                        fields.append(e)
        if not exprs and not fields:
            return None
        term2: dict[str, Any] = {}
        if exprs:
            term2["matchExpressions"] = exprs
        if fields:
            term2["matchFields"] = fields
        return {"nodeSelectorTerms": [term2]}

    def _config(self, cd: ClaimData) -> list[dict[str, Any]]:
        chosen: list[tuple[str, str]] = []  # (result request name, class)
        for r in cd.results:
            rd = self._find_rd(cd, r["request"])
            if (r["request"], rd.class_name) not in chosen:
                chosen.append((r["request"], rd.class_name))
        out: list[dict[str, Any]] = []
        by_class: dict[str, list[str]] = {}
        for req, cls in chosen:
            by_class.setdefault(cls, [])
            if req not in by_class[cls]:
                by_class[cls].append(req)
        for cls, reqs in by_class.items():
            for c in (self.a.classes[cls].get("spec") or {}).get("config") or []:
                if c.get("opaque"):
                    out.append({"source": "FromClass", "requests": list(reqs), "opaque": c["opaque"]})
        names = {r["request"] for r in cd.results}  # "req" or the chosen "req/sub"
        parents = {n.split("/")[0] for n in names}
        for c in ((cd.claim.get("spec") or {}).get("devices") or {}).get("config") or []:
            reqs = c.get("requests") or []
            if (not reqs or any(x in names or x in parents for x in reqs)) and c.get("opaque"):
                out.append({"source": "FromClaim", "requests": list(reqs), "opaque": c["opaque"]})
        # A config that covers every request of the claim (the request itself or its chosen
        # subrequest) applies to all: its request list is cleared.
        for c in out:
            listed = set(c["requests"])
            if not listed or all(n in listed or n.split("/")[0] in listed for n in names):
                c.pop("requests")
        return out

    def _find_rd(self, cd: ClaimData, name: str) -> RequestData:
        for alts in cd.requests:
            for rd in alts:
                if rd.name == name:
                    return rd
        raise KeyError(name)
