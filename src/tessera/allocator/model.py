"""Allocator input model: devices and pools from ResourceSlices, and the allocated state.

Built once from API dicts, then read many times by the search. Pure: no I/O.
Field names follow ``resource.k8s.io/v1``; semantics follow dra-spec.md sections 2 and 4.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from tessera.api.errors import ManifestError
from tessera.api.loader import object_ref
from tessera.api.quantity import Quantity, QuantityError
from tessera.cel import CelRuntimeError, DeviceView, SemverValue, device_activation

DeviceID = tuple[str, str, str]  # (driver, pool, device)

#: An exact amount in base units (bytes, cores, ...): an ``int`` when it is whole, else a
#: ``Fraction``. Both compare and add exactly with each other; whole amounts (nearly all) as
#: ints make the allocator's capacity arithmetic an order of magnitude cheaper.
Exact = int | Fraction


def exact(v: Fraction | int) -> Exact:
    """``v`` as an int when it is whole, else as it is (see :data:`Exact`)."""
    return v.numerator if v.denominator == 1 else v


@functools.lru_cache(maxsize=4096)
def _consumed(text: str | int) -> Exact:
    """A ``consumedCapacity`` value, exact (results repeat the same few texts)."""
    return exact(Quantity.parse(text, beyond_int64=True).value)


def device_id_str(d: DeviceID) -> str:
    """``driver/pool/device``, as the allocation results and explain name a device."""
    return "/".join(d)


class UnsupportedAttribute:
    """An attribute value the allocator cannot use: no value set.

    API validation rejects these, but the allocator must cope: upstream fails with
    ``unsupported attribute value`` as soon as a selector is evaluated on the device (the whole
    attribute map is converted for CEL up front); a constraint treats it as a value of unknown
    type (see ``_Constraint`` in core.py).
    """

    __slots__ = ("name", "why")

    def __init__(self, why: str, name: str = "") -> None:
        self.why = why
        self.name = name  # as the slice spells it (upstream's message names it so)

    def __repr__(self) -> str:
        return f"UnsupportedAttribute({self.why!r}, {self.name!r})"


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """``DeviceCapacity.requestPolicy`` (KEP-5075): default, validValues or validRange."""

    default: Quantity | None = None
    valid_values: tuple[Quantity, ...] = ()
    range_min: Quantity | None = None
    range_max: Quantity | None = None
    range_step: Quantity | None = None
    # validRange step arithmetic, precomputed as upstream's roundUpRange does it: in Value()
    # units (each bound rounded up to an integer), or in milli-units when DRAFractionalCapacityRange
    # is on (the 1.37 default) and min, max and step are all exact in milli-units within int64,
    # the step at least 1m (``useMilli``; then bounds are exact, a request must be too).
    milli_ok: bool = field(default=False, init=False, compare=False)
    min_units: int = field(default=0, init=False, compare=False)
    step_units: int = field(default=0, init=False, compare=False)
    min_milli: int = field(default=0, init=False, compare=False)
    step_milli: int = field(default=0, init=False, compare=False)

    def __post_init__(self) -> None:
        ok = True
        for x in (self.range_min, self.range_max, self.range_step):
            if x is not None:
                m = x.value * 1000
                ok = ok and m.denominator == 1 and -(2**63) <= m <= 2**63 - 1
        if self.range_step is not None and ok and self.range_step.value * 1000 < 1:
            ok = False
        object.__setattr__(self, "milli_ok", ok)
        if self.range_min is not None:
            object.__setattr__(self, "min_units", math.ceil(self.range_min.value))
            object.__setattr__(self, "min_milli", math.ceil(self.range_min.value * 1000))
        if self.range_step is not None:
            object.__setattr__(self, "step_units", math.ceil(self.range_step.value))
            object.__setattr__(self, "step_milli", math.ceil(self.range_step.value * 1000))

    def arithmetic(self, fractional: bool) -> tuple[int, int, int]:
        """``(scale, min, step)`` of the step arithmetic: scale 1000 (milli-units) when
        ``fractional`` (the DRAFractionalCapacityRange gate) and the bounds allow it, else 1."""
        if fractional and self.milli_ok:
            return 1000, self.min_milli, self.step_milli
        return 1, self.min_units, self.step_units


@dataclass(frozen=True, slots=True)
class Capacity:
    """One published capacity (``devices[].capacity[name]``, KEP-5075): ``value`` in the
    capacity's own units as a Quantity (memory in bytes, BinarySI; Tessera's ``cores`` in
    percent of the GPU's SMs, 0-100), which never changes with consumption, and its
    ``requestPolicy`` (None: a request consumes the whole value when shared, dra-spec.md 2.2)."""

    value: Quantity
    policy: RequestPolicy | None = None


@dataclass(frozen=True, slots=True)
class Taint:
    """A device taint (KEP-5055): published in the slice, or added by the DeviceTaintRule
    named ``rule`` ("" for a slice's own)."""

    key: str
    value: str
    effect: str
    rule: str = ""

    def text(self) -> str:
        """``key=value:effect`` (``key:effect`` without a value), kubectl's spelling."""
        return (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )


@dataclass(frozen=True, slots=True)
class TaintRule:
    """A ``resource.k8s.io/v1`` DeviceTaintRule (KEP-5055, DRADeviceTaintRules, GA in 1.37):
    ``spec.taint`` added to every device its ``spec.deviceSelector`` selects. Each of
    ``driver``, ``pool``, ``device`` narrows the selection when set (``None``: any); an empty
    selector selects every device; a rule without a selector (``selects_none``) selects none.
    The scheduler sees slices with these taints merged in, as if the driver published them."""

    name: str
    taint: Taint
    driver: str | None = None
    pool: str | None = None
    device: str | None = None
    selects_none: bool = False

    def selects(self, driver: str, pool: str, device: str) -> bool:
        if self.selects_none:
            return False
        return (
            (self.driver is None or self.driver == driver)
            and (self.pool is None or self.pool == pool)
            and (self.device is None or self.device == device)
        )


def taint_rule_from_dict(obj: Mapping[str, Any]) -> TaintRule:
    """A validated DeviceTaintRule object (API shape) as a :class:`TaintRule`. Empty strings in
    the selector count as unset (``omitempty`` fields)."""
    md = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    t = spec.get("taint") or {}
    sel = spec.get("deviceSelector")
    name = str(md.get("name") or "")
    taint = Taint(
        str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""), name
    )
    if sel is None:
        return TaintRule(name, taint, selects_none=True)
    return TaintRule(
        name,
        taint,
        driver=sel.get("driver") or None,
        pool=sel.get("pool") or None,
        device=sel.get("device") or None,
    )


