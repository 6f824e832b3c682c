"""HAMi's other vendors at the HAMi edge: the vendors' own manifests, converted into claims for
their DRA drivers (Ascend: HAMi's Ascend driver; Hygon: Hygon's HCU driver), then allocated by
the allocator against those drivers' slices and DeviceClasses (``tests/data/vendors``,
``SOURCES.md`` there)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tessera.allocator import AllocatedState, Allocator, Features, Node
from tessera.api.vendors import ASCEND, ASCEND_CHIPS, HYGON, installed_vendors
from tessera.cli import main
from tessera.convert import ConversionError, compute_unit_sizes, convert_object, convert_pod

DATA = Path(__file__).resolve().parents[1] / "data" / "vendors"
INSTALLED = ("ascend", "hygon")


def load(rel: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DATA / rel).read_text()) if d]


def one(rel: str) -> dict[str, Any]:
    (doc,) = load(rel)
    return doc


HYGON_SLICE = one("hcu-dra-driver/resourceslice-k100-ai.yaml")
ASCEND_SLICE = one("ascend-dra-driver/resourceslice-310p3.yaml")
CLASSES = {
    c["metadata"]["name"]: c
    for c in (
        one("hcu-dra-driver/deviceclass.yaml"),
        one("hami-dra/deviceclass-hami-vnpu-core.yaml"),
    )
}


def allocate(template: dict[str, Any], slice_: dict[str, Any]) -> dict[str, Any] | None:
    """The allocation upstream's allocator gives the template's claim on the slice's node."""
    claim = {"metadata": {"name": "claim", "namespace": "ns"}, "spec": template["spec"]["spec"]}
    a = Allocator([slice_], CLASSES, AllocatedState(), Features(), random.Random(0))
    out = a.allocate(Node(slice_["spec"]["nodeName"], {}), [claim])
    return None if out is None else out[0]


