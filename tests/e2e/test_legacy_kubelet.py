"""Legacy mode whole, on a real node: HAMi pods from the corpus (their resource requests
unchanged; image and command swapped for the fake-libcuda probe) are scheduled by the **real
kube-scheduler** with ``deploy/legacy/scheduler-config.yaml`` through ``tessera extender
--legacy``, allocated by ``tessera device-plugin`` on this machine as a kubelet node (fake NVML:
8x H100 80GB HBM3), their limits checked inside each container, the real ``tessera monitor``
reading the device plugin's state dir exports a per-share series named after each pod, and
nothing is left after deletion. Then a stream of pods through a ``kill -9`` of the device
plugin and of the extender: afterwards every pod is Running, Failed with a reason, or Pending
with the scheduler's reason; the bookings recorded on the pods fit each GPU (memory, cores,
slots); the node's files are exactly the running pods'; after deletion none are left."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tessera.convert.hami import BIND_PHASE, DEVICES_ALLOCATED, VGPU_NODE, decode_pod_devices
from tessera.kube.workloads import wait_for
from tessera.localcluster import build

from .conftest import LiveNode
from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import MonitorProcess
from .test_deviceplugin_kubelet import (
    CTX,
    DRIVER,
    MIB,
    SPLIT,
    DevicePluginProcess,
    device_plugin,
    probe_image,
)
from .test_driver_kubelet import fake_gpus_env, section, wait_log
from .test_legacy_extender import CONFIG, PODS, SCHEDULER, _free_port

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.legacy]

__all__ = ["device_plugin", "probe_image"]  # fixtures of this module too


class Schedulers:
    """``tessera extender --legacy`` and the real kube-scheduler with the legacy profile, as
    child processes on the node's cluster (beside its default scheduler)."""

    def __init__(self, node: LiveNode, tmp: Path) -> None:
        self.tmp = tmp
        self.port = _free_port()
        cfg = yaml.safe_load(CONFIG.read_text())
        cfg["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{self.port}"
        cfg["clientConnection"] = {"kubeconfig": str(node.kubeconfig)}
        cfg["leaderElection"] = {"leaderElect": False}
        cfg_path = tmp / "scheduler-config.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        self.ext_argv = [
            sys.executable,
            "-m",
            "tessera",
            "extender",
            "--legacy",
            f"--port={self.port}",
            f"--kubeconfig={node.kubeconfig}",
        ]
        self.extender = self._spawn(self.ext_argv, "extender.log")
        self.wait_ready()
        self.scheduler = self._spawn(
            [str(build.bin_dir() / "kube-scheduler"), f"--config={cfg_path}", "--secure-port=0"],
            "kube-scheduler.log",
        )

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen[bytes]:
        with open(self.tmp / log, "ab") as f:
            return subprocess.Popen(
                argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def wait_ready(self) -> None:
        def ready() -> bool | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=5):
                    return True
            except OSError:
                return None

        wait_for(ready, timeout=60, what="the extender to be ready", last=self.logs)

    def kill9_extender(self) -> None:
        self.extender.kill()
        self.extender.wait(timeout=30)
        self.extender = self._spawn(self.ext_argv, "extender.log")
        self.wait_ready()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.tmp.glob("*.log"))
        )

    def stop(self) -> None:
        for p in (self.scheduler, self.extender):
            p.terminate()
        for p in (self.scheduler, self.extender):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture(scope="module")
def schedulers(
    kube_node: LiveNode,
    device_plugin: DevicePluginProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Schedulers]:
    s = Schedulers(kube_node, tmp_path_factory.mktemp("legacy-schedulers"))
    try:
        yield s
    finally:
        s.stop()


