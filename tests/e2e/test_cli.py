"""`tessera cluster up|status|down` end to end, with kubectl, in its own state dir."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

import tessera
from tessera.cli.cluster import cluster
from tessera.kube.client import KubeClient
from tessera.kube.workloads import wait_pod_scheduled
from tessera.localcluster import build

from .conftest import session_nodes, write_slices

pytestmark = pytest.mark.cluster

POD = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: half-gpu, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.tessera.dev
          capacity: {requests: {memory: 40Gi, cores: "50"}}
---
apiVersion: v1
kind: Pod
metadata: {name: kubectl-pod, namespace: default}
spec:
  automountServiceAccountToken: false
  nodeSelector: {kubernetes.io/hostname: h100-node}
  resourceClaims: [{name: gpu, resourceClaimTemplateName: half-gpu}]
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    resources: {claims: [{name: gpu}]}
"""


def processes_under(state_dir: Path) -> list[str]:
    """Command lines of live processes that mention ``state_dir``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        text = " ".join(a.decode(errors="replace") for a in argv)
        if str(state_dir) in text and state != "Z":
            out.append(text)
    return out


def test_up_kubectl_down(tmp_path: Path) -> None:
    build.ensure_built()
    state = tmp_path / "state"
    slices = write_slices(tmp_path / "slices.yaml", session_nodes())
    runner = CliRunner()
    try:
        res = runner.invoke(
            cluster, ["up", "--state-dir", str(state), "--slices", str(slices), "--no-build"]
        )
        assert res.exit_code == 0, res.output
        assert f"export KUBECONFIG={state / 'kubeconfig'}" in res.stdout
        assert "(2 simulated nodes, 2 ResourceSlices)" in res.stdout

        res = runner.invoke(cluster, ["status", "--state-dir", str(state)])
        assert res.exit_code == 0, res.output
        assert "cluster: running" in res.output
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            assert any(
                line.strip().startswith(name) and "healthy" in line
                for line in res.output.splitlines()
            ), res.output

        env = {**os.environ, "KUBECONFIG": str(state / "kubeconfig")}
        kubectl = str(build.binary("kubectl"))
        got = subprocess.run(
            [kubectl, "get", "nodes,resourceslices", "-o", "json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        items = json.loads(got.stdout)["items"]
        assert sorted((i["kind"], i["metadata"]["name"]) for i in items) == [
            ("Node", "a5000-node"),
            ("Node", "h100-node"),
            ("ResourceSlice", "a5000-node-gpu.tessera.dev"),
            ("ResourceSlice", "h100-node-gpu.tessera.dev"),
        ]
        subprocess.run(
            [kubectl, "apply", "-f", "-"],
            input=POD,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        client = KubeClient.from_kubeconfig(state / "kubeconfig")
        pod = wait_pod_scheduled(client, "kubectl-pod")
        assert pod["spec"]["nodeName"] == "h100-node"
        got = subprocess.run(
            [
                kubectl,
                "get",
                "resourceclaims",
                "-o",
                "jsonpath={.items[0].status.allocation.devices.results[0].consumedCapacity}",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(got.stdout) == {"cores": "50", "memory": "40Gi"}

        # A second `up` on a running cluster is refused and changes nothing.
        res = runner.invoke(cluster, ["up", "--state-dir", str(state), "--no-build"])
        assert res.exit_code == 1
        assert "already running" in res.output
        assert len(processes_under(state)) == 4
    finally:
        res = runner.invoke(cluster, ["down", "--state-dir", str(state)])
    assert res.exit_code == 0, res.output
    assert (
        res.output.strip()
        == "stopped: kube-scheduler, kube-controller-manager, kube-apiserver, etcd"
    )
    assert processes_under(state) == []
    res = runner.invoke(cluster, ["status", "--state-dir", str(state)])
    assert res.exit_code == 3
    assert "cluster: stopped" in res.output
    res = runner.invoke(cluster, ["down", "--state-dir", str(state)])
    assert res.exit_code == 0 and "nothing was running" in res.output


def test_bad_slices_input_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: resource.k8s.io/v1beta1\nkind: ResourceSlice\nmetadata: {name: x}\nspec: {}\n"
    )
    res = CliRunner().invoke(
        cluster, ["up", "--state-dir", str(tmp_path / "s"), "--slices", str(bad), "--no-build"]
    )
    assert res.exit_code == 2
    assert (
        f"{bad}: document 1: apiVersion/kind is 'resource.k8s.io/v1beta1'/'ResourceSlice'"
        in res.output
    )
    assert not (tmp_path / "s").exists()


def test_up_with_bundled_cluster_description(tmp_path: Path) -> None:
    """`tessera cluster up --cluster src/tessera/examples/cluster.yaml` registers the bundled
    default's four nodes (labels from the file) and the slices load_cluster builds for them."""
    from tessera.sim.cluster import load_cluster

    build.ensure_built()
    desc = Path(tessera.__file__).parent / "examples" / "cluster.yaml"
    expected = load_cluster(desc)
    state = tmp_path / "state"
    runner = CliRunner()
    try:
        res = runner.invoke(
            cluster, ["up", "--state-dir", str(state), "--cluster", str(desc), "--no-build"]
        )
        assert res.exit_code == 0, res.output
        assert "(4 simulated nodes, 4 ResourceSlices)" in res.stdout
        client = KubeClient.from_kubeconfig(state / "kubeconfig")
        nodes = {n["metadata"]["name"]: n for n in client.list("v1", "Node")}
        assert sorted(nodes) == ["a100-mig-node", "a5000-node", "h100-node", "v100s-node"]
        family = {
            name: n["metadata"]["labels"].get("gpu.tessera.dev/family") for name, n in nodes.items()
        }
        assert family == {
            "h100-node": "hopper",
            "v100s-node": "volta",
            "a5000-node": "ampere",
            "a100-mig-node": "ampere",
        }
        assert all(
            n["metadata"]["labels"]["tessera.dev/simulated-node"] == "true" for n in nodes.values()
        )

        stored = {
            s["spec"]["nodeName"]: s for s in client.list("resource.k8s.io/v1", "ResourceSlice")
        }
        assert sorted(stored) == sorted(nodes)
        for node in expected.nodes:
            (want,) = node.slices
            assert stored[node.name]["spec"] == want["spec"], node.name
        devices = {name: [d["name"] for d in s["spec"]["devices"]] for name, s in stored.items()}
        assert devices["h100-node"] == [f"gpu-{i}" for i in range(8)]
        assert devices["v100s-node"] == [f"gpu-{i}" for i in range(8)]
        assert devices["a5000-node"] == ["gpu-0", "gpu-1"]
        products = {
            name: {
                d["attributes"]["productName"]["string"]
                for d in s["spec"]["devices"]
                if "productName" in d["attributes"]
            }
            for name, s in stored.items()
        }
        assert products["h100-node"] == {"NVIDIA H100 80GB HBM3"}
        assert products["v100s-node"] == {"Tesla V100S-PCIE-32GB"}
        assert products["a5000-node"] == {"NVIDIA RTX A5000"}
        assert (
            client.get("resource.k8s.io/v1", "DeviceClass", "gpu.tessera.dev")["metadata"]["name"]
            == "gpu.tessera.dev"
        )
    finally:
        res = runner.invoke(cluster, ["down", "--state-dir", str(state)])
    assert res.exit_code == 0, res.output
