"""HAMi's ``hami.io/node-nvidia-register`` annotation for a corpus inventory, as HAMi's device
plugin writes it (v2.8+ JSON; hami.md 1.5): ``devmem`` the GPU's MiB, ``devcore`` 100, ``type``
the NVML name prefixed ``NVIDIA-`` unless it starts with NVIDIA, ``numa`` from a topology when
given. For the legacy extender's tests (unit and e2e)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corpus_paths import corpus_path

INVENTORIES = corpus_path() / "inventories"
TOPOLOGIES = corpus_path() / "topologies"
A5000 = INVENTORIES / "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"
A10 = INVENTORIES / "gpud__nvidia-query_testdata__nvidia-smi-q.535.129.03.A10.txt"
H100 = INVENTORIES / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
H100_TOPOLOGY = TOPOLOGIES / "litgpt__tests_test_utils__topo-m.8xGPU-NV12-10nic.txt"


def register_entries(
    inventory: Path, topology: Path | None = None, count: int = 10
) -> list[dict[str, Any]]:
    from tessera.inventory import load_inventory, load_topology

    assert inventory.is_file(), f"corpus file missing: {inventory} (set TESSERA_CORPUS)"
    numa = load_topology(topology).numa if topology is not None else {}
    out = []
    for g in load_inventory(inventory):
        assert g.memory_bytes is not None
        name = g.product_name
        out.append(
            {
                "id": g.uuid,
                "index": g.index,
                "count": count,
                "devmem": g.memory_bytes // 2**20,
                "devcore": 100,
                "type": name if name.startswith("NVIDIA") else f"NVIDIA-{name}",
                "numa": numa.get(g.index) or g.numa_node or 0,
                "mode": "hami-core",
                "health": True,
            }
        )
    return out


def register_node(
    name: str, inventory: Path, topology: Path | None = None, count: int = 10
) -> dict[str, Any]:
    """A ``v1`` Node carrying the register annotation of ``inventory``."""
    entries = register_entries(inventory, topology, count)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {"hami.io/node-nvidia-register": json.dumps(entries)},
        },
        "status": {"capacity": {"nvidia.com/gpu": str(count * len(entries))}},
    }
