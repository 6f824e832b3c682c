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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tessera.allocator.model import (
    AllocatedState,
    Capacity,
    Descriptions,
    Device,
    DeviceID,
    Exact,
    Node,
    Slice,
    Taint,
    TaintRule,
    UnsupportedAttribute,
    device_on_node,
    exact,
    node_selector_matches,
    slice_from_dict,
)
from tessera.allocator.record import (
    SELECTION_CHECKS,
    BindingConditionsOff,
    CapacityMissing,
    CapacityShort,
    CapacityUnusable,
    CapacityUse,
    CelError,
    ConstraintFailed,
    CountersOff,
    CountersShort,
    DeviceRecord,
    InUse,
    NodeRecord,
    NotOnNode,
    PolicyViolation,
    Refusal,
    RequestRecord,
    SelectorFalse,
    Tainted,
)
from tessera.api.quantity import Quantity
from tessera.api.requests import device_requests
from tessera.api.uids import uuid_text
from tessera.cel import (
    CelCompileError,
    CelRuntimeError,
    CompiledSelector,
    SemverValue,
    compile_selector,
)
from tessera.cel.reading import device_fields

MAX_RESULTS_PER_CLAIM = 32
#: At most this many claim preparations are kept (Allocator frozen_specs).
_PREPARED_MAX = 4096
_ZERO = Fraction(0)


@functools.lru_cache(maxsize=4096)
def _parse_quantity(v: str | int) -> Quantity:
    """Quantity.parse for capacity requests, which repeat across claims and calls (Quantity is
    immutable); decimal values past 2^63-1 are kept, as the API server does."""
    return Quantity.parse(v, beyond_int64=True)


class AllocationError(Exception):
    """Upstream returns an error (not "unsatisfiable"): the pod's scheduling attempt is aborted
    on every node; it is retried with backoff, never placed while the error lasts.

    ``str()`` uses upstream's message forms (dra-spec.md 4.9).
    """


class NodeAllocationError(AllocationError):
    """An error about this node only (upstream's ``ErrFailedAllocationOnNode``: invalid resource
    pools were encountered and nothing else fit). kube-scheduler reports it as this node's
    Unschedulable reason and goes on with the other nodes."""


class SelectorError(AllocationError):
    """A selector could not be evaluated on a device (CEL runtime error): ``owner`` is
    ``class <name>`` or ``claim <ref>``; ``index``, ``expression`` and the CEL ``error`` text
    are the parts of upstream's message (dra-spec.md 3.2)."""

    def __init__(self, owner: str, index: int, expression: str, device: str, error: str) -> None:
        hint = ""
        if "no such key" in error:
            hint = " (hint: guard the lookup with has(...) so devices without it do not match)"
        super().__init__(
            f"{owner}: selector #{index} on device {device}: CEL runtime error: {error}{hint}"
        )
        self.owner = owner
        self.index = index
        self.expression = expression
        self.error = error


class SelectorCompileError(AllocationError):
    """A selector does not compile; raised when a device is first evaluated with it (upstream
    compiles on first use). ``owner``, ``index``, ``expression``, ``error`` as in
    :class:`SelectorError`."""

    def __init__(self, owner: str, index: int, expression: str, error: str) -> None:
        super().__init__(f"{owner}: selector #{index}: CEL compile error: {error}")
        self.owner = owner
        self.index = index
        self.expression = expression
        self.error = error


class CapacityArithmeticError(Exception):
    """A capacity amount the allocator must not act on (Kubernetes v1.37, kubernetes PR #140442
    and its negative-value guard): a request past what ``CmpRequestOverCapacity``'s range
    arithmetic can represent, or a negative amount. Upstream aborts the whole allocation
    rather than skipping the device; the message is upstream's inner text (``capacity "name":
    ...``), which the caller prefixes with the claim, request and device."""


class CapacityAbort(AllocationError):
    """A :class:`CapacityArithmeticError` met by the search: the allocation's error, with the
    claim, request and device named; ``inner`` is the capacity's own message."""

    def __init__(self, message: str, inner: str) -> None:
        super().__init__(message)
        self.inner = inner


_MAX_INT64 = 2**63 - 1
_NOT_REPRESENTABLE = "capacity request cannot be represented in the device's range arithmetic"


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
    fractional_capacity_range: bool = True  # DRAFractionalCapacityRange (beta, on in 1.37)

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
            fractional_capacity_range="FractionalCapacityRange" in s,
        )


# ---------------------------------------------------------------------------------------------
# Pools (dra-spec.md 4.2)


@dataclass
class Pool:
    """One resource pool as seen from a node (upstream's ``Pool``, dra-spec.md 4.2): its
    ``driver`` and ``name``, the slices of its newest generation targeting the node, the shared
    counters they publish, and whether it is ``complete`` (every slice of the generation seen)
    or ``invalid`` (the reason: a duplicate device name, counters published twice, ...)."""

    driver: str
    name: str
    slices: list[Slice]  # device slices targeting the node, sorted by slice name
    counters: dict[str, dict[str, Fraction]]  # counter set -> counter -> published value
    complete: bool = True
    invalid: str | None = None
    has_binding_conditions: bool = False
    # Device slices of the pool (this generation) that do not target the node: only known
    # when the pool looked incomplete from the node; they count for counter accounting.
    not_targeting: list[Slice] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        return (self.driver, self.name)


class SliceIndex:
    """All published slices, indexed for per-node pool gathering."""

    def __init__(
        self,
        slices: Iterable[Slice | Mapping[str, Any]],
        taint_rules: Sequence[TaintRule] = (),
    ) -> None:
        """``taint_rules``: DeviceTaintRules whose taints are merged into the devices they
        select (upstream's ``ListWithDeviceTaintRules``), after the slice's own taints."""
        shared = Descriptions()  # devices publishing the same capacities and values share them
        self.slices: list[Slice] = [
            s if isinstance(s, Slice) else slice_from_dict(dict(s), shared) for s in slices
        ]
        if taint_rules:
            for s in self.slices:
                for d in s.devices:
                    added = tuple(
                        r.taint for r in taint_rules if r.selects(d.driver, d.pool, d.name)
                    )
                    if added:
                        d.taints = d.taints + added
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

    def pool_publication(self, driver: str, pool: str) -> tuple[int, int, int]:
        """``(published, resourceSliceCount, generation)`` of the pool's newest generation: how
        many of its slices are published against how many it announces (an incomplete pool,
        dra-spec, publishes fewer). ``(0, 0, 0)`` for a pool with no slice."""
        sl = self.by_pool.get((driver, pool), [])
        gen = max((s.generation for s in sl), default=0)
        newest = [s for s in sl if s.generation == gen]
        return len(newest), max((s.slice_count for s in newest), default=0), gen


