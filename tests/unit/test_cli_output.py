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
from tessera.cli._tables import FitTable, _fit, unique_prefixes

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
    """The cells of each row of the table titled ``title``, folded cells read back whole: a
    row starts on a line whose last cell is not empty, and each column's continuation lines
    are appended to it (without the spaces a wrap removed)."""
    lines = out.splitlines()
    start = lines.index(next(line for line in lines if line.strip() == title))
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("└"):
            break
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.strip("│").split("│")]
        if cells[-1] or not rows:
            rows.append(cells)
        else:
            rows[-1] = [a + b for a, b in zip(rows[-1], cells, strict=True)]
    return rows


@pytest.mark.parametrize("columns", [60, 80, 100, 132])
def test_every_line_fits_the_terminal(columns: int) -> None:
    code, out, _ = run("simulate", columns=columns)
    assert code == 0
    widths = [len(line) for line in out.splitlines()]
    assert max(widths) <= columns
    assert "16 pod(s) scheduled, 2 pending." in out


def test_placements_and_gpus_share_the_device_key() -> None:
    code, out, _ = run("simulate", columns=100)
    assert code == 0
    placed = table_rows(out, "Placements")
    on_gpu5 = sorted(r[0] for r in placed if r[2] == "h100-node/gpu-5")
    # Two HAMi pods share h100-node/gpu-5: 40504Mi + 32403Mi = 72907Mi booked there (of the
    # 81008Mi published: 81559Mi less the 551Mi the driver reserves).
    assert on_gpu5 == ["default/hami-memory-fraction", "default/hami-sharing-1"]
    gpus = {r[0]: r for r in table_rows(out, "GPUs")}
    assert gpus["h100-node/gpu-5"][3:] == ["72907Mi / 81008Mi", "90 / 100", "2"]
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
        if columns >= 80:  # (at 60 the shareID column folds too, which table_rows cannot undo)
            assert {r[5] for r in table_rows(out, "Placements")} == set(
                unique_prefixes(share_ids, 8).values()
            )
        assert "…" not in out  # nothing is ever elided


def test_wide_shows_every_column_whole() -> None:
    code, out, _ = run("simulate", "-o", "wide", columns=80)
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("┃ pod"))
    assert [h.strip() for h in header.strip("┃").split("┃")] == [
        "pod", "container", "claim", "request", "node", "device", "GPU", "model", "memory", "cores", "shareID",
        "allocatable",
    ]  # fmt: skip
    rows = {(r[0], r[5]): r for r in table_rows(out, "Placements")}
    r = rows[("default/hami-sharing-1", "h100-node/gpu-5")]
    assert r[2] == "default/hami-sharing-1-ubuntu-container-gpu"
    assert r[6].startswith("GPU-980ea11b-") and len(r[6]) == 40
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", r[10])
    assert all(
        len(line) > 80 for line in out.splitlines() if line.startswith("│ default/hami-sharing-1")
    )
    # What one process can allocate of the share: its memory less one CUDA context, the
    # context-overhead the driver writes into the limits file (and the library charges).
    assert (r[8], r[11]) == ("32403Mi", "31891Mi")
    assert "each CUDA context takes 512Mi of it" in " ".join(out.split())


def test_allocatable_is_the_share_less_one_context_for_every_placement() -> None:
    from tessera.api.quantity import Quantity
    from tessera.enforcement.limits import DEFAULT_CONTEXT_OVERHEAD

    code, out, _ = run("simulate", "-o", "wide", columns=300)
    assert code == 0
    rows = [r for r in table_rows(out, "Placements") if r[8] != "-"]
    assert len(rows) >= 10
    for r in rows:
        mem = Quantity.parse(r[8]).value_int()
        left = Quantity.parse(r[11]).value_int()
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


def test_fit_gives_way_outliers_then_text_then_identifiers() -> None:
    t = FitTable("T", [("name", False), ("id", True)])
    for name, ident in [("a" * 30, "i" * 12)] * 3 + [("b" * 10, "i" * 40)]:
        t.add_row(name, ident)
    assert t.natural_widths() == [30, 40] and t.typical_widths() == [30, 12]
    assert _fit([30, 40], [30, 12], [False, True], 60) == [30, 30]  # the outlier id folds first
    assert _fit([30, 40], [30, 12], [False, True], 30) == [18, 12]  # then the text
    assert _fit([30, 40], [30, 12], [False, True], 10) == [10, 8]  # then ids, to the floors
