"""Every file of the shared corpus's inventories/ and topologies/ either yields valid
ResourceSlices or its documented, exact error."""

from __future__ import annotations

from dataclasses import replace

import pytest

from corpus_paths import corpus_path
from tessera.api.slice_validation import validate_resource_slice
from tessera.inventory import (
    GPU,
    InventoryError,
    Topology,
    build_resource_slices,
    parse_inventory,
    parse_topology,
)

CORPUS = corpus_path()
MISSING = "<corpus missing: set TESSERA_CORPUS or put shared/ beside the repository>"


def _files(sub: str) -> list[str]:
    d = CORPUS / sub
    return sorted(p.name for p in d.iterdir() if p.is_file()) if d.is_dir() else [MISSING]


INVENTORY_FILES = _files("inventories")
TOPOLOGY_FILES = _files("topologies")

_QUERY = (
    "nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id,driver_version,compute_cap,"
    "mig.mode.current --format=csv"
)
INVENTORY_ERRORS = {
    "gpud__nvidia-query_testdata__nvidia-smi-table.550.90.07.8xH100.txt": (
        "gpud__nvidia-query_testdata__nvidia-smi-table.550.90.07.8xH100.txt: uuid: the plain "
        "`nvidia-smi` table shows no GPU UUIDs, so GPUs cannot be identified; capture "
        "`nvidia-smi -q -x` (or `nvidia-smi -q`) instead"
    ),
    "netdata-go.d.plugin__nvidia_smi_testdata__tesla-p100.csv": (
        "netdata-go.d.plugin__nvidia_smi_testdata__tesla-p100.csv:1: memory.total: --query-gpu "
        "CSV lacks the column(s) memory.total needed to identify and size each GPU; capture "
        f"`{_QUERY}` or `nvidia-smi -q -x`"
    ),
    "xuesongtap-blog__nvidia-smi-more__query-gpu-csv.A10.txt": (
        "xuesongtap-blog__nvidia-smi-more__query-gpu-csv.A10.txt:2: uuid, name: --query-gpu CSV "
        "lacks the column(s) uuid, name needed to identify and size each GPU; capture "
        f"`{_QUERY}` or `nvidia-smi -q -x`"
    ),
}
TOPOLOGY_ERRORS = {
    "gpud__fabric-manager_testdata__lspci-nn.a100-nvswitch.txt": (
        "gpud__fabric-manager_testdata__lspci-nn.a100-nvswitch.txt: links: `lspci -nn` lists PCI "
        "devices but no GPU-to-GPU links; capture `nvidia-smi topo -m`"
    ),
    "gpud__fabric-manager_testdata__nvidia-smi-nvlink-status.8xA100-SXM4-80GB.txt": (
        "gpud__fabric-manager_testdata__nvidia-smi-nvlink-status.8xA100-SXM4-80GB.txt: links: "
        "`nvidia-smi nvlink --status` lists each GPU's active links and speeds but not the GPU at "
        "the other end, so NVLink domains cannot be told; capture `nvidia-smi topo -m`"
    ),
}


def read(sub: str, name: str) -> str:
    if name == MISSING:
        pytest.fail(f"corpus not found at {CORPUS}: {MISSING}")
    return (CORPUS / sub / name).read_text(encoding="utf-8")


def test_corpus_present() -> None:
    assert (CORPUS / "inventories").is_dir(), f"no corpus at {CORPUS}"
    assert (CORPUS / "topologies").is_dir(), f"no corpus at {CORPUS}"
    assert len(INVENTORY_FILES) == 34
    assert len(TOPOLOGY_FILES) == 13


def test_expected_error_tables_name_real_files() -> None:
    assert set(INVENTORY_ERRORS) <= set(INVENTORY_FILES)
    assert set(TOPOLOGY_ERRORS) <= set(TOPOLOGY_FILES)


def _check_pool(slices: list[dict], node: str) -> list[dict]:
    assert slices, "at least one slice"
    devices = []
    for s in slices:
        assert validate_resource_slice(s) == []
        assert s["spec"]["pool"] == {
            "name": node,
            "generation": 1,
            "resourceSliceCount": len(slices),
        }
        assert s["spec"]["nodeName"] == node
        devices += s["spec"].get("devices") or []  # counter slices carry sharedCounters only
    names = [d["name"] for d in devices]
    assert len(names) == len(set(names)), "device names unique across the pool"
    return devices


@pytest.mark.parametrize("name", INVENTORY_FILES)
def test_inventory_file(name: str) -> None:
    text = read("inventories", name)
    if name in INVENTORY_ERRORS:
        with pytest.raises(InventoryError) as err:
            parse_inventory(text, name)
        assert str(err.value) == INVENTORY_ERRORS[name]
        assert "\n" not in str(err.value)
        return
    gpus = parse_inventory(text, name)
    assert gpus
    assert [g.index for g in gpus] == list(range(len(gpus)))
    for g in gpus:
        assert g.memory_bytes > 0 and g.memory_bytes % (1 << 20) == 0
        assert g.uuid.startswith("GPU-") and len(g.uuid) == 40
    assert len({g.uuid for g in gpus}) == len(gpus)
    devices = _check_pool(build_resource_slices("node-1", gpus), "node-1")
    expected = sum(len(g.mig_devices) if g.mig_enabled else 1 for g in gpus)
    assert len(devices) == expected
    for d in devices:
        kind = d["attributes"]["type"]["string"]
        assert (kind == "gpu") == bool(d.get("allowMultipleAllocations"))


def _gpus_like(n: int) -> list[GPU]:
    """n distinct GPUs shaped like GPU 0 of the bundled 8x H100 inventory."""
    text = read(
        "inventories", "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
    )
    base = parse_inventory(text, "h100")[0]
    return [
        replace(base, index=i, uuid=f"GPU-{i:08x}-0000-4000-8000-{i:012x}", pcie_bus_id=None)
        for i in range(n)
    ]


@pytest.mark.parametrize("name", TOPOLOGY_FILES)
def test_topology_file(name: str) -> None:
    text = read("topologies", name)
    if name in TOPOLOGY_ERRORS:
        with pytest.raises(InventoryError) as err:
            parse_topology(text, name)
        assert str(err.value) == TOPOLOGY_ERRORS[name]
        return
    topo = parse_topology(text, name)
    assert isinstance(topo, Topology) and topo.gpus >= 2
    for (i, j), kind in topo.links.items():
        assert i != j and topo.links[(j, i)] == kind
    devices = _check_pool(build_resource_slices("node-1", _gpus_like(topo.gpus), topo), "node-1")
    domains = topo.nvlink_domains()
    for d in devices:
        index = d["attributes"]["index"]["int"]
        assert d["attributes"].get("nvlinkDomain", {}).get("int") == domains.get(index)
        assert d["attributes"].get("numaNode", {}).get("int") == topo.numa[index]
