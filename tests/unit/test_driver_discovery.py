"""Discovery through nvidia-ml-py over the fake NVML (``native/fake``, node description from a
real inventory), the nvidia-smi XML fallback, and the GPU registry's stable device names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tessera.driver.discovery import discover_smi
from tessera.driver.publish import GpuRegistry, desired_slices
from tessera.inventory import GPU, build_resource_slices, load_inventory

REPO = Path(__file__).resolve().parents[2]
H100 = "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
A5000_XML = "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"


@pytest.fixture(scope="module")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.fail("needs make and gcc to build the fake NVML")
    b = tmp_path_factory.mktemp("fake-nvml")
    r = subprocess.run(
        ["make", "-C", str(REPO / "native"), f"BUILD={b}", "fake"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return b / "fake" / "libnvidia-ml.so.1"


def _config(path: Path, corpus: Path, extra: str = "", lost: str = "") -> list:
    gpus = load_inventory(corpus / "inventories" / H100)
    lines = ["driver-version 535.161.08", "cuda-version 12020"]
    for g in gpus:
        lines.append(
            f'gpu {g.uuid} name="{g.product_name}" memory={g.memory_bytes} pci={g.pcie_bus_id} '
            f"cc={g.cuda_compute_capability} minor={g.index} reserved={g.memory_reserved_bytes}"
            + (" health=lost" if g.uuid == lost else "")
        )
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n" + extra)
    os.replace(tmp, path)
    return gpus


#: Run in a child process: NVML (even the fake) stays loaded in a process once loaded, and
#: other tests of this session rely on this machine having no libnvidia-ml.so.1.
CHILD = """
import json, sys
from dataclasses import asdict
from tessera.driver.discovery import discover_nvml, load_nvml, probe
nvml = load_nvml(sys.argv[1])
inv = discover_nvml(nvml)
print(json.dumps({"source": inv.source, "driver": inv.driver_version, "cuda": inv.cuda_driver_version,
                  "gpus": [{**asdict(n.gpu), "mig_devices": []} for n in inv.gpus],
                  "minors": [n.minor for n in inv.gpus],
                  "probe": {u: probe(nvml, u) for u in sys.argv[2:]}}))
