"""What ``tessera simulate`` prints: tables that fit the terminal, one device key in both tables,
identifiers never cut; ``-o wide``; ``--namespace``; ``--fail-on-pending``; ``tessera --version``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tessera import KUBERNETES_VERSION
from tessera.cli import main
from tessera.cli._tables import FitTable, unique_prefixes

REPO = Path(__file__).resolve().parents[2]
CLUSTER = str(REPO / "src/tessera/examples/cluster.yaml")


def run(*args: str, columns: int = 100) -> tuple[int, str, str]:
    r = CliRunner(env={"COLUMNS": str(columns)}).invoke(main, list(args))
    return r.exit_code, r.stdout, r.stderr


def default_world() -> dict[str, object]:
    code, out, _ = run("simulate", "-o", "json")
    assert code == 0
    return json.loads(out)  # type: ignore[no-any-return]


def table_rows(out: str, title: str) -> list[list[str]]:
    """The cells of each row of the table titled ``title``: columns are three spaces (or more,
    padded) apart and no cell holds two spaces in a row, so a line splits on runs of two."""
    lines = out.splitlines()
    start = lines.index(title)
    rows: list[list[str]] = []
    for line in lines[start + 2 :]:
        if not line or (line == line.lstrip() and "   " not in line):
            break  # the blank line before the next table, a caption, the footer
        rows.append(re.split(r" {2,}", line))
    return rows


def header(out: str, title: str) -> list[str]:
    lines = out.splitlines()
    return re.split(r" {2,}", lines[lines.index(title) + 1])


@pytest.mark.parametrize("columns", [60, 80, 100, 132])
def test_rows_never_wrap_and_identifiers_are_never_cut(columns: int) -> None:
    # Issue 22 item 15: at 80 columns the tables broke pod names mid-word
    # (`default/infe` / `rence-0`). As kubectl: one line per row, identifiers whole.
    code, out, _ = run("simulate", columns=columns)
    assert code == 0
    assert "16 pod(s) scheduled, 2 pending." in out
    world = default_world()
    pods = sorted(
        f"{o['metadata'].get('namespace', 'default')}/{o['metadata']['name']}"
        for o in world["items"]  # type: ignore[index]
        if o["kind"] == "Pod" and o["spec"].get("nodeName")
    )
    placed = table_rows(out, "Placements")
    assert header(out, "Placements") == ["POD", "CONTAINER", "DEVICE", "MEMORY", "CORES", "SHAREID"]
    assert all(len(r) == 6 for r in placed)
    assert sorted(set(r[0] for r in placed)) == pods
    assert "default/inference-0" in out.split()  # whole, one word
    gpus = table_rows(out, "GPUs")
    assert len(gpus) == 22 and all(len(r) == 6 for r in gpus)
    pending = table_rows(out, "Unschedulable pods")
    assert [r[0] for r in pending] == ["default/too-big", "default/hami-uuid-pinned"]
    # Only free text is cut, and only to fit: the reasons' lines fit the terminal.
    reason_lines = out.splitlines()[out.splitlines().index("Unschedulable pods") + 2 :][:2]
    assert all(len(line) <= max(columns, 24 + 3 + 10) for line in reason_lines)
    if columns < 132:
        assert all(r[1].endswith("...") for r in pending)
        assert "reasons cut to fit: -o wide or tessera explain POD" in out
    else:
        assert max(len(line) for line in out.splitlines()) <= columns


def test_placements_and_gpus_share_the_device_key() -> None:
    code, out, _ = run("simulate", columns=100)
    assert code == 0
    placed = table_rows(out, "Placements")
    on_gpu5 = sorted(r[0] for r in placed if r[2] == "h100-node/gpu-5")
    # Two HAMi pods share h100-node/gpu-5: 40504Mi + 32403Mi = 72907Mi booked there (of the
    # 81008Mi published: 81559Mi less the 551Mi the driver reserves).
    assert on_gpu5 == ["default/hami-memory-fraction", "default/hami-sharing-1"]
    assert header(out, "GPUs") == ["DEVICE", "GPU", "MEMORY", "CORES", "SHARES", "MODEL"]
    gpus = {r[0]: r for r in table_rows(out, "GPUs")}
    assert gpus["h100-node/gpu-5"][2:5] == ["72907Mi/81008Mi", "90/100", "2"]
    assert gpus["h100-node/gpu-5"][1] == "GPU-980ea11b"  # shortest unique prefix (12 at least)
    # The same key, from the claims' allocation results.
    world = default_world()
    claims = [o for o in world["items"] if o["kind"] == "ResourceClaim"]  # type: ignore[index]
    on5 = {
        c["metadata"]["name"]
        for c in claims
        for r in ((c.get("status") or {}).get("allocation") or {})
        .get("devices", {})
        .get("results", [])
        if (r["pool"], r["device"]) == ("h100-node", "gpu-5")
    }
    assert on5 == {
        "hami-memory-fraction-ubuntu-container-gpu",
        "hami-sharing-1-ubuntu-container-gpu",
    }


def test_identifiers_are_unique_prefixes_never_cut() -> None:
    world = default_world()
    slices = [o for o in world["items"] if o["kind"] == "ResourceSlice"]  # type: ignore[index]
    uuids = sorted(
        d["attributes"]["uuid"]["string"]
        for s in slices
        for d in s["spec"]["devices"]
        if "uuid" in d["attributes"]
    )
    claims = [o for o in world["items"] if o["kind"] == "ResourceClaim"]  # type: ignore[index]
    share_ids = {
        r["shareID"]
        for c in claims
        for r in ((c.get("status") or {}).get("allocation") or {})
        .get("devices", {})
        .get("results", [])
        if "shareID" in r
    }
    a5000 = [u for u in uuids if u.startswith("GPU-12345678")]
    assert a5000 == [
        "GPU-12345678-aaaa-bbbb-cccc-0123456789ab",
        "GPU-12345678-aaaa-bbbb-cccc-0123456789cd",
    ]
    shown = unique_prefixes(uuids, 12)
    # The A5000 pair share their first 38 characters: both keep the 39th, nothing is cut.
    assert (shown[a5000[0]], shown[a5000[1]]) == (a5000[0][:39], a5000[1][:39])
    assert len(set(shown.values())) == len(uuids)
    for columns in (60, 80, 100):
        code, out, _ = run("simulate", columns=columns)
        assert code == 0
        assert sorted(r[1] for r in table_rows(out, "GPUs") if r[1] != "-") == sorted(
            shown.values()
        )
        assert {r[5] for r in table_rows(out, "Placements")} == set(
            unique_prefixes(share_ids, 8).values()
        )
        assert "…" not in out


def test_wide_shows_every_column_whole() -> None:
    code, out, _ = run("simulate", "-o", "wide", columns=80)
    assert code == 0
    assert header(out, "Placements") == [
        "POD", "CONTAINER", "CLAIM", "REQUEST", "NODE", "DEVICE", "GPU", "MEMORY", "CORES", "SHAREID",
        "ALLOCATABLE", "MODEL",
    ]  # fmt: skip
    rows = {(r[0], r[5]): r for r in table_rows(out, "Placements")}
    r = rows[("default/hami-sharing-1", "h100-node/gpu-5")]
    assert r[2] == "default/hami-sharing-1-ubuntu-container-gpu"
    assert r[6].startswith("GPU-980ea11b-") and len(r[6]) == 40
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", r[9])
    assert r[11] == "NVIDIA H100 80GB HBM3"
    assert "..." not in out  # nothing cut
    # What one process can allocate of the share: its memory less one CUDA context, the
    # context-overhead the driver writes into the limits file (and the library charges).
    assert (r[7], r[10]) == ("32403Mi", "31891Mi")
    assert "each CUDA context takes 512Mi of it" in " ".join(out.split())
    pending = {p: reason for p, reason in table_rows(out, "Unschedulable pods")}
    world = default_world()
    (too_big,) = [
        o
        for o in world["items"]  # type: ignore[index]
        if o["kind"] == "Pod" and o["metadata"]["name"] == "too-big"
    ]
    assert pending["default/too-big"] == too_big["status"]["conditions"][0]["message"]


def test_allocatable_is_the_share_less_one_context_for_every_placement() -> None:
    from tessera.api.quantity import Quantity
    from tessera.enforcement.limits import DEFAULT_CONTEXT_OVERHEAD

    code, out, _ = run("simulate", "-o", "wide", columns=300)
    assert code == 0
    rows = [r for r in table_rows(out, "Placements") if r[7] != "-"]
    assert len(rows) >= 10
    for r in rows:
        mem = Quantity.parse(r[7]).value_int()
        left = Quantity.parse(r[10]).value_int()
        assert left == max(0, mem - DEFAULT_CONTEXT_OVERHEAD), r


def test_namespace_filter_and_fail_on_pending(tmp_path: Path) -> None:
    code, out, _ = run("simulate", "--fail-on-pending")
    assert code == 1 and "16 pod(s) scheduled, 2 pending." in out
    code, out, _ = run("simulate", "-n", "default", "--fail-on-pending")
    assert code == 1
    code, out, err = run("simulate", "-n", "team-b", "--fail-on-pending")
    assert code == 0 and "0 pod(s) scheduled, 0 pending." in out
    # a namespace no pod is in (a typo) is said, so a CI gate does not pass unnoticed
    assert (
        "tessera: warning: -n team-b: no pod of the input is in namespace 'team-b' "
        "(namespaces with pods: default)"
    ) in err
    # A second namespace: its pods are reported alone, yet they compete with every other pod.
    f = tmp_path / "b.yaml"
    f.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: solo, namespace: team-b}\nspec:\n  containers:\n"
        "  - name: c\n    image: x\n    resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 20000}}\n"
    )
    code, out, err = run(
        "simulate",
        "--cluster",
        CLUSTER,
        str(REPO / "src/tessera/examples/workloads"),
        str(f),
        "-n",
        "team-b",
        "-o",
        "yaml",
        "--fail-on-pending",
    )
    assert code == 0, err
    items = yaml.safe_load(out)["items"]
    assert {
        o["metadata"].get("namespace")
        for o in items
        if o["kind"] in ("Pod", "ResourceClaim", "ResourceClaimTemplate")
    } == {"team-b"}
    assert sum(o["kind"] == "ResourceSlice" for o in items) == 4
    (pod,) = [o for o in items if o["kind"] == "Pod"]
    assert pod["spec"]["nodeName"] == "h100-node"  # after the default namespace's pods
    (claim,) = [o for o in items if o["kind"] == "ResourceClaim"]
    # First fit: gpu-0 has 81559Mi - 5 x 8Gi = 41559Mi left after the default namespace's pods.
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"


def test_fail_on_pending_with_compare_uses_the_policy_run() -> None:
    code, out, _ = run("simulate", "--compare", "--fail-on-pending", "-o", "json")
    assert code == 1
    # spread: 2 since converted claims land on MIG devices too (the A100 MIG node takes HAMi pods)
    assert [r["podsPending"] for r in json.loads(out)] == [2, 2, 2, 2, 3]  # first-fit: 2
    code, out, _ = run(
        "simulate", "--compare", "--policy", "spread", "--fail-on-pending", "-n", "team-b"
    )
    assert code == 0


def test_version_names_the_kubernetes_release_tessera_targets() -> None:
    code, out, _ = run("--version")
    assert code == 0
    gomod = (REPO / "tools/kube/go.mod").read_text()
    pinned = re.search(r"^\s*k8s\.io/kubernetes (v\S+)$", gomod, re.M)
    assert pinned is not None and pinned.group(1) == KUBERNETES_VERSION
    assert out.splitlines()[0] == "tessera 0.1.0"
    assert f"targets Kubernetes {KUBERNETES_VERSION}: resource.k8s.io/v1" in out


def test_unique_prefixes() -> None:
    got = unique_prefixes(["GPU-aaaa0001", "GPU-aaaa0002", "GPU-b", "GPU-aaaa0001"], 5)
    assert got == {"GPU-aaaa0001": "GPU-aaaa0001", "GPU-aaaa0002": "GPU-aaaa0002", "GPU-b": "GPU-b"}
    assert unique_prefixes(["abc", "abcdef"], 1) == {"abc": "abc", "abcd" + "ef": "abcd"}
    assert unique_prefixes(["x1234567890", "y"], 4) == {"x1234567890": "x123", "y": "y"}


def test_only_free_text_gives_way() -> None:
    t = FitTable("T", [("name", False), ("reason", True)])
    t.add_row("a" * 30, "why " * 10)
    t.add_row("b" * 10, "short")
    assert t.natural_widths() == [30, 39]
    assert t.widths(60) == [30, 27]  # the reason gives 12 cells
    assert t.widths(20) == [30, 10]  # never below its floor; the name never gives way
    assert t.lines(60) == [
        "T",
        "NAME                             REASON",
        "a" * 30 + "   why why why why why why...",
        "b" * 10 + " " * 23 + "short",
    ]
    assert t.lines(None)[2] == "a" * 30 + "   " + ("why " * 10).strip()
