"""``tessera.convert.convert_object`` (whole manifests) and ``gpu_memory_sizes``."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tessera.convert import ConversionError, convert_object, gpu_memory_sizes
from tessera.inventory import build_resource_slices, parse_inventory

DATA = Path(__file__).resolve().parents[1] / "data" / "new-hardware"


def test_cronjob_template_is_converted_in_place(corpus: Path) -> None:
    # The corpus Job, as the job template of a CronJob.
    job = yaml.safe_load(
        (corpus / "hami-pods" / "HAMi__benchmarks_deployments__job-on-hami.yml").read_text()
    )
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "bench"},
        "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": job["spec"]}},
    }
    before = copy.deepcopy(cron)
    res = convert_object(cron, memory_sizes=[81559 << 20], source="cron.yaml")
    assert cron == before  # the input is not mutated
    (tmpl,) = res.templates
    ctr = tmpl["metadata"]["annotations"]["gpu.tessera.dev/container"]
    assert (tmpl["metadata"]["name"], tmpl["metadata"]["namespace"]) == (
        f"nightly-{ctr}-gpu",
        "bench",
    )
    spec = res.obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [
        {"name": f"{ctr}-gpu", "resourceClaimTemplateName": f"nightly-{ctr}-gpu"}
    ]
    assert res.obj["spec"]["schedule"] == "0 3 * * *" and res.obj["kind"] == "CronJob"


def test_objects_without_gpu_requests_come_back_as_they_are(corpus: Path) -> None:
    docs = list(
        yaml.safe_load_all(
            (corpus / "hami-pods" / "HAMi__examples_nvidia__vllm_cross_vgpu.yaml").read_text()
        )
    )
    pvc = docs[0]
    assert convert_object(pvc).obj is pvc
    plain = copy.deepcopy(docs[1])
    for c in plain["spec"]["template"]["spec"]["containers"]:
        c.pop("resources", None)
    res = convert_object(plain)
    assert res.obj is plain and res.templates == []


def test_a_controller_without_a_pod_template_is_an_error() -> None:
    with pytest.raises(
        ConversionError, match=r"^x.yaml: Deployment web: spec.template.spec is missing"
    ):
        convert_object(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "web"},
                "spec": {},
            },
            source="x.yaml",
        )


def test_memory_sizes_skip_devices_without_memory_and_other_drivers(corpus: Path) -> None:
    h100 = parse_inventory(
        (
            corpus
            / "inventories"
            / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
        ).read_text()
    )
    mig = parse_inventory(
        (
            corpus / "inventories" / "netdata-go.d.plugin__nvidia_smi_testdata__a100-sxm4-mig.xml"
        ).read_text()
    )
    gb10 = parse_inventory((DATA / "gb10-dgx-spark.nvidia-smi-q.txt").read_text())
    slices = (
        build_resource_slices("a", h100)
        + build_resource_slices("b", mig)
        + build_resource_slices("c", gb10)
    )
    other = copy.deepcopy(slices[0])
    other["spec"]["driver"] = "gpu.example.com"
    other["spec"]["devices"][0]["capacity"]["memory"]["value"] = "1Gi"
    assert gpu_memory_sizes([*slices, other]) == [81008 << 20, 19968 << 20]
