"""``--class-map`` runs the NVIDIA DRA driver's manifests on Tessera's devices (issue 22.4):
the class, the attribute/capacity domain and names in selectors, and the attributes of
``constraints[]`` are all mapped; what has no equivalent is named in a warning. Inputs: the
NVIDIA driver's quickstart ``gpu-test4`` and bats specs from the corpus; A100-PCIE-40GB GPUs
(dynamic MIG, and the static 2g.10gb + 3x 1g.5gb layout of tests/data/mig)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tessera.api.loader import Manifest, Source, expand_workloads, load_file, parse_documents
from tessera.inventory.mig import DynamicMIG
from tessera.inventory.model import GPU
from tessera.inventory.parse import load_inventory
from tessera.inventory.slices import build_resource_slices
from tessera.sim.classmap import map_expression, mapping_for
from tessera.sim.cluster import Cluster, SimNode
from tessera.sim.simulate import Simulation

MIB = 2**20
A100_STATIC = (
    Path(__file__).resolve().parents[1]
    / "data"
    / "mig"
    / "a100-pcie-40gb.2g10gb-3x1g5gb.nvidia-smi-q-x.xml"
)
NVIDIA_MAP = {"gpu.nvidia.com": "gpu.tessera.dev", "mig.nvidia.com": "gpu.tessera.dev"}


def a100_dynamic(n: int) -> Cluster:
    """One node with ``n`` A100-PCIE-40GB GPUs published for dynamic MIG."""
    gpus = [
        GPU(i, f"GPU-00000000-0000-0000-0000-{i + 1:012x}", "NVIDIA A100-PCIE-40GB", None, None,
            "590.48.01", "13.1", None, None, 40960 * MIB, mig_enabled=True)
        for i in range(n)
    ]  # fmt: skip
    slices = build_resource_slices("a100", gpus, dynamic_mig=DynamicMIG())
    return Cluster([SimNode("a100", {"kubernetes.io/hostname": "a100"}, slices, "a100")])


def a100_static() -> Cluster:
    slices = build_resource_slices("a100", load_inventory(A100_STATIC))
    return Cluster([SimNode("a100", {"kubernetes.io/hostname": "a100"}, slices, "a100")])


def corpus_file(corpus: Path, name: str) -> list[Manifest]:
    return list(expand_workloads(load_file(corpus / "dra-manifests" / name)))


def docs(text: str) -> list[Manifest]:
    return list(
        expand_workloads(
            Manifest(o, Source("t.yaml", d)) for d, o in parse_documents(text, "t.yaml")
        )
    )


def by_pod(res: Any) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for p in res.placements:
        out.setdefault(p.pod, []).append((p.request, p.device.rsplit("/", 1)[1]))
    return out


def test_gpu_test4_four_mig_devices_on_one_parent_per_replica(corpus: Path) -> None:
    # Before: "CEL runtime error: no such key: profile" (the selectors still read the
    # gpu.nvidia.com domain, and a full GPU has no profile), and matchAttribute
    # gpu.nvidia.com/parentUUID no device has.
    ms = corpus_file(corpus, "k8s-dra-driver-gpu__demo_specs_quickstart_v1__gpu-test4.yaml")
    res = Simulation(a100_dynamic(4), ms, class_map=NVIDIA_MAP).run()
    assert res.pending == []
    got = by_pod(res)
    assert sorted(got) == [f"gpu-test4/pod-{i}" for i in range(4)]
    for i in range(4):
        assert got[f"gpu-test4/pod-{i}"] == [
            ("mig-1g-5gb-0", f"gpu-{i}-mig-1g5gb-3"),
            ("mig-1g-5gb-1", f"gpu-{i}-mig-1g5gb-2"),
            ("mig-2g-10gb", f"gpu-{i}-mig-2g10gb-0"),
            ("mig-3g-20gb", f"gpu-{i}-mig-3g20gb-4"),
        ]
    claim = next(o for o in res.objects if o["kind"] == "ResourceClaim")
    spec = claim["spec"]["devices"]
    assert spec["constraints"] == [{"requests": [], "matchAttribute": "gpu.tessera.dev/parentUUID"}]
    assert [s["cel"]["expression"] for s in spec["requests"][0]["exactly"]["selectors"]] == [
        "device.driver == 'gpu.tessera.dev' && device.attributes['gpu.tessera.dev'].type == 'mig'",
        "device.attributes['gpu.tessera.dev'].profile == '1g.5gb'",
    ]
    assert [w for w in res.warnings if "--class-map" in w] == [
        f"{corpus / 'dra-manifests' / 'k8s-dra-driver-gpu__demo_specs_quickstart_v1__gpu-test4.yaml'} "
        "(document 2): ResourceClaimTemplate gpu-test4/mig-devices: --class-map: mig.nvidia.com -> gpu.tessera.dev"
    ]


MIXED = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: mixed-mig}
spec:
  devices:
    requests:
    - name: small
      exactly:
        deviceClassName: mig.nvidia.com
        selectors:
        - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"}
    - name: medium
      exactly:
        deviceClassName: mig.nvidia.com
        selectors:
        - cel: {expression: 'device.attributes["gpu.nvidia.com"]["profile"] == "2g.10gb"'}
        - cel: {expression: "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('9Gi')) >= 0"}
    constraints:
    - requests: [small, medium]
      matchAttribute: gpu.nvidia.com/parentUUID
---
apiVersion: v1
kind: Pod
metadata: {name: mixed}
spec:
  resourceClaims: [{name: mig, resourceClaimName: mixed-mig}]
  containers: [{name: c, image: x, resources: {claims: [{name: mig}]}}]
"""


