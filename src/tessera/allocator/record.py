"""Why the allocator refused devices: the record :meth:`Allocator.diagnose` produces.

Upstream's allocator logs (at verbosity 7) each time it passes over a candidate device: "Device
in use", "Device not selectable", "Device capacity not enough", "Insufficient counters", a taint,
a constraint. Tessera's allocator calls a recorder at exactly those points, with the numbers
behind the decision, but only when one is installed (:meth:`Allocator.diagnose`); the
scheduling path (:meth:`Allocator.allocate`) records nothing and pays one ``is None`` test per
refusal. ``tessera explain``, ``tessera simulate``'s pending reasons and the HAMi-terms lines
all read this record; none of them re-implements a check.

Shapes: a :class:`NodeRecord` per (node, claims) call holds the outcome and, per request or
``firstAvailable`` subrequest, one :class:`DeviceRecord` per candidate device in search order:
the first check that refused the device **on its own** (nothing else of the pod picked yet;
``None`` = it fits on its own) and the first refusal the search met when it tried the device
**beside the other picks** of the attempt. Amounts are exact (``Fraction``, base units).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar

from tessera.allocator.model import Device, DeviceID, RequestPolicy
from tessera.api.quantity import Format, Quantity


def fmt_amount(v: Fraction, fmt: Format) -> str:
    """An amount in a capacity's own format (BinarySI for memory), canonical."""
    return Quantity(v, fmt).canonical()


@dataclass(frozen=True, slots=True)
class CapacityUse:
    """What one request would consume of one capacity of one device, and what is free.

    ``requested``: the request's own amount, or None when it names no such capacity (then
    ``needs`` is the request policy's ``default``, or the whole ``total`` without a policy:
    dra-spec.md 2.2). ``needs`` is after the policy's rounding. ``allocated``: held by earlier
    allocations (shares of other claims); ``in_call``: held by devices picked earlier in the
    same attempt (this pod's other requests or claims).
    """

    name: str
    requested: Quantity | None
    needs: Fraction
    total: Fraction
    allocated: Fraction
    in_call: Fraction
    format: Format
    free: Fraction = field(init=False)  # total - allocated - in_call
    short: bool = field(init=False)  # needs more than is free
    never: bool = field(init=False)  # needs more than the device has even when nothing else uses it

    def __post_init__(self) -> None:
        free = (
            self.total - self.allocated - self.in_call
            if (self.allocated or self.in_call)
            else self.total
        )
        object.__setattr__(self, "free", free)
        object.__setattr__(self, "short", self.needs > free)
        object.__setattr__(self, "never", self.needs > self.total)

    def amount(self, v: Fraction) -> str:
        return fmt_amount(v, self.format)

    def need_text(self) -> str:
        """``memory 30Gi`` / ``memory 80Gi (the request names no memory: the request policy's default)``."""
        how = ""
        if self.requested is None:
            how = f" (the request names no {self.name}: the request policy's default)"
        elif self.requested.value != self.needs:
            how = f" ({self.requested.canonical()} rounded up by the request policy)"
        return f"{self.name} {self.amount(self.needs)}{how}"


class Refusal:
    """The check that refused one device for one request. ``check`` names it (stable, for
    JSON and grouping); :meth:`text` says it with this device's numbers; :meth:`key` says it
    without per-device values (devices with equal keys are grouped)."""

    check: ClassVar[str] = ""

    def text(self) -> str:
        raise NotImplementedError

    def key(self) -> str:
        return self.text()


@dataclass(frozen=True, slots=True)
class InUse(Refusal):
    """A dedicated device already held: ``by`` is ``allocated`` (an earlier allocation),
    ``allocating`` (picked earlier in this attempt) or ``same-claim`` (an admin request may
    not take a device its own claim already picked)."""

    check: ClassVar[str] = "in-use"
    by: str

    def text(self) -> str:
        if self.by == "allocated":
            return "in use: allocated whole (dedicated)"
        if self.by == "same-claim":
            return "in use: already picked for this claim"
        return "in use: already picked whole (dedicated) for this pod"


@dataclass(frozen=True, slots=True)
class BindingConditionsOff(Refusal):
    check: ClassVar[str] = "binding-conditions"

    def text(self) -> str:
        return "has binding conditions, but the DRADeviceBindingConditions feature is off"


@dataclass(frozen=True, slots=True)
class SelectorFalse(Refusal):
    """Selector #``index`` of the class (``owner == "class"``) or of the request is false."""

    owner: str  # "class" or "request"
    name: str  # class name or request name
    index: int
    expression: str

    @property
    def check(self) -> str:  # type: ignore[override]
        return "class-selector" if self.owner == "class" else "selector"

    def text(self) -> str:
        return f"{self.owner} {self.name} selector #{self.index} is false: `{' '.join(self.expression.split())}`"


