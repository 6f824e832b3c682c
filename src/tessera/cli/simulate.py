"""``tessera simulate``: where every GPU request lands, as kube-scheduler would place it."""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from tessera.api.quantity import Quantity
from tessera.cli._common import UserError, class_map, cluster_inputs, fail, load_inputs

if TYPE_CHECKING:
    from tessera.api.loader import Manifest
    from tessera.sim.cluster import Cluster
    from tessera.sim.simulate import SimResult, Simulation

class _NoAliasDumper(yaml.SafeDumper):
    """Plain YAML without anchors: claims share their template's spec object in memory."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _fmt_bytes(v: Fraction | None) -> str:
    if v is None:
        return "-"
    return Quantity(v, "BinarySI").canonical()


def _fmt_num(v: Fraction | None) -> str:
    if v is None:
        return "-"
    return Quantity(v).canonical()


@click.command()
@click.argument("manifests", nargs=-1, type=click.Path())
@cluster_inputs
@click.option("-o", "--output", type=click.Choice(["table", "json", "yaml"]), default="table", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for shareIDs (upstream draws them at random).")
@click.option(
    "--policy",
    type=click.Choice(["first-fit", "binpack", "spread", "topology"]),
    default="first-fit",
    show_default=True,
    help="Placement policy. first-fit is what kube-scheduler does; the others are Tessera's planning policies.",
)
@click.option("--compare", is_flag=True, help="Run the workload under every policy and as whole GPUs; print GPUs used and pods pending.")
def simulate(
    manifests: tuple[str, ...],
    cluster_file: str | None,
    node_specs: tuple[str, ...],
    class_maps: tuple[str, ...],
    output: str,
    seed: int,
    policy: str,
    compare: bool,
) -> None:
    """Schedule MANIFESTS (Pods, workloads, ResourceClaims, templates, DeviceClasses,
    ResourceSlices; HAMi-style pods too) onto simulated GPU nodes, as kube-scheduler would.

    With no arguments, runs the bundled default: a mixed cluster (8x H100, 8x V100S, 2x A5000,
    an A100 in MIG mode) built from real nvidia-smi inventories, with HAMi example pods and
    DRA-native claims.
    """
    try:
        cluster, loaded = load_inputs(manifests, cluster_file, node_specs)
        cmap = class_map(class_maps)
        if compare:
            _compare(cluster, loaded, output, seed, cmap)
        else:
            _simulate(cluster, loaded, output, seed, policy, cmap)
    except UserError as e:
        fail(str(e))


def _compare(cluster: Cluster, loaded: list[Manifest], output: str, seed: int, cmap: dict[str, str]) -> None:
    from tessera.sim.simulate import Simulation

    rows = []
    runs = [(p, p, False) for p in ("first-fit", "binpack", "spread", "topology")] + [("whole GPUs", "first-fit", True)]
    for label, pol, whole in runs:
        res = Simulation(cluster, loaded, seed=seed, policy=pol, whole_gpus=whole, class_map=cmap).run()
        used = [u for u in res.gpus if u.shares or u.dedicated]
        mem_used = sum((u.memory_allocated for u in used), Fraction(0))
        mem_cap = sum((u.memory_capacity or Fraction(0) for u in used), Fraction(0))
        rows.append(
            {
                "allocation": label,
                "gpusUsed": len(used),
                "podsScheduled": len(res.scheduled),
                "podsPending": len(res.pending),
                "pending": [p.pod for p in res.pending],
                "memoryBookedOnUsedGPUs": f"{float(100 * mem_used / mem_cap):.1f}%" if mem_cap else "-",
            }
        )
    if output == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    if output == "yaml":
        click.echo(yaml.safe_dump(rows, sort_keys=False))
        return
    t = Table(title="Policy comparison", title_justify="left")
    for col in ("allocation", "GPUs used", "pods scheduled", "pending", "memory booked on used GPUs", "pending pods"):
        t.add_column(col)
    for r in rows:
        t.add_row(
            str(r["allocation"]),
            str(r["gpusUsed"]),
            str(r["podsScheduled"]),
            str(r["podsPending"]),
            str(r["memoryBookedOnUsedGPUs"]),
            ", ".join(r["pending"]) or "-",  # type: ignore[arg-type]
        )
    Console(width=max(Console().width, 160)).print(t)


def _run_with_progress(sim: Simulation) -> SimResult:
    """Run ``sim``; with 1,000 pods or more and a terminal on stderr, show a progress bar there."""
    total = len(sim.pods)
    if total < 1000 or not sys.stderr.isatty():
        return sim.run()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("scheduling pods"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("pods", total=total)
        return sim.run(on_pod=lambda _ref: bar.advance(task))


def _simulate(cluster: Cluster, loaded: list[Manifest], output: str, seed: int, policy: str, cmap: dict[str, str]) -> None:
    from tessera.sim.simulate import Simulation

    sim = Simulation(cluster, loaded, seed=seed, policy=policy, class_map=cmap)
    result = _run_with_progress(sim)
    for w in result.warnings:  # on stderr in every output mode, so -o json|yaml stays clean
        click.echo(f"tessera: warning: {w}", err=True)
    if output in ("json", "yaml"):
        lst = {"apiVersion": "v1", "kind": "List", "items": result.objects}
        if output == "json":
            click.echo(json.dumps(lst, indent=2, sort_keys=False))
        else:
            click.echo(yaml.dump(lst, Dumper=_NoAliasDumper, sort_keys=False, width=120))
        return
    console = Console(width=max(Console().width, 160))
    t = Table(title="Placements", title_justify="left")
    for col in ("pod", "container", "node", "GPU", "model", "memory", "cores", "shareID"):
        t.add_column(col)
    for p in result.placements:
        t.add_row(p.pod, p.container, p.node, p.uuid or p.device, p.model or "-", p.memory or "-", p.cores or "-", p.share_id or "(dedicated)")
    console.print(t)
    g = Table(title="GPUs", title_justify="left")
    for col in ("node", "device", "model", "memory allocated / capacity", "cores allocated / capacity", "shares"):
        g.add_column(col)
    for u in result.gpus:
        g.add_row(
            u.node,
            u.device,
            u.model or "-",
            f"{_fmt_bytes(u.memory_allocated)} / {_fmt_bytes(u.memory_capacity)}",
            f"{_fmt_num(u.cores_allocated)} / {_fmt_num(u.cores_capacity)}",
            "dedicated" if u.dedicated else str(u.shares),
        )
    console.print(g)
    if result.pending:
        pt = Table(title="Unschedulable pods", title_justify="left")
        pt.add_column("pod")
        pt.add_column("reason")
        for pend in result.pending:
            pt.add_row(pend.pod, pend.reason)
        console.print(pt)
    console.print(f"{len(result.scheduled)} pod(s) scheduled, {len(result.pending)} pending.")
