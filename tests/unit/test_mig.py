"""MIG (issue 14): static instances that every request can use, and dynamic MIG through
partitionable devices (KEP-4815), from real inventories (corpus captures) and the small
hand-written ``nvidia-smi -q -x`` files of ``tests/data/mig`` (values traced in SOURCES.md)."""

from __future__ import annotations

import copy
from fractions import Fraction
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml
from click.testing import CliRunner

from corpus_paths import corpus_path
from tessera.api.loader import Manifest, Source
from tessera.api.slice_validation import validate_resource_slice
from tessera.cli import main
from tessera.explain.explain import explain
from tessera.inventory import (
    GPU,
    MalformedInputError,
    SliceBuildError,
    build_resource_slices,
    load_inventory,
    parse_inventory,
    publication_warnings,
)
from tessera.inventory.mig import (
    A30_24GB,
    A100_40GB,
    A100_80GB,
    B200_180GB,
    H100_80GB,
    H200_141GB,
    MIG_MODELS,
    DynamicMIG,
    device_in_slices,
    mig_model_for,
    mig_placement,
    parse_dynamic_mig,
)
from tessera.lint import lint
from tessera.sim.cluster import Cluster, SimNode, load_cluster
from tessera.sim.simulate import SimResult, Simulation

DATA = Path(__file__).resolve().parents[1] / "data" / "mig"
A100_STATIC = DATA / "a100-pcie-40gb.2g10gb-3x1g5gb.nvidia-smi-q-x.xml"
A100_UNKNOWN = DATA / "a100-pcie-40gb.instance-in-unknown-state.nvidia-smi-q-x.xml"
INV = corpus_path() / "inventories"
H200_MIG = (
    INV
    / "nvidia_gpu_exporter__internal_captures__linux-x86_64__nvidia-h200-mig__590.48.01.capture.txt"
)
H100_MIG = (
    INV
    / "nvidia_gpu_exporter__internal_captures__linux-x86_64__nvidia-h100-mig__590.48.01.capture.txt"
)
H100_ONE = (
    INV
    / "nvidia_gpu_exporter__internal_captures__linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.capture.txt"
)
H100_8 = INV / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
A100_80_XML = INV / "telegraf__nvidia_smi_testdata__a100-sxm4-v12.xml"
A5000_XML = INV / "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"
HAMI_PODS = corpus_path() / "hami-pods"
MIB = 2**20
D = "gpu.tessera.dev"


# ---- helpers -------------------------------------------------------------------------------


def devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def attr(dev: dict[str, Any], name: str) -> Any:
    a = dev["attributes"].get(name)
    return None if a is None else next(iter(a.values()))


def node(name: str, gpus: list[GPU], dynamic: DynamicMIG | None = None) -> SimNode:
    return SimNode(
        name,
        {"kubernetes.io/hostname": name},
        build_resource_slices(name, gpus, dynamic_mig=dynamic),
        name,
    )


def hami_pod(
    name: str, limits: dict[str, Any], *, mode: str | None = None, on: str | None = None
) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "namespace": "default"}
    if mode:
        md["annotations"] = {"nvidia.com/vgpu-mode": mode}
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]
    }
    if on:
        spec["nodeSelector"] = {"kubernetes.io/hostname": on}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": spec}


def dra_pod(
    name: str, requests: dict[str, str], *, selectors: tuple[str, ...] = (), count: int = 1
) -> list[dict[str, Any]]:
    body: dict[str, Any] = {
        "deviceClassName": D,
        "count": count,
        "capacity": {"requests": requests},
    }
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": body}]}},
    }
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
    }  # fmt: skip
    return [claim, pod]


def run_sim(nodes: list[SimNode], objects: list[dict[str, Any]]) -> SimResult:
    manifests = [Manifest(copy.deepcopy(o), Source("test", i + 1)) for i, o in enumerate(objects)]
    return Simulation(Cluster(nodes, "test"), manifests).run()


def placed(result: SimResult) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in result.placements:
        out.setdefault(p.pod.split("/")[1], []).append(p.device.split("/", 2)[2])
    return out


def pending(result: SimResult) -> dict[str, str]:
    return {p.pod.split("/")[1]: p.reason for p in result.pending}


# ---- static MIG: the A100-PCIE-40GB of the issue (one 2g.10gb, three 1g.5gb) ---------------------


def a100_static() -> list[GPU]:
    return load_inventory(A100_STATIC)