@dataclass(frozen=True, slots=True)
class CelError(Refusal):
    """Selector #``index`` of the class or request could not be evaluated on this device (a
    CEL runtime error): upstream aborts the whole pod's scheduling attempt (dra-spec.md 3.2).
    Only the on-its-own pass records it per device; the search raises it."""

    check: ClassVar[str] = "cel-error"
    owner: str  # "class" or "request"
    name: str
    index: int
    expression: str
    error: str
    kind: str = "runtime"  # or "compile"

    def text(self) -> str:
        hint = " (guard the lookup with has(...))" if "no such key" in self.error else ""
        return (
            f"{self.owner} {self.name} selector #{self.index}: CEL {self.kind} error: {self.error}{hint}; "
            "this aborts scheduling of the pod"
        )


@dataclass(frozen=True, slots=True)
class CapacityUnusable(Refusal):
    """What the request would consume of a capacity of this device cannot be used: a negative
    amount, or a request past what the validRange step arithmetic represents (int64 units;
    Kubernetes v1.37, kubernetes PR #140442). Upstream aborts the whole pod's scheduling
    attempt; only the on-its-own pass records it per device, the search raises it."""

    check: ClassVar[str] = "capacity-error"
    error: str  # upstream's text: 'capacity "name": ...'

    def text(self) -> str:
        return f"{self.error}; this aborts scheduling of the pod"


@dataclass(frozen=True, slots=True)
class NotOnNode(Refusal):
    check: ClassVar[str] = "node"

    def text(self) -> str:
        return "not available on this node (perDeviceNodeSelection)"


@dataclass(frozen=True, slots=True)
class CapacityMissing(Refusal):
    check: ClassVar[str] = "capacity"
    missing: tuple[str, ...]
    published: tuple[str, ...]

    def text(self) -> str:
        return f"has no capacity {', '.join(self.missing)} (it publishes: {', '.join(self.published) or 'none'})"


@dataclass(frozen=True, slots=True)
class PolicyViolation(Refusal):
    check: ClassVar[str] = "policy"
    capacity: str
    amount: Fraction
    format: Format
    policy: RequestPolicy

    def text(self) -> str:
        pol = self.policy
        a = fmt_amount(self.amount, self.format)
        if pol.range_min is not None:
            if pol.range_max is not None and self.amount > pol.range_max.value:
                why = f"{a} is over the request policy's maximum {pol.range_max.canonical()}"
            else:
                step = pol.range_step.canonical() if pol.range_step is not None else "?"
                why = f"{a} is not {pol.range_min.canonical()} plus a multiple of step {step}"
        elif pol.valid_values:
            why = (
                f"{a} is not one of the request policy's validValues "
                f"({', '.join(v.canonical() for v in pol.valid_values)})"
            )
        else:
            why = f"{a} violates the request policy"
        return f"{self.capacity}: {why}"


@dataclass(frozen=True, slots=True)
class CapacityShort(Refusal):
    """Not enough of one or more capacities. ``uses``: every capacity the request would
    consume on this device, short or not (defaults included)."""

    check: ClassVar[str] = "capacity"
    uses: tuple[CapacityUse, ...]

    @property
    def short(self) -> tuple[CapacityUse, ...]:
        return tuple(u for u in self.uses if u.short)

    @property
    def never(self) -> bool:
        """The device is too small for the request even when nothing else uses it."""
        return any(u.never for u in self.uses)

    def text(self) -> str:
        parts = []
        for u in self.short:
            if u.never:
                parts.append(
                    f"{u.name}: needs {u.amount(u.needs)}, more than the device has ({u.amount(u.total)})"
                    + _how(u)
                )
                continue
            held = f"{u.amount(u.free)} free of {u.amount(u.total)}"
            if u.in_call:
                held += f", {u.amount(u.in_call)} of it picked by this pod's other requests"
            parts.append(
                f"{u.name} short by {u.amount(u.needs - u.free)} (needs "
                f"{u.amount(u.needs)}{_how(u, inside=True)}, {held})"
            )
        return "; ".join(parts)

    def key(self) -> str:
        parts = []
        for u in self.short:
            if u.never:
                parts.append(f"{u.name}: needs more than the device has{_how(u)}")
            else:
                parts.append(f"{u.name} short (needs {u.amount(u.needs)}{_how(u, inside=True)})")
        return "; ".join(parts)


