"""Exact values read from real corpus inventories and topologies, and the error behaviour."""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from corpus_paths import corpus_path
from tessera.api.slice_validation import validate_resource_slice
from tessera.inventory import (
    GPU,
    InventoryError,
    MalformedInputError,
    MissingFieldError,
    SliceBuildError,
    Topology,
    UnsupportedFormatError,
    build_resource_slices,
    load_inventory,
    load_topology,
    parse_inventory,
    parse_topology,
)
from tessera.inventory.model import derive_architecture, normalize_bus_id, pcie_root_of, to_semver

CORPUS = corpus_path()
H100_Q = "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
V100S_XML = "datakit__nvidiasmi_testdata__gtx-8card.8xV100S-PCIE-32GB.xml"
A5000_XML = "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"
A100_MIG_XML = "netdata-go.d.plugin__nvidia_smi_testdata__a100-sxm4-mig.xml"
H100_MIG_CAPTURE = (
    "nvidia_gpu_exporter__internal_captures__linux-x86_64__nvidia-h100-mig__590.48.01.capture.txt"
)
RTX4080_CAPTURE = "nvidia_gpu_exporter__internal_captures__linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.capture.txt"  # noqa: E501
HAMI = "HAMi__docs_develop_protocol__node-register-annotations.2xV100-PCIE-32GB.txt"


def inv_text(name: str) -> str:
    path = CORPUS / "inventories" / name
    assert path.is_file(), f"corpus file missing: {path} (set TESSERA_CORPUS)"
    return path.read_text(encoding="utf-8")


def inventory(name: str) -> list[GPU]:
    return parse_inventory(inv_text(name), name)


def topology(name: str) -> Topology:
    path = CORPUS / "topologies" / name
    assert path.is_file(), f"corpus file missing: {path} (set TESSERA_CORPUS)"
    return parse_topology(path.read_text(encoding="utf-8"), name)


def devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    for s in slices:
        assert validate_resource_slice(s) == []
    return {d["name"]: d for s in slices for d in s["spec"]["devices"]}


def attr(dev: dict[str, Any], name: str) -> Any:
    (value,) = dev["attributes"][name].values()
    return value


# ---- inventories -------------------------------------------------------------------------


def test_h100_q_text_exact_values() -> None:
    gpus = inventory(H100_Q)
    assert len(gpus) == 8
    devs = devices(build_resource_slices("h100-node", gpus))
    assert list(devs) == [f"gpu-{i}" for i in range(8)]
    g0, g7 = devs["gpu-0"], devs["gpu-7"]
    assert attr(g0, "uuid") == "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"
    assert attr(g7, "uuid") == "GPU-b0fe4996-1f7c-91f6-0ccd-08ae3b7e23c5"
    assert attr(g0, "productName") == "NVIDIA H100 80GB HBM3"
    assert attr(g0, "architecture") == "Hopper"
    assert attr(g0, "cudaComputeCapability") == "9.0.0"
    assert attr(g0, "driverVersion") == "535.161.8"
    assert attr(g0, "cudaDriverVersion") == "12.2.0"
    assert attr(g0, "pcieBusID") == "0000:19:00.0"
    assert attr(g7, "pcieBusID") == "0000:db:00.0"
    assert "resource.kubernetes.io/pcieRoot" not in g0["attributes"]  # bus 19: root unknown
    assert "numaNode" not in g0["attributes"] and "nvlinkDomain" not in g0["attributes"]
    assert g0["allowMultipleAllocations"] is True
    assert g0["capacity"] == {
        "memory": {  # 81559 MiB less the 551 MiB the driver reserves
            "value": "81008Mi",
            "requestPolicy": {"default": "81008Mi", "validRange": {"min": "1Mi", "step": "1Mi"}},
        },
        "cores": {
            "value": "100",
            "requestPolicy": {
                "default": "0",
                "validRange": {"min": "0", "max": "100", "step": "1"},
            },
        },
    }
    assert gpus[0].memory_bytes == 81559 * 1048576
    # "Reserved : 551 MiB": the driver's and firmware's, left out of the published capacity
    assert (gpus[0].memory_reserved_bytes, gpus[0].usable_memory_bytes) == (
        551 * 1048576,
        81008 * 1048576,
    )
    assert gpus[0].driver_version == "535.161.08"


