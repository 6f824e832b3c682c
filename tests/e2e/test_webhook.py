"""The admission webhook and the scheduler extender with the real control plane.

One control plane for the module: kube-scheduler started with ``deploy/webhook/scheduler-config.yaml``
(the extender's URL pointed at a ``tessera extender`` process), a ``tessera webhook`` process
called by kube-apiserver through ``deploy/webhook/mutatingwebhookconfiguration.yaml`` (a CA made
here in the bundle), and two nodes built from corpus inventories: ``h100-node`` (8x H100 with its
NVLink/NUMA topology) and ``a5000-node`` (2x RTX A5000). Pods are applied with the real kubectl,
mutated by the webhook, scheduled by the real kube-scheduler; their claims are compared with what
``tessera simulate`` predicts for the unconverted originals.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import ctypes
import http.client
import json
import random
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.api.loader import Manifest, Source, expand_workloads
from tessera.api.quantity import Quantity
from tessera.kube.client import ApiError, KubeClient, Obj
from tessera.kube.watch import Informer
from tessera.kube.workloads import wait_for
from tessera.localcluster import build
from tessera.localcluster.cluster import Cluster, ClusterError
from tessera.localcluster.pki import CertPair, make_serving_certificate
from tessera.sim.cluster import SimNode
from tessera.sim.simulate import SimResult, Simulation
from tessera.webhook.admission import ClusterView
from tessera.webhook.server import Webhook
from tessera.webhook.templates import STAMP_ANNOTATION, TemplateStore

from .conftest import (
    A5000_INVENTORY,
    CORPUS,
    H100_INVENTORY,
    H100_TOPOLOGY,
    corpus_node,
    inventory_of,
    sim_cluster,
)
from .test_simulate import comparable, live_allocations, sim_allocations, wait_verdict

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "webhook"
HAMI = CORPUS / "hami-pods"
RESOURCE = "resource.k8s.io/v1"
GRACE = (
    10  # seconds an unused template is kept after its last admission (production: 600); the webhook
)
# restamps a busy template every GRACE / 4 s, so shorter means more API writes while 1,000 pods arrive
H100, A5000 = "h100-node", "a5000-node"
PIN_H100 = {"kubernetes.io/hostname": H100}


def simulate(nodes: list[SimNode], objects: list[Obj]) -> SimResult:
    """``tessera simulate`` over ``nodes`` with ``objects`` (workloads expanded into their pods)."""
    manifests = list(
        expand_workloads(
            Manifest(copy.deepcopy(o), Source("e2e-workload", i + 1)) for i, o in enumerate(objects)
        )
    )
    return Simulation(sim_cluster(nodes), manifests, seed=1).run()


def _pdeathsig() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Hooked:
    cluster: Cluster
    client: KubeClient
    kubeconfig: Path
    nodes: list[SimNode]
    webhook_port: int
    ca: CertPair
    serving: CertPair
    tmp: Path
    logs: Path

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        kubectl = str(build.bin_dir() / "kubectl")
        return subprocess.run(
            [kubectl, f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def namespace(self, labels: dict[str, str] | None = None) -> str:
        name = f"w-{uuid.uuid4().hex[:8]}"
        self.client.create(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": name, "labels": labels or {}},
            }
        )

        def has_sa() -> bool | None:
            try:
                self.client.get("v1", "ServiceAccount", "default", name)
                return True
            except ApiError as e:
                if e.status == 404:
                    return None
                raise

        wait_for(has_sa, timeout=60, what=f"ServiceAccount {name}/default")
        return name

    @contextlib.contextmanager
    def scratch(self, labels: dict[str, str] | None = None) -> Iterator[str]:
        """A fresh namespace whose workloads and pods are deleted afterwards (their claims with them),
        so that the next test starts from idle GPUs."""
        ns = self.namespace(labels)
        try:
            yield ns
        finally:
            for api, kind in (("apps/v1", "Deployment"), ("batch/v1", "Job")):
                for o in self.client.list(api, kind, ns):
                    path = self.client.collection_path(api, kind, ns) + f"/{o['metadata']['name']}"
                    self.client.request(
                        "DELETE", path, body={"propagationPolicy": "Background"}, what=kind
                    )
            self.clear(ns)
            wait_for(
                lambda: True if not self.client.list(RESOURCE, "ResourceClaim", ns) else None,
                timeout=120,
                what=f"the claims of {ns} to be deleted",
            )

    def clear(self, namespace: str, label_selector: str | None = None) -> None:
        """Delete the pods of ``namespace`` (those matching ``label_selector``) in one collection
        call, at once (no kubelet to wait for), and wait until they are gone."""
        query = {"labelSelector": label_selector} if label_selector else None
        path = f"/api/v1/namespaces/{namespace}/pods"
        self.client.request(
            "DELETE",
            path,
            body={"gracePeriodSeconds": 0},
            query=query,
            what=f"pods of {namespace}",
            timeout=300,
        )  # the API server deletes them one by one

        def gone() -> bool | None:
            left = self.client.request(
                "GET", path, query={**(query or {}), "limit": "1"}, what=f"pods of {namespace}"
            )
            return True if not left.get("items") else None

        wait_for(gone, timeout=120, what=f"pods of {namespace} to be deleted")


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "tessera", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            preexec_fn=_pdeathsig,
        )


@pytest.fixture(scope="module")
def hooked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hooked]:
    try:
        build.ensure_built()
    except build.BuildError as e:
        pytest.fail(f"cannot build the control plane: {e}")
    tmp = tmp_path_factory.mktemp("webhook")
    nodes = [corpus_node(H100, H100_INVENTORY, H100_TOPOLOGY), corpus_node(A5000, A5000_INVENTORY)]
    ext_port = _free_port()
    sched = yaml.safe_load((DEPLOY / "scheduler-config.yaml").read_text())
    sched["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{ext_port}"
    cluster = Cluster(tmp / "cluster")
    procs: list[subprocess.Popen[bytes]] = []
    logs = tmp / "logs"
    logs.mkdir()
    try:
        try:
            # --delete-collection-workers: one collection DELETE removes the 1,000 pods in parallel
            cluster.up(
                inventory_of(nodes),
                build_binaries=False,
                die_with_parent=True,
                scheduler_config=sched,
                extra_args={"kube-apiserver": ["--delete-collection-workers=8"]},
            )
        except ClusterError as e:
            pytest.fail(f"tessera cluster up failed: {e}")
        kc = cluster.kubeconfig
        ca, serving = make_serving_certificate(tmp, "webhook")
        port_file = tmp / "webhook.port"
        procs.append(
            _spawn(
                [
                    "webhook",
                    f"--tls-cert-file={serving.cert}",
                    f"--tls-private-key-file={serving.key}",
                    "--port=0",
                    f"--port-file={port_file}",
                    f"--kubeconfig={kc}",
                    f"--template-grace={GRACE}",
                    "--collect-interval=1",
                    "-v",
                ],
                logs / "webhook.log",
            )
        )
        procs.append(
            _spawn(
                ["extender", f"--port={ext_port}", f"--kubeconfig={kc}", "-v"],
                logs / "extender.log",
            )
        )
        wait_for(
            lambda: True if port_file.is_file() else None,
            timeout=60,
            what="the webhook to listen",
            last=lambda: (logs / "webhook.log").read_text(),
        )
        port = int(port_file.read_text())
        cfg = yaml.safe_load((DEPLOY / "mutatingwebhookconfiguration.yaml").read_text())
        for w in cfg["webhooks"]:
            w["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}/mutate-pods",
                "caBundle": base64.b64encode(ca.cert.read_bytes()).decode(),
            }
        client = cluster.client()
        client.create(cfg)
        h = Hooked(cluster, client, kc, nodes, port, ca, serving, tmp, logs)
        _wait_webhook_active(h)
        yield h
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        cluster.down()


def _wait_webhook_active(h: Hooked) -> None:
    """The API server reads webhook configurations through an informer: wait until pods are mutated."""
    ns = "default"
    probe = _pod(
        "probe", {"nvidia.com/gpumem": 1000}, node_selector={"kubernetes.io/hostname": "nowhere"}
    )

    def mutated() -> bool | None:
        r = h.kubectl(
            "create", "--dry-run=server", "-o", "json", "-n", ns, "-f", "-", stdin=json.dumps(probe)
        )
        return (
            True if r.returncode == 0 and "resourceClaims" in json.loads(r.stdout)["spec"] else None
        )

    wait_for(mutated, timeout=60, what="the API server to call the webhook")


def _pod(
    name: str,
    limits: dict[str, Any],
    *,
    annotations: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    init: dict[str, Any] | None = None,
) -> Obj:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": limits}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    if init is not None:
        spec["initContainers"] = [
            {"name": "init", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": init}}
        ]
    if node_selector:
        spec["nodeSelector"] = node_selector
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _corpus_pod(file: str, name: str, doc: int = 0, *, pin: bool = True) -> Obj:
    obj = [d for d in yaml.safe_load_all((HAMI / file).read_text()) if d][doc]
    obj["metadata"]["name"] = name
    if pin:
        obj["spec"]["nodeSelector"] = dict(PIN_H100)
    return obj


def _apply(h: Hooked, ns: str, obj: Obj) -> subprocess.CompletedProcess[str]:
    r = h.kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(obj))
    assert r.returncode == 0, r.stderr
    return r


def _compare(h: Hooked, ns: str, objects: list[Obj], nodes: list[SimNode] | None = None) -> None:
    predicted = sim_allocations(simulate(nodes or h.nodes, objects))
    got = live_allocations(h.client, ns)
    assert set(got) == set(predicted)
    for pod, refs in got.items():
        assert {k: comparable(v) for k, v in refs.items()} == {
            k: comparable(v) for k, v in predicted[pod].items()
        }, pod


# ---- HAMi pods through the webhook ---------------------------------------------------------------
CORPUS_PODS = [
    ("HAMi__examples_nvidia__default_use.yaml", 0, "share"),
    ("HAMi__examples_nvidia__use_memory_fraction.yaml", 0, "fraction"),
    ("HAMi__examples_nvidia__use_exclusive_card.yaml", 0, "exclusive"),
    ("HAMi__examples_nvidia__use_sharing_card.yaml", 0, "sharing-1"),
    ("HAMi__examples_nvidia__use_sharing_card.yaml", 1, "sharing-2"),
    ("HAMi__examples_nvidia__specify_card_type_not_use.yaml", 0, "not-type"),
    ("HAMi__examples_nvidia__specify_uuid_to_use.yaml", 0, "by-uuid"),
]


def test_corpus_hami_pods_are_mutated_and_scheduled_as_simulated(hooked: Hooked) -> None:
    """Corpus HAMi pods applied with kubectl: the webhook converts them (same code as
    ``tessera simulate``), kube-scheduler allocates what the simulation predicts for the
    unconverted originals, pending pods included (the UUIDs of the HAMi example exist nowhere:
    admitted with a warning, as HAMi admits them, and pending)."""
    h = hooked
    with h.scratch() as ns:
        objects = [_corpus_pod(f, name, doc) for f, doc, name in CORPUS_PODS]
        warnings = {}
        verdicts = {}
        for obj in objects:
            r = _apply(h, ns, obj)
            warnings[obj["metadata"]["name"]] = r.stderr
            verdicts[obj["metadata"]["name"]] = wait_verdict(h.client, obj["metadata"]["name"], ns)
        _compare(h, ns, objects)
        live = {p["metadata"]["name"]: p for p in h.client.list("v1", "Pod", ns)}
        for name, pod in live.items():
            for c in pod["spec"]["containers"]:
                assert not any(
                    k.startswith(("nvidia.com/", "volcano.sh/"))
                    for k in (c.get("resources") or {}).get("limits") or {}
                ), name
            for rc in pod["spec"].get("resourceClaims") or []:
                assert rc["resourceClaimTemplateName"].startswith("tessera-gpu-")
        assert verdicts["share"][0] == H100 and verdicts["fraction"][0] == H100
        assert verdicts["by-uuid"][0] is None
        assert (
            "Warning: pod" in warnings["by-uuid"]
            and "nvidia.com/use-gpuuuid" in warnings["by-uuid"]
        )
        assert "matches none of the 10 devices" in warnings["by-uuid"]
        # sharing-1 and sharing-2 (both 1 GPU) share one template only if their shapes are equal
        templates = {
            t["metadata"]["name"] for t in h.client.list(RESOURCE, "ResourceClaimTemplate", ns)
        }
        used = {
            rc["resourceClaimTemplateName"]
            for p in live.values()
            for rc in p["spec"].get("resourceClaims") or []
        }
        assert used == templates


def test_deployment_job_and_init_containers(hooked: Hooked) -> None:
    """Pods made by the ReplicaSet and Job controllers (generateName, no name at admission) and a
    pod whose init container asks for a GPU share get the claims ``tessera simulate`` predicts
    for the workloads; the replicas of one Deployment share one template."""
    h = hooked
    with h.scratch() as ns:
        deploy = next(
            d
            for d in yaml.safe_load_all((HAMI / "HAMi__examples_nvidia__example.yaml").read_text())
            if d
        )
        deploy["spec"]["replicas"] = 3
        deploy["spec"]["template"]["spec"]["nodeSelector"] = dict(PIN_H100)
        job = next(
            d
            for d in yaml.safe_load_all(
                (HAMI / "HAMi__benchmarks_deployments__job-on-hami.yml").read_text()
            )
            if d
        )
        job["spec"]["template"]["spec"]["nodeSelector"] = dict(PIN_H100)
        init_pod = _pod(
            "with-init",
            {"nvidia.com/gpumem": 2000, "nvidia.com/gpucores": 20},
            init={"nvidia.com/gpumem": 1000},
            node_selector=PIN_H100,
        )
        _apply(h, ns, deploy)
        wait_for(
            lambda: (
                True
                if len([p for p in h.client.list("v1", "Pod", ns) if p["spec"].get("nodeName")])
                == 3
                else None
            ),
            timeout=90,
            what="3 replicas scheduled",
        )
        _apply(h, ns, job)
        wait_for(
            lambda: (
                True
                if len([p for p in h.client.list("v1", "Pod", ns) if p["spec"].get("nodeName")])
                == 4
                else None
            ),
            timeout=90,
            what="the Job's pod scheduled",
        )
        _apply(h, ns, init_pod)
        assert wait_verdict(h.client, "with-init", ns)[0] == H100
        live = h.client.list("v1", "Pod", ns)
        owners = {
            p["metadata"]["name"]: (
                (p["metadata"].get("ownerReferences") or [{}])[0].get("kind") or "Pod"
            )
            for p in live
        }
        got = live_allocations(h.client, ns)
        predicted = sim_allocations(simulate(h.nodes, [deploy, job, init_pod]))

        def by_kind(
            allocs: dict[str, dict[str, Any]], kind_of: dict[str, str]
        ) -> dict[str, Counter[str]]:
            out: dict[str, Counter[str]] = {}
            for pod, refs in allocs.items():
                key = json.dumps(
                    {k: comparable(v) for k, v in refs.items()}, sort_keys=True, default=str
                )
                out.setdefault(kind_of[pod], Counter())[key] += 1
            return out

        sim_kinds = {
            p: (
                "ReplicaSet"
                if p.startswith("cuda-sample")
                else "Job"
                if p.startswith("ai-benchmark")
                else "Pod"
            )
            for p in predicted
        }
        assert by_kind(got, owners) == by_kind(predicted, sim_kinds)
        templates = {
            rc["resourceClaimTemplateName"]
            for p in live
            for rc in p["spec"].get("resourceClaims") or []
            if owners[p["metadata"]["name"]] == "ReplicaSet"
        }
        assert len(templates) == 1
        with_init = next(p for p in live if p["metadata"]["name"] == "with-init")
        assert [c["resources"].get("claims") for c in with_init["spec"]["initContainers"]] == [
            [{"name": "init-gpu"}]
        ]


def test_multi_gpu_claims_prefer_the_nvlink_node_as_simulated(hooked: Hooked) -> None:
    """A 2-GPU pod without a node selector: its claim's first subrequest (one NVLink domain)
    fits only on the H100 node, so kube-scheduler's DynamicResources score sends it there,
    whatever the node order; ``tessera simulate`` scores nodes the same way."""
    h = hooked
    with h.scratch() as ns:
        pod = _pod("pair", {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 8000})
        _apply(h, ns, pod)
        assert wait_verdict(h.client, "pair", ns)[0] == H100
        (alloc,) = live_allocations(h.client, ns)["pair"].values()
        assert alloc is not None
        assert {r["request"] for r in alloc["devices"]["results"]} == {"gpu/nvlink"}
        _compare(h, ns, [pod])
        _compare(
            h, ns, [pod], nodes=list(reversed(h.nodes))
        )  # a5000-node first: still the H100 node


def test_node_policies_through_the_extender(hooked: Hooked) -> None:
    """HAMi's ``hami.io/node-scheduler-policy``: binpack pods go to the most-booked node, spread
    pods to the least-booked, as ``tessera simulate`` places them (the extender ranks nodes with
    simulate's node usage; device choice stays first fit). A seed pod pinned to the A5000 node
    makes it the most booked."""
    h = hooked
    wait_for(
        lambda: (
            True
            if not [
                c
                for c in h.client.list(RESOURCE, "ResourceClaim")
                if (c.get("status") or {}).get("allocation")
            ]
            else None
        ),
        timeout=120,
        what="every GPU to be idle",
    )
    with h.scratch() as ns:
        seed = _pod(
            "seed", {"nvidia.com/gpumem": 4000}, node_selector={"kubernetes.io/hostname": A5000}
        )
        binpack = _corpus_pod(
            "HAMi-website__docs_nvidia_scheduling-policy__binpack-node-policy.yaml",
            "binpack-2gpu",
            pin=False,
        )
        spread = _corpus_pod(
            "HAMi__examples_nvidia__specify_scheduling_policy.yaml", "spread-exclusive", pin=False
        )
        spread2 = _pod(
            "spread-share",
            {"nvidia.com/gpumem": 2000},
            annotations={"hami.io/node-scheduler-policy": "spread"},
        )
        binpack2 = _pod(
            "binpack-share",
            {"nvidia.com/gpumem": 2000},
            annotations={"hami.io/node-scheduler-policy": "binpack"},
        )
        objects = [seed, binpack, spread, spread2, binpack2]
        nodes = {}
        for obj in objects:
            _apply(h, ns, obj)
            nodes[obj["metadata"]["name"]] = wait_verdict(h.client, obj["metadata"]["name"], ns)[0]
        result = simulate(h.nodes, objects)
        sim_nodes = {
            o["metadata"]["name"]: o["spec"].get("nodeName")
            for o in result.objects
            if o.get("kind") == "Pod"
        }
        assert nodes == sim_nodes
        # usage = booked memory fraction + cores fraction, summed per node: after the exclusive H100
        # (2.0) the A5000 node (3 x 4000 of 24564 MiB, about 0.49) is the least booked
        assert nodes == {
            "seed": A5000,
            "binpack-2gpu": A5000,
            "spread-exclusive": H100,
            "spread-share": A5000,
            "binpack-share": H100,
        }
        # Pods without a GPU policy: the same devices as simulated (spread-exclusive asks binpack
        # inside the node, which only the simulation does).
        got = live_allocations(h.client, ns)
        predicted = sim_allocations(result)
        for pod in ("seed", "binpack-2gpu", "spread-share", "binpack-share"):
            assert {k: comparable(v) for k, v in got[pod].items()} == {
                k: comparable(v) for k, v in predicted[pod].items()
            }, pod


# ---- no objects leak ------------------------------------------------------------------------------
def _template_watch(h: Hooked, ns: str) -> tuple[Informer, set[str]]:
    seen: set[str] = set()

    def record(etype: str, obj: Obj) -> None:
        if etype in ("ADDED", "MODIFIED"):
            seen.add(obj["metadata"]["name"])

    inf = Informer(
        h.client, RESOURCE, "ResourceClaimTemplate", namespace=ns, on_change=record
    ).start()
    assert inf.wait_synced(30)
    return inf, seen


def test_a_thousand_pods_of_five_shapes_leave_no_template(hooked: Hooked) -> None:
    """1,000 HAMi pods of 5 shapes (gpumem 1000..5000 MiB), created 16 at a time: at most 5
    templates ever exist in the namespace (watched from before the first pod), and none remains
    once the pods are gone (one collection delete) and the collector has run."""
    h = hooked
    ns = h.namespace()
    inf, seen = _template_watch(h, ns)
    label = "tessera-e2e/batch"
    try:

        def create(i: int) -> str:
            pod = _pod(f"p-{i:04d}", {"nvidia.com/gpumem": 1000 * (1 + i % 5)})
            pod["metadata"].update(namespace=ns, labels={label: "thousand"})
            pod["spec"]["schedulingGates"] = [
                {"name": f"{label}-hold"}
            ]  # never scheduled: no scheduler work
            created = h.client.create(pod)
            (rc,) = created["spec"]["resourceClaims"]  # the API server's answer: the mutated pod
            return str(rc["resourceClaimTemplateName"])

        with ThreadPoolExecutor(16) as pool:
            names = list(pool.map(create, range(1000)))
        assert len(set(names)) == 5
        assert all(names[i] == names[i % 5] for i in range(1000))  # one template per shape
        listed = h.client.request(
            "GET", f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": f"{label}=thousand"}
        )
        assert len(listed["items"]) == 1000
        assert {
            rc["resourceClaimTemplateName"]
            for p in listed["items"]
            for rc in p["spec"]["resourceClaims"]
        } == set(names)
        assert len(seen) <= 5
        h.clear(ns, f"{label}=thousand")
        wait_for(
            lambda: True if not h.client.list(RESOURCE, "ResourceClaimTemplate", ns) else None,
            timeout=60,
            what="the collector to delete the unused templates",
        )
        assert seen == set(names)
    finally:
        inf.stop()


def test_dry_run_creates_nothing_and_a_rejected_pod_leaves_nothing(hooked: Hooked) -> None:
    """``kubectl create --dry-run=server`` shows the mutated pod and creates no template. A pod
    that a later admission plugin rejects (ResourceQuota: no pods allowed) leaves a template that
    no pod uses: the collector deletes it after the grace period."""
    h = hooked
    ns = h.namespace()
    inf, seen = _template_watch(h, ns)
    try:
        pod = _pod("dry", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000})
        r = h.kubectl(
            "create", "--dry-run=server", "-o", "json", "-n", ns, "-f", "-", stdin=json.dumps(pod)
        )
        assert r.returncode == 0, r.stderr
        (rc,) = json.loads(r.stdout)["spec"]["resourceClaims"]
        assert rc["resourceClaimTemplateName"].startswith("tessera-gpu-")
        time.sleep(2)
        assert seen == set() and h.client.list(RESOURCE, "ResourceClaimTemplate", ns) == []

        h.client.create(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "no-pods", "namespace": ns},
                "spec": {"hard": {"pods": "0"}},
            }
        )
        wait_for(
            lambda: (
                True
                if (h.client.get("v1", "ResourceQuota", "no-pods", ns).get("status") or {}).get(
                    "hard"
                )
                else None
            ),
            timeout=30,
            what="the quota to be active",
        )
        r = h.kubectl("create", "-n", ns, "-f", "-", stdin=json.dumps(pod))
        assert r.returncode != 0 and "exceeded quota" in r.stderr
        assert seen == {
            rc["resourceClaimTemplateName"]
        }  # created at admission, then the pod was refused
        wait_for(
            lambda: True if not h.client.list(RESOURCE, "ResourceClaimTemplate", ns) else None,
            timeout=GRACE + 30,
            what="the collector to delete the orphaned template",
        )
    finally:
        inf.stop()


class GatedClient(KubeClient):
    """The real client to the test's API server, whose requests wait while ``gate`` is closed and
    are counted by verb."""

    def __init__(self, base: KubeClient) -> None:
        self.__dict__.update(base.__dict__)
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = 0
        self.verbs: Counter[str] = Counter()
        self._count = threading.Lock()

    def request(self, verb: str, path: str, **kw: Any) -> Any:
        with self._count:
            self.verbs[verb] += 1
            self.waiting += 1
        try:
            assert self.gate.wait(30), "the test never opened the gate"
            return super().request(verb, path, **kw)
        finally:
            with self._count:
                self.waiting -= 1


def test_concurrent_admissions_write_a_template_once_and_a_due_stamp_does_not_delay_them(
    hooked: Hooked,
) -> None:
    """Forty admissions of one shape at once: one create, not forty. When the template's stamp
    falls due (older than ``refresh``, younger than ``trusted``) the admissions are answered
    while the API server has not yet answered the one stamp write; once the stamp is older than
    ``trusted`` they wait for it. A template deleted behind the webhook's back is created again
    by the background write. In-process webhook, real API server, a fake clock one hour ahead
    (so the module's collector, on real time, leaves these templates alone)."""
    h = hooked
    ns = h.namespace()
    client = GatedClient(h.client)
    now = [time.time() + 3600.0]
    store = TemplateStore(client, refresh=10, trusted=20, clock=lambda: now[0])
    view = ClusterView.static(h.client.list(RESOURCE, "ResourceSlice"))
    hook = Webhook(view, store)
    pod = _pod("p", {"nvidia.com/gpumem": 3000})
    bodies = [json.dumps(_review(pod, uid=f"u-{i}", namespace=ns)).encode() for i in range(40)]

    def stamp() -> str:
        (t,) = h.client.list(RESOURCE, "ResourceClaimTemplate", ns)
        return str(t["metadata"]["annotations"][STAMP_ANNOTATION])

    def text(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(t)))

    async def admit_all() -> list[tuple[int, Any]]:
        return list(await asyncio.gather(*(hook.admit(b) for b in bodies)))

    async def scenario() -> None:
        answers = await admit_all()
        assert all(s == 200 and a["response"]["allowed"] for s, a in answers)
        assert {a["response"]["patchType"] for _, a in answers} == {"JSONPatch"}
        assert (store.stats.created, store.stats.refreshed) == (1, 0)
        assert client.verbs == {"POST": 1}
        assert stamp() == text(now[0])

        now[0] += 15  # due: answered without waiting for the API server
        client.gate.clear()
        answers = await asyncio.wait_for(admit_all(), 10)
        assert all(a["response"]["allowed"] for _, a in answers)
        for _ in range(500):
            if client.waiting:
                break
            await asyncio.sleep(0.01)
        assert client.waiting == 1  # the one stamp write, still held at the gate
        client.gate.set()
        while hook._writes:
            await asyncio.sleep(0.01)
        assert (store.stats.created, store.stats.refreshed) == (1, 1)
        assert client.verbs == {"POST": 2, "PATCH": 1}  # create refused (409), then stamped
        assert stamp() == text(now[0])

        now[0] += 25  # older than trusted: the answer waits for the write
        client.gate.clear()
        pending = asyncio.ensure_future(admit_all())
        await asyncio.sleep(0.5)
        assert not pending.done() and client.waiting == 1
        client.gate.set()
        answers = await asyncio.wait_for(pending, 10)
        assert all(a["response"]["allowed"] for _, a in answers)
        assert (store.stats.created, store.stats.refreshed) == (1, 2)
        assert stamp() == text(now[0])

        (t,) = h.client.list(RESOURCE, "ResourceClaimTemplate", ns)
        h.client.delete(RESOURCE, "ResourceClaimTemplate", t["metadata"]["name"], ns)
        now[0] += 15  # due again: the background write finds it gone and creates it
        await admit_all()
        while hook._writes:
            await asyncio.sleep(0.01)
        assert (store.stats.created, store.stats.refreshed) == (2, 2)
        assert stamp() == text(now[0])

    asyncio.run(scenario())


def test_a_second_webhook_stamps_a_template_that_carries_a_device_config(hooked: Hooked) -> None:
    """A webhook replica that did not create a template refreshes its stamp (create: 409, then a
    merge patch of the annotation). The API server compares the immutable spec of the patched
    object with the stored one, opaque parameters byte for byte: a template created with JSON
    other than Go's compact form was refused ("field is immutable") and every pod of that shape
    denied while a rollout brought up new replicas. Real API server, two stores."""
    h = hooked
    ns = h.namespace()
    view = ClusterView.static(h.client.list(RESOURCE, "ResourceSlice"))
    pod = _pod("p", {"nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30})  # work-conserving
    for i in range(2):  # two replicas: the first creates, the second finds it there
        store = TemplateStore(h.client, refresh=10, trusted=20)
        hook = Webhook(view, store)
        status, answer = asyncio.run(
            hook.admit(json.dumps(_review(pod, uid=f"u-{i}", namespace=ns)).encode())
        )
        assert status == 200 and answer["response"]["allowed"], answer["response"]
        assert (store.stats.created, store.stats.refreshed) == ((1, 0) if i == 0 else (0, 1))
    (t,) = h.client.list(RESOURCE, "ResourceClaimTemplate", ns)
    [cfg] = t["spec"]["spec"]["devices"]["config"]
    assert cfg["opaque"]["parameters"]["policy"] == "work-conserving"


# ---- bad input at admission -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("limits", "annotations", "denied", "text"),
    [
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 101},
            {},
            True,
            "container c: nvidia.com/gpucores 101 is over 100",
        ),
        (
            {"nvidia.com/gpumem": -3000},
            {},
            True,
            "container c: nvidia.com/gpumem '-3k' is negative",
        ),
        (
            {"nvidia.com/gpumem": "1Gi"},
            {},
            True,
            "container c: nvidia.com/gpumem is in MiB: write 1024, not 1Gi",
        ),
        (
            {"nvidia.com/gpumem": 200000},
            {},
            False,
            "container c: nvidia.com/gpumem: 200000Mi is more than any device has: the largest memory of a matching "
            "device is 81008Mi",
        ),
        (
            {"nvidia.com/gpu": 1},
            {"nvidia.com/use-gpuuuid": "GPU-00000000-0000-0000-0000-000000000000"},
            False,
            "container c: the pod's GPU selection annotations (nvidia.com/use-gpuuuid",
        ),
        (
            {"nvidia.com/gpu": 9},
            {},
            False,
            "nvidia.com/gpu: 9 GPUs on one node, but the most any node publishes is 8",
        ),
    ],
)
def test_bad_input_is_denied_or_admitted_with_a_warning(
    hooked: Hooked, limits: dict[str, Any], annotations: dict[str, str], denied: bool, text: str
) -> None:
    """Values the converter rejects are denied (code 422, the container and field named);
    requests no GPU of the cluster can hold are admitted with a warning, as HAMi admits them."""
    h = hooked
    ns = "default"
    name = f"bad-{uuid.uuid4().hex[:6]}"
    pod = _pod(
        name, limits, annotations=annotations, node_selector={"kubernetes.io/hostname": "nowhere"}
    )
    r = h.kubectl("create", "-n", ns, "-f", "-", stdin=json.dumps(pod))
    if denied:
        assert r.returncode == 1
        assert 'admission webhook "pods.gpu.tessera.dev" denied the request' in r.stderr
        assert text in r.stderr and "Internal" not in r.stderr
    else:
        assert r.returncode == 0, r.stderr
        assert "Warning: " in r.stderr and text in r.stderr
        h.client.request(
            "DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", body={"gracePeriodSeconds": 0}
        )


