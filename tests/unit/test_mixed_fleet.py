"""Mixed fleets in planning: other vendors' inventories (``npu-smi info``, a real capture) become
the slices their DRA drivers publish (``tessera.inventory.vendor_devices``, from the vendor
table), and ``simulate``, ``explain`` and ``lint`` plan NVIDIA and Ascend devices together,
with HAMi's pods of both vendors converted by the one conversion and placed by the one
allocator. Inputs: ``src/tessera/examples`` (``mixed-fleet/``, SOURCES.md) and the vendors'
own manifests and slices in ``tests/data/vendors``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tessera.api.deviceclass import vendor_device_class
from tessera.api.loader import Manifest, Source, load_file, load_files, parse_documents
from tessera.api.vendors import AMD, ASCEND, HYGON, vendor_of_driver
from tessera.cli import main
from tessera.cli._common import examples_dir
from tessera.inventory import InventoryError
from tessera.inventory.vendor_devices import (
    detect_vendor_format,
    load_vendor_inventory,
    parse_npu_smi_info,
    vendor_resource_slices,
)
from tessera.lint import lint
from tessera.sim.cluster import load_cluster
from tessera.sim.simulate import Simulation

EXAMPLES = examples_dir()
NPU_SMI = EXAMPLES / "vendor-inventories" / "ms-swift__npu-support__npu-smi-info.8xAscend910B3.txt"
A5000 = EXAMPLES / "inventories" / "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"
VENDORS = Path(__file__).resolve().parents[1] / "data" / "vendors"
GiB = 2**30


def manifests(text: str) -> list[Manifest]:
    return [Manifest(o, Source("test.yaml", d)) for d, o in parse_documents(text, "test.yaml")]


def one(path: Path) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return doc


# ---- npu-smi info: a real 8x Ascend 910B3 capture -------------------------------------------
def test_npu_smi_info_reads_every_npu_of_the_capture() -> None:
    devs = load_vendor_inventory(NPU_SMI)
    assert detect_vendor_format(NPU_SMI.read_text()) == "npu-smi-info"
    assert [(d.index, d.chip, d.product_name, d.health) for d in devs] == [
        (i, 0, "910B3", "OK") for i in range(8)
    ]
    # HBM-Usage(MB) 3318 / 65536: the total is the memory
    assert {d.memory_bytes for d in devs} == {65536 * 2**20}
    assert [d.bus_id for d in devs] == [
        "0000:c1:00.0",
        "0000:c2:00.0",
        "0000:81:00.0",
        "0000:82:00.0",
        "0000:01:00.0",
        "0000:02:00.0",
        "0000:41:00.0",
        "0000:42:00.0",
    ]
    # npu-smi info prints no compute-unit count and no UUID: none is made up
    assert {d.compute_units for d in devs} == {None}
    assert {d.vendor for d in devs} == {ASCEND}


def test_npu_smi_without_a_chip_row_is_refused_naming_the_line() -> None:
    lines = NPU_SMI.read_text().splitlines()
    cut = "\n".join(lines[:7] + lines[9:])  # NPU 0's chip row (and its rule) removed
    with pytest.raises(InventoryError) as e:
        parse_npu_smi_info(cut, "cut.txt")
    assert str(e.value) == (
        "cut.txt:7: Chip: NPU 0 has no chip row (Chip | Bus-Id | ... HBM-Usage(MB))"
    )


def test_the_npu_slices_have_the_ascend_drivers_shape() -> None:
    (built,) = vendor_resource_slices("npu-node-1", load_vendor_inventory(NPU_SMI))
    driver_own = one(VENDORS / "ascend-dra-driver" / "resourceslice-310p3.yaml")
    assert built["spec"]["driver"] == ASCEND.driver == driver_own["spec"]["driver"]
    assert built["metadata"]["name"] == driver_own["metadata"]["name"]
    dev, ref = built["spec"]["devices"][0], driver_own["spec"]["devices"][0]
    assert dev["name"] == ref["name"] == "npu-0-0"
    assert dev["attributes"].keys() == ref["attributes"].keys()
    assert dev["attributes"]["uuid"] == ref["attributes"]["uuid"] == {"string": "npu-node-1-0"}
    assert dev["attributes"]["productName"] == {"string": "910B3"}
    assert dev["attributes"]["type"] == ref["attributes"]["type"]
    assert dev["capacity"]["cores"] == ref["capacity"]["cores"]
    assert dev["capacity"]["memory"] == {
        "value": "64Gi",
        "requestPolicy": {
            "default": "64Gi",
            "validRange": {"min": "1Mi", "max": "64Gi", "step": "1Mi"},
        },
    }
    assert len(built["spec"]["devices"]) == 8


def test_vendor_device_classes_are_the_drivers_own() -> None:
    for v, path in (
        (HYGON, VENDORS / "hcu-dra-driver" / "deviceclass.yaml"),
        (ASCEND, VENDORS / "hami-dra" / "deviceclass-hami-vnpu-core.yaml"),
    ):
        own = one(path)
        ours = vendor_device_class(v)
        assert ours["metadata"]["name"] == own["metadata"]["name"]
        (o,), (w,) = own["spec"]["selectors"], ours["spec"]["selectors"]
        assert " ".join(o["cel"]["expression"].split()) == w["cel"]["expression"]
    # AMD's chart writes its class for resource.k8s.io/v1beta1, its string in single quotes
    own = one(VENDORS / "amd-gpu-dra-driver" / "deviceclass.yaml")
    ours = vendor_device_class(AMD)
    assert ours["metadata"] == own["metadata"] == {"name": "gpu.amd.com"}
    (o,), (w,) = own["spec"]["selectors"], ours["spec"]["selectors"]
    assert o["cel"]["expression"].replace("'", '"') == w["cel"]["expression"]


# ---- simulate: the mixed-fleet example -------------------------------------------------------
def mixed() -> Simulation:
    cluster = load_cluster(EXAMPLES / "mixed-fleet" / "cluster.yaml")
    return Simulation(cluster, load_file(EXAMPLES / "mixed-fleet" / "pods.yaml"))


def test_the_mixed_node_publishes_gpus_and_npus_from_their_inventories() -> None:
    cluster = load_cluster(EXAMPLES / "mixed-fleet" / "cluster.yaml")
    node = cluster.nodes[0]
    assert node.name == "a5000-ascend-node"
    by_driver = {s["spec"]["driver"]: len(s["spec"]["devices"]) for s in node.slices}
    assert by_driver == {"gpu.tessera.dev": 2, "ascend.project-hami.io": 8}
    assert [n.name for n in cluster.nodes] == ["a5000-ascend-node", "h100-node", "ascend-node"]


def test_mixed_fleet_places_hami_pods_of_both_vendors() -> None:
    sim = mixed()
    assert "hami-vnpu-core.project-hami.io" in sim.classes  # the driver's class, added
    res = sim.run()
    got = {(p.pod, p.device, p.memory, p.cores) for p in res.placements}
    npu0 = "ascend.project-hami.io/a5000-ascend-node/npu-0-0"
    # HAMi's job-910B3: 2000 MiB rounds up to vir05_1c_16g (16 GiB, 5 of 20 AICores = 25 %)
    assert ("default/ascend910b3-job", npu0, "16Gi", "25") in got
    # soft split: memory as asked, the -core percentage as asked, on the same NPU
    assert ("default/npu-soft-share", npu0, "20000Mi", "30") in got
    # one container, both vendors: the node that has both
    both = sorted((p.device, p.memory, p.cores) for p in res.placements if p.pod.endswith("npu"))
    assert both == [
        ("ascend.project-hami.io/a5000-ascend-node/npu-1-0", "32Gi", "50"),
        ("gpu.tessera.dev/a5000-ascend-node/gpu-0", "16000Mi", "50"),
    ]
    train = {p.device for p in res.placements if p.pod == "default/npu-train-a"}
    assert train == {f"ascend.project-hami.io/ascend-node/npu-{i}-0" for i in range(8)}
    (pending,) = res.pending
    assert pending.pod == "default/npu-train-b"
    # the reason names the NPU's capacity in its unit, and what is left where
    assert (
        "needs 8 devices with cores 100 (percent of the NPU's AICores) and memory 64Gi"
        in pending.reason
    )
    assert (
        "cores (percent of the NPU's AICores) short on 10 NPUs (most free: 50 of 100, on "
        "a5000-ascend-node/npu-1-0; needs 100); 6 NPUs fit on their own, at most 6 on one node, "
        "8 needed on one node" in pending.reason
    )


def test_without_the_npu_inventory_the_ascend_pods_stay_as_written() -> None:
    cluster = load_cluster(EXAMPLES / "cluster.yaml")  # NVIDIA only
    sim = Simulation(cluster, load_file(EXAMPLES / "mixed-fleet" / "pods.yaml"))
    res = sim.run()
    assert not [p for p in res.placements if p.device.startswith("ascend.")]
    assert any(
        "huawei.com/Ascend910B3, huawei.com/Ascend910B3-memory: the cluster has no DRA driver "
        "ascend.project-hami.io" in w
        for w in res.warnings
    )


def test_hygon_slices_four_shares_per_card_the_fifth_refused() -> None:
    """The HCU driver's ``slices``: 4 per card, each allocation consumes its default 1. Upstream's
    consumable capacity does exactly that: the fifth share of a K100_AI is refused, in its unit."""
    slices = load_file(VENDORS / "hcu-dra-driver" / "resourceslice-k100-ai.yaml")
    pods = "---\n".join(
        f"""apiVersion: v1