@dataclass(eq=False, slots=True)
class Device:
    """A device as the allocator sees it (one ``ResourceSlice.spec.devices[]`` entry).

    ``id``: (driver, pool, device name). ``attributes``: fully qualified names
    (``gpu.tessera.dev/uuid``) -> bool, int, str, semver, list or :class:`UnsupportedAttribute`;
    ``capacity``: names as the slice writes them (short in the driver's own domain) ->
    :class:`Capacity`; ``allow_multiple``: ``allowMultipleAllocations`` (KEP-5075: shares of it
    may go to several claims). ``consumes_counters``: (counter set, counter -> amount in the
    counter's units) per ``consumesCounters`` entry (KEP-4815); ``taints``: its own and
    DeviceTaintRules' (KEP-5055); ``binding_conditions`` (KEP-5007). Node selection: the slice's
    (``nodeName``, ``nodeSelector``, ``allNodes``) or, with ``per_device_node_selection``, the
    device's own."""

    id: DeviceID
    slice_name: str
    attributes: dict[str, Any]
    capacity: dict[str, Capacity]
    allow_multiple: bool
    consumes_counters: tuple[tuple[str, dict[str, Fraction]], ...] = ()
    taints: tuple[Taint, ...] = ()
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    binds_to_node: bool = False
    # Node selection of the slice, or of the device with perDeviceNodeSelection.
    node_name: str | None = None
    node_selector: dict[str, Any] | None = None
    all_nodes: bool = False
    per_device_node_selection: bool = False
    _activation: dict[str, Any] | None = None
    _activation_scalar: dict[str, Any] | None = None

    @property
    def driver(self) -> str:
        return self.id[0]

    @property
    def pool(self) -> str:
        return self.id[1]

    @property
    def name(self) -> str:
        return self.id[2]

    def activation(self, lists: bool = True) -> dict[str, Any]:
        """CEL activation, built on first use and kept.

        ``lists``: DRAListTypeAttributes is on. When it is off, list-valued attributes are not
        visible to selectors (as if the device did not have them). Raises
        :class:`CelRuntimeError` (``unsupported attribute value``) for an attribute without a
        usable value, like upstream's up-front conversion of the attribute map.
        """
        act = self._activation if lists else self._activation_scalar
        if act is None:
            attrs = self.attributes
            for k, v in attrs.items():
                if isinstance(v, UnsupportedAttribute):
                    raise CelRuntimeError(f"attribute {v.name or k}: unsupported attribute value")
            if not lists:
                attrs = {k: v for k, v in attrs.items() if not isinstance(v, list)}
            view = DeviceView(
                driver=self.driver,
                attributes=attrs,
                capacity={_qualify(k, self.driver): c.value for k, c in self.capacity.items()},
                allow_multiple_allocations=self.allow_multiple,
            )
            act = device_activation(view)
            if lists:
                self._activation = act
            else:
                self._activation_scalar = act
        return act


