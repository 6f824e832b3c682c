"""The proof on CPU: ``tessera driver`` on a real node (kubelet v1.37 + containerd 2.x + runc),
pods scheduled by the real kube-scheduler, claims prepared through the real kubelet, containers
started by containerd with the driver's CDI specs; every check is made **inside the container**
(the pod's log): the limits file, the preloaded enforcement library, and a CUDA probe over the
project's fake ``libcuda.so.1`` (built into the test image) that sees the claim's memory as its
total and is refused an allocation past it.

The node's GPUs are the 8x H100 80GB HBM3 of a corpus inventory, served by the fake NVML; the
device nodes handed to containers are stand-ins (character devices with /dev/null's numbers).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tessera.driver.publish import BACKEND_ATTRIBUTE
from tessera.enforcement import library_path
from tessera.enforcement.limits import DEFAULT_CONTEXT_OVERHEAD
from tessera.inventory import load_inventory
from tessera.kube.workloads import apply_objects, delete_pod, pod_claims, wait_for
from tessera.localcluster.localinstall import PROBE_SOURCE

from .conftest import LiveNode
from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import GIB, H100, node_slices, nvml_config, write_atomically

#: the driver's default context-overhead, charged to each CUDA context of a share
CTX = DEFAULT_CONTEXT_OVERHEAD

pytestmark = [pytest.mark.cluster, pytest.mark.node]

NATIVE = Path(__file__).resolve().parents[2] / "native"
PROBE_SRC = PROBE_SOURCE
DRIVER = "gpu.tessera.dev"


class NodeDriverProcess:
    """``tessera driver`` for the real node, as a child process. ``root`` holds its state,
    device nodes and fake-NVML config (made by the first process; a second one given the same
    ``root`` shares them, as two pods of the DaemonSet share the host paths). ``instance``:
    ``--rolling-update-id``; ``health_port``: serve ``/readyz`` on 127.0.0.1 (None: off);
    ``options``: more command-line options."""

    def __init__(
        self,
        node: LiveNode,
        root: Path,
        nvml_lib: Path,
        *,
        instance: str = "",
        health_port: int | None = None,
        options: Sequence[str] = (),
    ) -> None:
        self.root = root
        self.state = root / "state"
        gpus = load_inventory(H100)
        self.gpus = gpus
        self.instance = instance
        self.health_port = health_port
        dev = root / "devroot" / "dev"
        if not dev.is_dir():
            dev.mkdir(parents=True)
            for name in [f"nvidia{g.index}" for g in gpus] + [
                "nvidiactl",
                "nvidia-uvm",
                "nvidia-uvm-tools",
            ]:
                os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 3))
        self.nvml_cfg = root / "nvml.cfg"
        if not self.nvml_cfg.is_file():
            self.nvml_cfg.write_text(nvml_config(gpus))
        self.log = root / (f"driver-{instance}.log" if instance else "driver.log")
        argv = [
            sys.executable,
            "-m",
            "tessera",
            "driver",
            "--node-name",
            node.name,
            "--kubeconfig",
            str(node.kubeconfig),
            "--kubelet-root-dir",
            str(node.kubelet_root_dir),
            "--cdi-dir",
            str(node.cdi_spec_dir),
            "--state-dir",
            str(self.state),
            "--dev-root",
            str(root / "devroot"),
            "--nvml-library",
            str(nvml_lib),
            "--health-address",
            f"127.0.0.1:{health_port}" if health_port else "",
            *(["--rolling-update-id", instance] if instance else []),
            *options,
        ]
        # appended to: a process started again on the same root (a restart) keeps the log
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                env={**os.environ, "FAKE_NVML_CONFIG": str(self.nvml_cfg)},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def readyz(self) -> tuple[int, dict[str, Any]] | None:
        """``(HTTP status, body)`` of ``/readyz``; None while nothing answers."""
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}/readyz", timeout=5
            ) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())
        except OSError:
            return None

    @property
    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def node_driver(
    kube_node: LiveNode, fake_nvml_lib: Path, node_device_class: str
) -> Iterator[NodeDriverProcess]:
    root = Path(tempfile.mkdtemp(prefix="tessera-drv-", dir="/tmp"))
    drv = NodeDriverProcess(kube_node, root, fake_nvml_lib)
    try:
        try:
            kube_node.wait_plugin_registered(DRIVER, timeout=90)
        except Exception:
            pytest.fail(
                f"the kubelet did not register tessera driver; its log:\n{drv.log.read_text()[-4000:]}"
            )
        yield drv
    finally:
        drv.stop()
        for s in node_slices(kube_node.client, kube_node.name):
            kube_node.client.delete("resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"])
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def probe_image(
    kube_node: LiveNode, fake_nvml_lib: Path, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """busybox + the CUDA probe + the fake libcuda.so.1 (and libc for both)."""
    b = tmp_path_factory.mktemp("probe")
    probe = b / "cuda_probe"
    r = subprocess.run(
        [
            os.environ.get("CC", "gcc"),
            "-O2",
            "-Wall",
            "-Werror",
            "-o",
            str(probe),
            str(PROBE_SRC),
            "-ldl",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    libcuda = fake_nvml_lib.parent / "libcuda.so.1"
    lib = Path(library_path() or "")
    files = {
        "/opt/probe/cuda_probe": probe,
        "/opt/fake/libcuda.so.1": libcuda,
        # only so that the library's own dependencies (libc) are in the image: the driver's
        # CDI spec mounts the real one at /usr/lib/tessera/libtessera-enforce.so
        "/opt/deps/libtessera-enforce.so": lib,
    }
    image = kube_node.image(
        "tessera-cuda-probe", files, env={"LD_LIBRARY_PATH": "/opt/fake"}, libraries_for=list(files)
    )
    return image.ref


def fake_gpus_env(drv: NodeDriverProcess) -> str:
    """The fake libcuda's devices (``FAKE_GPUS``): the node's GPUs, UUID and memory."""
    return ",".join(f"{g.uuid}={g.memory_bytes}" for g in drv.gpus)


def probe_pod(
    name: str,
    ns: str,
    image: str,
    drv: NodeDriverProcess,
    node: str,
    allocs: list[int],
    *,
    template: str | None = None,
    claim: str | None = None,
    hold: bool = False,
) -> dict[str, Any]:
    script = (
        "echo '--- limits'; cat /etc/tessera/limits; echo '--- preload'; cat /etc/ld.so.preload; "
        "echo '--- env'; echo \"CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES\"; "
        f"echo '--- probe'; /opt/probe/cuda_probe {' '.join(str(a) for a in allocs)}; echo '--- done'; "
        "sleep 3600"
    )
    env = [{"name": "FAKE_GPUS", "value": fake_gpus_env(drv)}]
    if hold:
        env.append({"name": "PROBE_HOLD", "value": "1"})
    ref: dict[str, str] = {"name": "gpu"}
    if template:
        ref["resourceClaimTemplateName"] = template
    else:
        ref["resourceClaimName"] = str(claim)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "resourceClaims": [ref],
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                    "env": env,
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def template(name: str, ns: str, memory: str, cores: int) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": DRIVER,
                                "capacity": {"requests": {"memory": memory, "cores": str(cores)}},
                            },
                        }
                    ]
                }
            }
        },
    }


def wait_log(node: LiveNode, pod: str, ns: str, marker: str, timeout: float = 120) -> str:
    def ready() -> str | None:
        p = node.client.get("v1", "Pod", pod, ns)
        if (p.get("status") or {}).get("phase") != "Running":
            return None
        out = node.logs(pod, ns)
        return out if marker in out else None

    def why() -> str:
        p = node.client.get("v1", "Pod", pod, ns)
        return json.dumps(p.get("status"), indent=1)[-3000:]

    return wait_for(
        ready, timeout=timeout, interval=1.0, what=f"pod {ns}/{pod} to print {marker!r}", last=why
    )


def section(log: str, name: str) -> list[str]:
    """The lines of a log section, without the library's own messages (``tessera[pid]: ...``)."""
    lines = [ln for ln in log.splitlines() if not ln.startswith("tessera[")]
    start = lines.index(f"--- {name}") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("--- "))
    return lines[start:end]


