"""Inventories of new or unusual hardware: read, published with what is known, warned about.

Real inputs where the corpus has them (MIG-mode GPUs in ``--query-gpu`` CSV and XML, a GPU
passed through to a VM). The corpus has no capture of a unified-memory GPU: the GB10 inputs in
``tests/data/new-hardware`` are small texts of the shape public reports show, every value traced
to them in its ``SOURCES.md`` (nvtop#466, llama-swap#782, ArcticTraining#345, gpud#1170).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from corpus_paths import corpus_path
from tessera.api.slice_validation import validate_resource_slice
from tessera.cli import main
from tessera.inventory import (
    MissingFieldError,
    build_resource_slices,
    capture,
    parse_inventory,
    publication_warnings,
)

CORPUS = corpus_path()
GB10_UUID = "GPU-2dee1e25-b3b5-007e-2b55-79f2d0f2ebe5"

DATA = Path(__file__).resolve().parents[1] / "data" / "new-hardware"
GB10_Q = (DATA / "gb10-dgx-spark.nvidia-smi-q.txt").read_text()
GB10_XML = (DATA / "gb10-dgx-spark.nvidia-smi-q-x.xml").read_text()
GB10_CSV = (DATA / "gb10-dgx-spark.query-gpu.csv").read_text()


def inv(name: str) -> str:
    return (CORPUS / "inventories" / name).read_text()


def devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"]["devices"]}


@pytest.mark.parametrize(
    ("text", "reported"), [(GB10_Q, "N/A"), (GB10_XML, "N/A"), (GB10_CSV, "[N/A]")]
)
def test_unified_memory_gpu_is_read_with_memory_unknown(text: str, reported: str) -> None:
    (gpu,) = parse_inventory(text, "spark.txt")
    assert (gpu.uuid, gpu.product_name, gpu.pcie_bus_id) == (
        GB10_UUID,
        "NVIDIA GB10",
        "000f:01:00.0",
    )
    assert (gpu.memory_bytes, gpu.memory_reported) == (None, reported)
    assert (gpu.architecture, gpu.cuda_compute_capability) == ("Blackwell", "12.1")


def test_unified_memory_gpu_is_published_as_a_dedicated_whole_gpu() -> None:
    gpus = parse_inventory(GB10_Q, "spark.txt")
    slices = build_resource_slices("spark", gpus)
    assert all(validate_resource_slice(s) == [] for s in slices)
    (dev,) = devices(slices).values()
    assert dev["name"] == "gpu-0"
    assert "allowMultipleAllocations" not in dev  # dedicated: one claim at a time
    assert dev["capacity"] == {"cores": {"value": "100"}}  # no memory figure, no memory capacity
    assert dev["attributes"]["uuid"] == {"string": GB10_UUID}
    assert dev["attributes"]["cudaComputeCapability"] == {"version": "12.1.0"}
    assert dev["attributes"]["driverVersion"] == {"version": "580.126.9"}
    assert publication_warnings(gpus, "spark.txt") == [
        f"spark.txt: GPU 0 ({GB10_UUID}, NVIDIA GB10): memory total is N/A (unified memory, or not "
        "reported), so gpu-0 is published as a dedicated device without a memory capacity: "
        "whole-GPU claims can use it, memory shares cannot"
    ]


def test_absent_or_garbled_memory_is_still_an_error() -> None:
    with pytest.raises(
        MissingFieldError, match=r"memory\.total: GPU 0 .*'lots' is not a MiB count"
    ):
        parse_inventory(
            GB10_Q.replace("Total                             : N/A", "Total : lots", 1), "x.txt"
        )


def test_vgpu_guest_reads_the_gpu_not_the_licensed_product() -> None:
    # A vGPU guest's -q nests a second "Product Name" under "vGPU Software Licensed Product"
    # (NVIDIA/gpu-operator#220); shown here on the corpus A10 with its virtualization mode set.
    text = inv("gpud__nvidia-query_testdata__nvidia-smi-q.535.129.03.A10.txt")
    text = text.replace(
        "Virtualization Mode               : Pass-Through",
        "Virtualization Mode               : VGPU",
    )
    text = text.replace(
        "    GPU Reset Status\n",
        "    vGPU Software Licensed Product\n"
        "        Product Name                      : NVIDIA Virtual Compute Server\n"
        "        License Status                    : Unlicensed\n"
        "    GPU Reset Status\n",
        1,
    )
    assert "Virtual Compute Server" in text and ": VGPU" in text
    (gpu,) = parse_inventory(text, "vgpu.txt")
    assert (gpu.product_name, gpu.memory_bytes) == ("NVIDIA A10", 23028 << 20)
    assert publication_warnings([gpu], "vgpu.txt") == []


def _mig_csv() -> str:
    """The real ``--query-gpu`` CSV of an H100 in MIG mode (nvidia_gpu_exporter capture)."""
    text = inv(
        "nvidia_gpu_exporter__internal_captures__linux-x86_64__nvidia-h100-mig__590.48.01.capture.txt"
    )
    sec = capture.find(capture.sections(text), "query-gpu (csv")
    assert sec is not None
    return sec.body


def test_mig_mode_gpu_in_csv_is_not_dropped_silently() -> None:
    (gpu,) = parse_inventory(_mig_csv(), "h100-mig.csv")
    assert gpu.mig_enabled and gpu.mig_devices == () and gpu.memory_bytes == 81559 << 20
    assert devices(build_resource_slices("n", [gpu])) == {}  # a MIG-mode GPU cannot run work whole
    (w,) = publication_warnings([gpu], "h100-mig.csv")
    assert w.startswith(
        f"h100-mig.csv: GPU 0 ({gpu.uuid}, NVIDIA H100 80GB HBM3) is in MIG mode but the inventory lists no MIG device"
    )
    assert "capture `nvidia-smi -q -x`" in w


def test_mig_mode_gpu_in_xml_without_instances_is_warned_about() -> None:
    text = inv("netdata-go.d.plugin__nvidia_smi_testdata__a100-sxm4-mig.xml")
    # As nvidia-smi prints a GPU with no MIG device (see the GTX 950 XML in
    # b3rs3rk/gpustat-unraid#19): <mig_devices> holds the text "None".
    text = re.sub(
        r"<mig_devices>.*</mig_devices>",
        "<mig_devices>\n            None\n        </mig_devices>",
        text,
        flags=re.S,
    )
    (gpu,) = parse_inventory(text, "a100.xml")
    assert gpu.mig_enabled and gpu.mig_devices == ()
    assert len(publication_warnings([gpu], "a100.xml")) == 1
    # With its MIG devices (the file as captured) nothing is missing.
    full = parse_inventory(
        inv("netdata-go.d.plugin__nvidia_smi_testdata__a100-sxm4-mig.xml"), "a100.xml"
    )
    assert publication_warnings(full, "a100.xml") == []


POD = """apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  containers:
  - name: c
    image: x
    resources: {{limits: {{{res}}}}}
