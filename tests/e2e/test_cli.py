"""`tessera cluster up|status|down` end to end, with kubectl, in its own state dir."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from tessera.kube import build
from tessera.kube.cli import cluster
from tessera.kube.client import KubeClient
from tessera.kube.workloads import wait_pod_scheduled

from .conftest import SESSION_SLICES

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
  nodeSelector: {kubernetes.io/hostname: gpu-node-2}
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
    runner = CliRunner()
    try:
        res = runner.invoke(cluster, ["up", "--state-dir", str(state), "--slices", str(SESSION_SLICES), "--no-build"])
        assert res.exit_code == 0, res.output
        assert f"export KUBECONFIG={state / 'kubeconfig'}" in res.stdout
        assert "(2 nodes, 2 ResourceSlices)" in res.stdout

        res = runner.invoke(cluster, ["status", "--state-dir", str(state)])
        assert res.exit_code == 0, res.output
        assert "cluster: running" in res.output
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            assert any(line.strip().startswith(name) and "healthy" in line for line in res.output.splitlines()), res.output

        env = {**os.environ, "KUBECONFIG": str(state / "kubeconfig")}
        kubectl = str(build.binary("kubectl"))
        got = subprocess.run([kubectl, "get", "nodes,resourceslices", "-o", "json"], env=env, capture_output=True, text=True, check=True)
        items = json.loads(got.stdout)["items"]
        assert sorted((i["kind"], i["metadata"]["name"]) for i in items) == [
            ("Node", "gpu-node-1"), ("Node", "gpu-node-2"),
            ("ResourceSlice", "gpu-node-1-gpu.tessera.dev"), ("ResourceSlice", "gpu-node-2-gpu.tessera.dev"),
        ]
        subprocess.run([kubectl, "apply", "-f", "-"], input=POD, env=env, capture_output=True, text=True, check=True)
        client = KubeClient.from_kubeconfig(state / "kubeconfig")
        pod = wait_pod_scheduled(client, "kubectl-pod")
        assert pod["spec"]["nodeName"] == "gpu-node-2"
        got = subprocess.run(
            [kubectl, "get", "resourceclaims", "-o", "jsonpath={.items[0].status.allocation.devices.results[0].consumedCapacity}"],
            env=env, capture_output=True, text=True, check=True,
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
    assert res.output.strip() == "stopped: kube-scheduler, kube-controller-manager, kube-apiserver, etcd"
    assert processes_under(state) == []
    res = runner.invoke(cluster, ["status", "--state-dir", str(state)])
    assert res.exit_code == 3
    assert "cluster: stopped" in res.output
    res = runner.invoke(cluster, ["down", "--state-dir", str(state)])
    assert res.exit_code == 0 and "nothing was running" in res.output


def test_bad_slices_input_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: resource.k8s.io/v1beta1\nkind: ResourceSlice\nmetadata: {name: x}\nspec: {}\n")
    res = CliRunner().invoke(cluster, ["up", "--state-dir", str(tmp_path / "s"), "--slices", str(bad), "--no-build"])
    assert res.exit_code == 2
    assert f"{bad}: document 1: apiVersion/kind is 'resource.k8s.io/v1beta1'/'ResourceSlice'" in res.output
    assert not (tmp_path / "s").exists()
