"""Legacy mode's ``Allocate`` against a real API server, without a kubelet (the pods stay
``Pending``, as a pod does between its bind and its admission): the pod is chosen from the
plugin's cache of the node's pods (``tessera.deviceplugin.pods``) and only the pod's patch goes
to the API server; a cache that lags behind the API server (a pod bound after its last list,
a pod changed since) is waited for, then read afresh, and never makes a wrong choice; and the
start refuses an identity without the device plugin's access table. GPUs: the 8x H100 of a
corpus inventory behind the fake NVML."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tessera import DRIVER_NAME
from tessera.convert.hami import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    ContainerDevice,
    encode_pod_devices,
)
from tessera.deviceplugin.allocate import AllocateError
from tessera.deviceplugin.plugin import DevicePlugin, DevicePluginConfig, DevicePluginError
from tessera.deviceplugin.pods import NodePods
from tessera.deviceplugin.register import REGISTER_ANNOTATION
from tessera.driver.access import DEVICE_PLUGIN_ACCESS
from tessera.driver.guard import MODE_LABEL, MODE_LEGACY
from tessera.enforcement import library_path
from tessera.enforcement.limits import parse_limits
from tessera.inventory import GPU, load_inventory
from tessera.kube.client import KubeClient
from tessera.localcluster.fake_nvml import nvml_config

from .conftest import LiveCluster
from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import H100
from .identity import identity_kubeconfig

pytestmark = [pytest.mark.cluster, pytest.mark.legacy]

MIB = 1 << 20


class Recording(KubeClient):
    """The project's client, recording each request as ``(verb, path, fieldSelector)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[tuple[str, str, str]] = []

    def request(self, verb: str, path: str, **kwargs: Any) -> Any:
        query = kwargs.get("query") or {}
        self.requests.append((verb, path, str(query.get("fieldSelector", ""))))
        return super().request(verb, path, **kwargs)

    def pod_requests(self) -> list[tuple[str, str]]:
        """The requests about pods since the last ``requests.clear()``: ``(verb, what)``, what
        being a pod's name or ``list`` (the node's pods)."""
        return [
            (v, "list" if p.endswith("/pods") else p.rsplit("/", 1)[1])
            for v, p, _ in self.requests
            if "/pods" in p
        ]


@dataclass
class Env:
    node: str
    namespace: str
    client: Recording
    plugin: DevicePlugin
    gpus: list[GPU]
    state: Path
    logs: list[str] = field(default_factory=list)

    def bound_pod(self, name: str, entries: list[list[ContainerDevice]], bind_time: int) -> Any:
        """A pod the scheduler extender bound to the node (its records, then ``nodeName``),
        one container per entry."""
        return self.client.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "annotations": {
                        VGPU_NODE: self.node,
                        DEVICES_TO_ALLOCATE: encode_pod_devices(entries),
                        BIND_PHASE: "allocating",
                        BIND_TIME: str(bind_time),
                    },
                },
                "spec": {
                    "nodeName": self.node,
                    "containers": [
                        {"name": f"c{i}", "image": "busybox"} for i in range(len(entries))
                    ],
                },
            }
        )

    def share(self, uid: str) -> tuple[str, int, int]:
        """``(GPU UUID, bytes, cores)`` of the limits file of allocation ``uid``."""
        [gpu] = parse_limits((self.state / "claims" / uid / "limits").read_text()).gpus
        return gpu.uuid, gpu.memory, gpu.cores

    def annotations(self, name: str) -> tuple[str, str]:
        ann = self.client.get("v1", "Pod", name, self.namespace)["metadata"]["annotations"]
        return ann[BIND_PHASE], ann[DEVICES_TO_ALLOCATE]


def cdi_id(pod: Any, index: int, device: str) -> str:
    return f"{DRIVER_NAME}/claim={pod['metadata']['uid']}-{index}-0-{device}"


def config(node: str, root: Path, nvml: Path) -> DevicePluginConfig:
    lib = library_path()
    return DevicePluginConfig(
        node_name=node,
        device_plugin_dir=root / "device-plugins",
        state_dir=root / "state",
        cdi_dir=root / "cdi",
        dev_root=root / "devroot",
        library=Path(lib) if lib else None,
        driver=DRIVER_NAME,
        nvml_library=str(nvml),
    )


