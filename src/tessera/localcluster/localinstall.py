"""Tessera installed by its own Helm chart on this machine's real node, with fake GPUs.

What ``make demo`` and the ``install`` e2e test share (one place for every decision):

* :func:`make_fake_gpu_host` lays out, under a directory of the local cluster's state dir, what
  a GPU node has and this machine lacks: stand-in device nodes (``dev/nvidia*``, character
  devices with ``/dev/null``'s numbers) and a driver root holding the project's fake NVML
  (``native/fake``'s ``libnvidia-ml.so.1``) with a node description written from a real
  ``nvidia-smi`` inventory (:mod:`tessera.localcluster.fake_nvml`). The node agents load that NVML
  through the chart's ``node.nvmlLibrary``; nothing else about them is faked.
* :func:`chart_values` gives the chart (``deploy/helm/tessera``) the node's real paths: the
  kubelet's root dir, containerd's CDI spec dir, and state, library and device directories under
  the cluster's state dir (so ``tessera cluster down`` removes them with the node).
* :func:`helm` runs the project's helm (``tools/helm/bin/helm``) against the cluster.
* :func:`kube_scheduler_image` is legacy mode's second kube-scheduler without a registry: the
  project's own static binary (``tools/kube/bin/kube-scheduler``) alone in an image named for
  its version, which the chart's ``legacy.scheduler.image`` then names.

The node must have been started with ``tessera cluster up --kubelet`` without Tessera's
DeviceClasses (the chart owns them); the image is the one ``make image`` builds from
``deploy/images/Dockerfile``, imported into the node's containerd.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.inventory import GPU, load_inventory, load_topology

from . import build, images
from .fake_nvml import nvml_config
from .node import NodeInfo

#: Where the chart mounts ``node.nvidiaDriverRoot`` in the node agents' containers.
DRIVER_ROOT_IN_CONTAINER = "/driver-root"
#: The fake NVML and its node description, as the node agents see them.
NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_CONFIG = "nvml.cfg"
#: Device nodes every GPU node has besides one ``nvidiaN`` per GPU.
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
#: The bundled inventory and topology the demo's node gets (8x H100 80GB HBM3, NVLink NV12).
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DEFAULT_INVENTORY = (
    EXAMPLES
    / "inventories"
    / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
)
DEFAULT_TOPOLOGY = EXAMPLES / "topologies" / "litgpt__tests_test_utils__topo-m.8xGPU-NV12-10nic.txt"
#: The node label NVIDIA's GPU feature discovery sets; the chart's default affinity selects it.
GPU_NODE_LABEL = ("nvidia.com/gpu.present", "true")
#: Legacy mode's kube-scheduler image made here (:func:`kube_scheduler_image`): the repository
#: (its tag is the binary's version, which is what the chart's ``legacy.scheduler.image.tag``
#: defaults to: the API server's version) and where the binary is, as in
#: ``registry.k8s.io/kube-scheduler`` (the chart runs ``kube-scheduler`` from ``PATH``).
KUBE_SCHEDULER_REPOSITORY = f"{images.LOCAL_REGISTRY}/kube-scheduler"
KUBE_SCHEDULER_PATH = "/usr/local/bin/kube-scheduler"


class LocalInstallError(RuntimeError):
    """A step of the local install failed; the message names the step and its output."""


@dataclass(frozen=True)
class FakeGpuHost:
    """The fake GPU hardware of one node (host paths).

    ``dev_root`` holds ``dev/nvidia*``; ``driver_root`` holds the fake NVML and its node
    description (mounted read-only at :data:`DRIVER_ROOT_IN_CONTAINER`); ``fake_libcuda`` is
    the matching fake ``libcuda.so.1`` for probes in containers; ``gpus`` the inventory's GPUs.
    """

    root: Path
    dev_root: Path
    driver_root: Path
    fake_libcuda: Path
    gpus: tuple[GPU, ...]

    def fake_gpus_env(self) -> str:
        """``FAKE_GPUS`` for the fake libcuda: ``UUID=BYTES`` of every GPU, comma-separated."""
        return ",".join(f"{g.uuid}={g.memory_bytes}" for g in self.gpus)


def helm_binary() -> Path:
    """``tools/helm/bin/helm``, built by ``tools/helm/build.sh`` when missing or stale."""
    repo = images.project_root()
    r = subprocess.run(
        ["bash", str(repo / "tools" / "helm" / "build.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise LocalInstallError(f"tools/helm/build.sh failed: {(r.stdout + r.stderr)[-2000:]}")
    return repo / "tools" / "helm" / "bin" / "helm"


def build_fake_libraries(out: Path) -> Path:
    """Build ``native/fake`` (``libnvidia-ml.so.1``, ``libcuda.so.1``) into ``out``; returns
    the directory holding both. Raises :class:`LocalInstallError` with make's output."""
    native = images.project_root() / "native"
    r = subprocess.run(
        ["make", "-C", str(native), f"BUILD={out}", "fake"],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise LocalInstallError(f"building the fake NVML failed:\n{(r.stdout + r.stderr)[-3000:]}")
    return out / "fake"


def make_fake_gpu_host(
    root: Path,
    inventory: Path = DEFAULT_INVENTORY,
    topology: Path | None = DEFAULT_TOPOLOGY,
    *,
    fake_dir: Path | None = None,
) -> FakeGpuHost:
    """Lay out fake GPU hardware under ``root`` (made anew) for ``inventory``'s GPUs (any
    format :func:`tessera.inventory.load_inventory` reads; ``topology``: ``nvidia-smi topo -m``
    for NUMA nodes and NVLink domains). ``fake_dir``: an existing build of ``native/fake``
    (built into ``root`` when None). Needs root (``mknod``)."""
    if root.exists():
        shutil.rmtree(root)
    gpus = tuple(load_inventory(inventory))
    topo = load_topology(topology) if topology is not None else None
    fake = fake_dir or build_fake_libraries(root / "build")
    dev = root / "devroot" / "dev"
    dev.mkdir(parents=True)
    for name in [f"nvidia{g.index}" for g in gpus] + list(CONTROL_DEVICES):
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 3))
        os.chmod(dev / name, 0o666)
    driver_root = root / "driver-root"
    driver_root.mkdir()
    shutil.copy2(fake / NVML_LIBRARY, driver_root / NVML_LIBRARY)
    (driver_root / NVML_CONFIG).write_text(nvml_config(gpus, topology=topo))
    return FakeGpuHost(root, root / "devroot", driver_root, fake / "libcuda.so.1", gpus)


