"""Benchmark a pod's start-up in legacy mode against DRA mode on the same real node.

On this machine as a kubelet node (the ``kube_node`` fixture of ``tests/e2e``: kubelet +
containerd, fake NVML with 8x H100 80GB), ``$TESSERA_BENCH_PODS`` (20) pods are started **one
at a time** (each deleted before the next; one more first, to warm up, not counted), first in
DRA mode (``tessera driver``, the default kube-scheduler, a ResourceClaimTemplate of 3000Mi /
30 cores), then in legacy mode (the DeviceClass deleted: a cluster without DRA;
``tessera device-plugin``, the real kube-scheduler with ``deploy/legacy/scheduler-config.yaml``
and ``tessera extender --legacy``, HAMi's ``default_use.yaml``: 3000 MiB / 30 cores). Each pod runs the same probe
image with ``sleep``; its start-up is from the create call's return to the API showing it
``Running`` (polled every 50 ms). Reported: p50 / p90 / max per mode and the difference of the
medians (the issue's target: legacy ≤ DRA + 1 s).

Needs root and the node lock::

    flock /tmp/tessera-node-turn.lock .venv/bin/python -m pytest -q -s \\
        bench/bench_legacy_startup.py -p no:cacheprovider
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from e2e.conftest import kube_node, node_device_class, node_namespace  # noqa: E402
from e2e.driverkit import fake_nvml_lib, node_slices  # noqa: E402
from e2e.test_deviceplugin_kubelet import DevicePluginProcess, _label  # noqa: E402
from e2e.test_driver_kubelet import NodeDriverProcess, probe_image, probe_pod, template  # noqa: E402
from e2e.test_legacy_kubelet import Schedulers, corpus_pod  # noqa: E402
from tessera.kube.workloads import delete_pod, wait_for  # noqa: E402

__all__ = ["fake_nvml_lib", "kube_node", "node_device_class", "node_namespace", "probe_image"]

PODS = int(os.environ.get("TESSERA_BENCH_PODS", "20"))
DRIVER = "gpu.tessera.dev"


def _start(client: Any, pod: dict[str, Any], logs: Any = None) -> float:
    """Seconds from the create call's return to the pod ``Running``."""
    made = client.create(pod)
    t0 = time.monotonic()
    md = made["metadata"]

    def running() -> bool | None:
        p = client.get("v1", "Pod", md["name"], md["namespace"])
        return True if (p.get("status") or {}).get("phase") == "Running" else None

    def why() -> str:
        p = client.get("v1", "Pod", md["name"], md["namespace"])
        return json.dumps(p.get("status"))[-2000:] + (logs() if logs else "")

    wait_for(running, timeout=120, interval=0.05, what=f"pod {md['name']} to run", last=why)
    dt = time.monotonic() - t0
    delete_pod(client, md["name"], md["namespace"], wait=60)
    return dt


def _summary(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else xs * 9
    return f"p50 {statistics.median(xs):.3f} s, p90 {q[8]:.3f} s, max {max(xs):.3f} s (n={len(xs)})"


def test_startup_legacy_against_dra(
    kube_node: Any,
    fake_nvml_lib: Path,
    node_device_class: str,
    probe_image: str,
    node_namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    node, ns = kube_node, node_namespace
    dra: list[float] = []
    root = Path(tempfile.mkdtemp(prefix="tessera-bench-drv-", dir="/tmp"))
    drv = NodeDriverProcess(node, root, fake_nvml_lib)
    try:
        node.wait_plugin_registered(DRIVER, timeout=90)
        node.client.create(template("bench", ns, "3000Mi", 30))
        for i in range(PODS + 1):
            pod = probe_pod(f"dra-{i}", ns, probe_image, drv, node.name, [], template="bench")
            pod["spec"]["containers"][0]["command"] = ["/bin/sh", "-c", "sleep 3600"]
            dt = _start(node.client, pod)
            if i:  # the first one warms the image and the scheduler's caches
                dra.append(dt)
    finally:
        drv.stop()
        for s in node_slices(node.client, node.name):
            node.client.delete("resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"])
        shutil.rmtree(root, ignore_errors=True)

    legacy: list[float] = []
    # A cluster without DRA: the DeviceClass's extendedResourceName (nvidia.com/gpu) would
    # route the pods' nvidia.com/gpu to DRA (kube-scheduler: "1 cannot fit resource").
    node.client.delete("resource.k8s.io/v1", "DeviceClass", node_device_class)
    _label(node, "legacy")
    root = Path(tempfile.mkdtemp(prefix="tessera-bench-dp-", dir="/tmp"))
    dp = DevicePluginProcess(node, root, fake_nvml_lib)
    sched = None
    try:
        dp.wait_registered(node)
        sched = Schedulers(node, tmp_path_factory.mktemp("bench-sched"))
        for i in range(PODS + 1):
            pod = corpus_pod(
                "HAMi__examples_nvidia__default_use.yaml",
                0,
                f"legacy-{i}",
                ns,
                probe_image,
                dp,
                "sleep 3600",
            )
            dt = _start(node.client, pod, lambda: sched.logs() + dp.output[-2000:] if sched else "")
            if i:
                legacy.append(dt)
    finally:
        if sched is not None:
            sched.stop()
        dp.stop()
        shutil.rmtree(root, ignore_errors=True)
        _label(node, None)
        node.client.request(
            "PATCH",
            f"/api/v1/nodes/{node.name}",
            body={
                "metadata": {
                    "annotations": {
                        "hami.io/node-nvidia-register": None,
                        "hami.io/node-handshake": None,
                    }
                }
            },
            content_type="application/merge-patch+json",
        )
    print(f"\nDRA mode:    {_summary(dra)}")
    print(f"legacy mode: {_summary(legacy)}")
    print(f"legacy - DRA (medians): {statistics.median(legacy) - statistics.median(dra):+.3f} s")
