"""What a pool's devices hold: memory, cores and shared counters allocated against what each
device and counter set publishes (``resource.k8s.io/v1`` ResourceSlices; shared counters are
KEP-4815's). The one judgement ``tessera simulate``'s GPU table, ``explain``, ``lint`` and
``tessera monitor``'s allocation figures read; pure code, no I/O.

Units: memory in bytes, ``cores`` in percent of a GPU's SMs (0..100), both as exact
:class:`~fractions.Fraction`; counters in the units their slice publishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from tessera.allocator import AllocatedState, SliceIndex


@dataclass
class GPUUsage:
    """One device's allocation (:func:`gpu_usage`): memory in bytes, cores in percent of its SMs;
    ``*_capacity`` None when the device does not publish that capacity; ``shares``: the
    allocations with a shareID on it; ``dedicated``: allocated whole (no shareID)."""

    node: str
    device: str
    uuid: str | None
    model: str | None
    memory_allocated: Fraction
    memory_capacity: Fraction | None
    cores_allocated: Fraction
    cores_capacity: Fraction | None
    shares: int
    dedicated: bool
    driver: str = ""
    pool: str = ""
    #: The counter sets the device consumes (KEP-4815), one line each, e.g. ``memory slices of
    #: gpu-0: 3 of 8 used, compute slices 3 of 7`` (``tessera.inventory.mig.describe_counters``).
    counters: list[str] = field(default_factory=list)
    #: An unallocated profile placement of a dynamic-MIG GPU: a possible instance, not hardware.
    potential: bool = False


@dataclass
class CounterSetUsage:
    """One shared counter set of a pool (KEP-4815): what it publishes and what is left once the
    allocated devices that consume it are subtracted (``dra-spec.md`` 2.5: a shared device's
    counters are charged once), with the allocated devices that hold it."""

    driver: str
    pool: str
    name: str
    published: dict[str, Fraction]
    available: dict[str, Fraction]
    holders: list[str] = field(default_factory=list)

    def lines(
        self, needed: dict[str, Fraction] | None = None, *, all_counters: bool = False
    ) -> list[str]:
        """``describe_counters`` of this set (see there)."""
        from tessera.inventory.mig import describe_counters

        return describe_counters(
            self.name, self.published, self.available, needed, all_counters=all_counters
        )


def counter_usage(
    index: SliceIndex, state: AllocatedState
) -> dict[tuple[str, str, str], CounterSetUsage]:
    """``{(driver, pool, counter set): usage}`` for every counter set published in ``index``
    (the highest generation of each pool), against the allocations in ``state``. The one place
    ``simulate``, ``explain`` and ``lint`` read counter availability from."""
    newest: dict[tuple[str, str], int] = {}
    for sl in index.slices:
        key = (sl.driver, sl.pool)
        newest[key] = max(newest.get(key, sl.generation), sl.generation)
    out: dict[tuple[str, str, str], CounterSetUsage] = {}
    for sl in index.slices:
        if sl.generation != newest[(sl.driver, sl.pool)]:
            continue
        for cs, vals in sl.shared_counters.items():
            out[(sl.driver, sl.pool, cs)] = CounterSetUsage(
                sl.driver, sl.pool, cs, dict(vals), dict(vals)
            )
    for d in index.devices():
        if not d.consumes_counters or not state.is_allocated(d.id):
            continue
        for cs, vals in d.consumes_counters:
            u = out.get((d.driver, d.pool, cs))
            if u is None:
                continue
            for c, v in vals.items():
                if c in u.available:
                    u.available[c] -= v
            u.holders.append(d.name)
    return out


def gpu_usage(
    index: SliceIndex, state: AllocatedState, node_names: set[str] | frozenset[str] = frozenset()
) -> list[GPUUsage]:
    """Memory and cores allocated on every device of ``index`` against its capacity.

    A device allocated without a shareID (dedicated) counts its whole capacity; a shared one
    the sum of its shares' ``consumedCapacity`` (``AllocatedState.aggregated``). ``node``
    is the slice's ``nodeName``, else the pool name when it names one of ``node_names``.
    Used by ``tessera simulate``'s GPU table and by ``tessera monitor``'s allocation figures.
    """
    out: list[GPUUsage] = []
    share_count: dict[tuple[str, str, str], int] = {}
    for did, _ in state.shared:
        share_count[did] = share_count.get(did, 0) + 1
    usage = counter_usage(index, state)
    for d in index.devices():
        agg = state.aggregated.get(d.id, {})
        shares = share_count.get(d.id, 0)
        dedicated = d.id in state.dedicated
        mem = d.capacity.get("memory")
        cores = d.capacity.get("cores")
        out.append(
            GPUUsage(
                node=d.node_name or (d.pool if d.pool in node_names else ""),
                device=d.name,
                uuid=d.attributes.get(f"{d.driver}/uuid"),
                model=d.attributes.get(f"{d.driver}/productName"),
                memory_allocated=(
                    mem.value.value if dedicated and mem else Fraction(agg.get("memory", 0))
                ),
                memory_capacity=mem.value.value if mem else None,
                cores_allocated=(
                    cores.value.value if dedicated and cores else Fraction(agg.get("cores", 0))
                ),
                cores_capacity=cores.value.value if cores else None,
                shares=shares,
                dedicated=dedicated,
                driver=d.driver,
                pool=d.pool,
                counters=[
                    line
                    for cs, _ in d.consumes_counters
                    if (u := usage.get((d.driver, d.pool, cs))) is not None
                    for line in u.lines(all_counters=True)
                ],
                potential=f"{d.driver}/placementStart" in d.attributes
                and not state.is_allocated(d.id),
            )
        )
    return out