def chart_values(
    node: NodeInfo,
    host: FakeGpuHost,
    image_ref: str,
    state: Path,
    *,
    monitor_port: int = 31995,
) -> dict[str, Any]:
    """Helm values for the local node: the image ``image_ref`` (``repository:tag``) as
    imported into the node's containerd (never pulled), the node's kubelet root and CDI spec
    dir, Tessera's host directories under ``state``, the fake NVML (the monitor runs without
    NVML: the fake has no per-process figures to add), and the node agents' default affinity
    (the node carries :data:`GPU_NODE_LABEL`)."""
    repository, _, tag = image_ref.rpartition(":")
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "node": {
            "nvidiaDriverRoot": str(host.driver_root),
            "nvmlLibrary": f"{DRIVER_ROOT_IN_CONTAINER}/{NVML_LIBRARY}",
            "extraEnv": [
                {"name": "FAKE_NVML_CONFIG", "value": f"{DRIVER_ROOT_IN_CONTAINER}/{NVML_CONFIG}"}
            ],
        },
        "driver": {
            "kubeletRootDir": str(node.kubelet_root_dir),
            "cdiDir": str(node.cdi_spec_dir),
            "stateDir": str(state / "driver"),
            "libraryDir": str(state / "lib"),
            "devRoot": str(host.dev_root),
            "rescanSeconds": 2,
        },
        "monitor": {"nvml": False, "apiInterval": 2},
        "metrics": {"port": monitor_port},
    }


