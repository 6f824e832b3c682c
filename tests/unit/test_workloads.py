"""Workloads a user keeps in Git, as their controllers make pods: DaemonSets (one pod per
eligible node), ReplicationControllers, Jobs (parallelism, completions, suspend), CronJobs;
objects of other APIs named in one line; one table of where pod templates are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from tessera.api import validation
from tessera.api.loader import WORKLOAD_KINDS, Manifest, Source
from tessera.api.workloads import POD_TEMPLATE_PATHS
from tessera.cli import main
from tessera.convert import manifests as convert_manifests
from tessera.lint import lint

H100 = "inventories/gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
A10 = "inventories/gpud__nvidia-query_testdata__nvidia-smi-q.535.129.03.A10.txt"
HAMI_POD = "hami-pods/HAMi__examples_nvidia__default_use.yaml"


def _run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.stdout, r.stderr


def _cluster(tmp_path: Path, corpus: Path) -> Path:
    """Four GPU nodes labelled as HAMi labels them (gpu: on) and one CPU node: a cordoned
    H100 node (the DaemonSet controller tolerates node.kubernetes.io/unschedulable), a node
    whose taint only pods tolerating it may use, and an A10 node."""
    f = tmp_path / "cluster.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "tessera.dev/v1alpha1",
                "kind": "Cluster",
                "nodes": [
                    {
                        "name": "h100",
                        "count": 2,
                        "inventory": str(corpus / H100),
                        "labels": {"gpu": "on"},
                    },
                    {
                        "name": "cordoned",
                        "inventory": str(corpus / H100),
                        "labels": {"gpu": "on"},
                        "taints": [
                            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
                        ],
                    },
                    {
                        "name": "reserved",
                        "inventory": str(corpus / H100),
                        "labels": {"gpu": "on"},
                        "taints": [{"key": "team", "value": "infer", "effect": "NoSchedule"}],
                    },
                    {"name": "a10", "inventory": str(corpus / A10), "labels": {"gpu": "on"}},
                    {"name": "cpu", "inventory": str(corpus / A10)},
                ],
            }
        )
    )
    return f


def _daemonset(corpus: Path, gpus: int = 1) -> dict[str, Any]:
    """HAMi's default-use pod as the template of a GPU DaemonSet (a per-node GPU probe)."""
    pod = yaml.safe_load((corpus / HAMI_POD).read_text())
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = gpus
    pod["spec"]["nodeSelector"] = {"gpu": "on"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "gpu-probe", "namespace": "ops"},
        "spec": {
            "selector": {"matchLabels": {"app": "gpu-probe"}},
            "template": {"metadata": {"labels": {"app": "gpu-probe"}}, "spec": pod["spec"]},
        },
    }


def _simulate(
    tmp_path: Path, cluster: Path, objs: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], str]:
    f = tmp_path / "in.yaml"
    f.write_text(yaml.safe_dump_all(objs))
    code, out, err = _run("simulate", "--cluster", str(cluster), str(f), "-o", "json")
    assert code == 0, err
    return json.loads(out)["items"], err


