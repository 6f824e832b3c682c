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
**beside the other picks** of the attempt. Amounts are exact (``Fraction``, base units: bytes
for memory, percent of SMs for Tessera's ``cores``). The record is data: its words, one wording
for every reader, are :mod:`tessera.scheduler.words`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar

from tessera.allocator.model import Device, DeviceID, RequestPolicy
from tessera.api.quantity import Format, Quantity


@dataclass(frozen=True, slots=True)
class CapacityUse:
    """What one request would consume of one capacity of one device, and what is free.

    ``requested``: the request's own amount, or None when it names no such capacity (then
    ``needs`` is the request policy's ``default``, or the whole ``total`` without a policy:
    dra-spec.md 2.2). ``needs`` is after the policy's rounding. Amounts in base units (bytes
    for memory, percent of SMs for ``cores``), ``format`` the capacity's quantity format.
    ``allocated``: held by earlier allocations (shares of other claims); ``in_call``: held by
    devices picked earlier in the same attempt (this pod's other requests or claims).
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


class Refusal:
    """The check that refused one device for one request. ``check`` names it (stable, for
    JSON and grouping); :func:`tessera.scheduler.words.refusal_text` says it with this device's
    numbers, :func:`~tessera.scheduler.words.refusal_key` without per-device values (devices
    with equal keys are grouped)."""

    check: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class InUse(Refusal):
    """A dedicated device already held: ``by`` is ``allocated`` (an earlier allocation),
    ``allocating`` (picked earlier in this attempt) or ``same-claim`` (an admin request may
    not take a device its own claim already picked)."""

    check: ClassVar[str] = "in-use"
    by: str


@dataclass(frozen=True, slots=True)
class BindingConditionsOff(Refusal):
    """The device has ``bindingConditions`` (KEP-5007) and the DRADeviceBindingConditions
    feature is off."""

    check: ClassVar[str] = "binding-conditions"


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


@dataclass(frozen=True, slots=True)
class CapacityUnusable(Refusal):
    """What the request would consume of a capacity of this device cannot be used: a negative
    amount, or a request past what the validRange step arithmetic represents (int64 units;
    Kubernetes v1.37, kubernetes PR #140442). Upstream aborts the whole pod's scheduling
    attempt; only the on-its-own pass records it per device, the search raises it."""

    check: ClassVar[str] = "capacity-error"
    error: str  # upstream's text: 'capacity "name": ...'


@dataclass(frozen=True, slots=True)
class NotOnNode(Refusal):
    """A ``perDeviceNodeSelection`` device whose own node selection excludes this node."""

    check: ClassVar[str] = "node"


@dataclass(frozen=True, slots=True)
class CapacityMissing(Refusal):
    """The request names capacities (``missing``) the device does not publish (``published``:
    the ones it does)."""

    check: ClassVar[str] = "capacity"
    missing: tuple[str, ...]
    published: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PolicyViolation(Refusal):
    """The amount the request names of ``capacity`` (``amount``, base units: bytes for memory,
    percent of SMs for ``cores``; ``format`` its quantity format) is not one the device's
    ``requestPolicy`` allows (``validValues``, or ``validRange`` min/max/step; KEP-5075)."""

    check: ClassVar[str] = "policy"
    capacity: str
    amount: Fraction
    format: Format
    policy: RequestPolicy


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


@dataclass(frozen=True, slots=True)
class CountersOff(Refusal):
    """The device consumes shared counters (KEP-4815) and the DRAPartitionableDevices feature
    is off."""

    check: ClassVar[str] = "counters"


@dataclass(frozen=True, slots=True)
class CountersShort(Refusal):
    """A shared counter of the pool would go over: ``available`` = published minus what earlier
    allocations of the pool consume; ``in_call`` = consumed by this attempt's other picks;
    ``needs`` = this device's own consumption of that counter (0 when another device's
    consumption already exhausts it); amounts in the counter's own units
    (``ResourceSlice.spec.sharedCounters[].counters[].value``, KEP-4815). The whole set, when
    recorded, is what :func:`tessera.scheduler.words.counter_set` words (``memory slices of
    gpu-0: 7 of 8 used (slice 3 needed, in use)``): ``set_published`` every counter of the set,
    ``set_left`` what is left of each for this device (earlier allocations and this attempt's
    other picks taken off), ``set_needs`` the device's consumption of the set."""

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


@dataclass(frozen=True, slots=True)
class Tainted(Refusal):
    """A device taint (KEP-5055; the slice's own or a DeviceTaintRule's) that request
    ``request`` does not tolerate."""

    check: ClassVar[str] = "taint"
    key_: str
    value: str
    effect: str
    request: str
    rule: str = ""  # the DeviceTaintRule that added the taint ("" for the slice's own)


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
