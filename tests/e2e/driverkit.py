"""Helpers and fixtures for the node-driver tests (``tessera driver`` against a live control
plane, with the fake NVML of ``native/fake`` describing a node built from a corpus inventory,
and a fake kubelet: a gRPC client over the driver's real unix sockets).

Import the fixtures into a test module with ``from .driverkit import *``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.driver.kubelet import health_stubs, stubs
from tessera.driver.node import DriverConfig
from tessera.enforcement import library_path
from tessera.inventory import GPU, load_inventory
from tessera.kube.client import KubeClient
from tessera.localcluster.cluster import Inventory, register_inventory
from tessera.localcluster.fake_nvml import mig_lines, mig_uuid, nvml_config, write_atomically

from .conftest import CORPUS, LiveCluster

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "native"
#: 8x H100 80GB HBM3 (nvidia-smi -q, driver 535.161.08) and 2x RTX A5000 (nvidia-smi -q -x).
H100 = (
    CORPUS
    / "inventories"
    / "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
)
A5000 = CORPUS / "inventories" / "telegraf__nvidia_smi_testdata__dual_a5000-v13.xml"
GIB = 1 << 30


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``libnvidia-ml.so.1`` of ``native/fake``, built once per session."""
    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.fail("the driver tests need make and gcc to build the fake NVML")
    b = tmp_path_factory.mktemp("fake-nvml")
    r = subprocess.run(
        ["make", "-C", str(NATIVE), f"BUILD={b}", "fake"], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.fail(f"building the fake NVML failed:\n{r.stdout}\n{r.stderr}")
    return b / "fake" / "libnvidia-ml.so.1"


@dataclass
class FakeKubelet:
    """The kubelet side of the plugin protocol: a gRPC client on the driver's sockets."""

    registration_socket: Path
    dra_socket: Path
    _channels: list[Any] = field(default_factory=list)

    def _channel(self, path: Path) -> Any:
        ch = grpc.insecure_channel(f"unix://{path}")
        self._channels.append(ch)
        return ch

    def get_info(self) -> Any:
        reg_pb2, reg_grpc, _, _ = stubs()
        return reg_grpc.RegistrationStub(self._channel(self.registration_socket)).GetInfo(
            reg_pb2.InfoRequest(), timeout=10
        )

    def notify(self, ok: bool, error: str = "") -> None:
        reg_pb2, reg_grpc, _, _ = stubs()
        reg_grpc.RegistrationStub(self._channel(self.registration_socket)).NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=ok, error=error), timeout=10
        )

    def prepare(self, claims: Sequence[tuple[str, str, str]], timeout: float = 45) -> Any:
        """NodePrepareResources for ``(namespace, name, uid)`` claims; returns the reply."""
        _, _, pb2, pb2_grpc = stubs()
        req = pb2.NodePrepareResourcesRequest(
            claims=[pb2.Claim(namespace=n, name=m, uid=u) for n, m, u in claims]
        )
        return pb2_grpc.DRAPluginStub(self._channel(self.dra_socket)).NodePrepareResources(
            req, timeout=timeout
        )

    def unprepare(self, claims: Sequence[tuple[str, str, str]], timeout: float = 45) -> Any:
        _, _, pb2, pb2_grpc = stubs()
        req = pb2.NodeUnprepareResourcesRequest(
            claims=[pb2.Claim(namespace=n, name=m, uid=u) for n, m, u in claims]
        )
        return pb2_grpc.DRAPluginStub(self._channel(self.dra_socket)).NodeUnprepareResources(
            req, timeout=timeout
        )

    def watch_health(self, service: str = "v1.DRAResourceHealth") -> HealthWatch:
        """A ``NodeWatchResources`` stream of ``service`` (one of
        :data:`tessera.driver.kubelet.HEALTH_SERVICES`) on the DRA socket, read by a thread."""
        pb2, pb2_grpc = health_stubs()[service]
        stub = pb2_grpc.DRAResourceHealthStub(self._channel(self.dra_socket))
        return HealthWatch(pb2, stub.NodeWatchResources(pb2.NodeWatchResourcesRequest()))

    def close(self) -> None:
        for ch in self._channels:
            ch.close()