def test_static_mig_devices_publish_memory_and_cores_smallest_first() -> None:
    (gpu,) = a100_static()
    assert [(m.gpu_instance_id, m.memory_bytes // MIB, m.sm_count) for m in gpu.mig_devices] == [
        (5, 9856, 28), (7, 4864, 14), (8, 4864, 14), (13, 4864, 14),
    ]  # fmt: skip
    devs = devices(build_resource_slices("a100", [gpu]))
    # Smallest first, so the allocator's first fit is the smallest instance that holds a claim.
    assert list(devs) == ["gpu-0-mig-7-0", "gpu-0-mig-8-0", "gpu-0-mig-13-0", "gpu-0-mig-5-0"]
    for d in devs.values():
        # `cores` (100 % of the instance's own SMs) beside `memory`: every converted HAMi claim
        # names cores, and a MIG device without it could never take one (issue 14).
        assert set(d["capacity"]) == {"memory", "cores"} and d["capacity"]["cores"] == {
            "value": "100"
        }
        assert "allowMultipleAllocations" not in d and "consumesCounters" not in d
    assert devs["gpu-0-mig-5-0"]["capacity"]["memory"] == {"value": "9856Mi"}
    assert attr(devs["gpu-0-mig-5-0"], "multiprocessors") == 28
    assert attr(devs["gpu-0-mig-7-0"], "unit") == "MIG-GPU-2fa81118-5a5f-aa66-7660-471eed407181/7/0"


@pytest.mark.parametrize(
    ("limits", "mode", "device", "memory"),
    [
        # vgpu-mode mig: the smallest instance whose memory holds gpumem. 1g.5gb holds
        # 4864 MiB < 5120, so the 2g.10gb (9856 MiB), as HAMi (NVML's profile memory) picks.
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 5120}, "mig", "gpu-0-mig-5-0", "9856Mi"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4864}, None, "gpu-0-mig-7-0", "4864Mi"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4864}, "mig", "gpu-0-mig-7-0", "4864Mi"),
        ({"nvidia.com/gpu": 1}, None, "gpu-0-mig-7-0", "4864Mi"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30}, None, "gpu-0-mig-7-0", "4864Mi"),
    ],
)
def test_hami_pods_land_on_a_mig_instance(
    limits: dict[str, Any], mode: str | None, device: str, memory: str
) -> None:
    result = run_sim([node("a100", a100_static())], [hami_pod("p", limits, mode=mode)])
    assert pending(result) == {}
    ((p),) = result.placements
    assert (p.device, p.memory, p.cores, p.share_id) == (f"{D}/a100/{device}", memory, "100", None)


def test_dra_claim_of_the_same_size_lands_where_the_hami_pod_does() -> None:
    hami = run_sim(
        [node("a100", a100_static())],
        [hami_pod("p", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 5120}, mode="mig")],
    )
    dra = run_sim([node("a100", a100_static())], dra_pod("p", {"memory": "5Gi", "cores": "0"}))
    assert placed(hami) == placed(dra) == {"p": ["gpu-0-mig-5-0"]}


def test_hami_gpu_two_gets_two_instances_of_one_gpu() -> None:
    result = run_sim(
        [node("a100", a100_static())],
        [hami_pod("p", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 4000}, mode="mig")],
    )
    assert placed(result) == {"p": ["gpu-0-mig-7-0", "gpu-0-mig-8-0"]}


def test_a_full_a100_says_why_without_contradicting_itself() -> None:
    pods = [
        hami_pod(f"p{i}", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}, mode="mig")
        for i in range(5)
    ]
    result = run_sim([node("a100", a100_static())], pods)
    assert placed(result) == {
        "p0": ["gpu-0-mig-7-0"],
        "p1": ["gpu-0-mig-8-0"],
        "p2": ["gpu-0-mig-13-0"],
        "p3": ["gpu-0-mig-5-0"],
    }
    reason = pending(result)["p4"]
    assert reason == (
        "0/1 nodes are available: 1 cannot allocate all claims. claim default/p4-c-gpu, request gpu: "
        "needs 1 device with memory 4000Mi and cores 0; 4 GPUs in the cluster match its selectors, none has room now: "
        "4 GPUs in use (allocated whole to another claim)"
    )  # no "most free memory" on devices that are allocated whole
    exp = explain(
        Cluster([node("a100", a100_static())], "test"),
        [Manifest(p, Source("t", i)) for i, p in enumerate(pods)],
        "default/p4",
    )
    assert exp.hami == [
        "HAMi request (container c): 1 GPU × gpumem 4000 MiB, gpucores 0 — no node has 1 GPU with 4000 MiB and "
        "0% cores free"
    ]


# ---- static MIG: compute instances sharing a GPU instance (corpus H200 capture) --------------------