@pytest.fixture
def env(
    kube_cluster: LiveCluster,
    kube_namespace: str,
    fake_nvml_lib: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Env]:
    """A legacy-mode Node (an API object only), the fake NVML's 8 GPUs, stand-in device nodes
    and a device plugin (not started) on a recording client."""
    node = f"dp-{kube_namespace}"
    admin = kube_cluster.client
    admin.create(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "labels": {MODE_LABEL: MODE_LEGACY}},
        }
    )
    gpus = load_inventory(H100)
    dev = tmp_path / "devroot" / "dev"
    dev.mkdir(parents=True)
    for name in [f"nvidia{g.index}" for g in gpus] + ["nvidiactl", "nvidia-uvm"]:
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 3))
    (tmp_path / "nvml.cfg").write_text(nvml_config(gpus))
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(tmp_path / "nvml.cfg"))
    client = Recording.from_kubeconfig(kube_cluster.kubeconfig)
    assert isinstance(client, Recording)
    logs: list[str] = []
    plugin = DevicePlugin(config(node, tmp_path, fake_nvml_lib), client, log=logs.append)
    try:
        yield Env(node, kube_namespace, client, plugin, gpus, tmp_path / "state", logs)
    finally:
        plugin.stop()
        admin.delete("v1", "Node", node)


def test_allocate_chooses_from_the_cache_and_writes_only_the_pod(env: Env) -> None:
    g = env.gpus
    two = env.bound_pod(
        "two",
        [
            [ContainerDevice(g[0].uuid, "NVIDIA", 3000, 30)],
            [ContainerDevice(g[1].uuid, "NVIDIA", 2000, 20)],
        ],
        bind_time=1000,
    )
    one = env.bound_pod("one", [[ContainerDevice(g[2].uuid, "NVIDIA", 1000, 10)]], bind_time=2000)
    env.plugin.start()
    env.client.requests.clear()
    ids = [env.plugin.allocate([1])[0] for _ in range(3)]
    # oldest bind first; a pod's containers in order, the second right after the first's write
    assert ids == [
        [cdi_id(two, 0, "gpu-0")],
        [cdi_id(two, 1, "gpu-1")],
        [cdi_id(one, 0, "gpu-2")],
    ]
    # the node's pods were not listed: only the writes went to the API server
    assert env.client.pod_requests() == [("PATCH", "two"), ("PATCH", "two"), ("PATCH", "one")]
    assert env.annotations("two") == ("success", encode_pod_devices([[], []]))
    assert env.annotations("one") == ("success", encode_pod_devices([[]]))
    uid2, uid1 = two["metadata"]["uid"], one["metadata"]["uid"]
    assert env.share(f"{uid2}-0") == (g[0].uuid, 3000 * MIB, 30)
    assert env.share(f"{uid2}-1") == (g[1].uuid, 2000 * MIB, 20)
    assert env.share(f"{uid1}-0") == (g[2].uuid, 1000 * MIB, 10)


def test_a_lagging_cache_is_waited_for_then_read_and_a_conflict_reads_again(env: Env) -> None:
    g = env.gpus
    two = env.bound_pod(
        "two",
        [
            [ContainerDevice(g[0].uuid, "NVIDIA", 3000, 30)],
            [ContainerDevice(g[1].uuid, "NVIDIA", 2000, 20)],
        ],
        bind_time=1000,
    )
    changed = env.bound_pod(
        "changed", [[ContainerDevice(g[3].uuid, "NVIDIA", 4000, 40)]], bind_time=2000
    )
    env.plugin.start()
    # A cache that stopped after its first list: it never sees what follows.
    assert env.plugin.pods is not None
    env.plugin.pods.stop()
    frozen = NodePods.informer_for(env.client, env.node)
    frozen._list()
    env.plugin.pods = NodePods(env.client, env.node, informer=frozen, wait_seconds=0.2)
    late = env.bound_pod("late", [[ContainerDevice(g[4].uuid, "NVIDIA", 5000, 50)]], bind_time=3000)
    env.client.request(
        "PATCH",
        f"/api/v1/namespaces/{env.namespace}/pods/changed",
        body={"metadata": {"annotations": {"example.com/touched": "yes"}}},
        content_type="application/merge-patch+json",
    )
    env.client.requests.clear()
    ids = [env.plugin.allocate([1])[0] for _ in range(4)]
    assert ids == [
        [cdi_id(two, 0, "gpu-0")],
        [cdi_id(two, 1, "gpu-1")],
        [cdi_id(changed, 0, "gpu-3")],
        [cdi_id(late, 0, "gpu-4")],
    ]
    assert env.client.pod_requests() == [
        # the second container from the plugin's own first write, not from the cache
        ("PATCH", "two"),
        ("PATCH", "two"),
        # changed since the cache read it: the patch's resourceVersion conflicts, read again
        ("PATCH", "changed"),
        ("GET", "list"),
        ("PATCH", "changed"),
        # bound after the cache's list: not there after the wait, so read
        ("GET", "list"),
        ("PATCH", "late"),
    ]
    for name in ("two", "changed", "late"):
        assert env.annotations(name)[0] == "success"
    stored = env.client.get("v1", "Pod", "changed", env.namespace)["metadata"]["annotations"]
    assert stored["example.com/touched"] == "yes"
    assert env.share(f"{changed['metadata']['uid']}-0") == (g[3].uuid, 4000 * MIB, 40)
    assert env.share(f"{late['metadata']['uid']}-0") == (g[4].uuid, 5000 * MIB, 50)
    # every allocation has its record and files, none twice
    records = sorted(p.stem for p in (env.state / "deviceplugin").glob("*.json"))
    assert records == sorted(
        [
            f"{two['metadata']['uid']}-0",
            f"{two['metadata']['uid']}-1",
            f"{changed['metadata']['uid']}-0",
            f"{late['metadata']['uid']}-0",
        ]
    )