class HealthWatch:
    """The messages of one health stream as they arrive: :attr:`messages` holds
    ``(time.monotonic() when received, {(pool, device): (health name, message)}, response)``."""

    def __init__(self, pb2: Any, stream: Any) -> None:
        self.pb2 = pb2
        self.stream = stream
        self.messages: list[tuple[float, dict[tuple[str, str], tuple[str, str]], Any]] = []
        self.error: BaseException | None = None
        #: Set when the stream ended (the server closed it, or it broke: :attr:`error`).
        self.ended = threading.Event()
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for resp in self.stream:
                devices = {
                    (d.device.pool_name, d.device.device_name): (
                        self.pb2.HealthStatus.Name(d.health),
                        d.message,
                    )
                    for d in resp.devices
                }
                with self._cond:
                    self.messages.append((time.monotonic(), devices, resp))
                    self._cond.notify_all()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                self.error = e
        finally:
            self.ended.set()
            with self._cond:
                self._cond.notify_all()

    def wait(
        self, check: Any, timeout: float, what: str, after: float = 0.0
    ) -> tuple[float, dict[tuple[str, str], tuple[str, str]], Any]:
        """The first message received at or after ``after`` (``time.monotonic()``; so far or
        later) whose device map passes ``check``, waiting at most ``timeout`` seconds;
        AssertionError naming ``what`` and the last message otherwise."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for m in self.messages[seen:]:
                    if m[0] >= after and check(m[1]):
                        return m
                seen = len(self.messages)
                left = deadline - time.monotonic()
                if left <= 0 or self.error is not None:
                    last = self.messages[-1][1] if self.messages else None
                    raise AssertionError(
                        f"no health message with {what} within {timeout} s "
                        f"(stream error: {self.error}); last: {last}"
                    )
                self._cond.wait(left)

    def close(self) -> None:
        self.stream.cancel()


@dataclass
class DriverEnv:
    """One simulated node for the driver: its directories, fake NVML config and GPUs."""

    node: str
    root: Path
    kubelet_root: Path
    cdi_dir: Path
    state_dir: Path
    dev_root: Path
    nvml_config: Path
    nvml_lib: Path
    gpus: list[GPU]
    client: KubeClient
    kubeconfig: Path

    def config(self, **kw: Any) -> DriverConfig:
        base = dict(
            node_name=self.node,
            kubelet_root=self.kubelet_root,
            cdi_dir=self.cdi_dir,
            state_dir=self.state_dir,
            dev_root=self.dev_root,
            library=Path(library_path() or "/nonexistent"),
            nvml_library=str(self.nvml_lib),
            enforcement_backend="auto",
            health_address="127.0.0.1:0",
            rescan_seconds=0.5,
            xid_recovery_seconds=2.0,
        )
        base.update(kw)
        return DriverConfig(**base)  # type: ignore[arg-type]

    nvml: dict[str, Any] = field(default_factory=dict)

    def set_gpus(self, **kw: Any) -> None:
        """Rewrite the fake NVML's machine: the env's settings (``make_env``'s), changed by ``kw``."""
        write_atomically(self.nvml_config, nvml_config(self.gpus, **{**self.nvml, **kw}))

    def kubelet(self) -> FakeKubelet:
        return FakeKubelet(
            self.kubelet_root / "plugins_registry" / "gpu.tessera.dev-reg.sock",
            self.kubelet_root / "plugins" / "gpu.tessera.dev" / "dra.sock",
        )

    def env(self) -> dict[str, str]:
        """Environment for a ``tessera driver`` subprocess of this node."""
        return {
            **os.environ,
            "FAKE_NVML_CONFIG": str(self.nvml_config),
            "KUBECONFIG": str(self.kubeconfig),
        }


def make_env(
    tmp: Path,
    cluster: LiveCluster,
    nvml_lib: Path,
    inventory: Path = H100,
    gpus: Sequence[GPU] | None = None,
    **nvml: Any,
) -> DriverEnv:
    """A fresh node ``drv-<random>`` registered in ``cluster`` (Ready, no slices), with the
    GPUs of ``inventory`` (or ``gpus``) in the fake NVML, stand-in device nodes, and empty
    directories."""
    node = f"drv-{uuid.uuid4().hex[:8]}"
    # Unix socket paths are limited to 107 characters: a short root, removed by the fixture.
    root = Path(tempfile.mkdtemp(prefix=f"{node}-", dir="/tmp"))
    kubelet_root = root / "kubelet"
    (kubelet_root / "plugins_registry").mkdir(parents=True)
    dev = root / "devroot" / "dev"
    dev.mkdir(parents=True)
    gpus = list(gpus) if gpus is not None else load_inventory(inventory)
    # Stand-in device nodes: character devices with /dev/null's numbers, named as NVIDIA's.
    for name in [f"nvidia{g.index}" for g in gpus] + [
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
    ]:
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(1, 3))
    cfg = root / "nvml.cfg"
    write_atomically(cfg, nvml_config(gpus, **nvml))
    inv = Inventory()
    inv.add_node(node, {"kubernetes.io/hostname": node})
    register_inventory(cluster.client, inv)
    return DriverEnv(
        node,
        root,
        kubelet_root,
        root / "cdi",
        root / "state",
        root / "devroot",
        cfg,
        nvml_lib,
        gpus,
        cluster.client,
        cluster.kubeconfig,
        dict(nvml),
    )


