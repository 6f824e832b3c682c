"""`tessera explain/simulate --kubeconfig` and `tessera monitor`'s allocation figures against a
real control plane whose scheduler bound some pods and left others pending.

One control plane for the module (nodes ``a5000-node``: 2x RTX A5000, ``h100-node``: 1x H100
80GB, from corpus inventories). In namespace ``team-a``: two pods on 12Gi/50-core template
claims (the second kept off the H100) and one on a standalone 4Gi/10 claim (bound by the scheduler), a pod asking 100Gi
(pending: no GPU is that large) and one asking for an A10 by product name (pending: there is
none). The live answers must equal the answers for the same objects dumped with kubectl.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from tessera.api.quantity import Quantity
from tessera.cli import main
from tessera.enforcement.layout import REGION_FILE
from tessera.enforcement.region import create_region
from tessera.kube.client import ApiError, KubeClient, Obj
from tessera.kube.workloads import (
    apply_objects,
    gpu_claim_template,
    gpu_pod,
    load_objects,
    pod_claim_names,
    wait_for,
    wait_pod_scheduled,
    wait_pod_unschedulable,
)
from tessera.localcluster import build
from tessera.localcluster.cluster import Cluster, ClusterError

from .conftest import (
    A10_INVENTORY,
    A5000_INVENTORY,
    H100_SINGLE_INVENTORY,
    corpus_node,
    inventory_of,
)
from .driverkit import MonitorProcess
from .identity import identity_kubeconfig

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
NS = "team-a"
RESOURCE = "resource.k8s.io/v1"
BOUND = ("bound-1", "bound-2", "bound-shared")
PENDING = ("too-big", "needs-a10")


@dataclass
class Live:
    cluster: Cluster
    client: KubeClient
    kubeconfig: Path
    reader: Path  # a ServiceAccount bound to deploy/rbac/tessera-reader.yaml
    nobody: Path  # a ServiceAccount without it
    tmp: Path

    def dump(self, name: str) -> Path:
        """The same objects the live reading lists, as `kubectl get -o yaml` writes them."""
        kubectl = build.binary("kubectl")
        out = subprocess.run(
            [
                str(kubectl),
                "--kubeconfig",
                str(self.kubeconfig),
                "get",
                "nodes,deviceclasses,resourceslices,devicetaintrules,resourceclaimtemplates,resourceclaims,pods",
                "-A",
                "-o",
                "yaml",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        p = self.tmp / name
        p.write_text(out)
        return p


def _sa_kubeconfig(client: KubeClient, admin: Path, name: str, path: Path) -> Path:
    return identity_kubeconfig(client, admin, NS, name, path, seconds=3600)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    try:
        build.ensure_built()
    except build.BuildError as e:
        pytest.fail(f"cannot build the control plane: {e}")
    tmp = tmp_path_factory.mktemp("live")
    cluster = Cluster(tmp / "state")
    nodes = [
        corpus_node("a5000-node", A5000_INVENTORY),
        corpus_node("h100-node", H100_SINGLE_INVENTORY),
    ]
    try:
        try:
            cluster.up(inventory_of(nodes), build_binaries=False, die_with_parent=True)
        except ClusterError as e:
            pytest.fail(f"tessera cluster up failed: {e}")
        client = cluster.client()
        client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})

        def has_sa() -> bool | None:
            try:
                client.get("v1", "ServiceAccount", "default", NS)
                return True
            except ApiError as e:
                if e.status == 404:
                    return None
                raise

        wait_for(has_sa, timeout=60, what=f"ServiceAccount {NS}/default")
        apply_objects(client, load_objects(REPO / "deploy" / "rbac" / "tessera-reader.yaml"))
        reader = _sa_kubeconfig(client, cluster.kubeconfig, "reader", tmp / "reader.kubeconfig")
        nobody = _sa_kubeconfig(client, cluster.kubeconfig, "nobody", tmp / "nobody.kubeconfig")
        client.create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "tessera-reader"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "tessera-reader",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": NS}],
            }
        )
        a10 = gpu_claim_template("a10", namespace=NS, memory="8Gi", cores=20)
        a10["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
            {
                "cel": {
                    "expression": 'device.attributes["gpu.tessera.dev"].productName == "NVIDIA A10"'
                }
            }
        ]
        shared = {
            "apiVersion": RESOURCE,
            "kind": "ResourceClaim",
            "metadata": {"name": "shared", "namespace": NS},
            "spec": gpu_claim_template("x", memory="4Gi", cores=10)["spec"]["spec"],
        }
        apply_objects(
            client,
            [
                gpu_claim_template("half", namespace=NS, memory="12Gi", cores=50),
                gpu_claim_template("huge", namespace=NS, memory="100Gi", cores=10),
                a10,
                shared,
            ],
        )
        # bound-2 is kept off the H100: the scheduler breaks ties between nodes at random, and
        # with both 50-core shares there the H100 would have no cores left for the test's
        # 40Gi/30-core pod (which fits only there).
        for name, where in (
            ("bound-1", None),
            ("bound-2", {"kubernetes.io/hostname": "a5000-node"}),
        ):
            client.create(gpu_pod(name, namespace=NS, template="half", node_selector=where))
            wait_pod_scheduled(client, name, NS)
        client.create(gpu_pod("bound-shared", namespace=NS, claim="shared"))
        wait_pod_scheduled(client, "bound-shared", NS)
        client.create(gpu_pod("too-big", namespace=NS, template="huge"))
        wait_pod_unschedulable(client, "too-big", NS)
        client.create(gpu_pod("needs-a10", namespace=NS, template="a10"))
        wait_pod_unschedulable(client, "needs-a10", NS)
        yield Live(cluster, client, cluster.kubeconfig, reader, nobody, tmp)
    finally:
        cluster.down()


def _run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args))
    return r.exit_code, r.output


def _ok(*args: str) -> str:
    code, out = _run(*args)
    assert code == 0, out
    return out


def _live_pod(live: Live, name: str) -> Obj:
    return live.client.get("v1", "Pod", name, NS)


# ---- explain -------------------------------------------------------------------------------------


def test_explain_pending_pods_live_equals_files(live: Live) -> None:
    dump = live.dump("explain.yaml")
    for name in PENDING:
        from_cluster = json.loads(
            _ok("explain", f"{NS}/{name}", "--kubeconfig", str(live.kubeconfig), "-o", "json")
        )
        from_files = json.loads(_ok("explain", f"{NS}/{name}", str(dump), "-o", "json"))
        assert from_cluster == from_files
        assert from_cluster["status"] == "pending"
        assert [n["node"] for n in from_cluster["nodes"]] == ["a5000-node", "h100-node"]
    too_big = json.loads(
        _ok("explain", f"{NS}/too-big", "--kubeconfig", str(live.kubeconfig), "-o", "json")
    )
    assert "memory" in json.dumps(too_big["nodes"]) and "100Gi" in json.dumps(too_big)
    text = _ok("explain", f"{NS}/needs-a10", "--kubeconfig", str(live.kubeconfig))
    # The claim the controller made is explained (not its template): per node, the selector.
    claim = pod_claim_names(_live_pod(live, "needs-a10"))["gpu"]
    assert f"claim {NS}/{claim}, request gpu" in text and "not found" not in text
    assert 'productName == "NVIDIA A10"` (productName = "NVIDIA RTX A5000")' in text
    assert 'productName == "NVIDIA A10"` (productName = "NVIDIA H100 80GB HBM3")' in text


def test_explain_bound_pod_keeps_the_schedulers_node(live: Live) -> None:
    for name in BOUND:
        pod = _live_pod(live, name)
        exp = json.loads(
            _ok("explain", f"{NS}/{name}", "--kubeconfig", str(live.kubeconfig), "-o", "json")
        )
        assert exp["status"] == "scheduled"
        assert exp["node"] == pod["spec"]["nodeName"]


# ---- simulate --------------------------------------------------------------------------------------


def _claims_by_name(objs: list[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {
        ((o["metadata"].get("namespace") or "default"), o["metadata"]["name"]): o
        for o in objs
        if o["kind"] == "ResourceClaim"
    }


NEW = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: forty, namespace: team-b}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.tessera.dev, capacity: {requests: {memory: 40Gi, cores: "30"}}}}]}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: ten, namespace: team-b}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.tessera.dev, capacity: {requests: {memory: 10Gi, cores: "40"}}}}]}}}
---
apiVersion: v1
kind: Pod
metadata: {name: new-forty, namespace: team-b}
spec:
  resourceClaims: [{name: gpu, resourceClaimTemplateName: forty}]
  containers: [{name: main, image: x, resources: {claims: [{name: gpu}]}}]
---
apiVersion: v1
kind: Pod
metadata: {name: new-ten, namespace: team-b}
spec:
  resourceClaims: [{name: gpu, resourceClaimTemplateName: ten}]
  containers: [{name: main, image: x, resources: {claims: [{name: gpu}]}}]
"""  # noqa: E501


