"""Extended resources served by DeviceClasses (KEP-5004): the claim kube-scheduler synthesises.

Real inputs: the NVIDIA DRA driver's own per-MIG-profile recipe (DeviceClass with
``extendedResourceName: nvidia.com/mig-1g.12gb``, and the scheduler-made claim and pod status it
documents), its full-GPU recipe, the dra-example-driver's implicit/explicit example and slices.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from tessera.api.deviceclass import served_extended_resources
from tessera.api.loader import Manifest, Source
from tessera.cli import main
from tessera.lint import lint
from tessera.scheduler.extended import extended_requests
from tessera.sim.cluster import Cluster, SimNode
from tessera.sim.simulate import Simulation

NVIDIA_MIG = "dra-manifests/k8s-dra-driver-gpu__demo_specs_extended-resources__mig-1g-12gb.yaml"
NVIDIA_FULL = "dra-manifests/k8s-dra-driver-gpu__demo_specs_extended-resources__gpu-full.yaml"
NVIDIA_GPU_CLASS = (
    "dra-manifests/k8s-dra-driver-gpu__helm_templates__deviceclass-gpu.helm-template.yaml"
)
EXAMPLE_PODS = "dra-manifests/dra-example-driver__demo_examples__extended-resource-request.yaml"
EXAMPLE_SLICES = "dra-manifests/dra-example-driver__README__kubectl-get-resourceslice-8gpu.yaml"
EXAMPLE_NODE = "dra-example-driver-cluster-worker"
NODE = "kind-dra-1-worker"  # the node of the recipe's expected claim


def _run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.stdout, r.stderr


def _manifests(objs: list[dict[str, Any]]) -> list[Manifest]:
    return [Manifest(copy.deepcopy(o), Source("test.yaml", i + 1)) for i, o in enumerate(objs)]


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def gh200_mig_slice(recipe: Path) -> dict[str, Any]:
    """The NVIDIA DRA driver's ResourceSlice for the recipe's own ``nvidia-smi -L`` (2x GH200,
    7x 1g.12gb each, in its header comment): one ``type: mig`` device per MIG UUID listed, with
    the driver's attribute names (docs/reference/resourceslice-attributes)."""
    devices = []
    parent = ""
    gpu = -1
    for line in recipe.read_text().splitlines():
        g = re.match(r"#\s+GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f-]+)\)", line)
        if g:
            gpu, parent, product = int(g[1]), g[3], g[2]
            continue
        m = re.match(r"#\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9a-f-]+)\)", line)
        if m:
            devices.append(
                {
                    "name": f"gpu-{gpu}-mig-{m[2]}",  # DNS labels, as the driver names them
                    "attributes": {
                        "type": {"string": "mig"},
                        "profile": {"string": m[1]},
                        "uuid": {"string": m[3]},
                        "parentUUID": {"string": parent},
                        "productName": {"string": product},
                    },
                }
            )
    assert len(devices) == 14
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _sim(objs: list[dict[str, Any]], slices: list[dict[str, Any]], node: str = NODE) -> Simulation:
    cluster = Cluster([SimNode(node, {"kubernetes.io/hostname": node}, slices)])
    return Simulation(cluster, _manifests(objs))