"""


def _discover(nvml_lib: Path, cfg: Path, *probe_uuids: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(nvml_lib), *probe_uuids],
        capture_output=True,
        text=True,
        env={**os.environ, "FAKE_NVML_CONFIG": str(cfg)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def test_nvml_discovery_gives_the_inventorys_gpus(
    nvml_lib: Path, corpus: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "nvml.cfg"
    gpus = _config(cfg, corpus)
    out = _discover(nvml_lib, cfg)
    assert (out["source"], out["driver"], out["cuda"]) == ("nvml", "535.161.08", 12020)
    assert out["minors"] == list(range(8))
    seen = [GPU(**{**g, "mig_devices": ()}) for g in out["gpus"]]
    # The same slices as `tessera simulate` builds from the inventory file (one code path).
    # The driver-reserved 551 MiB (nvidia-smi "Reserved", NVML v2 `reserved`) is no share's:
    # 81559 MiB total, 81008 MiB published.
    assert [g.memory_reserved_bytes for g in seen] == [551 * 1024 * 1024] * 8
    ours = build_resource_slices("n", seen)
    theirs = build_resource_slices("n", gpus)
    for a, b in zip(ours[0]["spec"]["devices"], theirs[0]["spec"]["devices"], strict=True):
        a_attrs = {k: v for k, v in a["attributes"].items() if k != "cudaDriverVersion"}
        b_attrs = {k: v for k, v in b["attributes"].items() if k != "cudaDriverVersion"}
        assert (a["name"], a_attrs, a["capacity"]) == (b["name"], b_attrs, b["capacity"])
        assert a["capacity"]["memory"]["value"] == "81008Mi"
    lost = gpus[2].uuid
    _config(cfg, corpus, lost=lost)
    out = _discover(nvml_lib, cfg, lost, "GPU-00000000-1111-2222-3333-444444444444", gpus[0].uuid)
    assert [g["uuid"] for g in out["gpus"]] == [g.uuid for g in gpus if g.uuid != lost]
    assert out["probe"] == {
        lost: "lost",
        "GPU-00000000-1111-2222-3333-444444444444": "missing",
        gpus[0].uuid: "ok",
    }


def test_smi_fallback_reads_xml_and_minor_numbers(corpus: Path) -> None:
    text = (corpus / "inventories" / A5000_XML).read_text()
    inv = discover_smi(run=lambda argv: text if argv[1:] == ["-q", "-x"] else "")
    assert inv.source == "nvidia-smi"
    assert [n.gpu for n in inv.gpus] == load_inventory(corpus / "inventories" / A5000_XML)
    # The XML lists minor 1 before minor 0: the device node follows the minor, not the index.
    assert [(n.gpu.index, n.minor) for n in inv.gpus] == [(0, 1), (1, 0)]


def test_registry_keeps_device_names_when_a_gpu_vanishes(corpus: Path, tmp_path: Path) -> None:
    from dataclasses import replace

    from tessera.driver.discovery import NodeGPU

    gpus = load_inventory(corpus / "inventories" / H100)
    reg = GpuRegistry(tmp_path / "gpus.json")
    assert reg.update([NodeGPU(g, g.index) for g in gpus], {}, now=0)
    # GPU 2 vanishes: NVML renumbers the others 0..6, the registry keeps their names.
    rest = [NodeGPU(g, g.index) for g in gpus if g.index != 2]
    renumbered = [NodeGPU(replace(n.gpu, index=i), n.minor) for i, n in enumerate(rest)]
    assert reg.update(renumbered, {gpus[2].uuid: "missing"}, now=1)
    assert {name: r.gpu.uuid for name, r in reg.by_device().items()} == {
        f"gpu-{g.index}": g.uuid for g in gpus
    }
    slices = desired_slices(
        "n", "gpu.tessera.dev", reg.snapshot(), "library", 5, now=1, xid_recovery=60
    )
    tainted = [d for d in slices[0]["spec"]["devices"] if d.get("taints")]
    assert [(d["name"], d["taints"]) for d in tainted] == [
        (
            "gpu-2",
            [{"key": "gpu.tessera.dev/unhealthy", "value": "missing", "effect": "NoSchedule"}],
        )
    ]
    # Persisted: a restarted driver knows the vanished GPU and its index.
    again = GpuRegistry(tmp_path / "gpus.json")
    assert {n: r.health for n, r in again.by_device().items()}["gpu-2"] == "missing"
    assert not again.update(renumbered, {gpus[2].uuid: "missing"}, now=2)


# ---- the driver publishes what `tessera simulate` publishes from the machine's nvidia-smi ----

H100_TOPO = "nccl-issue-1264__topo-m.HGX-H100-SXM-8x-NV18-10nic.excerpt.txt"
PAIRS_TOPO = "litgpt__tests_test_utils__topo-m.4xGPU-NV1-pairs-SYS.txt"
H200_MIG = (
    "nvidia_gpu_exporter__internal_captures__linux-x86_64__nvidia-h200-mig__590.48.01.capture.txt"
)
A100_80_MIG = "telegraf__nvidia_smi_testdata__a100-sxm4-v12.xml"
A100_PCIE_MIG = REPO / "tests" / "data" / "mig" / "a100-pcie-40gb.2g10gb-3x1g5gb.nvidia-smi-q-x.xml"

#: The child's discovery pass, as the driver runs it, in JSON.
DISCOVER = """
import json, sys
from dataclasses import asdict
from tessera.driver.discovery import discover_nvml, load_nvml
inv = discover_nvml(load_nvml(sys.argv[1]))
print(json.dumps([asdict(n) for n in inv.gpus]))
"""


def _node_gpus(nvml_lib: Path, cfg: Path) -> list:
    from tessera.driver.discovery import GpuInstance, NodeGPU
    from tessera.inventory.model import MigDevice

    r = subprocess.run(
        [sys.executable, "-c", DISCOVER, str(nvml_lib)],
        capture_output=True,
        text=True,
        env={**os.environ, "FAKE_NVML_CONFIG": str(cfg)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    out = []
    for d in json.loads(r.stdout):
        g = d["gpu"]
        gpu = GPU(**{**g, "mig_devices": tuple(MigDevice(**m) for m in g["mig_devices"])})
        inst = tuple(
            GpuInstance(
                i["id"],
                i["profile_id"],
                i["start"],
                i["size"],
                tuple(tuple(c) for c in i["compute_instances"]),
            )
            for i in d["instances"]
        )
        out.append(NodeGPU(gpu, d["minor"], tuple(d["nvlink"]), inst))
    return out


@pytest.mark.parametrize(
    "inventory,topology,first",
    [
        (H100, H100_TOPO, 8),  # NUMA nodes 0 and 1, one NVLink domain (NVSwitch)
        (H100, PAIRS_TOPO, 4),  # two NVLink domains (GPU pairs), no NUMA affinity
        (A100_PCIE_MIG, None, 1),  # static MIG: one 2g.10gb and three 1g.5gb
        (A100_80_MIG, None, 1),  # static MIG: four 1g.20gb
        (H200_MIG, H200_MIG, 1),  # static MIG, one GPU instance split into two compute instances
    ],
)
def test_nvml_discovery_publishes_what_simulate_publishes_from_nvidia_smi(
    nvml_lib: Path, corpus: Path, tmp_path: Path, inventory: Any, topology: str | None, first: int
) -> None:
    """The fake machine is written from a real ``nvidia-smi`` output (and ``topo -m``); the
    driver reads it through NVML and publishes through its registry; `tessera simulate`'s
    builder publishes from the output itself. Both must be the same slices, device for device.
    ``-q -x`` lacks what ``nvidia-smi -L`` prints (MIG UUIDs, profile names): the expected side
    gets the fake machine's (``as_listed``)."""
    from tessera.driver.publish import desired_slices
    from tessera.inventory import load_topology
    from tessera.localcluster.fake_nvml import as_listed, nvml_config

    src = inventory if isinstance(inventory, Path) else corpus / "inventories" / inventory
    gpus = load_inventory(src)[:first]
    topo = None
    if topology is not None:
        tsrc = (
            corpus
            / ("inventories" if topology.endswith("capture.txt") else "topologies")
            / topology
        )
        topo = load_topology(tsrc)
    cfg = tmp_path / "nvml.cfg"
    cfg.write_text(nvml_config(gpus, topology=topo))
    seen = _node_gpus(nvml_lib, cfg)
    reg = GpuRegistry(tmp_path / "gpus.json")
    reg.update(seen, {}, now=0)
    again = GpuRegistry(tmp_path / "gpus.json")  # what a restarted driver publishes
    ours = desired_slices(
        "n", "gpu.tessera.dev", again.snapshot(), "library", 1, now=0, xid_recovery=60
    )
    theirs = build_resource_slices(
        "n",
        [as_listed(g) for g in gpus],
        topo,
        attributes={"enforcementBackend": {"string": "library"}},
    )
    assert ours == theirs
    devices = [d for s in ours for d in s["spec"].get("devices", [])]
    if topo is not None and not gpus[0].mig_enabled:
        assert {d["attributes"].get("numaNode", {}).get("int") for d in devices} == set(
            topo.numa.values()
        )
        assert {d["name"]: d["attributes"].get("nvlinkDomain", {}).get("int") for d in devices} == {
            f"gpu-{i}": topo.nvlink_domains().get(i) for i in range(len(gpus))
        }
    if gpus[0].mig_enabled:
        # Every MIG device with its MIG UUID and nvidia-smi -L's profile name.
        assert sorted(
            (
                d["attributes"]["gpuInstanceID"]["int"],
                d["attributes"]["computeInstanceID"]["int"],
                d["attributes"]["profile"]["string"],
            )
            for d in devices
        ) == sorted(
            (
                m.gpu_instance_id,
                m.compute_instance_id,
                m.profile or as_listed(gpus[0]).mig_devices[k].profile,
            )
            for k, m in enumerate(gpus[0].mig_devices)
        )
        assert all(d["attributes"]["uuid"]["string"].startswith("MIG-") for d in devices)