def test_simulate_new_workloads_on_top_of_the_live_allocations(live: Live) -> None:
    new = live.tmp / "new.yaml"
    new.write_text(NEW)
    dump = live.dump("simulate.yaml")
    from_cluster = json.loads(
        _ok("simulate", str(new), "--kubeconfig", str(live.kubeconfig), "-o", "json")
    )["items"]
    from_files = json.loads(_ok("simulate", str(dump), str(new), "-o", "json"))["items"]

    def key(o: Mapping[str, Any]) -> tuple[str, str, str]:
        return (o["kind"], o["metadata"].get("namespace") or "", o["metadata"]["name"])

    assert {key(o): o for o in from_cluster} == {key(o): o for o in from_files}
    # Every claim the cluster allocated keeps exactly its allocation.
    sim_claims = _claims_by_name(from_cluster)
    api_claims = live.client.list(RESOURCE, "ResourceClaim")
    allocated = [c for c in api_claims if (c.get("status") or {}).get("allocation")]
    assert len(allocated) == 3
    for c in allocated:
        k = (c["metadata"]["namespace"], c["metadata"]["name"])
        assert sim_claims[k]["status"]["allocation"] == c["status"]["allocation"]
    # The new pods fit where there is room now: 40Gi only on the H100; 10Gi/40 cores anywhere
    # with 40 cores left; no device gets more than it has.
    pods = {o["metadata"]["name"]: o for o in from_cluster if o["kind"] == "Pod"}
    assert pods["new-forty"]["spec"]["nodeName"] == "h100-node"
    assert "nodeName" in pods["new-ten"]["spec"]
    for name in PENDING:
        assert "nodeName" not in pods[name]["spec"]
    for name in BOUND:
        assert pods[name]["spec"]["nodeName"] == _live_pod(live, name)["spec"]["nodeName"]
    used: dict[tuple[str, str], dict[str, Fraction]] = {}
    for c in sim_claims.values():
        for r in (
            ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        ):
            for k, v in (r.get("consumedCapacity") or {}).items():
                d = used.setdefault((r["pool"], r["device"]), {})
                d[k] = d.get(k, Fraction(0)) + Quantity.parse(v).value
    for s in live.client.list(RESOURCE, "ResourceSlice"):
        for d in s["spec"]["devices"]:
            for k, cap in (d.get("capacity") or {}).items():
                assert (
                    used.get((s["spec"]["pool"]["name"], d["name"]), {}).get(k, Fraction(0))
                    <= Quantity.parse(cap["value"]).value
                )

    # The real scheduler agrees: the 40Gi pod lands on the H100, the 10Gi one somewhere.
    client = live.client
    client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-b"}})
    wait_for(lambda: _sa_exists(client, "team-b"), timeout=60, what="ServiceAccount team-b/default")
    objs = list(yaml.safe_load_all(NEW))
    for o in objs:
        if o["kind"] == "Pod":
            o["spec"]["automountServiceAccountToken"] = False
    apply_objects(client, [o for o in objs if o["kind"] != "Pod"])
    for o in objs:
        if o["kind"] == "Pod":
            client.create(o)
    assert wait_pod_scheduled(client, "new-forty", "team-b")["spec"]["nodeName"] == "h100-node"
    wait_pod_scheduled(client, "new-ten", "team-b")
    for name in ("new-forty", "new-ten"):
        client.request(
            "DELETE", f"/api/v1/namespaces/team-b/pods/{name}", body={"gracePeriodSeconds": 0}
        )