def allocated_uuid(
    node: LiveNode, pod: str, ns: str, drv: NodeDriverProcess
) -> tuple[str, dict[str, Any]]:
    [claim] = pod_claims(node.client, pod, ns).values()
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return drv.gpus[int(result["device"].split("-")[1])].uuid, claim


def test_a_pod_gets_its_share_enforced_inside_the_container(
    kube_node: LiveNode, node_driver: NodeDriverProcess, probe_image: str, node_namespace: str
) -> None:
    node, drv, ns = kube_node, node_driver, node_namespace
    slices = node_slices(node.client, node.name)
    assert [d["attributes"]["uuid"]["string"] for d in slices[0]["spec"]["devices"]] == [
        g.uuid for g in drv.gpus
    ]
    assert {d["attributes"][BACKEND_ATTRIBUTE]["string"] for d in slices[0]["spec"]["devices"]} == {
        "library"
    }
    apply_objects(
        node.client,
        [
            template("share-8g", ns, "8Gi", 20),
            probe_pod(
                "share",
                ns,
                probe_image,
                drv,
                node.name,
                [4 * GIB, 4 * GIB - CTX, 1 << 20],
                template="share-8g",
            ),
        ],
    )
    log = wait_log(node, "share", ns, "--- done")
    uuid, claim = allocated_uuid(node, "share", ns, drv)
    uid = claim["metadata"]["uid"]
    assert section(log, "limits") == [
        "version 1",
        f"claim {ns}/{claim['metadata']['name']} {uid}",
        "region /run/tessera/region",
        f"context-overhead {CTX}",
        "shares /run/tessera/shares",
        f"gpu {uuid} memory {8 * GIB} cores 20",
    ]
    assert section(log, "preload") == ["/usr/lib/tessera/libtessera-enforce.so"]
    assert section(log, "env") == [f"CUDA_VISIBLE_DEVICES={uuid}"]
    assert section(log, "probe") == [
        "preloaded yes",
        "init 0",
        "device 0",
        f"totalmem 0 {8 * GIB}",
        "ctx 0",
        f"meminfo 0 free={8 * GIB - CTX} total={8 * GIB}",  # the context's share is used
        f"alloc {4 * GIB} 0",
        f"alloc {4 * GIB - CTX} 0",
        f"alloc {1 << 20} 2",
    ]  # 2: CUDA_ERROR_OUT_OF_MEMORY
    # The library says why on stderr (its wording is the library's: only the figures are checked).
    [refusal] = [ln.split(": ", 1)[1] for ln in log.splitlines() if ln.startswith("tessera[")]
    assert refusal.startswith(f"cuMemAlloc of {1 << 20} bytes") and refusal.endswith(
        f"refused: claim uses {8 * GIB} of {8 * GIB}"
    )
    # The device node is the claim's GPU (a stand-in here), seen in the container.
    minor = [g.uuid for g in drv.gpus].index(uuid)
    assert node.exec("share", ns, "ls", f"/dev/nvidia{minor}").strip() == f"/dev/nvidia{minor}"
    spec = node.cdi_spec_dir / f"{DRIVER}-claim_{uid}.json"
    assert spec.is_file() and (drv.state / "claims" / uid / "limits").is_file()
    delete_pod(node.client, "share", ns, wait=60)
    wait_for(
        lambda: True if not spec.exists() and not (drv.state / "claims" / uid).exists() else None,
        timeout=60,
        what="unprepare to remove the CDI spec, limits file and region",
    )


