"""Legacy mode as a user installs it (``helm install --set mode=legacy``), on a cluster that
does not serve ``resource.k8s.io`` at all (``tessera cluster up --kubelet`` with
``resource_api=False``: kube-apiserver v1.37.2 with ``--runtime-config=resource.k8s.io/v1=false``;
:data:`tessera.localcluster.cluster.NO_RESOURCE_API_RUNTIME_CONFIG` says what else that takes),
with this machine as its real node and fake GPUs (the project's fake NVML and libcuda).

The chart's own pods run from the images made here: Tessera's (``make image``) and legacy
mode's kube-scheduler, the project's static binary alone in an image
(:func:`tessera.localcluster.localinstall.kube_scheduler_image`), both imported into the node's
containerd. In order, sharing one release:

1. ``helm install`` → the device plugin, the monitor, the legacy scheduler (kube-scheduler and
   ``tessera extender --legacy``) and two webhook replicas are Ready; the device plugin has
   registered with the kubelet: the Node's allocatable ``nvidia.com/gpu`` is GPUs x split and
   its ``hami.io/node-nvidia-register`` names every GPU.
2. HAMi pods from ``shared/corpus/hami-pods``, applied unchanged → the chart's webhook gives
   them ``schedulerName: tessera-legacy`` → the chart's kube-scheduler binds them through the
   extender (its decision on the pod) → the chart's device plugin allocates → inside each
   container the limits file, the preloaded library and the CUDA probe see the decision.
3. The chart's monitor (``--no-api``) exports each share's limit under Tessera's and HAMi's
   names, read through its Service.
4. Pods deleted → no claim directory, record or CDI spec is left.
5. ``helm uninstall`` leaves no pod, workload, identity, webhook configuration or plugin socket,
   and the node offers no ``nvidia.com/gpu`` any more.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from corpus_paths import corpus_path
from tessera.api.quantity import Quantity
from tessera.convert.hami import BIND_PHASE, DEVICES_ALLOCATED, VGPU_NODE, decode_pod_devices
from tessera.enforcement.layout import claims_dir
from tessera.inventory.node import HAMI_REGISTER
from tessera.kube.workloads import wait_for
from tessera.localcluster import cluster, images, localinstall

from .conftest import LiveNode, live_node
from .test_install import (
    CLUSTER_KINDS,
    HAMI_FILES,
    MIB,
    NS,
    RELEASE,
    RELEASE_KINDS,
    Release,
    _apply_corpus,
    _probe,
)
from .test_install import _wait_running as wait_running

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.install, pytest.mark.legacy]

MODE_LABEL = ("gpu.tessera.dev/mode", "legacy")
SCHEDULER = "tessera-legacy"
SPLIT = 10
#: The device plugin's socket (the chart's legacy.devicePlugin.socket) and its records dir.
SOCKET = "tessera-gpu.sock"
#: The kubelet's device-plugin directory: a constant of the kubelet (not under its root dir).
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
RECORDS = "deviceplugin"


@pytest.fixture(scope="module")
def no_resource_api_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveNode]:
    """This machine as the real node of a cluster without ``resource.k8s.io`` (its tests run
    before the session's ``kube_node``: conftest's ``OWN_NODE_FIXTURES``)."""
    with live_node(tmp_path_factory, resource_api=False) as node:
        yield node


@pytest.fixture(scope="module")
def release(
    no_resource_api_node: LiveNode, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    node = no_resource_api_node
    groups = {g["name"] for g in node.client.request("GET", "/apis", what="API groups")["groups"]}
    assert "resource.k8s.io" not in groups and "apps" in groups
    work = tmp_path_factory.mktemp("install-legacy")
    state = node.cluster.state_dir / "tessera-install"
    built = images.build_project_image()
    images.import_image(node.node.ctr, node.node.containerd_socket, built)
    scheduler = localinstall.kube_scheduler_image(node.node)
    host = localinstall.make_fake_gpu_host(state / "fake-gpus")
    for ref in ("docker.io/library/ubuntu:22.04", "docker.io/library/ubuntu:18.04"):
        localinstall.probe_image(node.node, ref, host, work / "probe")
    key, value = MODE_LABEL
    node.kubectl("label", "node", node.name, f"{key}={value}", "--overwrite")
    values = localinstall.chart_values(node.node, host, built.ref, state)
    values["mode"] = "legacy"
    values["legacy"] = {
        "devicePlugin": {"split": SPLIT, "socket": SOCKET},
        "scheduler": {
            # The tag stays the chart's default: the API server's version, which is the
            # binary's (v1.37.2) and so the image's tag.
            "image": {"repository": localinstall.KUBE_SCHEDULER_REPOSITORY, "pullPolicy": "Never"},
            "extraArgs": list(cluster.NO_RESOURCE_API_SCHEDULER_FLAGS),
        },
    }
    rel = Release(node, host, values, work, state)
    print(f"legacy scheduler image: {scheduler.ref} ({scheduler.config_digest})")
    try:
        with rel.installed(min_pods=5, timeout=240):
            yield rel
    finally:
        node.kubectl("label", "node", node.name, f"{key}-", check=False)


def _component_log(release: Release, component: str) -> str:
    return "\n".join(
        release.node.kubectl(
            "logs", "-n", NS, p["metadata"]["name"], "--all-containers", check=False
        ).stdout
        for p in release.pods(component)
    )


def _allocatable_gpus(node: LiveNode) -> str | None:
    n = node.client.get("v1", "Node", node.name)
    return (n.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu")


def test_legacy_pods_run_from_the_images_and_the_device_plugin_registers(
    release: Release,
) -> None:
    node = release.node
    pods = release.pods()
    by = sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods)
    assert by == ["device-plugin", "legacy-scheduler", "monitor", "webhook", "webhook"]
    images_run = {c["name"]: c["image"] for p in pods for c in p["spec"]["containers"]}
    tessera = f"{release.values['image']['repository']}:{release.values['image']['tag']}"
    assert images_run.pop("kube-scheduler") == f"{localinstall.KUBE_SCHEDULER_REPOSITORY}:v1.37.2"
    assert set(images_run.values()) == {tessera}
    # The device plugin registered with the kubelet: GPUs x split slots, and the GPUs in
    # HAMi's register annotation.
    want = str(len(release.host.gpus) * SPLIT)
    wait_for(
        lambda: True if _allocatable_gpus(node) == want else None,
        timeout=60,
        what=f"Node allocatable nvidia.com/gpu = {want}",
        last=lambda: (
            f"{_allocatable_gpus(node)}; the device plugin's log:\n"
            + _component_log(release, "device-plugin")[-3000:]
        ),
    )
    ann = node.client.get("v1", "Node", node.name)["metadata"]["annotations"][HAMI_REGISTER]
    assert all(g.uuid in ann for g in release.host.gpus), ann[:500]
    assert (DEVICE_PLUGIN_DIR / SOCKET).is_socket()
    # The legacy scheduler runs its profile: it holds its Lease.
    lease = node.client.get("coordination.k8s.io/v1", "Lease", f"{RELEASE}-legacy-scheduler", NS)
    [sched_pod] = release.pods("legacy-scheduler")
    assert lease["spec"]["holderIdentity"].startswith(sched_pod["metadata"]["name"])


# ---- HAMi pods through the chart's webhook, scheduler, extender and device plugin --------------


def _limits(node: LiveNode, pod: str, ns: str) -> list[str]:
    return node.exec(pod, ns, "cat", "/etc/tessera/limits").splitlines()


def test_hami_pods_are_sent_to_the_legacy_scheduler_bound_allocated_and_enforced(
    release: Release,
) -> None:
    node = release.node
    pods = {ns: _apply_corpus(release, ns, f) for ns, f in HAMI_FILES.items()}
    for ns, names in pods.items():
        for p in names:
            wait_running(release, p, ns, timeout=180)
    usable = release.host.gpus[0].memory_bytes - release.host.gpus[0].memory_reserved_bytes
    for ns, names in pods.items():
        docs = [
            d
            for d in yaml.safe_load_all((corpus_path() / "hami-pods" / HAMI_FILES[ns]).read_text())
            if d and d.get("kind") == "Pod"
        ]
        for name, doc in zip(names, docs, strict=True):
            got = node.client.get("v1", "Pod", name, ns)
            # The webhook kept the requests and chose the legacy scheduler.
            assert got["spec"]["schedulerName"] == SCHEDULER
            [c] = got["spec"]["containers"]
            lim = doc["spec"]["containers"][0]["resources"]["limits"]
            assert {k: Quantity.parse(v) for k, v in c["resources"]["limits"].items()} == {
                k: Quantity.parse(v) for k, v in lim.items()
            }
            assert not got["spec"].get("resourceClaims")
            # The extender decided and bound; the device plugin allocated.
            ann = got["metadata"]["annotations"]
            assert ann[VGPU_NODE] == node.name and ann[BIND_PHASE] == "success", ann
            [devices] = decode_pod_devices(ann[DEVICES_ALLOCATED])
            assert len(devices) == int(lim["nvidia.com/gpu"])
            mib = (
                int(lim["nvidia.com/gpumem"])
                if "nvidia.com/gpumem" in lim
                else usable // MIB * int(lim["nvidia.com/gpumem-percentage"]) // 100
            )
            assert {d.memory_mib for d in devices} == {mib}, (name, devices)
            assert {d.cores for d in devices} == {int(lim.get("nvidia.com/gpucores", 0))}
            limits = _limits(node, name, ns)
            assert limits[0] == "version 1"
            assert f"claim {ns}/{name} {got['metadata']['uid']}-0" in limits
            assert [ln for ln in limits if ln.startswith("gpu ")] == [
                f"gpu {d.uuid} memory {d.memory_mib * MIB} cores {d.cores}" for d in devices
            ]
            env = node.exec(name, ns, "sh", "-c", "echo $CUDA_VISIBLE_DEVICES").strip()
            assert sorted(env.split(",")) == sorted(d.uuid for d in devices)
            # kube-scheduler's binding event is the legacy profile's.
            events = node.client.list(
                "v1", "Event", ns, field_selector=f"involvedObject.name={name},reason=Scheduled"
            )
            assert {e.get("reportingComponent") or e["source"]["component"] for e in events} == {
                SCHEDULER
            }, events
    # default_use: 3000 MiB and 30 %: the context takes the driver's context-overhead
    # (512 MiB) of the share, allocations the rest, one MiB more is refused.
    assert node.exec("gpu-pod", "hami-default", "cat", "/etc/ld.so.preload").strip() == (
        "/usr/lib/tessera/libtessera-enforce.so"
    )
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


# ---- the monitor ---------------------------------------------------------------------------


def _series(release: Release, metric: str) -> list[dict[str, str]]:
    svc = release.node.client.get("v1", "Service", f"{RELEASE}-monitor", NS)
    url = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return [
        {**s.labels, "value": str(s.value)}
        for s in (fams[metric].samples if metric in fams else [])
    ]


def test_monitor_exports_each_legacy_share(release: Release) -> None:
    node = release.node
    want: dict[tuple[str, str, str], float] = {}
    for ns in HAMI_FILES:
        for p in node.client.list("v1", "Pod", ns):
            [devices] = decode_pod_devices(p["metadata"]["annotations"][DEVICES_ALLOCATED])
            for d in devices:
                want[(ns, p["metadata"]["name"], d.uuid)] = float(d.memory_mib * MIB)
    assert len({k[:2] for k in want}) == 4

    def hami() -> dict[tuple[str, str, str], float] | None:
        got = {
            (x["namespace"], x["pod"], x["device_uuid"]): float(x["value"])
            for x in _series(release, "hami_vgpu_memory_limit_bytes")
        }
        return got if got == want else None

    wait_for(
        hami,
        timeout=60,
        what="the monitor's hami_vgpu_memory_limit_bytes of each legacy pod and GPU",
        last=lambda: json.dumps(_series(release, "hami_vgpu_memory_limit_bytes"))[-3000:],
    )
    shares = {
        (x["namespace"], x["pod"]): float(x["value"])
        for x in _series(release, "tessera_share_memory_limit_bytes")
    }
    assert set(shares) == {k[:2] for k in want}


# ---- deleting pods, uninstalling ------------------------------------------------------------


def _left(release: Release) -> list[str]:
    state = Path(release.values["driver"]["stateDir"])
    return sorted(
        str(p)
        for p in [
            *(claims_dir(state).glob("*") if claims_dir(state).is_dir() else []),
            *(state / RECORDS).glob("*.json"),
            *release.node.cdi_spec_dir.glob("*claim_*"),
        ]
    )


def delete_pods_and_wait_for_their_files(release: Release, namespaces: Iterable[str]) -> None:
    """Delete every pod of ``namespaces``, then wait until the device plugin has removed their
    claim directories, records and CDI specs (:func:`_left` empty)."""
    for ns in namespaces:
        release.node.kubectl(
            "delete", "pods", "--all", "-n", ns, "--grace-period=1", "--wait=true", timeout=120
        )
    wait_for(
        lambda: True if not _left(release) else None,
        timeout=90,
        what="the device plugin to remove the deleted pods' files",
        last=lambda: str(_left(release)),
    )


def test_deleted_pods_leave_no_claim_directory_record_or_spec(release: Release) -> None:
    assert _left(release)
    delete_pods_and_wait_for_their_files(release, HAMI_FILES)


def test_uninstall_leaves_nothing_of_tesseras(release: Release) -> None:
    node = release.node
    release.uninstall()
    c = node.client
    roles = (
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    )
    assert release.left((*RELEASE_KINDS, ("v1", "Service"), ("v1", "Secret"), *roles)) == {}
    assert release.left(CLUSTER_KINDS, None) == {}
    left = [
        o["metadata"]["name"]
        for o in c.list("rbac.authorization.k8s.io/v1", "RoleBinding", "kube-system")
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == RELEASE
    ]
    assert left == []
    assert not (DEVICE_PLUGIN_DIR / SOCKET).exists()
    # The kubelet keeps the resource at 0 once the plugin is gone. (The Node's hami.io
    # annotations stay, as the device plugin leaves them: docs/legacy.md, "Moving a node".)
    wait_for(
        lambda: True if _allocatable_gpus(node) in (None, "0") else None,
        timeout=60,
        what="Node allocatable nvidia.com/gpu to drop to 0",
        last=lambda: str(_allocatable_gpus(node)),
    )
