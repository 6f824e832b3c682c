"""``helm install --set mode=both`` on this machine as a real node of a cluster that serves
``resource.k8s.io`` (the session's ``kube_node``), the node given to legacy mode
(``gpu.tessera.dev/mode=legacy``): the chart's DeviceClass ``gpu.tessera.dev`` maps
``nvidia.com/gpu`` (KEP-5004) while legacy mode's device plugin offers ``nvidia.com/gpu`` slots
on the node. A corpus HAMi pod in a namespace labelled for legacy mode is sent to the legacy
scheduler by the webhook, bound through the extender (the chart's profile runs without the
DynamicResources plugin, which would refuse the node: docs/install.md, "Mode both and
``nvidia.com/gpu``"), allocated by the device plugin and enforced in its container; the DRA node
agent stays off the legacy node. ``helm uninstall`` then leaves none of the release's objects.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tessera import DRIVER_NAME
from tessera.convert.hami import BIND_PHASE, DEVICES_ALLOCATED, VGPU_NODE, decode_pod_devices
from tessera.kube.workloads import wait_for
from tessera.localcluster import images, localinstall

from .conftest import LiveNode
from .test_install import (
    CLUSTER_KINDS,
    HAMI_FILES,
    MIB,
    RELEASE_KINDS,
    Release,
    _apply_corpus,
    _probe,
)
from .test_install import _wait_running as wait_running
from .test_install_legacy import (
    MODE_LABEL,
    SCHEDULER,
    SPLIT,
    _allocatable_gpus,
    _component_log,
    delete_pods_and_wait_for_their_files,
)

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.install, pytest.mark.legacy]

LEGACY_NS = "hami-legacy"


@pytest.fixture(scope="module")
def release(kube_node: LiveNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    node = kube_node
    work = tmp_path_factory.mktemp("install-both")
    state = node.cluster.state_dir / "tessera-install-both"
    built = images.build_project_image()
    images.import_image(node.node.ctr, node.node.containerd_socket, built)
    localinstall.kube_scheduler_image(node.node)
    host = localinstall.make_fake_gpu_host(state / "fake-gpus")
    localinstall.probe_image(node.node, "docker.io/library/ubuntu:22.04", host, work / "probe")
    gpu_key, gpu_value = localinstall.GPU_NODE_LABEL
    key, value = MODE_LABEL
    node.kubectl(
        "label", "node", node.name, f"{key}={value}", f"{gpu_key}={gpu_value}", "--overwrite"
    )
    values = localinstall.chart_values(node.node, host, built.ref, state)
    values["mode"] = "both"
    values["legacy"] = {
        "devicePlugin": {"split": SPLIT},
        "scheduler": {
            "image": {"repository": localinstall.KUBE_SCHEDULER_REPOSITORY, "pullPolicy": "Never"}
        },
    }
    rel = Release(node, host, values, work, state)
    try:
        with rel.installed(min_pods=5, timeout=240):
            yield rel
    finally:
        node.kubectl("label", "node", node.name, f"{key}-", f"{gpu_key}-", check=False)
        node.kubectl("delete", "namespace", LEGACY_NS, "--wait=false", check=False)


def test_a_legacy_node_in_mode_both_runs_hami_pods_beside_the_gpu_class(
    release: Release,
) -> None:
    node = release.node
    by = sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in release.pods())
    # No DRA node agent: the only node is a legacy one.
    assert by == ["device-plugin", "legacy-scheduler", "monitor", "webhook", "webhook"]
    dc = node.client.get("resource.k8s.io/v1", "DeviceClass", DRIVER_NAME)
    assert dc["spec"]["extendedResourceName"] == "nvidia.com/gpu"
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
    node.kubectl("create", "namespace", LEGACY_NS)
    key, value = MODE_LABEL
    node.kubectl("label", "namespace", LEGACY_NS, f"{key}={value}")
    [name] = _apply_corpus(release, LEGACY_NS, HAMI_FILES["hami-default"])
    wait_running(release, name, LEGACY_NS, timeout=180)
    got = node.client.get("v1", "Pod", name, LEGACY_NS)
    assert got["spec"]["schedulerName"] == SCHEDULER and not got["spec"].get("resourceClaims")
    ann = got["metadata"]["annotations"]
    assert ann[VGPU_NODE] == node.name and ann[BIND_PHASE] == "success", ann
    [[device]] = decode_pod_devices(ann[DEVICES_ALLOCATED])
    assert (device.memory_mib, device.cores) == (3000, 30)
    limits = node.exec(name, LEGACY_NS, "cat", "/etc/tessera/limits").splitlines()
    assert f"gpu {device.uuid} memory {3000 * MIB} cores 30" in limits
    probe = _probe(release, name, LEGACY_NS, 2488 * MIB, MIB)
    assert probe[3:] == [
        f"totalmem 0 {3000 * MIB}",
        "ctx 0",
        f"meminfo 0 free={2488 * MIB} total={3000 * MIB}",
        f"alloc {2488 * MIB} 0",
        f"alloc {MIB} 2",
    ]
    # The device plugin removes the deleted pod's files before the release goes (else the CDI
    # spec stays on the node: the next device plugin does not know it).
    delete_pods_and_wait_for_their_files(release, [LEGACY_NS])


def test_uninstall_of_mode_both_leaves_none_of_the_releases_objects(release: Release) -> None:
    release.uninstall()
    assert release.left(RELEASE_KINDS) == {}
    assert release.left((*CLUSTER_KINDS, ("resource.k8s.io/v1", "DeviceClass")), None) == {}