@dataclass
class Slice:
    """A ResourceSlice reduced to what allocation needs: its ``name``, ``driver``, ``pool``
    (``spec.pool.name``, ``generation``, ``resourceSliceCount`` as ``slice_count``), node
    selection, ``devices`` and ``shared_counters`` (counter set -> counter -> amount, KEP-4815);
    ``obj`` the object as read."""

    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node_name: str | None
    node_selector: dict[str, Any] | None
    all_nodes: bool
    per_device_node_selection: bool
    devices: list[Device]
    shared_counters: dict[str, dict[str, Fraction]] = field(default_factory=dict)
    obj: dict[str, Any] = field(default_factory=dict)


def _qualify(name: str, driver: str) -> str:
    return name if "/" in name else f"{driver}/{name}"


def _q(v: Any, where: str, ref: str) -> Quantity:
    """A ResourceSlice quantity: decimal values past 2^63-1 are kept, as the API server does."""
    try:
        return Quantity.parse(v, beyond_int64=True)
    except QuantityError as e:
        raise ManifestError(str(e), obj=ref, field=where) from None


def _attr_value(a: Any, where: str, ref: str) -> Any:
    if a is None or (isinstance(a, dict) and not any(v is not None for v in a.values())):
        return UnsupportedAttribute("no value set")
    if not isinstance(a, dict) or len([k for k in a if a[k] is not None]) != 1:
        raise ManifestError(
            "must have exactly one of int, bool, string, version (or ints/bools/strings/versions)",
            obj=ref,
            field=where,
        )
    kind, v = next((k, v) for k, v in a.items() if v is not None)
    if kind == "int" and isinstance(v, int) and not isinstance(v, bool):
        return v
    if kind == "bool" and isinstance(v, bool):
        return v
    if kind == "string" and isinstance(v, str):
        return v
    if kind == "version" and isinstance(v, str):
        try:
            return SemverValue.parse(v)
        except ValueError as e:
            raise ManifestError(str(e), obj=ref, field=where) from None
    if kind in ("ints", "bools", "strings", "versions") and isinstance(v, list):
        if not v:
            # API validation rejects empty lists, but the allocator copes as upstream does: an
            # empty list is a (list) value for CEL, and of unknown type for constraints.
            return []
        inner = kind[:-1]
        return [_attr_value({inner: x}, where, ref) for x in v]
    raise ManifestError(
        f"{kind}: {v!r} is not a valid {kind} attribute value", obj=ref, field=where
    )


