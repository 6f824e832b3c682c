"""Cluster descriptions for simulation: nodes from GPU inventories (or ResourceSlices).

The file format (``kind: Cluster``) is documented in ``docs/cluster-file.md``; in short::

    apiVersion: tessera.dev/v1alpha1
    kind: Cluster
    metadata: {name: lab}               # optional
    nodes:
    - name: h100                        # Node name (DNS subdomain); also the pool name
      count: 4                          # optional: 4 identical nodes h100-0 .. h100-3
      inventory: inventories/8xH100.txt # nvidia-smi -q / -q -x / --query-gpu CSV / HAMi annotation
      topology: topologies/topo-m.txt   # optional `nvidia-smi topo -m` (NVLink, NUMA)
      labels: {zone: a}                 # optional Node labels
      taints:                           # optional Node taints (NoSchedule/NoExecute keep pods
      - {key: gpu, value: h100, effect: NoSchedule}   #  without a toleration away)
      dynamicMIG: true                  # optional: partition MIG GPUs on demand (docs/mig.md)

A node labelled ``gpu.tessera.dev/mode: legacy`` (:mod:`tessera.api.modes`) is in Tessera's
legacy mode: it publishes no ResourceSlices, and its ``inventory`` must be HAMi's
``hami.io/node-nvidia-register`` annotation (what its device plugin registers), kept as the
node's annotation (:attr:`SimNode.annotations`) for legacy mode's decision.

A node may instead give ``slices: FILE`` holding its ResourceSlices. Beside either (or alone),
``vendorInventories: [FILE, ...]`` lists other vendors' inventories (``npu-smi info``, ``rocm-smi --json``:
:mod:`tessera.inventory.vendor_devices`): their devices are published as those vendors' DRA
drivers publish them, so one node can hold NVIDIA GPUs and Ascend NPUs. Paths are relative to the
file. Unknown keys are refused, naming the key and the closest known one.

``dynamicMIG`` (:func:`tessera.inventory.mig.parse_dynamic_mig`, the same setting the node
driver reads): ``true`` for every MIG-capable GPU of the node, a list of GPU indices or UUIDs,
or ``{gpus: all | [...], profiles: [1g.5gb, ...]}`` to offer only some profiles. Without it a
node publishes dynamic MIG only for GPUs its inventory marks so (HAMi's ``mode: mig``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from tessera.api.documents import documents
from tessera.api.errors import ManifestError, TesseraError
from tessera.api.loader import ReadBudget, load_file, read_text
from tessera.api.modes import MODE_LABEL, MODE_LEGACY, NodeModeError, labels_mode
from tessera.api.schema import SchemaSet
from tessera.api.uids import uuid5_url
from tessera.api.validation import is_dns_subdomain

CLUSTER_API_VERSION = "tessera.dev/v1alpha1"
#: At most this many nodes from one cluster file (``count`` included).
MAX_NODES = 100_000

_LABEL_VALUE = {
    "type": "string",
    "maxLength": 63,
    "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
}
_TAINT = {
    "type": "object",
    "properties": {
        "key": {"type": "string", "minLength": 1, "maxLength": 316},
        "value": _LABEL_VALUE,
        "effect": {"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
    },
    "required": ["key", "effect"],
    "additionalProperties": False,
}
_NODE = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 253},
        "count": {"type": "integer", "minimum": 1, "maximum": MAX_NODES},
        "inventory": {"type": "string", "minLength": 1},
        "topology": {"type": "string", "minLength": 1},
        "slices": {"type": "string", "minLength": 1},
        "vendorInventories": {
            "type": "array",
            "items": {"type": "string", "minLength": 1},
            "minItems": 1,
            "maxItems": 16,
        },
        "labels": {"type": "object", "additionalProperties": _LABEL_VALUE},
        "taints": {"type": "array", "items": _TAINT, "maxItems": 64},
        "dynamicMIG": {
            "type": ["boolean", "string", "array", "object"]
        },  # parse_dynamic_mig checks it
    },
    "required": ["name"],
    "additionalProperties": False,
}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"enum": [CLUSTER_API_VERSION]},
        "kind": {"enum": ["Cluster"]},
        "metadata": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "labels": {"type": "object"},
                "annotations": {"type": "object"},
            },
            "additionalProperties": False,
        },
        "nodes": {"type": "array", "items": _NODE, "minItems": 1},
    },
    "required": ["apiVersion", "kind", "nodes"],
    "additionalProperties": False,
}


@cache
def _schema() -> SchemaSet:
    return SchemaSet({"roots": {"Cluster": SCHEMA}})


@dataclass
class SimNode:
    """A simulated node: its name, labels, taints and the ResourceSlices its driver would
    publish; ``annotations``: the Node annotations legacy mode reads (HAMi's
    ``hami.io/node-nvidia-register`` and ``hami.io/device-cordon``) on a node whose label
    ``gpu.tessera.dev/mode`` is ``legacy`` (:attr:`mode`), which publishes no ResourceSlices."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    slices: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""
    taints: list[dict[str, str]] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        """``dra`` or ``legacy``: :func:`tessera.api.modes.labels_mode` of the labels. Raises
        :class:`~tessera.api.modes.NodeModeError` for a label value that is no mode."""
        return labels_mode(self.name, self.labels)

    def node_object(self) -> dict[str, Any]:
        """The node as a ``v1`` Node dict (name, labels, annotations, taints): what legacy
        mode's decision reads (:func:`tessera.scheduler.legacy.legacy_node`)."""
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": dict(self.labels),
                "annotations": dict(self.annotations),
            },
            "spec": {"taints": [dict(t) for t in self.taints]} if self.taints else {},
        }


