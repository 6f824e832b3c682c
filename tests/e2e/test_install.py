"""The whole path, as a user installs Tessera: the chart's own pods, from the image the
project's Dockerfile builds (``make image``), on this machine as a real node (kubelet v1.37 and
containerd 2.x, ``tessera cluster up --kubelet``), with fake GPUs (the project's fake NVML and
libcuda; everything else is real).

In order, sharing one release (``pytest -m install`` runs this module alone):

1. ``helm install`` → the node agent, monitor and two webhook replicas run from the image and
   are Ready; the node agent publishes the node's 8 GPUs.
2. HAMi pods from ``shared/corpus/hami-pods``, applied unchanged (their ``ubuntu:*`` images
   are stand-ins built here: busybox, a ``bash`` that runs busybox's shell, the CUDA probe and
   the fake libcuda) → the chart's webhook converts them → kube-scheduler allocates → the node
   agent prepares → inside each container the limits file, the preloaded library and a CUDA
   probe over the fake libcuda see the claim's limits.
3. The chart's monitor exports each share's used and limit bytes under Tessera's and HAMi's
   names; a real Prometheus scrapes it through the monitor's Service and the share alert fires
   while the probe holds memory near the limit.
4. Pods deleted → no CDI spec, limits file, region, claim or template is left.
5. ``helm upgrade`` rolls the node agent and the webhook while HAMi pods are being created:
   none is refused, none waits more than 5 s longer than without the roll.
6. ``helm uninstall`` leaves nothing of Tessera's behind.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from corpus_paths import corpus_path
from prom_server import prometheus
from tessera import DRIVER_NAME
from tessera.enforcement.layout import claims_dir
from tessera.kube.client import ApiError
from tessera.kube.workloads import wait_for
from tessera.localcluster import images, localinstall
from tessera.webhook.templates import HASH_LABEL

from .conftest import LiveNode

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.install]

NS = "tessera-system"
RELEASE = "tessera"
MIB, GIB = 1 << 20, 1 << 30
RULES = Path(__file__).resolve().parents[2] / "deploy" / "monitoring" / "tessera-alerts.yaml"
#: The corpus files applied unchanged, one namespace each (their pods share names).
HAMI_FILES = {
    "hami-default": "HAMi__examples_nvidia__default_use.yaml",
    "hami-sharing": "HAMi__examples_nvidia__use_sharing_card.yaml",
    "hami-fraction": "HAMi__examples_nvidia__use_memory_fraction.yaml",
}
#: The kinds of a release's namespaced and cluster-wide objects that uninstall must remove.
RELEASE_KINDS = (
    ("apps/v1", "DaemonSet"),
    ("apps/v1", "Deployment"),
    ("v1", "ServiceAccount"),
    ("v1", "ConfigMap"),
)
CLUSTER_KINDS = (
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"),
)
#: The label of the webhook's hashed ResourceClaimTemplates.
TEMPLATE_LABEL = HASH_LABEL


@dataclass
class Release:
    node: LiveNode
    host: localinstall.FakeGpuHost
    values: dict[str, Any]
    work: Path
    state: Path
    times: dict[str, float] = field(default_factory=dict)
    uninstalled: bool = False

    def helm(self, *args: str, values: dict[str, Any] | None = None) -> str:
        return localinstall.helm(
            self.node.kubeconfig, *args, values=values, work_dir=self.work
        ).stdout

    def pods(self, component: str | None = None) -> list[dict[str, Any]]:
        sel = f"app.kubernetes.io/instance={RELEASE}"
        if component:
            sel += f",app.kubernetes.io/component={component}"
        return self.node.client.list("v1", "Pod", NS, label_selector=sel)

    def uninstall(self) -> float:
        """``helm uninstall --wait`` of this release, then a wait until its pods are gone (after
        their grace period: the node agent hands its claims over or drains); seconds waited."""
        self.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "180s")
        self.uninstalled = True
        t0 = time.monotonic()
        wait_for(
            lambda: True if not self.pods() else None,
            timeout=150,
            what="the release's pods to end",
        )
        return time.monotonic() - t0

    def left(
        self, kinds: tuple[tuple[str, str], ...], namespace: str | None = NS
    ) -> dict[str, list[str]]:
        """The release's objects still there (label ``app.kubernetes.io/instance``), by kind;
        ``kinds`` are ``(apiVersion, kind)`` pairs, listed in ``namespace`` (None: cluster)."""
        sel = f"app.kubernetes.io/instance={RELEASE}"
        found = {
            kind: [
                o["metadata"]["name"]
                for o in self.node.client.list(api, kind, namespace, label_selector=sel)
            ]
            for api, kind in kinds
        }
        return {kind: names for kind, names in found.items() if names}

    @contextmanager
    def installed(self, min_pods: int, timeout: float) -> Iterator[Release]:
        """``helm install`` of this release, waited on until at least ``min_pods`` of its pods
        are Ready (``timeout`` s); uninstalled at the end unless a test already did."""
        t0 = time.monotonic()
        self.helm(
            "install",
            RELEASE,
            str(localinstall.chart_dir()),
            "-n",
            NS,
            "--create-namespace",
            values=self.values,
        )
        try:
            wait_for(
                lambda: (
                    True
                    if localinstall.tessera_pods_ready(self.pods()) and len(self.pods()) >= min_pods
                    else None
                ),
                timeout=timeout,
                interval=0.5,
                what="every Tessera pod Ready",
                last=lambda: json.dumps(
                    [
                        (p["metadata"]["name"], p.get("status", {}).get("containerStatuses"))
                        for p in self.pods()
                    ],
                    indent=1,
                )[-4000:],
            )
            self.times["install_to_ready_s"] = time.monotonic() - t0
            yield self
        finally:
            if not self.uninstalled:
                try:
                    self.helm("uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "120s")
                except localinstall.LocalInstallError as e:
                    print(f"helm uninstall at teardown: {e}")
            print(f"install timings: {self.times}")


@pytest.fixture(scope="module")
def release(kube_node: LiveNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    node = kube_node
    work = tmp_path_factory.mktemp("install")
    state = node.cluster.state_dir / "tessera-install"
    built = images.build_project_image()
    images.import_image(node.node.ctr, node.node.containerd_socket, built)
    host = localinstall.make_fake_gpu_host(state / "fake-gpus")
    # The corpus pods' images, as stand-ins (nothing is pulled).
    for ref in ("docker.io/library/ubuntu:22.04", "docker.io/library/ubuntu:18.04"):
        localinstall.probe_image(node.node, ref, host, work / "probe")
    # What NVIDIA's GPU feature discovery would say: the chart's default affinity selects it.
    key, value = localinstall.GPU_NODE_LABEL
    node.kubectl("label", "node", node.name, f"{key}={value}", "--overwrite")
    values = localinstall.chart_values(node.node, host, built.ref, state)
    rel = Release(node, host, values, work, state)
    try:
        with rel.installed(min_pods=4, timeout=180):
            yield rel
    finally:
        node.kubectl("label", "node", node.name, f"{key}-", check=False)


def test_tessera_pods_run_from_the_image_and_publish_the_gpus(release: Release) -> None:
    pods = release.pods()
    by = sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods)
    assert by == ["monitor", "node", "webhook", "webhook"]
    assert {c["image"] for p in pods for c in p["spec"]["containers"]} == {
        f"{release.values['image']['repository']}:{release.values['image']['tag']}"
    }
    slices = wait_for(
        lambda: (
            release.node.client.list(
                "resource.k8s.io/v1",
                "ResourceSlice",
                field_selector=f"spec.nodeName={release.node.name}",
            )
            or None
        ),
        timeout=60,
        what="the node agent's ResourceSlices",
    )
    uuids = [d["attributes"]["uuid"]["string"] for s in slices for d in s["spec"]["devices"]]
    assert sorted(uuids) == sorted(g.uuid for g in release.host.gpus)
    assert {s["spec"]["driver"] for s in slices} == {DRIVER_NAME}
    # The DeviceClasses are the chart's (nothing `cluster up` registered collides with them).
    dc = release.node.client.get("resource.k8s.io/v1", "DeviceClass", DRIVER_NAME)
    assert dc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


# ---- HAMi pods through the chart's webhook, driver and library --------------------------------


def _apply_corpus(release: Release, ns: str, name: str) -> list[str]:
    """``kubectl apply`` of the corpus file as it is, into ``ns``; returns the pod names."""
    node = release.node
    node.kubectl("create", "namespace", ns, check=False)
    path = corpus_path() / "hami-pods" / name
    node.kubectl("apply", "-n", ns, "-f", str(path))
    return [d["metadata"]["name"] for d in yaml.safe_load_all(path.read_text()) if d]


def _wait_running(release: Release, pod: str, ns: str, timeout: float = 120) -> float:
    t0 = time.monotonic()

    def ok() -> bool | None:
        p = release.node.client.get("v1", "Pod", pod, ns)
        st = p.get("status") or {}
        running = st.get("phase") == "Running" and all(
            c.get("ready") for c in st.get("containerStatuses") or [{}]
        )
        return True if running else None

    def why() -> str:
        p = release.node.client.get("v1", "Pod", pod, ns)
        ev = release.node.client.list(
            "v1", "Event", ns, field_selector=f"involvedObject.name={pod}"
        )
        return (
            json.dumps(p.get("status"), indent=1)[-2000:]
            + "\n"
            + "\n".join(f"{e.get('reason')}: {e.get('message')}" for e in ev)
        )

    wait_for(ok, timeout=timeout, interval=0.1, what=f"pod {ns}/{pod} Running", last=why)
    return time.monotonic() - t0


def _claims(release: Release, pod: str, ns: str) -> list[dict[str, Any]]:
    p = release.node.client.get("v1", "Pod", pod, ns)
    names = [
        s["resourceClaimName"] for s in (p.get("status") or {}).get("resourceClaimStatuses", [])
    ]
    return [release.node.client.get("resource.k8s.io/v1", "ResourceClaim", n, ns) for n in names]


def _probe(release: Release, pod: str, ns: str, *allocs: int) -> list[str]:
    """The CUDA probe, run in the pod's container with ``kubectl exec``; its output lines
    without the library's own messages."""
    out = release.node.exec(
        pod,
        ns,
        "env",
        f"FAKE_GPUS={release.host.fake_gpus_env()}",
        localinstall.PROBE_PATH,
        *(str(a) for a in allocs),
    )
    return [ln for ln in out.splitlines() if not ln.startswith("tessera[")]


