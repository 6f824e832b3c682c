"""The allocator's record in words: one wording for ``tessera explain`` and simulate's pending reasons.

:mod:`tessera.allocator.record` holds what the allocator decided, device by device, as data (a
:class:`~tessera.allocator.record.Refusal` per refused device, with the numbers behind it); this
module says it. :func:`refusal_text` says a refusal with this device's numbers, :func:`refusal_key`
without the per-device values (devices with equal keys are grouped). ``explain``'s per-device
verdicts (:func:`tessera.explain.explain.verdict`) and the pending reasons
(:mod:`tessera.sim.reasons`) both call these, so a message is changed in one place and neither
reader decides anything on a message's text.

Amounts are exact ``Fraction`` s in base units (bytes for memory, percent of SMs for ``cores``),
written as canonical quantities in the capacity's own format (:func:`amount`). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from tessera.allocator.model import UnsupportedAttribute
from tessera.allocator.record import (
    BindingConditionsOff,
    CapacityMissing,
    CapacityShort,
    CapacityUnusable,
    CapacityUse,
    CelError,
    ConstraintFailed,
    CountersOff,
    CountersShort,
    InUse,
    NotOnNode,
    PolicyViolation,
    Refusal,
    SelectorFalse,
    Tainted,
)
from tessera.api.quantity import Format, Quantity
from tessera.cel import SemverValue
from tessera.inventory.mig import describe_counters


def amount(v: Fraction, fmt: Format) -> str:
    """An amount ``v`` (base units) in a capacity's own ``fmt`` (BinarySI for memory), canonical:
    ``amount(Fraction(30 * 2**30), "BinarySI") == "30Gi"``."""
    return Quantity(v, fmt).canonical()


def counter_amount(v: Fraction) -> str:
    """A shared counter's amount, canonical. Counters carry no format of their own
    (``ResourceSlice.spec.sharedCounters[].counters[].value`` is a bare quantity): binary
    suffixes read best for memory-like ones (4Gi), and leave plain counts as they are (1000, 3)."""
    return Quantity(v, "BinarySI").canonical()


def attribute_value(v: Any) -> str:
    """A device attribute's value as CEL would write it: ``"a100"``, ``true``,
    ``semver("1.2.3")``, ``quantity("80Gi")``, lists in brackets."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, SemverValue):
        return f'semver("{v.text}")'
    if isinstance(v, Quantity):
        return f'quantity("{v.canonical()}")'
    if isinstance(v, list):
        return "[" + ", ".join(attribute_value(x) for x in v) + "]"
    if isinstance(v, UnsupportedAttribute):
        return f"<unsupported: {v.why}>"
    return str(v)


def taint(r: Tainted) -> str:
    """``key=value:effect``, with ``(DeviceTaintRule NAME)`` for a rule's taint."""
    t = f"{r.key_}={r.value}:{r.effect}" if r.value else f"{r.key_}:{r.effect}"
    return f"{t} (DeviceTaintRule {r.rule})" if r.rule else t


def counter_set(r: CountersShort, *, needed: bool) -> list[str]:
    """The refusal's whole counter set in words (:func:`tessera.inventory.mig.describe_counters`:
    ``memory slices of gpu-0: 7 of 8 used (slice 3 needed, in use)``); with ``needed`` the
    counters this device cannot have are marked. [] when the set was not recorded, or when it is
    another driver's (its counters have no words of their own: :func:`refusal_text` says more)."""
    if not r.set_published:
        return []
    lines = describe_counters(
        r.counter_set,
        dict(r.set_published),
        dict(r.set_left),
        dict(r.set_needs) if needed else None,
    )
    return [] if all(line.startswith("counter ") for line in lines) else lines


def cel_error(r: CelError, at: str = "") -> str:
    """A selector that could not be evaluated on a device; ``at``: where in it, when known
    (`` in `expr` ``, as explain finds the failing conjunct)."""
    hint = " (guard the lookup with has(...))" if "no such key" in r.error else ""
    return (
        f"{r.owner} {r.name} selector #{r.index}: CEL {r.kind} error{at}: {r.error}{hint}; "
        "this aborts scheduling of the pod"
    )


def selector_false(r: SelectorFalse, part: str | None = None) -> str:
    """A false selector, quoting ``part`` (its false top-level conjunct, when explain found
    it) or the whole expression."""
    quoted = part if part is not None else " ".join(r.expression.split())
    return f"{r.owner} {r.name} selector #{r.index} is false: `{quoted}`"


def _in_use(r: InUse) -> str:
    if r.by == "allocated":
        return "in use: allocated whole (dedicated)"
    if r.by == "same-claim":
        return "in use: already picked for this claim"
    return "in use: already picked whole (dedicated) for this pod"


def _policy(r: PolicyViolation) -> str:
    pol = r.policy
    a = amount(r.amount, r.format)
    if pol.range_min is not None:
        if pol.range_max is not None and r.amount > pol.range_max.value:
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
    return f"{r.capacity}: {why}"