def test_nvidia_mig_recipe_gets_the_claim_the_recipe_documents(corpus: Path) -> None:
    recipe = corpus / NVIDIA_MIG
    objs = [d for d in _docs(recipe) if d["kind"] != "Namespace"]
    sim = _sim(objs, [gh200_mig_slice(recipe)])
    result = sim.run()
    assert result.pending == []
    assert result.scheduled == ["extended-resource-mig-1g12gb/mig-1g12gb-pod"]
    (claim,) = [o for o in result.objects if o["kind"] == "ResourceClaim"]
    md = claim["metadata"]
    assert re.fullmatch(r"mig-1g12gb-pod-extended-resources-[b-z2-9]{5}", md["name"])
    assert md["namespace"] == "extended-resource-mig-1g12gb"
    assert md["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    (owner,) = md["ownerReferences"]
    assert (owner["apiVersion"], owner["kind"], owner["name"], owner["controller"]) == (
        "v1",
        "Pod",
        "mig-1g12gb-pod",
        True,
    )
    # The spec the recipe's comment shows kube-scheduler creating.
    assert claim["spec"] == {
        "devices": {
            "requests": [
                {
                    "name": "container-0-request-0",
                    "exactly": {
                        "deviceClassName": "mig-1g-12gb.gpu.nvidia.com",
                        "allocationMode": "ExactCount",
                        "count": 1,
                    },
                }
            ]
        }
    }
    (res,) = claim["status"]["allocation"]["devices"]["results"]
    assert (res["driver"], res["pool"], res["device"], res["request"]) == (
        "gpu.nvidia.com",
        NODE,
        "gpu-0-mig-0",
        "container-0-request-0",
    )
    pod = next(o for o in result.objects if o["kind"] == "Pod")
    assert pod["spec"]["nodeName"] == NODE
    assert pod["status"]["extendedResourceClaimStatus"] == {
        "resourceClaimName": md["name"],
        "requestMappings": [
            {
                "containerName": "cuda-container",
                "resourceName": "nvidia.com/mig-1g.12gb",
                "requestName": "container-0-request-0",
            }
        ],
    }
    (p,) = result.placements
    assert (p.container, p.claim, p.device) == (
        "cuda-container",
        f"extended-resource-mig-1g12gb/{md['name']}",
        f"gpu.nvidia.com/{NODE}/gpu-0-mig-0",
    )
    # Served, so not "a MIG-profile resource, not converted".
    assert not [w for w in result.warnings if "mig-1g.12gb" in w]


def test_nvidia_mig_recipe_fills_the_fourteen_instances_then_waits(corpus: Path) -> None:
    recipe = corpus / NVIDIA_MIG
    docs = [d for d in _docs(recipe) if d["kind"] != "Namespace"]
    cls, pod = docs
    pods = []
    for i in range(8):
        p = copy.deepcopy(pod)
        p["metadata"]["name"] = f"mig-{i}"
        p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.12gb"] = 2
        pods.append(p)
    sim = _sim([cls, *pods], [gh200_mig_slice(recipe)])
    result = sim.run()
    assert len(result.scheduled) == 7
    (pend,) = result.pending
    assert pend.pod == "extended-resource-mig-1g12gb/mig-7"
    assert pend.reason.startswith("0/1 nodes are available: 1 cannot allocate all claims.")
    used = {
        r["device"]
        for o in result.objects
        if o["kind"] == "ResourceClaim" and o.get("status")
        for r in o["status"]["allocation"]["devices"]["results"]
    }
    assert len(used) == 14


def test_implicit_and_explicit_names_of_the_example_driver(corpus: Path) -> None:
    """dra-example-driver's example: pod0 asks the implicit name of class gpu.example.com, pod1
    the explicit example.com/gpu that only ``--set deviceClass.extendedResourceName`` adds."""
    pods = [d for d in _docs(corpus / EXAMPLE_PODS) if d["kind"] == "Pod"]
    text = (corpus / EXAMPLE_SLICES).read_text().split("\n", 1)[1]  # after the "$ kubectl" line
    slices = yaml.safe_load(text)["items"]
    cls: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.example.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}]},
    }
    result = _sim([cls, *pods], slices, EXAMPLE_NODE).run()
    assert result.scheduled == ["extended-resource-request/pod0"]
    (pend,) = result.pending
    assert pend.reason == "0/1 nodes are available: 1 Insufficient example.com/gpu."
    # With the chart's extendedResourceName set, both are served: the class keeps its implicit
    # name too (kubernetes PR #133363).
    cls["spec"]["extendedResourceName"] = "example.com/gpu"
    result = _sim([cls, *pods], slices, EXAMPLE_NODE).run()
    assert result.pending == []
    assert result.scheduled == ["extended-resource-request/pod0", "extended-resource-request/pod1"]
    devs = [p.device for p in result.placements]
    assert devs == [
        f"gpu.example.com/{EXAMPLE_NODE}/gpu-0",
        f"gpu.example.com/{EXAMPLE_NODE}/gpu-1",
    ]