def _policy(p: Any, where: str, ref: str) -> RequestPolicy | None:
    if not p:
        return None
    rng = p.get("validRange") or {}
    return RequestPolicy(
        default=_q(p["default"], f"{where}.default", ref) if p.get("default") is not None else None,
        valid_values=tuple(_q(x, f"{where}.validValues", ref) for x in p.get("validValues") or ()),
        range_min=_q(rng["min"], f"{where}.validRange.min", ref)
        if rng.get("min") is not None
        else None,
        range_max=_q(rng["max"], f"{where}.validRange.max", ref)
        if rng.get("max") is not None
        else None,
        range_step=_q(rng["step"], f"{where}.validRange.step", ref)
        if rng.get("step") is not None
        else None,
    )


def _counters(m: Any, where: str, ref: str) -> dict[str, Fraction]:
    return {k: _q((v or {}).get("value"), f"{where}.{k}", ref).value for k, v in (m or {}).items()}


_UNKNOWN = object()


class Descriptions:
    """What devices of many slices have in common, parsed once and shared.

    A fleet built from a few inventories publishes the same capacities (values and request
    policies) and mostly the same attribute values on every node: a :class:`SliceIndex` reads
    them once and every :class:`Device` that publishes the same holds the same objects (its
    ``capacity`` mapping itself is shared, which the allocator's capacity memo keys on).
    Keys are the published object itself, else the ``repr`` of the published value (JSON
    data: equal reprs are equal values of equal types). Shared objects are never modified.
    Values that cannot be read are not kept: each device's error names its own slice and field.
    """

    __slots__ = ("attributes", "by_id", "capacities")

    def __init__(self) -> None:
        self.capacities: dict[str, dict[str, Capacity]] = {}
        self.attributes: dict[tuple[str, str], Any] = {}
        # The same published object met again (slices of ``count`` copies share every object
        # that holds no name): id -> (object, parsed), the object kept so that its id stays its.
        self.by_id: dict[int, tuple[Any, Any]] = {}


