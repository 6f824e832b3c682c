"""The node driver's guard against a second GPU manager, with the real control plane: Node
objects and ResourceSlices that show each kind of other manager make ``tessera driver`` refuse
to start (one line, exit 2, nothing published); the node label override lets it start.

The node's GPUs are the 8x H100 of a corpus inventory behind the fake NVML (``driverkit``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.driver.guard import MODE_LABEL, OVERRIDE_LABEL, SecondManagerError, check_node

from .conftest import CORPUS, LiveCluster
from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import DriverEnv, DriverProcess, node_slices

pytestmark = pytest.mark.cluster

HAMI_ANNOTATIONS = (
    CORPUS
    / "inventories"
    / "HAMi__docs_develop_protocol__node-register-annotations.2xV100-PCIE-32GB.txt"
)
NVIDIA_FULL_GPU = (
    CORPUS
    / "dra-manifests"
    / "dra-driver-nvidia-gpu__docs_reference_resourceslice-attributes__full-gpu-A100-PCIE-40GB.fragment.yaml"
)


def _refused(env: DriverEnv, *options: str) -> list[str]:
    """Start ``tessera driver`` for ``env``; it must exit 2 before publishing. Returns its
    error lines."""
    d = DriverProcess(env, *options).start(timeout=90)
    if d.returncode is None:
        d.stop()
        pytest.fail(f"tessera driver started on a node with another GPU manager:\n{d.output}")
    assert d.returncode == 2, d.output
    assert [
        s for s in node_slices(env.client, env.node) if s["spec"]["driver"] == "gpu.tessera.dev"
    ] == []
    return [line for line in d.output.splitlines() if line.startswith("tessera: error:")]


def _set_allocatable(client: Any, node: str, resources: dict[str, str]) -> None:
    obj = client.get("v1", "Node", node)
    status = {
        "capacity": {**(obj.get("status") or {}).get("capacity", {}), **resources},
        "allocatable": {**(obj.get("status") or {}).get("allocatable", {}), **resources},
    }
    client.patch_status(obj, {"status": status})


def _annotate(
    client: Any,
    node: str,
    annotations: dict[str, str | None],
    labels: dict[str, str | None] | None = None,
) -> None:
    client.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        body={"metadata": {"annotations": annotations, "labels": labels or {}}},
        content_type="application/merge-patch+json",
        what=f"Node {node}",
    )


def test_device_plugin_in_allocatable_refuses_start(driver_env: DriverEnv) -> None:
    env = driver_env
    _set_allocatable(env.client, env.node, {"nvidia.com/gpu": "8"})
    lines = _refused(env)
    assert len(lines) == 1
    assert lines[0].startswith(
        f"tessera: error: node {env.node} already has another manager of its NVIDIA GPUs: "
        f"Node {env.node} status.allocatable nvidia.com/gpu: 8. "
    )
    assert f"label it {OVERRIDE_LABEL}=true" in lines[0]


def test_hami_annotations_refuse_start(driver_env: DriverEnv) -> None:
    env = driver_env
    ann = dict(line.split(": ", 1) for line in HAMI_ANNOTATIONS.read_text().splitlines())
    _annotate(env.client, env.node, ann)
    # HAMi's split replicas too (deviceSplitCount 10 x 8 GPUs).
    _set_allocatable(env.client, env.node, {"nvidia.com/gpu": "80"})
    (line,) = _refused(env)
    assert (
        f"Node {env.node} status.allocatable nvidia.com/gpu: 80; Node {env.node} annotation "
        "hami.io/node-nvidia-register; "
        f"Node {env.node} annotation hami.io/node-handshake-nvidia. "
    ) in line


def test_another_dra_driver_with_the_same_uuids_refuses_start(driver_env: DriverEnv) -> None:
    """A slice of the NVIDIA DRA driver (its documented device entry, with this node's UUID)
    on this node; the same UUIDs on another node, or another driver's other GPUs, do not count."""
    env = driver_env
    device = yaml.safe_load(NVIDIA_FULL_GPU.read_text())[0]
    mine = env.gpus[3].uuid
    device["attributes"]["uuid"] = {"string": mine}

    def nvidia_slice(name: str, node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": devices,
            },
        }

    other = yaml.safe_load(NVIDIA_FULL_GPU.read_text())[
        0
    ]  # its own GPU-2fa81118..., not one of ours
    env.client.create(nvidia_slice(f"{env.node}-nvidia-other", env.node, [other]))
    env.client.create(
        nvidia_slice(f"{env.node}-nvidia-elsewhere", "h100-node", [dict(device, name="gpu-9")])
    )
    try:
        assert check_node(env.client, env.node, [g.uuid for g in env.gpus]) == []
        env.client.create(nvidia_slice(f"{env.node}-nvidia", env.node, [device]))
        (line,) = _refused(env)
        assert (
            f"DRA driver gpu.nvidia.com publishes {mine} (ResourceSlice {env.node}-nvidia). "
            in line
        )
    finally:
        for n in ("nvidia", "nvidia-other", "nvidia-elsewhere"):
            env.client.delete("resource.k8s.io/v1", "ResourceSlice", f"{env.node}-{n}")