def test_mixed_mig_claim_on_one_parent() -> None:
    res = Simulation(a100_dynamic(2), docs(MIXED), class_map=NVIDIA_MAP).run()
    assert res.pending == []
    assert by_pod(res) == {
        "default/mixed": [("small", "gpu-0-mig-1g5gb-6"), ("medium", "gpu-0-mig-2g10gb-0")]
    }
    # The same claim without the map: the class does not exist.
    plain = Simulation(a100_dynamic(2), docs(MIXED)).run()
    assert "device class mig.nvidia.com does not exist" in plain.pending[0].reason


def test_multiprocessors_capacity_reads_tessera_s_attribute(corpus: Path) -> None:
    # bats gpu-multiple-mig: one MIG device with < 30 SMs, one with > 50 (NVIDIA publishes
    # multiprocessors as a capacity, Tessera as an int attribute).
    ms = corpus_file(corpus, "k8s-dra-driver-gpu__tests_bats_specs__gpu-multiple-mig.yaml")
    res = Simulation(a100_dynamic(1), ms, class_map=NVIDIA_MAP).run()
    assert by_pod(res) == {
        "default/pod-2mig": [("mig1", "gpu-0-mig-1g5gb-6"), ("mig2", "gpu-0-mig-4g20gb-0")]
    }
    claim = next(o for o in res.objects if o["kind"] == "ResourceClaim")
    sel = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][1]["cel"]["expression"]
    assert sel.strip() == (
        "quantity('0').add(device.attributes['gpu.tessera.dev'].multiprocessors).isLessThan(quantity(\"30\"))"
    )


def test_attribute_without_an_equivalent_is_named(corpus: Path) -> None:
    text = MIXED.replace(
        "'gpu.nvidia.com'].profile == '1g.5gb'\"}",
        "'gpu.nvidia.com'].profile == '1g.5gb' && device.attributes['gpu.nvidia.com'].brand == 'Nvidia'\"}",
    ).replace("matchAttribute: gpu.nvidia.com/parentUUID", "matchAttribute: gpu.nvidia.com/minor")
    res = Simulation(a100_dynamic(1), docs(text), class_map=NVIDIA_MAP).run()
    notes = [w.split(": ", 1)[1] for w in res.warnings if "no equivalent" in w]
    assert notes == [
        f"ResourceClaim default/mixed-mig: --class-map: attribute gpu.nvidia.com/{n} has no equivalent on "
        "gpu.tessera.dev devices: left as it is (selectors reading it match no device, or stop with a CEL "
        "runtime error; constraints on it fail)"
        for n in ("brand", "minor")
    ]


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        (
            "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100'",
            "device.attributes['gpu.tessera.dev'].productName == 'NVIDIA A100'",
        ),
        (
            'device.attributes["gpu.nvidia.com"]["uuid"] == "GPU-1"',
            'device.attributes["gpu.tessera.dev"]["uuid"] == "GPU-1"',
        ),
        (
            "has(device.attributes['gpu.nvidia.com'].parentUUID)",
            "has(device.attributes['gpu.tessera.dev'].parentUUID)",
        ),
        (
            "device.attributes['resource.kubernetes.io'].pciBusID == '0000:65:00.0'",
            "device.attributes['gpu.tessera.dev'].pcieBusID == '0000:65:00.0'",
        ),
        (
            "device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:64'",
            "device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:64'",
        ),
        (
            "device.attributes['gpu.nvidia.com'].numa == 0",
            "device.attributes['gpu.tessera.dev'].numaNode == 0",
        ),
        (
            "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('20Gi'))",
            "device.capacity['gpu.tessera.dev'].memory.isGreaterThan(quantity('20Gi'))",
        ),
        ("device.driver == 'gpu.nvidia.com'", "device.driver == 'gpu.tessera.dev'"),
        ("'gpu.nvidia.com' in device.attributes", "'gpu.nvidia.com' in device.attributes"),
    ],
)
def test_expression_mapping(expr: str, want: str) -> None:
    cm = mapping_for("gpu.nvidia.com", "gpu.tessera.dev", {})
    unmapped: set[str] = set()
    assert map_expression(cm, expr, unmapped) == want
    assert unmapped == set()