def test_an_allocation_whose_record_cannot_be_written_fails_after_its_patch(env: Env) -> None:
    """The pod's patch travels while the allocation's record and files are written; when the
    record cannot be written (the records directory made read-only by a read-only bind mount
    over it), ``Allocate`` fails naming the pod and the fault, nothing of the allocation is
    left, and the pod's ``bind-phase`` is ``failed``: written after the patch that was in
    flight, not overwritten by it, and although removing the record met the same fault."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.fail("this test makes a read-only bind mount: run it as root (the project's VM is)")
    g = env.gpus
    one = env.bound_pod("one", [[ContainerDevice(g[2].uuid, "NVIDIA", 1000, 10)]], bind_time=1000)
    uid = f"{one['metadata']['uid']}-0"
    records = env.plugin.records_dir
    records.mkdir(parents=True)
    env.plugin.start()
    env.client.requests.clear()
    subprocess.run(["mount", "--bind", str(records), str(records)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(records)], check=True)
        with pytest.raises(AllocateError, match=r"pod .*/one: writing its files: .*[Rr]ead-only"):
            env.plugin.allocate([1])
    finally:
        subprocess.run(["umount", str(records)], check=True)
    assert env.client.pod_requests()[:2] == [("PATCH", "one"), ("PATCH", "one")]
    assert env.annotations("one")[0] == "failed"
    assert not (env.state / "claims" / uid).exists()
    assert list(env.plugin.cfg.cdi_dir.glob(f"*{uid}*")) == []
    assert uid not in env.plugin.plans
    assert list(records.iterdir()) == []
    # (its clean-up met the read-only directory too: logged, and the pod still marked failed)
    assert any(f"allocation {uid}: removing what its failed Allocate left" in m for m in env.logs)


def identity(
    cluster: LiveCluster, namespace: str, name: str, rules: list[dict[str, Any]], path: Path
) -> Path:
    """A kubeconfig for a new ServiceAccount ``name``, bound to a ClusterRole of ``rules``."""
    return identity_kubeconfig(
        cluster.client, cluster.kubeconfig, namespace, name, path, rules=rules
    )


def test_the_start_refuses_an_identity_without_the_access_table(
    env: Env, kube_cluster: LiveCluster, tmp_path: Path
) -> None:
    """Every row of DEVICE_PLUGIN_ACCESS but ``watch pods`` (the pod cache's): refused at
    start, naming the row, before the Node is written; the whole table starts."""
    rules = [
        {"apiGroups": [a.group], "resources": [a.resource], "verbs": [a.verb]}
        for a in DEVICE_PLUGIN_ACCESS
    ]
    partial = [r for r in rules if (r["verbs"], r["resources"]) != (["watch"], ["pods"])]
    assert len(partial) == len(rules) - 1
    kc = identity(kube_cluster, env.namespace, "dp-nowatch", partial, tmp_path / "nowatch.yaml")
    cfg = env.plugin.cfg
    plugin = DevicePlugin(cfg, KubeClient.from_kubeconfig(kc), log=env.logs.append)
    with pytest.raises(DevicePluginError) as refused:
        plugin.start()
    assert str(refused.value) == (
        "the API server denies this identity: watch pods; grant the device plugin's "
        "ServiceAccount the ClusterRole in docs/install.md ('Identities')"
    )
    node = kube_cluster.client.get("v1", "Node", env.node)
    assert REGISTER_ANNOTATION not in (node["metadata"].get("annotations") or {})
    kc = identity(kube_cluster, env.namespace, "dp-all", rules, tmp_path / "all.yaml")
    plugin = DevicePlugin(cfg, KubeClient.from_kubeconfig(kc), log=env.logs.append)
    try:
        plugin.start()
        node = kube_cluster.client.get("v1", "Node", env.node)
        assert REGISTER_ANNOTATION in node["metadata"]["annotations"]
    finally:
        plugin.stop()