# ---- HAMi's other vendors: converted once their DRA driver's DeviceClass exists ------------------------
VENDOR_DATA = REPO / "tests" / "data" / "vendors"


def test_hygon_pod_is_converted_for_the_hcu_driver_once_its_device_class_exists(
    hooked: Hooked,
) -> None:
    """HAMi's own Hygon example: admitted unchanged with a warning while the cluster has no
    DeviceClass ``dra.hygon.com``; once the HCU driver's DeviceClass and a card's slice are in the
    API server, the webhook (watching both) turns it into a template the API server accepts, with
    60 % of the card's 120 compute units."""
    h = hooked
    ns = "default"
    pod = yaml.safe_load((VENDOR_DATA / "hami-examples" / "hygon" / "default_use.yaml").read_text())
    pod["metadata"]["name"] = f"hygon-{uuid.uuid4().hex[:6]}"
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "nowhere"}
    r = h.kubectl(
        "create", "--dry-run=server", "-o", "json", "-n", ns, "-f", "-", stdin=json.dumps(pod)
    )
    assert r.returncode == 0, r.stderr
    assert "no DRA driver dra.hygon.com" in r.stderr
    assert "resourceClaims" not in json.loads(r.stdout)["spec"]
    hcu_class = yaml.safe_load((VENDOR_DATA / "hcu-dra-driver" / "deviceclass.yaml").read_text())
    hcu_slice = yaml.safe_load(
        (VENDOR_DATA / "hcu-dra-driver" / "resourceslice-k100-ai.yaml").read_text()
    )
    h.client.create(hcu_class)
    h.client.create(hcu_slice)
    try:

        def converted() -> bool | None:
            r = h.kubectl(
                "create",
                "--dry-run=server",
                "-o",
                "json",
                "-n",
                ns,
                "-f",
                "-",
                stdin=json.dumps(pod),
            )
            return (
                True
                if r.returncode == 0 and "resourceClaims" in json.loads(r.stdout)["spec"]
                else None
            )

        wait_for(converted, timeout=60, what="the webhook to see DeviceClass dra.hygon.com")
        r = h.kubectl("create", "-o", "json", "-n", ns, "-f", "-", stdin=json.dumps(pod))
        assert r.returncode == 0, r.stderr
        created = json.loads(r.stdout)
        (rc,) = created["spec"]["resourceClaims"]
        assert rc["name"] == "vdcu-pytorch-demo-hcu"
        (c,) = created["spec"]["containers"]
        assert "limits" not in c["resources"]
        tpl = h.client.get(RESOURCE, "ResourceClaimTemplate", rc["resourceClaimTemplateName"], ns)
        req = tpl["spec"]["spec"]["devices"]["requests"][0]
        assert (req["name"], req["exactly"]["deviceClassName"]) == ("hcu", "dra.hygon.com")
        assert req["exactly"]["capacity"] == {"requests": {"memory": "2000Mi", "cores": "72"}}
    finally:
        with contextlib.suppress(ApiError):
            h.client.request(
                "DELETE",
                f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}",
                body={"gracePeriodSeconds": 0},
            )
        for kind, name in (
            ("ResourceSlice", hcu_slice["metadata"]["name"]),
            ("DeviceClass", hcu_class["metadata"]["name"]),
        ):
            with contextlib.suppress(ApiError):
                h.client.request("DELETE", h.client.collection_path(RESOURCE, kind) + f"/{name}")