def test_compute_instances_of_one_gpu_instance_share_its_memory_through_a_counter() -> None:
    (gpu,) = load_inventory(H200_MIG)
    assert [
        (m.profile, m.gpu_instance_id, m.compute_instance_id, m.memory_bytes // MIB, m.sm_count)
        for m in gpu.mig_devices
    ] == [
        ("1c.3g.71gb", 2, 0, 71424, 16),
        ("2c.3g.71gb", 2, 1, 71424, 32),
        ("2g.35gb", 3, 0, 33280, 32),
        ("1g.18gb", 9, 0, 16384, 16),
        ("1g.18gb", 10, 0, 16384, 16),
    ]
    slices = build_resource_slices("h200", [gpu])
    assert [s["metadata"]["name"] for s in slices] == [
        "h200-gpu.tessera.dev",
        "h200-gpu.tessera.dev-counters",
    ]
    assert all(validate_resource_slice(s) == [] for s in slices)
    assert slices[1]["spec"]["sharedCounters"] == [
        {"name": "gpu-0", "counters": {"gi-2-memory": {"value": "71424Mi"}}}
    ]
    devs = devices(slices)
    assert list(devs) == [
        "gpu-0-mig-9-0",
        "gpu-0-mig-10-0",
        "gpu-0-mig-3-0",
        "gpu-0-mig-2-0",
        "gpu-0-mig-2-1",
    ]
    for name in ("gpu-0-mig-2-0", "gpu-0-mig-2-1"):
        assert devs[name]["consumesCounters"] == [
            {"counterSet": "gpu-0", "counters": {"gi-2-memory": {"value": "71424Mi"}}}
        ]
    assert "consumesCounters" not in devs["gpu-0-mig-3-0"]


def test_two_60gib_claims_are_not_both_promised_the_71gib_gpu_instance() -> None:
    h200 = node("h200", load_inventory(H200_MIG))
    objs = dra_pod("a", {"memory": "60Gi"}) + dra_pod("b", {"memory": "60Gi"})
    result = run_sim([h200], objs)
    assert placed(result) == {"a": ["gpu-0-mig-2-0"]}
    assert (
        "5 GPUs in the cluster match its selectors: 3 GPUs can never hold it (memory 60Gi is more than any of "
        "them has: "
        "the largest has 33280Mi, h200/gpu-0-mig-3-0); 1 GPU in use (allocated whole to another claim); "
        "1 GPU with shared counters used up (h200/gpu-0: memory of GPU instance 2 of gpu-0 (shared by its compute "
        "instances): 71424Mi of 71424Mi in use)"
    ) in pending(result)["b"]
    # the per-GPU table shows the sharing on both compute instances
    usage = {u.device: u for u in result.gpus}
    shared = "memory of GPU instance 2 of gpu-0 (shared by its compute instances): 71424Mi of 71424Mi in use"
    assert usage["gpu-0-mig-2-0"].counters == [shared] and usage["gpu-0-mig-2-0"].dedicated
    assert usage["gpu-0-mig-2-1"].counters == [shared] and not usage["gpu-0-mig-2-1"].dedicated
    exp = explain(
        Cluster([h200], "test"),
        [Manifest(o, Source("t", i)) for i, o in enumerate(objs)],
        "default/b",
    )
    groups = [(g.count, g.reason) for r in exp.nodes[0].requests for g in r.groups]
    assert (1, f"shared counters: {shared}") in groups


def test_h200_table_holds_the_corpus_capture() -> None:
    """No profile promises more than the capture's instances have; SMs agree."""
    (gpu,) = load_inventory(H200_MIG)
    assert mig_model_for(gpu.product_name, gpu.memory_bytes) is H200_141GB
    for m in gpu.mig_devices:
        assert m.profile is not None
        gi_profile = (
            m.profile.split(".", 1)[1] if m.profile.count(".") == 2 else m.profile
        )  # 1c.3g.71gb -> 3g.71gb
        p = H200_141GB.profile(gi_profile)
        assert p is not None and p.memory_bytes <= m.memory_bytes, m
        if gi_profile == m.profile:  # one compute instance: the instance's SMs are the profile's
            assert p.multiprocessors == m.sm_count
    # the 3g.71gb GPU instance split into 1c + 2c compute instances: 16 + 32 of its 60 SMs
    assert sum(m.sm_count or 0 for m in gpu.mig_devices if m.gpu_instance_id == 2) <= (
        H200_141GB.profile("3g.71gb").multiprocessors or 0
    )  # type: ignore[union-attr]


def test_h100_and_a100_tables_hold_the_corpus_captures() -> None:
    (h100,) = load_inventory(H100_MIG)
    for m in h100.mig_devices:
        p = H100_80GB.profile(str(m.profile))
        assert (
            p is not None and p.memory_bytes <= m.memory_bytes and p.multiprocessors == m.sm_count
        )
    (a100,) = load_inventory(A100_80_XML)
    assert mig_model_for(a100.product_name, a100.memory_bytes) is A100_80GB
    p = A100_80GB.profile("1g.20gb")
    assert p is not None
    assert {(m.memory_bytes, m.sm_count) for m in a100.mig_devices} == {
        (p.memory_bytes, p.multiprocessors)
    }


# ---- the profile tables ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", MIG_MODELS, ids=lambda m: m.name)
def test_profile_tables_are_consistent(model: Any) -> None:
    names = [p.name for p in model.profiles]
    assert len(names) == len(set(names))
    for p in model.profiles:
        assert p.name.startswith(f"{p.compute_slices}g.")
        assert all(s >= 0 and s + p.memory_slices <= model.memory_slices for s in p.starts)
        assert p.compute_slices <= model.compute_slices
        assert p.media_extensions == p.name.endswith("+me")
    full = model.full
    assert (full.compute_slices, full.memory_slices, full.starts) == (
        model.compute_slices,
        model.memory_slices,
        (0,),
    )
    assert max(p.memory_mib for p in model.profiles) == full.memory_mib


@pytest.mark.parametrize(
    ("product", "memory_mib", "model"),
    [
        ("NVIDIA A100-PCIE-40GB", 40960, A100_40GB),
        ("NVIDIA A100-SXM4-40GB", 40960, A100_40GB),
        ("NVIDIA A100-SXM4-80GB", 81920, A100_80GB),
        ("NVIDIA A100 80GB PCIe", 81920, A100_80GB),
        ("NVIDIA A30", 24576, A30_24GB),
        ("NVIDIA H100 80GB HBM3", 81559, H100_80GB),
        ("NVIDIA H100 PCIe", 81559, H100_80GB),
        ("NVIDIA H200", 143771, H200_141GB),
        ("NVIDIA H200 NVL", 143771, H200_141GB),
        ("NVIDIA B200", 183359, B200_180GB),
        ("NVIDIA H100 NVL", 95830, None),  # 1g.12gb profiles: no table
        ("NVIDIA GB200", 189471, None),
        ("NVIDIA RTX A5000", 24564, None),
    ],
)
def test_model_lookup(product: str, memory_mib: int, model: Any) -> None:
    assert mig_model_for(product, memory_mib * MIB) is model


def test_nvml_profile_constants_exist_in_nvml() -> None:
    """The constants a placement names are NVML's (nvidia-ml-py spells them as nvml.h does)."""
    for model in MIG_MODELS:
        for s in build_resource_slices("n", [_dynamic_gpu(model)], dynamic_mig=DynamicMIG()):
            for d in s["spec"].get("devices") or []:
                pl = mig_placement(d)
                assert pl is not None
                assert isinstance(getattr(pynvml, pl.gpu_instance_profile), int)
                assert isinstance(getattr(pynvml, pl.compute_instance_profile), int)


# ---- dynamic MIG: publishing --------------------------------------------------------------------


def _dynamic_gpu(model: Any, index: int = 0) -> GPU:
    names = {
        "A100 40GB": ("NVIDIA A100-PCIE-40GB", 40960), "A100 80GB": ("NVIDIA A100-SXM4-80GB", 81920),
        "A30": ("NVIDIA A30", 24576), "H100 80GB": ("NVIDIA H100 80GB HBM3", 81559),
        "H200 141GB": ("NVIDIA H200", 143771), "B200 180GB": ("NVIDIA B200", 183359),
    }  # fmt: skip
    product, mib = names[model.name]
    return GPU(index, f"GPU-00000000-0000-0000-0000-{index + 1:012x}", product, None, None, "590.48.01", "13.1",
               None, None, mib * MIB, mig_enabled=True)  # fmt: skip


@pytest.mark.parametrize("model", MIG_MODELS, ids=lambda m: m.name)
def test_dynamic_gpu_publishes_one_device_per_placement_and_the_whole_gpu(model: Any) -> None:
    slices = build_resource_slices("n", [_dynamic_gpu(model)], dynamic_mig=DynamicMIG())
    assert all(validate_resource_slice(s) == [] for s in slices)
    devs = devices(slices)
    placements = sum(len(p.starts) for p in model.profiles)
    assert len(devs) == placements + 1
    (cs,) = [c for s in slices for c in s["spec"].get("sharedCounters") or []]
    assert cs["name"] == "gpu-0"
    assert cs["counters"] == {
        **{f"memory-slice-{k}": {"value": "1"} for k in range(model.memory_slices)},
        "compute-slices": {"value": str(model.compute_slices)},
        "media-extensions": {"value": "1"},
    }
    for p in model.profiles:
        for start in p.starts:
            name = f"gpu-0-mig-{p.name.replace('.', '').replace('+', '-')}-{start}"
            d = devs[name]
            assert (
                attr(d, "type") == "mig"
                and attr(d, "profile") == p.name
                and attr(d, "placementStart") == start
            )
            assert d["capacity"] == {
                "memory": {"value": _q(p.memory_bytes)},
                "cores": {"value": "100"},
            }
            want = {
                f"memory-slice-{k}": {"value": "1"} for k in range(start, start + p.memory_slices)
            }
            want["compute-slices"] = {"value": str(p.compute_slices)}
            if p.media_extensions:
                want["media-extensions"] = {"value": "1"}
            assert d["consumesCounters"] == [{"counterSet": "gpu-0", "counters": want}]
    whole = devs["gpu-0"]
    assert whole["allowMultipleAllocations"] is True and attr(whole, "migDynamic") is True
    assert whole["capacity"]["memory"]["value"] == _q(model.full.memory_bytes)
    assert whole["consumesCounters"] == [{"counterSet": "gpu-0", "counters": cs["counters"]}]
    assert list(devs)[-1] == "gpu-0"  # placements first: MIG is what a dynamic GPU is for


def _q(n: int) -> str:
    from tessera.api.quantity import Quantity

    return Quantity.from_int(n, "BinarySI").canonical()


def test_eight_dynamic_h100s_fill_slices_of_64_devices_and_one_counter_slice() -> None:
    gpus = load_inventory(H100_8)
    slices = build_resource_slices("h100", gpus, dynamic_mig=DynamicMIG())
    # 26 devices per GPU, a GPU's devices kept in one slice of at most 64: 2 GPUs a slice.
    assert [(s["metadata"]["name"], len(s["spec"].get("devices") or []), len(s["spec"].get("sharedCounters") or [])) for s in slices] == [  # noqa: E501
        ("h100-gpu.tessera.dev-0", 52, 0), ("h100-gpu.tessera.dev-1", 52, 0),
        ("h100-gpu.tessera.dev-2", 52, 0), ("h100-gpu.tessera.dev-3", 52, 0),
        ("h100-gpu.tessera.dev-counters", 0, 8),
    ]  # fmt: skip
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {5}
    # dynamic for two GPUs only, and only the profiles HAMi's chart allows on H100
    only = build_resource_slices(
        "h100",
        gpus,
        dynamic_mig=parse_dynamic_mig(
            {"gpus": [0, gpus[1].uuid], "profiles": ["1g.10gb", "3g.40gb"]}, "t"
        ),
    )
    devs = devices(only)
    assert [n for n in devs if n.startswith("gpu-0")] == [
        "gpu-0-mig-1g10gb-6", "gpu-0-mig-1g10gb-5", "gpu-0-mig-1g10gb-4", "gpu-0-mig-1g10gb-3",
        "gpu-0-mig-1g10gb-2", "gpu-0-mig-1g10gb-1", "gpu-0-mig-1g10gb-0", "gpu-0-mig-3g40gb-4", "gpu-0-mig-3g40gb-0", "gpu-0",  # noqa: E501
    ]  # fmt: skip
    assert "consumesCounters" not in devs["gpu-2"] and attr(devs["gpu-1"], "migDynamic") is True
    assert len(devs) == 2 * 10 + 6


def test_mig_placement_is_what_the_driver_creates() -> None:
    slices = build_resource_slices("n", [_dynamic_gpu(A100_40GB)], dynamic_mig=DynamicMIG())
    pl = mig_placement(device_in_slices(slices, "gpu-0-mig-3g20gb-4") or {})
    assert pl is not None
    assert (pl.gpu_index, pl.profile, pl.start, pl.size, pl.shared) == (0, "3g.20gb", 4, 4, False)
    assert (pl.gpu_instance_profile, pl.compute_instance_profile) == (
        "NVML_GPU_INSTANCE_PROFILE_3_SLICE", "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    )  # fmt: skip
    me = mig_placement(device_in_slices(slices, "gpu-0-mig-1g5gb-me-2") or {})
    assert me is not None and me.gpu_instance_profile == "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1"
    two = mig_placement(device_in_slices(slices, "gpu-0-mig-1g10gb-6") or {})
    assert two is not None and (two.size, two.gpu_instance_profile) == (
        2,
        "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2",
    )
    whole = mig_placement(device_in_slices(slices, "gpu-0") or {})
    assert whole is not None
    assert (whole.profile, whole.start, whole.size, whole.shared, whole.gpu_instance_profile) == (
        "7g.40gb", 0, 8, True, "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
    )  # fmt: skip
    assert (
        mig_placement(devices(build_resource_slices("s", a100_static()))["gpu-0-mig-5-0"]) is None
    )  # exists already


# ---- dynamic MIG: scheduling ----------------------------------------------------------------------


def test_seven_1g_instances_then_the_counter_is_named() -> None:
    n = node("h100", load_inventory(H100_ONE), DynamicMIG())
    pods = [
        hami_pod(f"p{i}", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 9000}, mode="mig")
        for i in range(8)
    ]
    result = run_sim([n], pods)
    # 1g profiles from the highest placement down (HAMi's order): 6, 5, ... 0
    assert placed(result) == {f"p{i}": [f"gpu-0-mig-1g10gb-{6 - i}"] for i in range(7)}
    assert pending(result)["p7"].endswith(
        "none has room now: 7 GPUs in use (allocated whole to another claim); "
        "18 GPUs with shared counters used up (h100/gpu-0: memory slices of gpu-0: 7 of 8 used; compute slices "
        "of gpu-0: 7 of 7 used)"
    )
    exp = explain(
        Cluster([n], "test"),
        [Manifest(p, Source("t", i)) for i, p in enumerate(pods)],
        "default/p7",
    )
    reasons = {g.reason for r in exp.nodes[0].requests for g in r.groups}
    # the exhausted counters in words (issue 14), then the counter each placement cannot have
    assert (
        "shared counters: memory slices of gpu-0: 7 of 8 used; compute slices of gpu-0: 7 of 7 used "
        "(gpu-0/memory-slice-6; gpu-0/memory-slice-5; gpu-0/memory-slice-4; ...)" in reasons
    ), reasons
    (gpu_row,) = [u for u in result.gpus if u.device == "gpu-0"]
    assert gpu_row.counters == [
        "memory slices of gpu-0: 7 of 8 used",
        "compute slices of gpu-0: 7 of 7 used",
    ]
    assert (
        sum(1 for u in result.gpus if u.potential) == 26 - 1 - 7
    )  # free placements, hidden in the table


def test_hami_dynamic_mig_example_on_an_a100_40gb() -> None:
    """HAMi's examples/nvidia/dynamic_mig_example.yaml (gpu 2 x gpumem 8000, vgpu-mode mig)
    "will allocate 2g.10gb * 2 for A100-40GB": with HAMi's chart allowlist (no 1g.10gb) two
    2g.10gb of one GPU; with every profile the smaller 1g.10gb twice."""
    (gpu,) = a100_static()
    fresh = GPU(**{**{f: getattr(gpu, f) for f in GPU.__slots__}, "mig_devices": ()})  # type: ignore[attr-defined]
    pod = yaml.safe_load(
        (HAMI_PODS / "HAMi__examples_nvidia__dynamic_mig_example.yaml").read_text()
    )
    allow = parse_dynamic_mig({"profiles": ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]}, "t")
    assert placed(run_sim([node("a100", [fresh], allow)], [pod])) == {
        "gpu-pod": ["gpu-0-mig-2g10gb-0", "gpu-0-mig-2g10gb-2"]
    }
    assert placed(run_sim([node("a100", [fresh], DynamicMIG())], [pod])) == {
        "gpu-pod": ["gpu-0-mig-1g10gb-6", "gpu-0-mig-1g10gb-4"]
    }