@dataclass
class Cluster:
    """Nodes in scheduling order (the order of the file)."""

    nodes: list[SimNode]
    source: str = ""
    #: What an inventory could not give in full (``tessera.inventory.publication_warnings``,
    #: an ``attached_gpus`` count that differs from the GPUs listed).
    warnings: list[str] = field(default_factory=list)


def is_cluster_doc(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and obj.get("kind") == "Cluster"
        and str(obj.get("apiVersion", "")).startswith("tessera.dev/")
    )


def _copy_uuid(original: str, node: str) -> str:
    """A stable GPU UUID for a ``count`` copy: uuid5 of the inventory's UUID and the node name."""
    return "GPU-" + uuid5_url(f"tessera-cluster-copy/{node}/{original.lower()}")


_GPU_UUID_RX = re.compile(
    r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)


def _copy_register(value: str, node: str) -> str:
    """A HAMi register annotation ``value`` for the ``count`` copy ``node``: every GPU UUID in
    it replaced as :func:`_copy_uuid` replaces it (either encoding names GPUs by UUID only)."""
    return _GPU_UUID_RX.sub(lambda m: _copy_uuid(m.group(0), node), value)


def _legacy_register(n: dict[str, Any], where: str, base: Path, file: str) -> str:
    """The register annotation value of the legacy node entry ``n`` (``nodes[i]``: ``where``):
    its ``inventory`` file must be HAMi's ``hami.io/node-nvidia-register`` (what the device
    plugin publishes); read and checked as an inventory. Raises :class:`ManifestError` naming
    the entry and field otherwise."""
    from tessera.inventory import load_inventory
    from tessera.inventory.hami import KEY, register_value

    label = f"label {MODE_LABEL}: {MODE_LEGACY}"
    for key in ("slices", "topology", "dynamicMIG", "vendorInventories"):
        if key in n:
            raise _err(
                file,
                f"{where}.{key}",
                f"a node with {label} publishes no ResourceSlices: give its GPUs as 'inventory', "
                f"HAMi's {KEY} annotation (docs/cluster-file.md, 'Legacy nodes'), and no {key!r}",
            )
    if "inventory" not in n:
        raise _err(
            file,
            where,
            f"a node with {label} needs 'inventory': HAMi's {KEY} annotation its device plugin "
            f"registers (kubectl get node NAME -o yaml, or the value alone)",
        )
    path = base / n["inventory"]
    try:
        text = read_text(path)
        load_inventory(path)
    except TesseraError as e:
        raise _err(file, f"{where}.inventory", str(e)) from None
    found = register_value(text)
    if found is None:
        raise _err(
            file,
            f"{where}.inventory",
            f"{n['inventory']}: a node with {label} is described by what its device plugin "
            f"registers, HAMi's {KEY} annotation (kubectl get node NAME -o yaml, or the value "
            "alone), not nvidia-smi output; or drop the label to plan the node in DRA mode",
        )
    return found[0]