def test_daemonset_is_one_pod_per_eligible_node(corpus: Path, tmp_path: Path) -> None:
    items, _ = _simulate(tmp_path, _cluster(tmp_path, corpus), [_daemonset(corpus)])
    pods = {o["metadata"]["name"]: o for o in items if o["kind"] == "Pod"}
    # Not on "reserved" (untolerated taint) nor "cpu" (no gpu=on label); on the cordoned node.
    assert list(pods) == [
        "gpu-probe-h100-0",
        "gpu-probe-h100-1",
        "gpu-probe-cordoned",
        "gpu-probe-a10",
    ]
    for name, pod in pods.items():
        node = name.removeprefix("gpu-probe-")
        assert pod["metadata"]["namespace"] == "ops"
        assert pod["metadata"]["labels"] == {"app": "gpu-probe"}
        assert pod["spec"]["nodeName"] == node
        assert pod["spec"]["affinity"] == {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            }
        }
        assert [t["key"] for t in pod["spec"]["tolerations"]] == [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
            "node.kubernetes.io/disk-pressure",
            "node.kubernetes.io/memory-pressure",
            "node.kubernetes.io/pid-pressure",
            "node.kubernetes.io/unschedulable",
        ]
        # HAMi's request was converted per pod: 3000 MiB and 30 cores on one GPU of its node.
        assert "nvidia.com/gpumem" not in json.dumps(pod["spec"])
    claims = [o for o in items if o["kind"] == "ResourceClaim"]
    assert sorted(
        c["status"]["allocation"]["devices"]["results"][0]["pool"] for c in claims
    ) == sorted(["h100-0", "h100-1", "cordoned", "a10"])
    assert {
        r["consumedCapacity"]["memory"]
        for c in claims
        for r in c["status"]["allocation"]["devices"]["results"]
    } == {"3000Mi"}


def test_daemonset_pod_that_does_not_fit_its_node_stays_pending_there(
    corpus: Path, tmp_path: Path
) -> None:
    """Two GPUs per pod: the A10 node has one; its pod is pinned there and waits, as the real
    scheduler keeps it (NodeAffinity's PreFilter narrows it to that node)."""
    items, _ = _simulate(tmp_path, _cluster(tmp_path, corpus), [_daemonset(corpus, gpus=2)])
    pods = {o["metadata"]["name"]: o for o in items if o["kind"] == "Pod"}
    assert [n for n, p in pods.items() if "nodeName" in p["spec"]] == [
        "gpu-probe-h100-0",
        "gpu-probe-h100-1",
        "gpu-probe-cordoned",
    ]
    msg = pods["gpu-probe-a10"]["status"]["conditions"][0]["message"]
    assert msg.startswith(
        "0/6 nodes are available: 1 cannot allocate all claims, "
        "5 node(s) didn't satisfy plugin(s) [NodeAffinity]."
    )


def test_daemonset_tolerations_are_merged_as_the_controller_merges_them(
    corpus: Path, tmp_path: Path
) -> None:
    ds = _daemonset(corpus)
    spec = ds["spec"]["template"]["spec"]
    spec["hostNetwork"] = True
    spec["tolerations"] = [
        {"key": "team", "operator": "Equal", "value": "infer", "effect": "NoSchedule"},
        # Same key, operator and effect as a default: replaced by the default (no seconds).
        {
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 30,
        },
    ]
    items, _ = _simulate(tmp_path, _cluster(tmp_path, corpus), [ds])
    pods = {o["metadata"]["name"]: o for o in items if o["kind"] == "Pod"}
    assert "gpu-probe-reserved" in pods  # its taint is tolerated now
    tols = pods["gpu-probe-reserved"]["spec"]["tolerations"]
    assert tols[0]["key"] == "team"
    assert tols[1] == {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
    }
    assert tols[-1] == {
        "key": "node.kubernetes.io/network-unavailable",
        "operator": "Exists",
        "effect": "NoSchedule",
    }
    assert len(tols) == 8


def test_daemonset_with_no_eligible_node_is_said(corpus: Path, tmp_path: Path) -> None:
    ds = _daemonset(corpus)
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"gpu": "off"}
    items, err = _simulate(tmp_path, _cluster(tmp_path, corpus), [ds])
    assert not [o for o in items if o["kind"] == "Pod"]
    assert "DaemonSet ops/gpu-probe: no node is eligible" in err


