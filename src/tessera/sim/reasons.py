"""Pending reasons: the allocator's record of every node a pod could use, summed up per request.

``tessera simulate`` appends one clause per request (per ``firstAvailable`` subrequest; those
refused alike share one: :func:`join_clauses`) to the scheduler's ``0/N nodes are available:
...`` message of a pod whose claims fit nowhere. Each clause is read from
:class:`tessera.allocator.NodeRecord` (what the allocator decided, device
by device, with the numbers) and:

* names every capacity the request consumes, the ones it does not name included (the request
  policy's default, e.g. all of a GPU's memory);
* separates devices that can never hold the request (too small, a capacity they lack, an amount
  their request policy forbids) from devices that are full now, and says "no GPU in the cluster
  is that large" when every matching device is too small;
* for devices that are full now, names only the capacities that are short, and for each the
  most free amount among the devices where it is short (so it never contradicts itself);
* says when devices fit one by one but not together (count, constraints, competition).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from tessera import DRIVER_NAME
from tessera.allocator import (
    CapacityShort,
    CapacityUse,
    NodeRecord,
    Refusal,
    RequestRecord,
)
from tessera.allocator.record import (
    CapacityMissing,
    ConstraintFailed,
    CountersOff,
    CountersShort,
    DeviceRecord,
    InUse,
    PolicyViolation,
    Tainted,
)
from tessera.api.quantity import Format
from tessera.api.vendors import capacity_unit, vendor_of_driver
from tessera.scheduler.words import (
    amount,
    counter_amount,
    counter_set,
    refusal_key,
    refusal_text,
    taint,
)


@dataclass
class _Seen:
    node: str
    dr: DeviceRecord


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {many or word + 's'}"


def _noun(devs: Sequence[_Seen]) -> str:
    """``GPU``, ``NPU``, ``DCU``: the vendor table's noun when every device is of one driver
    with a row (:mod:`tessera.api.vendors`), else ``device``."""
    drivers = {s.dr.device.driver for s in devs}
    v = vendor_of_driver(next(iter(drivers))) if len(drivers) == 1 else None
    return v.noun if v else "device"


def _unit(driver: str, name: str) -> str:
    """`` (<unit>)`` after another vendor's capacity ``name`` whose value is a plain number
    (``cores``: percent of the NPU's AICores, or the DCU's compute units; ``slices``), from
    the vendor table; "" for Tessera's own and for byte quantities."""
    if driver == DRIVER_NAME:
        return ""
    unit = capacity_unit(driver, name)
    return f" ({unit})" if unit and unit != "bytes" else ""


def needs_text(rr: RequestRecord, devs: Sequence[DeviceRecord]) -> str:
    """Every capacity the request consumes per device: ``9 devices with memory 8Gi and cores
    50``; a capacity it does not name is consumed at the request policy's default (all of it
    without one, dra-spec.md 2.2), said once over ``devs`` (the request's device records, from
    every node the statement is about). A default of zero consumes nothing and is left out.
    One text for ``simulate``'s pending reasons and ``explain``'s "wants" lines."""
    drivers = {dr.device.driver for dr in devs}
    driver = next(iter(drivers)) if len(drivers) == 1 else DRIVER_NAME
    named = [f"{k} {v.canonical()}{_unit(driver, k)}" for k, v in rr.capacity.items()]
    defaults: dict[str, dict[tuple[bool, int, int], tuple[Fraction, Format]]] = {}
    having: dict[str, int] = {}
    zero: dict[str, int] = {}  # devices whose default for it is 0 (they consume none)
    counted = 0
    for dr in devs:
        if dr.uses is None:
            continue
        counted += 1
        for u in dr.uses:
            if u.requested is None and u.needs:
                key = (u.needs == u.total, u.needs.numerator, u.needs.denominator)  # ints hash fast
                defaults.setdefault(u.name, {})[key] = (u.needs, u.format)
                having[u.name] = having.get(u.name, 0) + 1
            elif u.requested is None:
                zero[u.name] = zero.get(u.name, 0) + 1
    for k, vals in defaults.items():
        if zero.get(k):
            some = f" on {having[k]} of the {having[k] + zero[k]} devices that have it, 0 on the others"
        elif having[k] < counted:
            some = " on the devices that have it"
        else:
            some = ""
        why = f"the request names no {k}, so the request policy's default applies"
        if len(vals) == 1:
            (whole, _, _), (needs, fmt) = next(iter(vals.items()))
            text = amount(needs, fmt)
            named.append(
                f"{k} {text}{_unit(driver, k)} ({'all of it' + some + ': ' if whole else ''}{why})"
            )
        elif all(whole for whole, _, _ in vals):
            named.append(f"all of the device's {k}{some} ({why})")
        else:
            named.append(
                f"{k} at each device's request policy default{some} (the request names no {k})"
            )
    count = "all matching devices" if rr.all_mode else _plural(rr.count, "device")
    if not named:
        return count
    return f"{count} with {_join(named)}"