def test_the_whole_gpu_and_its_placements_exclude_each_other() -> None:
    n = node("h100", load_inventory(H100_ONE), DynamicMIG())
    shares = [hami_pod("s1", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}, mode="hami-core"),
              hami_pod("s2", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 20000}, mode="hami-core"),
              hami_pod("m", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 9000}, mode="mig")]  # fmt: skip
    result = run_sim([n], shares)
    assert placed(result) == {"s1": ["gpu-0"], "s2": ["gpu-0"]}  # two shares, counters charged once
    assert "m" in pending(result)
    first_mig = run_sim([n], [shares[2], shares[0]])
    assert placed(first_mig) == {"m": ["gpu-0-mig-1g10gb-6"]} and "s1" in pending(first_mig)


def test_hami_register_annotation_in_mig_mode_is_dynamic_with_nvml_profiles() -> None:
    """HAMi v2.10 registers a MIG-mode GPU with the profiles NVML gave it (migProfiles): HAMi
    makes instances per pod, so Tessera publishes it for dynamic MIG, with those figures."""
    value = (
        '[{"id":"GPU-2fa81118-5a5f-aa66-7660-471eed407181","index":0,"count":7,"devmem":40960,"devcore":100,'
        '"type":"NVIDIA-NVIDIA A100-PCIE-40GB","numa":0,"mode":"mig","health":true,"migProfiles":['
        '{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":[{"start":0,"size":1},{"start":1,"size":1},'
        '{"start":2,"size":1},{"start":3,"size":1},{"start":4,"size":1},{"start":5,"size":1},{"start":6,"size":1}]},'
        '{"name":"2g.10gb","memoryMB":9984,"core":29,"sliceCount":2,"placements":[{"start":0,"size":2},{"start":2,"size":2},{"start":4,"size":2}]},'
        '{"name":"7g.40gb","memoryMB":40448,"core":100,"sliceCount":7,"placements":[{"start":0,"size":8}]}]}]'
    )
    (gpu,) = parse_inventory(f"hami.io/node-nvidia-register: {value}", "hami.txt")
    assert gpu.mig_on_demand and gpu.mig_model is not None
    assert [(p.name, p.memory_mib, p.starts) for p in gpu.mig_model.profiles] == [
        ("1g.5gb", 4864, (0, 1, 2, 3, 4, 5, 6)), ("2g.10gb", 9984, (0, 2, 4)), ("7g.40gb", 40448, (0,)),
    ]  # fmt: skip
    devs = devices(
        build_resource_slices("hami", [gpu])
    )  # no dynamic_mig given: the inventory's word
    assert len(devs) == 7 + 3 + 1 + 1
    assert devs["gpu-0-mig-2g10gb-0"]["capacity"]["memory"] == {"value": "9984Mi"}
    assert publication_warnings([gpu], "hami.txt") == []
    with pytest.raises(MalformedInputError) as err:
        broken = value.replace('"memoryMB":9984', '"memoryMB":0')
        parse_inventory(f"hami.io/node-nvidia-register: {broken}", "hami.txt")
    assert str(err.value) == (
        "hami.txt:1: migProfiles: GPU 0: migProfiles[1] needs a profile name like 2g.10gb and memoryMB > 0; give the "
        "annotation as HAMi wrote it"
    )