def _how(u: CapacityUse, inside: bool = False) -> str:
    if u.requested is None:
        text = f"policy default: the request names no {u.name}"
    elif u.requested.value != u.needs:
        text = f"{u.requested.canonical()} rounded up by the request policy"
    else:
        return ""
    return f", {text}" if inside else f" ({text})"


@dataclass(frozen=True, slots=True)
class CountersOff(Refusal):
    check: ClassVar[str] = "counters"

    def text(self) -> str:
        return "consumes shared counters, but the DRAPartitionableDevices feature is off"


@dataclass(frozen=True, slots=True)
class CountersShort(Refusal):
    """A shared counter of the pool would go over: ``available`` = published minus what earlier
    allocations of the pool consume; ``in_call`` = consumed by this attempt's other picks;
    ``needs`` = this device's own consumption of that counter (0 when another device's
    consumption already exhausts it). The whole set, when given, words it as
    :func:`tessera.inventory.mig.describe_counters` does (``memory slices of gpu-0: 7 of 8 used
    (slice 3 needed, in use)``): ``set_published`` every counter of the set, ``set_left`` what
    is left of each for this device (earlier allocations and this attempt's other picks taken
    off), ``set_needs`` the device's consumption of the set."""

    check: ClassVar[str] = "counters"
    counter_set: str
    counter: str
    needs: Fraction
    available: Fraction
    in_call: Fraction
    published: Fraction
    set_published: tuple[tuple[str, Fraction], ...] = ()
    set_left: tuple[tuple[str, Fraction], ...] = ()
    set_needs: tuple[tuple[str, Fraction], ...] = ()

    def set_lines(self, *, needed: bool) -> list[str]:
        """The set in words (:func:`~tessera.inventory.mig.describe_counters`): with ``needed``
        only the counters this device cannot have; [] when the set was not recorded."""
        if not self.set_published:
            return []
        from tessera.inventory.mig import describe_counters

        lines = describe_counters(
            self.counter_set,
            dict(self.set_published),
            dict(self.set_left),
            dict(self.set_needs) if needed else None,
        )
        # Another driver's counters have no words of their own: the one-counter text says more.
        return [] if all(line.startswith("counter ") for line in lines) else lines

    def text(self) -> str:
        lines = self.set_lines(needed=True)
        if lines:
            return f"shared counters: {'; '.join(lines)}"
        free = max(self.available - self.in_call, Fraction(0))
        held = (
            [f"{fmt_counter(self.published - self.available)} held by earlier allocations"]
            if self.published != self.available
            else []
        )
        if self.in_call:
            held.append(f"{fmt_counter(self.in_call)} by this pod's other picks")
        return (
            f"shared counter {self.counter_set}/{self.counter} used up: the device needs {fmt_counter(self.needs)}, "
            f"{fmt_counter(free)} of {fmt_counter(self.published)} left"
            + (f" ({', '.join(held)})" if held else "")
        )

    def key(self) -> str:
        lines = self.set_lines(needed=False)
        if lines:
            return f"shared counters: {'; '.join(lines)}"
        return f"shared counter {self.counter_set}/{self.counter} used up"


def fmt_counter(v: Fraction) -> str:
    """A counter amount, canonical. Counters carry no format of their own: binary suffixes read
    best for memory-like ones (4Gi), and leave plain counts as they are (1000, 3)."""
    return Quantity(v, "BinarySI").canonical()


@dataclass(frozen=True, slots=True)
class Tainted(Refusal):
    check: ClassVar[str] = "taint"
    key_: str
    value: str
    effect: str
    request: str
    rule: str = ""  # the DeviceTaintRule that added the taint ("" for the slice's own)

    def taint(self) -> str:
        """``key=value:effect``, with ``(DeviceTaintRule NAME)`` for a rule's taint."""
        t = (
            f"{self.key_}={self.value}:{self.effect}"
            if self.value
            else f"{self.key_}:{self.effect}"
        )
        return f"{t} (DeviceTaintRule {self.rule})" if self.rule else t

    def text(self) -> str:
        return f"taint {self.taint()} not tolerated: add a toleration to request {self.request}"


