"""Legacy mode's device plugin on a real node (kubelet v1.37 + containerd 2.x + runc): the
kubelet registers ``tessera device-plugin`` (fake NVML: the 8x H100 80GB HBM3 of a corpus
inventory), the Node gets its ``nvidia.com/gpu`` slots and HAMi's register annotation, and a
HAMi example pod from the corpus, carrying the annotations the scheduler extender writes,
starts with the annotated share enforced **inside the container** (the fake-libcuda probe of
``test_driver_kubelet``); after its deletion nothing of it is left on the node."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.convert.hami import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    ContainerDevice,
    encode_pod_devices,
)
from tessera.deviceplugin.allocate import NODE_LOCK
from tessera.deviceplugin.register import HANDSHAKE_ANNOTATION, REGISTER_ANNOTATION
from tessera.driver.guard import MODE_LABEL
from tessera.enforcement.limits import DEFAULT_CONTEXT_OVERHEAD
from tessera.inventory import load_inventory
from tessera.inventory.hami import raw_gpus_from_hami
from tessera.kube.workloads import delete_pod, wait_for

from .conftest import CORPUS, LiveNode
from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import H100, nvml_config, write_atomically
from .test_driver_kubelet import fake_gpus_env, probe_image, section, wait_log

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.legacy]

__all__ = ["probe_image"]  # a fixture of this module too

CTX = DEFAULT_CONTEXT_OVERHEAD
MIB = 1 << 20
SPLIT = 10
#: The kubelet's device manager directory: fixed, whatever its --root-dir.
KUBELET_DIR = Path("/var/lib/kubelet")
DRIVER = "gpu.tessera.dev"


class DevicePluginProcess:
    """``tessera device-plugin`` for the real node, as a child process; ``root`` holds its
    state dir, stand-in device nodes and fake-NVML config."""

    def __init__(self, node: LiveNode, root: Path, nvml_lib: Path) -> None:
        self.root = root
        self.state = root / "state"
        self.gpus = load_inventory(H100)
        dev = root / "devroot" / "dev"
        dev.mkdir(parents=True)
        for name in [f"nvidia{g.index}" for g in self.gpus] + ["nvidiactl", "nvidia-uvm"]:
            os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 3))
        self.nvml_cfg = root / "nvml.cfg"
        self.nvml_cfg.write_text(nvml_config(self.gpus))
        self.log = root / "device-plugin.log"
        argv = [
            sys.executable,
            "-m",
            "tessera",
            "device-plugin",
            "--node-name",
            node.name,
            "--kubeconfig",
            str(node.kubeconfig),
            "--kubelet-dir",
            str(KUBELET_DIR),
            "--split",
            str(SPLIT),
            "--cdi-dir",
            str(node.cdi_spec_dir),
            "--state-dir",
            str(self.state),
            "--dev-root",
            str(root / "devroot"),
            "--nvml-library",
            str(nvml_lib),
            "--reconcile-seconds",
            "2",
            "--rescan-seconds",
            "1",
        ]
        self.argv = argv
        self.start()

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env={**os.environ, "FAKE_NVML_CONFIG": str(self.nvml_cfg)},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def wait_registered(self, node: LiveNode, timeout: float = 90) -> None:
        """Until this process registered with the kubelet (a plugin stopped before leaves the
        Node's capacity), the Node has its register annotation and all slots are allocatable."""
        want = str(SPLIT * len(self.gpus))

        def registered() -> bool | None:
            if "registered nvidia.com/gpu with the kubelet" not in self.output:
                return None
            n = node.client.get("v1", "Node", node.name)
            if REGISTER_ANNOTATION not in (n["metadata"].get("annotations") or {}):
                return None
            return True if gpu_allocatable(node) == want else None

        wait_for(
            registered,
            timeout=timeout,
            interval=0.5,
            what=f"the device plugin registered, its annotation and {want} slots allocatable",
        )

    def kill9(self) -> None:
        """SIGKILL (nothing of the process runs after it), then start it again."""
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.start()

    @property
    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def gpu_capacity(node: LiveNode, field: str = "capacity") -> str | None:
    n = node.client.get("v1", "Node", node.name)
    return ((n.get("status") or {}).get(field) or {}).get("nvidia.com/gpu")


def gpu_allocatable(node: LiveNode) -> str | None:
    return gpu_capacity(node, "allocatable")


def _label(node: LiveNode, mode: str | None) -> None:
    node.client.request(
        "PATCH",
        f"/api/v1/nodes/{node.name}",
        body={"metadata": {"labels": {MODE_LABEL: mode}}},
        content_type="application/merge-patch+json",
    )


@pytest.fixture(scope="module")
def device_plugin(kube_node: LiveNode, fake_nvml_lib: Path) -> Iterator[DevicePluginProcess]:
    root = Path(tempfile.mkdtemp(prefix="tessera-dp-", dir="/tmp"))
    # The node moves to legacy mode (docs/legacy.md, "Moving a node"): labelled, and the node
    # driver's ResourceSlices of earlier tests gone (its guard counts them).
    _label(kube_node, "legacy")
    for s in kube_node.client.list(
        "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.nodeName={kube_node.name}"
    ):
        kube_node.client.delete("resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"])
    dp = DevicePluginProcess(kube_node, root, fake_nvml_lib)
    try:
        try:
            dp.wait_registered(kube_node)
        except Exception:
            pytest.fail(
                f"the kubelet did not register the device plugin; its log:\n{dp.output[-4000:]}"
            )
        yield dp
    finally:
        dp.stop()
        shutil.rmtree(root, ignore_errors=True)
        _label(kube_node, None)
        # Leave the node as a DRA node again for the session's other tests: the node driver's
        # start-up guard refuses a node with HAMi's annotations or a device plugin's GPUs.
        kube_node.client.request(
            "PATCH",
            f"/api/v1/nodes/{kube_node.name}",
            body={
                "metadata": {"annotations": {REGISTER_ANNOTATION: None, HANDSHAKE_ANNOTATION: None}}
            },
            content_type="application/merge-patch+json",
        )
        wait_for(
            lambda: True if gpu_allocatable(kube_node) in (None, "0") else None,
            timeout=60,
            interval=0.5,
            what="the kubelet to take the stopped plugin's nvidia.com/gpu out of allocatable",
        )