def slice_on_node(s: Slice, node: Node) -> bool:
    """Whether a slice targets ``node`` (dra-spec.md 4.2 step 2)."""
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
    """The pools visible from ``node``, in allocation order: upstream's ``GatherPools``
    (dra-spec.md 4.2), Kubernetes v1.37.2's incubating variant."""
    relevant: dict[tuple[str, str], list[Slice]] = {}
    for s in index.by_node.get(node.name, []) + index.unpinned:
        if not features.partitionable_devices and (
            s.per_device_node_selection or s.shared_counters
        ):
            continue
        if not slice_on_node(s, node):
            continue
        key = (s.driver, s.pool)
        cur = relevant.get(key)
        if cur is None or s.generation > cur[0].generation:
            relevant[key] = [s]  # a newer generation replaces the slices seen so far
        elif s.generation == cur[0].generation:
            cur.append(s)
    plain: list[Pool] = []
    binding: list[Pool] = []
    for key, sl in relevant.items():
        gen, count = sl[0].generation, sl[0].slice_count
        if len(sl) == count:
            pool = _build_pool(key, sl, features, None)
        else:
            # Slices filtered out as not targeting the node may complete the pool.
            all_of_pool = index.by_pool.get(key, [])
            if any(s.generation > gen for s in all_of_pool):
                continue  # obsolete: the driver is publishing a newer generation
            same = [s for s in all_of_pool if s.generation == gen]
            if len(same) != count:
                plain.append(Pool(key[0], key[1], [], {}, complete=False))
                continue
            pool = _build_pool(key, sl, features, same)
        (binding if pool.has_binding_conditions else plain).append(pool)
    plain.sort(key=lambda p: p.key)
    binding.sort(key=lambda p: p.key)
    return plain + binding


def _build_pool(
    key: tuple[str, str], slices: list[Slice], features: Features, all_slices: list[Slice] | None
) -> Pool:
    """buildPool: the node's device slices (by name), counter sets, validity."""
    pd = features.partitionable_devices
    device_slices: list[Slice] = []
    counter_slices: list[Slice] = []
    not_targeting: list[Slice] = []
    for s in sorted(slices, key=lambda s: s.name):
        (counter_slices if pd and s.shared_counters else device_slices).append(s)
    if all_slices is not None and len(slices) < len(all_slices):
        names = {s.name for s in slices}
        for s in all_slices:
            if s.name not in names:
                (counter_slices if pd and s.shared_counters else not_targeting).append(s)
    has_bc = any(d.binding_conditions for s in device_slices for d in s.devices)
    pool = Pool(key[0], key[1], device_slices, {}, True, None, has_bc, not_targeting)
    seen: set[str] = set()
    for s in device_slices:
        for d in s.devices:
            if d.name in seen:
                pool.invalid = f"duplicate device name {d.name}"
                return pool
            seen.add(d.name)
    if not pd:
        return pool
    for s in counter_slices:
        for cs, cvals in s.shared_counters.items():
            if cs in pool.counters:
                pool.invalid = f"duplicate counter set name {cs}"
                return pool
            pool.counters[cs] = cvals
    for s in device_slices + not_targeting:
        for d in s.devices:
            for cs, cvals in d.consumes_counters:
                if cs not in pool.counters:
                    pool.invalid = f"counter set {cs} not found"
                    return pool
                for c in cvals:
                    if c not in pool.counters[cs]:
                        pool.invalid = f"counter {c} not found in counter set {cs}"
                        return pool
    return pool


# ---------------------------------------------------------------------------------------------
# Consumable capacity arithmetic (dra-spec.md 2.2, 2.3)


def consumed_amount(cap: Capacity, requested: Quantity | None, fractional: bool = True) -> Quantity:
    """``calculateConsumedCapacity`` for one capacity of a device; ``fractional``: the
    DRAFractionalCapacityRange gate (:meth:`RequestPolicy.arithmetic`).

    Raises :class:`CapacityArithmeticError` where upstream's validRange step arithmetic (int64
    units, or int64 milli-units) cannot hold the request or its rounded value (``roundUpRange``,
    Kubernetes v1.37)."""
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
        scale, mn, step = pol.arithmetic(fractional)
        q = requested.canonical()
        if scale == 1:
            if requested.value > _MAX_INT64:
                raise CapacityArithmeticError(f"{_NOT_REPRESENTABLE}: request {q} exceeds MaxInt64")
            ru = math.ceil(requested.value)
        else:
            milli = requested.value * 1000  # safeMilliValue: exact, within int64
            if milli.denominator != 1 or not -_MAX_INT64 - 1 <= milli <= _MAX_INT64:
                raise CapacityArithmeticError(
                    f"{_NOT_REPRESENTABLE}: request {q} is not a representable milli value"
                )
            ru = int(milli)
        steps = -((mn - ru) // step)  # ceil((requested - min) / step)
        if (mn >= 0 or scale != 1) and steps > (_MAX_INT64 - mn) // step:
            passes = "MaxInt64" if scale == 1 else "the milli-value range"
            raise CapacityArithmeticError(
                f"{_NOT_REPRESENTABLE}: rounding request {q} up to the next step passes {passes}"
            )
        n = mn + steps * step
        return Quantity(Fraction(n, scale) if scale != 1 else Fraction(n), requested.format)
    if pol.valid_values:
        for v in sorted(pol.valid_values, key=lambda q: q.value):
            if v.value >= requested.value:
                return v
        return requested
    return requested


def violates_policy(cap: Capacity, amount: Quantity, fractional: bool = True) -> bool:
    """Whether requesting ``amount`` (in the capacity's units) of ``cap`` breaks its
    ``requestPolicy`` (``validValues``, or ``validRange`` min/max/step; its ``default`` is
    always allowed; KEP-5075). ``fractional``: DRAFractionalConsumedCapacity is on."""
    pol = cap.policy
    if pol is None:
        return False
    if pol.default is not None and amount.value == pol.default.value:
        return False
    if pol.range_min is not None:
        if pol.range_max is not None and amount.value > pol.range_max.value:
            return True
        if pol.range_step is not None:
            scale, mn, step = pol.arithmetic(fractional)
            if scale == 1:
                au = math.ceil(amount.value)
            else:
                milli = amount.value * 1000
                if milli.denominator != 1 or not -_MAX_INT64 - 1 <= milli <= _MAX_INT64:
                    return True
                au = int(milli)
            return (au - mn) % step != 0
        return False
    if pol.valid_values:
        return all(v.value != amount.value for v in pol.valid_values)
    return False


def consumption(
    requests: Mapping[str, Quantity], d: Device, fractional: bool = True
) -> tuple[tuple[str, Exact, Exact, str], ...] | Refusal:
    """What a request naming ``requests`` consumes of each capacity of ``d`` (dra-spec.md 2.2,
    2.3): (name, amount, published value, amount as a result string) per capacity, amounts
    exact (:data:`~tessera.allocator.model.Exact`); or why the
    device cannot serve it at any fill level (a requested capacity it lacks, an amount its
    request policy forbids)."""
    req = requests
    caps = d.capacity
    missing = tuple(k for k in req if k not in caps)
    if missing:
        return CapacityMissing(missing, tuple(caps))
    # Every amount first: one that cannot be used aborts (CapacityArithmeticError) whatever a
    # soft refusal of another capacity would say, as upstream resolves them all before its
    # policy and capacity checks (Kubernetes v1.37).
    amounts = []
    for k, cap in caps.items():
        try:
            amount = consumed_amount(cap, req.get(k), fractional)
        except CapacityArithmeticError as e:
            raise CapacityArithmeticError(f'capacity "{k}": {e}') from None
        if amount.value < 0:
            raise CapacityArithmeticError(f'capacity "{k}": capacity value is negative')
        amounts.append((k, cap, amount))
    items = []
    for k, cap, amount in amounts:
        if violates_policy(cap, amount, fractional):
            assert cap.policy is not None
            return PolicyViolation(k, amount.value, cap.value.format, cap.policy)
        items.append(
            (
                k,
                exact(amount.value),
                exact(cap.value.value),
                Quantity(amount.value, cap.value.format).canonical(),
            )
        )
    return tuple(items)


# ---------------------------------------------------------------------------------------------
# Requests


@dataclass
class RequestData:
    """One request (or one firstAvailable subrequest) ready for the search."""

    claim_index: int
    name: str  # "req" or "req/sub"
    parent: str
    class_name: str
    class_selectors: list[CompiledSelector | _BadSelector]
    selectors: list[CompiledSelector | _BadSelector]
    all_mode: bool
    count: int
    admin: bool
    tolerations: list[dict[str, Any]]
    capacity: dict[str, Quantity]
    cap_key: str  # capacity requests as a string: memo key for _Search._consumption
    requested_key: str  # the same with their formats (the record's memo; a str hashes fast)
    raw: dict[str, Any]
    all_devices: list[Device] = field(default_factory=list)
    sub_index: int = -1
    kept: bool = False  # memoised by the allocator (frozen_specs): lives as long as it
    what: str = ""  # "claim <ref>, request <own name>": the prefix of its error messages


@dataclass
class ClaimData:
    """One claim ready for the search: its requests (per request, ``[exactly]`` or its
    ``firstAvailable`` subrequests), its constraints, and what the search has picked for it so
    far (``results``: allocation result dicts, ``devices``, the dedicated ones)."""

    claim: Mapping[str, Any]
    ref: str  # namespace/name
    requests: list[list[RequestData]]  # per request: [exactly] or its subrequests
    constraints: list[_Constraint]
    results: list[dict[str, Any]] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)
    picked_dedicated: set[DeviceID] = field(default_factory=set)