kind: Pod
metadata: {{name: dcu-{i}, namespace: ns}}
spec:
  containers:
  - name: c
    image: x
    resources:
      limits: {{hygon.com/dcunum: 1, hygon.com/dcumem: 2000, hygon.com/dcucores: 10}}
"""
        for i in range(5)
    )
    from tessera.sim.cluster import Cluster, SimNode

    cluster = Cluster([SimNode("hcu-node-1", {}, [m.obj for m in slices], "k100")], "x")
    res = Simulation(cluster, manifests(pods)).run()
    # 10 % of 120 CUs = 12 CUs each, 1 vHCU slice each
    assert [(p.pod, p.memory, p.cores) for p in res.placements] == [
        (f"ns/dcu-{i}", "2000Mi", "12") for i in range(4)
    ]
    (pending,) = res.pending
    assert pending.pod == "ns/dcu-4"
    assert (
        "needs 1 device with memory 2000Mi, cores 12 (compute units (CUs) of the card) and "
        "slices 1 (virtual HCUs) (the request names no slices, so the request policy's default "
        "applies)" in pending.reason
    )
    assert (
        "slices (virtual HCUs) short on hcu-node-1/hcu-0000-1c-00-0: 0 free of 4, needs 1"
        in pending.reason
    )
    assert vendor_of_driver("dra.hygon.com") is HYGON


def test_cli_simulate_output_of_the_mixed_fleet_example() -> None:
    r = CliRunner().invoke(
        main,
        [
            "simulate",
            "--cluster",
            str(EXAMPLES / "mixed-fleet" / "cluster.yaml"),
            str(EXAMPLES / "mixed-fleet" / "pods.yaml"),
            "-o",
            "wide",
        ],
    )
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "NPUs of ascend.project-hami.io: cores are percent of the NPU's AICores" in out
    assert "5 pod(s) scheduled, 1 pending." in out
    # no CUDA context on an NPU: no "allocatable" figure there
    rows = [ln.split() for ln in r.output.splitlines() if "ascend910b3-job" in ln]
    assert rows and rows[0][-2] == "-" and rows[0][-1] == "910B3"


def test_explain_names_the_npu_capacity_in_its_unit() -> None:
    r = CliRunner().invoke(
        main,
        [
            "explain",
            "default/npu-train-b",
            "--cluster",
            str(EXAMPLES / "mixed-fleet" / "cluster.yaml"),
            str(EXAMPLES / "mixed-fleet" / "pods.yaml"),
        ],
    )
    out = " ".join(r.output.split())
    assert "Pod default/npu-train-b: pending" in out
    assert (
        "request npu wants 8 devices with cores 100 (percent of the NPU's AICores) and memory "
        "64Gi" in out
    )
    assert "(class hami-vnpu-core.project-hami.io)" in out


# ---- lint -----------------------------------------------------------------------------------
def test_lint_checks_the_vendors_values_and_passes_their_examples() -> None:
    examples = sorted((VENDORS / "hami-examples").rglob("*.yaml"))
    assert lint(load_files(examples)) == []
    bad = """apiVersion: v1