def test_two_classes_naming_one_resource_the_newest_serves_it(corpus: Path) -> None:
    """The NVIDIA driver's chart sets ``extendedResourceName: nvidia.com/gpu`` on
    gpu.nvidia.com, as Tessera's gpu.tessera.dev does: kube-scheduler uses the class created
    last. A pod the webhook leaves alone (``hami.io/webhook: ignore``) goes to that class."""
    # The chart template rendered for resource.k8s.io/v1 (its only template actions).
    text = (corpus / NVIDIA_GPU_CLASS).read_text()
    text = text.replace("{{ $resourceApiVersion }}", "resource.k8s.io/v1")
    nv = yaml.safe_load(
        "\n".join(line for line in text.splitlines() if not line.strip().startswith("{{"))
    )
    assert nv["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    tessera = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.tessera.dev", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "selectors": [{"cel": {"expression": 'device.driver == "gpu.tessera.dev"'}}],
            "extendedResourceName": "nvidia.com/gpu",
        },
    }
    nv["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    served = served_extended_resources([tessera, nv])
    assert served["nvidia.com/gpu"] == "gpu.nvidia.com"
    assert served["deviceclass.resource.kubernetes.io/gpu.tessera.dev"] == "gpu.tessera.dev"
    assert served["deviceclass.resource.kubernetes.io/gpu.nvidia.com"] == "gpu.nvidia.com"
    nv["metadata"]["creationTimestamp"] = tessera["metadata"]["creationTimestamp"]
    assert (
        served_extended_resources([nv, tessera])["nvidia.com/gpu"] == "gpu.nvidia.com"
    )  # lowest name

    (pod,) = [d for d in _docs(corpus / NVIDIA_FULL) if d["kind"] == "Pod"]
    pod["metadata"]["labels"] = {"hami.io/webhook": "ignore"}
    nv["metadata"]["creationTimestamp"] = "2026-02-01T00:00:00Z"
    gpu = gh200_mig_slice(corpus / NVIDIA_MIG)
    for d in gpu["spec"]["devices"]:
        d["attributes"]["type"] = {"string": "gpu"}
    result = _sim([tessera, nv, pod], [gpu]).run()
    (claim,) = [o for o in result.objects if o["kind"] == "ResourceClaim"]
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "gpu.nvidia.com"
    assert result.placements[0].device.startswith("gpu.nvidia.com/")


def test_hami_names_are_converted_by_the_webhook_before_any_class_sees_them(
    corpus: Path,
) -> None:
    """The NVIDIA recipe's full-GPU pod (``nvidia.com/gpu: 1``): the webhook converts it at
    admission, so the simulation gives it Tessera's converted claim, not a synthesised one."""
    (pod,) = [d for d in _docs(corpus / NVIDIA_FULL) if d["kind"] == "Pod"]
    sim = _sim([pod], [])  # no GPUs: only the shape of the claim matters
    result = sim.run()
    kinds = [o["kind"] for o in result.objects]
    assert "ResourceClaimTemplate" in kinds
    assert not [
        o
        for o in result.objects
        if o["kind"] == "ResourceClaim" and "extended-resource-claim" in json.dumps(o)
    ]


def _pod(init: list[dict[str, Any]], containers: list[dict[str, Any]]) -> dict[str, Any]:
    def ctr(c: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": c["name"], "image": "x", "resources": {"limits": c["res"]}}
        if c.get("sidecar"):
            out["restartPolicy"] = "Always"
        return out

    return {
        "metadata": {"name": "p", "namespace": "default", "uid": "u"},
        "spec": {
            "initContainers": [ctr(c) for c in init],
            "containers": [ctr(c) for c in containers],
        },
    }


SERVED = {"nvidia.com/mig-1g.10gb": "mig-1g", "nvidia.com/mig-3g.40gb": "mig-3g"}


def test_requests_are_per_container_and_named_by_sorted_index() -> None:
    pod = _pod(
        [],
        [
            {
                "name": "a",
                "res": {"cpu": "1", "nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-1g.10gb": 1},
            },
            {"name": "b", "res": {"nvidia.com/mig-1g.10gb": "3"}},
        ],
    )
    ext = extended_requests(pod, SERVED)
    assert ext.unserved == []
    # Container 0's sorted names: cpu, nvidia.com/mig-1g.10gb, nvidia.com/mig-3g.40gb.
    assert [
        (r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"]) for r in ext.requests
    ] == [
        ("container-0-request-1", "mig-1g", 1),
        ("container-0-request-2", "mig-3g", 2),
        ("container-1-request-0", "mig-1g", 3),
    ]
    assert [(m["containerName"], m["requestName"]) for m in ext.mappings] == [
        ("a", "container-0-request-1"),
        ("b", "container-1-request-0"),
        ("a", "container-0-request-2"),
    ]


def test_init_containers_reuse_later_long_lived_requests() -> None:
    """Upstream's case "three init containers, one sidecar, one regular container": the first
    init container is covered by the sidecar after it, the last asks its own."""
    pod = _pod(
        [
            {"name": "init-0", "res": {"nvidia.com/mig-3g.40gb": 1}},
            {"name": "sidecar", "res": {"nvidia.com/mig-3g.40gb": 1}, "sidecar": True},
            {"name": "init-2", "res": {"nvidia.com/mig-3g.40gb": 2}},
        ],
        [{"name": "main", "res": {"nvidia.com/mig-1g.10gb": 1}}],
    )
    ext = extended_requests(pod, SERVED)
    assert [
        (r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"]) for r in ext.requests
    ] == [
        ("container-1-request-0", "mig-3g", 1),
        ("container-2-request-0", "mig-3g", 2),
        ("container-3-request-0", "mig-1g", 1),
    ]
    assert ("init-0", "container-1-request-0") in [
        (m["containerName"], m["requestName"]) for m in ext.mappings
    ]
    # Two init containers with their own requests: only the largest stays, both map to it.
    pod = _pod(
        [
            {"name": "i0", "res": {"nvidia.com/mig-3g.40gb": 1}},
            {"name": "i1", "res": {"nvidia.com/mig-3g.40gb": 2}},
        ],
        [{"name": "main", "res": {"nvidia.com/mig-1g.10gb": 1}}],
    )
    ext = extended_requests(pod, SERVED)
    assert [(r["name"], r["exactly"]["count"]) for r in ext.requests] == [
        ("container-1-request-0", 2),
        ("container-2-request-0", 1),
    ]
    assert [
        (m["containerName"], m["requestName"]) for m in ext.mappings if m["containerName"] != "main"
    ] == [
        ("i0", "container-1-request-0"),
        ("i1", "container-1-request-0"),
    ]


def test_zero_and_unserved_amounts() -> None:
    pod = _pod([], [{"name": "a", "res": {"nvidia.com/mig-1g.10gb": 0, "example.com/fpga": 1}}])
    ext = extended_requests(pod, SERVED)
    assert ext.requests == [] and ext.unserved == ["example.com/fpga"]
    pod = _pod([], [{"name": "a", "res": {"example.com/fpga": 0}}])
    assert extended_requests(pod, SERVED).unserved == []


def test_explain_accounts_for_the_synthesised_claim(corpus: Path, tmp_path: Path) -> None:
    recipe = corpus / NVIDIA_MIG
    docs = [d for d in _docs(recipe) if d["kind"] != "Namespace"]
    docs[1]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.12gb"] = 15
    f = tmp_path / "in.yaml"
    f.write_text(yaml.safe_dump_all([*docs, gh200_mig_slice(recipe)]))
    code, out, err = _run("explain", "extended-resource-mig-1g12gb/mig-1g12gb-pod", str(f))
    assert code == 0, err
    assert "Pod extended-resource-mig-1g12gb/mig-1g12gb-pod: pending" in out
    assert "request container-0-request-0 wants 15 devices" in out
    assert "(class mig-1g-12gb.gpu.nvidia.com)" in out
    assert "14 of 14 devices fit (needs 15)" in out


def test_lint_names_an_implicit_resource_of_a_missing_class(corpus: Path) -> None:
    (pod,) = [d for d in _docs(corpus / EXAMPLE_PODS) if d["kind"] == "Pod"][:1]
    cls = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.example.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}]},
    }
    assert lint(_manifests([cls, pod])) == []
    bad = copy.deepcopy(pod)
    limits = bad["spec"]["containers"][0]["resources"]["limits"]
    limits["deviceclass.resource.kubernetes.io/gpu.exampel.com"] = limits.pop(
        "deviceclass.resource.kubernetes.io/gpu.example.com"
    )
    (f,) = lint(_manifests([cls, bad]))
    assert f.field == (
        "spec.containers[0].resources.limits[deviceclass.resource.kubernetes.io/gpu.exampel.com]"
    )
    assert "DeviceClass 'gpu.exampel.com' does not exist" in f.problem
    assert f.fix == "use deviceclass.resource.kubernetes.io/gpu.example.com"