def consumed(result: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    return [(r["device"], r.get("consumedCapacity", {})) for r in result["devices"]["results"]]


def test_the_drivers_own_device_classes_are_the_tables() -> None:
    assert installed_vendors(set(CLASSES)) == {"ascend", "hygon"}
    assert set(CLASSES) == {ASCEND.device_class, HYGON.device_class}
    assert compute_unit_sizes([HYGON_SLICE, ASCEND_SLICE]) == [120]


# ---- Hygon: HAMi's examples/hygon on Hygon's HCU driver ---------------------------------------
def hygon(rel: str, units: tuple[int, ...] = (120,)) -> Any:
    pod = one(f"hami-examples/hygon/{rel}")
    pod["metadata"]["namespace"] = "ns"
    return convert_pod(pod, vendors=INSTALLED, compute_units=units)


def test_hygon_default_use_books_60_percent_of_the_k100_ai_compute_units() -> None:
    conv = hygon("default_use.yaml")
    assert conv.warnings == []
    (t,) = conv.templates
    assert t["metadata"]["name"] == "vdcu-pytorch-demo-vdcu-pytorch-demo-hcu"
    req = t["spec"]["spec"]["devices"]["requests"][0]
    assert req["name"] == "hcu"
    assert req["exactly"]["deviceClassName"] == "dra.hygon.com"
    # 60 % of 120 CUs = 72 CUs; dcumem 2000 MiB
    assert req["exactly"]["capacity"] == {"requests": {"memory": "2000Mi", "cores": "72"}}
    c = conv.pod["spec"]["containers"][0]
    assert c["resources"] == {"claims": [{"name": "vdcu-pytorch-demo-hcu"}]}
    assert conv.pod["spec"]["resourceClaims"] == [
        {
            "name": "vdcu-pytorch-demo-hcu",
            "resourceClaimTemplateName": "vdcu-pytorch-demo-vdcu-pytorch-demo-hcu",
        }
    ]
    result = allocate(t, HYGON_SLICE)
    assert result is not None
    # the driver's own slices default: one of the card's 4 vHCU slices per allocation
    assert consumed(result) == [
        ("hcu-0000-1c-00-0", {"cores": "72", "memory": "2000Mi", "slices": "1"})
    ]


def test_hygon_cores_round_up_per_card_size_through_first_available() -> None:
    conv = hygon("default_use.yaml", units=(120, 64))
    subs = conv.templates[0]["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"]
    # ceil(60 % x 120) = 72, ceil(60 % x 64) = ceil(38.4) = 39: each on cards of its size
    assert [(s["name"], s["capacity"]["requests"]["cores"]) for s in subs] == [
        ("cu-0", "72"),
        ("cu-1", "39"),
    ]
    result = allocate(conv.templates[0], HYGON_SLICE)
    assert result is not None and result["devices"]["results"][0]["request"] == "hcu/cu-0"


def test_hygon_card_type_and_uuid_annotations_select_on_the_drivers_attributes() -> None:
    # HAMi writes DCU-K100_AI and DCU-<serial>; the HCU driver publishes K100_AI and <serial>
    for rel, fits in (
        ("specify_card_type_to_use.yaml", True),
        ("specify_card_type_not_use.yaml", False),
        ("specify_uuid_to_use.yaml", True),
        ("specify_uuid_not_use.yaml", False),
    ):
        conv = hygon(rel)
        assert conv.warnings == [], rel
        assert (allocate(conv.templates[0], HYGON_SLICE) is not None) is fits, rel


def test_hygon_exclusive_card_takes_two_whole_distinct_cards() -> None:
    conv = hygon("use_exclusive_card.yaml", units=())
    devices = conv.templates[0]["spec"]["spec"]["devices"]
    req = devices["requests"][0]["exactly"]
    assert req["count"] == 2 and "capacity" not in req  # the driver's defaults: whole cards
    assert devices["constraints"] == [
        {"requests": ["hcu"], "distinctAttribute": "dra.hygon.com/uuid"}
    ]
    assert conv.requests[0].hami_view() == "hygon.com/dcunum=2,hygon.com/dcucores=100"
    assert allocate(conv.templates[0], HYGON_SLICE) is None  # one card on the node


def test_hygon_percentage_without_known_cards_is_refused_naming_the_field() -> None:
    with pytest.raises(ConversionError, match=r"hygon.com/dcucores 60 is a percentage") as e:
        hygon("default_use.yaml", units=())
    assert e.value.field == "hygon.com/dcucores"


# ---- Ascend: HAMi's examples/ascend and HAMi-DRA's example on HAMi's Ascend driver ------------
def ascend(rel: str) -> Any:
    pod = one(rel)
    pod["metadata"]["namespace"] = "ns"
    return convert_pod(pod, vendors=INSTALLED)


@pytest.mark.parametrize(
    ("chip", "memory", "cores", "template"),
    [
        # 2000 MiB rounds up to the chip's smallest vNPU template; cores its AICores' share
        ("310P", "3Gi", "13", "vir01"),  # 3072 MiB, 1 of 8 AICores
        ("910A", "2184Mi", "7", "vir02"),  # 2 of 30
        ("910B2", "8Gi", "13", "vir03_1c_8g"),  # 3 of 24
        ("910B3", "16Gi", "25", "vir05_1c_16g"),  # 5 of 20
        ("910B4", "8Gi", "25", "vir05_1c_8g"),  # 5 of 20
    ],
)
def test_hami_ascend_examples_book_their_vnpu_template(
    chip: str, memory: str, cores: str, template: str
) -> None:
    conv = ascend(f"hami-examples/ascend/job-{chip}.yaml")
    assert conv.warnings == []
    (t,) = conv.templates
    word = f"ascend{chip.lower()}"
    assert t["metadata"]["name"] == f"{word}-job-ubuntu-container-{word}"
    req = t["spec"]["spec"]["devices"]["requests"][0]
    assert req["name"] == "npu"
    assert req["exactly"]["deviceClassName"] == "hami-vnpu-core.project-hami.io"
    assert req["exactly"]["capacity"] == {"requests": {"memory": memory, "cores": cores}}
    assert conv.requests[0].template == template
    (c,) = conv.pod["spec"]["containers"]
    assert c["resources"] == {"claims": [{"name": f"ubuntu-container-{word}"}]}


def test_hami_310p_example_lands_on_a_310p3_and_not_on_another_chip() -> None:
    conv = ascend("hami-examples/ascend/job-310P.yaml")
    result = allocate(conv.templates[0], ASCEND_SLICE)
    assert result is not None
    assert consumed(result) == [("npu-0-0", {"cores": "13", "memory": "3Gi"})]
    other = ascend("hami-examples/ascend/job-910B3.yaml")
    assert allocate(other.templates[0], ASCEND_SLICE) is None  # productName 310P3 != 910B3


def test_hami_910c_example_takes_a_pair_of_npus() -> None:
    conv = ascend("hami-examples/ascend/job-910C.yaml")
    assert conv.warnings == [
        "pod ns/ascend910c-job, container ubuntu-container: huawei.com/Ascend910C 1 is 2: "
        "Ascend910C NPUs are allocated in pairs (as HAMi does)"
    ]
    devices = conv.templates[0]["spec"]["spec"]["devices"]
    assert devices["requests"][0]["exactly"]["count"] == 2
    assert devices["requests"][0]["exactly"]["capacity"]["requests"] == {
        "memory": "16Gi",
        "cores": "25",
    }
    assert devices["constraints"] == [
        {"requests": ["npu"], "distinctAttribute": "ascend.project-hami.io/uuid"}
    ]


def test_hami_dra_ascend_example_is_a_soft_split_share() -> None:
    conv = ascend("hami-dra/ascend-share.yaml")
    assert conv.warnings == [
        "pod ns/ascend-share, container app: huawei.com/Ascend310P-core is read as HAMi's soft "
        "split (memory as asked, no vNPU template), what the driver does; HAMi's device plugin "
        'needs annotation huawei.com/vnpu-mode: "hami-core" for it'
    ]
    req = conv.templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert req["capacity"] == {"requests": {"memory": "1Gi", "cores": "50"}}
    exprs = [s["cel"]["expression"] for s in req["selectors"]]
    assert (
        'has(device.attributes["ascend.project-hami.io"].uuid) && '
        'device.attributes["ascend.project-hami.io"].uuid in ["<device-uuid>"]'
    ) in exprs
    # the example's UUID is a placeholder: no NPU has it
    assert allocate(conv.templates[0], ASCEND_SLICE) is None
    pod = one("hami-dra/ascend-share.yaml")
    pod["metadata"]["annotations"]["hami.io/use-Ascend310P-uuid"] = "npu-node-1-1"
    conv = convert_pod(pod, vendors=INSTALLED)
    result = allocate(conv.templates[0], ASCEND_SLICE)
    assert result is not None
    assert consumed(result) == [("npu-1-0", {"cores": "50", "memory": "1Gi"})]


def test_ascend_bad_values_are_refused_naming_the_field() -> None:
    pod = one("hami-examples/ascend/job-310P.yaml")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    limits["huawei.com/Ascend310P-memory"] = 30000  # over the 310P's 24576 MiB
    with pytest.raises(ConversionError, match="more than an Ascend310P holds") as e:
        convert_pod(pod, vendors=INSTALLED)
    assert e.value.field == "huawei.com/Ascend310P-memory"
    limits["huawei.com/Ascend310P-memory"] = 2000
    limits["huawei.com/Ascend310P"] = 2  # a template serves one NPU (HAMi refuses it too)
    with pytest.raises(ConversionError, match=r"vNPU template \(vir01\)") as e:
        convert_pod(pod, vendors=INSTALLED)
    assert e.value.field == "huawei.com/Ascend310P-memory"
    pod["metadata"]["annotations"] = {"huawei.com/vnpu-mode": "hami-core"}
    limits["huawei.com/Ascend310P-core"] = 101
    with pytest.raises(ConversionError, match="is over 100") as e:
        convert_pod(pod, vendors=INSTALLED)
    assert e.value.field == "huawei.com/Ascend310P-core"


def test_a_chip_above_every_template_gets_the_whole_npu() -> None:
    pod = one("hami-examples/ascend/job-310P.yaml")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    limits["huawei.com/Ascend310P-memory"] = 20000  # above vir04 (12288), within 24576
    conv = convert_pod(pod, vendors=INSTALLED)
    req = conv.templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert req["capacity"] == {"requests": {"cores": "100"}}  # memory: the device's default
    result = allocate(conv.templates[0], ASCEND_SLICE)
    assert result is not None
    assert consumed(result) == [("npu-0-0", {"cores": "100", "memory": "24Gi"})]


# ---- installed or not; mixed pods ---------------------------------------------------------------
def test_a_vendor_without_its_driver_keeps_its_requests_with_a_warning() -> None:
    pod = one("hami-examples/hygon/default_use.yaml")
    conv = convert_pod(pod, vendors=("ascend",))
    assert conv.templates == [] and conv.pod == pod
    assert conv.warnings == [
        "pod vdcu-pytorch-demo, container vdcu-pytorch-demo: hygon.com/dcucores, "
        "hygon.com/dcumem, hygon.com/dcunum: the cluster has no DRA driver dra.hygon.com for "
        "Hygon DCUs (no DeviceClass dra.hygon.com); left unchanged (tessera convert: --vendor "
        "hygon says it is installed)"
    ]


def test_one_claim_per_vendor_per_container() -> None:
    pod = one("hami-examples/ascend/job-310P.yaml")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    limits.update({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "hygon.com/dcunum": 1})
    conv = convert_pod(pod, vendors=INSTALLED)
    assert [t["spec"]["spec"]["devices"]["requests"][0]["name"] for t in conv.templates] == [
        "gpu",
        "npu",
        "hcu",
    ]
    assert [r.vendor for r in conv.requests] == ["tessera", "ascend", "hygon"]
    (c,) = conv.pod["spec"]["containers"]
    assert c["resources"] == {
        "claims": [
            {"name": "ubuntu-container-gpu"},
            {"name": "ubuntu-container-ascend310p"},
            {"name": "ubuntu-container-hcu"},
        ]
    }


def test_two_spellings_of_hygon_cards_are_refused() -> None:
    pod = one("hami-examples/hygon/default_use.yaml")
    pod["spec"]["containers"][0]["resources"]["limits"]["hygon.com/hcunum"] = 1
    with pytest.raises(ConversionError, match="two spellings of the same cards") as e:
        convert_pod(pod, vendors=INSTALLED, compute_units=(120,))
    assert e.value.field == "hygon.com/dcunum"


def test_hami_dra_hcu_spelling_converts_like_hami_s() -> None:
    pod = one("hami-examples/hygon/default_use.yaml")
    pod["spec"]["containers"][0]["resources"]["limits"] = {
        "hygon.com/hcunum": 1,
        "hygon.com/hcucores": 60,
        "hygon.com/hcumem": 2000,
    }
    conv = convert_pod(pod, vendors=INSTALLED, compute_units=(120,))
    req = conv.templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert req["capacity"] == {"requests": {"memory": "2000Mi", "cores": "72"}}


def test_every_ascend_chip_has_templates_in_memory_order() -> None:
    # HAMi's trimMemory walks templates in memory order (InitDevices sorts them)
    for chip in ASCEND_CHIPS:
        mems = [t.memory_mib for t in chip.templates]
        assert mems == sorted(mems) and mems[-1] <= chip.memory_capacity_mib, chip.common_word


# ---- the drivers' own DRA manifests pass through unchanged ---------------------------------------
@pytest.mark.parametrize(
    "rel",
    [
        "hcu-dra-driver/resourceclaim-hcu-basic.yaml",
        "hcu-dra-driver/pod-hcu-consumer.yaml",
        "ascend-dra-driver/workloads.yaml",
        "ascend-dra-driver/setup-resources.yaml",
    ],
)
def test_dra_native_demo_specs_are_left_as_they_are(rel: str) -> None:
    for doc in load(rel):
        res = convert_object(doc, vendors=INSTALLED)
        assert res.obj == doc and res.templates == [] and res.warnings == []


def test_hcu_driver_demo_claim_allocates_on_its_slice() -> None:
    claim = one("hcu-dra-driver/resourceclaim-hcu-basic.yaml")
    result = allocate({"spec": {"spec": claim["spec"]}}, HYGON_SLICE)
    assert result is not None
    assert consumed(result) == [
        ("hcu-0000-1c-00-0", {"cores": "60", "memory": "20Gi", "slices": "1"})
    ]


# ---- tessera convert: --vendor, or the vendor's DeviceClass among the manifests ----------------
def test_cli_convert_needs_to_be_told_the_driver_is_installed() -> None:
    runner = CliRunner()
    pod = str(DATA / "hami-examples/hygon/default_use.yaml")
    slice_ = str(DATA / "hcu-dra-driver/resourceslice-k100-ai.yaml")
    plain = runner.invoke(main, ["convert", pod])
    assert plain.exit_code == 0
    assert "no DRA driver dra.hygon.com" in plain.stderr
    assert "hygon.com/dcunum: 1" in plain.stdout
    for extra in (["--vendor", "hygon"], [str(DATA / "hcu-dra-driver/deviceclass.yaml")]):
        res = runner.invoke(main, ["convert", *extra, pod, slice_])
        assert res.exit_code == 0, res.output
        assert res.stderr == ""
        docs = [d for d in yaml.safe_load_all(res.stdout) if d]
        (t,) = [d for d in docs if d["kind"] == "ResourceClaimTemplate"]
        assert t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
            "requests": {"memory": "2000Mi", "cores": "72"}
        }