def slice_from_dict(obj: dict[str, Any], shared: Descriptions | None = None) -> Slice:
    """Build a :class:`Slice` from a ResourceSlice dict.

    Raises :class:`ManifestError` naming the slice and field for values that cannot be read
    (quantities, attribute values). Structural API validation is done elsewhere. ``shared``:
    parsed capacities and attribute values to reuse (and to add to), see :class:`Descriptions`.
    """
    ref = object_ref(obj)
    spec = obj.get("spec") or {}
    driver = spec.get("driver") or ""
    pool = spec.get("pool") or {}
    pool_name = pool.get("name") or ""
    if not driver or not pool_name:
        raise ManifestError("spec.driver and spec.pool.name are required", obj=ref, field="spec")
    per_dev = bool(spec.get("perDeviceNodeSelection"))
    sl = Slice(
        name=(obj.get("metadata") or {}).get("name") or "",
        driver=driver,
        pool=pool_name,
        generation=int(pool.get("generation") or 0),
        slice_count=int(pool.get("resourceSliceCount") or 1),
        node_name=spec.get("nodeName") or None,
        node_selector=spec.get("nodeSelector") or None,
        all_nodes=bool(spec.get("allNodes")),
        per_device_node_selection=per_dev,
        devices=[],
        obj=obj,
    )
    for cs in spec.get("sharedCounters") or []:
        sl.shared_counters[cs.get("name", "")] = _counters(
            cs.get("counters"), f"spec.sharedCounters[{cs.get('name')}]", ref
        )
    shared = shared if shared is not None else Descriptions()
    known_attrs, known_caps, by_id = shared.attributes, shared.capacities, shared.by_id
    for i, d in enumerate(spec.get("devices") or []):
        where = f"spec.devices[{i}]"
        attrs: dict[str, Any] = {}
        for k, raw in (d.get("attributes") or {}).items():
            qk = k if "/" in k else f"{driver}/{k}"
            hit = by_id.get(id(raw))
            if hit is not None and hit[0] is raw:
                attrs[qk] = hit[1]
                continue
            akey = (qk, repr(raw))
            v = known_attrs.get(akey, _UNKNOWN)
            if v is _UNKNOWN:
                v = _attr_value(raw, f"{where}.attributes[{k}]", ref)
                if isinstance(v, UnsupportedAttribute):
                    v.name = k  # one per device: not shared
                elif not isinstance(v, list):
                    known_attrs[akey] = v
            if not isinstance(v, (UnsupportedAttribute, list)):
                by_id[id(raw)] = (raw, v)
            attrs[qk] = v
        raw_caps = d.get("capacity") or {}
        hit = by_id.get(id(raw_caps))
        if hit is not None and hit[0] is raw_caps:
            caps = hit[1]
        else:
            ckey = repr(raw_caps)
            caps = known_caps.get(ckey)
            if caps is None:
                caps = {
                    k: Capacity(
                        _q((v or {}).get("value", 0), f"{where}.capacity[{k}].value", ref),
                        _policy(
                            (v or {}).get("requestPolicy"),
                            f"{where}.capacity[{k}].requestPolicy",
                            ref,
                        ),
                    )
                    for k, v in raw_caps.items()
                }
                known_caps[ckey] = caps
            if raw_caps:
                by_id[id(raw_caps)] = (raw_caps, caps)
        dev = Device(
            id=(driver, pool_name, d.get("name") or ""),
            slice_name=sl.name,
            attributes=attrs,
            capacity=caps,
            allow_multiple=bool(d.get("allowMultipleAllocations")),
            consumes_counters=tuple(
                (
                    c.get("counterSet", ""),
                    _counters(c.get("counters"), f"{where}.consumesCounters", ref),
                )
                for c in d.get("consumesCounters") or []
            ),
            taints=tuple(
                Taint(t.get("key", ""), t.get("value", "") or "", t.get("effect", ""))
                for t in d.get("taints") or []
            ),
            binding_conditions=tuple(d.get("bindingConditions") or ()),
            binding_failure_conditions=tuple(d.get("bindingFailureConditions") or ()),
            binds_to_node=bool(d.get("bindsToNode")),
            node_name=(d.get("nodeName") or None) if per_dev else sl.node_name,
            node_selector=(d.get("nodeSelector") or None) if per_dev else sl.node_selector,
            all_nodes=bool(d.get("allNodes")) if per_dev else sl.all_nodes,
            per_device_node_selection=per_dev,
        )
        sl.devices.append(dev)
    return sl


# ---------------------------------------------------------------------------------------------
# Node matching