# ---- whole GPUs without the webhook ---------------------------------------------------------------------
def test_whole_gpu_pods_are_served_without_the_webhook(hooked: Hooked) -> None:
    """In kube-system (outside the webhook's namespaceSelector) a pod asking only
    ``nvidia.com/gpu: 1`` is served by kube-scheduler through the DeviceClass's
    extendedResourceName (KEP-5004). A second DeviceClass mapping the same name, created later,
    wins: the start-up check says so, and the scheduler then uses it."""
    from tessera.cli.webhook import check_extended_resource

    h = hooked
    wait_for(
        lambda: (
            True
            if not [
                c
                for c in h.client.list(RESOURCE, "ResourceClaim")
                if (c.get("status") or {}).get("allocation")
            ]
            else None
        ),
        timeout=120,
        what="every GPU to be idle",
    )
    ns = "kube-system"
    pod = _pod(
        f"whole-{uuid.uuid4().hex[:6]}",
        {"nvidia.com/gpu": 1},
        node_selector={"kubernetes.io/hostname": A5000},
    )
    pod["spec"]["automountServiceAccountToken"] = False
    pod["metadata"]["namespace"] = ns
    created = h.client.create(pod)
    assert "resourceClaims" not in created["spec"]  # not mutated
    node, _ = wait_verdict(h.client, pod["metadata"]["name"], ns)
    assert node == A5000
    claims = [
        c
        for c in h.client.list(RESOURCE, "ResourceClaim", ns)
        if (c["metadata"].get("annotations") or {}).get(
            "resource.kubernetes.io/extended-resource-claim"
        )
        == "true"
    ]
    (claim,) = claims
    (res,) = claim["status"]["allocation"]["devices"]["results"]
    assert (res["driver"], res["pool"], res["device"]) == ("gpu.tessera.dev", A5000, "gpu-0")
    assert (
        res["consumedCapacity"]["memory"] == "24114Mi"
    )  # the whole memory (less 450Mi driver-reserved): no one shares it
    assert (
        check_extended_resource(h.client)
        == "nvidia.com/gpu is served by DeviceClass gpu.tessera.dev"
    )

    time.sleep(1.1)  # a later creationTimestamp (seconds)
    other = {
        "apiVersion": RESOURCE,
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {
            "selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}],
            "extendedResourceName": "nvidia.com/gpu",
        },
    }
    h.client.create(other)
    try:
        msg = check_extended_resource(h.client)
        assert msg.startswith(
            "nvidia.com/gpu is mapped by 2 DeviceClasses (gpu.nvidia.com, gpu.tessera.dev); "
            "kube-scheduler uses gpu.nvidia.com"
        )
        pod2 = copy.deepcopy(pod)
        pod2["metadata"]["name"] = f"whole-{uuid.uuid4().hex[:6]}"
        h.client.create(pod2)
        _, reason = wait_verdict(h.client, pod2["metadata"]["name"], ns)
        assert (
            "cannot allocate all claims" in reason
        )  # served by gpu.nvidia.com: no such devices here
    finally:
        h.client.delete(RESOURCE, "DeviceClass", "gpu.nvidia.com")
        for p in (pod, locals().get("pod2")):
            if p:
                h.client.request(
                    "DELETE",
                    f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}",
                    body={"gracePeriodSeconds": 0},
                )