# ---- bad input: one line each -----------------------------------------------------------------------


def _cluster_file(tmp_path: Path, inventory: Path, dynamic: Any) -> Path:
    f = tmp_path / "cluster.yaml"
    f.write_text(yaml.safe_dump({"apiVersion": "tessera.dev/v1alpha1", "kind": "Cluster",
                                 "nodes": [{"name": "n", "inventory": str(inventory), "dynamicMIG": dynamic}]}))  # fmt: skip  # noqa: E501
    return f


def _cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.stderr


def test_bad_input_profile_the_model_lacks(tmp_path: Path) -> None:
    f = _cluster_file(tmp_path, H100_ONE, {"profiles": ["1g.5gb"]})
    code, err = _cli("simulate", "--cluster", str(f))
    assert code == 2 and err.count("\n") == 1
    assert err == (
        f"tessera: error: {f}: node n: {H100_ONE}: dynamicMIG.profiles: profile '1g.5gb' does not exist on this node's "
        "dynamic MIG GPUs (H100 80GB); their profiles: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, "
        "7g.80gb\n"
    )


def test_bad_input_gpu_not_mig_capable_marked_dynamic(tmp_path: Path) -> None:
    f = _cluster_file(tmp_path, A5000_XML, [1])
    code, err = _cli("simulate", "--cluster", str(f))
    assert code == 2
    assert err == (
        f"tessera: error: {f}: node n: {A5000_XML}: dynamicMIG: GPU 1 (NVIDIA RTX A5000) is not MIG-capable, so it "
        "cannot be partitioned on demand; leave it out of dynamicMIG (MIG GPUs: A100 40GB, A100 80GB, A30, H100 80GB, "
        "H200 141GB, B200 180GB)\n"
    )