def _sa_exists(client: KubeClient, ns: str) -> bool | None:
    try:
        client.get("v1", "ServiceAccount", "default", ns)
        return True
    except ApiError as e:
        if e.status == 404:
            return None
        raise


def test_add_node_answers_whether_one_more_node_lets_the_pending_pods_in(live: Live) -> None:
    out = _ok(
        "simulate", "--kubeconfig", str(live.kubeconfig), "--add-node", f"spare-a10={A10_INVENTORY}"
    )
    assert (
        "2 pod(s) pending in the cluster; with spare-a10 added: 1 would be scheduled there, 1 would stay pending"
        in out
    )
    assert f"{NS}/needs-a10: scheduled on spare-a10 (added)" in out
    assert f"{NS}/too-big: stays pending" in out
    # Without the spare node nothing changes for them.
    out = _ok("simulate", "--kubeconfig", str(live.kubeconfig))
    assert "2 pod(s) pending in the cluster, 2 would stay pending" in out


# ---- RBAC and bad input ----------------------------------------------------------------------------


def _one_line_exit_2(*args: str) -> str:
    code, out = _run(*args)
    assert code == 2, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tessera: error: "), out
    return lines[0]


def test_read_only_role_is_enough_and_its_absence_is_one_line(live: Live) -> None:
    admin = json.loads(_ok("simulate", "--kubeconfig", str(live.kubeconfig), "-o", "json"))
    reader = json.loads(_ok("simulate", "--kubeconfig", str(live.reader), "-o", "json"))
    assert reader == admin
    line = _one_line_exit_2("explain", f"{NS}/too-big", "--kubeconfig", str(live.nobody))
    assert "refused GET Node list (403 Forbidden" in line
    assert 'User "system:serviceaccount:team-a:nobody" cannot list resource "nodes"' in line
    assert "deploy/rbac/tessera-reader.yaml" in line