def test_nvlink_domains_are_published_when_indices_have_a_gap(
    nvml_lib: Path, corpus: Path, tmp_path: Path
) -> None:
    """Published indices 0, 2, 3 (GPU 1 fell off the bus): NVML's NVLink peers (UUIDs, read
    through the fake NVML of the machine with GPU pairs 0-1 and 2-3) still give the domains,
    named by the smallest published index; the GPU whose peer is gone has none. (Before, a
    gap published no ``nvlinkDomain`` at all.)"""
    from tessera.inventory import load_topology
    from tessera.localcluster.fake_nvml import nvml_config

    gpus = load_inventory(corpus / "inventories" / H100)[:4]
    topo = load_topology(corpus / "topologies" / PAIRS_TOPO)
    cfg = tmp_path / "nvml.cfg"
    cfg.write_text(nvml_config(gpus, topology=topo))
    seen = [n for n in _node_gpus(nvml_lib, cfg) if n.gpu.index != 1]
    assert seen[0].nvlink == (gpus[1].uuid,)  # NVML still names the gone GPU as a peer
    reg = GpuRegistry(tmp_path / "gpus.json")
    reg.update(seen, {}, now=0)
    again = GpuRegistry(tmp_path / "gpus.json")
    assert [r.gpu.index for r in again.snapshot()] == [0, 2, 3]
    slices = desired_slices(
        "n", "gpu.tessera.dev", again.snapshot(), "library", 1, now=0, xid_recovery=60
    )
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    assert {d["name"]: d["attributes"].get("nvlinkDomain", {}).get("int") for d in devices} == {
        "gpu-0": None,
        "gpu-2": 2,
        "gpu-3": 2,
    }