class _Constraint:
    """matchAttribute / distinctAttribute over the requests in scope (dra-spec.md 4.5, 2.6).

    Kubernetes v1.37.2 semantics, both variants. A device without the attribute is refused.
    Values are kept as sets of (type, value) keys on a stack that the search pops on
    backtracking (so the running intersection is restored, upstream PR #140326):

    * DRAListTypeAttributes on (upstream's experimental variant): a scalar is a one-element
      set, a list the set of its items; an empty list or an attribute without a value is of
      unknown type and refused. ``match`` keeps the running intersection non-empty,
      ``distinct`` keeps every device disjoint from all earlier ones.
    * off (incubating): only scalars compare. The first device in scope is always accepted,
      whatever its value; after it, ``match`` accepts a scalar equal to it (nothing at all if
      the first value was a list), ``distinct`` refuses a scalar equal to an earlier scalar
      and refuses any list or valueless attribute.
    """

    __slots__ = ("attribute", "distinct", "index", "lists", "scope", "stack")

    def __init__(
        self, index: int, attribute: str, requests: Sequence[str], distinct: bool, lists: bool
    ) -> None:
        self.index = index
        self.attribute = attribute
        self.scope = frozenset(requests)
        self.distinct = distinct
        self.lists = lists
        self.stack: list[frozenset[tuple[str, Any]] | None] = []

    @property
    def kind(self) -> str:
        return "distinctAttribute" if self.distinct else "matchAttribute"

    def covers(self, request: str) -> bool:
        if not self.scope:
            return True
        return request in self.scope or request.split("/", 1)[0] in self.scope

    def _keys(self, v: Any) -> frozenset[tuple[str, Any]] | None:
        """The value as a set of typed keys; None for a value of unknown type."""
        if isinstance(v, UnsupportedAttribute):
            return None
        if isinstance(v, list):
            if not self.lists or not v:
                return None
            return frozenset(_attr_key(x) for x in v)
        return frozenset((_attr_key(v),))

    def add(self, request: str, d: Device) -> bool:
        if not self.covers(request):
            return True
        v = d.attributes.get(self.attribute, _MISSING)
        if v is _MISSING:
            return False
        keys = self._keys(v)
        stack = self.stack
        if self.distinct:
            if keys is None:
                if self.lists or stack:
                    return False
            elif any(k is not None and not k.isdisjoint(keys) for k in stack):
                return False
            stack.append(keys)
            return True
        if not stack:
            if keys is None and self.lists:
                return False
            stack.append(keys)
            return True
        top = stack[-1]
        if keys is None or top is None:
            return False
        new = top & keys
        if not new:
            return False
        stack.append(new)
        return True

    def remove(self, request: str, d: Device) -> None:
        if not self.covers(request):
            return
        self.stack.pop()


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


def evicting_taint(
    taints: Iterable[Taint], tolerations: Sequence[Mapping[str, Any]]
) -> tuple[Taint, int | None] | None:
    """The first ``NoExecute`` taint for which kube-controller-manager's device taint eviction
    controller (KEP-5055) evicts the pods using an allocation result with ``tolerations``, and
    after how many seconds (``None``: at once), or None. That controller counts only
    tolerations whose ``effect`` is ``NoExecute`` (one without an effect lets the scheduler
    allocate the device but does not stop the eviction); one without ``tolerationSeconds``
    tolerates for ever, else the shortest matching ``tolerationSeconds`` (at least 0) applies.
    Kubernetes v1.37.2's ``devicetainteviction`` controller."""
    for t in taints:
        if t.effect != "NoExecute":
            continue
        seconds: int | None = None
        forever = False
        for tol in tolerations:
            if tol.get("effect") != "NoExecute" or not tolerates([tol], t.key, t.value, t.effect):
                continue
            ts = tol.get("tolerationSeconds")
            if ts is None:
                forever = True
                break
            seconds = max(int(ts), 0) if seconds is None else min(seconds, max(int(ts), 0))
        if not forever:
            return t, seconds
    return None


# ---------------------------------------------------------------------------------------------
# The allocator


class SearchMemos:
    """What the search keeps between calls of one :class:`Allocator` (speed only: every
    answer is the one the search would work out again). Owned by the allocator, handed to each
    search; nothing else reads them.

    - ``prepared``: with ``frozen_specs``, ``(id(spec), claim index)`` -> ``(spec, requests,
      constraint arguments)``, the claim's preparation; bounded at :data:`_PREPARED_MAX`
      (:meth:`keep_prepared`);
    - ``selectable``: per ``(id(kept request), id(node's search order))``, whether each
      candidate is selectable (None: not evaluated yet, or it raised, which is not kept);
    - ``consumption``: per ``(id(device capacities), request capacity key)``, what the request
      consumes of such a device (or None: it cannot);
    - ``uses``: per device capacities, request and the amounts already used, the capacity uses.
    """

    def __init__(self) -> None:
        self.prepared: dict[
            tuple[int, int], tuple[Any, list[list[RequestData]], list[tuple[Any, ...]]]
        ] = {}
        self.selectable: dict[tuple[int, int], tuple[RequestData, list[bool | None]]] = {}
        self.consumption: dict[
            tuple[int, str], tuple[tuple[str, Exact, Exact, str], ...] | None
        ] = {}
        self.uses: dict[tuple[Any, ...], tuple[CapacityUse, ...]] = {}

    def keep_prepared(
        self,
        key: tuple[int, int],
        entry: tuple[Any, list[list[RequestData]], list[tuple[Any, ...]]],
    ) -> None:
        """Keep a claim's preparation. Bounded: past :data:`_PREPARED_MAX` (claims with specs
        of their own are each prepared for one pod) every preparation goes, and with them the
        selectability rows, which are keyed on their requests."""
        if len(self.prepared) >= _PREPARED_MAX:
            self.prepared.clear()
            self.selectable.clear()
        self.prepared[key] = entry