"""


def test_whole_gpu_lands_on_gb10_memory_share_does_not(tmp_path: Path) -> None:
    spark = tmp_path / "spark.txt"
    spark.write_text(GB10_Q)
    a10 = CORPUS / "inventories" / "gpud__nvidia-query_testdata__nvidia-smi-q.535.129.03.A10.txt"
    pods = tmp_path / "pods.yaml"
    pods.write_text(
        "---\n".join(
            [
                POD.format(name="whole", res="nvidia.com/gpu: 1"),
                POD.format(name="share", res="nvidia.com/gpu: 1, nvidia.com/gpumem: 30000"),
                POD.format(name="half", res="nvidia.com/gpu: 1, nvidia.com/gpumem-percentage: 50"),
                POD.format(name="whole-2", res="nvidia.com/gpu: 1"),
            ]
        )
    )
    r = CliRunner().invoke(
        main,
        ["simulate", "--node", f"spark={spark}", "--node", f"a10={a10}", str(pods), "-o", "json"],
    )
    assert r.exit_code == 0, r.stderr
    assert (
        "spark.txt: GPU 0 (GPU-2dee1e25-b3b5-007e-2b55-79f2d0f2ebe5, NVIDIA GB10): memory total is N/A"
        in r.stderr
    )
    items = json.loads(r.stdout)["items"]
    pods_out = {o["metadata"]["name"]: o for o in items if o["kind"] == "Pod"}
    claims = {o["metadata"]["name"]: o for o in items if o["kind"] == "ResourceClaim"}
    # The whole-GPU pod gets the GB10 to itself (dedicated: no shareID, no consumedCapacity).
    assert pods_out["whole"]["spec"]["nodeName"] == "spark"
    (res,) = claims["whole-c-gpu"]["status"]["allocation"]["devices"]["results"]
    assert (res["pool"], res["device"]) == ("spark", "gpu-0") and "shareID" not in res
    # 30000 MiB fits no GPU with a memory figure (the A10 publishes 22516 MiB: 23028 MiB less the
    # driver's 512 MiB) and the GB10 has none.
    assert "nodeName" not in pods_out["share"]["spec"]
    # (The GB10 is refused first as in use: the allocator checks that before capacity.)
    assert pods_out["share"]["status"]["conditions"][0]["message"].endswith(
        "1 GPU can never hold it (memory 30000Mi is more than any of them has: the largest has 22516Mi, a10/gpu-0); "
        "1 GPU in use (allocated whole to another claim)"
    )
    # A percentage resolves against the sizes that are known: half of the A10's 22516Mi.
    (res,) = claims["half-c-gpu"]["status"]["allocation"]["devices"]["results"]
    assert (res["pool"], res["consumedCapacity"]["memory"]) == ("a10", "11258Mi")
    # A second whole-GPU pod finds the GB10 handed out (dedicated) and the A10 shared.
    assert "nodeName" not in pods_out["whole-2"]["spec"]
    reason = pods_out["whole-2"]["status"]["conditions"][0]["message"]
    assert reason.startswith("0/2 nodes are available: 2 cannot allocate all claims.")
    # As whole GPUs (--compare), a memory request becomes a guarded selector: no CEL error on
    # the GB10, which has no memory capacity to compare.
    r = CliRunner().invoke(
        main,
        [
            "simulate",
            "--node",
            f"spark={spark}",
            "--node",
            f"a10={a10}",
            str(pods),
            "--compare",
            "-o",
            "json",
        ],
    )
    assert r.exit_code == 0, r.stderr
    whole = json.loads(r.stdout)[-1]
    assert (whole["allocation"], whole["pending"]) == (
        "whole GPUs",
        ["default/share", "default/whole-2"],
    )


def test_explain_says_the_gb10_has_no_memory_capacity(tmp_path: Path) -> None:
    spark = tmp_path / "spark.txt"
    spark.write_text(GB10_Q)
    pods = tmp_path / "pods.yaml"
    pods.write_text(POD.format(name="share", res="nvidia.com/gpu: 1, nvidia.com/gpumem: 4096"))
    r = CliRunner().invoke(
        main, ["explain", "share", "--node", f"spark={spark}", str(pods), "-o", "json"]
    )
    assert r.exit_code == 0, r.stderr
    assert "has no capacity memory (it publishes: cores)" in r.stdout


def test_cluster_file_inventory_warnings_reach_stderr(tmp_path: Path) -> None:
    (tmp_path / "spark.txt").write_text(GB10_Q)
    cluster = {
        "apiVersion": "tessera.dev/v1alpha1",
        "kind": "Cluster",
        "nodes": [{"name": "spark", "inventory": "spark.txt"}],
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cluster))
    pods = tmp_path / "p.yaml"
    pods.write_text(POD.format(name="whole", res="nvidia.com/gpu: 1"))
    r = CliRunner().invoke(main, ["simulate", "--cluster", str(tmp_path / "c.yaml"), str(pods)])
    assert r.exit_code == 0, r.stderr
    assert r.stderr.startswith(
        f"tessera: warning: {tmp_path / 'c.yaml'}: node spark: spark.txt: GPU 0 ("
    )
    assert "1 pod(s) scheduled, 0 pending." in r.stdout