@pytest.fixture
def driver_env(
    tmp_path: Path, kube_cluster: LiveCluster, fake_nvml_lib: Path
) -> Iterator[DriverEnv]:
    env = make_env(tmp_path, kube_cluster, fake_nvml_lib)
    yield env
    shutil.rmtree(env.root, ignore_errors=True)
    # Leave the session cluster as it was: other tests compare the scheduler's view of all nodes.
    for s in kube_cluster.client.list(
        "resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.nodeName={env.node}"
    ):
        kube_cluster.client.delete("resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"])
    kube_cluster.client.delete("v1", "Node", env.node)


class DriverProcess:
    """``tessera driver`` for a :class:`DriverEnv`, as a child process (NVML, even the fake one,
    is loaded once per process and cannot be unloaded: the test process must not load it).

    ``options`` are extra command-line options. :meth:`start` waits until ``/readyz`` says the
    DRA service answers (``serving``; ``ok`` needs a kubelet's registration too, which the fake
    kubelet gives only when a test asks: :meth:`FakeKubelet.notify`), or the process exits: then
    :attr:`returncode` and :attr:`output` say why.
    """

    def __init__(self, env: DriverEnv, *options: str) -> None:
        self.env = env
        self.options = options
        self._pick_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def _pick_port(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = self.env
        self.argv = [
            sys.executable,
            "-m",
            "tessera",
            "driver",
            "--node-name",
            env.node,
            "--kubeconfig",
            str(env.kubeconfig),
            "--kubelet-root-dir",
            str(env.kubelet_root),
            "--cdi-dir",
            str(env.cdi_dir),
            "--state-dir",
            str(env.state_dir),
            "--dev-root",
            str(env.dev_root),
            "--nvml-library",
            str(env.nvml_lib),
            "--health-address",
            f"127.0.0.1:{self.port}",
            "--rescan-seconds",
            "0.5",
            "--xid-recovery-seconds",
            "2",
            *self.options,
        ]
        self.log = env.root / f"driver-{self.port}.log"

    def start(self, timeout: float = 60) -> DriverProcess:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                if f"--health-address 127.0.0.1:{self.port}: Address already in use" in self.output:
                    # The free port picked above was taken (by an outgoing connection of a
                    # loaded machine) before the driver bound it: pick another.
                    self._pick_port()
                    return self.start(max(1.0, deadline - time.monotonic()))
                return self
            try:
                if self.ready(attempts=1).get("serving"):
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"tessera driver not ready after {timeout} s:\n{self.output}")
            time.sleep(0.05)

    def ready(self, attempts: int = 3) -> dict[str, Any]:
        """The ``/readyz`` answer (503 answers are returned too). A connection error is retried
        (``attempts`` in all): on a loaded machine one answer can take seconds."""
        for attempt in range(attempts):
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/readyz", timeout=10
                ) as r:
                    return dict(json.loads(r.read()))
            except urllib.error.HTTPError as e:
                return dict(json.loads(e.read()))
            except OSError:
                if attempt == attempts - 1:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


