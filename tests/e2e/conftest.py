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

``kube_node`` (session, marker ``node``): a control plane of its own plus this machine as a
real node (``Cluster.up(kubelet=True)``: containerd, a kubelet and kube-proxy; no DeviceClass,
as a chart's ``helm install`` needs; root only). It waits up to
``$TESSERA_NODE_LOCK_WAIT`` seconds (default 900) for another session's node on this machine
to go (one kubelet per machine), and at the end of the session ``down`` restores the host; a
host it cannot restore is an error of the last test. :class:`LiveNode` gives the node's name,
the CDI spec dir, the kubelet's root and plugin dirs, an image builder, kubectl, exec and logs.
``node_namespace`` (function): a fresh namespace on that cluster; its pods are deleted
afterwards and the kubelet's confirmation awaited. ``node_device_class`` (module): the
DeviceClass ``gpu.tessera.dev`` there, for tests that run their own driver.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.kube.client import ApiError, KubeClient
from tessera.kube.workloads import delete_pod, wait_for
from tessera.localcluster import build, images
from tessera.localcluster.cluster import (
    DEVICE_CLASS,
    Cluster,
    ClusterError,
    Inventory,
    register_inventory,
)
from tessera.localcluster.node import NodeInfo, check_host, plugin_registered
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
H100_INVENTORY = (
    CORPUS
    / "inventories"
    / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
)
H100_TOPOLOGY = CORPUS / "topologies" / "litgpt__tests_test_utils__topo-m.8xGPU-NV12-10nic.txt"
#: 2x RTX A5000 (`nvidia-smi -q -x`).
A5000_INVENTORY = CORPUS / "inventories" / "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"
#: 1x A10 (`nvidia-smi -q`).
A10_INVENTORY = (
    CORPUS / "inventories" / "gpud__nvidia-query_testdata__nvidia-smi-q.535.129.03.A10.txt"
)
#: 1x H100 80GB HBM3 (nvidia_gpu_exporter capture).
H100_SINGLE_INVENTORY = (
    CORPUS
    / "inventories"
    / "nvidia_gpu_exporter__internal_captures__linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.capture.txt"
)


def corpus_node(
    name: str, inventory: Path, topology: Path | None = None, labels: dict[str, str] | None = None
) -> SimNode:
    """A node whose ResourceSlices ``tessera.inventory`` builds from a corpus inventory, as
    ``tessera simulate`` (``tessera.sim.cluster``) reads a cluster description."""
    from tessera.inventory import build_resource_slices, load_inventory, load_topology

    assert inventory.is_file(), f"corpus file missing: {inventory} (set TESSERA_CORPUS)"
    topo = load_topology(topology) if topology is not None else None
    node_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    return SimNode(
        name,
        node_labels,
        build_resource_slices(name, load_inventory(inventory), topo),
        str(inventory),
    )


def session_nodes() -> list[SimNode]:
    """The session cluster: ``h100-node`` (8x H100 with NVLink topology), ``a5000-node`` (2x A5000)."""
    return [
        corpus_node("h100-node", H100_INVENTORY, H100_TOPOLOGY),
        corpus_node("a5000-node", A5000_INVENTORY),
    ]


def inventory_of(nodes: Sequence[SimNode]) -> Inventory:
    """What ``tessera cluster up`` registers for these nodes (labels, taints and slices)."""
    inv = Inventory()
    for n in nodes:
        inv.add_node(n.name, n.labels, n.taints)
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
        pytest.fail(
            f"cannot build the control plane for `cluster` tests (deselect them with -m 'not cluster'): {e}"
        )
    state = tmp_path_factory.mktemp("tessera-cluster")
    cluster = Cluster(state)
    inventory = inventory_of(session_nodes())
    try:
        try:
            # die_with_parent: even a SIGKILLed test session leaves no component behind.
            cluster.up(inventory, build_binaries=False, die_with_parent=True)
        except ClusterError as e:
            pytest.fail(f"tessera cluster up failed: {e}")
        yield LiveCluster(
            cluster, cluster.kubeconfig, cluster.client(), str(cluster.server), inventory
        )
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
        return LiveCluster(
            cluster, cluster.kubeconfig, cluster.client(), str(cluster.server), inventory
        )

    try:
        yield start
    finally:
        for c in started:
            c.down()


@contextlib.contextmanager
def temp_namespace(client: KubeClient, *, grace_period: int = 0) -> Iterator[str]:
    """A fresh namespace ``t-<random>`` with its default ServiceAccount; afterwards its pods
    are deleted (``grace_period`` seconds: 0 on simulated nodes, more on a real one, where the
    kubelet confirms) and the namespace with them."""
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
            delete_pod(client, pod["metadata"]["name"], name, grace_period=grace_period, wait=60)
        client.delete("v1", "Namespace", name)


@pytest.fixture
def kube_namespace(kube_cluster: LiveCluster) -> Iterator[str]:
    with temp_namespace(kube_cluster.client) as name:
        yield name


# ---- a real node --------------------------------------------------------------------------

#: Seconds a session waits for another session's node on this machine (one kubelet per machine).
NODE_LOCK_WAIT = float(os.environ.get("TESSERA_NODE_LOCK_WAIT", "900"))


def node_prerequisites() -> list[str]:
    """What this machine lacks for the ``node`` tests (root, packages, binaries); empty when ready."""
    problems = check_host()
    try:
        build.ensure_built(node=True)
    except build.BuildError as e:
        problems.append(str(e))
    return problems


@dataclass
class LiveNode(LiveCluster):
    """A running control plane plus this machine as a real node (``Cluster.up(kubelet=True)``).

    ``node`` holds the paths a DRA kubelet plugin needs; ``bin_dir`` the kubectl/ctr binaries.
    """

    node: NodeInfo
    bin_dir: Path

    @property
    def name(self) -> str:
        """The Node's name (this machine's hostname)."""
        return self.node.name

    @property
    def cdi_spec_dir(self) -> Path:
        """Where a DRA driver writes CDI specs; containerd reads them from here."""
        return self.node.cdi_spec_dir

    @property
    def kubelet_root_dir(self) -> Path:
        return self.node.kubelet_root_dir

    @property
    def plugins_registry_dir(self) -> Path:
        """``<kubelet root>/plugins_registry``: where a kubelet plugin's registration socket goes."""
        return self.node.plugins_registry_dir

    def plugin_dir(self, driver: str) -> Path:
        """``<kubelet root>/plugins/<driver>``: where a DRA plugin's socket goes."""
        return self.node.plugin_dir(driver)

    def image(
        self, name: str, files: Mapping[str, images.FileLike], *, tag: str = "latest", **kwargs: Any
    ) -> images.Image:
        """Build ``tessera.local/<name>:<tag>`` (busybox plus ``files``; keyword arguments of
        :func:`tessera.localcluster.images.build_image`: env, entrypoint, cmd, libraries_for...) and
        import it into the node's containerd. Use ``.ref`` with ``imagePullPolicy: Never``."""
        return self.node.build_image(name, files, tag=tag, **kwargs)

    def kubectl(
        self, *args: str, timeout: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl ARGS`` against this cluster; with ``check``, a non-zero exit fails the test."""
        proc = subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def exec(self, pod: str, namespace: str, *command: str, container: str | None = None) -> str:
        """``kubectl exec`` (API server -> kubelet -> containerd) and return stdout."""
        opts = ["-c", container] if container else []
        return self.kubectl("exec", "-n", namespace, pod, *opts, "--", *command).stdout

    def logs(self, pod: str, namespace: str, *, container: str | None = None) -> str:
        """``kubectl logs`` (read by the kubelet from the pod log dir) and return them."""
        opts = ["-c", container] if container else []
        return self.kubectl("logs", "-n", namespace, pod, *opts).stdout

    def wait_plugin_registered(self, driver: str, *, timeout: float = 60.0) -> None:
        """Wait until the kubelet has registered the kubelet plugin of ``driver`` (create pods
        only then: a pod created before fails preparing its claims and is retried only after
        a back-off of over a minute)."""
        kubelet = self.cluster.kubelet_client()
        wait_for(
            lambda: True if plugin_registered(kubelet, self.node, driver) else None,
            timeout=timeout,
            interval=0.5,
            what=f"the kubelet to register the plugin of {driver} in {self.plugins_registry_dir}",
        )


@pytest.fixture(scope="session")
def kube_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveNode]:
    with live_node(tmp_path_factory) as node:
        yield node


#: The fixture of a module that starts a real node of its own (:func:`live_node`), not the
#: session's ``kube_node``: its tests run first, like ``host_restore`` tests.
OWN_NODE_FIXTURES = ("no_resource_api_node",)


@contextlib.contextmanager
def live_node(tmp_path_factory: pytest.TempPathFactory, **up: Any) -> Iterator[LiveNode]:
    """A control plane and this machine as a real node (``Cluster.up(kubelet=True)``, with
    keyword arguments ``up`` of :meth:`Cluster.up`, e.g. ``resource_api=False``), stopped on
    exit. Fails the test when the machine cannot be a node or the cluster does not start."""
    problems = node_prerequisites()
    if problems:
        pytest.fail(
            "cannot run a real node for `node` tests (deselect them with -m 'not node'): "
            + "; ".join(problems)
        )
    cluster = Cluster(tmp_path_factory.mktemp("node"))
    try:
        try:
            cluster.up(
                Inventory(),
                build_binaries=False,
                die_with_parent=True,
                kubelet=True,
                node_lock_wait=NODE_LOCK_WAIT,
                **up,
            )
        except ClusterError as e:
            pytest.fail(f"tessera cluster up --kubelet failed: {e}")
        info = cluster.node
        assert info is not None
        yield LiveNode(
            cluster,
            cluster.kubeconfig,
            cluster.client(),
            str(cluster.server),
            Inventory(),
            info,
            build.bin_dir(),
        )
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def node_device_class(kube_node: LiveNode) -> Iterator[str]:
    """The DeviceClass ``gpu.tessera.dev`` on the real node's cluster for a module whose
    tests run their own driver: ``up --kubelet`` registers none (a Helm release of the chart
    creates its own and refuses one it does not own). Created if absent, and then deleted
    after the module; yields its name."""
    name = DEVICE_CLASS["metadata"]["name"]
    try:
        kube_node.client.get("resource.k8s.io/v1", "DeviceClass", name)
        created = False
    except ApiError as e:
        if e.status != 404:
            raise
        kube_node.client.apply(DEVICE_CLASS, field_manager="tessera-e2e")
        created = True
    try:
        yield name
    finally:
        if created:
            with contextlib.suppress(ApiError):
                kube_node.client.delete("resource.k8s.io/v1", "DeviceClass", name)


@pytest.fixture
def node_namespace(kube_node: LiveNode) -> Iterator[str]:
    with temp_namespace(kube_node.client, grace_period=2) as name:
        yield name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``host_restore``, and those of a module with a node of its own
    (:data:`OWN_NODE_FIXTURES`), start and stop that node: run them before any test that
    starts the session's ``kube_node`` (which holds the machine's node)."""
    items.sort(
        key=lambda item: (
            0
            if item.get_closest_marker("host_restore")
            or set(OWN_NODE_FIXTURES) & set(getattr(item, "fixturenames", ()))
            else 1
        )
    )