@dataclass(frozen=True)
class Node:
    """A node as scheduling sees it: ``metadata.name`` and ``metadata.labels`` (what node
    selectors match, with ``metadata.name`` as the one field)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


def _req_matches(req: dict[str, Any], labels: Mapping[str, str], name: str, fields: bool) -> bool:
    key = req.get("key", "")
    op = req.get("operator", "")
    vals = req.get("values") or []
    have: str | None = (name if key == "metadata.name" else None) if fields else labels.get(key)
    if op == "In":
        return have is not None and have in vals
    if op == "NotIn":
        return have is None or have not in vals
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt"):
        try:
            h, v = int(have or ""), int(vals[0])
        except (ValueError, IndexError):
            return False
        return h > v if op == "Gt" else h < v
    return False


def node_selector_matches(sel: dict[str, Any] | None, node: Node) -> bool:
    """``v1.NodeSelector`` semantics: terms are ORed, requirements within a term ANDed."""
    if sel is None:
        return False
    for term in sel.get("nodeSelectorTerms") or []:
        exprs = term.get("matchExpressions") or []
        fields = term.get("matchFields") or []
        if not exprs and not fields:
            continue
        if all(_req_matches(r, node.labels, node.name, False) for r in exprs) and all(
            _req_matches(r, node.labels, node.name, True) for r in fields
        ):
            return True
    return False


def device_on_node(d: Device, node: Node) -> bool:
    """Whether ``d``'s node selection (its slice's, or its own with perDeviceNodeSelection)
    includes ``node`` (dra-spec.md 4.2)."""
    if d.node_name is not None:
        return d.node_name == node.name
    if d.all_nodes:
        return True
    if d.node_selector is not None:
        return node_selector_matches(d.node_selector, node)
    return False


# ---------------------------------------------------------------------------------------------
# Allocated state (schedulerapi.AllocatedState)


@dataclass
class AllocatedState:
    """What earlier allocations hold (dra-spec.md 2.4).

    ``dedicated``: devices allocated without a shareID; ``shared``: (device, shareID) pairs;
    ``aggregated``: per device, the sum of consumedCapacity of its shares (exact, base units:
    :data:`Exact`).
    Admin-access results are not recorded: they never block anyone. ``consumable_capacity``:
    the DRAConsumableCapacity gate; off, kube-scheduler counts every result as dedicated,
    shareID or not.
    """

    dedicated: set[DeviceID] = field(default_factory=set)
    shared: set[tuple[DeviceID, str]] = field(default_factory=set)
    aggregated: dict[DeviceID, dict[str, Exact]] = field(default_factory=dict)
    consumable_capacity: bool = True
    #: shareID -> how many recorded results carry it (any device): the allocator never draws
    #: one of these for a new result (:meth:`share_id_in_use`).
    share_ids: dict[str, int] = field(default_factory=dict)

    def share_id_in_use(self, share: str) -> bool:
        """Whether a recorded result (on any device, admin access included) holds ``share``."""
        return share in self.share_ids

    def add_result(self, result: Mapping[str, Any]) -> None:
        """Record one ``status.allocation.devices.results[]`` entry."""
        if isinstance(sid := result.get("shareID"), str) and sid:
            self.share_ids[sid] = self.share_ids.get(sid, 0) + 1
        if result.get("adminAccess"):
            return
        did = (result["driver"], result["pool"], result["device"])
        share = result.get("shareID") if self.consumable_capacity else None
        if share:
            self.shared.add((did, share))
            agg = self.aggregated.setdefault(did, {})
            for k, v in (result.get("consumedCapacity") or {}).items():
                agg[k] = exact(agg.get(k, 0) + _consumed(v))
        else:
            self.dedicated.add(did)

    def remove_result(self, result: Mapping[str, Any]) -> None:
        """Undo :meth:`add_result` (a claim was deallocated)."""
        if isinstance(sid := result.get("shareID"), str) and sid in self.share_ids:
            self.share_ids[sid] -= 1
            if not self.share_ids[sid]:
                del self.share_ids[sid]
        if result.get("adminAccess"):
            return
        did = (result["driver"], result["pool"], result["device"])
        share = result.get("shareID") if self.consumable_capacity else None
        if share:
            self.shared.discard((did, share))
            agg = self.aggregated.get(did, {})
            for k, v in (result.get("consumedCapacity") or {}).items():
                agg[k] = exact(agg.get(k, 0) - _consumed(v))
            if not any((d == did) for d, _ in self.shared):
                self.aggregated.pop(did, None)
        else:
            self.dedicated.discard(did)

    def add_claim(self, claim: Mapping[str, Any]) -> None:
        alloc = (claim.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or []:
            self.add_result(r)

    def is_allocated(self, did: DeviceID) -> bool:
        return did in self.dedicated or did in self.aggregated

    @classmethod
    def from_claims(
        cls, claims: Iterable[Mapping[str, Any]], consumable_capacity: bool = True
    ) -> AllocatedState:
        st = cls(consumable_capacity=consumable_capacity)
        for c in claims:
            st.add_claim(c)
        return st