# ---- the server itself -------------------------------------------------------------------------------------
def _post(h: Hooked, body: bytes, ctx: ssl.SSLContext) -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", h.webhook_port, context=ctx, timeout=30)
    try:
        conn.request(
            "POST", "/mutate-pods", body=body, headers={"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _review(obj: Any, uid: str = "u-1", **request: Any) -> dict[str, Any]:
    req = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": "default",
        "object": obj,
        **request,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def _mutations(rng: random.Random, value: Any, depth: int = 0) -> Any:
    """``value`` with random parts replaced by junk of other types."""
    junk = [
        None,
        0,
        -1,
        2**70,
        "",
        "x" * 5000,
        [],
        {},
        [1, "a"],
        {"a": {"b": []}},
        1.5,
        True,
        "-5",
        "1Gi",
        "101",
    ]
    if rng.random() < 0.15:
        return rng.choice(junk)
    if isinstance(value, dict):
        out = {k: _mutations(rng, v, depth + 1) for k, v in value.items() if rng.random() > 0.05}
        if rng.random() < 0.1:
            out[rng.choice(["nvidia.com/gpu", "nvidia.com/gpumem", "spec", "uid", "object"])] = (
                rng.choice(junk)
            )
        return out
    if isinstance(value, list):
        return [_mutations(rng, v, depth + 1) for v in value]
    return value


def test_fuzzed_admission_reviews_never_crash_the_server_or_get_a_500(hooked: Hooked) -> None:
    """Malformed JSON, missing fields, wrong types, mutated corpus pods and a huge pod: every
    answer is a 200 with a well-formed AdmissionReview for the request's uid, or a 400/413 for a
    body that is not one; never a 500, never an internal error; the server stays healthy."""
    h = hooked
    ctx = ssl.create_default_context(cafile=str(h.ca.cert))
    rng = random.Random(20261201)
    bases = [_corpus_pod(f, f"fuzz-{doc}", doc) for f, doc, _ in CORPUS_PODS]
    bodies: list[bytes] = [
        b"",
        b"{",
        b"null",
        b"[]",
        b'"x"',
        b"\xff\xfe",
        b"{" * 100000,
        json.dumps({"apiVersion": 1}).encode(),
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
        json.dumps(_review(None)).encode(),
        json.dumps(_review({"spec": []})).encode(),
    ]
    huge = _pod("huge", {"nvidia.com/gpumem": 1000})
    huge["spec"]["containers"] = [
        {**huge["spec"]["containers"][0], "name": f"c{i}"} for i in range(3000)
    ]
    bodies.append(json.dumps(_review(huge)).encode())
    for i in range(400):
        base = copy.deepcopy(rng.choice(bases))
        review = _mutations(rng, _review(base, uid=f"u-{i}"))
        bodies.append(json.dumps(review).encode())
        if i % 10 == 0:
            text = bodies[-1].decode()
            cut = rng.randrange(len(text))
            bodies.append(text[:cut].encode())
    statuses: Counter[int] = Counter()
    for body in bodies:
        status, payload = _post(h, body, ctx)
        statuses[status] += 1
        assert status in (200, 400, 413), (status, payload[:300])
        if status == 200:
            review = json.loads(payload)
            resp = review["response"]
            assert review["kind"] == "AdmissionReview" and isinstance(resp["allowed"], bool)
            assert json.loads(body)["request"]["uid"] == resp["uid"]
            assert (resp.get("status") or {}).get("reason") != "InternalError", resp
    assert statuses[200] >= 100 and statuses[400] >= 10, statuses
    conn = http.client.HTTPSConnection("127.0.0.1", h.webhook_port, context=ctx, timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().read() == b"ok"


def _served_serial(h: Hooked) -> int:
    ctx = ssl.create_default_context(cafile=str(h.ca.cert))
    with (
        socket.create_connection(("127.0.0.1", h.webhook_port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    from cryptography import x509

    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def test_a_rotated_certificate_is_served_without_a_restart(hooked: Hooked) -> None:
    """cert-manager rotates the serving certificate by rewriting the files: the webhook serves
    the new one within seconds, and the API server (same CA) keeps calling it."""
    h = hooked
    before = _served_serial(h)
    make_serving_certificate(h.tmp, "webhook", ca=h.ca)  # same files, new key and certificate
    wait_for(
        lambda: True if _served_serial(h) != before else None,
        timeout=20,
        what="the new certificate to be served",
    )
    with h.scratch() as ns:
        pod = _pod("after-rotation", {"nvidia.com/gpumem": 1000}, node_selector=PIN_H100)
        _apply(h, ns, pod)
        assert "resourceClaims" in h.client.get("v1", "Pod", "after-rotation", ns)["spec"]


# ---- upgrades: drain at SIGTERM, templates deleted at uninstall -------------------------------

LOG_LINE = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z tessera webhook: "


def test_sigterm_drains_answering_every_request_then_stops(hooked: Hooked) -> None:
    """A second webhook process, SIGTERM'd while a client keeps sending reviews over a kept-alive
    connection: for --drain-seconds every review is still answered (with Connection: close, so
    the client reconnects), /readyz is 503; a request whose body is still arriving when the
    drain ends is finished; then the port is closed and the process has exited."""
    h = hooked
    drain = 3.0
    port_file = h.tmp / "drain.port"
    log = h.logs / "webhook-drain.log"
    proc = _spawn(
        [
            "webhook",
            f"--tls-cert-file={h.serving.cert}",
            f"--tls-private-key-file={h.serving.key}",
            "--port=0",
            f"--port-file={port_file}",
            f"--kubeconfig={h.kubeconfig}",
            "--no-collector",
            f"--drain-seconds={drain}",
        ],
        log,
    )
    try:
        wait_for(
            lambda: True if port_file.is_file() else None,
            timeout=60,
            what="the second webhook to listen",
            last=log.read_text,
        )
        port = int(port_file.read_text())
        ctx = ssl.create_default_context(cafile=str(h.ca.cert))
        pod = _pod("drain", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000})
        body = json.dumps(_review(pod, dryRun=True)).encode()

        def ready_status() -> int:
            c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
            try:
                c.request("GET", "/readyz")
                r = c.getresponse()
                r.read()
                return r.status
            finally:
                c.close()

        wait_for(lambda: True if ready_status() == 200 else None, timeout=60, what="/readyz")
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)

        def review() -> tuple[int, str | None, dict[str, Any]]:
            conn.request(
                "POST", "/mutate-pods", body=body, headers={"Content-Type": "application/json"}
            )
            r = conn.getresponse()
            return r.status, r.getheader("connection"), json.loads(r.read())

        status, connection, first = review()
        assert (status, connection) == (200, None) and first["response"]["allowed"] is True
        assert first["response"].get("patch")  # converted: the review did real work
        # A request in flight across the end of the drain: headers and half its body now.
        slow = socket.create_connection(("127.0.0.1", port), timeout=20)
        slow_tls = ctx.wrap_socket(slow, server_hostname="127.0.0.1")
        head = (
            f"POST /mutate-pods HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        slow_tls.sendall(head + body[: len(body) // 2])

        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        answered: list[tuple[int, str | None]] = []
        readyz: list[int] = []
        while time.monotonic() - t0 < drain - 0.5:
            status, connection, doc = review()
            assert doc["response"]["allowed"] is True and doc["response"].get("patch")
            answered.append((status, connection))
            readyz.append(ready_status())
            time.sleep(0.1)
        assert proc.poll() is None  # still serving
        assert answered and set(answered) == {(200, "close")}, answered
        assert set(readyz) == {503}
        # Past the drain the server stops accepting; the slow request is still finished.
        wait_for(
            lambda: True if "no longer accepting" in log.read_text() else None,
            timeout=drain + 10,
            what="the drain to end",
            last=log.read_text,
        )
        slow_tls.sendall(body[len(body) // 2 :])
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply.split(b"\r\n\r\n", 1)[1]) < 20:
            chunk = slow_tls.recv(65536)
            if not chunk:
                break
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
        slow_tls.close()
        assert proc.wait(15) == 0
        elapsed = time.monotonic() - t0
        assert drain <= elapsed < drain + 10
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        text = log.read_text()
        for line in text.splitlines():
            if "tessera webhook:" in line:
                assert re.match(LOG_LINE, line), line
        assert "draining for 3 s" in text and "stopped: " in text
        print(
            f"\n{len(answered)} review(s) answered during the {drain:g} s drain; "
            f"stopped {elapsed:.2f} s after SIGTERM"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_collect_templates_all_deletes_every_template_no_pod_still_needs(hooked: Hooked) -> None:
    """``tessera collect-templates --all`` (the chart's pre-delete hook) against the real API
    server: young unused templates and those whose pods already have their claim go; a template
    a pod still waits on (its claim cannot be made: a quota) stays and is named; a template the
    webhook did not make is never touched."""
    h = hooked
    far = "2999-01-01T00:00:00Z"  # the module's own collector must leave them alone meanwhile

    def hashed(name: str) -> Obj:
        return {
            "apiVersion": RESOURCE,
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": name,
                "labels": {"gpu.tessera.dev/template-hash": name[-16:]},
                "annotations": {STAMP_ANNOTATION: far},
            },
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}
                        ]
                    }
                }
            },
        }

    def pod(name: str, template: str) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
            },
        }

    with h.scratch() as ns, h.scratch() as blocked:
        h.client.create(
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "no-claims", "namespace": blocked},
                "spec": {"hard": {"count/resourceclaims.resource.k8s.io": "0"}},
            }
        )
        unused, claimed, waited = (
            "tessera-gpu-0000000000000001",
            "tessera-gpu-0000000000000002",
            "tessera-gpu-0000000000000003",
        )
        foreign = hashed("hand-made")
        del foreign["metadata"]["labels"]
        for ns_, obj in ((ns, hashed(unused)), (ns, hashed(claimed)), (ns, foreign)):
            h.client.create({**obj, "metadata": {**obj["metadata"], "namespace": ns_}})
        h.client.create(
            {**hashed(waited), "metadata": {**hashed(waited)["metadata"], "namespace": blocked}}
        )
        h.client.create(
            {**pod("has-claim", claimed), "metadata": {"name": "has-claim", "namespace": ns}}
        )
        h.client.create(
            {**pod("waits", waited), "metadata": {"name": "waits", "namespace": blocked}}
        )

        def claim_made() -> bool | None:
            p = h.client.get("v1", "Pod", "has-claim", ns)
            return True if (p.get("status") or {}).get("resourceClaimStatuses") else None

        wait_for(claim_made, timeout=60, what="the resource-claim controller to make the claim")
        time.sleep(1.0)  # the controller has tried (and been refused) in the quota'd namespace
        assert (
            not h.client.get("v1", "Pod", "waits", blocked)
            .get("status", {})
            .get("resourceClaimStatuses")
        )

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tessera",
                    "collect-templates",
                    f"--kubeconfig={h.kubeconfig}",
                    *args,
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )

        def names(namespace: str) -> set[str]:
            return {
                t["metadata"]["name"]
                for t in h.client.list(RESOURCE, "ResourceClaimTemplate", namespace)
            }

        plain = run()  # the webhook's own rule: young ones stay
        assert plain.returncode == 0, plain.stderr
        assert names(ns) == {unused, claimed, "hand-made"} and names(blocked) == {waited}
        r = run("--all")
        assert r.returncode == 0, r.stderr
        assert names(ns) == {"hand-made"} and names(blocked) == {waited}
        assert f"deleted ResourceClaimTemplate {ns}/{unused}" in r.stdout
        assert f"deleted ResourceClaimTemplate {ns}/{claimed}" in r.stdout
        assert f"still needed by pods waiting for their claim: {blocked}/waits" in r.stdout
        # the pod that had its claim is untouched by its template's deletion
        assert h.client.get("v1", "Pod", "has-claim", ns)["status"]["resourceClaimStatuses"]
        h.client.delete(RESOURCE, "ResourceClaimTemplate", "hand-made", ns)
        h.client.delete(RESOURCE, "ResourceClaimTemplate", waited, blocked)