def test_output_fed_back_keeps_the_synthesised_claim(corpus: Path, tmp_path: Path) -> None:
    """simulate's -o yaml given back (with a second pod of the same recipe): the bound pod
    keeps the claim its status names and its device; the new pod gets a claim of its own."""
    recipe = corpus / NVIDIA_MIG
    docs = [d for d in _docs(recipe) if d["kind"] != "Namespace"]
    f = tmp_path / "in.yaml"
    f.write_text(yaml.safe_dump_all([*docs, gh200_mig_slice(recipe)]))
    code, out, err = _run("simulate", str(f), "-o", "yaml")
    assert code == 0, err
    first = [o for o in yaml.safe_load(out)["items"] if o["kind"] == "ResourceClaim"]
    assert len(first) == 1
    g = tmp_path / "out.yaml"
    g.write_text(out)
    second_pod = copy.deepcopy(docs[1])
    second_pod["metadata"]["name"] = "second"
    h = tmp_path / "more.yaml"
    h.write_text(yaml.safe_dump(second_pod))
    code, out2, err = _run("simulate", str(g), str(h), "-o", "yaml")
    assert code == 0, err
    claims = [o for o in yaml.safe_load(out2)["items"] if o["kind"] == "ResourceClaim"]
    assert claims[0] == first[0]
    assert len(claims) == 2
    assert claims[1]["metadata"]["name"].startswith("second-extended-resources-")
    assert claims[1]["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0-mig-1"


def test_convert_leaves_a_served_name_without_a_warning(corpus: Path) -> None:
    """`tessera convert` of the NVIDIA recipe: its DeviceClass serves nvidia.com/mig-1g.12gb,
    so the pod is left as written and no "MIG-profile resource, not converted" is said."""
    code, out, err = _run("convert", str(corpus / NVIDIA_MIG))
    assert code == 0, err
    assert "mig-1g.12gb" not in err
    pod = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.12gb": 1}
    # Without the class, the warning stays (HAMi's mig example asks nvidia.com/mig-3g.20gb).
    code, _, err = _run(
        "convert", str(corpus / "hami-pods/HAMi__examples_nvidia__mig_example.yaml")
    )
    assert "nvidia.com/mig-3g.20gb is a MIG-profile resource, not converted" in err


def test_live_cluster_keeps_a_bound_pod_with_a_synthesised_claim(corpus: Path) -> None:
    """What `--kubeconfig` reads: the recipe's pod bound by kube-scheduler, with the claim and
    pod status the recipe documents, stays in the simulation with its allocation, and a second
    pending pod of the recipe gets the next instance."""
    from tessera.kube.live import select_objects

    recipe = corpus / NVIDIA_MIG
    cls, pod = [d for d in _docs(recipe) if d["kind"] != "Namespace"]
    ns = pod["metadata"]["namespace"]
    pod["metadata"]["uid"] = "6c01cc40-3527-43a9-a241-89c9e7d18921"
    pod["spec"]["nodeName"] = NODE
    pod["status"] = {
        "phase": "Running",
        "extendedResourceClaimStatus": {
            "resourceClaimName": "mig-1g12gb-pod-extended-resources-8r9k5",
            "requestMappings": [
                {
                    "containerName": "cuda-container",
                    "requestName": "container-0-request-0",
                    "resourceName": "nvidia.com/mig-1g.12gb",
                }
            ],
        },
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "mig-1g12gb-pod-extended-resources-8r9k5",
            "namespace": ns,
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "controller": True,
                    "kind": "Pod",
                    "name": "mig-1g12gb-pod",
                    "uid": pod["metadata"]["uid"],
                }
            ],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "container-0-request-0",
                        "exactly": {
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "deviceClassName": cls["metadata"]["name"],
                        },
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "device": "gpu-1-mig-3",
                            "driver": "gpu.nvidia.com",
                            "pool": NODE,
                            "request": "container-0-request-0",
                        }
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODE]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [
                {"name": "mig-1g12gb-pod", "resource": "pods", "uid": pod["metadata"]["uid"]}
            ],
        },
    }
    pending = copy.deepcopy(pod)
    pending["metadata"] = {"name": "next", "namespace": ns, "uid": "u-next"}
    pending["spec"].pop("nodeName")
    pending.pop("status")
    kept, states = select_objects([cls, gh200_mig_slice(recipe), claim, pod, pending])
    assert sorted(states.values()) == ["bound", "pending"]
    result = _sim(kept, []).run()  # the slice comes with the objects, as a live read has it
    assert result.scheduled == [f"{ns}/mig-1g12gb-pod", f"{ns}/next"]
    devs = [p.device.rsplit("/", 1)[1] for p in result.placements]
    assert devs == ["gpu-1-mig-3", "gpu-0-mig-0"]
