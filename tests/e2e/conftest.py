"""Fixtures for tests against a live control plane (marker ``cluster``).

``kube_cluster`` (session): builds the binaries if needed (tools/kube/build.sh), starts
etcd, kube-apiserver, kube-controller-manager and kube-scheduler in a temporary state dir
with the nodes and ResourceSlices of ``data/slices.yaml``, and stops them at the end of the
session, also when tests fail or the session is interrupted.

``kube_namespace`` (function): a fresh namespace with its default ServiceAccount; its pods
are force-deleted afterwards so that their claims' capacity is released.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tessera.kube import build
from tessera.kube.client import ApiError, KubeClient
from tessera.kube.cluster import (
    Cluster,
    ClusterError,
    Inventory,
    load_slice_files,
    register_inventory,
)
from tessera.kube.workloads import delete_pod, wait_for

DATA = Path(__file__).parent / "data"
SESSION_SLICES = DATA / "slices.yaml"


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
    inventory = load_slice_files([SESSION_SLICES])
    try:
        try:
            # die_with_parent: even a SIGKILLed test session leaves no component behind.
            cluster.up(inventory, build_binaries=False, die_with_parent=True)
        except ClusterError as e:
            pytest.fail(f"tessera cluster up failed: {e}")
        yield LiveCluster(cluster, cluster.kubeconfig, cluster.client(), str(cluster.server), inventory)
    finally:
        cluster.down()


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
