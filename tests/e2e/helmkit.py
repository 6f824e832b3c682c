"""Helpers for the chart tests: the ``helm`` binary (built from the Go module proxy by
``tools/helm/build.sh``), rendering the chart, kubectl, and ServiceAccount tokens of the
chart's identities (bound to a pod on a node, as the kubelet gives them to the chart's pods).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.kube.client import ApiError, KubeClient
from tessera.kube.workloads import wait_for
from tessera.localcluster import build, localinstall

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "tessera"
#: The Kubernetes version the chart is rendered for (the tools/kube control plane's).
KUBE_VERSION = "1.37.2"
#: cert-manager's CRDs (Certificate, Issuer, ClusterIssuer) for the cert-manager value set, from
#: its Go module (deploy/crds), fetched with `go mod download` like the kubelet protos.
CERT_MANAGER = "github.com/cert-manager/cert-manager@v1.21.2"


def helm_bin() -> Path:
    """``$TESSERA_HELM_BIN`` (a prebuilt helm), else ``tools/helm/bin/helm``, built by
    ``tools/helm/build.sh`` when missing or stale
    (:func:`tessera.localcluster.localinstall.helm_binary`, a no-op otherwise). Fails the test
    when it cannot be built."""
    env = os.environ.get("TESSERA_HELM_BIN")
    if env:
        p = Path(env)
        if not os.access(p, os.X_OK):
            pytest.fail(f"TESSERA_HELM_BIN={env} is not an executable helm")
        return p
    try:
        return localinstall.helm_binary()
    except localinstall.LocalInstallError as e:
        pytest.fail(str(e))


def cert_manager_crds() -> list[Path]:
    """The cert-manager CRD files of :data:`CERT_MANAGER` (module cache, fetched when missing)."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run(
            ["go", "mod", "download", "-json", CERT_MANAGER],
            cwd=d,
            capture_output=True,
            text=True,
            env={**os.environ, "GOFLAGS": "-mod=mod"},
            check=False,
        )
    if r.returncode != 0:
        pytest.fail(f"go mod download {CERT_MANAGER} failed: {r.stdout[-1000:]}{r.stderr[-1000:]}")
    crds = Path(json.loads(r.stdout)["Dir"]) / "deploy" / "crds"
    return [
        crds / f"cert-manager.io_{k}.yaml" for k in ("certificates", "issuers", "clusterissuers")
    ]


@dataclass
class Tools:
    """``helm`` and ``kubectl`` against one cluster (``kubeconfig``)."""

    helm_path: Path
    kubeconfig: Path
    tmp: Path

    def helm(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [str(self.helm_path), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={
                **os.environ,
                "HELM_CACHE_HOME": str(self.tmp / "helm-cache"),
                "HELM_CONFIG_HOME": str(self.tmp / "helm-config"),
                "HELM_DATA_HOME": str(self.tmp / "helm-data"),
            },
        )
        if check and r.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
        return r

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [
                str(build.bin_dir() / "kubectl"),
                f"--kubeconfig={kubeconfig or self.kubeconfig}",
                *args,
            ],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and r.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
        return r

    def render(
        self,
        release: str,
        namespace: str,
        values: Mapping[str, Any] | None = None,
        *,
        api_versions: Sequence[str] = (),
        show_only: str | None = None,
    ) -> list[dict[str, Any]]:
        """``helm template`` of the chart (hooks included): the objects, in helm's order."""
        vf = self.tmp / f"values-{release}.yaml"
        vf.write_text(yaml.safe_dump(dict(values or {})))
        args = [
            "template",
            release,
            str(CHART),
            "-n",
            namespace,
            f"--kube-version={KUBE_VERSION}",
            "-f",
            str(vf),
        ]
        args += [f"--api-versions={v}" for v in api_versions]
        if show_only:
            args += ["--show-only", show_only]
        out = self.helm(*args).stdout
        return [d for d in yaml.safe_load_all(out) if d]

    def can_i(self, verb: str, resource: str, user: str, *extra: str) -> bool:
        r = self.kubectl("auth", "can-i", verb, resource, f"--as={user}", *extra, check=False)
        assert r.stdout.strip() in ("yes", "no"), (verb, resource, r.stdout, r.stderr)
        return r.stdout.strip() == "yes"

    def token_kubeconfig(
        self, client: KubeClient, sa: str, namespace: str, *, pod: Mapping[str, Any] | None = None
    ) -> Path:
        """A kubeconfig with a token of ServiceAccount ``namespace/sa``; bound to ``pod`` (a Pod
        object with ``spec.nodeName``: the API server puts the node in the token's user info,
        ``authentication.kubernetes.io/node-name``) when given."""
        args = ["create", "token", sa, "-n", namespace, "--duration=1h"]
        if pod is not None:
            args += [
                "--bound-object-kind=Pod",
                f"--bound-object-name={pod['metadata']['name']}",
                f"--bound-object-uid={pod['metadata']['uid']}",
            ]
        token = self.kubectl(*args).stdout.strip()
        cfg = yaml.safe_load(self.kubeconfig.read_text())
        cluster = cfg["clusters"][0]
        path = (
            self.tmp
            / f"kc-{namespace}-{sa}-{(pod or {}).get('metadata', {}).get('name', 'unbound')}.yaml"
        )
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "sa",
                    "clusters": [cluster],
                    "users": [{"name": sa, "user": {"token": token}}],
                    "contexts": [
                        {"name": "sa", "context": {"cluster": cluster["name"], "user": sa}}
                    ],
                }
            )
        )
        return path


def bound_pod(client: KubeClient, name: str, namespace: str, sa: str, node: str) -> dict[str, Any]:
    """A pod of ServiceAccount ``sa`` bound to ``node`` (no kubelet runs it: it only anchors a
    node-bound token, as the chart's DaemonSet pods would)."""
    pod = client.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "serviceAccountName": sa,
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
    )
    return pod


def ensure_namespace(client: KubeClient, name: str) -> None:
    try:
        client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except ApiError as e:
        if e.status != 409:
            raise

    def has_sa() -> bool | None:
        try:
            client.get("v1", "ServiceAccount", "default", name)
            return True
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    wait_for(has_sa, timeout=60, what=f"ServiceAccount {name}/default")


def tessera_process(args: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """``python -m tessera ARGS`` with output in ``log`` (killed with the test session)."""
    import ctypes
    import signal

    def pdeathsig() -> None:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)

    with open(log, "ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "tessera", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            preexec_fn=pdeathsig,
        )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