kind: Pod
metadata: {name: bad910c}
spec:
  containers:
  - name: c
    image: x
    resources:
      limits: {huawei.com/Ascend910C: 3}
---
apiVersion: v1
kind: Pod
metadata: {name: bigb3}
spec:
  containers:
  - name: c
    image: x
    resources:
      limits: {huawei.com/Ascend910B3: 1, huawei.com/Ascend910B3-memory: 70000}
"""
    found = [f"{f.field}: {f.problem}" for f in lint(manifests(bad))]
    assert found == [
        "spec.containers[0].resources[huawei.com/Ascend910C]: huawei.com/Ascend910C 3: "
        "Ascend910C NPUs are allocated in pairs (one module)",
        "spec.containers[0].resources[huawei.com/Ascend910B3-memory]: "
        "huawei.com/Ascend910B3-memory 70000 is more than an Ascend910B3 holds (65536 MiB)",
    ]


# ---- the cluster file ------------------------------------------------------------------------
def test_a_cluster_file_with_an_nvidia_file_as_vendor_inventory_is_refused(
    tmp_path: Path,
) -> None:
    shutil.copy(A5000, tmp_path / "a5000.xml")
    (tmp_path / "c.yaml").write_text(
        "apiVersion: tessera.dev/v1alpha1\nkind: Cluster\nnodes:\n"
        "- name: n\n  vendorInventories: [a5000.xml]\n"
    )
    with pytest.raises(Exception) as e:
        load_cluster(tmp_path / "c.yaml")
    assert "nodes[0].vendorInventories[0]" in str(e.value)
    assert "give `npu-smi info` output or" in str(e.value)
    (tmp_path / "c.yaml").write_text(
        "apiVersion: tessera.dev/v1alpha1\nkind: Cluster\nnodes:\n- name: n\n  labels: {}\n"
    )
    with pytest.raises(Exception) as e:
        load_cluster(tmp_path / "c.yaml")
    assert "'vendorInventories' (other vendors' inventories: npu-smi info, rocm-smi --json)" in str(
        e.value
    )


def test_the_docs_show_the_real_simulate_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cluster-file.md's mixed-fleet output is what the command prints."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "cluster-file.md").read_text()
    shown = doc.split("mixed-fleet/pods.yaml` prints (exit 0):\n\n```text\n", 1)[1]
    shown = shown.split("\n```", 1)[0]
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.setenv("COLUMNS", "100")
    r = CliRunner().invoke(
        main, ["simulate", "--cluster", "mixed-fleet/cluster.yaml", "mixed-fleet/pods.yaml"]
    )
    assert r.exit_code == 0, r.output
    assert r.output.rstrip("\n") == shown


def test_the_sm_count_is_published_where_the_inventory_gives_it() -> None:
    """``multiprocessors`` (Tessera's row of the vendor table) on MIG devices, whose nvidia-smi
    record prints it (telegraf's A100: 14 SMs each); never on a whole GPU, whose inventories
    (nvidia-smi -q, -q -x) print none."""
    from tessera.api.vendors import TESSERA

    assert "multiprocessors" in TESSERA.attributes
    cluster = load_cluster(EXAMPLES / "cluster.yaml")
    seen = {
        (n.name, d["attributes"]["type"]["string"], str(d["attributes"].get("multiprocessors")))
        for n in cluster.nodes
        for s in n.slices
        for d in s["spec"]["devices"]
    }
    assert seen == {
        ("a100-mig-node", "mig", "{'int': 14}"),
        ("h100-node", "gpu", "None"),
        ("v100s-node", "gpu", "None"),
        ("a5000-node", "gpu", "None"),
    }


# ---- AMD: rocm-smi --json (telegraf's real 4x MI100 capture) ---------------------------------
ROCM_SMI = (
    EXAMPLES / "vendor-inventories" / "telegraf__amd_rocm_smi_testdata__mi100_rocm602.4xMI100.json"
)


def test_rocm_smi_json_reads_the_four_mi100_and_lacks_what_it_lacks() -> None:
    devs = load_vendor_inventory(ROCM_SMI)
    assert [(d.index, d.bus_id, d.memory_bytes) for d in devs] == [
        (0, "0000:83:00.0", 34342961152),
        (1, "0000:a3:00.0", 34342961152),
        (2, "0000:c3:00.0", 34342961152),
        (3, "0000:e3:00.0", 34342961152),
    ]
    (built,) = vendor_resource_slices("amd-node", devs)
    assert built["spec"]["driver"] == "gpu.amd.com"
    dev = built["spec"]["devices"][0]
    assert dev == {
        "name": "gpu-0",
        "attributes": {
            "type": {"string": "amdgpu"},
            "cardIndex": {"int": 0},
            "pciAddr": {"string": "0000:83:00.0"},
            "deviceID": {"string": "0x738c"},
            "productName": {"string": "Arcturus GL-XL [Instinct MI100]"},
            "driverVersion": {"version": "6.3.6"},
        },
        # rocm-smi prints no CU or SIMD counts: computeUnits / simdUnits are not published
        "capacity": {"memory": {"value": "32752Mi"}},
    }


def test_an_amd_node_beside_nvidia_takes_dra_native_claims_for_its_driver(
    tmp_path: Path,
) -> None:
    (tmp_path / "c.yaml").write_text(
        "apiVersion: tessera.dev/v1alpha1\nkind: Cluster\nnodes:\n"
        f"- name: a5000-node\n  inventory: {A5000}\n"
        f"- name: mi100-node\n  vendorInventories: [{ROCM_SMI}]\n"
    )
    pods = "---\n".join(
        f"""apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: amd-{n}, namespace: ns}}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.amd.com
        count: {n}
        selectors:
        - cel:
            expression: device.capacity["gpu.amd.com"].memory.compareTo(quantity("30Gi")) >= 0
---
apiVersion: v1
kind: Pod
metadata: {{name: amd-{n}, namespace: ns}}
spec:
  resourceClaims: [{{name: gpu, resourceClaimName: amd-{n}}}]
  containers: [{{name: c, image: x, resources: {{claims: [{{name: gpu}}]}}}}]
"""
        for n in (3, 2)
    )
    sim = Simulation(load_cluster(tmp_path / "c.yaml"), manifests(pods))
    assert "gpu.amd.com" in sim.classes  # AMD's DeviceClass, added for its devices
    res = sim.run()
    assert sorted({p.device for p in res.placements if p.pod == "ns/amd-3"}) == [
        f"gpu.amd.com/mi100-node/gpu-{i}" for i in range(3)
    ]
    (pending,) = res.pending
    assert pending.pod == "ns/amd-2"
    assert "0/2 nodes are available: 2 cannot allocate all claims." in pending.reason
    assert "needs 2 devices with memory 32752Mi" in pending.reason
    assert "in use (allocated whole to another claim)" in pending.reason