def test_two_pods_on_one_gpu_see_their_own_limits(
    kube_node: LiveNode, node_driver: NodeDriverProcess, probe_image: str, node_namespace: str
) -> None:
    node, drv, ns = kube_node, node_driver, node_namespace
    apply_objects(
        node.client,
        [
            template("t8", ns, "8Gi", 20),
            template("t4", ns, "4Gi", 10),
            probe_pod(
                "big", ns, probe_image, drv, node.name, [8 * GIB - CTX, 1 << 20], template="t8"
            ),
            probe_pod(
                "small", ns, probe_image, drv, node.name, [4 * GIB - CTX, 1 << 20], template="t4"
            ),
        ],
    )
    logs = {p: wait_log(node, p, ns, "--- done") for p in ("big", "small")}
    (u_big, c_big), (u_small, c_small) = (
        allocated_uuid(node, p, ns, drv) for p in ("big", "small")
    )
    assert u_big == u_small  # first fit: both shares on the same GPU
    assert section(logs["big"], "limits")[-1] == f"gpu {u_big} memory {8 * GIB} cores 20"
    assert section(logs["small"], "limits")[-1] == f"gpu {u_small} memory {4 * GIB} cores 10"
    assert f"totalmem 0 {8 * GIB}" in section(logs["big"], "probe")
    assert f"totalmem 0 {4 * GIB}" in section(logs["small"], "probe")
    # each process's context takes CTX of its share, allocations the rest
    big, small = section(logs["big"], "probe")[-2:], section(logs["small"], "probe")[-2:]
    assert big == [f"alloc {8 * GIB - CTX} 0", f"alloc {1 << 20} 2"]
    assert small == [f"alloc {4 * GIB - CTX} 0", f"alloc {1 << 20} 2"]
    uids = [c["metadata"]["uid"] for c in (c_big, c_small)]
    for p in ("big", "small"):
        delete_pod(node.client, p, ns, wait=60)
    wait_for(
        lambda: (
            True
            if not any((node.cdi_spec_dir / f"{DRIVER}-claim_{u}.json").exists() for u in uids)
            else None
        ),
        timeout=60,
        what="both claims unprepared",
    )