class Allocator:
    """Allocates claims on one node at a time, against slices, classes and an allocated state.

    ``classes`` maps DeviceClass name to its object. ``state`` is read, never changed: the
    caller records results it commits (``AllocatedState.add_claim``). ``rng`` makes shareIDs
    reproducible (upstream draws random UUIDs; only their presence matters).

    ``frozen_specs``: the caller promises that a claim's ``spec`` object, once passed, is never
    modified, nor are ``classes`` (the simulation: a claim made from a template shares the
    template's spec). The preparation of a claim (its requests checked, classes and selectors
    resolved, capacity requests parsed) is then memoised per spec object and position; claims
    with an ``allocationMode: All`` request, whose preparation depends on the node, are
    prepared every time.
    """

    def __init__(
        self,
        slices: SliceIndex | Iterable[Slice | Mapping[str, Any]],
        classes: Mapping[str, Mapping[str, Any]],
        state: AllocatedState | None = None,
        features: Features | None = None,
        rng: random.Random | None = None,
        *,
        frozen_specs: bool = False,
    ) -> None:
        self.frozen_specs = frozen_specs
        self.memos = SearchMemos()
        self.index = slices if isinstance(slices, SliceIndex) else SliceIndex(slices)
        self.classes = classes
        self.state = state or AllocatedState()
        self.features = features or Features()
        self.rng = rng or random.Random()
        self._pools_cache: dict[tuple[str, tuple[tuple[str, str], ...]], list[Pool]] = {}
        self._by_node_object: dict[
            int, tuple[Node, list[Pool], tuple[str, tuple[tuple[str, str], ...]]]
        ] = {}
        self._order_cache: dict[
            tuple[str, tuple[tuple[str, str], ...]], list[tuple[Pool, Device]]
        ] = {}
        self._sel_cache: dict[tuple[str, int], bool | CelRuntimeError] = {}
        self._sig_cache: dict[tuple[Any, ...], bool | CelRuntimeError] = {}
        self._lists = self.features.list_type_attributes

    # ---- public ----------------------------------------------------------------------------
    def pools(self, node: Node) -> list[Pool]:
        """:func:`gather_pools` for ``node``, kept per node name and labels."""
        return self._node_entry(node)[0]

    def _node_entry(self, node: Node) -> tuple[list[Pool], tuple[str, tuple[tuple[str, str], ...]]]:
        # The same Node object asks again and again (the simulation's nodes): its key is kept.
        hit = self._by_node_object.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1], hit[2]
        key = (node.name, tuple(sorted(node.labels.items())))
        p = self._pools_cache.get(key)
        if p is None:
            p = gather_pools(self.index, node, self.features)
            self._pools_cache[key] = p
        self._by_node_object[id(node)] = (node, p, key)
        return p, key

    def search_order(self, node: Node) -> list[tuple[Pool, Device]]:
        """The candidate devices of ``node`` in upstream's search order: pools, slices, devices
        (dra-spec.md 4.4), from complete and valid pools only. Kept per node (not to be
        modified: a placement policy sorts a copy)."""
        key = self._node_entry(node)[1]
        order = self._order_cache.get(key)
        if order is None:
            order = [
                (pool, d)
                for pool in self.pools(node)
                if pool.complete and not pool.invalid
                for sl in pool.slices
                for d in sl.devices
            ]
            self._order_cache[key] = order
        return order

    def allocate(
        self,
        node: Node,
        claims: Sequence[Mapping[str, Any]],
        device_rank: Callable[[Device], Any] | None = None,
        *,
        transient: bool = False,
    ) -> list[dict[str, Any]] | None:
        """Allocate ``claims`` (ResourceClaim dicts, in order) on ``node``.

        Returns one AllocationResult dict per claim, or ``None`` if unsatisfiable here.
        Raises :class:`AllocationError` for what upstream reports as an error
        (:class:`NodeAllocationError` when it concerns this node only).

        ``device_rank`` (Tessera's placement policies, not upstream) re-orders the candidate
        devices: they are tried in ascending rank, ties kept in upstream's pool, slice and
        device order. ``None`` is upstream's first fit.

        ``transient``: the claims are copies made for this call only (a policy's stricter
        variants): their preparation is not memoised, even with ``frozen_specs``.
        """
        s = _Search(self, node, claims, device_rank)
        s.memoise = self.frozen_specs and not transient
        return s.run()

    def diagnose(
        self,
        node: Node,
        claims: Sequence[Mapping[str, Any]],
        device_rank: Callable[[Device], Any] | None = None,
        *,
        search: bool = True,
    ) -> NodeRecord:
        """What :meth:`allocate` decides on ``node``, with the reasons: a :class:`NodeRecord`.

        Runs the same search as :meth:`allocate` (same outcome, same errors, captured in the
        record instead of raised) with a recorder installed at every point where a candidate
        device is refused, then, per request and ``firstAvailable`` subrequest, runs each
        candidate device through the same checks on its own (nothing else of the claims picked
        yet). A CEL error met on its own is recorded for that device (:class:`CelError`), not
        raised. Costs one search plus one pass over the node's devices per request; the
        scheduling path (:meth:`allocate`) records nothing. ``search=False`` skips the search
        (for a caller that already knows the outcome): no ``in_search`` refusals, and
        ``results``/``error`` stay None.
        """
        rec = NodeRecord(node.name)
        for p in self.pools(node):
            if not p.complete:
                rec.incomplete_pools.append(f"{p.driver}/{p.name}")
            if p.invalid:
                rec.invalid_pools.append((f"{p.driver}/{p.name}", p.invalid))
        first: dict[tuple[int, str, DeviceID], Refusal] = {}
        if search:
            s = _Search(self, node, claims, device_rank)
            s.rec = _Recorder()
            try:
                rec.results = s.run()
            except AllocationError as e:
                rec.error = str(e)
                rec.node_only = isinstance(e, NodeAllocationError)
            first = s.rec.first
        # On its own: a fresh search state per (claim, request), so picks of the failed search
        # (or of one left half-done by an error) never leak into it.
        alone = _Search(self, node, claims, device_rank)
        try:
            alone._prepare()
        except AllocationError:
            return rec
        alone.rec = _Recorder()
        for cd in alone.claims:
            for alts in cd.requests:
                for rd in alts:
                    rr = RequestRecord(
                        claim_index=rd.claim_index,
                        claim=cd.ref,
                        name=rd.name,
                        parent=rd.parent,
                        class_name=rd.class_name,
                        count=rd.count,
                        all_mode=rd.all_mode,
                        admin=rd.admin,
                        capacity=dict(rd.capacity),
                    )
                    for pool, d in alone.order:
                        r = alone.alone(cd, rd, d, pool)
                        dr = DeviceRecord(d, r, first.get((rd.claim_index, rd.name, d.id)))
                        if isinstance(r, CapacityShort):
                            dr.uses = r.uses  # the same numbers: nothing else is picked here
                        elif r is None or r.check not in SELECTION_CHECKS:
                            dr.uses = alone.uses(rd, d)
                        rr.devices.append(dr)
                    rec.requests.append(rr)
        return rec

    # ---- selectors ----------------------------------------------------------------------------
    def matches(
        self, sels: Sequence[CompiledSelector | _BadSelector], d: Device, owner: str
    ) -> bool:
        """Whether ``d`` passes every selector; a CEL runtime error raises AllocationError."""
        return self.first_false(sels, d, owner) < 0

    def first_false(
        self, sels: Sequence[CompiledSelector | _BadSelector], d: Device, owner: str
    ) -> int:
        """The index of the first selector that is false on ``d``, or -1 when all are true;
        a CEL runtime error raises AllocationError (upstream's message, ``owner`` first).

        Results are memoised per (expression, device), and across devices that agree on every
        field the expression can read (:func:`_reads`): 8 identical GPUs but for their
        UUIDs evaluate ``device.driver == "x"`` once.
        """
        for i, sel in enumerate(sels):
            if isinstance(sel, _BadSelector):
                raise SelectorCompileError(owner, i, sel.expression, sel.error)
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
                raise SelectorError(owner, i, sel.expression, "/".join(d.id), str(r))
            if not r:
                return i
        return -1