def test_unreachable_api_server_is_one_line(live: Live) -> None:
    cfg = yaml.safe_load(live.kubeconfig.read_text())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    kc = live.tmp / "unreachable.kubeconfig"
    kc.write_text(yaml.safe_dump(cfg))
    for args in (("simulate",), ("explain", f"{NS}/too-big")):
        line = _one_line_exit_2(*args, "--kubeconfig", str(kc))
        assert f"cannot reach the API server https://127.0.0.1:{port}" in line


# ---- tessera monitor's allocation figures -------------------------------------------------------


def test_monitor_reports_allocations_per_gpu_and_share(live: Live) -> None:
    client = live.client
    pod = _live_pod(live, "bound-1")
    node = pod["spec"]["nodeName"]
    claim = client.get(RESOURCE, "ResourceClaim", pod_claim_names(pod)["gpu"], NS)
    result = claim["status"]["allocation"]["devices"]["results"][0]
    slices = client.list(RESOURCE, "ResourceSlice")
    devices = {
        (s["spec"]["pool"]["name"], d["name"]): d for s in slices for d in s["spec"]["devices"]
    }
    uuid = devices[(result["pool"], result["device"])]["attributes"]["uuid"]["string"]
    regions = live.tmp / "claims"
    (regions / claim["metadata"]["uid"]).mkdir(parents=True)
    create_region(str(regions / claim["metadata"]["uid"] / REGION_FILE), [(uuid, 12 << 30, 50)])
    mon = MonitorProcess(
        "--node-name",
        node,
        "--kubeconfig",
        str(live.reader),
        "--no-nvml",
        "--region-dir",
        str(regions),
        "--api-interval",
        "1",
    )
    try:
        text = mon.scrape()
    finally:
        assert mon.stop() == 0
    fams = {f.name: f for f in text_string_to_metric_families(text)}

    def series(name: str) -> list[tuple[dict[str, str], float]]:
        return [(s.labels, s.value) for s in fams[name].samples] if name in fams else []

    # Per GPU: allocated = the sum of consumedCapacity of every claim on it, from the API.
    want: dict[str, Fraction] = {}
    for c in client.list(RESOURCE, "ResourceClaim"):
        for r in (
            ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        ):
            if r["pool"] == node:
                want[r["device"]] = (
                    want.get(r["device"], Fraction(0))
                    + Quantity.parse(r["consumedCapacity"]["memory"]).value
                )
    got = {lab["dra_device_name"]: v for lab, v in series("tessera_gpu_memory_allocated_bytes")}
    assert got == {d: float(want.get(d, 0)) for (pool, d) in devices if pool == node}
    caps = {lab["dra_device_name"]: v for lab, v in series("tessera_gpu_memory_capacity_bytes")}
    assert caps == {
        d: float(Quantity.parse(dev["capacity"]["memory"]["value"]).value)
        for (pool, d), dev in devices.items()
        if pool == node
    }
    # Per share: the claim, its pod and container, by the API (the region has no claim.json).
    share = [
        (lab, v)
        for lab, v in series("tessera_share_memory_allocated_bytes")
        if lab["pod"] == "bound-1"
    ]
    assert len(share) == 1
    lab, v = share[0]
    assert v == 12 * 2**30
    assert (
        lab["dra_claim_namespace"],
        lab["dra_claim_name"],
        lab["container"],
        lab["dra_pool_name"],
        lab["UUID"],
    ) == (NS, claim["metadata"]["name"], "main", node, uuid)
    # The region's series carry the very same labels.
    limit = [lab2 for lab2, _ in series("tessera_share_memory_limit_bytes")]
    assert limit == [lab]
    assert series("tessera_monitor_api_up") == [({"node": node}, 1.0)]
    hami = [
        (lab2, v2)
        for lab2, v2 in series("hami_vgpu_core_allocated_ratio")
        if lab2["pod"] == "bound-1"
    ]
    assert hami == [
        (
            {
                "namespace": NS,
                "node": node,
                "pod": "bound-1",
                "container_index": "0",
                "device_uuid": uuid,
                "zone": "vGPU",
            },
            50.0,
        )
    ]


def test_monitor_without_permission_exits_2_with_one_line(live: Live) -> None:
    regions = live.tmp / "empty-claims"
    regions.mkdir()
    mon = MonitorProcess(
        "--node-name",
        "h100-node",
        "--kubeconfig",
        str(live.nobody),
        "--no-nvml",
        "--region-dir",
        str(regions),
        must_start=False,
    )
    log = mon.log
    assert mon.url is None and mon.proc.returncode == 2, log
    assert len(log) == 1 and log[0].startswith("tessera: error: the API server"), log
    assert "403 Forbidden" in log[0] and "tessera-reader" in log[0]


def test_token_kubeconfig_reaches_the_api(live: Live) -> None:
    c = KubeClient.from_kubeconfig(live.reader)
    assert {n["metadata"]["name"] for n in c.list("v1", "Node")} == {"a5000-node", "h100-node"}
    pages = list(c.list_pages("v1", "Pod", limit=2))
    assert len(pages) >= 3 and sum(len(x) for x in pages) == len(c.list("v1", "Pod"))