def corpus_pod(
    file: str, k: int, name: str, ns: str, image: str, dp: DevicePluginProcess, script: str
) -> dict[str, Any]:
    """Pod ``k`` of a corpus file, its resources as they are, running ``script`` in the probe
    image, for the legacy scheduler."""
    docs = [d for d in yaml.safe_load_all((PODS / file).read_text()) if d and d["kind"] == "Pod"]
    pod = copy.deepcopy(docs[k])
    pod["metadata"] = {**pod["metadata"], "name": name, "namespace": ns}
    [c] = pod["spec"]["containers"]
    c.update(
        image=image,
        imagePullPolicy="Never",
        command=["/bin/sh", "-c", script],
        env=[{"name": "FAKE_GPUS", "value": fake_gpus_env(dp)}],  # type: ignore[arg-type]
    )
    pod["spec"].update(
        schedulerName=SCHEDULER, terminationGracePeriodSeconds=1, automountServiceAccountToken=False
    )
    return pod


#: The enforcement library's allocation granularity (sizes are rounded up to it).
GRAIN = 2 * MIB


def fill(mib: int) -> int:
    """The most a container limited to ``mib`` MiB can allocate at once: the limit less the
    context overhead, rounded down to the granularity."""
    return (mib * MIB - CTX) // GRAIN * GRAIN


def probe_script(first_mib: int | None) -> str:
    """Print the limits and the visible GPUs; then allocate :func:`fill` of the first GPU's
    limit and one granule more (when it has a limit)."""
    allocs = f"{fill(first_mib)} {GRAIN}" if first_mib is not None else ""
    return (
        "echo '--- limits'; cat /etc/tessera/limits 2>/dev/null; echo '--- env'; "
        'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; '
        f"echo '--- probe'; /opt/probe/cuda_probe {allocs}; echo '--- done'; sleep 3600"
    )


def _phase(p: dict[str, Any]) -> str:
    return str((p.get("status") or {}).get("phase") or "")


def _left(dp: DevicePluginProcess, node: LiveNode) -> list[str]:
    return sorted(
        str(p)
        for p in [
            *(dp.state / "claims").glob("*"),
            *(dp.state / "deviceplugin").glob("*.json"),
            *node.cdi_spec_dir.glob(f"{DRIVER}-claim_*"),
        ]
    )


def _delete_all(node: LiveNode, ns: str, dp: DevicePluginProcess) -> None:
    for p in node.client.list("v1", "Pod", ns):
        node.client.request(
            "DELETE",
            node.client.collection_path("v1", "Pod", ns) + f"/{p['metadata']['name']}",
            body={"gracePeriodSeconds": 0},
        )
    wait_for(
        lambda: True if not node.client.list("v1", "Pod", ns) else None,
        timeout=90,
        what=f"the pods of {ns} to be gone",
    )
    wait_for(
        lambda: True if not _left(dp, node) else None,
        timeout=60,
        what="the device plugin to remove the deleted pods' files",
        last=lambda: f"left: {_left(dp, node)}; log:\n{dp.output[-2000:]}",
    )


