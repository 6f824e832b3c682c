"""Fixtures for tests against a live control plane (marker ``cluster``).

``kube_cluster`` (session): builds the binaries if needed (tools/kube/build.sh), starts
etcd, kube-apiserver, kube-controller-manager and kube-scheduler in a temporary state dir
with the session nodes (:func:`session_nodes`: ResourceSlices built by ``tessera.inventory``
from real inventories in the corpus), and stops them at the end of the session, also when
tests fail or the session is interrupted.

``fresh_cluster`` (function): a factory that starts a control plane of its own with the
given nodes (for tests whose outcome depends on every node of the cluster), stopped after
the test.

``kube_namespace`` (function): a fresh namespace with its default ServiceAccount; its pods
are force-deleted afterwards so that their claims' capacity is released.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tessera.kube import build
from tessera.kube.client import ApiError, KubeClient
from tessera.kube.cluster import (
    Cluster,
    ClusterError,
    Inventory,
    register_inventory,
)
from tessera.kube.workloads import delete_pod, wait_for
from tessera.sim.cluster import Cluster as SimCluster
from tessera.sim.cluster import SimNode

DATA = Path(__file__).parent / "data"


def corpus_dir() -> Path:
    """The corpus of real inputs: ``$TESSERA_CORPUS`` or ``../shared/corpus`` beside the checkout."""
    env = os.environ.get("TESSERA_CORPUS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".." / "shared" / "corpus"


CORPUS = corpus_dir()
#: 8x H100 80GB HBM3 (`nvidia-smi -q`) and the `nvidia-smi topo -m` of an 8-GPU NV12 box.
H100_INVENTORY = CORPUS / "inventories" / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
H100_TOPOLOGY = CORPUS / "topologies" / "litgpt__tests_test_utils__topo-m.8xGPU-NV12-10nic.txt"
#: 2x RTX A5000 (`nvidia-smi -q -x`).
A5000_INVENTORY = CORPUS / "inventories" / "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"
#: 1x A10 (`nvidia-smi -q`).
A10_INVENTORY = CORPUS / "inventories" / "gpud__nvidia-query_testdata__nvidia-smi-q.535.129.03.A10.txt"
#: 1x H100 80GB HBM3 (nvidia_gpu_exporter capture).
H100_SINGLE_INVENTORY = (
    CORPUS / "inventories" / "nvidia_gpu_exporter__internal_captures__linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.capture.txt"
)


def corpus_node(name: str, inventory: Path, topology: Path | None = None, labels: dict[str, str] | None = None) -> SimNode:
    """A node whose ResourceSlices ``tessera.inventory`` builds from a corpus inventory, as
    ``tessera simulate`` (``tessera.sim.cluster``) reads a cluster description."""
    from tessera.inventory import build_resource_slices, load_inventory, load_topology

    assert inventory.is_file(), f"corpus file missing: {inventory} (set TESSERA_CORPUS)"
    topo = load_topology(topology) if topology is not None else None
    node_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    return SimNode(name, node_labels, build_resource_slices(name, load_inventory(inventory), topo), str(inventory))


def session_nodes() -> list[SimNode]:
    """The session cluster: ``h100-node`` (8x H100 with NVLink topology), ``a5000-node`` (2x A5000)."""
    return [corpus_node("h100-node", H100_INVENTORY, H100_TOPOLOGY), corpus_node("a5000-node", A5000_INVENTORY)]


def inventory_of(nodes: Sequence[SimNode]) -> Inventory:
    """What ``tessera cluster up`` registers for these nodes (labels and slices)."""
    inv = Inventory()
    for n in nodes:
        inv.add_node(n.name, n.labels)
        for j, s in enumerate(n.slices):
            inv.add_slice(s, f"{n.source}: slice {j}")
    return inv


def sim_cluster(nodes: Sequence[SimNode]) -> SimCluster:
    """The same nodes as a ``tessera simulate`` cluster (node order = scheduling order)."""
    return SimCluster(list(nodes), "e2e")


def write_slices(path: Path, nodes: Sequence[SimNode]) -> Path:
    """Write the nodes' ResourceSlices as one multi-document YAML file (``--slices`` input)."""
    path.write_text(yaml.safe_dump_all([s for n in nodes for s in n.slices], sort_keys=False))
    return path


@dataclass
class LiveCluster:
    """A running control plane: ``kubeconfig`` path, admin ``client``, ``server`` URL."""

    cluster: Cluster
    kubeconfig: Path
    client: KubeClient
    server: str
    inventory: Inventory

    def register(self, inventory: Inventory) -> None:
        """Add nodes and ResourceSlices to the running cluster (see register_inventory)."""
        register_inventory(self.client, inventory)


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveCluster]:
    try:
        build.ensure_built()
    except build.BuildError as e:
        pytest.fail(f"cannot build the control plane for `cluster` tests (deselect them with -m 'not cluster'): {e}")
    state = tmp_path_factory.mktemp("tessera-cluster")
    cluster = Cluster(state)
    inventory = inventory_of(session_nodes())
    try:
        try:
            # die_with_parent: even a SIGKILLed test session leaves no component behind.
            cluster.up(inventory, build_binaries=False, die_with_parent=True)
        except ClusterError as e:
            pytest.fail(f"tessera cluster up failed: {e}")
        yield LiveCluster(cluster, cluster.kubeconfig, cluster.client(), str(cluster.server), inventory)
    finally:
        cluster.down()


StartCluster = Callable[[Sequence[SimNode]], LiveCluster]


@pytest.fixture
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartCluster]:
    """``fresh_cluster(nodes)`` starts a control plane with only these nodes (and the
    DeviceClass), waits for the ``default`` ServiceAccount, and stops it after the test."""
    started: list[Cluster] = []

    def start(nodes: Sequence[SimNode]) -> LiveCluster:
        try:
            build.ensure_built()
        except build.BuildError as e:
            pytest.fail(f"cannot build the control plane: {e}")
        cluster = Cluster(tmp_path_factory.mktemp("tessera-fresh-cluster"))
        started.append(cluster)
        inventory = inventory_of(nodes)
        try:
            cluster.up(inventory, build_binaries=False, die_with_parent=True)
        except ClusterError as e:
            pytest.fail(f"tessera cluster up failed: {e}")
        return LiveCluster(cluster, cluster.kubeconfig, cluster.client(), str(cluster.server), inventory)

    try:
        yield start
    finally:
        for c in started:
            c.down()


@pytest.fixture
def kube_namespace(kube_cluster: LiveCluster) -> Iterator[str]:
    client = kube_cluster.client
    name = f"t-{uuid.uuid4().hex[:8]}"
    client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def has_default_sa() -> bool | None:
        try:
            client.get("v1", "ServiceAccount", "default", name)
            return True
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    wait_for(has_default_sa, timeout=60, what=f"ServiceAccount {name}/default")
    try:
        yield name
    finally:
        for pod in client.list("v1", "Pod", name):
            delete_pod(client, pod["metadata"]["name"], name)
        client.delete("v1", "Namespace", name)