def test_the_kubelet_registers_the_slots_and_the_node_its_gpus(
    kube_node: LiveNode, device_plugin: DevicePluginProcess
) -> None:
    node, dp = kube_node, device_plugin
    assert gpu_capacity(node) == str(SPLIT * len(dp.gpus)) == "80"
    n = node.client.get("v1", "Node", node.name)
    raws = raw_gpus_from_hami(
        n["metadata"]["annotations"][REGISTER_ANNOTATION], f"Node {node.name}"
    )
    assert [(r.index, r.uuid, r.product_name, r.memory) for r in raws] == [
        (g.index, g.uuid, g.product_name, str((g.usable_memory_bytes or 0) // MIB)) for g in dp.gpus
    ]
    assert (KUBELET_DIR / "device-plugins" / "tessera-gpu.sock").exists()


def test_the_plugin_registers_again_after_a_kubelet_restart(
    kube_node: LiveNode, device_plugin: DevicePluginProcess
) -> None:
    node, dp = kube_node, device_plugin
    said = "registered nvidia.com/gpu with the kubelet"
    before = dp.output.count(said)
    assert before >= 1
    node.cluster.restart_component("kubelet")
    # a restarted kubelet empties its device-plugin directory and counts no device of a plugin
    # until the plugin registers again
    wait_for(
        lambda: True if dp.output.count(said) > before else None,
        timeout=60,
        what="the device plugin to register again with the restarted kubelet",
        last=lambda: dp.output[-2000:],
    )
    wait_for(
        lambda: True if gpu_allocatable(node) == "80" else None,
        timeout=60,
        interval=0.5,
        what="the restarted kubelet's allocatable nvidia.com/gpu to be 80 again",
    )
    assert dp.proc.poll() is None


def test_a_lost_gpu_takes_its_slots_out_of_allocatable(
    kube_node: LiveNode, device_plugin: DevicePluginProcess
) -> None:
    node, dp = kube_node, device_plugin
    lost = dp.gpus[7].uuid

    def register_health() -> dict[str, bool]:
        n = node.client.get("v1", "Node", node.name)
        return {
            str(g["id"]): bool(g["health"])
            for g in json.loads(n["metadata"]["annotations"][REGISTER_ANNOTATION])
        }

    write_atomically(dp.nvml_cfg, nvml_config(dp.gpus, lost=[lost]))
    try:
        wait_for(
            lambda: True if gpu_allocatable(node) == "70" else None,
            timeout=60,
            interval=0.5,
            what="allocatable nvidia.com/gpu to be 70 with one of 8 GPUs lost",
            last=lambda: dp.output[-2000:],
        )
        assert register_health() == {g.uuid: g.uuid != lost for g in dp.gpus}
        assert gpu_capacity(node) == "80"  # unhealthy slots stay in capacity
    finally:
        write_atomically(dp.nvml_cfg, nvml_config(dp.gpus))
    wait_for(
        lambda: True if gpu_allocatable(node) == "80" else None,
        timeout=60,
        interval=0.5,
        what="allocatable nvidia.com/gpu to be 80 again once the GPU answers",
    )
    assert all(register_health().values())


def hami_pod(ns: str, image: str, dp: DevicePluginProcess, node: str, uuid: str) -> dict[str, Any]:
    """HAMi's ``examples/nvidia/default_use.yaml`` (nvidia.com/gpu 1, gpumem 3000, gpucores 30,
    unchanged) running the probe, with the extender's decision for ``uuid`` on it."""
    pod = copy.deepcopy(
        yaml.safe_load(
            (CORPUS / "hami-pods" / "HAMi__examples_nvidia__default_use.yaml").read_text()
        )
    )
    [c] = pod["spec"]["containers"]
    limits = c["resources"]["limits"]
    memory, cores = int(limits["nvidia.com/gpumem"]), int(limits["nvidia.com/gpucores"])
    script = (
        "echo '--- limits'; cat /etc/tessera/limits; echo '--- preload'; cat /etc/ld.so.preload; "
        "echo '--- env'; echo \"CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES\"; "
        f"echo '--- probe'; /opt/probe/cuda_probe {memory * MIB - CTX} {MIB}; echo '--- done'; "
        "sleep 3600"
    )
    c.update(
        image=image,
        imagePullPolicy="Never",
        command=["/bin/sh", "-c", script],
        env=[{"name": "FAKE_GPUS", "value": fake_gpus_env(dp)}],
    )
    decision = encode_pod_devices([[ContainerDevice(uuid, "NVIDIA", memory, cores)]])
    pod["metadata"].update(
        namespace=ns,
        annotations={
            VGPU_NODE: node,
            DEVICES_TO_ALLOCATE: decision,
            DEVICES_ALLOCATED: decision,
            BIND_PHASE: "allocating",
            BIND_TIME: str(int(time.time())),
        },
    )
    pod["spec"].update(
        nodeName=node, terminationGracePeriodSeconds=1, automountServiceAccountToken=False
    )
    return pod


def test_a_hami_pod_gets_the_annotated_share_and_leaves_nothing(
    kube_node: LiveNode, device_plugin: DevicePluginProcess, probe_image: str, node_namespace: str
) -> None:
    node, dp, ns = kube_node, device_plugin, node_namespace
    uuid = dp.gpus[2].uuid
    # the extender's node lock, held for this pod until its Allocate ends (hami.md §1.7)
    lock = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())},{ns},gpu-pod"
    node.client.request(
        "PATCH",
        f"/api/v1/nodes/{node.name}",
        body={"metadata": {"annotations": {NODE_LOCK: lock}}},
        content_type="application/merge-patch+json",
    )
    pod = node.client.create(hami_pod(ns, probe_image, dp, node.name, uuid))
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    log = wait_log(node, name, ns, "--- done")
    assert section(log, "limits") == [
        "version 1",
        f"claim {ns}/{name} {uid}-0",
        "region /run/tessera/region",
        f"context-overhead {CTX}",
        "shares /run/tessera/shares",
        f"gpu {uuid} memory {3000 * MIB} cores 30",
    ]
    assert section(log, "preload") == ["/usr/lib/tessera/libtessera-enforce.so"]
    assert section(log, "env") == [f"CUDA_VISIBLE_DEVICES={uuid}"]
    probe = section(log, "probe")
    assert f"totalmem 0 {3000 * MIB}" in probe
    assert probe[-2:] == [f"alloc {3000 * MIB - CTX} 0", f"alloc {MIB} 2"]  # 2: out of memory
    annotations = node.client.get("v1", "Pod", name, ns)["metadata"]["annotations"]
    assert (annotations[BIND_PHASE], annotations[DEVICES_TO_ALLOCATE]) == ("success", ";")
    assert NODE_LOCK not in node.client.get("v1", "Node", node.name)["metadata"]["annotations"]
    spec = node.cdi_spec_dir / f"{DRIVER}-claim_{uid}-0.json"
    assert spec.is_file() and (dp.state / "claims" / f"{uid}-0" / "limits").is_file()
    delete_pod(node.client, name, ns, wait=60)

    def left() -> list[str]:
        return [
            str(p)
            for p in [
                spec,
                *(dp.state / "claims").glob("*"),
                *(dp.state / "deviceplugin").glob("*"),
            ]
            if p.exists()
        ]

    wait_for(
        lambda: True if not left() else None,
        timeout=60,
        what="the device plugin to remove the pod's CDI spec, claim directory and record",
        last=lambda: f"left: {left()}; log:\n{dp.output[-2000:]}",
    )