def _uuid_of(release: Release, result: dict[str, Any]) -> str:
    return release.host.gpus[int(result["device"].split("-")[1])].uuid


def test_hami_pods_are_converted_scheduled_prepared_and_enforced(release: Release) -> None:
    node = release.node
    # The first file alone: `kubectl apply` to Running is issue 20's "first shared pod" figure.
    t0 = time.monotonic()
    pods = {"hami-default": _apply_corpus(release, "hami-default", HAMI_FILES["hami-default"])}
    _wait_running(release, pods["hami-default"][0], "hami-default")
    release.times["first_hami_pod_running_s"] = time.monotonic() - t0
    pods.update(
        {ns: _apply_corpus(release, ns, f) for ns, f in HAMI_FILES.items() if ns not in pods}
    )
    for ns, names in pods.items():
        for p in names:
            _wait_running(release, p, ns)

    # default_use: nvidia.com/gpu 1, gpumem 3000 (MiB), gpucores 30.
    [claim] = _claims(release, "gpu-pod", "hami-default")
    [res] = claim["status"]["allocation"]["devices"]["results"]
    assert res["consumedCapacity"] == {"memory": "3000Mi", "cores": "30"}
    uuid = _uuid_of(release, res)
    limits = node.exec("gpu-pod", "hami-default", "cat", "/etc/tessera/limits").splitlines()
    assert limits[0] == "version 1"
    # HAMi's default GPU_CORE_UTILIZATION_POLICY: work-conserving (docs/enforcement.md 5)
    assert f"gpu {uuid} memory {3000 * MIB} cores 30 policy work-conserving" in limits
    assert node.exec("gpu-pod", "hami-default", "cat", "/etc/ld.so.preload").strip() == (
        "/usr/lib/tessera/libtessera-enforce.so"
    )
    # The share is the process's whole footprint: its CUDA context takes the driver's
    # context-overhead (512 MiB) of the 3000 MiB, allocations the rest.
    assert _probe(release, "gpu-pod", "hami-default", 2000 * MIB, 488 * MIB, MIB) == [
        "preloaded yes",
        "init 0",
        "device 0",
        f"totalmem 0 {3000 * MIB}",
        "ctx 0",
        f"meminfo 0 free={2488 * MIB} total={3000 * MIB}",
        f"alloc {2000 * MIB} 0",
        f"alloc {488 * MIB} 0",
        f"alloc {MIB} 2",
    ]

    # use_sharing_card: 40 % and 60 % of one GPU's memory (80 GB H100: the webhook reads the
    # size from the node agent's slices: what a GPU publishes, its memory less the driver's
    # reserve), cores 60 and 40.
    gpu = release.host.gpus[0]
    gpu_mem = gpu.memory_bytes - gpu.memory_reserved_bytes
    seen = {}
    for pod, pct, cores in (("gpu-pod1", 40, 60), ("gpu-pod2", 60, 40)):
        [claim] = _claims(release, pod, "hami-sharing")
        [res] = claim["status"]["allocation"]["devices"]["results"]
        uuid = _uuid_of(release, res)
        want = gpu_mem * pct // 100
        lines = node.exec(pod, "hami-sharing", "cat", "/etc/tessera/limits").splitlines()
        [gpu_line] = [ln for ln in lines if ln.startswith("gpu ")]
        got = int(gpu_line.split()[3])
        assert gpu_line.split()[1] == uuid and gpu_line.split()[5] == str(cores)
        assert want - MIB < got <= want, (gpu_line, want)
        seen[pod] = uuid
        total = _probe(release, pod, "hami-sharing")[3]
        assert total == f"totalmem 0 {got}"

    # use_memory_fraction: 2 GPUs, 50 % each, cores 30: both devices visible, each limited.
    [claim] = _claims(release, "gpu-pod", "hami-fraction")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2
    env = node.exec("gpu-pod", "hami-fraction", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES").strip()
    assert sorted(env.split(",")) == sorted(_uuid_of(release, r) for r in results)
    lines = node.exec("gpu-pod", "hami-fraction", "cat", "/etc/tessera/limits").splitlines()
    assert len([ln for ln in lines if ln.startswith("gpu ")]) == 2


# ---- the monitor, a real Prometheus and the share alert ---------------------------------------


def test_monitor_exports_each_share_and_the_alert_fires(release: Release, tmp_path: Path) -> None:
    node = release.node
    svc = node.client.get("v1", "Service", f"{RELEASE}-monitor", NS)
    target = f"{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"
    # The alert rules as shipped, with `for:` shortened so that a test sees them fire.
    rules = yaml.safe_load(RULES.read_text())
    for g in rules["groups"]:
        for r in g["rules"]:
            r["for"] = "1s"
    fast = tmp_path / "rules.yaml"
    fast.write_text(yaml.safe_dump(rules))
    [claim] = _claims(release, "gpu-pod", "hami-default")
    cname = claim["metadata"]["name"]
    # Hold 2900 of 3000 MiB (97 %) in the container until the alert fired: the context's
    # 512 MiB and 2388 MiB of allocations.
    kubectl = [str(node.bin_dir / "kubectl"), f"--kubeconfig={node.kubeconfig}"]
    holder = subprocess.Popen(
        [
            *kubectl,
            "exec",
            "-n",
            "hami-default",
            "gpu-pod",
            "--",
            "env",
            f"FAKE_GPUS={release.host.fake_gpus_env()}",
            "PROBE_HOLD=1",
            "/opt/probe/cuda_probe",
            str(2388 * MIB),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        with prometheus(tmp_path / "prom", [target], rule_files=[fast]) as prom:
            used = prom.wait(
                f'tessera_share_memory_used_bytes{{dra_claim_name="{cname}"}}',
                lambda r: len(r) == 1 and float(r[0]["value"][1]) == 2900 * MIB,
                timeout=60,
            )
            assert used[0]["metric"]["dra_claim_namespace"] == "hami-default"
            limit = prom.value(f'tessera_share_memory_limit_bytes{{dra_claim_name="{cname}"}}')
            assert limit == 3000 * MIB
            hami = prom.query('hami_vgpu_memory_used_bytes{namespace="hami-default",pod="gpu-pod"}')
            assert [float(s["value"][1]) for s in hami] == [2900 * MIB]
            hami_limit = prom.query(
                'hami_vgpu_memory_limit_bytes{namespace="hami-default",pod="gpu-pod"}'
            )
            assert [float(s["value"][1]) for s in hami_limit] == [3000 * MIB]
            # Every share of the HAMi pods has a limit series.
            limits = prom.query("tessera_share_memory_limit_bytes")
            assert {s["metric"]["dra_claim_namespace"] for s in limits} >= set(HAMI_FILES)
            firing = prom.wait(
                'ALERTS{alertname="TesseraShareNearMemoryLimit",alertstate="firing"}',
                lambda r: len(r) == 1,
                timeout=60,
            )
            assert firing[0]["metric"]["dra_claim_name"] == cname
    finally:
        holder.kill()
        holder.wait()


# ---- deleting pods leaves nothing ------------------------------------------------------------


def test_deleted_pods_leave_no_spec_limits_region_claim_or_template(release: Release) -> None:
    node = release.node
    uids = []
    for ns in HAMI_FILES:
        for p in node.client.list("v1", "Pod", ns):
            for c in _claims(release, p["metadata"]["name"], ns):
                uids.append(c["metadata"]["uid"])
    assert len(uids) == 4
    for ns in HAMI_FILES:
        node.kubectl(
            "delete", "pods", "--all", "-n", ns, "--grace-period=1", "--wait=true", timeout=120
        )
    state = Path(release.values["driver"]["stateDir"])

    def gone() -> bool | None:
        specs = list(node.cdi_spec_dir.glob(f"{DRIVER_NAME}-claim_*.json"))
        dirs = list(claims_dir(state).iterdir()) if claims_dir(state).is_dir() else []
        claims = [
            c
            for ns in HAMI_FILES
            for c in node.client.list("resource.k8s.io/v1", "ResourceClaim", ns)
        ]
        return True if not specs and not dirs and not claims else None

    wait_for(gone, timeout=60, what="CDI specs, claim directories and claims to go")
    # The webhook's templates: collected once unused (here: deleted by the uninstall below,
    # and by the collector after its grace); none belongs to a pod any more.
    for ns in HAMI_FILES:
        for t in node.client.list("resource.k8s.io/v1", "ResourceClaimTemplate", ns):
            assert TEMPLATE_LABEL in t["metadata"].get("labels", {})


# ---- helm upgrade while HAMi pods are created -------------------------------------------------


def _create_and_time(release: Release, ns: str, names: list[str], gap: float) -> dict[str, float]:
    """Create HAMi pods one every ``gap`` seconds; the seconds each took to Running. A pod the
    API server refuses (the webhook unreachable) fails the test."""
    times: dict[str, float] = {}
    errors: list[str] = []
    threads = []
    for n in names:
        t0 = time.monotonic()
        try:
            release.node.client.create(
                localinstall.hami_pod(
                    n,
                    ns,
                    "ubuntu:22.04",
                    gpumem=1000,
                    gpucores=5,
                    command=("bash", "-c", "sleep 86400"),
                )
            )
        except ApiError as e:
            errors.append(f"{n}: {e}")
            continue

        def watch(n: str = n, t0: float = t0) -> None:
            _wait_running(release, n, ns, timeout=180)
            times[n] = time.monotonic() - t0

        th = threading.Thread(target=watch)
        th.start()
        threads.append(th)
        time.sleep(gap)
    for th in threads:
        th.join()
    assert not errors, errors
    assert set(times) == set(names)
    return times


def test_upgrade_rolls_node_agent_and_webhook_without_refusing_or_delaying_pods(
    release: Release,
) -> None:
    node = release.node
    ns = "hami-roll"
    node.kubectl("create", "namespace", ns, check=False)
    base = _create_and_time(release, ns, [f"base-{i}" for i in range(4)], 0.5)
    node.kubectl(
        "delete", "pods", "--all", "-n", ns, "--grace-period=1", "--wait=true", timeout=120
    )
    before = {p["metadata"]["name"] for p in release.pods()}
    values = json.loads(json.dumps(release.values))
    values["node"]["podAnnotations"] = {"tessera.test/rev": "2"}
    values["webhook"] = {"podAnnotations": {"tessera.test/rev": "2"}}
    done: list[str] = []
    upgrader = threading.Thread(
        target=lambda: done.append(
            release.helm(
                "upgrade",
                RELEASE,
                str(localinstall.chart_dir()),
                "-n",
                NS,
                "--wait",
                "--timeout",
                "300s",
                values=values,
            )
        )
    )
    upgrader.start()
    rolled = _create_and_time(release, ns, [f"roll-{i}" for i in range(12)], 1.0)
    upgrader.join()
    assert done, "helm upgrade did not finish"
    # An old pod may still be ending (the webhook drains for webhook.drainSeconds): replaced
    # means every pod of before is gone or being deleted.
    after = {
        p["metadata"]["name"] for p in release.pods() if not p["metadata"].get("deletionTimestamp")
    }
    assert not (before & after), "the upgrade did not replace every Tessera pod"
    slowest_base = max(base.values())
    release.times["roll_slowest_s"] = max(rolled.values())
    release.times["no_roll_slowest_s"] = slowest_base
    assert max(rolled.values()) <= slowest_base + 5, (base, rolled)
    node.kubectl(
        "delete", "pods", "--all", "-n", ns, "--grace-period=1", "--wait=true", timeout=120
    )


# ---- helm uninstall ----------------------------------------------------------------------------


def test_uninstall_leaves_nothing_of_tesseras(release: Release) -> None:
    node = release.node
    release.times["uninstall_pods_gone_s"] = release.uninstall()
    c = node.client
    assert release.left((*RELEASE_KINDS, ("v1", "Service"), ("v1", "Secret"))) == {}
    assert release.left((*CLUSTER_KINDS, ("resource.k8s.io/v1", "DeviceClass")), None) == {}
    templates = [
        f"{t['metadata']['namespace']}/{t['metadata']['name']}"
        for t in c.list("resource.k8s.io/v1", "ResourceClaimTemplate")
        if TEMPLATE_LABEL in t["metadata"].get("labels", {})
    ]
    assert templates == []
    # The kubelet deletes a driver's slices 30 s after its last instance unregistered (the
    # kubelet's wiping delay, which keeps the GPUs published across a node agent's restart).
    t0 = time.monotonic()
    wait_for(
        lambda: (
            None
            if c.list(
                "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.driver={DRIVER_NAME}"
            )
            else True
        ),
        timeout=90,
        what="the kubelet to delete the node agent's ResourceSlices",
    )
    release.times["uninstall_slices_gone_s"] = time.monotonic() - t0
    assert list(node.cdi_spec_dir.glob(f"{DRIVER_NAME}-*")) == []
    assert not list(node.plugins_registry_dir.glob(f"{DRIVER_NAME}*"))