def test_bad_input_mig_instance_in_unknown_state() -> None:
    code, err = _cli("simulate", "--node", f"n={A100_UNKNOWN}")
    assert code == 2
    assert err == (
        f"tessera: error: {A100_UNKNOWN}: mig_device: GPU 0: MIG device 2 is in an unknown state (gpu_instance_id N/A, "
        "compute_instance_id N/A): an instance was being created or destroyed; capture the inventory again once "
        "`nvidia-smi -L` lists it\n"
    )


def test_bad_input_other_dynamic_mig_settings() -> None:
    with pytest.raises(
        ValueError, match=r"^nodes\[0\].dynamicMIG: 'some' is not a dynamic-MIG setting"
    ):
        parse_dynamic_mig("some", "nodes[0].dynamicMIG")
    with pytest.raises(
        SliceBuildError,
        match=r"^node 'n': dynamicMIG: no GPU 3 on this node \(its GPUs: 0, or their UUIDs\)$",
    ):
        build_resource_slices("n", load_inventory(H100_ONE), dynamic_mig=DynamicMIG(gpus=(3,)))
    with pytest.raises(
        SliceBuildError, match=r"already holds 5 MIG instance\(s\) the node driver did not make"
    ):
        build_resource_slices("n", load_inventory(H200_MIG), dynamic_mig=DynamicMIG())