class _Recorder:
    """Collects refusals (installed by :meth:`Allocator.diagnose` only). ``first``: the first
    refusal per (claim index, request name, device); ``last``: the latest one."""

    __slots__ = ("first", "last")

    def __init__(self) -> None:
        self.first: dict[tuple[int, str, DeviceID], Refusal] = {}
        self.last: Refusal | None = None

    def refuse(self, rd: RequestData, d: Device, r: Refusal) -> None:
        self.last = r
        self.first.setdefault((rd.claim_index, rd.name, d.id), r)

    def latest(self) -> Refusal | None:
        """``last``, read through a call: after ``rec.last = None`` and a search that may set
        it, mypy would go on narrowing ``rec.last`` to None, and mypyc (setup.py) checks that
        narrowed type at run time."""
        return self.last


@functools.lru_cache(maxsize=4096)
def _reads(expression: str) -> frozenset[tuple[str, str]] | None:
    """The device fields ``expression`` can read (:func:`tessera.cel.reading.device_fields` of
    its compiled tree: ``(kind, "domain/name")``), or None if it may read fields it does not
    name (then its results are memoised per device only)."""
    try:
        return device_fields(compile_selector(expression).tree)
    except CelCompileError:
        return None


def _selector_key(expression: str, d: Device) -> tuple[Any, ...] | None:
    """A key under which devices give the same result for ``expression``: the driver, the
    multi-allocation flag, and the values of the attributes and capacities it names."""
    fields = _reads(expression)
    if fields is None:
        return None
    if any(isinstance(v, UnsupportedAttribute) for v in d.attributes.values()):
        return None  # its activation fails whatever the expression reads: never share
    attrs: list[tuple[str, str]] = []
    caps: list[tuple[str, Fraction]] = []
    prefix = d.driver + "/"
    for kind, name in sorted(fields):
        if kind == "attributes":
            v = d.attributes.get(name)
            if v is not None:
                attrs.append((name, f"{type(v).__name__}:{v!r}"))
        else:  # capacity keys of the driver's own domain are short (as the slice writes them)
            c = d.capacity.get(name)
            if c is None and name.startswith(prefix):
                c = d.capacity.get(name[len(prefix) :])
            if c is not None:
                caps.append((name, c.value.value))
    return (expression, d.driver, d.allow_multiple, tuple(attrs), tuple(caps))


@dataclass(frozen=True)
class _BadSelector:
    """A selector that does not compile: upstream compiles on first use, so the error is raised
    only when a device is evaluated with it (``CEL compile error``)."""

    expression: str
    error: str


def _compile_all(sels: Any) -> list[CompiledSelector | _BadSelector]:
    out: list[CompiledSelector | _BadSelector] = []
    for s in sels or []:
        expr = ((s or {}).get("cel") or {}).get("expression") or ""
        try:
            out.append(_compile(expr))
        except CelCompileError as e:
            out.append(_BadSelector(expr, str(e)))
    return out


@functools.lru_cache(maxsize=4096)
def _compile(expression: str) -> CompiledSelector:
    """compile_selector, cached by expression text (upstream's CEL cache)."""
    return compile_selector(expression)