# ---- legacy mode: the scheduler named, requests unchanged --------------------------------------


def test_legacy_namespace_pods_keep_their_requests_and_get_the_legacy_scheduler(
    hooked: Hooked,
) -> None:
    """A second webhook process, ``--mode both``, answers ``/mutate-pods-legacy`` for the
    namespaces labelled ``gpu.tessera.dev/mode=legacy`` (the chart's split in mode both; the
    shipped configuration is held off them meanwhile): corpus HAMi pods created there by the
    real API server keep their containers as written and get ``spec.schedulerName:
    tessera-legacy``, with no claim and no template; the same pod in another namespace still
    becomes a claim."""
    h = hooked
    port_file = h.tmp / "webhook-legacy.port"
    proc = _spawn(
        [
            "webhook",
            f"--tls-cert-file={h.serving.cert}",
            f"--tls-private-key-file={h.serving.key}",
            "--port=0",
            f"--port-file={port_file}",
            f"--kubeconfig={h.kubeconfig}",
            "--mode=both",
            "--no-collector",
            "-v",
        ],
        h.logs / "webhook-legacy.log",
    )
    cfg_name = "tessera-webhook-legacy-test"
    (shipped,) = h.client.list("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")
    shipped = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        **shipped,
    }
    original = copy.deepcopy(shipped)
    label = "gpu.tessera.dev/mode"
    try:
        wait_for(
            lambda: True if port_file.is_file() else None,
            timeout=60,
            what="the legacy webhook to listen",
            last=lambda: (h.logs / "webhook-legacy.log").read_text(),
        )
        port = int(port_file.read_text())
        not_legacy = {"key": label, "operator": "NotIn", "values": ["legacy"]}
        for w in shipped["webhooks"]:
            sel = w.setdefault("namespaceSelector", {})
            sel.setdefault("matchExpressions", []).append(not_legacy)
        h.client.request(
            "PUT",
            h.client.collection_path(
                "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"
            )
            + f"/{shipped['metadata']['name']}",
            body=shipped,
            what="the shipped webhook configuration",
        )
        legacy_cfg = copy.deepcopy(original)
        legacy_cfg["metadata"] = {"name": cfg_name}
        for w in legacy_cfg["webhooks"]:
            w["name"] = "legacy-" + w["name"]
            w["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}/mutate-pods-legacy",
                "caBundle": base64.b64encode(h.ca.cert.read_bytes()).decode(),
            }
            w["namespaceSelector"] = {
                "matchExpressions": [{"key": label, "operator": "In", "values": ["legacy"]}]
            }
        h.client.create(legacy_cfg)
        with h.scratch({label: "legacy"}) as ns, h.scratch() as dra_ns:
            probe = _corpus_pod("HAMi__examples_nvidia__default_use.yaml", "probe", pin=False)

            def legacy_active() -> bool | None:
                r = h.kubectl(
                    "create",
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-n",
                    ns,
                    "-f",
                    "-",
                    stdin=json.dumps(probe),
                )
                return (
                    True
                    if r.returncode == 0
                    and json.loads(r.stdout)["spec"].get("schedulerName") == "tessera-legacy"
                    else None
                )

            wait_for(legacy_active, timeout=60, what="the API server to call the legacy webhook")
            for file, doc, name in CORPUS_PODS:
                src = _corpus_pod(file, name, doc, pin=False)
                _apply(h, ns, src)
                got = h.client.get("v1", "Pod", name, ns)
                assert got["spec"]["schedulerName"] == "tessera-legacy", name
                assert "resourceClaims" not in got["spec"], name
                for c_src, c_got in zip(
                    src["spec"]["containers"], got["spec"]["containers"], strict=True
                ):
                    # as written, after the API server's own defaulting (requests from limits)
                    res = c_src.get("resources") or {}
                    want = {"limits": res.get("limits") or {}}
                    want["requests"] = {**want["limits"], **(res.get("requests") or {})}
                    gres = c_got.get("resources") or {}
                    for part in ("limits", "requests"):
                        assert {
                            n: Quantity.parse(str(v)) for n, v in (gres.get(part) or {}).items()
                        } == {n: Quantity.parse(str(v)) for n, v in want[part].items()}, name
            assert h.client.list(RESOURCE, "ResourceClaimTemplate", ns) == []
            _apply(
                h, dra_ns, _corpus_pod("HAMi__examples_nvidia__default_use.yaml", "dra", pin=False)
            )
            dra = h.client.get("v1", "Pod", "dra", dra_ns)
            assert (
                dra["spec"]["resourceClaims"]
                and dra["spec"]["schedulerName"] == "default-scheduler"
            )
    finally:
        with contextlib.suppress(ApiError):
            h.client.delete(
                "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration", cfg_name
            )
        cur = h.client.get(
            "admissionregistration.k8s.io/v1",
            "MutatingWebhookConfiguration",
            original["metadata"]["name"],
        )
        restored = {
            **original,
            "metadata": {
                **original["metadata"],
                "resourceVersion": cur["metadata"]["resourceVersion"],
            },
        }
        h.client.request(
            "PUT",
            h.client.collection_path(
                "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"
            )
            + f"/{original['metadata']['name']}",
            body=restored,
            what="the shipped webhook configuration",
        )
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