@dataclass(frozen=True, slots=True)
class ConstraintFailed(Refusal):
    """Constraint #``index`` of the claim refused the device: it lacks the attribute
    (``value is None``), or its value conflicts with the devices already picked in scope
    (``chosen``: their names and values)."""

    check: ClassVar[str] = "constraint"
    index: int
    kind: str  # matchAttribute | distinctAttribute
    attribute: str
    value: Any
    chosen: tuple[tuple[str, Any], ...] = ()

    def text(self) -> str:
        if self.value is None:
            return f"has no attribute {self.attribute}, which constraint #{self.index} ({self.kind}) needs"
        short = self.attribute.rpartition("/")[2]
        if not self.chosen:
            return (
                f"constraint #{self.index} {self.kind} {self.attribute} refused it ({short} = "
                f"{fmt_value(self.value)})"
            )
        others = ", ".join(f"{n}: {fmt_value(v)}" for n, v in self.chosen)
        how = "differs from" if self.kind == "matchAttribute" else "repeats a value of"
        return (
            f"constraint #{self.index} {self.kind} {self.attribute}: {short} = {fmt_value(self.value)} "
            f"{how} the devices picked before it ({others})"
        )


def fmt_value(v: Any) -> str:
    """An attribute value as CEL would write it."""
    from tessera.allocator.model import UnsupportedAttribute
    from tessera.cel import SemverValue

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, SemverValue):
        return f'semver("{v.text}")'
    if isinstance(v, Quantity):
        return f'quantity("{v.canonical()}")'
    if isinstance(v, list):
        return "[" + ", ".join(fmt_value(x) for x in v) + "]"
    if isinstance(v, UnsupportedAttribute):
        return f"<unsupported: {v.why}>"
    return str(v)


@dataclass
class DeviceRecord:
    """One candidate device for one request: ``alone`` is the first check that refused it on
    its own (None: it fits on its own); ``in_search`` the first refusal the search met when it
    tried the device beside other picks (None: never refused there, or never tried); ``uses``
    what the request would consume of each of its capacities."""

    device: Device
    alone: Refusal | None
    in_search: Refusal | None = None
    # Every capacity the request would consume of the device, with what is free now (for
    # devices the request's selectors accept and whose capacities can serve it), else None.
    uses: tuple[CapacityUse, ...] | None = None

    @property
    def id(self) -> DeviceID:
        return self.device.id

    @property
    def matches(self) -> bool:
        """The request's class and request selectors (and the node) accept the device."""
        return self.alone is None or self.alone.check not in SELECTION_CHECKS


@dataclass
class RequestRecord:
    """One request (``req``) or ``firstAvailable`` subrequest (``req/sub``) of one claim on one
    node. ``capacity``: the amounts the request names; ``devices`` in search order (pool, slice,
    device) over the complete and valid pools visible from the node."""

    claim_index: int
    claim: str  # namespace/name (or name)
    name: str
    parent: str
    class_name: str
    count: int  # devices wanted; for allocationMode All: the devices in its precomputed set
    all_mode: bool
    admin: bool
    capacity: dict[str, Quantity]
    devices: list[DeviceRecord] = field(default_factory=list)

    @property
    def fitting(self) -> list[DeviceRecord]:
        return [d for d in self.devices if d.alone is None]

    @property
    def matching(self) -> list[DeviceRecord]:
        """Devices its class and request selectors (and node) accept."""
        return [d for d in self.devices if d.matches]


# Checks that decide whether a device is one the request may use at all (isSelectable).
SELECTION_CHECKS = frozenset(
    {"class-selector", "selector", "node", "binding-conditions", "cel-error"}
)


@dataclass
class NodeRecord:
    """The allocator's account of one ``allocate(node, claims)`` call.

    ``results``: what ``allocate`` returned (None: cannot allocate here); ``error``: the
    allocator error, if any; ``node_only``: the error concerns this node only (upstream's
    ``ErrFailedAllocationOnNode``: invalid pools), else it aborts the pod's scheduling attempt
    on every node. ``requests``: per claim, per request (or subrequest), in spec order; empty
    when the claims could not even be prepared (unknown class, compile error, ...).
    ``invalid_pools`` / ``incomplete_pools``: ``driver/pool`` names skipped on this node.
    """

    node: str
    results: list[dict[str, Any]] | None = None
    error: str | None = None
    node_only: bool = False
    requests: list[RequestRecord] = field(default_factory=list)
    incomplete_pools: list[str] = field(default_factory=list)
    invalid_pools: list[tuple[str, str]] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.results is not None

    def for_claim(self, index: int) -> list[RequestRecord]:
        return [r for r in self.requests if r.claim_index == index]


def alternatives(requests: Sequence[RequestRecord]) -> dict[tuple[int, str], list[RequestRecord]]:
    """Group request records by (claim index, parent request): one entry per request, holding
    its subrequests in ``firstAvailable`` order (or the request itself)."""
    out: dict[tuple[int, str], list[RequestRecord]] = {}
    for r in requests:
        out.setdefault((r.claim_index, r.parent), []).append(r)
    return out