def test_a_shared_claims_pods_draw_on_one_budget(
    kube_node: LiveNode, node_driver: NodeDriverProcess, probe_image: str, node_namespace: str
) -> None:
    node, drv, ns = kube_node, node_driver, node_namespace
    node.client.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "shared", "namespace": ns},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "gpu",
                            "exactly": {
                                "deviceClassName": DRIVER,
                                "capacity": {"requests": {"memory": "8Gi", "cores": "20"}},
                            },
                        }
                    ]
                }
            },
        }
    )
    # The first pod takes 5 GiB and keeps it (with its context, 5.5 GiB of the 8); the second's
    # context takes 0.5 GiB more: it is then refused 4 GiB but gets 2 GiB.
    apply_objects(
        node.client,
        [probe_pod("first", ns, probe_image, drv, node.name, [5 * GIB], claim="shared", hold=True)],
    )
    first = wait_log(node, "first", ns, "holding")
    apply_objects(
        node.client,
        [
            probe_pod(
                "second",
                ns,
                probe_image,
                drv,
                node.name,
                [4 * GIB, 2 * GIB, 1 << 20],
                claim="shared",
            )
        ],
    )
    second = wait_log(node, "second", ns, "--- done")
    claim = node.client.get("resource.k8s.io/v1", "ResourceClaim", "shared", ns)
    uid = claim["metadata"]["uid"]
    assert sorted(r["name"] for r in claim["status"]["reservedFor"]) == ["first", "second"]
    assert section(first, "limits") == section(second, "limits")  # one claim, one limits file
    assert f"alloc {5 * GIB} 0" in first
    assert section(second, "probe")[-3:] == [
        f"alloc {4 * GIB} 2",
        f"alloc {2 * GIB} 0",
        f"alloc {1 << 20} 2",
    ]
    # The shared claim stays prepared until its last pod is gone.
    spec = node.cdi_spec_dir / f"{DRIVER}-claim_{uid}.json"
    delete_pod(node.client, "first", ns, wait=60)
    assert spec.is_file() and (drv.state / "claims" / uid / "region").is_file()
    delete_pod(node.client, "second", ns, wait=60)
    wait_for(
        lambda: True if not spec.exists() and not (drv.state / "claims" / uid).exists() else None,
        timeout=60,
        what="the shared claim to be unprepared after its last pod",
    )
    checkpoint = json.loads((drv.state / "checkpoint.json").read_text())
    assert checkpoint["claims"] == {}
    assert sorted(p.name for p in node.cdi_spec_dir.iterdir() if p.name.startswith(DRIVER)) == []