def test_v100s_xml_exact_values() -> None:
    gpus = inventory(V100S_XML)
    assert [g.pcie_bus_id for g in gpus] == [f"0000:00:{b:02x}.0" for b in range(0x0D, 0x15)]
    devs = devices(build_resource_slices("v100s-node", gpus))
    assert len(devs) == 8
    g0, g7 = devs["gpu-0"], devs["gpu-7"]
    assert attr(g0, "uuid") == "GPU-76098dc1-d3bc-9a1b-7ea6-f7b48837829e"
    assert attr(g7, "uuid") == "GPU-1d955959-c95b-4f40-2cac-100d3006ffe2"
    assert attr(g0, "productName") == "Tesla V100S-PCIE-32GB"
    assert attr(g0, "architecture") == "Volta"  # derived: driver 460 XML has no architecture
    assert attr(g0, "cudaComputeCapability") == "7.0.0"
    assert attr(g0, "driverVersion") == "460.73.1"
    assert attr(g0, "resource.kubernetes.io/pcieRoot") == "pci0000:00"
    assert g0["capacity"]["memory"]["value"] == "32510Mi"


def test_dual_a5000_xml() -> None:
    gpus = inventory(A5000_XML)
    assert [(g.index, g.uuid, g.pcie_bus_id, g.memory_bytes) for g in gpus] == [
        (0, "GPU-12345678-aaaa-bbbb-cccc-0123456789ab", "0000:81:00.0", 24564 << 20),
        (1, "GPU-12345678-aaaa-bbbb-cccc-0123456789cd", "0000:c1:00.0", 24564 << 20),
    ]
    devs = devices(build_resource_slices("a5000-node", gpus))
    assert attr(devs["gpu-1"], "driverVersion") == "590.44.1"
    assert attr(devs["gpu-1"], "cudaComputeCapability") == "8.6.0"
    assert devs["gpu-1"]["capacity"]["memory"]["value"] == "24114Mi"  # less 450 MiB reserved


# `nvidia-smi --query-gpu=index,uuid,name,memory.free,memory.total,pci.bus_id,driver_version,compute_cap
# --format=csv` on a two-GPU GTX 1080 Ti host (the corpus has no --query-gpu capture with uuid and
# memory.total). Rows as a sampling loop may print them: not in index order; memory.free before
# memory.total, and smaller.
GTX1080TI_CSV = """\
index, uuid, name, memory.free [MiB], memory.total [MiB], pci.bus_id, driver_version, compute_cap
1, GPU-5d2a8e1c-1f0b-7c43-9e1a-3b8f2d6c4a11, NVIDIA GeForce GTX 1080 Ti, 11170 MiB, 11264 MiB, 00000000:02:00.0, 535.161.08, 6.1
0, GPU-5d2a8e1c-1f0b-7c43-9e1a-3b8f2d6c4a10, NVIDIA GeForce GTX 1080 Ti, 8264 MiB, 11264 MiB, 00000000:01:00.0, 535.161.08, 6.1
"""  # noqa: E501


def test_query_gpu_csv_exact_values() -> None:
    gpus = parse_inventory(GTX1080TI_CSV, "gtx1080ti.csv")
    assert [(g.index, g.uuid, g.pcie_bus_id, g.memory_bytes) for g in gpus] == [
        (0, "GPU-5d2a8e1c-1f0b-7c43-9e1a-3b8f2d6c4a10", "0000:01:00.0", 11264 << 20),
        (1, "GPU-5d2a8e1c-1f0b-7c43-9e1a-3b8f2d6c4a11", "0000:02:00.0", 11264 << 20),
    ]
    assert {
        (g.product_name, g.architecture, g.cuda_compute_capability, g.driver_version) for g in gpus
    } == {("NVIDIA GeForce GTX 1080 Ti", "Pascal", "6.1", "535.161.08")}
    devs = devices(build_resource_slices("gtx", gpus))
    assert sorted(devs) == ["gpu-0", "gpu-1"]
    assert attr(devs["gpu-0"], "uuid") == "GPU-5d2a8e1c-1f0b-7c43-9e1a-3b8f2d6c4a10"
    assert attr(devs["gpu-1"], "index") == 1
    assert devs["gpu-0"]["capacity"]["memory"]["value"] == "11Gi"