def test_corpus_pods_scheduled_allocated_enforced_and_monitored(
    kube_node: LiveNode,
    device_plugin: DevicePluginProcess,
    schedulers: Schedulers,
    probe_image: str,
    node_namespace: str,
) -> None:
    node, dp, ns = kube_node, device_plugin, node_namespace
    # (file, pod index, MiB of the first GPU's limit as the request says, through HAMi's
    # percentage of the H100's usable memory where it gives one)
    usable_mib = (dp.gpus[0].usable_memory_bytes or 0) // MIB
    cases = [
        ("HAMi__examples_nvidia__default_use.yaml", 0, "default-use"),
        ("HAMi__examples_nvidia__use_sharing_card.yaml", 0, "share-40"),
        ("HAMi__examples_nvidia__use_sharing_card.yaml", 1, "share-60"),
        ("HAMi__examples_nvidia__use_memory_fraction.yaml", 0, "fraction-2gpu"),
    ]
    made = []
    for file, k, name in cases:
        docs = [
            d for d in yaml.safe_load_all((PODS / file).read_text()) if d and d["kind"] == "Pod"
        ]
        lim = docs[k]["spec"]["containers"][0]["resources"]["limits"]
        if "nvidia.com/gpumem" in lim:
            mib = int(lim["nvidia.com/gpumem"])
        else:
            mib = usable_mib * int(lim["nvidia.com/gpumem-percentage"]) // 100
        pod = corpus_pod(file, k, name, ns, probe_image, dp, probe_script(mib))
        made.append((node.client.create(pod), mib, int(lim["nvidia.com/gpu"])))

    for pod, mib, gpus in made:
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]

        log = wait_log(node, name, ns, "--- done", timeout=150)
        got = node.client.get("v1", "Pod", name, ns)
        ann = got["metadata"]["annotations"]
        assert ann[BIND_PHASE] == "success" and ann[VGPU_NODE] == node.name
        assert got["spec"]["schedulerName"] == SCHEDULER
        [devices] = decode_pod_devices(ann[DEVICES_ALLOCATED])
        assert len(devices) == gpus
        assert devices[0].memory_mib == mib, (name, devices)
        assert section(log, "limits") == [
            "version 1",
            f"claim {ns}/{name} {uid}-0",
            "region /run/tessera/region",
            f"context-overhead {CTX}",
            "shares /run/tessera/shares",
            *[f"gpu {d.uuid} memory {d.memory_mib * MIB} cores {d.cores}" for d in devices],
        ]
        [env] = section(log, "env")
        assert sorted(env.removeprefix("CUDA_VISIBLE_DEVICES=").split(",")) == sorted(
            d.uuid for d in devices
        )
        probe = section(log, "probe")
        assert f"totalmem 0 {mib * MIB}" in probe, probe
        assert probe[-2:] == [f"alloc {fill(mib)} 0", f"alloc {GRAIN} 2"], probe  # 2: OOM

    # The monitor, pointed where the device plugin writes, exports each pod's share.
    mon = MonitorProcess(
        "--node-name",
        node.name,
        "--kubeconfig",
        str(node.kubeconfig),
        "--no-nvml",
        "--region-dir",
        str(dp.state / "claims"),
        "--api-interval",
        "1",
    )
    try:

        def series(metric: str) -> list[dict[str, str]]:
            fams = {f.name: f for f in text_string_to_metric_families(mon.scrape())}
            return [
                {**s.labels, "value": str(s.value)}
                for s in (fams[metric].samples if metric in fams else [])
            ]

        def shares() -> dict[str, tuple[str, str, str, float]] | None:
            got = {
                x["dra_claim_uid"]: (x["namespace"], x["pod"], x["container"], float(x["value"]))
                for x in series("tessera_share_memory_limit_bytes")
            }
            return got if len(got) == len(made) else None

        want = {
            f"{p['metadata']['uid']}-0": (ns, p["metadata"]["name"], "ubuntu-container", mib * MIB)
            for p, mib, _ in made
        }
        got = wait_for(
            shares,
            timeout=30,
            what="the monitor's per-share series of each legacy pod",
            last=lambda: json.dumps(series("tessera_share_memory_limit_bytes"))[-3000:],
        )
        assert got == want
        hami = {
            (x["namespace"], x["pod"], x["device_uuid"]): float(x["value"])
            for x in series("hami_vgpu_memory_limit_bytes")
        }
        assert hami == {
            (ns, p["metadata"]["name"], d.uuid): float(d.memory_mib * MIB)
            for p, _, _ in made
            for d in decode_pod_devices(
                node.client.get("v1", "Pod", p["metadata"]["name"], ns)["metadata"]["annotations"][
                    DEVICES_ALLOCATED
                ]
            )[0]
        }

        _delete_all(node, ns, dp)
        wait_for(
            lambda: True if not series("tessera_share_memory_limit_bytes") else None,
            timeout=15,
            what="the shares' series to go with the pods",
        )
    finally:
        mon.stop()