class _Search:
    def __init__(
        self,
        alloc: Allocator,
        node: Node,
        claims: Sequence[Mapping[str, Any]],
        device_rank: Callable[[Device], Any] | None = None,
    ) -> None:
        self.a = alloc
        self.memos = alloc.memos
        self.f = alloc.features
        self.st = alloc.state
        self.node = node
        self.claims_in = claims
        self.pools = alloc.pools(node)
        # Refusals are recorded only when diagnosing (Allocator.diagnose); else None.
        self.rec: _Recorder | None = None
        # Preparations memoised per spec object (Allocator.frozen_specs, not for transient claims).
        self.memoise = alloc.frozen_specs
        # Dedicated picks in this call, counted: an admin request may pick a device another
        # claim of the call already holds, and undoing it must not free the other pick.
        self.allocating: dict[DeviceID, int] = {}
        self.cap_in_call: dict[DeviceID, dict[str, Exact]] = {}
        # shareIDs drawn in this call (kept when a pick is undone: never drawn twice)
        self.share_ids_drawn: set[str] = set()
        self.counters_in_call: dict[tuple[str, str], dict[str, dict[str, Fraction]]] = {}
        self._available: dict[tuple[str, str], dict[str, dict[str, Fraction]]] = {}
        self.claims: list[ClaimData] = []
        self.invalid_seen = any(p.invalid for p in self.pools)
        # Candidate devices in search order: pools, slices, devices (dra-spec.md 4.4), from
        # complete and valid pools only; a placement policy may re-rank them (stable sort).
        self.ranked = device_rank is not None
        if device_rank is None:
            self.order = alloc.search_order(node)
        else:
            self.order = sorted(alloc.search_order(node), key=lambda pd: device_rank(pd[1]))

    # ---- preparation (dra-spec.md 4.3) ------------------------------------------------------
    def _request(
        self, ci: int, ref: str, name: str, parent: str, r: Mapping[str, Any], admin_ok: bool
    ) -> RequestData:
        """validateDeviceRequest, in upstream's order (messages name a subrequest by its own
        name, as upstream's ``request.name()`` does)."""
        own = name.rpartition("/")[2]
        what = f"claim {ref}, request {own}"
        for i, sel in enumerate(r.get("selectors") or []):
            if (sel or {}).get("cel") is None:
                raise AllocationError(
                    f"{what}, selector #{i}: CEL expression empty (unsupported selector type?)"
                )
        admin = bool(r.get("adminAccess")) if admin_ok else False
        if admin_ok and r.get("adminAccess") is not None and not self.f.admin_access:
            raise AllocationError(f"{what}: admin access is requested, but the feature is disabled")
        cls_name = r.get("deviceClassName") or ""
        if not cls_name:
            raise AllocationError(f"{what}: missing device class name (unsupported request type?)")
        cls = self.a.classes.get(cls_name)
        if cls is None:
            raise AllocationError(
                f'{what}: could not retrieve device class {cls_name}: deviceclass.resource.k8s.io "{cls_name}" '
                "not found"
            )
        mode = r.get("allocationMode") or "ExactCount"
        caps = {
            k: _parse_quantity(v)
            for k, v in ((r.get("capacity") or {}).get("requests") or {}).items()
        }
        cap_key = ";".join(f"{k}={caps[k].value}" for k in sorted(caps))
        rd = RequestData(
            claim_index=ci,
            name=name,
            parent=parent,
            class_name=cls_name,
            class_selectors=_compile_all((cls.get("spec") or {}).get("selectors")),
            selectors=_compile_all(r.get("selectors")),
            all_mode=mode == "All",
            count=int(r.get("count") or 1) if mode == "ExactCount" else 0,
            admin=admin,
            tolerations=list(r.get("tolerations") or []),
            capacity=caps,
            cap_key=cap_key,
            requested_key=cap_key + "|" + ",".join(caps[k].format for k in sorted(caps)),
            raw=dict(r),
            what=what,
        )
        if mode == "All":
            for p in self.pools:
                if not p.complete:
                    raise AllocationError(
                        f"{what}: asks for all devices, but resource pool {p.driver}/{p.name} is currently "
                        "being updated"
                    )
                if p.invalid:
                    raise AllocationError(
                        f"{what}: asks for all devices, but resource pool {p.driver}/{p.name} is currently invalid"
                    )
                for sl in p.slices:
                    for d in sl.devices:
                        if not self._selectable(rd, d, ref):
                            continue
                        # Kubernetes v1.37.2 (checked with tools/kube's harness): the All set
                        # drops devices the request can never fit, not those that earlier
                        # allocations filled; those make the request fail (dra-spec.md 2.7).
                        if self.f.consumable_capacity and not self._capacity_fits(
                            rd, d, in_call=False, existing=False, prescan=True
                        ):
                            continue
                        rd.all_devices.append(d)
            rd.count = len(rd.all_devices)
        elif mode != "ExactCount":
            raise AllocationError(f"{what}: unsupported count mode {mode}")
        return rd

    def _prepare(self) -> None:
        """Allocate's preparation, in upstream's order: per claim, per request: feature checks,
        validateDeviceRequest (per subrequest), the 32-device limit; then the constraints."""
        for ci, claim in enumerate(self.claims_in):
            md = claim.get("metadata") or {}
            # klog.KObj: "namespace/name", or just "name" for an object without a namespace.
            name = md.get("name") or md.get("generateName") or ""
            ref = f"{md['namespace']}/{name}" if md.get("namespace") else name
            spec = claim.get("spec")
            if self.memoise:
                hit = self.memos.prepared.get((id(spec), ci))
                if hit is not None and hit[0] is spec:  # prepared before, without an error
                    cons = [
                        _Constraint(*args) for args in hit[2]
                    ]  # fresh: their stacks are per search
                    self.claims.append(ClaimData(claim, ref, hit[1], cons))
                    continue
            devices = (spec or {}).get("devices") or {}
            reqs: list[list[RequestData]] = []
            min_total = 0
            for r in device_requests(spec):
                name = r.name
                subs_in = r.first_available
                if subs_in and not self.f.prioritized_list:
                    raise AllocationError(
                        f"claim {ref}, request {name}: has subrequests, but the DRAPrioritizedList feature is disabled"
                    )
                if not self.f.consumable_capacity:
                    if r.exactly is not None and r.exactly.body.get("capacity") is not None:
                        raise AllocationError(
                            f"claim {ref}, request {name}: has capacity requests, but the DRAConsumableCapacity "
                            "feature is disabled"
                        )
                    for sub in subs_in:
                        if sub.body.get("capacity") is not None:
                            raise AllocationError(
                                f"claim {ref}, subrequest {sub.body.get('name', '')}: has capacity requests, but "
                                "the DRAConsumableCapacity feature is disabled"
                            )
                if subs_in:
                    subs = [
                        self._request(ci, ref, s.name, name, s.body, admin_ok=False)
                        for s in subs_in
                    ]
                    for j, s in enumerate(subs):
                        s.sub_index = j
                    reqs.append(subs)
                    need = min(s.count for s in subs)
                else:
                    exact = r.exactly.body if r.exactly is not None else {}
                    rd = self._request(ci, ref, name, name, exact, admin_ok=True)
                    reqs.append([rd])
                    need = rd.count
                if need > MAX_RESULTS_PER_CLAIM - min_total:
                    raise AllocationError(
                        f"claim {ref}, request {name}: adding {need} devices exceeds the claim limit of "
                        f"{MAX_RESULTS_PER_CLAIM}, with {min_total} already accounted for"
                    )
                min_total += need
            con_args: list[tuple[Any, ...]] = []
            for i, c in enumerate(devices.get("constraints") or []):
                if c.get("matchAttribute"):
                    con_args.append(
                        (
                            i,
                            c["matchAttribute"],
                            c.get("requests") or [],
                            False,
                            self.f.list_type_attributes,
                        )
                    )
                elif c.get("distinctAttribute") and self.f.consumable_capacity:
                    con_args.append(
                        (
                            i,
                            c["distinctAttribute"],
                            c.get("requests") or [],
                            True,
                            self.f.list_type_attributes,
                        )
                    )
                else:
                    raise AllocationError(
                        f"claim {ref}, constraint #{i}: empty constraint (unsupported constraint type?)"
                    )
            self.claims.append(
                ClaimData(claim, ref, reqs, [_Constraint(*args) for args in con_args])
            )
            if self.memoise and not any(rd.all_mode for alts in reqs for rd in alts):
                self.memos.keep_prepared((id(spec), ci), (spec, reqs, con_args))
                for alts in reqs:
                    for rd in alts:
                        rd.kept = True

    # ---- checks -----------------------------------------------------------------------------
    # Each check decides in one place; where it refuses, a recorder (diagnose only) is told
    # why, with the numbers: the points where upstream logs "Device not selectable", "Device
    # capacity not enough", "Insufficient counters", ... at verbosity 7.
    def _selectable(self, rd: RequestData, d: Device, ref: str) -> bool:
        """isSelectable: binding conditions (feature off), class selectors, request selectors,
        then the per-device node selection, in upstream's order."""
        rec = self.rec
        if d.binding_conditions and not self.f.device_binding_and_status:
            if rec is not None:
                rec.refuse(rd, d, BindingConditionsOff())
            return False
        i = self.a.first_false(rd.class_selectors, d, f"class {rd.class_name}")
        if i >= 0:
            if rec is not None:
                rec.refuse(
                    rd,
                    d,
                    SelectorFalse("class", rd.class_name, i, rd.class_selectors[i].expression),
                )
            return False
        i = self.a.first_false(rd.selectors, d, f"claim {ref}")
        if i >= 0:
            if rec is not None:
                rec.refuse(rd, d, SelectorFalse("request", rd.name, i, rd.selectors[i].expression))
            return False
        if d.per_device_node_selection and not device_on_node(d, self.node):
            if rec is not None:
                rec.refuse(rd, d, NotOnNode())
            return False
        return True

    def _multi(self, d: Device) -> bool:
        return d.allow_multiple and self.f.consumable_capacity

    def _in_use(self, rd: RequestData, d: Device, cd: ClaimData) -> bool:
        did = d.id
        if rd.admin:
            if did not in cd.picked_dedicated:
                return False
        elif did not in self.st.dedicated and (self._multi(d) or did not in self.allocating):
            return False
        if self.rec is not None:
            by = (
                "same-claim"
                if rd.admin
                else "allocated"
                if did in self.st.dedicated
                else "allocating"
            )
            self.rec.refuse(rd, d, InUse(by))
        return True

    def _consumption(
        self, rd: RequestData, d: Device
    ) -> tuple[tuple[str, Exact, Exact, str], ...] | None:
        """What ``rd`` would consume of each capacity of ``d``: (name, amount, published value,
        amount as a result string); None if ``d`` lacks a requested capacity or an amount
        violates its policy (dra-spec.md 2.2, 2.3). Depends only on the request's capacity
        requests and the device's capacities, so it is memoised for the allocator's lifetime
        per capacity mapping: devices that publish the same capacities share one
        (:class:`~tessera.allocator.model.Descriptions`), and one answer."""
        key = (id(d.capacity), rd.cap_key)
        memo = self.memos.consumption
        if key in memo:
            return memo[key]
        # CapacityArithmeticError: not memoised, it aborts
        got = consumption(rd.capacity, d, self.f.fractional_capacity_range)
        out = got if isinstance(got, tuple) else None
        memo[key] = out
        return out

    def _new_share_id(self) -> str:
        """A fresh shareID (a random UUID, as upstream draws one) that no recorded result and no
        earlier pick of this call holds: a seeded run fed back its own output never reuses one
        of the kept allocations' shareIDs (two shares of one device would count as one)."""
        while True:
            sid = uuid_text(self.a.rng.getrandbits(128), 4)
            if not self.st.share_id_in_use(sid) and sid not in self.share_ids_drawn:
                self.share_ids_drawn.add(sid)
                return sid

    def _use(
        self, rd: RequestData, d: Device, prescan: bool = False
    ) -> tuple[tuple[str, Exact, Exact, str], ...] | None:
        """:meth:`_consumption`, an amount that cannot be used raised as the allocation's
        error, naming the device as upstream does: by its name in allocationMode All's
        pre-scan (``prescan``), else by its ID."""
        try:
            return self._consumption(rd, d)
        except CapacityArithmeticError as e:
            dev = d.name if prescan else "/".join(d.id)
            raise CapacityAbort(
                f"{rd.what}: checking capacity for device {dev}: {e}", str(e)
            ) from None

    def _capacity_fits(
        self,
        rd: RequestData,
        d: Device,
        *,
        in_call: bool,
        existing: bool = True,
        prescan: bool = False,
    ) -> bool:
        """CmpRequestOverCapacity: earlier shares (``existing``) plus this call's picks
        (``in_call``) plus what ``rd`` consumes must stay within every capacity. An amount that
        cannot be used aborts the allocation (:class:`AllocationError`, see :meth:`_use`)."""
        use = self._use(rd, d, prescan)
        if use is None:
            if self.rec is not None:
                why = consumption(rd.capacity, d, self.f.fractional_capacity_range)
                assert isinstance(why, Refusal)
                self.rec.refuse(rd, d, why)
            return False
        prior = self.st.aggregated.get(d.id) if existing else None
        pending = self.cap_in_call.get(d.id) if in_call else None
        for k, amount, total, _ in use:
            if prior:
                amount = amount + prior.get(k, 0)
            if pending:
                amount = amount + pending.get(k, 0)
            if amount > total:
                if self.rec is not None:
                    self.rec.refuse(rd, d, CapacityShort(self._uses(rd, d, use, prior, pending)))
                return False
        return True

    def uses(self, rd: RequestData, d: Device) -> tuple[CapacityUse, ...] | None:
        """What ``rd`` consumes of each capacity of ``d`` and what is free before this call's
        picks (diagnose only); None when the device cannot serve the request at all (also
        when an amount cannot be used: :class:`CapacityUnusable`)."""
        try:
            use = self._use(rd, d)
        except CapacityAbort:
            return None
        if use is None:
            return None
        return self._uses(rd, d, use, self.st.aggregated.get(d.id), None)

    def _uses(
        self,
        rd: RequestData,
        d: Device,
        use: tuple[tuple[str, Exact, Exact, str], ...],
        prior: Mapping[str, Exact] | None,
        pending: Mapping[str, Exact] | None,
    ) -> tuple[CapacityUse, ...]:
        """The record's :class:`CapacityUse` per capacity (diagnose only). The same for every
        device with the same capacities and the same amounts in use, so memoised on those
        (the records of a whole fleet repeat a few fill levels)."""
        key = (
            id(d.capacity),
            rd.requested_key,
            tuple(prior.items()) if prior else (),
            tuple(pending.items()) if pending else (),
        )
        memo = self.memos.uses
        got = memo.get(key)
        if got is None:
            got = tuple(
                CapacityUse(
                    n,
                    rd.capacity.get(n),
                    Fraction(a),
                    Fraction(t),
                    Fraction((prior or {}).get(n, 0)),
                    Fraction((pending or {}).get(n, 0)),
                    d.capacity[n].value.format,
                )
                for n, a, t, _ in use
            )
            memo[key] = got
        return got

    def _available_counters(
        self, pool_key: tuple[str, str], counters: dict[str, dict[str, Fraction]]
    ) -> dict[str, dict[str, Fraction]]:
        """Published counters of the pool minus what already-allocated devices consume (may go
        negative: then nothing is available)."""
        av = self._available.get(pool_key)
        if av is None:
            av = {cs: dict(v) for cs, v in counters.items()}
            pool = next(p for p in self.pools if p.key == pool_key)
            for s in pool.slices + pool.not_targeting:
                for d in s.devices:
                    if d.consumes_counters and self.st.is_allocated(d.id):
                        for cs, cvals in d.consumes_counters:
                            for c, v in cvals.items():
                                if cs in av and c in av[cs]:
                                    av[cs][c] -= v
            self._available[pool_key] = av
        return av

    def _charge_counters(
        self, rd: RequestData, d: Device, pool: Pool
    ) -> list[tuple[str, str, Fraction]] | None:
        """checkAvailableCounters: add ``d``'s consumption to this call's per-pool totals; if
        any counter of the pool then exceeds what is available, take it back and refuse."""
        avail = self._available_counters(pool.key, pool.counters)
        used = self.counters_in_call.setdefault(pool.key, {})
        charge: list[tuple[str, str, Fraction]] = []
        for cs, cvals in d.consumes_counters:
            for c, v in cvals.items():
                u = used.setdefault(cs, {})
                u[c] = u.get(c, Fraction(0)) + v
                charge.append((cs, c, v))
        for cs, cvals in avail.items():
            u = used.get(cs, {})
            for c, have in cvals.items():
                if have < u.get(c, Fraction(0)):
                    self._uncharge(pool, charge)
                    if self.rec is not None:
                        own = sum((v for s2, c2, v in charge if (s2, c2) == (cs, c)), Fraction(0))
                        in_call = used.get(cs, {}).get(c, Fraction(0))  # after taking ours back
                        left = tuple(
                            (c2, a2 - used.get(cs, {}).get(c2, Fraction(0)))
                            for c2, a2 in sorted(cvals.items())
                        )
                        needs = tuple(
                            sorted(
                                next(
                                    (dict(v2) for s2, v2 in d.consumes_counters if s2 == cs), {}
                                ).items()
                            )
                        )
                        self.rec.refuse(
                            rd,
                            d,
                            CountersShort(
                                cs,
                                c,
                                own,
                                have,
                                in_call,
                                pool.counters[cs][c],
                                tuple(sorted(pool.counters[cs].items())),
                                left,
                                needs,
                            ),
                        )
                    return None
        return charge

    def _uncharge(self, pool: Pool, charge: list[tuple[str, str, Fraction]]) -> None:
        used = self.counters_in_call.get(pool.key, {})
        for cs, c, v in charge:
            used[cs][c] -= v

    # ---- allocateDevice (dra-spec.md 4.4 steps 1-6) -----------------------------------------
    def _allocate_device(
        self,
        cd: ClaimData,
        rd: RequestData,
        d: Device,
        pool: Pool,
        must: bool,
        capacity_checked: bool = False,
    ) -> Callable[[], None] | None:
        """Try to add ``d`` for ``rd``; return an undo callable, or None if it cannot be added.

        Kubernetes v1.37.2's order: in use, counters (charged once per shared device: not when
        it already has capacity in use), taints, constraints (a failure is an error when
        ``must``: allocationMode All), then capacity against this call's picks (unless the caller
        just checked it, ``capacity_checked``: nothing in between changes the answer). The undo
        releases everything the pick took, counters and the in-call capacity entry of a
        shareable device included (dra-spec.md 2.5, correction)."""
        multi = self._multi(d)
        rec = self.rec
        if self._in_use(rd, d, cd):
            return None
        if d.consumes_counters and not self.f.partitionable_devices:
            if rec is not None:
                rec.refuse(rd, d, CountersOff())
            return None
        counter_charge: list[tuple[str, str, Fraction]] = []
        if d.consumes_counters:
            # A share placed earlier (any earlier cycle: an aggregated entry exists even for a
            # share without consumedCapacity; or this call) already paid the counters.
            in_use_cap = d.id in self.st.aggregated or d.id in self.cap_in_call
            if not (multi and in_use_cap):
                charged = self._charge_counters(rd, d, pool)
                if charged is None:
                    return None
                counter_charge = charged
        if self.f.device_taints:
            for t in d.taints:
                if t.effect in ("NoSchedule", "NoExecute") and not tolerates(
                    rd.tolerations, t.key, t.value, t.effect
                ):
                    self._uncharge(pool, counter_charge)
                    if rec is not None:
                        rec.refuse(rd, d, Tainted(t.key, t.value, t.effect, rd.name, t.rule))
                    return None
        added: list[_Constraint] = []
        for con in cd.constraints:
            if not con.add(rd.name, d):
                for a in reversed(added):
                    a.remove(rd.name, d)
                self._uncharge(pool, counter_charge)
                if rec is not None:
                    rec.refuse(rd, d, self._constraint_refusal(cd, con, d))
                if must:
                    raise AllocationError(
                        f"claim {cd.ref}, request {rd.name.rpartition('/')[2]}: cannot add device "
                        f"{'/'.join(d.id)} because a claim constraint would not be satisfied"
                    )
                return None
            added.append(con)
        if (
            self.f.consumable_capacity
            and not capacity_checked
            and not self._capacity_fits(rd, d, in_call=True)
        ):
            for a in reversed(added):
                a.remove(rd.name, d)
            self._uncharge(pool, counter_charge)
            return None
        result: dict[str, Any] = {
            "request": rd.name,
            "driver": d.driver,
            "pool": d.pool,
            "device": d.name,
        }
        if rd.admin:
            result["adminAccess"] = True
        if rd.tolerations:
            result["tolerations"] = [dict(t) for t in rd.tolerations]
        if d.binding_conditions and self.f.device_binding_and_status:
            result["bindingConditions"] = list(d.binding_conditions)
            result["bindingFailureConditions"] = list(d.binding_failure_conditions)
        cap_added: dict[str, Exact] = {}
        entry_existed = False
        if multi:
            result["shareID"] = self._new_share_id()
            if d.capacity:
                consumed = {}
                for k, amount, _, text in self._consumption(rd, d) or ():
                    consumed[k] = text
                    cap_added[k] = amount
                result["consumedCapacity"] = consumed
            entry_existed = d.id in self.cap_in_call
            entry = self.cap_in_call.setdefault(d.id, {})
            for k, v in cap_added.items():
                entry[k] = entry.get(k, 0) + v
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
                # ConsumedCapacityCollection.Remove: subtract, drop the entry once all of it
                # is zero; an entry an earlier share of this call made stays (as its marker).
                entry = self.cap_in_call.get(d.id)
                if entry is not None:
                    for k, v in cap_added.items():
                        if k in entry:
                            entry[k] -= v
                    if not any(entry.values()):
                        del self.cap_in_call[d.id]
                if entry_existed and d.id not in self.cap_in_call:
                    self.cap_in_call[d.id] = {}
            else:
                left = self.allocating[d.id] - 1
                if left:
                    self.allocating[d.id] = left
                else:
                    del self.allocating[d.id]
                cd.picked_dedicated.discard(d.id)
            for con in reversed(added):
                con.remove(rd.name, d)
            self._uncharge(pool, counter_charge)

        return undo

    def _constraint_refusal(self, cd: ClaimData, con: _Constraint, d: Device) -> ConstraintFailed:
        v = d.attributes.get(con.attribute)
        chosen = tuple(
            (p.name, p.attributes.get(con.attribute))
            for p, r in zip(cd.devices, cd.results, strict=True)
            if con.covers(r["request"])
        )
        return ConstraintFailed(con.index, con.kind, con.attribute, v, chosen)

    def _candidate(
        self,
        cd: ClaimData,
        rd: RequestData,
        d: Device,
        pool: Pool,
        memo: list[bool | None] | None = None,
        k: int = -1,
    ) -> Callable[[], None] | None:
        """One candidate of the device loop (allocateOne): in use, selectable, capacity, then
        allocateDevice. Returns the undo of a successful pick, else None. The search
        (``_slot``) and the on-its-own pass (:meth:`alone`) both ask it. ``memo``: the
        request's kept selectability per position in the node's order (``k``: this device's
        position), or None to evaluate the selectors."""
        if self._in_use(rd, d, cd):
            return None
        if memo is not None:
            ok = memo[k]
            if ok is None:
                ok = memo[k] = self._selectable(rd, d, cd.ref)
        else:
            ok = self._selectable(rd, d, cd.ref)
        if not ok:
            return None
        cap = self.f.consumable_capacity
        if cap and not self._capacity_fits(rd, d, in_call=True):
            return None
        return self._allocate_device(cd, rd, d, pool, must=False, capacity_checked=cap)

    def alone(self, cd: ClaimData, rd: RequestData, d: Device, pool: Pool) -> Refusal | None:
        """The first check that refuses ``d`` for ``rd`` with nothing else picked (diagnose
        only; the search state is left as it was). A CEL error, or a capacity amount that
        aborts the allocation, is returned, not raised."""
        assert self.rec is not None
        self.rec.last = None
        try:
            undo = self._candidate(cd, rd, d, pool)
        except CapacityAbort as abort:  # its own name: mypyc types a handler's name once
            return CapacityUnusable(abort.inner)
        except (SelectorError, SelectorCompileError) as e:
            owner = "class" if e.owner.startswith("class ") else "request"
            kind = "compile" if isinstance(e, SelectorCompileError) else "runtime"
            return CelError(
                owner,
                rd.class_name if owner == "class" else rd.name,
                e.index,
                e.expression,
                e.error,
                kind,
            )
        if undo is not None:
            undo()
            return None
        return self.rec.latest()

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
                raise NodeAllocationError("invalid resource pools were encountered")
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
            # The precomputed set: each device must be allocatable; a constraint that fails is
            # an error, and it is checked before the device's remaining capacity (v1.37.2).
            d = rd.all_devices[di]
            pool = next(p for p in self.pools if p.key == (d.driver, d.pool))
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
        # Selectability does not change with allocations: with frozen specs, outside diagnose
        # and in upstream's order, it is kept per request and node, evaluated where upstream
        # first evaluates it (a CEL error is raised at the same point, and never kept).
        order = self.order
        memo: list[bool | None] | None = None
        if rd.kept and self.rec is None and not self.ranked:
            mkey = (id(rd), id(order))  # the order list is kept per node by the allocator
            row = self.memos.selectable.get(mkey)
            if row is None or row[0] is not rd:  # the row holds its request: ids stay theirs
                row = self.memos.selectable[mkey] = (rd, [None] * len(order))
            memo = row[1]
        for k in range(start + 1, len(order)):
            pool, d = order[k]
            undo = self._candidate(cd, rd, d, pool, memo, k)
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
                        {
                            "matchFields": [
                                {
                                    "key": "metadata.name",
                                    "operator": "In",
                                    "values": [self.node.name],
                                }
                            ]
                        }
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
                    out.append(
                        {"source": "FromClass", "requests": list(reqs), "opaque": c["opaque"]}
                    )
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