def test_a100_mig_xml_publishes_dedicated_mig_devices_only() -> None:
    (gpu,) = inventory(A100_MIG_XML)
    assert gpu.mig_enabled and gpu.memory_bytes == 40960 << 20
    assert [(m.gpu_instance_id, m.compute_instance_id, m.memory_bytes >> 20, m.sm_count)
            for m in gpu.mig_devices] == [(1, 0, 19968, 42), (2, 0, 19968, 42)]  # fmt: skip
    devs = devices(build_resource_slices("a100-node", [gpu]))
    assert list(devs) == ["gpu-0-mig-1-0", "gpu-0-mig-2-0"]
    mig = devs["gpu-0-mig-1-0"]
    assert "allowMultipleAllocations" not in mig
    # `cores` 100 = all of the instance's own SMs, so claims that name cores (every converted
    # HAMi claim) match it; dedicated, so it is a filter. The SM count is an attribute.
    assert mig["capacity"] == {"memory": {"value": "19968Mi"}, "cores": {"value": "100"}}
    assert attr(mig, "multiprocessors") == 42
    assert attr(mig, "type") == "mig"
    assert attr(mig, "parentUUID") == "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a"
    assert attr(mig, "gpuInstanceID") == 1
    assert "uuid" not in mig["attributes"] and "profile" not in mig["attributes"]
    # the hardware it gives, named the way CUDA names a MIG device without its MIG UUID
    assert attr(mig, "unit") == "MIG-GPU-27b94a00-ed54-5c24-b1fd-1054085de32a/1/0"
    assert "consumesCounters" not in mig  # one compute instance per GPU instance: nothing shared


def test_h100_mig_capture_profiles_and_masking() -> None:
    (gpu,) = inventory(H100_MIG_CAPTURE)
    assert gpu.uuid_synthesized
    assert [(m.profile, m.memory_bytes >> 20, m.sm_count, m.uuid) for m in gpu.mig_devices] == [
        ("3g.40gb", 40448, 60, None),
        ("2g.20gb", 20096, 32, None),
        ("1g.10gb", 9984, 16, None),
        ("1g.10gb", 9984, 16, None),
    ]
    assert gpu.cuda_compute_capability == "9.0"  # from the capture's --query-gpu section
    devs = devices(build_resource_slices("n", [gpu]))
    # Smallest first: the allocator's first fit is then the smallest instance that holds a claim.
    assert [(name, attr(d, "profile")) for name, d in devs.items()] == [
        ("gpu-0-mig-9-0", "1g.10gb"),
        ("gpu-0-mig-10-0", "1g.10gb"),
        ("gpu-0-mig-3-0", "2g.20gb"),
        ("gpu-0-mig-2-0", "3g.40gb"),
    ]
    assert all(attr(d, "parentUUIDSynthesized") is True for d in devs.values())


def test_masked_all_zero_uuid_is_synthesized_stably() -> None:
    text = inv_text(RTX4080_CAPTURE)
    assert "GPU-00000000-0000-0000-0000-000000000000" in text
    (gpu,) = parse_inventory(text, RTX4080_CAPTURE)
    ns = uuid.uuid5(uuid.NAMESPACE_DNS, "gpu.tessera.dev")
    assert gpu.uuid == "GPU-" + str(uuid.uuid5(ns, f"{RTX4080_CAPTURE}|0000:01:00.0"))
    assert gpu.uuid_synthesized
    # the same file under another directory gives the same UUID; another file name another one
    assert parse_inventory(text, f"/elsewhere/{RTX4080_CAPTURE}")[0].uuid == gpu.uuid
    assert parse_inventory(text, "other-node.txt")[0].uuid != gpu.uuid
    dev = devices(build_resource_slices("n", [gpu]))["gpu-0"]
    assert attr(dev, "uuidSynthesized") is True


def test_all_zero_uuid_in_plain_q_text_is_synthesized() -> None:
    text = inv_text(H100_Q).replace(
        "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa", "GPU-00000000-0000-0000-0000-000000000000"
    )
    gpus = parse_inventory(text, "masked.txt")
    assert gpus[0].uuid_synthesized and not gpus[1].uuid_synthesized
    assert gpus[1].uuid == "GPU-47daa2ad-a218-6286-252b-af45f0dfaf00"


def test_duplicated_uuids_are_synthesized_per_gpu() -> None:
    gpus = inventory("telegraf__nvidia_smi_testdata__dual_2080-v13.xml")
    assert [g.uuid_synthesized for g in gpus] == [True, True]
    assert gpus[0].uuid != gpus[1].uuid