_PLACEHOLDER = "tessera-node-placeholder-0"
_PLACEHOLDER_UUID = "GPU-7e55e7a0-0000-4000-8000-{:012x}"
_PLACEHOLDER_UUID_MARK = "GPU-7e55e7a0-0000-4000-8000-"
_PLACEHOLDER_RX = re.compile(r"GPU-7e55e7a0-0000-4000-8000-([0-9a-f]{12})")


def _named(s: str) -> bool:
    return _PLACEHOLDER in s or _PLACEHOLDER_UUID_MARK in s


class _Copier:
    """Slices of ``count`` identical nodes. Each copy's GPUs get their own UUID (uuid5 of the
    inventory's UUID and the node name), published with ``uuidSynthesized: true``; MIG devices
    publish no UUID of their own (as for any synthesized parent). The slices are built and
    checked once, for placeholder names; a copy is new only where a name differs (the objects
    that hold the node's name or a GPU UUID, keys included, and the objects above them) and
    shares every other object with the other copies (capacities, most attribute values), so
    memory grows with what differs. Shared objects are never modified (readers copy what they
    change: the API apply path, ``-o yaml``'s dumper writes no aliases)."""

    def __init__(
        self, gpus: list[Any], topo: Any, dynamic: Any = None, where: str | None = None
    ) -> None:
        from tessera.inventory import build_resource_slices

        self.uuids = [g.uuid for g in gpus]
        if dynamic is not None and dynamic.gpus:  # GPUs named by UUID: name the placeholders
            by_uuid = {u.lower(): _PLACEHOLDER_UUID.format(k) for k, u in enumerate(self.uuids)}
            dynamic = dataclasses.replace(
                dynamic,
                gpus=tuple(
                    by_uuid.get(g.lower(), g) if isinstance(g, str) else g for g in dynamic.gpus
                ),
            )
        placeholders = [
            dataclasses.replace(
                g,
                uuid=_PLACEHOLDER_UUID.format(k),
                uuid_synthesized=True,
                mig_devices=tuple(dataclasses.replace(m, uuid=None) for m in g.mig_devices),
            )
            for k, g in enumerate(gpus)
        ]
        # Through JSON once: plain dicts, lists and scalars, as a slices file would give.
        self.template: list[dict[str, Any]] = json.loads(
            json.dumps(
                build_resource_slices(
                    _PLACEHOLDER, placeholders, topo, dynamic_mig=dynamic, where=where
                )
            )
        )
        self.dirty: set[int] = set()  # ids of the template's containers that hold a name
        self._mark(self.template)

    def _mark(self, obj: Any) -> bool:
        if isinstance(obj, str):
            return _named(obj)
        if isinstance(obj, dict):
            items = list(obj.items())
            found = any([self._mark(v) for _, v in items]) or any(_named(k) for k, _ in items)
        elif isinstance(obj, list):
            found = any([self._mark(v) for v in obj])
        else:
            return False
        if found:
            self.dirty.add(id(obj))
        return found

    def slices(self, node: str) -> list[dict[str, Any]]:
        made: dict[str, str] = {}

        def gpu_uuid(m: re.Match[str]) -> str:
            k = m.group(1)
            u = made.get(k)
            if u is None:
                u = made[k] = _copy_uuid(self.uuids[int(k, 16)], node)
            return u

        def text(s: str) -> str:
            if _PLACEHOLDER in s:
                s = s.replace(_PLACEHOLDER, node)
            if _PLACEHOLDER_UUID_MARK in s:
                s = _PLACEHOLDER_RX.sub(gpu_uuid, s)
            return s

        dirty = self.dirty

        def copy(obj: Any) -> Any:
            if isinstance(obj, str):
                return text(obj) if _named(obj) else obj
            if id(obj) not in dirty:
                return obj  # shared with every copy
            if isinstance(obj, dict):
                return {(text(k) if _named(k) else k): copy(v) for k, v in obj.items()}
            return [copy(v) for v in obj]

        out: list[dict[str, Any]] = copy(self.template)
        return out


