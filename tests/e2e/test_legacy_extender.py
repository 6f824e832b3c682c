"""Legacy mode's scheduler extender with the real kube-scheduler and API server.

A control plane of its own (``fresh_cluster``) with two Nodes as API objects (no kubelet): one
with a corpus A10, one with the corpus dual A5000, each carrying HAMi's
``hami.io/node-nvidia-register`` annotation built from its inventory and ``nvidia.com/gpu``
capacity (10 slots per GPU) as Tessera's device plugin publishes them; no DeviceClass (a cluster
without DRA). A second kube-scheduler (the real binary) runs ``deploy/legacy/scheduler-config.yaml``
(schedulerName ``tessera-legacy``) with a ``tessera extender --legacy`` process. Corpus HAMi pods
are bound one by one; the records on each bound pod decode to what
:func:`tessera.scheduler.legacy.decide` says for that node given the pods bound before it. A pod
that fits nowhere stays Pending with the extender's reasons; bind refuses, and books nothing for,
a pod that no longer fits, one deleted before its bind, one replaced by another of its name, and
one deleted (or bound elsewhere) between the records' patch and the Binding.
"""

from __future__ import annotations

import contextlib
import copy
import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_register import A10, A5000, register_node
from tessera.convert.hami import (
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    decode_pod_devices,
)
from tessera.extender.legacy import LegacyExtender
from tessera.kube.client import ApiError, KubeClient
from tessera.kube.workloads import wait_for
from tessera.localcluster import build
from tessera.scheduler.legacy import bookings, decide, legacy_node
from tessera.sim.cluster import SimNode

from .conftest import CORPUS, StartCluster

pytestmark = [pytest.mark.cluster, pytest.mark.legacy]

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "deploy" / "legacy" / "scheduler-config.yaml"
PODS = CORPUS / "hami-pods"
SCHEDULER = "tessera-legacy"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _corpus_pod(file: str, k: int, name: str) -> dict[str, Any]:
    docs = [
        d for d in yaml.safe_load_all((PODS / file).read_text()) if d and d.get("kind") == "Pod"
    ]
    pod = copy.deepcopy(docs[k])
    pod["metadata"] = {**pod["metadata"], "name": name}
    pod["spec"]["schedulerName"] = SCHEDULER
    pod["spec"]["terminationGracePeriodSeconds"] = 0
    return pod


class Legacy:
    def __init__(
        self,
        client: KubeClient,
        nodes: list[dict[str, Any]],
        ext_port: int,
        tmp: Path,
        kubeconfig: Path,
    ):
        self.kubeconfig = kubeconfig
        self.client = client
        self.nodes = nodes
        self.ext_port = ext_port
        self.tmp = tmp

    def call(self, verb: str, body: Any) -> Any:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.ext_port}/{verb}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def booked(self) -> list[dict[str, Any]]:
        return self.client.list("v1", "Pod", label_selector=VGPU_NODE)

    def expected(self, pod: dict[str, Any], node: str) -> Any:
        """What the decision says for ``pod`` on ``node`` against the pods booked now."""
        objs = [self.client.get("v1", "Node", n["metadata"]["name"]) for n in self.nodes]
        d = decide(pod, [legacy_node(o) for o in objs], bookings(self.booked()))
        return d, d.get(node)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-4000:]}" for p in sorted(self.tmp.glob("*.log"))
        )


