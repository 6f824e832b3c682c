"""tessera.monitor without processes: the region directory contract, the allocation view
from real slices and simulated allocations, the collector's joins and labels, the documented
metric list, and the CLI's start-up errors."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml
from click.testing import CliRunner

from tessera.api.loader import Manifest, Source
from tessera.cli import main
from tessera.enforcement import region as R
from tessera.enforcement.layout import DEFAULT_CLAIMS_DIR, REGION_FILE, claims_dir
from tessera.enforcement.limits import GpuLimit, Limits, write_limits
from tessera.inventory import build_resource_slices, load_inventory
from tessera.monitor.allocation import AllocationView, allocation_view
from tessera.monitor.collector import TesseraCollector
from tessera.monitor.metrics import BY_NAME, CLAIM_LABELS, GPU_LABELS, METRICS, SHARE_LABELS
from tessera.monitor.regions import MetadataError, RegionDir, parse_claim_json
from tessera.sim.cluster import Cluster, SimNode
from tessera.sim.simulate import Simulation

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30
MiB = 1 << 20
H100 = "inventories/gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"


# ---- claim.json ------------------------------------------------------------------------------


def test_claim_json_full_and_defaults() -> None:
    meta = parse_claim_json(
        json.dumps(
            {
                "version": 1,
                "uid": "u-1",
                "namespace": "team-a",
                "name": "c",
                "driver": "gpu.tessera.dev",
                "pool": "n1",
                "devices": [{"uuid": "GPU-AAAA", "device": "gpu-3"}],
                "pods": [
                    {
                        "namespace": "team-a",
                        "name": "p",
                        "uid": "pu",
                        "containers": ["main", "side"],
                    }
                ],
            }
        ),
        "x/claim.json",
        "dir-uid",
    )
    assert (meta.uid, meta.namespace, meta.name, meta.pool) == ("u-1", "team-a", "c", "n1")
    assert meta.devices == {"gpu-aaaa": "gpu-3"}
    assert meta.pods[0].containers == ("main", "side")
    assert parse_claim_json("{}", "x", "dir-uid").uid == "dir-uid"


@pytest.mark.parametrize(
    "text, msg",
    [
        ("{", "x/claim.json: not JSON"),
        ("[]", "x/claim.json: expected a JSON object"),
        ('{"version": 2}', "x/claim.json: version 2 is not supported"),
        ('{"devices": ["gpu-0"]}', "x/claim.json: devices[0]: expected an object"),
        (
            '{"pods": [{"name": "p", "containers": "main"}]}',
            "x/claim.json: pods[0].containers: expected a list",
        ),
        ('{"namespace": 3}', "x/claim.json: namespace: expected a string, got int"),
    ],
)
def test_claim_json_errors_name_file_and_field(text: str, msg: str) -> None:
    with pytest.raises(MetadataError, match=re.escape(msg)):
        parse_claim_json(text, "x/claim.json", "u")


# ---- the region directory ------------------------------------------------------------------


def _claim_dir(
    root: Path, uid: str, gpus: list[tuple[str, int, int]], claim: str | None = None
) -> Path:
    d = root / uid
    d.mkdir()
    R.create_region(str(d / REGION_FILE), gpus)
    if claim:
        write_limits(
            str(d / "limits"),
            Limits(
                region="/run/tessera/usage",
                claim=claim,
                claim_uid=uid,
                gpus=tuple(GpuLimit(u, m, c) for u, m, c in gpus),
            ),
        )
    return d


U0 = "GPU-00000000-1111-2222-3333-444444444444"
U1 = "GPU-11111111-2222-3333-4444-555555555555"


def test_region_dir_reads_each_claim_on_its_own(tmp_path: Path) -> None:
    _claim_dir(tmp_path, "uid-a", [(U0, 8 * GiB, 30)], claim="team-a/a")
    d = _claim_dir(tmp_path, "uid-b", [(U1, GiB, 0)])
    (d / "claim.json").write_text(
        '{"namespace": "team-b", "name": "b", "pods": [{"namespace": "team-b", "name": "nb"}]}'
    )
    bad = _claim_dir(tmp_path, "uid-c", [(U1, GiB, 0)], claim="team-c/c")
    (bad / REGION_FILE).write_bytes(b"TSSREGN1" + bytes(100))  # truncated
    (bad / "claim.json").write_text("{not json")
    (tmp_path / "uid-preparing").mkdir()  # no usage file yet
    (tmp_path / "stray-file").write_text("x")
    got = {r.meta.uid: r for r in RegionDir(str(tmp_path)).read()}
    assert sorted(got) == ["uid-a", "uid-b", "uid-c"]
    a, b, c = got["uid-a"], got["uid-b"], got["uid-c"]
    assert (a.meta.namespace, a.meta.name, a.error) == ("team-a", "a", None)
    assert (
        a.snapshot is not None
        and a.snapshot.gpus[0].memory_limit == 8 * GiB
        and a.snapshot.gpus[0].cores == 30
    )
    assert (b.meta.namespace, b.meta.name, [p.name for p in b.meta.pods]) == ("team-b", "b", ["nb"])
    assert (
        c.snapshot is None
        and c.error is not None
        and "region is 108 bytes, expected 230976" in c.error
    )
    assert (
        c.meta.name == "c" and c.meta_error is not None and "claim.json: not JSON" in c.meta_error
    )


# ---- the allocation view -------------------------------------------------------------------------


def _claim_template(name: str, memory: str | None, cores: str | None) -> dict:
    caps = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    exactly: dict = {"deviceClassName": "gpu.tessera.dev"}
    if caps:
        exactly["capacity"] = {"requests": caps}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


def _pod(name: str, template: str, containers: tuple[str, ...] = ("main",)) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            "containers": [
                {"name": c, "image": "x", "resources": {"claims": [{"name": "gpu"}]}}
                for c in containers
            ]
            + [{"name": "sidecar", "image": "x"}],
        },
    }


@pytest.fixture
def simulated(corpus: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """8x H100 node 'gpu-1' with three pods allocated by the simulation: (slices, claims, pods)."""
    slices = build_resource_slices("gpu-1", load_inventory(corpus / H100))
    objs = [
        _claim_template("half", "40Gi", "50"),
        _claim_template("small", "10Gi", "20"),
        _claim_template("whole", None, None),
        _pod("a", "half", ("main", "worker")),
        _pod("b", "small"),
        _pod("c", "half"),
        _pod("d", "whole"),
    ]
    ms = [Manifest(o, Source("test", i)) for i, o in enumerate(objs)]
    res = Simulation(Cluster([SimNode("gpu-1", {}, slices)]), ms).run()
    assert not res.pending
    claims = [o for o in res.objects if o["kind"] == "ResourceClaim"]
    pods = [o for o in res.objects if o["kind"] == "Pod"]
    return slices, claims, pods


def test_allocation_view_matches_the_allocations(
    simulated: tuple[list[dict], list[dict], list[dict]],
) -> None:
    slices, claims, pods = simulated
    view = allocation_view("gpu-1", slices, claims, pods)
    assert len(view.gpus) == 8
    g = {x.device: x for x in view.gpus}
    # First fit: a (40Gi/50) and b (10Gi/20) share gpu-0; c (40Gi/50) does not fit beside them
    # (81559Mi < 90Gi), so it goes to gpu-1; d asks for no capacity: the request policy's
    # defaults book all of gpu-2's memory and no cores (a share, not a dedicated device).
    assert (
        g["gpu-0"].memory_allocated == 50 * GiB
        and g["gpu-0"].cores_allocated == 70
        and g["gpu-0"].shares == 2
    )
    assert g["gpu-1"].memory_allocated == 40 * GiB and g["gpu-1"].shares == 1
    # (81559 MiB less the 551 MiB the driver reserves)
    assert g["gpu-2"].memory_allocated == g["gpu-2"].memory_capacity == 81008 * MiB
    assert g["gpu-2"].cores_allocated == 0 and not g["gpu-2"].dedicated
    assert (
        g["gpu-7"].memory_allocated == 0
        and g["gpu-7"].index == "7"
        and g["gpu-7"].model == "NVIDIA H100 80GB HBM3"
    )
    by_claim = {s.claim_name: s for s in view.shares}
    assert (
        by_claim["a-gpu"].memory == 40 * GiB
        and by_claim["a-gpu"].cores == 50
        and by_claim["a-gpu"].device == "gpu-0"
    )
    assert (
        by_claim["d-gpu"].memory == 81008 * MiB
        and by_claim["d-gpu"].cores == 0
        and by_claim["d-gpu"].shared
    )
    info = {i.name: i for i in view.claims.values()}
    assert [(p.name, p.containers, p.container_indexes) for p in info["a-gpu"].pods] == [
        ("a", ("main", "worker"), (0, 1))
    ]
    # Another node's view sees none of it.
    assert allocation_view("gpu-2", slices, claims, pods).gpus == ()


def test_collector_joins_regions_nvml_free_and_api(
    tmp_path: Path, simulated: tuple[list[dict], list[dict], list[dict]]
) -> None:
    slices, claims, pods = simulated
    view = allocation_view("gpu-1", slices, claims, pods, fetched_at=1700000000.0)
    a = next(c for c in claims if c["metadata"]["name"] == "a-gpu")
    uuid0 = next(x.uuid for x in view.gpus if x.device == "gpu-0")
    # The driver prepared claim a: its region, named by the claim's UID, with no claim.json.
    _claim_dir(tmp_path, a["metadata"]["uid"], [(uuid0.lower(), 40 * GiB, 50)])

    class Api:
        def snapshot(self) -> tuple[AllocationView | None, bool, float]:
            return view, True, view.fetched_at

    logs: list[str] = []
    col = TesseraCollector("gpu-1", RegionDir(str(tmp_path)), None, Api(), logs.append)
    fams = {f.name: f for f in col.collect()}
    used = fams["tessera_share_memory_used_bytes"].samples
    assert len(used) == 1
    labels = used[0].labels
    # Identity from the API (claim by UID, pod and containers by reservedFor), device from the slice.
    assert labels == {
        "node": "gpu-1",
        "UUID": uuid0,
        "dra_driver_name": "gpu.tessera.dev",
        "dra_pool_name": "gpu-1",
        "dra_device_name": "gpu-0",
        "dra_claim_namespace": "ml",
        "dra_claim_name": "a-gpu",
        "dra_claim_uid": a["metadata"]["uid"],
        "namespace": "ml",
        "pod": "a",
        "container": "main,worker",
    }
    alloc = {
        tuple(sorted(s.labels.items())): s.value
        for s in fams["tessera_share_memory_allocated_bytes"].samples
    }
    assert alloc[tuple(sorted(labels.items()))] == 40 * GiB  # same labels on both sides
    gpu0 = [
        s
        for s in fams["tessera_gpu_memory_allocated_bytes"].samples
        if s.labels["dra_device_name"] == "gpu-0"
    ]
    assert gpu0[0].value == 50 * GiB and gpu0[0].labels["gpu"] == "0"
    hami = [s for s in fams["hami_vgpu_memory_allocated_bytes"].samples if s.labels["pod"] == "a"]
    assert hami[0].labels["container_index"] == "0,1" and hami[0].labels["zone"] == "vGPU"
    assert {
        s.value
        for s in fams["hami_gpu_core_allocated_ratio"].samples
        if s.labels["device_index"] == "0"
    } == {70}
    assert fams["tessera_monitor_api_up"].samples[0].value == 1
    assert "tessera_monitor_nvml_up" not in fams and "tessera_gpu_memory_used_bytes" not in fams
    assert logs == []


def test_every_metric_is_documented_with_labels_unit_and_hami_name() -> None:
    doc = (REPO / "docs" / "monitoring.md").read_text()
    named = {SHARE_LABELS: "*share*", CLAIM_LABELS: "*claim*", GPU_LABELS: "*GPU*"}
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_]+)` \|.*$", doc, re.M)}
    documented = {n for n in rows if n.startswith(("tessera_", "hami_"))}
    assert documented == set(BY_NAME), documented ^ set(BY_NAME)
    for m in METRICS:
        cells = [c.strip() for c in rows[m.name].strip("|").split("|")]
        assert cells[1] == m.kind, m.name
        assert cells[2] == named.get(m.labels, ", ".join(m.labels)), m.name
        assert cells[3] == m.unit, m.name
        assert cells[4] == (f"`{m.hami}`" if m.hami else "-"), m.name


def test_dashboard_and_alerts_use_only_exported_metrics() -> None:
    dash = json.loads((REPO / "deploy" / "monitoring" / "tessera-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    rules = yaml.safe_load((REPO / "deploy" / "monitoring" / "tessera-alerts.yaml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = {n for e in exprs for n in re.findall(r"\b((?:tessera|hami)_[a-z_]+)\b", e)}
    assert used and used <= set(BY_NAME), used - set(BY_NAME)
    # The share panel draws the limit beside the usage.
    share = next(
        p for p in dash["panels"] if p["title"].startswith("Share memory used, with its limit")
    )
    assert [t["expr"].split("{")[0] for t in share["targets"]] == [
        "tessera_share_memory_used_bytes",
        "tessera_share_memory_limit_bytes",
    ]


# ---- CLI ---------------------------------------------------------------------------------------


def _one_line_exit_2(args: list[str], own_process: bool = False) -> str:
    """The one error line of ``tessera ARGS`` exiting 2; ``own_process``: run as ``python -m
    tessera`` (60 s at most), for state this process may hold (a loaded NVML)."""
    if own_process:
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        p = subprocess.run(
            [sys.executable, "-m", "tessera", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        code, output = p.returncode, p.stdout + p.stderr
    else:
        r = CliRunner().invoke(main, args)
        code, output = r.exit_code, r.output
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tessera: error: "), output
    return lines[0]


def test_monitor_start_up_errors(tmp_path: Path) -> None:
    assert "--region-dir" in _one_line_exit_2(
        ["monitor", "--region-dir", str(tmp_path / "nope"), "--no-api", "--no-nvml"]
    )
    # No libnvidia-ml.so.1 on this machine: NVML missing is one line naming --no-nvml. In a
    # process of its own: pynvml keeps the library it loaded once, and earlier tests of this
    # session load the fake NVML through it (the monitor would start and serve for ever).
    assert "pass --no-nvml" in _one_line_exit_2(
        ["monitor", "--region-dir", str(tmp_path), "--no-api"], own_process=True
    )
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            }
        )
    )
    line = _one_line_exit_2(
        ["monitor", "--region-dir", str(tmp_path), "--no-nvml", "--kubeconfig", str(kc)]
    )
    assert "cannot reach the API server https://127.0.0.1:1" in line
    line = _one_line_exit_2(["explain", "ml/x", "--kubeconfig", str(kc)])
    assert "cannot reach the API server https://127.0.0.1:1" in line
    exec_kc = tmp_path / "exec-kubeconfig"
    exec_kc.write_text(kc.read_text().replace("token: t", "exec: {command: aws}"))
    assert "users[u].exec is not supported" in _one_line_exit_2(
        ["simulate", "--kubeconfig", str(exec_kc)]
    )


def test_node_objects_in_files_define_nodes_with_their_labels(tmp_path: Path, corpus: Path) -> None:
    slices = build_resource_slices("gpu-b", load_inventory(corpus / H100))
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gpu-b", "labels": {"zone": "b"}},
    }
    pod = _pod("z", "small")
    pod["spec"]["nodeSelector"] = {"zone": "b"}
    f = tmp_path / "world.yaml"
    f.write_text(yaml.safe_dump_all([node, *slices, _claim_template("small", "10Gi", "20"), pod]))
    r = CliRunner().invoke(main, ["simulate", str(f), "-o", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    placed = next(o for o in out["items"] if o["kind"] == "Pod")
    assert placed["spec"]["nodeName"] == "gpu-b"
    assert not any(o["kind"] == "Node" for o in out["items"])
    # Without the Node (so without its label) the selector matches no node.
    f.write_text(yaml.safe_dump_all([*slices, _claim_template("small", "10Gi", "20"), pod]))
    r = CliRunner().invoke(main, ["simulate", str(f), "-o", "json"])
    assert (
        "nodeName"
        not in next(o for o in json.loads(r.output)["items"] if o["kind"] == "Pod")["spec"]
    )


def test_add_node_reports_who_lands_there(corpus: Path) -> None:
    ex = REPO / "src" / "tessera" / "examples"
    a10 = corpus / "inventories" / "gpud__nvidia-query_testdata__nvidia-smi-q.535.129.03.A10.txt"
    r = CliRunner().invoke(
        main,
        [
            "simulate",
            "--cluster",
            str(ex / "cluster.yaml"),
            str(ex / "workloads"),
            "--add-node",
            f"spare={a10}",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "with spare added: 0 pod(s) scheduled there" in r.output
    line = _one_line_exit_2(
        ["simulate", "--cluster", str(ex / "cluster.yaml"), "--add-node", f"h100-node={a10}"]
    )
    assert "--add-node" in line and "'h100-node' is already defined" in line


def test_live_selection_keeps_allocations_and_queues_pending_oldest_first() -> None:
    from tessera.api.loader import load_objects
    from tessera.kube.live import pending_outcome, select_objects

    def pod(
        name: str,
        ts: str,
        node: str | None = None,
        claims: bool = True,
        phase: str = "Pending",
        hami: bool = False,
    ) -> dict:
        spec: dict = {"containers": [{"name": "c", "image": "x"}]}
        if claims:
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
        if hami:
            spec["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
        if node:
            spec["nodeName"] = node
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "ml",
                "creationTimestamp": ts,
                "managedFields": [{"manager": "kubectl"}],
            },
            "spec": spec,
            "status": {"phase": phase},
        }

    objs = [
        pod("late", "2026-01-02T00:00:00Z"),
        pod("bound", "2026-01-03T00:00:00Z", node="n1"),
        pod("early", "2026-01-01T00:00:00Z"),
        pod("done", "2026-01-01T00:00:00Z", node="n1", phase="Succeeded"),
        pod("web", "2026-01-01T00:00:00Z", node="n1", claims=False),
        pod("hami", "2026-01-05T00:00:00Z", claims=False, hami=True),
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}},
    ]
    out, states = select_objects(objs)
    assert [(o["kind"], o["metadata"]["name"]) for o in out] == [
        ("Node", "n1"),
        ("Pod", "bound"),
        ("Pod", "early"),
        ("Pod", "late"),
        ("Pod", "hami"),
    ]
    assert [states[i] for i in sorted(states)] == ["bound", "pending", "pending", "pending"]
    assert all("managedFields" not in o["metadata"] for o in out)
    ms = load_objects(out, "API server https://x")
    for i, st in states.items():
        ms[i].extra["live"] = st
    assert str(ms[2].source) == "API server https://x (document 3)"
    sim_out = [dict(o) for o in out]
    sim_out[2] = {**out[2], "spec": {**out[2]["spec"], "nodeName": "extra"}}
    lines = pending_outcome(ms, sim_out, ["extra"])
    assert (
        lines[0]
        == "3 pod(s) pending in the cluster; with extra added: 1 would be scheduled there, 2 would stay pending"
    )
    assert lines[1:] == [
        "  ml/early: scheduled on extra (added)",
        "  ml/late: stays pending",
        "  ml/hami: stays pending",
    ]


def test_exposition_matches_prometheus_client_byte_for_byte(
    tmp_path: Path, simulated: tuple[list[dict], list[dict], list[dict]]
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from tessera.monitor.exposition import Exposition

    slices, claims, pods = simulated
    view = allocation_view("gpu-1", slices, claims, pods, fetched_at=1700000000.0)
    for c in claims:
        uuid = next(x.uuid for x in view.shares if x.claim_uid == c["metadata"]["uid"])
        _claim_dir(tmp_path, c["metadata"]["uid"], [(uuid, GiB, 10)])
    d = _claim_dir(tmp_path, "odd", [(U0, GiB, 10)])
    (d / "claim.json").write_text(
        json.dumps({"name": 'we"ird\\name\nx', "pods": [{"name": "p", "containers": ["a"]}]})
    )

    class Api:
        def snapshot(self) -> tuple[AllocationView | None, bool, float]:
            return view, True, view.fetched_at

    col = TesseraCollector("gpu-1", RegionDir(str(tmp_path)), None, Api())
    reg = CollectorRegistry(auto_describe=False)
    reg.register(col)
    expo = Exposition()

    def lines(b: bytes) -> list[str]:
        return [
            x
            for x in b.decode().splitlines()
            if not x.startswith("tessera_monitor_collect_duration_seconds")
        ]

    ours = expo.render(col.collect())
    theirs = generate_latest(reg)
    assert lines(ours) == lines(theirs)
    assert lines(expo.render(col.collect())) == lines(ours)  # from the label cache: the same text
    assert 'dra_claim_name="we\\"ird\\\\name\\nx"' in ours.decode()


def test_in_cluster_client_reads_the_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tessera.kube.client import KubeClient, KubeconfigError

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeconfigError, match="not running in a pod"):
        KubeClient.in_cluster(sa_dir=tmp_path)
    from tessera.localcluster.pki import make_pki

    pki = make_pki(tmp_path / "pki")
    (tmp_path / "ca.crt").write_bytes(pki.ca.cert.read_bytes())
    (tmp_path / "token").write_text("abc\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    c = KubeClient.in_cluster(sa_dir=tmp_path)
    assert c.server == "https://10.96.0.1:443"
    assert c._bearer_token() == "abc"
    (tmp_path / "token").write_text("rotated")
    assert c._bearer_token() == "rotated"  # re-read: projected tokens rotate


def test_driver_and_monitor_defaults_meet() -> None:
    """Without flags, the monitor reads the claim directories the driver writes."""
    ctx = click.Context(main)
    driver_cmd, monitor_cmd = main.get_command(ctx, "driver"), main.get_command(ctx, "monitor")
    assert driver_cmd is not None and monitor_cmd is not None
    state = next(p.default for p in driver_cmd.params if p.name == "state_dir")
    region = next(p.default for p in monitor_cmd.params if p.name == "region_dir")
    assert claims_dir(str(state)) == Path(str(region)) == Path(DEFAULT_CLAIMS_DIR)