def helm(
    kubeconfig: Path,
    *args: str,
    values: Mapping[str, Any] | None = None,
    work_dir: Path,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run ``helm ARGS`` against the cluster of ``kubeconfig`` (with ``values`` written to a
    file in ``work_dir`` and passed with ``-f``). Raises :class:`LocalInstallError` naming the
    command and its output when it fails."""
    import yaml

    cmd: list[str] = [str(helm_binary()), *args, "--kubeconfig", str(kubeconfig)]
    if values is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        vf = work_dir / "values.yaml"
        vf.write_text(yaml.safe_dump(dict(values), sort_keys=False))
        cmd += ["-f", str(vf)]
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(work_dir / "helm-cache"),
        "HELM_CONFIG_HOME": str(work_dir / "helm-config"),
        "HELM_DATA_HOME": str(work_dir / "helm-data"),
    }
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if r.returncode != 0:
        raise LocalInstallError(f"{' '.join(cmd[:3])} failed ({r.returncode}): {r.stderr[-3000:]}")
    return r


def kubectl(kubeconfig: Path, *args: str, timeout: float = 120) -> str:
    """``kubectl ARGS`` (the project's, ``tools/kube/bin``) against ``kubeconfig``; its stdout.
    Raises :class:`LocalInstallError` with kubectl's stderr when it fails."""
    cmd = [str(build.binary("kubectl")), f"--kubeconfig={kubeconfig}", *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode != 0:
        raise LocalInstallError(f"kubectl {' '.join(args)} failed: {r.stderr.strip()[-2000:]}")
    return r.stdout


def kube_scheduler_image(node: NodeInfo) -> images.Image:
    """``tessera.local/kube-scheduler:v<major>.<minor>.<patch>``: the project's kube-scheduler
    (``tools/kube/bin``, built by ``make kube`` at ``tools/kube/go.mod``'s version; static, so
    nothing else goes in: no shell, no libraries, as upstream's distroless image) at
    :data:`KUBE_SCHEDULER_PATH`, imported into the node's containerd. The tag is the version
    the binary reports (``kube-scheduler --version``). Raises :class:`LocalInstallError` when
    the binary is missing, dynamically linked or reports no version."""
    binary = build.binary("kube-scheduler")
    if not binary.is_file():
        raise LocalInstallError(f"{binary} is missing: build it with `make kube`")
    if not images.is_static_elf(binary):
        raise LocalInstallError(
            f"{binary} is dynamically linked: the image holds the binary alone "
            "(tools/kube/build.sh builds it with CGO_ENABLED=0)"
        )
    r = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    version = r.stdout.strip().removeprefix("Kubernetes ")
    if r.returncode != 0 or not version.startswith("v"):
        raise LocalInstallError(
            f"{binary} --version said {(r.stdout + r.stderr).strip()!r}, not 'Kubernetes vX.Y.Z'"
        )
    return node.build_image(
        KUBE_SCHEDULER_REPOSITORY.removeprefix(f"{images.LOCAL_REGISTRY}/"),
        {KUBE_SCHEDULER_PATH: images.ImageFile(source=binary, mode=0o755)},
        tag=version,
        busybox=False,
        entrypoint=[KUBE_SCHEDULER_PATH],
    )


def chart_dir() -> Path:
    """``deploy/helm/tessera`` of the checkout."""
    return images.project_root() / "deploy" / "helm" / "tessera"


#: The CUDA probe (``cuda_probe BYTES...``: cuInit, total memory, a context, free/total, then one
#: cuMemAlloc per argument; ``PROBE_HOLD=1`` keeps the allocations), compiled into probe images.
PROBE_SOURCE = Path(__file__).resolve().parent / "node_assets" / "cuda_probe.c"
#: Where probe images keep it.
PROBE_PATH = "/opt/probe/cuda_probe"


def probe_image(node: NodeInfo, ref: str, host: FakeGpuHost, work: Path) -> images.Image:
    """Build ``ref`` and import it into the node's containerd: busybox, ``/bin/bash`` running
    busybox's ``sh`` (so HAMi's examples, ``bash -c ...``, run unchanged), the CUDA probe at
    :data:`PROBE_PATH` and the fake ``libcuda.so.1`` on ``LD_LIBRARY_PATH`` (plus the shared
    libraries both need). ``ref`` may name a public image (``docker.io/library/ubuntu:22.04``):
    pods that use it with the default pull policy of a tag find it and pull nothing."""
    work.mkdir(parents=True, exist_ok=True)
    probe = compile_probe(PROBE_SOURCE, work / "cuda_probe")
    files: dict[str, images.FileLike] = {
        PROBE_PATH: probe,
        "/opt/fake/libcuda.so.1": host.fake_libcuda,
        "/bin/bash": images.ImageFile(data=b'#!/bin/sh\nexec /bin/sh "$@"\n', mode=0o755),
    }
    image = images.build_image(
        ref,
        files,
        node.images_dir,
        env={"LD_LIBRARY_PATH": "/opt/fake"},
        libraries_for=[PROBE_PATH, "/opt/fake/libcuda.so.1"],
    )
    images.import_image(node.ctr, node.containerd_socket, image)
    return image


def compile_probe(source: Path, out: Path) -> Path:
    """Compile a C probe (``-ldl``) for the probe image; raises with the compiler's output."""
    r = subprocess.run(
        [os.environ.get("CC", "gcc"), "-O2", "-Wall", "-o", str(out), str(source), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        raise LocalInstallError(f"compiling {source.name} failed:\n{r.stderr[-2000:]}")
    return out


def hami_pod(
    name: str,
    namespace: str,
    image: str,
    *,
    gpumem: int,
    gpucores: int,
    command: Sequence[str] = ("sh", "-c", "sleep 86400"),
) -> dict[str, Any]:
    """A HAMi-style pod: one container asking ``nvidia.com/gpu: 1``, ``nvidia.com/gpumem``
    (MiB) and ``nvidia.com/gpucores`` (percent), for the chart's webhook to convert."""
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": gpumem, "nvidia.com/gpucores": gpucores}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "command": list(command),
                    "resources": {"limits": limits},
                }
            ],
        },
    }


def tessera_pods_ready(pods: Sequence[Mapping[str, Any]]) -> bool:
    """True when every pod is Running with every container ready."""
    for p in pods:
        st = p.get("status") or {}
        if st.get("phase") != "Running":
            return False
        cs = st.get("containerStatuses") or []
        if not cs or not all(c.get("ready") for c in cs):
            return False
    return bool(pods)
