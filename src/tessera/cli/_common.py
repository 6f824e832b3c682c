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


def examples_dir() -> Path:
    """The bundled examples shipped inside the package."""
    return Path(str(resources.files("tessera") / "examples"))


def cluster_inputs(f: F) -> F:
    """``--cluster FILE``, repeatable ``--node NAME=INVENTORY[:TOPOLOGY]`` and repeatable
    ``--class-map FROM=TO``."""
    f = click.option(
        "--class-map",
        "class_maps",
        multiple=True,
        metavar="FROM=TO",
        help="Run requests for DeviceClass FROM with class TO, e.g. the NVIDIA DRA driver's "
        "--class-map gpu.nvidia.com=gpu.tessera.dev (selectors' \"FROM\" domain becomes \"TO\"). Repeatable.",
    )(f)
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


def class_map(specs: tuple[str, ...]) -> dict[str, str]:
    """``--class-map FROM=TO`` options as a dict. Raises TesseraError for a malformed one."""
    out: dict[str, str] = {}
    for spec in specs:
        src, sep, dst = spec.partition("=")
        if not sep or not src.strip() or not dst.strip():
            raise TesseraError(f"--class-map {spec!r}: expected FROM=TO, e.g. gpu.nvidia.com=gpu.tessera.dev")
        out[src.strip()] = dst.strip()
    return out


def load_inputs(
    manifests: tuple[str, ...], cluster_file: str | None, node_specs: tuple[str, ...]
) -> tuple[Cluster, list[Manifest]]:
    """The nodes and manifests of a simulation, from simulate's arguments (shared with
    ``tessera explain``). With no arguments at all: the bundled default. Raises
    :class:`~tessera.api.errors.TesseraError` for bad input."""
    from tessera.sim.cluster import Cluster, SimNode, load_cluster

    if not manifests and not cluster_file and not node_specs:
        ex = examples_dir()
        cluster_file = str(ex / "cluster.yaml")
        manifests = (str(ex / "workloads"),)
    nodes: list[SimNode] = []
    if cluster_file:
        nodes.extend(load_cluster(cluster_file).nodes)
    for spec in node_specs:
        from tessera.inventory import build_resource_slices, load_inventory, load_topology

        name, sep, rest = spec.partition("=")
        if not sep or not name or not rest:
            raise TesseraError(f"--node {spec!r}: expected NAME=INVENTORY[:TOPOLOGY], e.g. gpu-1=nvidia-smi-q.xml")
        inv, _, topo = rest.partition(":")
        gpus = load_inventory(inv)
        topology = load_topology(topo) if topo else None
        if any(n.name == name for n in nodes):
            raise TesseraError(f"--node {spec!r}: node {name!r} is already defined (by --cluster or an earlier --node): use another name")
        nodes.append(SimNode(name, {"kubernetes.io/hostname": name}, build_resource_slices(name, gpus, topology), inv))
    loaded = list(expand_workloads(load_files(manifests)))
    if manifests and not loaded:
        raise TesseraError(f"no Kubernetes objects in {', '.join(manifests)}: pass YAML or JSON manifests (files or directories)")
    if not nodes and not any(m.kind == "ResourceSlice" for m in loaded):
        raise TesseraError("no nodes to schedule on: give --cluster FILE, --node NAME=INVENTORY, or ResourceSlices")
    slice_nodes = {
        (m.obj.get("spec") or {}).get("nodeName") for m in loaded if m.kind == "ResourceSlice"
    } - {None} - {n.name for n in nodes}
    for extra in sorted(str(x) for x in slice_nodes):
        nodes.append(SimNode(extra, {"kubernetes.io/hostname": extra}, [], "ResourceSlices"))
    return Cluster(nodes), loaded