def _err(file: str, field: str, message: str) -> ManifestError:
    return ManifestError(message, file=file, obj="Cluster", field=field)


def cluster_from_dict(
    doc: Any, base: Path, file: str, *, budget: ReadBudget | None = None
) -> Cluster:
    """Build a :class:`Cluster` from a parsed ``kind: Cluster`` document.

    Raises :class:`ManifestError` naming the file, node and field for a bad entry (unknown key,
    wrong type, bad name, duplicate node, more than :data:`MAX_NODES` nodes), and for an
    unreadable inventory, topology or slices file (its own error, prefixed with the field that
    names it).
    """
    from tessera.inventory import (
        build_resource_slices,
        load_inventory,
        load_topology,
        publication_warnings,
    )
    from tessera.inventory.mig import parse_dynamic_mig
    from tessera.inventory.node import HAMI_REGISTER
    from tessera.inventory.vendor_devices import load_vendor_inventory, vendor_resource_slices

    problems = _schema().problems("Cluster", doc)
    if problems:
        p = problems[0]
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise _err(file, p.field, p.message + more)
    nodes: list[SimNode] = []
    notes: list[str] = []
    seen: set[str] = set()
    total = sum(int(n.get("count", 1)) for n in doc["nodes"])
    if total > MAX_NODES:
        raise _err(file, "nodes", f"{total:,} nodes in all: at most {MAX_NODES:,} are simulated")
    for i, n in enumerate(doc["nodes"]):
        where = f"nodes[{i}]"
        base_name = n["name"]
        count = int(n.get("count", 1))
        names = [base_name] if "count" not in n else [f"{base_name}-{k}" for k in range(count)]
        for name in (names[0], names[-1]):
            if not is_dns_subdomain(name):
                raise _err(
                    file,
                    f"{where}.name",
                    f"{name!r} is not a valid node name (lower-case DNS subdomain)",
                )
        labels = {str(k): str(v) for k, v in (n.get("labels") or {}).items()}
        taints = [dict(t) for t in n.get("taints") or []]
        try:
            mode = labels_mode(base_name, labels)
        except NodeModeError as e:
            raise _err(file, f"{where}.labels[{MODE_LABEL}]", str(e)) from None
        if mode == MODE_LEGACY:
            register = _legacy_register(n, where, base, file)
            for name in names:
                if name in seen:
                    raise _err(file, f"{where}.name", f"duplicate node name {name!r}")
                seen.add(name)
                node_labels = dict(labels)
                node_labels.setdefault("kubernetes.io/hostname", name)
                value = register if len(names) == 1 else _copy_register(register, name)
                nodes.append(
                    SimNode(
                        name,
                        node_labels,
                        [],
                        str(n["inventory"]),
                        [dict(t) for t in taints],
                        {HAMI_REGISTER: value},
                    )
                )
            continue
        try:
            dynamic = parse_dynamic_mig(n.get("dynamicMIG"), f"{where}.dynamicMIG")
        except ValueError as e:
            raise ManifestError(str(e), file=file, obj="Cluster") from None
        if "dynamicMIG" in n and "inventory" not in n:
            raise _err(
                file,
                f"{where}.dynamicMIG",
                "dynamicMIG needs 'inventory' (an nvidia-smi output file): ResourceSlices given as 'slices' are "
                "published as they are",
            )
        sources = [k for k in ("inventory", "slices") if k in n]
        if len(sources) > 1 or not (sources or "vendorInventories" in n):
            raise _err(
                file,
                where,
                "needs one of 'inventory' (an nvidia-smi output file), 'slices' (ResourceSlice YAML) "
                "or 'vendorInventories' (other vendors' inventories: npu-smi info, rocm-smi --json)"
                if not sources
                else "give 'inventory' or 'slices', not both",
            )
        if "topology" in n and "slices" in n:
            raise _err(
                file, f"{where}.topology", "a topology goes with an inventory, not with slices"
            )

        def located(e: TesseraError, key: str, where: str = where) -> TesseraError:
            if str(e).startswith(f"{file}: "):  # already names this file and node
                return e
            return _err(file, f"{where}.{key}", str(e))

        if "inventory" in n:
            try:
                gpus = load_inventory(base / n["inventory"], notes)
            except TesseraError as e:
                raise located(e, "inventory") from None
            try:
                topo = load_topology(base / n["topology"]) if "topology" in n else None
            except TesseraError as e:
                raise located(e, "topology") from None
            src = str(n["inventory"])
            built_where = f"{file}: node {base_name}: {src}"
            notes.extend(publication_warnings(gpus, built_where, dynamic))
            if len(names) == 1 or len(base_name) > 200:  # long names: slice names get hashed
                try:
                    built = [
                        (
                            nm,
                            build_resource_slices(
                                nm, gpus, topo, dynamic_mig=dynamic, where=built_where
                            ),
                        )
                        for nm in names
                    ]
                except TesseraError as e:
                    raise located(e, "inventory") from None
            else:
                try:
                    copier = _Copier(gpus, topo, dynamic, built_where)
                except TesseraError as e:
                    raise located(e, "inventory") from None
                built = [(nm, copier.slices(nm)) for nm in names]
        elif "slices" in n:
            if len(names) > 1:
                raise _err(
                    file,
                    f"{where}.count",
                    "count needs an inventory: ResourceSlices name their node",
                )
            try:
                loaded = load_file(base / n["slices"], budget=budget)
            except TesseraError as e:
                raise located(e, "slices") from None
            built = [(names[0], [m.obj for m in loaded if m.kind == "ResourceSlice"])]
            src = str(n["slices"])
        else:
            built = [(nm, []) for nm in names]
            src = ""
        if "vendorInventories" in n:
            devices = []
            for k, rel in enumerate(n["vendorInventories"]):
                try:
                    devices.extend(load_vendor_inventory(base / rel))
                except TesseraError as e:
                    raise located(e, f"vendorInventories[{k}]") from None
            try:
                built = [
                    (
                        nm,
                        slices
                        + vendor_resource_slices(
                            nm, devices, where=f"{file}: node {nm}: vendorInventories"
                        ),
                    )
                    for nm, slices in built
                ]
            except TesseraError as e:
                raise located(e, "vendorInventories") from None
            src = ", ".join([src, *n["vendorInventories"]] if src else n["vendorInventories"])
        for name, slices in built:
            if name in seen:
                raise _err(file, f"{where}.name", f"duplicate node name {name!r}")
            seen.add(name)
            node_labels = dict(labels)
            node_labels.setdefault("kubernetes.io/hostname", name)
            nodes.append(SimNode(name, node_labels, slices, src, [dict(t) for t in taints]))
    return Cluster(nodes, file, notes)


def load_cluster(path: str | Path, *, budget: ReadBudget | None = None) -> Cluster:
    """Read a cluster description file. Raises :class:`ManifestError` naming the file (and node
    and field) on bad input: unreadable, not UTF-8, not one YAML document of ``kind: Cluster``,
    or a bad entry (see :func:`cluster_from_dict`)."""
    name = str(path)
    text = read_text(path, budget)
    docs = [d for d in documents(text, name) if d is not None]
    if len(docs) != 1 or not is_cluster_doc(docs[0]):
        raise ManifestError(
            f"not a cluster description: expected one YAML document with apiVersion {CLUSTER_API_VERSION}, "
            "kind Cluster (docs/cluster-file.md)",
            file=name,
        )
    p = Path(path)
    return cluster_from_dict(docs[0], p.parent, name, budget=budget)