def test_a_decision_for_more_gpus_than_the_container_asks_fails_the_pod(
    kube_node: LiveNode, device_plugin: DevicePluginProcess, probe_image: str, node_namespace: str
) -> None:
    node, dp, ns = kube_node, device_plugin, node_namespace
    pod = hami_pod(ns, probe_image, dp, node.name, dp.gpus[0].uuid)
    two = [[ContainerDevice(g.uuid, "NVIDIA", 3000, 30) for g in dp.gpus[:2]]]
    pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE] = encode_pod_devices(two)
    name = node.client.create(pod)["metadata"]["name"]

    def failed() -> dict[str, Any] | None:
        p = node.client.get("v1", "Pod", name, ns)
        return p if (p.get("status") or {}).get("phase") == "Failed" else None

    p = wait_for(failed, timeout=60, what=f"pod {ns}/{name} to fail admission")
    assert p["status"]["reason"] == "UnexpectedAdmissionError"
    assert (
        f"pod {ns}/{name}: annotation {DEVICES_TO_ALLOCATE} container entry 0 has 2 device(s) "
        "but the kubelet asks for 1"
    ) in p["status"]["message"]
    assert p["metadata"]["annotations"][BIND_PHASE] == "failed"
    assert not list((dp.state / "claims").glob(f"{p['metadata']['uid']}-*"))
    delete_pod(node.client, name, ns, wait=60)
