"""The `tessera simulate` command: the bundled default, output formats, and bad input (exit 2)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from click.testing import CliRunner

from tessera.cli import main

CLUSTER = str(Path(__file__).resolve().parents[2] / "src/tessera/examples/cluster.yaml")
H100_Q = "inventories/gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_default_run_places_pods_and_reports_pending() -> None:
    code, out, _ = run("simulate")
    assert code == 0
    assert "16 pod(s) scheduled, 2 pending." in out
    assert "default/too-big" in out and "default/hami-uuid-pinned" in out


def test_default_yaml_is_a_list_with_allocations() -> None:
    code, out, _ = run("simulate", "-o", "yaml")
    assert code == 0
    lst = yaml.safe_load(out)
    assert lst["kind"] == "List"
    kinds = [o["kind"] for o in lst["items"]]
    assert kinds.count("ResourceSlice") == 4 and kinds.count("DeviceClass") == 1
    pods = {o["metadata"]["name"]: o for o in lst["items"] if o["kind"] == "Pod"}
    assert len(pods) == 18
    assert pods["hami-default-use"]["spec"]["nodeName"] == "h100-node"
    assert "nvidia.com/gpumem" not in str(pods["hami-default-use"]["spec"])
    cond = pods["too-big"]["status"]["conditions"][0]
    assert cond["status"] == "False" and "4 cannot allocate all claims" in cond["message"]
    claims = {o["metadata"]["name"]: o for o in lst["items"] if o["kind"] == "ResourceClaim"}
    shared = claims["shared-notebook-gpu"]
    assert [r["name"] for r in shared["status"]["reservedFor"]] == ["notebook-a", "notebook-b"]
    (res,) = shared["status"]["allocation"]["devices"]["results"]
    assert (res["pool"], res["device"], res["consumedCapacity"]) == (
        "a5000-node",
        "gpu-0",
        {"memory": "16Gi", "cores": "30"},
    )
    # Nothing is ever booked past capacity.
    slices = [o for o in lst["items"] if o["kind"] == "ResourceSlice"]
    cap = {
        (s["spec"]["pool"]["name"], d["name"]): d["capacity"]
        for s in slices
        for d in s["spec"]["devices"]
    }
    from fractions import Fraction

    from tessera.api.quantity import Quantity

    used: dict[tuple[str, str], dict[str, Fraction]] = {}
    for c in claims.values():
        for r in (
            ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        ):
            u = used.setdefault((r["pool"], r["device"]), {})
            for k, v in (r.get("consumedCapacity") or {}).items():
                u[k] = u.get(k, Fraction(0)) + Quantity.parse(v).value
    assert used
    for key, u in used.items():
        for k, v in u.items():
            assert v <= Quantity.parse(cap[key][k]["value"]).value


def test_json_output(tmp_path: Path) -> None:
    code, out, _ = run("simulate", "-o", "json")
    assert code == 0
    lst = json.loads(out)
    assert (lst["apiVersion"], lst["kind"]) == ("v1", "List")
    kinds = [o["kind"] for o in lst["items"]]
    assert (
        kinds.count("ResourceSlice") == 4
        and kinds.count("DeviceClass") == 1
        and kinds.count("Pod") == 18
    )
    # The same List as -o yaml, object for object.
    code, out_yaml, _ = run("simulate", "-o", "yaml")
    assert code == 0 and yaml.safe_load(out_yaml) == lst
    pods = {o["metadata"]["name"]: o for o in lst["items"] if o["kind"] == "Pod"}
    assert pods["trainer-1"]["spec"]["nodeName"] == "h100-node"
    assert pods["too-big"]["status"]["conditions"][0]["reason"] == "Unschedulable"


def test_node_flag_with_corpus_inventory(corpus: Path, tmp_path: Path) -> None:
    pod = corpus / "hami-pods" / "HAMi__examples_nvidia__use_memory_fraction.yaml"
    inv = corpus / H100_Q
    code, out, err = run("simulate", "--node", f"gpu-a={inv}", str(pod), "-o", "yaml")
    assert code == 0, err
    lst = yaml.safe_load(out)
    claim = next(o for o in lst["items"] if o["kind"] == "ResourceClaim")
    res = claim["status"]["allocation"]["devices"]["results"]
    # 50% of the 81008 MiB published (81559 MiB less the driver's 551 MiB) = 40504 MiB, on two
    # distinct GPUs.
    assert [(r["device"], r["consumedCapacity"]) for r in res] == [
        ("gpu-0", {"memory": "40504Mi", "cores": "30"}),
        ("gpu-1", {"memory": "40504Mi", "cores": "30"}),
    ]


def _bad(tmp_path: Path, *args: str) -> str:
    code, out, err = run(*args)
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_truncated_inventory(corpus: Path, tmp_path: Path) -> None:
    src = (corpus / "inventories" / "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml").read_text()
    cut = tmp_path / "cut.xml"
    cut.write_text(src[: len(src) // 2])
    msg = _bad(tmp_path, "simulate", "--node", f"n1={cut}")
    assert msg.startswith(f"tessera: error: {cut}:")


def test_helm_template_input(corpus: Path, tmp_path: Path) -> None:
    f = (
        corpus
        / "dra-manifests"
        / "k8s-dra-driver-gpu__helm_templates__deviceclass-gpu.helm-template.yaml"
    )
    msg = _bad(tmp_path, "simulate", str(f))
    assert (
        "this is a template" in msg
        and "`helm template CHART | tessera ... -` for a Helm chart" in msg
    )


def test_shell_prompt_input(tmp_path: Path) -> None:
    f = tmp_path / "pasted.yaml"
    f.write_text("$ kubectl get pods\nNAME   READY   STATUS\n")
    msg = _bad(tmp_path, "simulate", str(f))
    assert msg.startswith(f"tessera: error: {f}") and "not a Kubernetes object" in msg


def test_negative_gpumem(tmp_path: Path) -> None:
    f = tmp_path / "neg.yaml"
    f.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: neg}\nspec:\n  containers:\n"
        "  - name: c\n    image: x\n    resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: -1024}}\n"
    )
    msg = _bad(tmp_path, "simulate", "--cluster", CLUSTER, str(f))
    assert "neg" in msg and "container c" in msg and "nvidia.com/gpumem" in msg


def test_unknown_device_class(corpus: Path, tmp_path: Path) -> None:
    # A template naming a class that does not exist is not bad input (kube-scheduler would leave
    # pods using it pending): a warning on stderr, exit 0.
    f = corpus / "dra-manifests" / "kubernetes-website__examples_dra__resourceclaimtemplate.yaml"
    r = CliRunner().invoke(main, ["simulate", "--cluster", CLUSTER, str(f)])
    assert r.exit_code == 0, r.output
    assert (
        f"tessera: warning: {f} (document 1): ResourceClaimTemplate default/example-resource-claim-template: "
        "spec.spec.devices.requests[0].exactly.deviceClassName: DeviceClass 'example-device-class' does not exist: "
        "pods using it stay pending (known: gpu.tessera.dev; add the DeviceClass, or map it with "
        "--class-map example-device-class=CLASS)"
    ) in r.stderr


def test_class_map_option(corpus: Path, tmp_path: Path) -> None:
    f = corpus / "dra-manifests" / "k8s-dra-driver-gpu__demo_specs_quickstart_v1__gpu-test1.yaml"
    code, out, _ = run(
        "simulate",
        "--cluster",
        CLUSTER,
        "--class-map",
        "gpu.nvidia.com=gpu.tessera.dev",
        "-o",
        "json",
        str(f),
    )
    assert code == 0
    pods = {
        o["metadata"]["name"]: o["spec"].get("nodeName")
        for o in json.loads(out)["items"]
        if o["kind"] == "Pod"
    }
    assert pods == {"pod1": "h100-node", "pod2": "h100-node"}
    assert _bad(
        tmp_path, "simulate", "--cluster", CLUSTER, "--class-map", "gpu.nvidia.com", str(f)
    ) == (
        "tessera: error: --class-map 'gpu.nvidia.com': expected FROM=TO, e.g. gpu.nvidia.com=gpu.tessera.dev"
    )


def test_misindented_selector_from_kubernetes_docs(corpus: Path, tmp_path: Path) -> None:
    # The kubernetes.io example has `expression` beside `cel` instead of under it.
    f = corpus / "dra-manifests" / "kubernetes-website__examples_dra__resourceclaim.yaml"
    msg = _bad(tmp_path, "simulate", "--cluster", CLUSTER, str(f))
    assert msg.endswith(
        "ResourceClaim default/example-resource-claim: spec.devices.requests[0].exactly.selectors[0].expression: "
        "unknown field 'expression': it belongs under 'cel' (indent it one level)"
    )


def test_no_nodes(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, image: x}]}\n"
    )
    assert "no nodes to schedule on" in _bad(tmp_path, "simulate", str(f))


def test_compare_on_the_default() -> None:
    import json

    code, out, err = run("simulate", "--compare", "-o", "json")
    assert code == 0, err
    rows = {r["allocation"]: r for r in json.loads(out)}
    assert list(rows) == ["first-fit", "binpack", "spread", "topology", "whole GPUs"]
    # Fractional sharing needs fewer GPUs than whole-GPU allocation and leaves fewer pods out.
    assert rows["first-fit"]["gpusUsed"] == 13 and rows["whole GPUs"]["gpusUsed"] == 18
    assert rows["first-fit"]["pending"] == ["default/too-big", "default/hami-uuid-pinned"]
    assert rows["whole GPUs"]["pending"] == [
        "default/trainer-1",
        "default/too-big",
        "default/hami-uuid-pinned",
    ]
    assert rows["whole GPUs"]["memoryBookedOnUsedGPUs"] == "100.0%"
    assert rows["spread"]["gpusUsed"] > rows["binpack"]["gpusUsed"]


POD = (
    "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  - name: c\n    image: x\n "
    "   resources: {{limits: {{{res}}}}}\n"
)


def test_duplicate_pod_names_are_an_error(tmp_path: Path) -> None:
    f = tmp_path / "dup.yaml"
    f.write_text(
        POD.format(name="dup", res="nvidia.com/gpu: 1, nvidia.com/gpumem: 1000")
        + "---\n"
        + POD.format(name="dup", res="nvidia.com/gpu: 1, nvidia.com/gpumem: 2000")
    )
    msg = _bad(tmp_path, "simulate", "--cluster", CLUSTER, str(f))
    assert msg == (
        f"tessera: error: {f} (document 2): Pod default/dup: metadata.name: duplicate Pod name "
        f"(first in {f} (document 1)): names must be unique"
    )


def test_duplicate_device_in_a_slice_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "slice.yaml"
    dev = "{name: gpu-0, attributes: {uuid: {string: GPU-1}}}"
    f.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata: {name: s1}\nspec:\n  driver: gpu.tessera.dev\n"
        f"  pool: {{name: n9, generation: 1, resourceSliceCount: 1}}\n  nodeName: n9\n  devices: [{dev}, {dev}]\n"
    )
    msg = _bad(tmp_path, "simulate", str(f))
    assert msg.endswith("ResourceSlice s1: spec.devices[1].name: duplicate device name 'gpu-0'")


def test_duplicate_node_is_an_error(corpus: Path, tmp_path: Path) -> None:
    inv = corpus / "inventories" / "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"
    msg = _bad(tmp_path, "simulate", "--cluster", CLUSTER, "--node", f"a5000-node={inv}")
    assert "node 'a5000-node' is already defined" in msg


def test_pod_checks_the_api_server_would_make(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: empty}\nspec: {containers: []}\n")
    assert _bad(tmp_path, "simulate", "--cluster", CLUSTER, str(f)).endswith(
        "Pod default/empty: spec.containers: required: a Pod needs at least one container"
    )
    f.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
        "  - {name: c, image: x, resources: {claims: [{name: gpu}]}}\n"
    )
    assert _bad(tmp_path, "simulate", "--cluster", CLUSTER, str(f)).endswith(
        "spec.containers[0].resources.claims[0].name: claim 'gpu' is not declared in spec.resourceClaims: add it there"
    )


def test_selector_that_does_not_compile_is_an_error(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: c}\nspec:\n  devices:\n    requests:\n"
        "    - name: gpu\n      exactly:\n        deviceClassName: gpu.tessera.dev\n"
        "        selectors: [{cel: {expression: 'device.driver =='}}]\n"
    )
    msg = _bad(tmp_path, "simulate", "--cluster", CLUSTER, str(f))
    assert (
        "ResourceClaim default/c: spec.devices.requests[0].exactly.selectors[0].cel.expression: CEL compile error"
        in msg
    )


def test_nothing_to_read(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("---\n")
    assert "no Kubernetes objects in" in _bad(
        tmp_path, "simulate", "--cluster", CLUSTER, str(tmp_path / "empty.yaml")
    )
    d = tmp_path / "d"
    d.mkdir()
    assert "no *.yaml, *.yml or *.json file in this directory" in _bad(
        tmp_path, "simulate", "--cluster", CLUSTER, str(d)
    )


def test_unconverted_extended_resource_stays_pending(corpus: Path) -> None:
    f = corpus / "hami-pods" / "HAMi__examples_nvidia__mig_example.yaml"
    code, out, err = run("simulate", "--cluster", CLUSTER, str(f), "-o", "yaml")
    assert code == 0
    pod = next(o for o in yaml.safe_load(out)["items"] if o["kind"] == "Pod")
    assert "nodeName" not in pod["spec"]
    assert (
        pod["status"]["conditions"][0]["message"]
        == "0/4 nodes are available: 4 Insufficient nvidia.com/mig-3g.20gb."
    )
    # The warning goes to stderr, so -o yaml stays clean.
    assert "nvidia.com/mig-3g.20gb is a MIG-profile resource, not converted" in err


def test_output_fed_back_reproduces_the_state(tmp_path: Path) -> None:
    code, out, _ = run("simulate", "-o", "yaml")
    assert code == 0
    f = tmp_path / "world.yaml"
    f.write_text(out)
    code, out2, err = run("simulate", "--cluster", CLUSTER, str(f), "-o", "yaml")
    assert code == 0, err
    before = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load(out)["items"]}
    after = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load(out2)["items"]}
    assert before.keys() == after.keys()
    for k in before:
        if k[0] == "ResourceClaim":
            assert (after[k].get("status") or {}).get("allocation") == (
                before[k].get("status") or {}
            ).get("allocation")
        if k[0] == "Pod":
            assert after[k]["spec"].get("nodeName") == before[k]["spec"].get("nodeName")


def test_progress_lines_when_asked_without_a_terminal() -> None:
    # The bundled default: 18 pods; --progress on a stderr that is not a terminal prints one
    # line at the end with the pods done and the claims per second (of the 18 pods' claims).
    code, out, err = run("simulate", "--progress")
    assert code == 0 and "16 pod(s) scheduled, 2 pending." in out
    lines = [ln for ln in err.splitlines() if ln.startswith("tessera simulate: ")]
    assert (
        len(lines) == 1
        and lines[0].startswith("tessera simulate: 18/18 pods, ")
        and lines[0].endswith(" claims/s")
    )
    code, _, err = run("simulate")
    assert code == 0 and "claims/s" not in err


def test_output_fed_back_with_new_pods_never_reuses_a_kept_shareid(tmp_path: Path) -> None:
    # A seeded run fed its own output plus a new pod draws the same first shareID again; the
    # new claim must get another one, and the GPU counts both shares.
    inv = Path(CLUSTER).parent / "inventories/telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"
    pod = (
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {}}}\nspec:\n  containers:\n  - name: c\n"
        "    image: x\n    resources: {{limits: {{nvidia.com/gpu: 1, nvidia.com/gpumem: 3000}}}}\n"
    )
    (tmp_path / "first.yaml").write_text(pod.format("first"))
    (tmp_path / "second.yaml").write_text(pod.format("second"))
    node = f"n={inv}"
    code, out, err = run("simulate", "--node", node, str(tmp_path / "first.yaml"), "-o", "yaml")
    assert code == 0, err
    (tmp_path / "world.yaml").write_text(out)
    args = ("simulate", "--node", node, str(tmp_path / "world.yaml"), str(tmp_path / "second.yaml"))
    code, out2, err = run(*args, "-o", "yaml")
    assert code == 0, err
    shares = {
        o["metadata"]["name"]: o["status"]["allocation"]["devices"]["results"][0]["shareID"]
        for o in yaml.safe_load(out2)["items"]
        if o["kind"] == "ResourceClaim"
    }
    assert len(shares) == 2 and len(set(shares.values())) == 2, shares
    code, table, err = run(*args, "-o", "wide")
    gpus = table[table.index("GPUs") :].splitlines()
    header = re.split(r" {2,}", gpus[1])
    row = next(re.split(r" {2,}", line) for line in gpus if line.startswith("n   "))
    assert row[header.index("SHARES")] == "2", row
