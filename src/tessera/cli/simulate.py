"""``tessera simulate``: where every GPU request lands, as kube-scheduler would place it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from tessera import DRIVER_NAME
from tessera.api.modes import MODE_LEGACY
from tessera.api.quantity import Quantity
from tessera.cli._common import (
    UserError,
    class_map,
    cluster_inputs,
    fail,
    input_limits,
    limits_from,
    live_outcome,
    load_inputs,
    to_yaml,
    warn,
    write_json_list,
)
from tessera.cli._tables import (
    SHARE_ID_MIN,
    UUID_MIN,
    FitTable,
    device_key,
    device_key_of,
    print_tables,
    unique_prefixes,
)
from tessera.enforcement.limits import DEFAULT_CONTEXT_OVERHEAD, allocatable

if TYPE_CHECKING:
    from tessera.api.loader import Manifest
    from tessera.sim.cluster import Cluster
    from tessera.sim.simulate import Placement, SimResult, Simulation


def _fmt_bytes(v: Fraction | None) -> str:
    if v is None:
        return "-"
    return Quantity(v, "BinarySI").canonical()


def _fmt_num(v: Fraction | None) -> str:
    if v is None:
        return "-"
    return Quantity(v).canonical()


@click.command()
@click.argument("manifests", nargs=-1, type=click.Path(readable=False))
@cluster_inputs
@click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "wide", "json", "yaml"]),
    default="table",
    show_default=True,
    help="table: kubectl-style columns, one line per row, free text cut to the terminal (UUIDs and shareIDs as "
    "unique prefixes); wide: every column, nothing cut.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed for shareIDs (upstream draws them at random).",
)
@click.option(
    "--policy",
    type=click.Choice(["first-fit", "binpack", "spread", "topology"]),
    default="first-fit",
    show_default=True,
    help="Placement policy. first-fit is what kube-scheduler does; the others are Tessera's planning policies.",
)
@click.option(
    "--compare",
    is_flag=True,
    help="Run the workload under every policy and as whole GPUs; print GPUs used and pods pending.",
)
@click.option(
    "-n",
    "--namespace",
    "namespaces",
    multiple=True,
    metavar="NAMESPACE",
    help="Report only pods (and claims, templates) of this namespace; all pods are still scheduled. Repeatable.",
)
@click.option(
    "--fail-on-pending",
    is_flag=True,
    help="Exit 1 when a pod (of --namespace, if given) stays pending; with --compare, under --policy.",
)
@click.option(
    "--progress/--no-progress",
    "progress",
    default=None,
    help="Progress on stderr while pods are scheduled (pods done, claims per second). Default: a bar when "
    "stderr is a terminal and there are 1,000 pods or more; --progress also prints a line every few "
    "seconds when it is not a terminal.",
)
@input_limits
def simulate(
    manifests: tuple[str, ...],
    cluster_file: str | None,
    node_specs: tuple[str, ...],
    kubeconfig: str | None,
    add_nodes: tuple[str, ...],
    class_maps: tuple[str, ...],
    output: str,
    seed: int,
    policy: str,
    compare: bool,
    namespaces: tuple[str, ...],
    fail_on_pending: bool,
    progress: bool | None,
    max_input_size: int | None,
    max_pods: int | None,
) -> None:
    """Schedule MANIFESTS (Pods, workloads, ResourceClaims, templates, DeviceClasses,
    ResourceSlices; HAMi-style pods too) onto simulated GPU nodes, as kube-scheduler would.

    With no arguments, runs the bundled default: a mixed cluster (8x H100, 8x V100S, 2x A5000,
    an A100 in MIG mode) built from real nvidia-smi inventories, with HAMi example pods and
    DRA-native claims. MANIFESTS are files, directories or `-` (standard input).

    With --kubeconfig, starts from a live cluster (read only): what is allocated there stays,
    its pending pods are scheduled first, then MANIFESTS. --add-node adds a hypothetical node
    last: would one more node of this kind let the pending pods in?

    Exit status: 0; 1 with --fail-on-pending when a pod stays pending; 2 on bad input.
    """
    try:
        notes: list[str] = []
        limits = limits_from(max_input_size, max_pods)
        cluster, loaded = load_inputs(
            manifests, cluster_file, node_specs, kubeconfig, add_nodes, limits, notes
        )
        cmap = class_map(class_maps)
        if compare:
            pending = _compare(cluster, loaded, output, seed, policy, namespaces, cmap)
            for w in notes:
                warn(w)
        else:
            pending = _simulate(
                cluster, loaded, output, seed, policy, namespaces, cmap, notes, progress
            )
    except UserError as e:
        fail(str(e))
    if fail_on_pending and pending:
        sys.exit(1)


def _warn_empty_namespaces(pod_refs: Sequence[str], namespaces: tuple[str, ...]) -> None:
    """Warn about each ``-n`` namespace no pod of the input is in (a typo would otherwise
    report nothing, and ``--fail-on-pending`` pass)."""
    have = sorted({ref.split("/", 1)[0] for ref in pod_refs})
    for ns in namespaces:
        if ns not in have:
            warn(
                f"-n {ns}: no pod of the input is in namespace {ns!r} "
                f"(namespaces with pods: {', '.join(have) if have else 'none'})"
            )


def _in_namespaces(ref: str, namespaces: tuple[str, ...]) -> bool:
    """``ref`` (``namespace/name``) is in one of ``namespaces``; everything is with none given."""
    return not namespaces or ref.split("/", 1)[0] in namespaces


def _compare(
    cluster: Cluster,
    loaded: list[Manifest],
    output: str,
    seed: int,
    policy: str,
    namespaces: tuple[str, ...],
    cmap: dict[str, str],
) -> int:
    """Print the comparison; return how many pods stay pending under ``policy``."""
    from tessera.sim.simulate import Simulation

    rows: list[dict[str, Any]] = []
    runs = [(p, p, False) for p in ("first-fit", "binpack", "spread", "topology")] + [
        ("whole GPUs", "first-fit", True)
    ]
    for label, pol, whole in runs:
        res = Simulation(
            cluster, loaded, seed=seed, policy=pol, whole_gpus=whole, class_map=cmap
        ).run()
        used = [u for u in res.gpus if u.shares or u.dedicated]
        mem_used = sum((u.memory_allocated for u in used), Fraction(0))
        mem_cap = sum((u.memory_capacity or Fraction(0) for u in used), Fraction(0))
        if not rows:
            _warn_empty_namespaces([*res.scheduled, *(p.pod for p in res.pending)], namespaces)
        pending = [p.pod for p in res.pending if _in_namespaces(p.pod, namespaces)]
        rows.append(
            {
                "allocation": label,
                "gpusUsed": len(used),
                "podsScheduled": len([p for p in res.scheduled if _in_namespaces(p, namespaces)]),
                "podsPending": len(pending),
                "pending": pending,
                "memoryBookedOnUsedGPUs": f"{float(100 * mem_used / mem_cap):.1f}%"
                if mem_cap
                else "-",
            }
        )
    if output == "json":
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
    elif output == "yaml":
        click.echo(to_yaml(rows))
    else:
        t = FitTable(
            "Policy comparison",
            [("allocation", False), ("GPUs used", False), ("scheduled", False), ("pending", False),
             ("memory booked", False), ("pending pods", True)],
        )  # fmt: skip
        for r in rows:
            t.add_row(
                str(r["allocation"]),
                str(r["gpusUsed"]),
                str(r["podsScheduled"]),
                str(r["podsPending"]),
                str(r["memoryBookedOnUsedGPUs"]),
                ", ".join(r["pending"]) or "-",
            )
        print_tables([t], wide=output == "wide")
    return next(int(r["podsPending"]) for r in rows if r["allocation"] == policy)


def _run_with_progress(sim: Simulation, progress: bool | None = None) -> SimResult:
    """Run ``sim`` with progress on stderr: pods done and claims per second (claims of the pods
    done, over the time since the run started). ``None`` (the default): a bar when stderr is a
    terminal and there are 1,000 pods or more. ``True``: the bar on a terminal, else one line
    every 5 seconds and one at the end. ``False``: nothing."""
    import time

    total = len(sim.pods)
    tty = sys.stderr.isatty()
    if progress is False or (progress is None and (total < 1000 or not tty)):
        return sim.run()
    start = time.monotonic()

    def rate() -> str:
        elapsed = time.monotonic() - start
        return f"{sim.claims_seen / elapsed:,.0f} claims/s" if elapsed > 0 else "- claims/s"

    if not tty:
        done = 0
        last = start

        def line(_ref: str) -> None:
            nonlocal done, last
            done += 1
            if done % 256 == 0 or done == total:
                now = time.monotonic()
                if now - last >= 5 or done == total:
                    last = now
                    print(
                        f"tessera simulate: {done:,}/{total:,} pods, {rate()}",
                        file=sys.stderr,
                        flush=True,
                    )

        return sim.run(on_pod=line)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("scheduling pods"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("pods", total=total, rate="")
        done = 0

        def tick(_ref: str) -> None:
            nonlocal done
            done += 1
            if done % 64 == 0 or done == total:
                bar.update(task, completed=done, rate=rate())

        return sim.run(on_pod=tick)


_CLUSTER_SCOPED = ("DeviceClass", "ResourceSlice")


def _object_in_namespaces(obj: dict[str, Any], namespaces: tuple[str, ...]) -> bool:
    if not namespaces or obj.get("kind") in _CLUSTER_SCOPED:
        return True
    return str((obj.get("metadata") or {}).get("namespace") or "default") in namespaces


def _simulate(
    cluster: Cluster,
    loaded: list[Manifest],
    output: str,
    seed: int,
    policy: str,
    namespaces: tuple[str, ...],
    cmap: dict[str, str],
    notes: Sequence[str] = (),
    progress: bool | None = None,
) -> int:
    """Run and print the simulation; return how many pods (of ``namespaces``) stay pending."""
    from tessera.sim.simulate import Simulation

    sim = Simulation(cluster, loaded, seed=seed, policy=policy, class_map=cmap)
    result = _run_with_progress(sim, progress)
    # On stderr in every output mode, so -o json|yaml stays clean; only once the run succeeded,
    # so that bad input prints its one error line and nothing else.
    for w in [*notes, *result.warnings]:
        warn(w)
    _warn_empty_namespaces([*result.scheduled, *(p.pod for p in result.pending)], namespaces)
    placements = [p for p in result.placements if _in_namespaces(p.pod, namespaces)]
    pending = [p for p in result.pending if _in_namespaces(p.pod, namespaces)]
    scheduled = [p for p in result.scheduled if _in_namespaces(p, namespaces)]
    if output in ("json", "yaml"):
        items = [o for o in result.objects if _object_in_namespaces(o, namespaces)]
        if output == "json":
            sys.stdout.flush()
            write_json_list(items, sys.stdout.buffer)
        else:
            click.echo(to_yaml({"apiVersion": "v1", "kind": "List", "items": items}))
        return len(pending)
    wide = output == "wide"
    tables = [_placement_table(result, placements, wide), _gpu_table(result, wide)]
    if pending:
        mixed = _mixed(result)
        pt = FitTable(
            "Unschedulable pods",
            [("pod", False), *([("mode", False)] if mixed else []), ("reason", True)],
            cut_caption="reasons cut to fit: -o wide or tessera explain POD",
        )
        for pend in pending:
            pt.add_row(pend.pod, *([pend.mode] if mixed else []), pend.reason)
        tables.append(pt)
    print_tables(
        tables, wide=wide, footer=f"{len(scheduled)} pod(s) scheduled, {len(pending)} pending."
    )
    for line in live_outcome(cluster, loaded, result.objects):
        click.echo(line)
    return len(pending)


def _uuid_names(result: SimResult, wide: bool) -> dict[str, str]:
    """How each GPU UUID is shown: whole with -o wide, else its shortest unique prefix."""
    uuids = {u.uuid for u in result.gpus if u.uuid} | {p.uuid for p in result.placements if p.uuid}
    return {u: u for u in uuids} if wide else unique_prefixes(uuids, UUID_MIN)


def _ours(device: str) -> bool:
    """``device`` (``driver/pool/device``) is one of Tessera's GPUs (the enforcement library's)."""
    return device.startswith(f"{DRIVER_NAME}/")


def _vendor_units(placements: Sequence[Placement]) -> str:
    """What another vendor's ``cores`` counts, for each such driver among ``placements`` (the
    vendor table's unit), or "" when every placement is on Tessera's GPUs."""
    from tessera.api.vendors import vendor_of_driver

    seen: dict[str, str] = {}
    for p in placements:
        driver = p.device.split("/", 1)[0]
        v = None if _ours(p.device) else vendor_of_driver(driver)
        c = v.capacity("cores") if v else None
        if v and c and driver not in seen:
            seen[driver] = f"{v.noun}s of {driver}: cores are {c.unit}"
    if not seen:
        return ""
    return "; ".join(seen.values()) + " (their own enforcement, not Tessera's)"


def _allocatable(memory: str | None, device: str) -> str:
    """What one process's allocations can take of a share's ``memory`` (a quantity): the share
    less one CUDA context (``context-overhead``, the driver's default), ``-`` without memory
    or on another vendor's device (no CUDA context there)."""
    if not memory or not _ours(device):
        return "-"
    return _fmt_bytes(
        Fraction(allocatable(Quantity.parse(memory).value_int(), DEFAULT_CONTEXT_OVERHEAD))
    )


def _mixed(result: SimResult) -> bool:
    """Some pod went to legacy mode's scheduler: the tables say per pod which mode took it."""
    return any(m == MODE_LEGACY for m in result.modes.values())


def _placement_table(result: SimResult, placements: list[Placement], wide: bool) -> FitTable:
    """The placements, one row per container and device (a ``mode`` column, ``dra`` or
    ``legacy``, when some pod went to legacy mode; a legacy row has no claim, request or
    shareID: ``-``)."""
    uuids = _uuid_names(result, wide)
    mixed = _mixed(result)
    caption = None
    if any(p.memory and _ours(p.device) for p in placements):
        caption = (
            "memory is a share's whole footprint on the GPU: each CUDA context takes "
            f"{_fmt_bytes(Fraction(DEFAULT_CONTEXT_OVERHEAD))} of it (the driver's context-overhead), "
            "so one process can allocate memory less that (-o wide: allocatable); a GPU publishes "
            "its memory less what the NVIDIA driver reserves"
        )
    others = _vendor_units(placements)
    if others:
        caption = f"{caption}. {others}" if caption else others
    share_ids = {p.share_id for p in result.placements if p.share_id}
    shares = {s: s for s in share_ids} if wide else unique_prefixes(share_ids, SHARE_ID_MIN)
    # kubectl's columns: identifiers whole, free text (the model) last; -o wide adds columns.
    mode_col = [("mode", False)] if mixed else []
    if wide:
        t = FitTable(
            "Placements",
            [("pod", False), ("container", False), *mode_col, ("claim", False), ("request", False),
             ("node", False), ("device", False), ("GPU", False), ("memory", False), ("cores", False),
             ("shareID", False), ("allocatable", False), ("model", True)],
            caption=caption,
        )  # fmt: skip
    else:
        t = FitTable(
            "Placements",
            [("pod", False), ("container", False), *mode_col, ("device", False), ("memory", False),
             ("cores", False), ("shareID", False)],
            caption=caption,
        )  # fmt: skip
    for p in placements:
        gpu = uuids.get(p.uuid, "-") if p.uuid else "-"
        legacy = p.mode == MODE_LEGACY
        share = shares[p.share_id] if p.share_id else "-" if legacy else "(dedicated)"
        key = device_key_of(p.device)
        mode = [p.mode] if mixed else []
        if wide:
            t.add_row(
                p.pod,
                p.container,
                *mode,
                p.claim or "-",
                p.request or "-",
                p.node,
                key,
                gpu,
                p.memory or "-",
                p.cores or "-",
                share,
                _allocatable(p.memory, p.device),
                p.model or "-",
            )
        else:
            t.add_row(p.pod, p.container, *mode, key, p.memory or "-", p.cores or "-", share)
    return t


def _gpu_table(result: SimResult, wide: bool) -> FitTable:
    uuids = _uuid_names(result, wide)
    # memory and cores: allocated/capacity; free text (model, counters) last.
    cols = [("device", False), ("GPU", False), ("memory", False), ("cores", False), ("shares", False),
            ("model", True)]  # fmt: skip
    # Unallocated profile placements of dynamic-MIG GPUs are possible instances, not hardware:
    # the GPU's own row (gpu-<i>) and its counters column say what is left of it.
    rows = [u for u in result.gpus if not u.potential]
    counters = any(u.counters for u in rows)
    if counters:
        cols.append(("shared counters", True))
    if wide:
        cols.insert(0, ("node", False))
    g = FitTable(
        "GPUs",
        cols,
        caption=None if wide else "UUIDs and shareIDs as unique prefixes; -o wide shows them whole",
    )
    for u in rows:
        row = [
            device_key(u.driver, u.pool, u.device),
            uuids.get(u.uuid, "-") if u.uuid else "-",
            _usage(u.memory_allocated, u.memory_capacity, _fmt_bytes),
            _usage(u.cores_allocated, u.cores_capacity, _fmt_num),
            "dedicated" if u.dedicated else str(u.shares),
            u.model or "-",
        ]
        if counters:
            row.append("; ".join(u.counters) or "-")
        g.add_row(*([u.node or "-"] if wide else []), *row)
    return g


def _usage(
    allocated: Fraction, capacity: Fraction | None, fmt: Callable[[Fraction | None], str]
) -> str:
    """``allocated/capacity`` (one word, as kubectl's ``READY 1/1``); ``-`` alone for a capacity
    the device does not publish."""
    if capacity is None:
        return "-"
    return f"{fmt(allocated)}/{fmt(capacity)}"
