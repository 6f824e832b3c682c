"""``make demo``: Tessera on one machine, as a newcomer first sees it.

:func:`run_demo` starts a local cluster with this machine as a real node
(``tessera cluster up --kubelet``, without Tessera's DeviceClasses: the chart owns them), lays
out fake GPUs from the bundled 8x H100 inventory (:mod:`tessera.localcluster.localinstall`), imports
the image ``make image`` built, installs the chart, runs one HAMi-style pod (converted by the
chart's webhook) and one DRA pod, and returns what each container sees, the claims'
allocations and the monitor's metrics URL. ``make demo-down`` is ``tessera cluster down`` of
the same state dir: it stops everything and restores the host.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tessera.kube.workloads import (
    apply_objects,
    gpu_claim_template,
    gpu_pod,
    pod_claims,
    wait_for,
    wait_pod_running,
)

from . import images, localinstall
from .cluster import Cluster, Inventory

#: The demo's cluster (``--state-dir`` of ``tessera cluster demo``).
DEFAULT_DEMO_DIR = Path("~/.cache/tessera/demo").expanduser()
NAMESPACE = "demo"
RELEASE = "tessera"
RELEASE_NAMESPACE = "tessera-system"
PROBE_IMAGE = "tessera.local/demo-cuda:1"


@dataclass
class PodView:
    """What one demo pod's container sees, and its claims' allocations."""

    name: str
    kind: str  # "HAMi" or "DRA"
    limits: list[str]
    visible_devices: str
    probe: list[str]
    allocations: list[dict[str, Any]]
    running_after_s: float


@dataclass
class DemoReport:
    kubeconfig: Path
    state_dir: Path
    metrics_url: str
    install_to_ready_s: float
    pods: list[PodView] = field(default_factory=list)


def _objects(kind: str) -> list[dict[str, Any]]:
    """The demo's HAMi pod (3000 MiB, 30 %) or DRA pod (a template of 8 GiB, 20 %)."""
    sleep = ("sh", "-c", "sleep 86400")
    if kind == "HAMi":
        return [
            localinstall.hami_pod(
                "hami-pod", NAMESPACE, PROBE_IMAGE, gpumem=3000, gpucores=30, command=sleep
            )
        ]
    return [
        gpu_claim_template("share-8g", namespace=NAMESPACE, memory="8Gi", cores=20),
        gpu_pod(
            "dra-pod", namespace=NAMESPACE, template="share-8g", image=PROBE_IMAGE, command=sleep
        ),
    ]


def run_demo(state_dir: Path = DEFAULT_DEMO_DIR, *, say: Callable[[str], None]) -> DemoReport:
    """Run the demo (needs root; ``make image`` first). Raises
    :class:`~tessera.localcluster.cluster.ClusterError` or :class:`~.localinstall.LocalInstallError`
    naming the step that failed; the cluster is then left running for ``tessera cluster down``
    (``make demo-down``) and inspection."""
    cluster = Cluster(state_dir)
    say("starting a control plane and this machine as a real node")
    cluster.up(Inventory(), kubelet=True, device_classes=False, progress=say)
    node = cluster.node
    assert node is not None
    client = cluster.client()
    work = cluster.state_dir / "demo-work"
    state = cluster.state_dir / "tessera"
    say("importing the image make image built")
    built = images.build_project_image()
    images.import_image(node.ctr, node.containerd_socket, built)
    say("laying out 8 fake H100 GPUs (fake NVML, stand-in device nodes)")
    host = localinstall.make_fake_gpu_host(state / "fake-gpus")
    localinstall.probe_image(node, PROBE_IMAGE, host, work / "probe")
    key, value = localinstall.GPU_NODE_LABEL
    client.apply(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node.name, "labels": {key: value}},
        },
        field_manager="tessera-demo",
    )
    values = localinstall.chart_values(node, host, built.ref, state)
    say("helm install tessera deploy/helm/tessera")
    t0 = time.monotonic()
    localinstall.helm(
        cluster.kubeconfig,
        "install",
        RELEASE,
        str(localinstall.chart_dir()),
        "-n",
        RELEASE_NAMESPACE,
        "--create-namespace",
        values=values,
        work_dir=work,
    )
    sel = f"app.kubernetes.io/instance={RELEASE}"

    def ready() -> bool | None:
        pods = client.list("v1", "Pod", RELEASE_NAMESPACE, label_selector=sel)
        return True if len(pods) >= 4 and localinstall.tessera_pods_ready(pods) else None

    def states() -> str:
        return "; ".join(
            f"{p['metadata']['name']}: "
            + ",".join(
                str((c.get("state") or {}).get("waiting", {}).get("reason") or c.get("ready"))
                for c in (p.get("status") or {}).get("containerStatuses") or []
            )
            for p in client.list("v1", "Pod", RELEASE_NAMESPACE, label_selector=sel)
        )

    wait_for(ready, timeout=180, interval=0.5, what="the chart's pods to be Ready", last=states)
    install_s = time.monotonic() - t0
    wait_for(
        lambda: (
            client.list(
                "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.nodeName={node.name}"
            )
            or None
        ),
        timeout=60,
        what="the node agent's ResourceSlices",
    )
    svc = client.get("v1", "Service", f"{RELEASE}-monitor", RELEASE_NAMESPACE)
    metrics = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/metrics"
    report = DemoReport(cluster.kubeconfig, cluster.state_dir, metrics, install_s)
    client.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        field_manager="tessera-demo",
    )
    for kind in ("HAMi", "DRA"):
        objs = _objects(kind)
        say(f"creating the {kind} pod")
        t = time.monotonic()
        apply_objects(client, objs)
        name = objs[-1]["metadata"]["name"]
        wait_pod_running(client, name, NAMESPACE)
        after = time.monotonic() - t
        allocs = [
            r
            for c in pod_claims(client, name, NAMESPACE).values()
            for r in c["status"]["allocation"]["devices"]["results"]
        ]

        def exec_(*cmd: str, name: str = name) -> str:
            return localinstall.kubectl(
                cluster.kubeconfig, "exec", "-n", NAMESPACE, name, "--", *cmd
            )

        limits = exec_("cat", "/etc/tessera/limits").splitlines()
        visible = exec_("sh", "-c", "echo $CUDA_VISIBLE_DEVICES").strip()
        probe = exec_(
            "env",
            f"FAKE_GPUS={host.fake_gpus_env()}",
            localinstall.PROBE_PATH,
            str(2 << 30),
            str(2 << 30),
        ).splitlines()
        report.pods.append(PodView(name, kind, limits, visible, probe, allocs, after))
    return report