def _resource_status(node: LiveNode, pod: str, ns: str) -> list[dict[str, Any]]:
    """``status.containerStatuses[main].allocatedResourcesStatus`` of the pod (KEP-4680)."""
    p = node.client.get("v1", "Pod", pod, ns)
    for c in (p.get("status") or {}).get("containerStatuses") or []:
        if c.get("name") == "main":
            return list(c.get("allocatedResourcesStatus") or [])
    return []


def test_an_xid_on_a_pods_gpu_shows_in_its_allocated_resources_status(
    kube_node: LiveNode, node_driver: NodeDriverProcess, probe_image: str, node_namespace: str
) -> None:
    """The kubelet v1.37.2 (ResourceHealthStatus on by default since 1.36) reads the driver's
    DRAResourceHealth stream; a fake NVML XID on the pod's GPU makes the pod's status say the
    device is unhealthy, with the driver's message. Last in the module: the GPU stays tainted
    for the XID recovery time (60 s)."""
    node, drv, ns = kube_node, node_driver, node_namespace
    apply_objects(
        node.client,
        [
            template("health-4g", ns, "4Gi", 10),
            probe_pod("health", ns, probe_image, drv, node.name, [1 << 20], template="health-4g"),
        ],
    )
    wait_log(node, "health", ns, "--- done")
    uuid, claim = allocated_uuid(node, "health", ns, drv)
    [result] = claim["status"]["allocation"]["devices"]["results"]

    def health(want: str) -> list[dict[str, Any]] | None:
        st = _resource_status(node, "health", ns)
        found = [r for s in st if s["name"] == "claim:gpu" for r in s.get("resources") or []]
        return st if found and all(r.get("health") == want for r in found) else None

    before = wait_for(
        lambda: health("Healthy"),
        timeout=60,
        what="the pod's allocatedResourcesStatus to show its device Healthy",
        last=lambda: json.dumps(_resource_status(node, "health", ns)),
    )
    [entry] = [s for s in before if s["name"] == "claim:gpu"]
    assert len(entry["resources"]) == 1
    try:
        write_atomically(drv.nvml_cfg, nvml_config(drv.gpus, xids=[(1, uuid, 48)]))
        after = wait_for(
            lambda: health("Unhealthy"),
            timeout=60,
            what="the pod's allocatedResourcesStatus to show its device Unhealthy after XID 48",
            last=lambda: json.dumps(_resource_status(node, "health", ns)),
        )
        [entry] = [s for s in after if s["name"] == "claim:gpu"]
        [res] = entry["resources"]
        assert f"GPU {uuid}: XID 48 (double-bit ECC error)" in res.get("message", ""), res
        # The same judgement tainted the device in the published slice.
        [dev] = [
            d
            for s in node_slices(node.client, node.name)
            for d in s["spec"].get("devices") or []
            if d["name"] == result["device"]
        ]
        assert [t["value"] for t in dev.get("taints") or []] == ["xid-48"]
    finally:
        write_atomically(drv.nvml_cfg, nvml_config(drv.gpus))
        delete_pod(node.client, "health", ns, wait=60)