@contextlib.contextmanager
def start_legacy(
    fresh_cluster: StartCluster,
    tmp: Path,
    nodes: Sequence[dict[str, Any]],
    *,
    dra_nodes: Sequence[SimNode] = (),
    extender_args: Sequence[str] = (),
    dynamic_resources: bool = False,
) -> Iterator[Legacy]:
    """A fresh control plane with ``nodes`` (``v1`` Node dicts from
    :func:`hami_register.register_node`: their labels, register annotation and ``nvidia.com/gpu``
    capacity are set on the API objects) and ``dra_nodes`` (publishing their ResourceSlices; the
    DeviceClass is kept only when there are some), the real kube-scheduler with
    ``deploy/legacy/scheduler-config.yaml`` and a ``tessera extender --legacy`` process (with
    ``extender_args``) beside it; both stopped afterwards. ``dynamic_resources``: the
    profile with the DynamicResources plugin on again (the chart's
    ``legacy.scheduler.disableDynamicResources: false``; the shipped profile disables it)."""
    live = fresh_cluster(
        [
            *(SimNode(n["metadata"]["name"], n["metadata"]["labels"], [], "legacy") for n in nodes),
            *dra_nodes,
        ]
    )
    client = live.client
    if not dra_nodes:
        client.delete("resource.k8s.io/v1", "DeviceClass", "gpu.tessera.dev")  # no DRA here
    for n in nodes:
        name = n["metadata"]["name"]
        client.request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            body={"metadata": {"annotations": n["metadata"]["annotations"]}},
            content_type="application/merge-patch+json",
        )
        cur = client.get("v1", "Node", name)
        slots = n["status"]["capacity"]
        st = cur["status"]
        client.patch_status(
            cur,
            {
                "status": {
                    "capacity": {**st["capacity"], **slots},
                    "allocatable": {**st["allocatable"], **slots},
                }
            },
        )
    ext_port = _free_port()
    port_file = tmp / "extender.port"
    procs: list[subprocess.Popen[bytes]] = []
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{ext_port}"
    cfg["clientConnection"] = {"kubeconfig": str(live.kubeconfig)}
    cfg["leaderElection"] = {"leaderElect": False}
    if dynamic_resources:
        del cfg["profiles"][0]["plugins"]
    cfg_path = tmp / "scheduler-config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    try:
        with open(tmp / "extender.log", "ab") as log:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tessera",
                        "extender",
                        "--legacy",
                        f"--port={ext_port}",
                        f"--port-file={port_file}",
                        f"--kubeconfig={live.kubeconfig}",
                        "-v",
                        *extender_args,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        with open(tmp / "kube-scheduler.log", "ab") as log:
            procs.append(
                subprocess.Popen(
                    [
                        str(build.bin_dir() / "kube-scheduler"),
                        f"--config={cfg_path}",
                        "--secure-port=0",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        h = Legacy(client, list(nodes), ext_port, tmp, live.kubeconfig)

        def ready() -> bool | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ext_port}/readyz", timeout=5):
                    return True
            except OSError:
                return None

        wait_for(ready, timeout=60, what="the extender to be ready", last=h.logs)
        yield h
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def legacy(fresh_cluster: StartCluster, tmp_path: Path) -> Iterator[Legacy]:
    nodes = [register_node("a10-node", A10), register_node("a5000-node", A5000)]
    with start_legacy(fresh_cluster, tmp_path, nodes) as h:
        yield h


def _bound(h: Legacy, ns: str, name: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        p = h.client.get("v1", "Pod", name, ns)
        return p if (p.get("spec") or {}).get("nodeName") else None

    return wait_for(done, timeout=90, what=f"pod {ns}/{name} to be bound", last=h.logs)


def test_the_real_scheduler_binds_hami_pods_as_the_decision_says(
    legacy: Legacy, kube_namespace_legacy: str
) -> None:
    """Each pod of the sequence fits on one node only (two whole GPUs: the A5000 node; then the
    A10's shares), so kube-scheduler's choice is the decision's; the last fits nowhere."""
    h, ns = legacy, kube_namespace_legacy
    sequence = [
        ("HAMi__examples_nvidia__use_exclusive_card.yaml", 0, "two-whole"),
        ("HAMi__examples_nvidia__use_sharing_card.yaml", 0, "share-40"),
        ("HAMi__examples_nvidia__use_sharing_card.yaml", 1, "share-60"),
    ]
    for file, k, name in sequence:
        pod = _corpus_pod(file, k, name)
        created = h.client.create({**pod, "metadata": {**pod["metadata"], "namespace": ns}})
        # What the decision says against the pods bound so far (each waited for).
        decision, _ = h.expected(created, "")
        assert len(decision.fitting()) == 1, {f.node: f.reason for f in decision.nodes}
        bound = _bound(h, ns, name)
        node = bound["spec"]["nodeName"]
        fit = decision.get(node)
        assert fit is not None and fit.devices is not None, (node, fit)
        ann = bound["metadata"]["annotations"]
        assert ann[VGPU_NODE] == node
        assert bound["metadata"]["labels"][VGPU_NODE] == node
        assert decode_pod_devices(ann[DEVICES_ALLOCATED]) == fit.devices
        assert ann[DEVICES_TO_ALLOCATE] == ann[DEVICES_ALLOCATED]
        assert ann["hami.io/bind-phase"] == "allocating"
        _allocated(h, ns, name)

    # Both A5000s are held whole, the A10's cores are all booked (60 + 40): default_use
    # (3000 MiB, 30 cores) fits nowhere and stays Pending with the extender's reasons.
    late = _corpus_pod("HAMi__examples_nvidia__default_use.yaml", 0, "late")
    created = h.client.create({**late, "metadata": {**late["metadata"], "namespace": ns}})
    decision, _ = h.expected(created, "")
    assert decision.best() is None

    def refused() -> str | None:
        p = h.client.get("v1", "Pod", "late", ns)
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("message"):
                return str(c["message"])
        return None

    msg = wait_for(refused, timeout=90, what="pod late to be refused", last=h.logs)
    for f in decision.nodes:
        assert f.reason and f.reason in msg, (f.node, f.reason, msg)
    assert not h.client.get("v1", "Pod", "late", ns)["spec"].get("nodeName")

    # Deleting the bound pods frees what they held: late is bound once they are gone.
    for _, _, name in sequence:
        h.client.request(
            "DELETE",
            h.client.collection_path("v1", "Pod", ns) + f"/{name}",
            body={"gracePeriodSeconds": 0},
        )
    assert _bound(h, ns, "late")["spec"]["nodeName"] in ("a10-node", "a5000-node")
    _allocated(h, ns, "late")
    assert [p["metadata"]["name"] for p in h.booked()] == ["late"]
    _bind_refusals(h, ns)
    _deleted_mid_bind(h, ns)


def _allocated(h: Legacy, ns: str, name: str) -> None:
    """What the node's device plugin writes once the kubelet's ``Allocate`` took the pod's
    decision (these Nodes have no kubelet): a node takes no second HAMi pod before that."""
    h.client.request(
        "PATCH",
        h.client.collection_path("v1", "Pod", ns) + f"/{name}",
        body={"metadata": {"annotations": {"hami.io/bind-phase": "success"}}},
        content_type="application/merge-patch+json",
    )


def _deleted_mid_bind(h: Legacy, ns: str) -> None:
    """An extender in this process whose API client deletes the pod (or binds it elsewhere)
    between bind's patch of the records and its Binding: the Binding fails, and nothing stays
    booked (the deleted pod takes its records with it; a pod bound by someone else has them
    taken off)."""
    client = KubeClient.from_kubeconfig(h.kubeconfig)
    real = client.request
    meddle: dict[str, str] = {}

    def request(verb: str, path: str, **kw: Any) -> Any:
        if verb == "POST" and path.endswith("/binding") and meddle:
            name = path.split("/")[-2]
            if meddle["how"] == "delete":
                real("DELETE", path.rsplit("/", 1)[0], body={"gracePeriodSeconds": 0})
            else:
                real(
                    "POST",
                    path,
                    body={
                        "apiVersion": "v1",
                        "kind": "Binding",
                        "metadata": {"name": name, "namespace": ns},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": meddle["node"]},
                    },
                )
        return real(verb, path, **kw)

    client.request = request  # type: ignore[method-assign]
    ext = LegacyExtender(
        lambda n: client.get("v1", "Node", n),
        lambda: client.list("v1", "Pod", label_selector=VGPU_NODE),
        client,
    )
    before = sorted(p["metadata"]["name"] for p in h.booked())
    for how in ("delete", "bind-elsewhere"):
        pod = _corpus_pod("HAMi__examples_nvidia__default_use.yaml", 0, f"mid-{how}")
        pod["spec"]["schedulerName"] = "nobody"
        made = h.client.create({**pod, "metadata": {**pod["metadata"], "namespace": ns}})
        decision, _ = h.expected(made, "")
        best = decision.best()
        assert best is not None
        other = next(n["metadata"]["name"] for n in h.nodes if n["metadata"]["name"] != best.node)
        meddle.update(how=how, node=other)
        md = made["metadata"]
        err = ext.bind(
            {"PodName": md["name"], "PodNamespace": ns, "PodUID": md["uid"], "Node": best.node}
        )["Error"]
        assert "Binding to" in err and "failed" in err, err
        assert sorted(p["metadata"]["name"] for p in h.booked()) == before
        if how == "bind-elsewhere":
            left = h.client.get("v1", "Pod", md["name"], ns)
            assert left["spec"]["nodeName"] == other
            assert VGPU_NODE not in (left["metadata"].get("annotations") or {})


def _bind_refusals(h: Legacy, ns: str) -> None:
    """Bind called as kube-scheduler calls it, for pods no scheduler picks up (``schedulerName``
    nobody): a pod deleted before its bind, one replaced by a new pod of its name, one that does
    not fit on the node named; each is refused with nothing written; the right one is bound."""

    def make(file: str, name: str) -> dict[str, Any]:
        pod = _corpus_pod(file, 0, name)
        pod["spec"]["schedulerName"] = "nobody"
        return h.client.create({**pod, "metadata": {**pod["metadata"], "namespace": ns}})

    def bind(pod: dict[str, Any], node: str) -> str:
        md = pod["metadata"]
        return str(
            h.call(
                "bind",
                {"PodName": md["name"], "PodNamespace": ns, "PodUID": md["uid"], "Node": node},
            )["Error"]
        )

    def delete(name: str) -> None:
        h.client.delete("v1", "Pod", name, ns)

        def missing() -> bool | None:
            try:
                h.client.get("v1", "Pod", name, ns)
            except ApiError as e:
                if e.status == 404:
                    return True
                raise
            return None

        wait_for(missing, timeout=30, what=f"pod {name} to be deleted")

    before = sorted(p["metadata"]["name"] for p in h.booked())
    gone = make("HAMi__examples_nvidia__default_use.yaml", "gone")
    delete("gone")
    assert "was deleted" in bind(gone, "a10-node")

    old = make("HAMi__examples_nvidia__default_use.yaml", "again")
    delete("again")
    new = make("HAMi__examples_nvidia__default_use.yaml", "again")
    assert "another pod now" in bind(old, "a10-node")
    again = h.client.get("v1", "Pod", "again", ns)
    assert VGPU_NODE not in (again["metadata"].get("annotations") or {})

    # Two whole GPUs do not fit on the one-GPU A10.
    two = make("HAMi__examples_nvidia__use_exclusive_card.yaml", "two")
    _, fit = h.expected(two, "a10-node")
    assert fit is not None and not fit.fits
    err = bind(two, "a10-node")
    assert "no longer fits" in err and fit.reason in err
    after = h.client.get("v1", "Pod", "two", ns)
    assert not after["spec"].get("nodeName")
    assert VGPU_NODE not in (after["metadata"].get("annotations") or {})
    assert sorted(p["metadata"]["name"] for p in h.booked()) == before

    # The pod of the right UID is bound where it fits, with the decision on it.
    decision, _ = h.expected(new, "")
    best = decision.best()
    assert best is not None and best.devices is not None
    assert bind(new, best.node) == ""
    bound = h.client.get("v1", "Pod", "again", ns)
    assert bound["spec"]["nodeName"] == best.node
    assert decode_pod_devices(bound["metadata"]["annotations"][DEVICES_ALLOCATED]) == best.devices
    assert sorted(p["metadata"]["name"] for p in h.booked()) == sorted([*before, "again"])
    _allocated(h, ns, "again")


@pytest.fixture
def kube_namespace_legacy(legacy: Legacy) -> Iterator[str]:
    from .conftest import temp_namespace

    with temp_namespace(legacy.client) as name:
        yield name