def test_served_device_plugin_socket_refuses_start(driver_env: DriverEnv) -> None:
    env = driver_env
    d = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(d / "nvidia-gpu.sock"))
    s.listen(1)
    try:
        (line,) = _refused(env, "--device-plugin-dir", str(d))
        assert f"device plugin socket {d / 'nvidia-gpu.sock'} is served. " in line
    finally:
        s.close()
    # The plugin stopped: its socket file stays, nobody listens; the driver starts.
    p = DriverProcess(env, "--device-plugin-dir", str(d)).start(timeout=90)
    try:
        assert p.returncode is None, p.output
    finally:
        p.stop()


def test_override_label_starts_beside_another_manager(
    driver_env: DriverEnv, kube_cluster: LiveCluster
) -> None:
    """The migration override: the Node labelled allow-other-gpu-managers=true; the driver
    starts, logs what it found, and publishes."""
    env = driver_env
    _set_allocatable(env.client, env.node, {"nvidia.com/gpu": "8"})
    _annotate(env.client, env.node, {}, {OVERRIDE_LABEL: "true"})
    d = DriverProcess(env).start(timeout=90)
    try:
        assert d.returncode is None, d.output
        assert (
            f"another manager of this node's GPUs is present, started anyway (label {OVERRIDE_LABEL}=true): "
            f"Node {env.node} status.allocatable nvidia.com/gpu: 8"
        ) in d.output
        assert sum(len(s["spec"]["devices"]) for s in node_slices(env.client, env.node)) == 8
    finally:
        d.stop()
    # Without the label again: refused (the label is read at every start).
    _annotate(env.client, env.node, {}, {OVERRIDE_LABEL: None})
    for s in node_slices(env.client, env.node):
        env.client.delete("resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"])
    _refused(env)


def test_a_plain_node_starts(running_driver: tuple[DriverEnv, DriverProcess]) -> None:
    """No sign: the guard lets the driver start (the other driver tests start this way too)."""
    env, d = running_driver
    assert d.returncode is None
    assert "another manager" not in d.output
    assert check_node(env.client, env.node, [g.uuid for g in env.gpus]) == []


def test_a_node_given_to_legacy_mode_refuses_the_node_driver(driver_env: DriverEnv) -> None:
    """The Node labelled gpu.tessera.dev/mode=legacy: ``tessera driver`` refuses to start, in
    one line naming the label and how to move the node."""
    env = driver_env
    _annotate(env.client, env.node, {}, {MODE_LABEL: "legacy"})
    try:
        (line,) = _refused(env)
    finally:
        _annotate(env.client, env.node, {}, {MODE_LABEL: None})
    assert (
        f"Node {env.node} label {MODE_LABEL}=legacy gives its GPUs to Tessera's device plugin "
        "and scheduler extender; drain the node and set the label to dra to move it"
    ) in line