def _join(parts: Sequence[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _never(r: Refusal | None) -> bool:
    return isinstance(r, (CapacityMissing, PolicyViolation)) or (
        isinstance(r, CapacityShort) and r.never
    )


def request_clause(
    rr: RequestRecord, seen: Sequence[_Seen], per_node_fit: Mapping[str, int], scope: str
) -> str:
    """One request's clause over the nodes in ``seen`` (its devices, node by node)."""
    matching = [s for s in seen if s.dr.matches]
    noun = _noun(matching or seen)
    head = f"needs {needs_text(rr, [s.dr for s in matching or seen])}"
    if not matching:
        return f"{head}; none of the {_plural(len(seen), noun)} {scope} matches its selectors"
    fitting = [s for s in matching if s.dr.alone is None]
    never = [s for s in matching if _never(s.dr.alone)]
    now = [s for s in matching if s.dr.alone is not None and not _never(s.dr.alone)]
    parts: list[str] = []
    if never:
        if len(never) == len(matching):
            parts.append(f"no {noun} {scope} is that large{_largest(never, True)}")
        else:
            parts.append(f"{_plural(len(never), noun)} can never hold it{_largest(never, False)}")
    if now:
        parts.append(_now(now, noun))
    if fitting:
        most = max(per_node_fit.values(), default=0)
        want = rr.count
        fit = f"{_plural(len(fitting), noun)} {'fits on its own' if len(fitting) == 1 else 'fit on their own'}"
        if rr.all_mode:
            parts.append(f"{fit}, but allocationMode All needs every matching one")
        elif most < want:
            if len(per_node_fit) > 1:
                parts.append(f"{fit}, at most {most} on one node, {want} needed on one node")
            else:
                parts.append(f"{fit}, {want} needed")
        else:
            together = next((s.dr.in_search for s in fitting if s.dr.in_search is not None), None)
            why = (
                f": {refusal_text(together)}"
                if together is not None
                else " (no combination of them fits)"
            )
            parts.append(f"{fit}, but not together with the rest of the pod{why}")
    matches = f"{_plural(len(matching), noun)} {scope} {'matches' if len(matching) == 1 else 'match'} its selectors"
    if not fitting and not never:
        return f"{head}; {matches}, none has room now: {'; '.join(parts)}"
    return f"{head}; {matches}: {'; '.join(parts)}"


def _largest(never: Sequence[_Seen], every: bool) -> str:
    """For devices too small: the capacity that is too small and the largest amount of it among
    them (``every``: they are all the matching devices there are)."""
    by_cap: dict[str, tuple[CapacityUse, _Seen]] = {}
    other = 0
    for s in never:
        r = s.dr.alone
        if isinstance(r, CapacityShort):
            for u in r.uses:
                if u.never and (u.name not in by_cap or u.total > by_cap[u.name][0].total):
                    by_cap[u.name] = (u, s)
        else:
            other += 1
    parts = [
        f"{u.name} {amount(u.needs, u.format)} is more than any "
        f"{'has' if every else 'of them has'}: the largest has "
        f"{amount(u.total, u.format)}, {s.node}/{s.dr.device.name}"
        for u, s in by_cap.values()
    ]
    kinds = {
        refusal_text(s.dr.alone)
        for s in never
        if not isinstance(s.dr.alone, CapacityShort) and s.dr.alone is not None
    }
    if other:
        parts.append("; ".join(sorted(kinds)[:2]))
    return f" ({'; '.join(parts)})" if parts else ""


def _now(now: Sequence[_Seen], noun: str) -> str:
    """Devices that could hold the request but are taken now: what is short where."""
    short: dict[str, list[tuple[CapacityUse, _Seen]]] = {}
    others: dict[str, int] = {}
    sets: dict[
        str, dict[str, CountersShort]
    ] = {}  # counter set (pool/name) -> counter -> a refusal
    for s in now:
        r = s.dr.alone
        if isinstance(r, CapacityShort):
            for u in r.short:
                short.setdefault(u.name, []).append((u, s))
        elif isinstance(r, InUse):
            others["in use (allocated whole to another claim)"] = (
                others.get("in use (allocated whole to another claim)", 0) + 1
            )
        elif isinstance(r, (CountersShort, CountersOff)):
            others[_COUNTERS] = others.get(_COUNTERS, 0) + 1
            if isinstance(r, CountersShort):
                sets.setdefault(f"{s.dr.device.pool}/{r.counter_set}", {})[r.counter] = r
        elif isinstance(r, Tainted):
            key = f"tainted {taint(r)} (not tolerated)"
            others[key] = others.get(key, 0) + 1
        elif isinstance(r, ConstraintFailed):
            key = f"without attribute {r.attribute} (constraint #{r.index})"
            others[key] = others.get(key, 0) + 1
        elif r is not None:
            key = refusal_key(r)
            others[key] = others.get(key, 0) + 1
    parts = []
    for name, items in short.items():
        u, s = max(items, key=lambda it: it[0].free)
        where = f"{s.node}/{s.dr.device.name}"
        free, total, needs = (amount(v, u.format) for v in (u.free, u.total, u.needs))
        name = f"{name}{_unit(s.dr.device.driver, name)}"
        if len(items) == 1:
            parts.append(f"{name} short on {where}: {free} free of {total}, needs {needs}")
        else:
            parts.append(
                f"{name} short on {_plural(len(items), noun)} (most free: {free} of {total}, "
                f"on {where}; needs {needs})"
            )
    for text, n in others.items():
        if text == _COUNTERS and sets:
            named = [f"{cs}: {_counters_text(found)}" for cs, found in sorted(sets.items())]
            more = f"; and {len(named) - 2} more counter sets" if len(named) > 2 else ""
            text += f" ({'; '.join(named[:2])}{more})"
        parts.append(f"{_plural(n, noun)} {text}")
    return "; ".join(parts)


_COUNTERS = "with shared counters used up"


def _counters_text(found: Mapping[str, CountersShort]) -> str:
    """The used-up counters of one set: the set in words as the allocator recorded it
    (``memory slices of gpu-0: 7 of 8 used; compute slices of gpu-0: 7 of 7 used``), or, for
    another driver's counters, each one with what is left of what the set publishes."""
    for r in found.values():
        lines = counter_set(r, needed=False)
        if lines:
            return "; ".join(lines)
    return ", ".join(
        f"{c} {counter_amount(max(r.available - r.in_call, Fraction(0)))} of "
        f"{counter_amount(r.published)} left"
        for c, r in sorted(found.items())
    )


def request_clauses(records: Sequence[NodeRecord], n_nodes: int) -> list[tuple[int, str, str]]:
    """(claim index, request name, clause) for each request of the claims whose ``records``
    are given: one record per node the pod may use. ``n_nodes``: nodes in the cluster (to say
    "in the cluster" or "on the N nodes it may use")."""
    scope = (
        "in the cluster"
        if len(records) == n_nodes
        else f"on the {_plural(len(records), 'node')} it may use"
    )
    keys: list[tuple[int, str]] = []
    seen: dict[tuple[int, str], list[_Seen]] = {}
    per_node: dict[tuple[int, str], dict[str, int]] = {}
    first: dict[tuple[int, str], RequestRecord] = {}
    for rec in records:
        for rr in rec.requests:
            k = (rr.claim_index, rr.name)
            if k not in first:
                first[k] = rr
                keys.append(k)
            seen.setdefault(k, []).extend(_Seen(rec.node, dr) for dr in rr.devices)
            per_node.setdefault(k, {})[rec.node] = len(rr.fitting)
    return [(k[0], k[1], request_clause(first[k], seen[k], per_node[k], scope)) for k in keys]


def join_clauses(clauses: Sequence[tuple[int, str, str]], claim_name: Sequence[str]) -> str:
    """The clauses of :func:`request_clauses` as one text: ``claim NS/NAME, request REQ: WHY``
    joined by ``; ``. Consecutive ``firstAvailable`` alternatives of one request (``gpu/nvlink``,
    ``gpu/numa``, ``gpu/any``) refused for the same reason are said once: ``claim NS/NAME,
    request gpu (every firstAvailable alternative: nvlink, numa, any): WHY``, or ``(alternatives
    nvlink, numa)`` when others differ. ``claim_name[i]``: the namespaced name of claim ``i``."""
    groups: list[tuple[int, str, list[str], str]] = []  # claim, parent request, subrequests, why
    for ci, req, why in clauses:
        parent, _, sub = req.partition("/")
        last = groups[-1] if groups else None
        if sub and last and last[:2] == (ci, parent) and last[2] and last[3] == why:
            last[2].append(sub)
        else:
            groups.append((ci, parent if sub else req, [sub] if sub else [], why))
    alternatives = {
        (ci, req): sum(1 for c, r, _ in clauses if c == ci and r.startswith(req + "/"))
        for ci, req, subs, _ in groups
        if subs
    }
    out = []
    for ci, req, subs, why in groups:
        if len(subs) > 1:
            every = len(subs) == alternatives[(ci, req)]
            label = "every firstAvailable alternative: " if every else "alternatives "
            name = f"{req} ({label}{', '.join(subs)})"
        else:
            name = f"{req}/{subs[0]}" if subs else req
        out.append(f"claim {claim_name[ci]}, request {name}: {why}")
    return "; ".join(out)
