"""GPU inventories -> a node's GPUs -> ``resource.k8s.io/v1`` ResourceSlices (pure code).

- :func:`parse_inventory` / :func:`load_inventory`: ``nvidia-smi -q -x`` XML, ``nvidia-smi -q``
  text, nvidia_gpu_exporter captures, ``--query-gpu`` CSV, HAMi's node-register annotation ->
  ``list[GPU]`` (memory in bytes).
- :func:`parse_topology` / :func:`load_topology`: ``nvidia-smi topo -m`` -> :class:`Topology`.
- :func:`build_resource_slices`: GPUs (+ topology) -> ResourceSlice dicts of one node pool;
  :func:`publication_warnings`: what it could not publish in full (unified memory, MIG unknown).
- :mod:`tessera.inventory.mig`: MIG profile tables, dynamic MIG (:class:`DynamicMIG`), counters,
  and what the node driver creates for an allocated device (docs/mig.md).

Every error is an :class:`InventoryError` (``ValueError``) whose message is one line naming the
source and the field. See docs/inventory.md.
"""

from .errors import (
    InventoryError,
    MalformedInputError,
    MissingFieldError,
    SliceBuildError,
    UnsupportedFormatError,
)
from .mig import DynamicMIG, MigPlacement, mig_placement, parse_dynamic_mig
from .model import GPU, MigDevice, MigModel, MigProfile, Topology
from .parse import load_inventory, load_topology, parse_inventory, parse_topology
from .slices import build_resource_slices, publication_warnings

__all__ = [
    "GPU",
    "DynamicMIG",
    "InventoryError",
    "MalformedInputError",
    "MigDevice",
    "MigModel",
    "MigPlacement",
    "MigProfile",
    "MissingFieldError",
    "SliceBuildError",
    "Topology",
    "UnsupportedFormatError",
    "build_resource_slices",
    "load_inventory",
    "load_topology",
    "mig_placement",
    "parse_dynamic_mig",
    "parse_inventory",
    "parse_topology",
    "publication_warnings",
]