def test_ascend_soft_split_annotation_books_memory_as_asked() -> None:
    pod = one("hami-examples/ascend/job-310P.yaml")
    pod["metadata"]["annotations"] = {"huawei.com/vnpu-mode": "hami-core"}
    conv = convert_pod(pod, vendors=INSTALLED)
    assert conv.warnings == []
    req = conv.templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    # 2000 MiB as written, HAMi's soft split without -core reserves no AICores
    assert req["capacity"] == {"requests": {"memory": "2000Mi", "cores": "0"}}
    assert conv.requests[0].template == ""
    # -core 0 without the annotation is no request: still HAMi's hard split (vir01)
    del pod["metadata"]["annotations"]
    pod["spec"]["containers"][0]["resources"]["limits"]["huawei.com/Ascend310P-core"] = 0
    conv = convert_pod(pod, vendors=INSTALLED)
    assert conv.warnings == [] and conv.requests[0].template == "vir01"


def test_other_names_under_a_vendors_prefix_are_warned_and_kept() -> None:
    # Huawei's own device plugin names huawei.com/Ascend910; Hygon's its own hygon.com/dcu
    pod = one("hami-examples/ascend/job-310P.yaml")
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    limits.update({"huawei.com/Ascend910": 1, "hygon.com/dcu": 1})
    conv = convert_pod(pod, vendors=INSTALLED)
    assert len(conv.templates) == 1
    assert conv.pod["spec"]["containers"][0]["resources"]["limits"] == {
        "huawei.com/Ascend910": 1,
        "hygon.com/dcu": 1,
    }
    head = "pod ascend310p-job, container ubuntu-container: "
    assert conv.warnings == [
        f"{head}huawei.com/Ascend910 is not one of HAMi's names for Ascend NPUs (left unchanged); "
        "Tessera converts huawei.com/<chip>, <chip>-memory, <chip>-core for chips Ascend910A, "
        "Ascend910B2, Ascend910B3, Ascend910B4-1, Ascend910B4, Ascend310P, Ascend910C",
        f"{head}hygon.com/dcu is not one of HAMi's names for Hygon DCUs (left unchanged); "
        "Tessera converts hygon.com/dcunum, hygon.com/dcumem, hygon.com/dcucores, "
        "hygon.com/hcunum, hygon.com/hcumem, hygon.com/hcucores",
    ]