def test_hami_colon_and_json_forms() -> None:
    colon = inventory(HAMI)
    expected = [
        (0, "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec", "Tesla V100-PCIE-32GB", 32768 << 20, 0),
        (1, "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448", "Tesla V100-PCIE-32GB", 32768 << 20, 0),
    ]
    got = [(g.index, g.uuid, g.product_name, g.memory_bytes, g.numa_node) for g in colon]
    assert got == expected
    assert colon[0].architecture == "Volta" and colon[0].cuda_compute_capability == "7.0"
    entries = [
        {"id": u, "index": i, "count": 10, "devmem": m >> 20, "devcore": 100,
         "type": "NVIDIA-" + n, "numa": numa, "mode": "hami-core", "health": True}
        for i, u, n, m, numa in expected
    ]  # fmt: skip
    text = "hami.io/node-nvidia-register: " + json.dumps(entries)
    assert parse_inventory(text, "json") == parse_inventory(inv_text(HAMI), "json")
    devs = devices(build_resource_slices("hami-node", colon))
    assert attr(devs["gpu-1"], "numaNode") == 0


# ---- errors -----------------------------------------------------------------------------------


def test_truncated_xml_names_file_line_and_column() -> None:
    lines = inv_text(A5000_XML).splitlines(keepends=True)
    with pytest.raises(MalformedInputError) as err:
        parse_inventory("".join(lines[:300]), "dual_a5000-v13.xml")
    assert str(err.value) == (
        "dual_a5000-v13.xml:301:1: xml: nvidia-smi XML is malformed or truncated (no element "
        "found); capture it again, complete, with `nvidia-smi -q -x > FILE`"
    )
    assert (err.value.line, err.value.column) == (301, 1)


def test_load_inventory_names_the_path(tmp_path: Path) -> None:
    cut = tmp_path / "cut.xml"
    cut.write_text(inv_text(V100S_XML)[:5000], encoding="utf-8")
    with pytest.raises(InventoryError, match=rf"^{cut}:\d+:\d+: xml: "):
        load_inventory(cut)
    with pytest.raises(UnsupportedFormatError, match=r": file: cannot read the file"):
        load_inventory(tmp_path / "absent.xml")


def test_cut_q_text_is_reported() -> None:
    text = inv_text(H100_Q)
    cut = text[: text.index("GPU 00000000:5D:00.0")]
    with pytest.raises(MalformedInputError) as err:
        parse_inventory(cut, "cut.txt")
    assert str(err.value) == (
        "cut.txt:8: Attached GPUs: Attached GPUs says 8 but 3 `GPU <bus id>` blocks follow; the "
        "text is cut - capture all of `nvidia-smi -q` again"
    )


def test_missing_memory_is_a_missing_field() -> None:
    text = inv_text(H100_Q).replace("        Total                             : 81559 MiB", "", 1)
    with pytest.raises(MissingFieldError) as err:
        parse_inventory(text, "q.txt")
    assert str(err.value).startswith("q.txt:9: memory.total: GPU 0 (GPU-ee7954ec-")


FORMATS = (
    "give `nvidia-smi -q -x` XML, `nvidia-smi -q` text, `--query-gpu=... --format=csv` with "
    "uuid, name and memory.total, or HAMi's hami.io/node-nvidia-register annotation"
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("the quick brown fox\njumps", f"in.txt: format: not a GPU inventory; {FORMATS}"),
        ("", f"in.txt: format: empty input; {FORMATS}"),
        (
            "<html><body>hi</body></html>",
            f"in.txt: format: XML or markup that is not <nvidia_smi_log>; {FORMATS}",
        ),
    ],
)
def test_random_text_is_a_one_line_error(text: str, message: str) -> None:
    with pytest.raises(UnsupportedFormatError) as err:
        parse_inventory(text, "in.txt")
    assert str(err.value) == message
    assert isinstance(err.value, ValueError)


def test_helm_template_is_not_an_inventory() -> None:
    name = "k8s-dra-driver-gpu__helm_templates__deviceclass-gpu.helm-template.yaml"
    text = (CORPUS / "dra-manifests" / name).read_text(encoding="utf-8")
    with pytest.raises(UnsupportedFormatError) as err:
        parse_inventory(text, name)
    assert str(err.value) == f"{name}: format: not a GPU inventory; {FORMATS}"


def test_topology_given_as_inventory() -> None:
    text = (CORPUS / "topologies" / "litgpt__tests_test_utils__topo-m.2xGPU-NV1.txt").read_text()
    with pytest.raises(UnsupportedFormatError) as err:
        parse_inventory(text, "t.txt")
    assert str(err.value) == (
        "t.txt: format: this is an `nvidia-smi topo -m` matrix, not an inventory; give it as the "
        "node's topology: --node NAME=INVENTORY:TOPOLOGY (or `topology:` in a cluster file)"
    )