def _how(u: CapacityUse, inside: bool = False) -> str:
    """Why the request consumes ``u.needs``, when it is not the amount it names."""
    if u.requested is None:
        text = f"policy default: the request names no {u.name}"
    elif u.requested.value != u.needs:
        text = f"{u.requested.canonical()} rounded up by the request policy"
    else:
        return ""
    return f", {text}" if inside else f" ({text})"


def _capacity_short(r: CapacityShort) -> str:
    parts = []
    for u in r.short:
        f = u.format
        if u.never:
            parts.append(
                f"{u.name}: needs {amount(u.needs, f)}, more than the device has "
                f"({amount(u.total, f)})" + _how(u)
            )
            continue
        held = f"{amount(u.free, f)} free of {amount(u.total, f)}"
        if u.in_call:
            held += f", {amount(u.in_call, f)} of it picked by this pod's other requests"
        parts.append(
            f"{u.name} short by {amount(u.needs - u.free, f)} (needs "
            f"{amount(u.needs, f)}{_how(u, inside=True)}, {held})"
        )
    return "; ".join(parts)


def _capacity_short_key(r: CapacityShort) -> str:
    parts = []
    for u in r.short:
        if u.never:
            parts.append(f"{u.name}: needs more than the device has{_how(u)}")
        else:
            parts.append(
                f"{u.name} short (needs {amount(u.needs, u.format)}{_how(u, inside=True)})"
            )
    return "; ".join(parts)


def _counters_short(r: CountersShort) -> str:
    lines = counter_set(r, needed=True)
    if lines:
        return f"shared counters: {'; '.join(lines)}"
    free = max(r.available - r.in_call, Fraction(0))
    held = (
        [f"{counter_amount(r.published - r.available)} held by earlier allocations"]
        if r.published != r.available
        else []
    )
    if r.in_call:
        held.append(f"{counter_amount(r.in_call)} by this pod's other picks")
    return (
        f"shared counter {r.counter_set}/{r.counter} used up: the device needs "
        f"{counter_amount(r.needs)}, {counter_amount(free)} of {counter_amount(r.published)} left"
        + (f" ({', '.join(held)})" if held else "")
    )


def _counters_short_key(r: CountersShort) -> str:
    lines = counter_set(r, needed=False)
    if lines:
        return f"shared counters: {'; '.join(lines)}"
    return f"shared counter {r.counter_set}/{r.counter} used up"


def _constraint(r: ConstraintFailed) -> str:
    if r.value is None:
        return f"has no attribute {r.attribute}, which constraint #{r.index} ({r.kind}) needs"
    short = r.attribute.rpartition("/")[2]
    if not r.chosen:
        return (
            f"constraint #{r.index} {r.kind} {r.attribute} refused it ({short} = "
            f"{attribute_value(r.value)})"
        )
    others = ", ".join(f"{n}: {attribute_value(v)}" for n, v in r.chosen)
    how = "differs from" if r.kind == "matchAttribute" else "repeats a value of"
    return (
        f"constraint #{r.index} {r.kind} {r.attribute}: {short} = {attribute_value(r.value)} "
        f"{how} the devices picked before it ({others})"
    )


def _missing(r: CapacityMissing) -> str:
    published = ", ".join(r.published) or "none"
    return f"has no capacity {', '.join(r.missing)} (it publishes: {published})"


_TEXT: dict[type[Refusal], Callable[[Any], str]] = {
    InUse: _in_use,
    BindingConditionsOff: lambda r: (
        "has binding conditions, but the DRADeviceBindingConditions feature is off"
    ),
    SelectorFalse: selector_false,
    CelError: cel_error,
    CapacityUnusable: lambda r: f"{r.error}; this aborts scheduling of the pod",
    NotOnNode: lambda r: "not available on this node (perDeviceNodeSelection)",
    CapacityMissing: _missing,
    PolicyViolation: _policy,
    CapacityShort: _capacity_short,
    CountersOff: lambda r: (
        "consumes shared counters, but the DRAPartitionableDevices feature is off"
    ),
    CountersShort: _counters_short,
    Tainted: lambda r: f"taint {taint(r)} not tolerated: add a toleration to request {r.request}",
    ConstraintFailed: _constraint,
}

#: Refusals whose key (the grouping text) differs from their text: it leaves out the values
#: that differ from device to device.
_KEY: dict[type[Refusal], Callable[[Any], str]] = {
    CapacityShort: _capacity_short_key,
    CountersShort: _counters_short_key,
}


def refusal_text(r: Refusal) -> str:
    """The refusal in words, with this device's numbers (``memory short by 2Gi (needs 10Gi,
    8Gi free of 80Gi)``). Raises ``TypeError`` for a refusal kind this module has no words
    for (a new kind in the record must be given its words here)."""
    say = _TEXT.get(type(r))
    if say is None:
        raise TypeError(f"no words for refusal {type(r).__name__}")
    return say(r)


def refusal_key(r: Refusal) -> str:
    """The refusal in words without per-device values (``memory short (needs 10Gi)``):
    devices with equal keys are one group in explain and the pending reasons."""
    say = _KEY.get(type(r))
    return say(r) if say is not None else refusal_text(r)