def test_job_runs_parallelism_pods_at_most_completions(corpus: Path, tmp_path: Path) -> None:
    job = yaml.safe_load(
        (corpus / "hami-pods/HAMi__benchmarks_deployments__job-on-hami.yml").read_text()
    )
    job["spec"]["parallelism"] = 3
    job["spec"]["completions"] = 2
    suspended = json.loads(json.dumps(job))
    suspended["metadata"]["name"] = "later"
    suspended["spec"]["suspend"] = True
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 3 * * *", "suspend": True, "jobTemplate": {"spec": job["spec"]}},
    }
    items, err = _simulate(tmp_path, _cluster(tmp_path, corpus), [job, suspended, cron])
    assert [o["metadata"]["name"] for o in items if o["kind"] == "Pod"] == [
        "ai-benchmark-on-hami-0",
        "ai-benchmark-on-hami-1",
    ]
    assert "Job default/later: spec.suspend makes no pod now" in err
    assert "CronJob default/nightly: spec.suspend makes no pod now" in err


def test_replication_controller_is_expanded_converted_and_linted(
    corpus: Path, tmp_path: Path
) -> None:
    pod = yaml.safe_load((corpus / HAMI_POD).read_text())
    rc = {
        "apiVersion": "v1",
        "kind": "ReplicationController",
        "metadata": {"name": "legacy"},
        "spec": {
            "replicas": 2,
            "selector": {"app": "legacy"},
            "template": {"metadata": {"labels": {"app": "legacy"}}, "spec": pod["spec"]},
        },
    }
    items, _ = _simulate(tmp_path, _cluster(tmp_path, corpus), [rc])
    assert [o["metadata"]["name"] for o in items if o["kind"] == "Pod"] == ["legacy-0", "legacy-1"]
    assert all("nodeName" in o["spec"] for o in items if o["kind"] == "Pod")
    bad = json.loads(json.dumps(rc))
    bad["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = (
        "3Gi"
    )
    (f,) = lint([Manifest(bad, Source("rc.yaml", 1))])
    assert f.field == "spec.template.spec.containers[0].resources[nvidia.com/gpumem]"
    g = tmp_path / "rc.yaml"
    g.write_text(yaml.safe_dump(rc))
    code, out, err = _run("convert", str(g))
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["ResourceClaimTemplate", "ReplicationController"]


def test_objects_of_other_apis_with_pod_templates_are_named_in_one_line(
    tmp_path: Path, corpus: Path
) -> None:
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "train"},
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "template": yaml.safe_load((corpus / HAMI_POD).read_text()),
                }
            }
        },
    }
    _, err = _simulate(tmp_path, _cluster(tmp_path, corpus), [job])
    (line,) = [w for w in err.splitlines() if "PyTorchJob" in w]
    assert line.endswith(
        "PyTorchJob default/train: kubeflow.org PyTorchJob is not expanded into pods, so its pods are "
        "not simulated (templates: spec.pytorchReplicaSpecs.<role>.template): give each pod template "
        "as a Pod, or as a Deployment or Job with the replica count"
    )
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(job))
    code, _, err = _run("convert", str(f))
    assert code == 0
    assert (
        "PyTorchJob train: kubeflow.org PyTorchJob is not expanded into pods, so its pods are not converted"
        in err
    )


def test_one_table_of_pod_templates() -> None:
    assert validation.TEMPLATE_PATHS is POD_TEMPLATE_PATHS
    assert convert_manifests.POD_TEMPLATE_PATHS is POD_TEMPLATE_PATHS
    assert set(WORKLOAD_KINDS) == set(POD_TEMPLATE_PATHS)
    assert "ReplicationController" in WORKLOAD_KINDS


def test_replication_controller_is_validated_against_its_schema() -> None:
    """The bundled OpenAPI schema has ReplicationController (tools/openapi/generate.py): a
    misspelt field is refused naming the closest one, as kubectl apply refuses it."""
    rc = {
        "apiVersion": "v1",
        "kind": "ReplicationController",
        "metadata": {"name": "legacy"},
        "spec": {"replica": 2, "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
    }
    (f,) = lint([Manifest(rc, Source("rc.yaml", 1))])
    assert (f.field, f.problem, f.fix) == (
        "spec.replica",
        "unknown field 'replica'",
        "did you mean 'replicas'?",
    )