# ---- topologies -------------------------------------------------------------------------------


def test_8x_a100_nv12_is_one_nvlink_domain() -> None:
    topo = topology("xuesongtap-blog__nvidia-smi-more__topo-m.8xA100-NV12-17nic.txt")
    assert topo.gpus == 8 and topo.complete
    assert topo.nvlink_domains() == dict.fromkeys(range(8), 0)
    assert topo.links[(0, 7)] == "NV12" and len(topo.links) == 56
    assert topo.numa == dict.fromkeys(range(8), 0)


def test_nv1_pairs_across_sys_are_two_domains() -> None:
    topo = topology("litgpt__tests_test_utils__topo-m.4xGPU-NV1-pairs-SYS.txt")
    assert topo.nvlink_domains() == {0: 0, 1: 0, 2: 2, 3: 2}
    assert topo.links[(1, 2)] == "SYS"
    assert topo.numa == dict.fromkeys(range(4))  # no NUMA Affinity column


def test_no_nvlink_means_no_domains() -> None:
    assert (
        topology("litgpt__tests_test_utils__topo-m.4xGPU-PHB-no-nvlink.txt").nvlink_domains() == {}
    )
    ucx = topology("ucx-py-issue-749__topo-m.DGX-A100-8x-nvlink-not-shown-12nic.excerpt.txt")
    assert ucx.nvlink_domains() == {} and ucx.links[(0, 1)] == "PXB"
    assert ucx.numa == dict.fromkeys(range(8))  # "6-7" spans two nodes


def test_tab_separated_with_nics_and_two_numa_nodes() -> None:
    topo = topology("litgpt__tests_test_utils__topo-m.8xGPU-NV12-10nic.txt")
    assert topo.numa == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}
    assert set(topo.links.values()) == {"NV12"}
    devs = devices(build_resource_slices("n", inventory(H100_Q), topo))
    assert [attr(d, "numaNode") for d in devs.values()] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {attr(d, "nvlinkDomain") for d in devs.values()} == {0}


def test_truncated_excerpts() -> None:
    dgx2 = topology("nccl-tests-issue-78__topo-m.DGX-2-16xV100-NV6.excerpt-truncated.txt")
    assert (dgx2.gpus, dgx2.complete) == (16, False)
    assert dgx2.nvlink_domains() == dict.fromkeys(range(16), 0)
    assert (5, 9) not in dgx2.links and dgx2.links[(9, 0)] == "NV6"
    hx = topology(
        "guevara-read-it-later-issue-11550__topo-m.8xH-series-NV18-2nic.excerpt-truncated.txt"
    )
    assert (hx.gpus, hx.complete) == (8, False)
    assert hx.numa == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: None}
    assert hx.links[(7, 6)] == "NV18"  # from GPU6's row


def test_empty_affinity_columns() -> None:
    topo = topology("vllm-issue-19607__topo-m.2xGPU-NV12-8nic-vm-slice.excerpt.txt")
    assert topo.numa == {0: None, 1: None}
    assert topo.nvlink_domains() == {0: 0, 1: 0}


def test_capture_topology_section() -> None:
    topo = parse_topology(inv_text(RTX4080_CAPTURE), "cap")
    assert (topo.gpus, topo.links, topo.numa) == (1, {}, {0: 0})


def test_bad_cell_names_line_and_column() -> None:
    text = "\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNVX\t0-7\nGPU1\tNV1\t X \t0-7\n"
    with pytest.raises(MalformedInputError) as err:
        parse_topology(text, "t")
    assert str(err.value) == (
        "t:2:17: topo -m: cell GPU0/GPU1 is 'NVX', not X, NV#, PIX, PXB, PHB, NODE or SYS"
    )


def test_load_topology_random_text(tmp_path: Path) -> None:
    p = tmp_path / "x.txt"
    p.write_text("hello\n")
    with pytest.raises(UnsupportedFormatError) as err:
        load_topology(p)
    assert str(err.value) == (
        f"{p}: format: not an `nvidia-smi topo -m` matrix (no header line `GPU0 GPU1 ... CPU "
        "Affinity`)"
    )


# ---- slices --------------------------------------------------------------------------------


def test_topology_of_another_size_is_refused() -> None:
    topo = topology("litgpt__tests_test_utils__topo-m.2xGPU-NV1.txt")
    with pytest.raises(SliceBuildError) as err:
        build_resource_slices("n", inventory(H100_Q), topo)
    assert str(err.value) == (
        "node 'n': topology: the topology shows 2 GPUs but the inventory has 8 (indices "
        "[0, 1, 2, 3, 4, 5, 6, 7]); take both from the same node"
    )


