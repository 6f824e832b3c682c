"""What every ``tessera`` command shares: the one way a user error is reported, the bundled
examples, and the options and input loading of the commands that build a simulated cluster
(``simulate``, ``explain``)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn, TypeVar

import click
import orjson
import yaml

from tessera.api.errors import TesseraError
from tessera.api.limits import DEFAULT_LIMITS, Limits
from tessera.api.loader import expand_workloads, load_files

if TYPE_CHECKING:
    from tessera.api.loader import Manifest, ReadBudget
    from tessera.sim.cluster import Cluster, SimNode

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


#: ``SimNode.source`` prefix of the nodes ``--add-node`` adds.
ADDED_NODE = "--add-node"


def node_inputs(f: F) -> F:
    """``--cluster FILE`` and repeatable ``--node NAME=INVENTORY[:TOPOLOGY]`` (the nodes of
    :func:`load_nodes`)."""
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
        type=click.Path(readable=False),
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


def cluster_inputs(f: F) -> F:
    """:func:`node_inputs`, plus ``--kubeconfig FILE`` (start from a live cluster),
    repeatable ``--add-node NAME=INVENTORY[:TOPOLOGY]`` (the inputs of :func:`load_inputs`) and
    repeatable ``--class-map FROM=TO`` (see :func:`class_map`)."""
    f = click.option(
        "--class-map",
        "class_maps",
        multiple=True,
        metavar="FROM=TO",
        help="Run requests for DeviceClass FROM with class TO, e.g. the NVIDIA DRA driver's "
        "--class-map gpu.nvidia.com=gpu.tessera.dev --class-map mig.nvidia.com=gpu.tessera.dev "
        "(FROM's selectors are kept; attributes in selectors and constraints are mapped to TO's driver, "
        "those without an equivalent get a warning). Repeatable.",
    )(f)
    f = click.option(
        "--add-node",
        "add_nodes",
        multiple=True,
        metavar="NAME=INVENTORY[:TOPOLOGY]",
        help="Add a hypothetical node after all others (e.g. to a --kubeconfig cluster): would it let the "
        "pending pods in? Repeatable.",
    )(f)
    f = click.option(
        "--kubeconfig",
        type=click.Path(dir_okay=False),
        default=None,
        help="Start from this live cluster (read only): its nodes, DeviceClasses, ResourceSlices, allocated "
        "ResourceClaims and pods.",
    )(f)
    return node_inputs(f)


def class_map(specs: tuple[str, ...]) -> dict[str, str]:
    """``--class-map FROM=TO`` options as a dict. Raises TesseraError for a malformed one."""
    out: dict[str, str] = {}
    for spec in specs:
        src, sep, dst = spec.partition("=")
        if not sep or not src.strip() or not dst.strip():
            raise TesseraError(
                f"--class-map {spec!r}: expected FROM=TO, e.g. gpu.nvidia.com=gpu.tessera.dev"
            )
        out[src.strip()] = dst.strip()
    return out


class _NoAliasDumper(yaml.CSafeDumper):
    """Plain YAML without anchors: objects may share sub-objects in memory (a claim and its
    template's spec), which must print as copies. libyaml's emitter (PyYAML's C binding)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(obj: Any) -> str:
    """``obj`` as block YAML, keys in their order, no anchors, text other than ASCII written as
    itself (``café``, not ``caf\\xE9``, as kubectl writes it): what ``-o yaml`` prints."""
    return yaml.dump(obj, Dumper=_NoAliasDumper, sort_keys=False, width=120, allow_unicode=True)


_JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS


def _json_bytes(obj: Any) -> bytes:
    """``obj`` as JSON indented by 2 (the layout of ``json.dumps(obj, indent=2)``, UTF-8 not
    escaped), encoded by orjson; the standard library's encoder for what orjson refuses (an
    integer beyond 64 bits)."""
    try:
        return orjson.dumps(obj, option=_JSON_OPTIONS)
    except TypeError:
        return json.dumps(obj, indent=2, ensure_ascii=False).encode()


def write_json_list(items: Iterable[Any], out: BinaryIO) -> None:
    """Write ``{"apiVersion": "v1", "kind": "List", "items": [...]}`` (what ``-o json`` prints),
    indented by 2, item by item: the output is never held whole in memory. Byte for byte what
    ``json.dumps(..., indent=2, ensure_ascii=False)`` gives, 10-20x faster (issue 16)."""
    first = True
    for item in items:
        out.write(
            b'{\n  "apiVersion": "v1",\n  "kind": "List",\n  "items": [\n' if first else b",\n"
        )
        first = False
        out.write(b"    " + _json_bytes(item).replace(b"\n", b"\n    "))
    out.write(
        _json_bytes({"apiVersion": "v1", "kind": "List", "items": []}) if first else b"\n  ]\n}"
    )
    out.write(b"\n")


def timestamp(now: float | None = None) -> str:
    """``now`` (``time.time()`` seconds; default: now) as RFC 3339 UTC with milliseconds, e.g.
    ``2026-12-02T01:23:45.678Z``: what every log line of the long-running commands starts with."""
    import datetime as dt
    import time

    t = dt.datetime.fromtimestamp(time.time() if now is None else now, dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def log_line(component: str, msg: str, now: float | None = None) -> str:
    """One log line of a long-running command: ``<RFC 3339 UTC> tessera <component>: <msg>``
    (no newline). The one format of ``tessera driver``, ``monitor`` and ``webhook``."""
    return f"{timestamp(now)} tessera {component}: {msg}"


def logger(component: str) -> Callable[[str], None]:
    """A function that writes ``msg`` as a :func:`log_line` of ``component`` on stderr and
    flushes it (a container runtime keeps each line as it comes)."""

    def log(msg: str) -> None:
        sys.stderr.write(log_line(component, msg) + "\n")
        sys.stderr.flush()

    return log


class LogFormatter(logging.Formatter):
    """:func:`log_line` for :mod:`logging` records (the webhook's and uvicorn's): the record's
    time, ``tessera <component>:``, then ``warning:``/``error:`` when the level is that high,
    the logger's name and the message (with a traceback, if any)."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        text = f"{level}{record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return log_line(self.component, text, record.created)


def configure_logging(component: str, level: int = logging.WARNING) -> None:
    """Send every :mod:`logging` record at ``level`` or above to stderr in the :func:`log_line`
    format (replacing handlers set before)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogFormatter(component))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def warn(msg: str) -> None:
    """Print ``tessera: warning: MSG`` on stderr (stdout stays clean for -o json|yaml)."""
    click.echo(f"tessera: warning: {msg}", err=True)


def _inventory_node(spec: str, option: str, cluster: Cluster) -> SimNode:
    """The node of one ``--node``/``--add-node NAME=INVENTORY[:TOPOLOGY]``; the inventory's
    publication warnings are added to ``cluster.warnings``."""
    from tessera.inventory import (
        build_resource_slices,
        load_inventory,
        load_topology,
        publication_warnings,
    )
    from tessera.sim.cluster import SimNode

    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise TesseraError(
            f"{option} {spec!r}: expected NAME=INVENTORY[:TOPOLOGY], e.g. gpu-1=nvidia-smi-q.xml"
        )
    inv, _, topo = rest.partition(":")
    gpus = load_inventory(inv, cluster.warnings)
    topology = load_topology(topo) if topo else None
    if any(n.name == name for n in cluster.nodes):
        raise TesseraError(
            f"{option} {spec!r}: node {name!r} is already defined (by --cluster, --kubeconfig, a Node object or "
            "an earlier "
            "--node/--add-node): use another name"
        )
    cluster.warnings.extend(publication_warnings(gpus, f"{option} {name}: {inv}"))
    source = f"{ADDED_NODE} {inv}" if option == ADDED_NODE else inv
    try:
        slices = build_resource_slices(name, gpus, topology)
    except TesseraError as e:  # a topology of another node: name the files
        raise TesseraError(f"{option} {spec}: {e}") from None
    return SimNode(name, {"kubernetes.io/hostname": name}, slices, source)


def load_nodes(
    cluster_file: str | None, node_specs: tuple[str, ...], budget: ReadBudget | None = None
) -> Cluster:
    """The nodes of ``--cluster FILE`` then of each ``--node NAME=INVENTORY[:TOPOLOGY]``, with
    every inventory's publication warnings in ``Cluster.warnings``. Raises
    :class:`~tessera.api.errors.TesseraError` for bad input."""
    from tessera.sim.cluster import Cluster, load_cluster

    cluster = load_cluster(cluster_file, budget=budget) if cluster_file else Cluster([])
    for spec in node_specs:
        cluster.nodes.append(_inventory_node(spec, "--node", cluster))
    return cluster


def load_inputs(
    manifests: tuple[str, ...],
    cluster_file: str | None,
    node_specs: tuple[str, ...],
    kubeconfig: str | None = None,
    add_nodes: tuple[str, ...] = (),
    limits: Limits = DEFAULT_LIMITS,
    warnings: list[str] | None = None,
) -> tuple[Cluster, list[Manifest]]:
    """The nodes and manifests of a simulation, from simulate's arguments (shared with
    ``tessera explain``). With no arguments at all: the bundled default.

    Node order (the order nodes are tried): ``--cluster``, ``--node``, Node objects (from
    ``--kubeconfig`` or the files; their labels count), nodes only named by ResourceSlices,
    then ``--add-node``. A live cluster's objects come before the files' (the new workloads
    are scheduled on top of what is already there).

    Every manifest is validated (:func:`tessera.api.validation.check_all`: apiVersion, schema,
    API rules) before anything reads it; Node objects become nodes (labels, taints, and HAMi's
    register annotation as their inventory); pods HAMi already bound keep their node; workloads
    are expanded (a DaemonSet into one pod per eligible node, once every node is known), at
    most ``limits.max_pods`` pods; all inputs together are read up to
    ``limits.max_input_bytes``. Warnings (inventories, skipped files, finished pods) are
    appended to ``warnings`` for the caller to print once the command succeeded (printed here
    when it is None). Raises :class:`~tessera.api.errors.TesseraError` for bad input.
    """
    from tessera.api.loader import ReadBudget
    from tessera.api.validation import check_all
    from tessera.sim.cluster import SimNode
    from tessera.sim.inputs import node_from_object, unbind_hami_pods

    if not manifests and not cluster_file and not node_specs and not kubeconfig and not add_nodes:
        ex = examples_dir()
        cluster_file = str(ex / "cluster.yaml")
        manifests = (str(ex / "workloads"),)
    notes: list[str] = []
    budget = ReadBudget.of(limits)
    cluster = load_nodes(cluster_file, node_specs, budget)
    nodes = cluster.nodes
    live: list[Manifest] = []
    if kubeconfig:
        from tessera.kube.live import read_cluster

        live = read_cluster(kubeconfig, progress=True)
    loaded = load_files(manifests, limits=limits, warnings=notes, budget=budget)
    if manifests and not loaded:
        raise TesseraError(
            f"no Kubernetes objects in {', '.join(manifests)}: pass YAML or JSON manifests (files or directories)"
        )
    loaded = live + loaded
    check_all(loaded)
    for m in loaded:
        if m.kind == "Node" and not any(n.name == m.name for n in nodes):
            nodes.append(node_from_object(m))
    loaded = unbind_hami_pods([m for m in loaded if m.kind != "Node"], nodes, notes)
    loaded = list(expand_workloads(loaded, max_pods=limits.max_pods, notes=notes))
    if not nodes and not add_nodes and not any(m.kind == "ResourceSlice" for m in loaded):
        raise TesseraError(
            "no nodes to schedule on: give --cluster FILE, --node NAME=INVENTORY, --kubeconfig FILE, or ResourceSlices"
        )
    slice_nodes = (
        {(m.obj.get("spec") or {}).get("nodeName") for m in loaded if m.kind == "ResourceSlice"}
        - {None}
        - {n.name for n in nodes}
    )
    for extra in sorted(str(x) for x in slice_nodes):
        nodes.append(SimNode(extra, {"kubernetes.io/hostname": extra}, [], "ResourceSlices"))
    for spec in add_nodes:
        nodes.append(_inventory_node(spec, ADDED_NODE, cluster))
    if any(m.kind == "DaemonSet" for m in loaded):  # one pod per eligible node: nodes are known now
        from tessera.sim.daemonset import expand_daemonsets

        loaded = list(expand_daemonsets(loaded, nodes, max_pods=limits.max_pods, notes=notes))
    notes = [*cluster.warnings, *notes]
    if warnings is None:
        for w in notes:
            warn(w)
    else:
        warnings.extend(notes)
    return cluster, loaded


def live_outcome(
    cluster: Cluster, loaded: list[Manifest], objects: list[dict[str, Any]]
) -> list[str]:
    """For ``--kubeconfig``/``--add-node`` runs: what became of the pods pending in the
    cluster, or who landed on the added nodes (see :func:`tessera.kube.live.pending_outcome`);
    empty for other runs."""
    from tessera.kube.live import LIVE_STATE, pending_outcome

    added = [n.name for n in cluster.nodes if n.source.startswith(ADDED_NODE)]
    if not added and not any(LIVE_STATE in m.extra for m in loaded):
        return []
    return pending_outcome(loaded, objects, added)


def catch_termination() -> list[int]:
    """Catch SIGTERM and SIGINT from now on: each one's number is appended to the returned list
    (read by :func:`wait_for_termination`). Called before a command says it is serving, so a
    signal sent as soon as the caller reads that line is a clean stop, not a kill.

    The handler only appends to a list: a handler that takes a lock (such as
    ``threading.Event.set``) deadlocks when the signal interrupts the main thread while it holds
    that same lock."""
    import signal

    got: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: got.append(signum))
    return got


def wait_for_termination(got: list[int] | None = None) -> int:
    """Block until SIGTERM or SIGINT arrives; return its number. For the long-running commands
    (``tessera driver``, ``tessera monitor``), whose caller then stops what it serves.
    ``got``: the list of an earlier :func:`catch_termination` (else the signals are caught
    from now on); polled every 0.2 s."""
    import time

    if got is None:
        got = catch_termination()
    while not got:
        time.sleep(0.2)
    return got[0]
