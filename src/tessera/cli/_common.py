"""What every ``tessera`` command shares: the one way a user error is reported, the bundled
examples, and the options and input loading of the commands that build a simulated cluster
(``simulate``, ``explain``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from tessera.api.errors import TesseraError
from tessera.api.limits import DEFAULT_LIMITS, Limits
from tessera.api.loader import expand_workloads, load_files

if TYPE_CHECKING:
    from tessera.api.loader import Manifest
    from tessera.sim.cluster import Cluster

F = TypeVar("F", bound=Callable[..., Any])

#: The root of every error Tessera reports to a user: the CLI prints it on one line and exits 2.
UserError = TesseraError


def fail(msg: str, code: int = 2) -> NoReturn:
    """Print ``tessera: error: MSG`` on stderr and exit with ``code`` (2: bad input)."""
    click.echo(f"tessera: error: {msg}", err=True)
    sys.exit(code)


def warn(msg: str) -> None:
    """Print ``tessera: warning: MSG`` on stderr (every output mode keeps stdout clean)."""
    click.echo(f"tessera: warning: {msg}", err=True)


def examples_dir() -> Path:
    """The bundled examples shipped inside the package."""
    return Path(str(resources.files("tessera") / "examples"))


def cluster_inputs(f: F) -> F:
    """``--cluster FILE`` and repeatable ``--node NAME=INVENTORY[:TOPOLOGY]``."""
    f = click.option(
        "--node",
        "node_specs",
        multiple=True,
        metavar="NAME=INVENTORY[:TOPOLOGY]",
        help="Add a node from an nvidia-smi inventory file (and optional `nvidia-smi topo -m` file). Repeatable.",
    )(f)
    f = click.option(
        "--cluster",
        "cluster_file",
        type=click.Path(),
        help="Cluster description (kind: Cluster) naming each node's GPU inventory.",
    )(f)
    return f


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    from tessera.api.quantity import Quantity, QuantityError

    try:
        q = Quantity.parse(value)
    except QuantityError as e:
        raise click.BadParameter(str(e)) from None
    if q.value <= 0 or not q.is_integer():
        raise click.BadParameter(f"{value!r}: give a whole number of bytes such as 1Gi")
    return int(q.value)


def input_limits(f: F) -> F:
    """``--max-input-size SIZE`` and ``--max-pods N``: the adjustable bounds of docs/limits.md."""
    f = click.option(
        "--max-pods",
        type=click.IntRange(min=1),
        default=None,
        help=f"Refuse more than N pods after expanding workloads [default: {DEFAULT_LIMITS.max_pods:,}].",
    )(f)
    f = click.option(
        "--max-input-size",
        callback=_size,
        default=None,
        metavar="SIZE",
        help="Refuse inputs larger than SIZE bytes in all (a quantity such as 2Gi) [default: 512Mi].",
    )(f)
    return f


def limits_from(max_input_size: int | None, max_pods: int | None) -> Limits:
    """The :class:`~tessera.api.limits.Limits` the options ask for."""
    return Limits(
        max_input_bytes=max_input_size or DEFAULT_LIMITS.max_input_bytes,
        max_pods=max_pods or DEFAULT_LIMITS.max_pods,
    )


def load_inputs(
    manifests: tuple[str, ...],
    cluster_file: str | None,
    node_specs: tuple[str, ...],
    limits: Limits = DEFAULT_LIMITS,
    warnings: list[str] | None = None,
) -> tuple[Cluster, list[Manifest]]:
    """The nodes and manifests of a simulation, from simulate's arguments (shared with
    ``tessera explain``). With no arguments at all: the bundled default.

    Every manifest is validated (:func:`tessera.api.validation.check_all`: apiVersion, schema,
    API rules) before anything reads it; Node objects become nodes (HAMi's register annotation
    their inventory); pods HAMi already bound keep their node; workloads are expanded, at most
    ``limits.max_pods`` pods. Warnings (skipped files, finished pods) are appended to
    ``warnings``. Raises :class:`~tessera.api.errors.TesseraError` for bad input.
    """
    from tessera.api.loader import ReadBudget
    from tessera.api.validation import check_all
    from tessera.sim.cluster import Cluster, SimNode, load_cluster
    from tessera.sim.inputs import node_from_object, unbind_hami_pods

    notes = warnings if warnings is not None else []
    if not manifests and not cluster_file and not node_specs:
        ex = examples_dir()
        cluster_file = str(ex / "cluster.yaml")
        manifests = (str(ex / "workloads"),)
    budget = ReadBudget.of(limits)
    nodes: list[SimNode] = []
    if cluster_file:
        described = load_cluster(cluster_file, budget=budget)
        nodes.extend(described.nodes)
        notes.extend(described.warnings)
    for spec in node_specs:
        from tessera.inventory import build_resource_slices, load_inventory, load_topology

        name, sep, rest = spec.partition("=")
        if not sep or not name or not rest:
            raise TesseraError(f"--node {spec!r}: expected NAME=INVENTORY[:TOPOLOGY], e.g. gpu-1=nvidia-smi-q.xml")
        inv, _, topo = rest.partition(":")
        gpus = load_inventory(inv, notes)
        topology = load_topology(topo) if topo else None
        if any(n.name == name for n in nodes):
            raise TesseraError(f"--node {spec!r}: node {name!r} is already defined (by --cluster or an earlier --node): use another name")
        try:
            slices = build_resource_slices(name, gpus, topology)
        except TesseraError as e:
            raise TesseraError(f"--node {spec}: {e}") from None
        nodes.append(SimNode(name, {"kubernetes.io/hostname": name}, slices, inv))
    loaded = load_files(manifests, limits=limits, warnings=notes, budget=budget)
    if manifests and not loaded:
        raise TesseraError(f"no Kubernetes objects in {', '.join(manifests)}: pass YAML or JSON manifests (files or directories)")
    check_all(loaded)
    for m in loaded:
        if m.kind == "Node":
            node = node_from_object(m)
            if any(n.name == node.name for n in nodes):
                raise TesseraError(f"{m.source}: {m.ref()}: node {node.name!r} is already defined (by --cluster, --node or an earlier Node)")
            nodes.append(node)
    loaded = unbind_hami_pods([m for m in loaded if m.kind != "Node"], nodes, notes)
    loaded = list(expand_workloads(loaded, max_pods=limits.max_pods))
    if not nodes and not any(m.kind == "ResourceSlice" for m in loaded):
        raise TesseraError("no nodes to schedule on: give --cluster FILE, --node NAME=INVENTORY, Node objects or ResourceSlices")
    slice_nodes = {
        (m.obj.get("spec") or {}).get("nodeName") for m in loaded if m.kind == "ResourceSlice"
    } - {None} - {n.name for n in nodes}
    for extra in sorted(str(x) for x in slice_nodes):
        nodes.append(SimNode(extra, {"kubernetes.io/hostname": extra}, [], "ResourceSlices"))
    return Cluster(nodes), loaded