def test_many_gpus_split_into_slices_of_one_pool() -> None:
    base = inventory(H100_Q)[0]
    gpus = [replace(base, index=i, uuid=f"GPU-{i:08x}-0000-4000-8000-{i:012x}") for i in range(300)]
    slices = build_resource_slices("big", gpus, generation=7)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert [s["metadata"]["name"] for s in slices] == [
        "big-gpu.tessera.dev-0", "big-gpu.tessera.dev-1", "big-gpu.tessera.dev-2",
    ]  # fmt: skip
    assert all(s["spec"]["pool"] == {"name": "big", "generation": 7, "resourceSliceCount": 3}
               for s in slices)  # fmt: skip
    assert len(devices(slices)) == 300


def test_long_node_name_is_hashed_to_a_valid_slice_name() -> None:
    node = ".".join(["a" * 60] * 4)  # 243 characters: a valid node name
    (s,) = build_resource_slices(node, inventory(A5000_XML))
    name = s["metadata"]["name"]
    assert len(name) <= 253 and validate_resource_slice(s) == []
    assert name == build_resource_slices(node, inventory(A5000_XML))[0]["metadata"]["name"]


def test_long_product_name_is_shortened_deterministically() -> None:
    (g,) = inventory("telegraf__nvidia_smi_testdata__pro-6000-maxq-blackwell-v13.xml")
    long = replace(g, product_name=g.product_name + " With A Very Long Marketing Suffix")
    dev = devices(build_resource_slices("n", [long]))["gpu-0"]
    assert len(attr(dev, "productName")) == 64
    assert attr(dev, "productName").startswith("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation")
    assert attr(devices(build_resource_slices("n", [g]))["gpu-0"], "productName") == (
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
    )


def test_bad_node_name_and_duplicates() -> None:
    gpus = inventory(A5000_XML)
    with pytest.raises(SliceBuildError, match=r"^node 'Node_1': nodeName: "):
        build_resource_slices("Node_1", gpus)
    with pytest.raises(SliceBuildError) as err:
        build_resource_slices("n", [gpus[0], replace(gpus[0], index=5)])
    assert str(err.value) == (
        "node 'n': uuid: GPUs 0 and 5 share uuid 'GPU-12345678-aaaa-bbbb-cccc-0123456789ab'; "
        "each GPU needs its own"
    )


def test_no_gpus_is_one_empty_slice() -> None:
    (s,) = build_resource_slices("n", [])
    assert s["spec"]["devices"] == [] and validate_resource_slice(s) == []


def test_pcie_roots_supplied_by_caller() -> None:
    gpus = inventory(H100_Q)
    devs = devices(build_resource_slices("n", gpus, pcie_roots={"0000:19:00.0": "pci0000:18"}))
    assert attr(devs["gpu-0"], "resource.kubernetes.io/pcieRoot") == "pci0000:18"
    assert "resource.kubernetes.io/pcieRoot" not in devs["gpu-1"]["attributes"]


# ---- helpers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "semver"),
    [("535.161.08", "535.161.8"), ("460.39", "460.39.0"), ("9.0", "9.0.0"), ("595.80", "595.80.0"),
     ("N/A", None), ("1.2.3.4", None), (None, None)],
)  # fmt: skip
def test_to_semver(raw: str | None, semver: str | None) -> None:
    assert to_semver(raw) == semver


def test_bus_id_normal_form_and_root() -> None:
    assert normalize_bus_id("00000000:DB:00.0") == "0000:db:00.0"
    assert normalize_bus_id("N/A") is None
    assert pcie_root_of("00000000:00:1E.0") == "pci0000:00"
    assert pcie_root_of("00000001:00:04.0") == "pci0001:00"
    assert pcie_root_of("00000000:65:00.0") is None


@pytest.mark.parametrize(
    ("cc", "name", "arch"),
    [("8.9", "x", "Ada Lovelace"), ("10.0", "x", "Blackwell"), ("12.0", "x", "Blackwell"),
     ("7.5", "x", "Turing"), (None, "Tesla V100-PCIE-32GB", "Volta"), (None, "Graphics Device", None)],
)  # fmt: skip
def test_derive_architecture(cc: str | None, name: str, arch: str | None) -> None:
    assert derive_architecture(None, cc, name) == arch