def test_dynamic_gpu_with_mig_mode_disabled_is_warned_about() -> None:
    gpus = load_inventory(H100_ONE)
    (w,) = publication_warnings(gpus, "h100.txt", DynamicMIG())
    assert w == (
        f"h100.txt: GPU 0 ({gpus[0].uuid}, NVIDIA H100 80GB HBM3) is published for dynamic MIG but its MIG mode is "
        "disabled: the node driver must enable it (nvidia-smi -i 0 -mig 1; on Ampere GPUs this takes effect "
        "after a GPU "
        "reset) before it can create instances"
    )


def test_cluster_file_dynamic_mig(tmp_path: Path) -> None:
    f = _cluster_file(tmp_path, H100_8, [0, 1])
    cluster = load_cluster(f)
    devs = devices(cluster.nodes[0].slices)
    assert len(devs) == 2 * 26 + 6
    assert len(cluster.warnings) == 2  # MIG mode disabled on GPUs 0 and 1


# ---- lint: counters --------------------------------------------------------------------------------


def test_lint_counts_devices_that_share_counters() -> None:
    slices = build_resource_slices("h100", load_inventory(H100_ONE), dynamic_mig=DynamicMIG())
    claim = dra_pod("three-3g", {}, count=3, selectors=(f'device.attributes["{D}"].?profile.orValue("") == ' '"3g.40gb" || '  # noqa: E501
                                                        f'device.attributes["{D}"].?profile.orValue("") == ' '"4g.40gb"',))[0]  # fmt: skip  # noqa: E501
    (finding,) = lint([Manifest(claim, Source("c.yaml", 1))], slices)
    assert (finding.field, finding.problem) == (
        "spec.devices.requests[0].exactly.count",
        "3 devices asked, but at most 2 of the devices matching this request can be allocated together on one "
        "node (h100): "
        "they consume shared counters (counter set gpu-0: 8 memory slices, 7 compute slices, media extensions)",
    )
    two = copy.deepcopy(claim)
    two["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    assert lint([Manifest(two, Source("c.yaml", 1))], slices) == []


def test_counter_usage_subtracts_allocated_devices_once() -> None:
    from tessera.allocator import AllocatedState, SliceIndex
    from tessera.scheduler.usage import counter_usage

    slices = build_resource_slices("h100", load_inventory(H100_ONE), dynamic_mig=DynamicMIG())
    state = AllocatedState()
    state.add_result({"driver": D, "pool": "h100", "device": "gpu-0-mig-3g40gb-4"})
    u = counter_usage(SliceIndex(slices), state)[(D, "h100", "gpu-0")]
    assert u.available["compute-slices"] == Fraction(4) and u.holders == ["gpu-0-mig-3g40gb-4"]
    assert [k for k in range(8) if u.available[f"memory-slice-{k}"] == 0] == [4, 5, 6, 7]
    assert u.lines() == [
        "memory slices of gpu-0: 4 of 8 used",
        "compute slices of gpu-0: 3 of 7 used",
    ]


# ---- conversion ------------------------------------------------------------------------------------


def test_hami_mig_allocations_annotation_keeps_the_profile_hami_chose() -> None:
    """A pod recreated from a HAMi cluster carries hami.io/vgpu-mig-allocations (HAMi's
    scheduler's record, shape from HAMi docs/develop/mig-dynamic-deallocate.md): its claim asks
    for that profile; the GPU and placement are chosen again."""
    pod = hami_pod("p", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}, mode="mig")
    pod["metadata"]["annotations"]["hami.io/vgpu-mig-allocations"] = (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-xxxxxxxx","profile":"2g.10gb",'
        '"placement":{"start":2,"size":2},"migUUID":"MIG-xxxxxxxx","gpuInstanceID":4,"computeInstanceID":0}]'
    )
    from tessera.convert import convert_pod

    conv = convert_pod(pod)
    sels = [
        s["cel"]["expression"]
        for s in conv.templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    ]
    assert (
        sels[-1]
        == f'has(device.attributes["{D}"].profile) && device.attributes["{D}"].profile in ["2g.10gb"]'
    )
    assert conv.warnings == [
        "pod default/p, container c: hami.io/vgpu-mig-allocations (written by HAMi's scheduler) recorded MIG "
        "profile(s) "
        "2g.10gb: the claim asks for that profile; GPU and placement are chosen again"
    ]
    (gpu,) = load_inventory(H100_ONE)
    a100 = GPU(
        **{
            **{f: getattr(gpu, f) for f in GPU.__slots__},
            "product_name": "NVIDIA A100-PCIE-40GB",
            "memory_bytes": 40960 * MIB,
        }
    )  # type: ignore[attr-defined]
    result = run_sim([node("a100", [a100], DynamicMIG())], [pod])
    assert placed(result) == {
        "p": ["gpu-0-mig-2g10gb-0"]
    }  # not the 1g.5gb that 3000 MiB alone would pick
    bad = copy.deepcopy(pod)
    bad["metadata"]["annotations"]["hami.io/vgpu-mig-allocations"] = "not json"
    conv = convert_pod(bad)
    assert conv.warnings[0].startswith(
        "pod default/p: annotation hami.io/vgpu-mig-allocations is not JSON"
    )
    assert len(conv.templates) == 1


def test_percentages_resolve_against_gpus_not_mig_placements() -> None:
    from tessera.convert import gpu_memory_sizes

    slices = build_resource_slices("h100", load_inventory(H100_ONE), dynamic_mig=DynamicMIG())
    assert gpu_memory_sizes(slices) == [
        81152 * MIB
    ]  # the whole GPU; its 25 placements are not GPUs
    assert gpu_memory_sizes(build_resource_slices("s", a100_static())) == [9856 * MIB, 4864 * MIB]
