"""``tessera convert``: HAMi manifests in, applyable DRA manifests out, through the same
conversion as ``tessera simulate`` (so simulating the output places pods exactly as simulating
the HAMi originals does)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from tessera.cli import main

REPO = Path(__file__).resolve().parents[2]
CLUSTER = str(REPO / "src/tessera/examples/cluster.yaml")


def run(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
    r = CliRunner().invoke(main, list(args), input=stdin)
    return r.exit_code, r.stdout, r.stderr


def hami_files(corpus: Path) -> list[Path]:
    """The corpus HAMi manifests that are manifests (not Helm templates, not prose)."""
    return sorted(
        p
        for p in (corpus / "hami-pods").iterdir()
        if p.suffix in (".yaml", ".yml") and "helm-template" not in p.name
    )


def test_pod_becomes_template_then_pod(corpus: Path) -> None:
    f = corpus / "hami-pods" / "HAMi__examples_nvidia__use_memory_fraction.yaml"
    code, out, err = run("convert", "--cluster", CLUSTER, str(f))
    assert code == 0, err
    assert err == ""
    tmpl, pod = list(yaml.safe_load_all(out))
    assert (tmpl["kind"], tmpl["metadata"]["name"]) == (
        "ResourceClaimTemplate",
        "gpu-pod-ubuntu-container-gpu",
    )
    req = tmpl["spec"]["spec"]["devices"]["requests"][0]
    # 50% of each GPU size of the cluster as published (less the driver-reserved memory the
    # inventory reports), largest first: H100, V100S, A5000, A100 MIG device;
    # 2 GPUs: each size on one NVLink domain first, then anywhere (4 sizes x 3 topology levels
    # is over firstAvailable's 8, so the NUMA level is left out).
    sizes = [("mem-0", "40504Mi"), ("mem-1", "16255Mi"), ("mem-2", "12057Mi"), ("mem-3", "9984Mi")]
    assert [(s["name"], s["capacity"]["requests"]["memory"]) for s in req["firstAvailable"]] == [
        (f"{level}-{name}", mem) for level in ("nvlink", "any") for name, mem in sizes
    ]
    assert pod["spec"]["resourceClaims"] == [
        {
            "name": "ubuntu-container-gpu",
            "resourceClaimTemplateName": "gpu-pod-ubuntu-container-gpu",
        }
    ]
    ctr = pod["spec"]["containers"][0]
    assert ctr["resources"] == {"claims": [{"name": "ubuntu-container-gpu"}]}
    # Deterministic: the same bytes every time; -o json is one List of the same objects.
    assert run("convert", "--cluster", CLUSTER, str(f))[1] == out
    code, js, _ = run("convert", "--cluster", CLUSTER, str(f), "-o", "json")
    assert code == 0
    assert json.loads(js) == {"apiVersion": "v1", "kind": "List", "items": [tmpl, pod]}


def test_workloads_keep_their_kind_and_get_one_template(corpus: Path) -> None:
    f = corpus / "hami-pods" / "HAMi__benchmarks_deployments__job-on-hami.yml"
    code, out, err = run("convert", "--cluster", CLUSTER, str(f))
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["ResourceClaimTemplate", "Job"]
    tmpl, job = docs
    spec = job["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [
        {"name": f"{c}-gpu", "resourceClaimTemplateName": f"{job['metadata']['name']}-{c}-gpu"}
        for c in [tmpl["metadata"]["annotations"]["gpu.tessera.dev/container"]]
    ]
    assert "nvidia.com/gpu" not in json.dumps(spec)
    # Objects without GPU requests pass through untouched, in input order.
    f = corpus / "hami-pods" / "HAMi__examples_nvidia__vllm_cross_vgpu.yaml"
    code, out, err = run("convert", "--cluster", CLUSTER, str(f))
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    original = list(yaml.safe_load_all(f.read_text()))
    assert [d["kind"] for d in docs] == [
        "PersistentVolumeClaim",
        "ResourceClaimTemplate",
        "Deployment",
    ]
    assert docs[0] == original[0]
    assert (
        docs[2]["metadata"] == original[1]["metadata"]
        and docs[2]["spec"]["replicas"] == original[1]["spec"]["replicas"]
    )


def test_warnings_go_to_stderr_and_unconverted_objects_stay(corpus: Path) -> None:
    f = corpus / "hami-pods" / "HAMi__examples_nvidia__mig_example.yaml"
    code, out, err = run("convert", str(f))
    assert code == 0
    assert (
        err.startswith("tessera: warning: ")
        and "nvidia.com/mig-3g.20gb is a MIG-profile resource, not converted" in err
    )
    (pod,) = list(yaml.safe_load_all(out))
    assert pod == yaml.safe_load(f.read_text())


def test_bad_input_writes_nothing(corpus: Path, tmp_path: Path) -> None:
    f = corpus / "hami-pods" / "HAMi__examples_nvidia__vllm_cross_vgpu.yaml"
    code, out, err = run("convert", str(f), "--out-dir", str(tmp_path / "out"))
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith(
        f"tessera: error: {f} (document 2): pod vllm-cross-vgpu, container vllm: nvidia.com/gpumem-percentage 30 needs"
    )
    assert "`tessera convert --cluster FILE` or --node" in line
    assert not (tmp_path / "out").exists()
    helm = corpus / "hami-pods" / "HAMi-DRA__charts_templates__device-config.helm-template.yaml"
    code, out, err = run("convert", str(helm))
    assert code == 2 and out == "" and "this is a template" in err


def test_stdin_and_out_dir(corpus: Path, tmp_path: Path) -> None:
    src = tmp_path / "in"
    (src / "team").mkdir(parents=True)
    for name in (
        "HAMi__examples_nvidia__use_exclusive_card.yaml",
        "HAMi__examples_nvidia__example.yaml",
    ):
        (src / "team" / name).write_text((corpus / "hami-pods" / name).read_text())
    code, _, err = run("convert", str(src), "--out-dir", str(tmp_path / "out"))
    assert code == 0, err
    assert err == f"tessera convert: wrote 2 file(s) under {tmp_path / 'out'}\n"
    for f in sorted((src / "team").iterdir()):
        written = (tmp_path / "out" / "team" / f.name).read_text()
        assert written == run("convert", str(f))[1]
        assert written == run("convert", "-", stdin=f.read_text())[1]
    code, _, err = run("convert", "-", "--out-dir", str(tmp_path / "x"), stdin="")
    assert code == 2 and "not - (stdin)" in err


def _placements(args: list[str]) -> dict[str, Any]:
    code, out, err = run("simulate", "--cluster", CLUSTER, *args, "-o", "json")
    assert code == 0, err
    items = json.loads(out)["items"]
    pods = {
        o["metadata"]["name"]: (o["spec"].get("nodeName"), o["status"])
        for o in items
        if o["kind"] == "Pod"
    }
    claims = {
        o["metadata"]["name"]: (o.get("status") or {}).get("allocation")
        for o in items
        if o["kind"] == "ResourceClaim"
    }
    return {"pods": pods, "claims": claims}


def test_round_trip_gives_the_same_placements(corpus: Path, tmp_path: Path) -> None:
    files = hami_files(corpus)
    assert len(files) == 25
    placed = 0
    for f in files:
        code, out, err = run("convert", "--cluster", CLUSTER, str(f))
        assert code == 0, (f, err)
        converted = tmp_path / f.name
        converted.write_text(out)
        before, after = _placements([str(f)]), _placements([str(converted)])
        assert after == before, f.name
        placed += sum(1 for node, _ in before["pods"].values() if node)
    assert (
        placed == 32
    )  # pods of the corpus that the bundled cluster can place (MIG devices included)


def test_text_beyond_ascii_is_written_as_itself(tmp_path: Path) -> None:
    # kubectl writes a label value or annotation such as "café" as itself in YAML and JSON.
    f = tmp_path / "p.yaml"
    f.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  annotations: {team: café, note: 日本}\n"
        "spec:\n  containers:\n  - name: c\n    image: x\n"
        "    resources: {limits: {nvidia.com/gpu: 1}}\n",
        encoding="utf-8",
    )
    for fmt in ("yaml", "json"):
        code, out, err = run("convert", "--cluster", CLUSTER, str(f), "-o", fmt)
        assert code == 0, err
        assert "café" in out and "日本" in out and "\\x" not in out and "\\u" not in out, out
    code, out, err = run("simulate", "--cluster", CLUSTER, str(f), "-o", "yaml")
    assert code == 0, err
    assert "team: café" in out and "note: 日本" in out


def test_volcano_uuid_pins_are_kept_by_simulate_and_convert(tmp_path: Path) -> None:
    # Issue 22 item 5: a Volcano pod pinned to the A5000 node's second GPU lands there; one that
    # excludes both GPUs stays pending; convert writes the selector.
    inv = (
        REPO / "src/tessera/examples/inventories/telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"
    )
    second = "GPU-12345678-aaaa-bbbb-cccc-0123456789cd"
    first = "GPU-12345678-aaaa-bbbb-cccc-0123456789ab"
    pods = ""
    for name, ann in (
        (
            "pinned",
            f"volcano.sh/vgpu-use-gpuuuid: ' {first} , {second} '\n    volcano.sh/vgpu-nouse-gpuuuid: '{first}'",
        ),
        ("fenced", f"volcano.sh/vgpu-nouse-gpuuuid: '{first},{second}'"),
    ):
        pods += (
            f"---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  annotations:\n    {ann}\n"
            "spec:\n  containers:\n  - name: c\n    image: x\n"
            "    resources: {limits: {volcano.sh/vgpu-number: 1, volcano.sh/vgpu-memory: 3000}}\n"
        )
    f = tmp_path / "volcano.yaml"
    f.write_text(pods)
    code, out, err = run("simulate", "--node", f"n={inv}", str(f), "-o", "yaml")
    assert code == 0, err
    items = yaml.safe_load(out)["items"]
    claims = {o["metadata"]["name"]: o for o in items if o["kind"] == "ResourceClaim"}
    (result,) = claims["pinned-c-gpu"]["status"]["allocation"]["devices"]["results"]
    assert result["device"] == "gpu-1"
    assert "allocation" not in (claims["fenced-c-gpu"].get("status") or {})
    code, out, err = run("convert", "--node", f"n={inv}", str(f))
    assert code == 0 and err == "", err
    tmpl = next(o for o in yaml.safe_load_all(out) if o["metadata"]["name"] == "pinned-c-gpu")
    exprs = [
        s["cel"]["expression"]
        for s in tmpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    ]
    assert (
        len(exprs) == 2 and first in exprs[0] and second in exprs[0] and exprs[1].startswith("!(")
    )
