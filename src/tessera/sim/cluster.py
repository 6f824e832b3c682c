"""Cluster descriptions for simulation: nodes from GPU inventories (or ResourceSlices).

File format (YAML, paths relative to the file)::

    apiVersion: tessera.dev/v1alpha1
    kind: Cluster
    nodes:
    - name: h100-a                      # Node name (DNS subdomain); also the pool name
      inventory: inventories/8xH100.txt # nvidia-smi -q / -q -x / HAMi register annotation
      topology: topologies/topo-m.txt   # optional `nvidia-smi topo -m` for NVLink/NUMA
      labels: {zone: a}                 # optional Node labels
      dynamicMIG: true                  # optional: partition MIG GPUs on demand (docs/mig.md)

A node may instead give ``slices: FILE`` holding its ResourceSlices.

``dynamicMIG`` (:func:`tessera.inventory.mig.parse_dynamic_mig`, the same setting the node
driver reads): ``true`` for every MIG-capable GPU of the node, a list of GPU indices or UUIDs,
or ``{gpus: all | [...], profiles: [1g.5gb, ...]}`` to offer only some profiles. Without it a
node publishes dynamic MIG only for GPUs its inventory marks so (HAMi's ``mode: mig``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tessera.api.errors import ManifestError
from tessera.api.loader import load_file
from tessera.api.validation import is_dns_subdomain

CLUSTER_API_VERSION = "tessera.dev/v1alpha1"


@dataclass
class SimNode:
    """A simulated node: its name, labels and the ResourceSlices its driver would publish."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    slices: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""


@dataclass
class Cluster:
    """Nodes in scheduling order (the order of the file)."""

    nodes: list[SimNode]
    source: str = ""
    #: What an inventory could not give in full (``tessera.inventory.publication_warnings``).
    warnings: list[str] = field(default_factory=list)


def is_cluster_doc(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("kind") == "Cluster" and str(obj.get("apiVersion", "")).startswith("tessera.dev/")


def cluster_from_dict(doc: dict[str, Any], base: Path, file: str) -> Cluster:
    """Build a :class:`Cluster` from a parsed ``kind: Cluster`` document.

    Raises :class:`ManifestError` naming the node and field for a bad entry, and
    ``InventoryError`` (from :mod:`tessera.inventory`) for an unreadable inventory.
    """
    from tessera.inventory import (
        build_resource_slices,
        load_inventory,
        load_topology,
        publication_warnings,
    )
    from tessera.inventory.mig import parse_dynamic_mig

    nodes_in = doc.get("nodes")
    if not isinstance(nodes_in, list) or not nodes_in:
        raise ManifestError("must list at least one node", file=file, obj="Cluster", field="nodes")
    nodes: list[SimNode] = []
    warnings: list[str] = []
    seen: set[str] = set()
    for i, n in enumerate(nodes_in):
        where = f"nodes[{i}]"
        if not isinstance(n, dict):
            raise ManifestError("must be a mapping with name and inventory", file=file, obj="Cluster", field=where)
        name = str(n.get("name") or "")
        if not is_dns_subdomain(name):
            raise ManifestError(
                f"{name!r} is not a valid node name (lower-case DNS subdomain)", file=file, obj="Cluster", field=f"{where}.name"
            )
        if name in seen:
            raise ManifestError(f"duplicate node name {name!r}", file=file, obj="Cluster", field=f"{where}.name")
        seen.add(name)
        labels = {str(k): str(v) for k, v in (n.get("labels") or {}).items()}
        labels.setdefault("kubernetes.io/hostname", name)
        try:
            dynamic = parse_dynamic_mig(n.get("dynamicMIG"), f"{where}.dynamicMIG")
        except ValueError as e:
            raise ManifestError(str(e), file=file, obj="Cluster") from None
        if n.get("inventory"):
            gpus = load_inventory(base / n["inventory"])
            topo = load_topology(base / n["topology"]) if n.get("topology") else None
            src = str(n["inventory"])
            slices = build_resource_slices(
                name, gpus, topo, dynamic_mig=dynamic, where=f"{file}: node {name}: {src}"
            )
            warnings.extend(publication_warnings(gpus, f"{file}: node {name}: {src}", dynamic))
        elif n.get("dynamicMIG") is not None:
            raise ManifestError(
                "dynamicMIG needs 'inventory' (an nvidia-smi output file): ResourceSlices "
                "given as 'slices' are published as they are",
                file=file,
                obj="Cluster",
                field=f"{where}.dynamicMIG",
            )
        elif n.get("slices"):
            slices = [m.obj for m in load_file(base / n["slices"]) if m.kind == "ResourceSlice"]
            src = str(n["slices"])
        else:
            raise ManifestError(
                "needs 'inventory' (an nvidia-smi output file) or 'slices' (ResourceSlice YAML)",
                file=file,
                obj="Cluster",
                field=where,
            )
        nodes.append(SimNode(name, labels, slices, src))
    return Cluster(nodes, file, warnings)


def load_cluster(path: str | Path) -> Cluster:
    """Read a cluster description file. Raises ManifestError / InventoryError on bad input."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError("file not found", file=str(path)) from None
    except yaml.YAMLError as e:
        raise ManifestError(f"not valid YAML ({str(e).splitlines()[0]})", file=str(path)) from None
    if not is_cluster_doc(doc):
        raise ManifestError(
            f"not a cluster description: expected apiVersion {CLUSTER_API_VERSION}, kind Cluster", file=str(path)
        )
    return cluster_from_dict(doc, p.parent, str(path))