def test_legacy_mode_sees_tesseras_own_slices_and_not_its_own_node_records(
    running_driver: tuple[DriverEnv, DriverProcess],
) -> None:
    """The device plugin's side of the guard (``mode="legacy"``) on the real API server: the
    running node driver's ResourceSlices for the node are a sign even though they are
    Tessera's; the node's HAMi register annotation and ``nvidia.com/gpu`` allocatable (what
    the device plugin itself writes) are not; on a node without the legacy label the label is
    one more sign."""
    env, _d = running_driver
    ann = dict(line.split(": ", 1) for line in HAMI_ANNOTATIONS.read_text().splitlines())
    _annotate(env.client, env.node, ann, {MODE_LABEL: "legacy"})
    _set_allocatable(env.client, env.node, {"nvidia.com/gpu": "80"})
    uuids = [g.uuid for g in env.gpus]
    try:
        with pytest.raises(SecondManagerError) as e:
            check_node(env.client, env.node, uuids, mode="legacy")
        assert f"DRA driver gpu.tessera.dev publishes {', '.join(sorted(uuids))}" in str(e.value)
        assert "hami.io/node-nvidia-register" not in str(e.value)
        assert "status.allocatable" not in str(e.value)
        assert "tessera-mode" not in str(e.value) and MODE_LABEL not in str(e.value)
        _annotate(env.client, env.node, {}, {MODE_LABEL: None})
        with pytest.raises(SecondManagerError, match=f"label {MODE_LABEL}=dra \\(unset\\)"):
            check_node(env.client, env.node, uuids, mode="legacy")
    finally:
        _annotate(env.client, env.node, dict.fromkeys(ann), {MODE_LABEL: None})
        _set_allocatable(env.client, env.node, {"nvidia.com/gpu": "0"})


def _device_plugin(env: DriverEnv) -> subprocess.CompletedProcess[str]:
    """``tessera device-plugin`` for ``env``'s node (its kubelet dir, fake NVML); it must stop
    before serving: returns the finished process."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tessera",
            "device-plugin",
            "--node-name",
            env.node,
            "--kubeconfig",
            str(env.kubeconfig),
            "--kubelet-dir",
            str(env.kubelet_root),
            "--cdi-dir",
            str(env.cdi_dir),
            "--state-dir",
            str(env.state_dir),
            "--dev-root",
            str(env.dev_root),
            "--nvml-library",
            str(env.nvml_lib),
        ],
        env={**os.environ, "FAKE_NVML_CONFIG": str(env.nvml_config)},
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_the_device_plugin_refuses_a_node_not_given_to_legacy_mode(
    running_driver: tuple[DriverEnv, DriverProcess],
) -> None:
    """``tessera device-plugin`` on a node without the legacy label, where the node driver
    publishes the GPUs: one line naming both signs, exit 2, no socket served."""
    env, _d = running_driver
    r = _device_plugin(env)
    assert r.returncode == 2, r.stdout + r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("tessera: error:")]
    assert (
        f"Node {env.node} label {MODE_LABEL}=dra (unset) gives its GPUs to Tessera's DRA node driver"
        in line
    )
    assert "DRA driver gpu.tessera.dev publishes" in line
    assert not list((env.kubelet_root / "device-plugins").glob("*.sock"))


def test_slice_reads_are_of_this_node_only(driver_env: DriverEnv, tmp_path: Path) -> None:
    """Every ResourceSlice list the node agent makes (the guard's, the publisher's) asks the
    API server for this node's slices only (``fieldSelector=spec.nodeName=<node>``), and the
    API server answers with those alone: another node's slice is never read. (RBAC cannot hold
    a list to a field selector; the ClusterRole's ``list resourceslices`` stays cluster-wide.)"""
    from tessera.driver.publish import GpuRegistry, Publisher
    from tessera.kube.client import KubeClient

    env = driver_env
    asked: list[tuple[str, dict[str, str]]] = []
    got: list[str] = []

    class Recording(KubeClient):
        def request(self, verb: str, path: str, **kw: Any) -> Any:
            out = super().request(verb, path, **kw)
            if verb == "GET" and path.endswith("/resourceslices"):
                asked.append((path, dict(kw.get("query") or {})))
                got.extend(i["spec"].get("nodeName") or "" for i in out.get("items") or [])
            return out

    kc = Recording.from_kubeconfig(env.kubeconfig)
    elsewhere = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{env.node}-elsewhere"},
        "spec": {
            "driver": "gpu.tessera.dev",
            "nodeName": "h100-node",
            "pool": {"name": "h100-node", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": env.gpus[0].uuid}}}],
        },
    }
    env.client.create(elsewhere)
    try:
        assert check_node(kc, env.node, [g.uuid for g in env.gpus]) == []
        pub = Publisher(kc, env.node, "gpu.tessera.dev", GpuRegistry(tmp_path / "g.json"), "none")
        assert pub._ours() == []
    finally:
        env.client.delete("resource.k8s.io/v1", "ResourceSlice", f"{env.node}-elsewhere")
    assert [q["fieldSelector"] for _p, q in asked] == [
        f"spec.nodeName={env.node}",
        f"spec.nodeName={env.node},spec.driver=gpu.tessera.dev",
    ]
    assert got == []