@pytest.fixture
def running_driver(driver_env: DriverEnv) -> Iterator[tuple[DriverEnv, DriverProcess]]:
    """``tessera driver`` on ``driver_env`` (a child process), stopped after the test."""
    d = DriverProcess(driver_env).start()
    assert d.returncode is None, d.output
    try:
        yield driver_env, d
    finally:
        d.stop()


class MonitorProcess:
    """``tessera monitor`` as a child process on a free loopback port; its stderr is read
    into :attr:`log` by a thread (so it never blocks), :attr:`url` is its ``/metrics`` URL.
    With ``must_start=False`` a monitor that exits before serving leaves ``url`` None (its
    status in ``proc.returncode``)."""

    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        timeout: float = 90,
        must_start: bool = True,
    ) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tessera",
                "monitor",
                "--port",
                "0",
                "--address",
                "127.0.0.1",
                *args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.log: list[str] = []
        self.url: str | None = None
        self._serving = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._serving.wait(timeout):
            self.proc.kill()
        if self.url is None:
            self.proc.wait()
            if must_start:
                raise AssertionError("tessera monitor did not start:\n" + "\n".join(self.log))

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip("\n"))
            m = re.search(r"serving (http://\S+)", line)
            if m and self.url is None:
                self.url = m.group(1)
                self._serving.set()
        self._serving.set()

    def scrape(self) -> str:
        assert self.url is not None
        with urllib.request.urlopen(self.url, timeout=10) as r:
            text: str = r.read().decode()
            return text

    def stop(self) -> int:
        """SIGTERM, then its exit status (killed after 30 s)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def node_slices(client: KubeClient, node: str) -> list[dict[str, Any]]:
    return sorted(
        client.list("resource.k8s.io/v1", "ResourceSlice", field_selector=f"spec.nodeName={node}"),
        key=lambda s: s["metadata"]["name"],
    )


def allocated_claim(
    client: KubeClient,
    namespace: str,
    name: str,
    results: list[dict[str, Any]],
    node: str | None = None,
) -> dict[str, Any]:
    """A ResourceClaim with ``status.allocation`` written by hand (as an allocator would),
    for allocations the scheduler would never make (another node, another driver...)."""
    claim = client.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev"}}]
                }
            },
        }
    )
    claim["status"] = {"allocation": {"devices": {"results": results}}}
    if node:
        claim["status"]["allocation"]["nodeSelector"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
    return client.update_status(claim)


def admin_result(pool: str, device: str) -> dict[str, Any]:
    """An allocation result with ``adminAccess`` on a whole ``device`` of pool ``pool``
    (``status.allocation.devices.results[]`` of ``resource.k8s.io/v1``)."""
    return {
        "request": "gpu",
        "driver": "gpu.tessera.dev",
        "pool": pool,
        "device": device,
        "adminAccess": True,
    }


__all__ = [
    "A5000",
    "GIB",
    "H100",
    "DriverEnv",
    "DriverProcess",
    "FakeKubelet",
    "HealthWatch",
    "MonitorProcess",
    "admin_result",
    "allocated_claim",
    "driver_env",
    "fake_nvml_lib",
    "make_env",
    "mig_lines",
    "mig_uuid",
    "node_slices",
    "nvml_config",
    "running_driver",
    "write_atomically",
]
