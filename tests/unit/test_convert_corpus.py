"""tessera.convert over the real HAMi / Volcano manifests in shared/corpus/hami-pods.

The corpus sits beside the repository (``../shared/corpus``) or where ``TESSERA_CORPUS`` says.
A missing corpus is a failure, not a skip.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_convert import ATTRS, H100_80GB, V100S_32GB, assert_api_valid

from corpus_paths import corpus_path
from tessera.convert import ContainerRequest, Conversion, convert_pod

HAMI_PODS = corpus_path().resolve() / "hami-pods"
SIZES = (H100_80GB, V100S_32GB)

# Workload kinds and where their pod template lives.
TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": (),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}

# Files that are not plain YAML manifests (Helm templates, text excerpts): never loaded.
NOT_MANIFESTS = {
    "HAMi-DRA__charts_templates__device-config.helm-template.yaml",
    "HAMi__docs_develop_protocol__pod-allocation-annotations.txt",
}

# Every document holding a pod: (file, doc index) -> (kind, name, converted containers).
EXPECTED_PODS: dict[tuple[str, int], tuple[str, str, int]] = {
    ("HAMi-website__docs_kueue_examples__default-use.yaml", 4): ("Deployment", "gpu-burn", 1),
    ("HAMi-website__docs_nvidia_scheduling-policy__binpack-node-policy.yaml", 0): (
        "Pod",
        "gpu-pod",
        1,
    ),
    ("HAMi-website__docs_volcano-vgpu_examples__use-exclusive-gpu.yaml", 0): ("Pod", "test1", 1),
    ("HAMi__benchmarks_deployments__job-on-hami.yml", 0): ("Job", "ai-benchmark-on-hami", 1),
    ("HAMi__examples_nvidia__default_use.yaml", 0): ("Pod", "gpu-pod", 1),
    ("HAMi__examples_nvidia__default_use_legacy.yaml", 0): ("Pod", "gpu-pod", 1),
    ("HAMi__examples_nvidia__dynamic_mig_example.yaml", 0): ("Pod", "gpu-pod", 1),
    ("HAMi__examples_nvidia__example.yaml", 0): ("Deployment", "cuda-sample-vector-add", 1),
    ("HAMi__examples_nvidia__mig_example.yaml", 0): ("Pod", "gpu-pod", 0),  # MIG profile: warned
    ("HAMi__examples_nvidia__specify_card_type_not_use.yaml", 0): ("Pod", "gpu-pod", 1),
    ("HAMi__examples_nvidia__specify_card_type_to_use.yaml", 0): ("Pod", "gpu-pod", 1),
    ("HAMi__examples_nvidia__specify_scheduling_policy.yaml", 0): ("Pod", "gpu-pod", 1),
    ("HAMi__examples_nvidia__specify_uuid_not_use.yaml", 0): ("Pod", "gpu-pod", 1),
    ("HAMi__examples_nvidia__specify_uuid_to_use.yaml", 0): ("Pod", "gpu-pod", 1),
    ("HAMi__examples_nvidia__use_as_normal.yaml", 0): ("Pod", "gpu-pod1", 1),
    ("HAMi__examples_nvidia__use_as_normal.yaml", 1): ("Pod", "gpu-pod2", 1),
    ("HAMi__examples_nvidia__use_exclusive_card.yaml", 0): ("Pod", "gpu-pod1", 1),
    ("HAMi__examples_nvidia__use_memory_fraction.yaml", 0): ("Pod", "gpu-pod", 1),
    ("HAMi__examples_nvidia__use_sharing_card.yaml", 0): ("Pod", "gpu-pod1", 1),
    ("HAMi__examples_nvidia__use_sharing_card.yaml", 1): ("Pod", "gpu-pod2", 1),
    ("HAMi__examples_nvidia__vllm_cross_vgpu.yaml", 1): ("Deployment", "vllm-cross-vgpu", 1),
    ("volcano-vgpu-device-plugin__examples__gpu-share.yml", 0): ("Pod", "pod1", 0),  # gpu-share
    ("volcano-vgpu-device-plugin__examples__vgpu-case01.yml", 0): ("Pod", "test1", 1),
    ("volcano-vgpu-device-plugin__examples__vgpu-case02.yml", 0): ("Pod", "pod1", 1),
    ("volcano-vgpu-device-plugin__examples__vgpu-case03.yml", 0): ("Pod", "gpu-pod12", 2),
    ("volcano-vgpu-device-plugin__examples__vgpu-deployment.yaml", 0): (
        "Deployment",
        "resnet101-deployment",
        1,
    ),
}


def manifest_files() -> list[Path]:
    assert HAMI_PODS.is_dir(), (
        f"corpus not found at {HAMI_PODS}: check out 'shared' beside the repository or set "
        "TESSERA_CORPUS to the corpus folder"
    )
    return sorted(p for p in HAMI_PODS.iterdir() if p.name not in NOT_MANIFESTS)


def as_pod(doc: dict[str, Any]) -> dict[str, Any] | None:
    """A Pod, or a workload's pod template wrapped as a Pod named after the workload."""
    path = TEMPLATE_PATHS.get(doc.get("kind", ""))
    if path is None:
        return None
    if not path:
        return doc
    template: Any = doc
    for key in path:
        template = template[key]
    meta = dict(template.get("metadata") or {})
    meta["name"] = doc["metadata"]["name"]
    if "namespace" in doc["metadata"]:
        meta["namespace"] = doc["metadata"]["namespace"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def load(name: str) -> list[dict[str, Any]]:
    with (HAMI_PODS / name).open() as f:
        return list(yaml.safe_load_all(f))


def pod_docs() -> dict[tuple[str, int], tuple[str, str, dict[str, Any]]]:
    out = {}
    for path in manifest_files():
        for i, doc in enumerate(load(path.name)):
            if isinstance(doc, dict) and (p := as_pod(doc)) is not None:
                out[(path.name, i)] = (doc["kind"], doc["metadata"]["name"], p)
    return out


def convert_file(name: str, doc: int = 0) -> Conversion:
    p = as_pod(load(name)[doc])
    assert p is not None
    before = copy.deepcopy(p)
    conv = convert_pod(p, memory_sizes=SIZES, source=name)
    assert p == before
    assert_api_valid(conv, p)
    return conv


def spec_of(conv: Conversion, i: int = 0) -> dict[str, Any]:
    return conv.templates[i]["spec"]["spec"]


DISTINCT = [{"requests": ["gpu"], "distinctAttribute": "gpu.tessera.dev/unit"}]
# HAMi's default GPU_CORE_UTILIZATION_POLICY (unset) as Tessera's opaque device config.
WORK_CONSERVING = [
    {
        "requests": ["gpu"],
        "opaque": {
            "driver": "gpu.tessera.dev",
            "parameters": {
                "apiVersion": "gpu.tessera.dev/v1alpha1",
                "kind": "ComputeConfig",
                "policy": "work-conserving",
            },
        },
    }
]
LEVELS = (
    ("nvlink", "gpu.tessera.dev/nvlinkDomain"),
    ("numa", "gpu.tessera.dev/numaNode"),
    ("any", None),
)


def with_topology(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` (one request ``gpu`` of N > 1 GPUs, written as before topology) as convert
    writes it: ``firstAvailable`` over the topology levels (level-major over the memory-size
    subrequests of a percentage), one ``matchAttribute`` constraint per strict level."""
    out = copy.deepcopy(spec)
    (r,) = out["devices"]["requests"]
    alts = (
        [("", r.pop("exactly"))]
        if "exactly" in r
        else [(s.pop("name"), s) for s in r.pop("firstAvailable")]
    )
    r["firstAvailable"] = [
        {"name": f"{level}-{name}" if name else level, **body}
        for level, _ in LEVELS
        for name, body in alts
    ]
    for level, attr in LEVELS:
        if attr:
            refs = [f"gpu/{level}-{name}" if name else f"gpu/{level}" for name, _ in alts]
            out["devices"]["constraints"].append({"requests": refs, "matchAttribute": attr})
    return out


def body_of(spec: dict[str, Any]) -> dict[str, Any]:
    """The request body of a one-GPU request, or of the last topology level of a multi-GPU one."""
    r = spec["devices"]["requests"][0]
    if "exactly" in r:
        return r["exactly"]
    return {k: v for k, v in r["firstAvailable"][-1].items() if k != "name"}


# ---- the whole corpus --------------------------------------------------------------------------
def test_corpus_is_present_and_complete() -> None:
    names = {p.name for p in HAMI_PODS.iterdir()}
    assert names >= NOT_MANIFESTS
    assert len(names) == 27  # SOURCES.md: hami-pods/ holds 27 files


def test_exactly_these_documents_hold_pods() -> None:
    found = {k: (kind, name) for k, (kind, name, _) in pod_docs().items()}
    assert found == {k: (kind, name) for k, (kind, name, _) in EXPECTED_PODS.items()}


def test_non_pod_documents_are_known_kinds() -> None:
    kinds = sorted(
        {
            doc["kind"]
            for path in manifest_files()
            for doc in load(path.name)
            if isinstance(doc, dict) and doc.get("kind") not in TEMPLATE_PATHS
        }
    )
    assert kinds == [
        "ClusterQueue",
        "LocalQueue",
        "Namespace",
        "PersistentVolumeClaim",
        "ResourceFlavor",
        "ResourceQuota",
    ]


@pytest.mark.parametrize(("name", "doc"), sorted(EXPECTED_PODS))
def test_every_corpus_pod_converts(name: str, doc: int) -> None:
    _, _, n_templates = EXPECTED_PODS[(name, doc)]
    conv = convert_file(name, doc)
    assert len(conv.templates) == n_templates
    if n_templates == 0:
        # HAMi-ish but unsupported: said so, pod left as it was.
        assert len(conv.warnings) == 1 and "not converted (left unchanged)" in conv.warnings[0]
        assert conv.pod == as_pod(load(name)[doc])


# ---- exact outputs for real files -------------------------------------------------------------
def test_default_use() -> None:
    conv = convert_file("HAMi__examples_nvidia__default_use.yaml")
    assert conv.templates == [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": "gpu-pod-ubuntu-container-gpu",
                "labels": {"app.kubernetes.io/managed-by": "tessera"},
                "annotations": {
                    "gpu.tessera.dev/hami-request": "nvidia.com/gpu=1,nvidia.com/gpumem=3000,"
                    "nvidia.com/gpucores=30",
                    "gpu.tessera.dev/container": "ubuntu-container",
                },
            },
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": "gpu.tessera.dev",
                                    "allocationMode": "ExactCount",
                                    "count": 1,
                                    "capacity": {"requests": {"memory": "3000Mi", "cores": "30"}},
                                },
                            }
                        ],
                        "config": WORK_CONSERVING,
                    }
                }
            },
        }
    ]
    assert conv.pod["spec"] == {
        "containers": [
            {
                "name": "ubuntu-container",
                "image": "ubuntu:22.04",
                "command": ["bash", "-c", "sleep 86400"],
                "resources": {"claims": [{"name": "ubuntu-container-gpu"}]},
            }
        ],
        "resourceClaims": [
            {
                "name": "ubuntu-container-gpu",
                "resourceClaimTemplateName": "gpu-pod-ubuntu-container-gpu",
            }
        ],
    }
    assert conv.requests == [
        ContainerRequest(
            container="ubuntu-container",
            gpus=1,
            memory_mib=3000,
            memory_percentage=None,
            cores=30,
            claim_name="ubuntu-container-gpu",
            template_name="gpu-pod-ubuntu-container-gpu",
        )
    ]
    assert conv.warnings == []


def test_use_memory_fraction_80gb_and_32gb() -> None:
    conv = convert_file("HAMi__examples_nvidia__use_memory_fraction.yaml")

    def sub(i: int, size: str, memory: str) -> dict[str, Any]:
        return {
            "name": f"mem-{i}",
            "deviceClassName": "gpu.tessera.dev",
            "allocationMode": "ExactCount",
            "count": 2,
            "selectors": [
                {
                    "cel": {
                        "expression": 'has(device.capacity["gpu.tessera.dev"].memory) && '
                        f'device.capacity["gpu.tessera.dev"].memory == quantity("{size}")'
                    }
                }
            ],
            "capacity": {"requests": {"memory": memory, "cores": "30"}},
        }

    assert spec_of(conv) == with_topology(
        {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        # 50 % of 81559 MiB = 40779.5 -> 40779 MiB; of 32510 MiB = 16255 MiB
                        "firstAvailable": [
                            sub(0, "81559Mi", "40779Mi"),
                            sub(1, "32510Mi", "16255Mi"),
                        ],
                    }
                ],
                "constraints": DISTINCT,
                "config": WORK_CONSERVING,
            }
        }
    )
    assert conv.requests[0].memory_percentage == 50 and conv.requests[0].cores == 30


def test_specify_card_type_to_use() -> None:
    conv = convert_file("HAMi__examples_nvidia__specify_card_type_to_use.yaml")
    assert spec_of(conv) == with_topology(
        {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.tessera.dev",
                            "allocationMode": "ExactCount",
                            "count": 2,
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": f"has({ATTRS}.productName) && "
                                        f'({ATTRS}.productName.lowerAscii().contains("a100")'
                                        f' || {ATTRS}.productName.lowerAscii().contains("v100"))'
                                    }
                                }
                            ],
                            "capacity": {"requests": {"cores": "100"}},
                        },
                    }
                ],
                "constraints": DISTINCT,
            }
        }
    )
    assert conv.pod["metadata"]["annotations"] == {"nvidia.com/use-gputype": "A100,V100"}


ONE_UUID = '["GPU-03f69c50-207a-2038-9b45-23cac89cb67d"]'
BOTH_UUIDS = (
    '["GPU-03f69c50-207a-2038-9b45-23cac89cb67d", "GPU-03f69c50-207a-2038-9b45-23cac89cb67e"]'
)


def test_specify_uuid_not_use() -> None:
    conv = convert_file("HAMi__examples_nvidia__specify_uuid_not_use.yaml")
    assert spec_of(conv) == with_topology(
        {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.tessera.dev",
                            "allocationMode": "ExactCount",
                            "count": 2,
                            "selectors": [
                                {
                                    "cel": {
                                        "expression": f"!((has({ATTRS}.uuid) && {ATTRS}.uuid in {ONE_UUID}) || "
                                        f"(has({ATTRS}.parentUUID) && {ATTRS}.parentUUID in {ONE_UUID}))"
                                    }
                                }
                            ],
                            "capacity": {"requests": {"cores": "100"}},
                        },
                    }
                ],
                "constraints": DISTINCT,
            }
        }
    )


def test_specify_uuid_to_use_lists_both_uuids() -> None:
    conv = convert_file("HAMi__examples_nvidia__specify_uuid_to_use.yaml")
    assert spec_of(conv)["devices"]["requests"][0]["exactly"]["selectors"] == [
        {
            "cel": {
                "expression": f"(has({ATTRS}.uuid) && {ATTRS}.uuid in {BOTH_UUIDS}) || "
                f"(has({ATTRS}.parentUUID) && {ATTRS}.parentUUID in {BOTH_UUIDS})"
            }
        }
    ]
    assert "constraints" not in spec_of(conv)["devices"]  # one GPU


def test_use_exclusive_card() -> None:
    conv = convert_file("HAMi__examples_nvidia__use_exclusive_card.yaml")
    assert spec_of(conv) == with_topology(
        {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.tessera.dev",
                            "allocationMode": "ExactCount",
                            "count": 2,
                            "capacity": {"requests": {"cores": "100"}},  # whole memory by default
                        },
                    }
                ],
                "constraints": DISTINCT,
            }
        }
    )
    assert conv.requests[0].whole_memory and conv.requests[0].cores == 100


def test_kueue_deployment_with_quoted_strings() -> None:
    conv = convert_file("HAMi-website__docs_kueue_examples__default-use.yaml", 4)
    assert conv.templates[0]["metadata"]["name"] == "gpu-burn-main-gpu"
    assert conv.templates[0]["metadata"]["namespace"] == "kueue-test"
    assert spec_of(conv) == with_topology(
        {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.tessera.dev",
                            "allocationMode": "ExactCount",
                            "count": 2,
                            "capacity": {"requests": {"memory": "1Gi", "cores": "30"}},
                        },
                    }
                ],
                "constraints": DISTINCT,
                "config": WORK_CONSERVING,
            }
        }
    )
    assert conv.pod["metadata"] == {
        "name": "gpu-burn",
        "namespace": "kueue-test",
        "labels": {"app-name": "gpu-burn"},
    }
    assert conv.pod["spec"]["containers"][0]["resources"] == {"claims": [{"name": "main-gpu"}]}


def test_volcano_vgpu_case03_three_containers() -> None:
    conv = convert_file("volcano-vgpu-device-plugin__examples__vgpu-case03.yml")

    def claim(memory: str) -> dict[str, Any]:
        return {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.tessera.dev",
                            "allocationMode": "ExactCount",
                            "count": 2,
                            "capacity": {"requests": {"memory": memory, "cores": "0"}},
                        },
                    }
                ],
                "constraints": DISTINCT,
            }
        }

    assert [t["metadata"]["name"] for t in conv.templates] == [
        "gpu-pod12-ubuntu-container-gpu",
        "gpu-pod12-ubuntu-container1-gpu",
    ]
    assert [spec_of(conv, 0), spec_of(conv, 1)] == [
        with_topology(claim("2000Mi")),
        with_topology(claim("3000Mi")),
    ]
    containers = conv.pod["spec"]["containers"]
    assert [c.get("resources") for c in containers] == [
        {"claims": [{"name": "ubuntu-container-gpu"}]},
        None,  # ubuntu-container0 asks for nothing and is left alone
        {"claims": [{"name": "ubuntu-container1-gpu"}]},
    ]
    assert conv.pod["spec"]["resourceClaims"] == [
        {
            "name": "ubuntu-container-gpu",
            "resourceClaimTemplateName": "gpu-pod12-ubuntu-container-gpu",
        },
        {
            "name": "ubuntu-container1-gpu",
            "resourceClaimTemplateName": "gpu-pod12-ubuntu-container1-gpu",
        },
    ]
    assert conv.pod["spec"]["schedulerName"] == "volcano"
    assert [(r.container, r.gpus, r.memory_mib, r.family) for r in conv.requests] == [
        ("ubuntu-container", 2, 2000, "volcano"),
        ("ubuntu-container1", 2, 3000, "volcano"),
    ]


def test_job_on_hami_percentage_in_requests_and_limits() -> None:
    conv = convert_file("HAMi__benchmarks_deployments__job-on-hami.yml")
    subs = spec_of(conv)["devices"]["requests"][0]["firstAvailable"]
    assert [s["capacity"]["requests"] for s in subs] == [
        {"memory": "40779Mi", "cores": "0"},
        {"memory": "16255Mi", "cores": "0"},
    ]
    server, client = conv.pod["spec"]["containers"]
    assert server["resources"] == {"claims": [{"name": "vllm-server-gpu"}]}
    assert "resources" not in client
    assert conv.warnings == []


def test_vllm_cross_vgpu_keeps_cpu_and_memory() -> None:
    conv = convert_file("HAMi__examples_nvidia__vllm_cross_vgpu.yaml", 1)
    res = conv.pod["spec"]["containers"][0]["resources"]
    assert res == {
        "limits": {"cpu": "8", "memory": "20Gi"},
        "requests": {"cpu": "2", "memory": "6Gi"},
        "claims": [{"name": "vllm-gpu"}],
    }
    subs = spec_of(conv)["devices"]["requests"][0]["firstAvailable"]
    # 30 % of 81559 MiB = 24467.7 -> 24467 MiB; of 32510 MiB = 9753 MiB; 2 GPUs: each size on
    # one NVLink domain, then one NUMA node, then anywhere
    assert [(s["name"], s["capacity"]["requests"]) for s in subs] == [
        (f"{level}-mem-{i}", {"memory": mem, "cores": "30"})
        for level in ("nvlink", "numa", "any")
        for i, mem in enumerate(("24467Mi", "9753Mi"))
    ]


def test_scheduling_policy_annotations_are_recorded() -> None:
    conv = convert_file("HAMi__examples_nvidia__specify_scheduling_policy.yaml")
    assert (conv.node_scheduler_policy, conv.gpu_scheduler_policy) == ("spread", "binpack")
    binpack = convert_file("HAMi-website__docs_nvidia_scheduling-policy__binpack-node-policy.yaml")
    assert (binpack.node_scheduler_policy, binpack.gpu_scheduler_policy) == ("binpack", None)
    assert body_of(spec_of(binpack))["capacity"] == {"requests": {"memory": "4000Mi", "cores": "0"}}


def test_sharing_cards_and_exclusive_volcano() -> None:
    one = convert_file("HAMi__examples_nvidia__use_sharing_card.yaml", 0)
    two = convert_file("HAMi__examples_nvidia__use_sharing_card.yaml", 1)
    assert [(r.memory_percentage, r.cores) for r in one.requests + two.requests] == [
        (40, 60),
        (60, 40),
    ]
    excl = convert_file("HAMi-website__docs_volcano-vgpu_examples__use-exclusive-gpu.yaml")
    assert spec_of(excl)["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"cores": "100"}
    }


def test_dynamic_mig_example_selects_mig_devices() -> None:
    conv = convert_file("HAMi__examples_nvidia__dynamic_mig_example.yaml")
    body = body_of(spec_of(conv))
    assert body["selectors"] == [
        {"cel": {"expression": f'has({ATTRS}.type) && {ATTRS}.type == "mig"'}}
    ]
    assert body["capacity"] == {"requests": {"memory": "8000Mi", "cores": "0"}}
    assert conv.gpu_scheduler_policy == "binpack"
    assert conv.warnings == []
    # gpu: 2 asks two distinct MIG devices, which may share a parent GPU (HAMi's example puts
    # two 2g.10gb on one A100-40GB): distinct on `unit`; MIG devices have no NVLink domain, so
    # the last topology level ("any") is the one they fit.
    assert spec_of(conv)["devices"]["constraints"][0] == DISTINCT[0]
    assert [s["name"] for s in spec_of(conv)["devices"]["requests"][0]["firstAvailable"]] == [
        "nvlink",
        "numa",
        "any",
    ]


def test_unsupported_corpus_resources_say_so() -> None:
    mig = convert_file("HAMi__examples_nvidia__mig_example.yaml")
    assert mig.warnings == [
        "HAMi__examples_nvidia__mig_example.yaml: pod gpu-pod, container ubuntu-container: "
        "nvidia.com/mig-3g.20gb is a MIG-profile resource, not converted (left unchanged): ask "
        "nvidia.com/gpu with annotation nvidia.com/vgpu-mode: mig, or write a DRA claim "
        'selecting type "mig"'
    ]
    share = convert_file("volcano-vgpu-device-plugin__examples__gpu-share.yml")
    assert share.warnings == [
        "volcano-vgpu-device-plugin__examples__gpu-share.yml: pod pod1, container pod1-ctr: "
        "volcano.sh/gpu-memory belongs to Volcano's gpu-share plugin, not converted (left "
        "unchanged): use volcano.sh/vgpu-number with volcano.sh/vgpu-memory (MiB)"
    ]