def test_kill9_of_the_device_plugin_and_the_extender_during_a_stream(
    kube_node: LiveNode,
    device_plugin: DevicePluginProcess,
    schedulers: Schedulers,
    probe_image: str,
    node_namespace: str,
) -> None:
    """Twelve sharing pods (HAMi's use_sharing_card: 40 % memory + 60 % cores, and 60 % + 40 %,
    alternately; at most one 60-core pod per GPU), one a second; the device plugin is killed
    (-9) and started again after the 4th, the extender after the 8th. All of them fit, so each
    ends Running, or Failed with the kubelet's reason (one that reached it while the plugin was
    down); Unschedulable is transient (CI once found eight pods so right after the stream)."""
    node, dp, ns, s = kube_node, device_plugin, node_namespace, schedulers
    file = "HAMi__examples_nvidia__use_sharing_card.yaml"
    names = []
    for i in range(12):
        pod = corpus_pod(
            file, i % 2, f"stream-{i}", ns, probe_image, dp, "cat /etc/tessera/limits; sleep 3600"
        )
        names.append(node.client.create(pod)["metadata"]["name"])
        if i == 3:
            dp.kill9()
        if i == 7:
            s.kill9_extender()
        time.sleep(1)

    def settled() -> list[dict[str, Any]] | None:
        pods = node.client.list("v1", "Pod", ns)
        for p in pods:
            ph = _phase(p)
            if ph == "Running" or (ph == "Failed" and (p.get("status") or {}).get("message")):
                continue
            # Every pod fits (8 GPUs: one 60-core and one 40-core pod each), so Unschedulable is
            # only transient: while the killed plugin is down the kubelet reports no
            # nvidia.com/gpu, and the scheduler retries once the Node's allocatable is back.
            return None
        return pods

    pods = wait_for(
        settled,
        timeout=300,
        interval=1.0,
        what="every pod of the stream Running, Failed with a reason or unschedulable",
        last=lambda: (
            json.dumps(
                {p["metadata"]["name"]: p.get("status") for p in node.client.list("v1", "Pod", ns)}
            )[-4000:]
            + s.logs()
            + dp.output[-2000:]
        ),
    )
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(names)
    running = [p for p in pods if _phase(p) == "Running"]
    print(
        "stream outcome:",
        {
            p["metadata"]["name"]: _phase(p) + f" {(p.get('status') or {}).get('reason', '')}"
            for p in pods
        },
    )
    # The restarted plugin allocates, and the restarted extender schedules, the later pods.
    later = {p["metadata"]["name"] for p in running}
    assert later & {f"stream-{i}" for i in range(4, 8)}, later
    assert later & {f"stream-{i}" for i in range(8, 12)}, later
    # The bookings on the pods that hold GPUs (bound, not finished) fit each GPU.
    mem: dict[str, int] = defaultdict(int)
    cores: dict[str, int] = defaultdict(int)
    slots: dict[str, int] = defaultdict(int)
    for p in pods:
        ann = p["metadata"].get("annotations") or {}
        if _phase(p) in ("Succeeded", "Failed") or DEVICES_ALLOCATED not in ann:
            continue
        for container in decode_pod_devices(ann[DEVICES_ALLOCATED]):
            for d in container:
                mem[d.uuid] += d.memory_mib
                cores[d.uuid] += d.cores
                slots[d.uuid] += 1
    usable = {g.uuid: (g.usable_memory_bytes or 0) // MIB for g in dp.gpus}
    for uuid in mem:
        assert mem[uuid] <= usable[uuid] and cores[uuid] <= 100 and slots[uuid] <= SPLIT, (
            uuid,
            mem[uuid],
            cores[uuid],
            slots[uuid],
        )
    # Each running pod's share is on the node, as its record says, and is the one its
    # container got (the limits file names the pod); nothing else is on the node.
    for p in running:
        uid, name = p["metadata"]["uid"], p["metadata"]["name"]
        assert f"claim {ns}/{name} {uid}-0" in node.logs(name, ns).splitlines()
        [devices] = decode_pod_devices(p["metadata"]["annotations"][DEVICES_ALLOCATED])
        limits = (dp.state / "claims" / f"{uid}-0" / "limits").read_text().splitlines()
        assert [ln for ln in limits if ln.startswith("gpu ")] == [
            f"gpu {d.uuid} memory {d.memory_mib * MIB} cores {d.cores}" for d in devices
        ]
    wait_for(
        lambda: (
            True
            if sorted(x.name for x in (dp.state / "claims").iterdir())
            == sorted(f"{p['metadata']['uid']}-0" for p in running)
            else None
        ),
        timeout=30,
        what="the node's claim directories to be exactly the running pods'",
        last=lambda: str(_left(dp, node)),
    )
    _delete_all(node, ns, dp)
