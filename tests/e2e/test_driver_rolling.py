"""Upgrading the node agent on a real node (kubelet v1.37 + containerd): two ``tessera driver``
instances registered at once (``--rolling-update-id``, as the chart's DaemonSet runs them with
``maxSurge: 1``) hand the node over while pods are being created, and no prepare fails; and
``/readyz`` is ready only once the real kubelet has confirmed the registration.

Every pod here asks for a 1 GiB share through a ResourceClaimTemplate; its container only
sleeps (what a container sees of its share is proven in ``test_driver_kubelet.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.driver.kubelet import dra_socket, registration_socket
from tessera.kube.workloads import apply_objects, wait_for
from tessera.localcluster.node import kubelet_metric_lines

from .conftest import LiveNode
from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import node_slices
from .test_driver_kubelet import DRIVER, NodeDriverProcess, template

pytestmark = [pytest.mark.cluster, pytest.mark.node]

#: Pods created before the roll (the time each takes to run is the reference), and after the
#: old instance is gone (pods keep coming from before the new one starts until then).
BASELINE_PODS = 4
AFTER_PODS = 3
#: Seconds between two pod creations.
PACE = 0.5
#: How much longer than the slowest pod without a roll a pod may take during one (issue 20).
SLACK = 5.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _registered_sockets(node: LiveNode) -> set[str]:
    """Registration sockets the kubelet's plugin manager holds as registered (its metric)."""
    out = set()
    for ln in kubelet_metric_lines(node.cluster.kubelet_client(), "plugin_manager_total_plugins"):
        if 'state="actual_state_of_world"' in ln and not ln.endswith(" 0"):
            out.add(ln.split('socket_path="', 1)[1].split('"', 1)[0])
    return out


def _kubelet_pid(node: LiveNode) -> int:
    state = json.loads(node.cluster.state_file.read_text())
    return int(state["components"]["kubelet"]["pid"])


def _wait_ready(drv: NodeDriverProcess, timeout: float = 90) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        assert drv.proc.poll() is None, f"tessera driver exited:\n{drv.output[-4000:]}"
        r = drv.readyz()
        return r[1] if r is not None and r[0] == 200 else None

    return wait_for(
        ready,
        timeout=timeout,
        interval=0.1,
        what=f"driver instance {drv.instance} to be ready",
        last=lambda: drv.output[-3000:],
    )


@pytest.fixture
def driver_root(kube_node: LiveNode, node_device_class: str) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="tessera-roll-", dir="/tmp"))
    yield root
    for s in node_slices(kube_node.client, kube_node.name):
        kube_node.client.delete("resource.k8s.io/v1", "ResourceSlice", s["metadata"]["name"])
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def sleeper_image(kube_node: LiveNode) -> str:
    return kube_node.image("tessera-roll-sleeper", {}).ref


def _pod(name: str, ns: str, image: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "share-1g"}],
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


class PodClock:
    """Creates pods and records, for each, the seconds from its creation until the test first
    sees it Running (pods are listed every 0.1 s)."""

    def __init__(self, node: LiveNode, ns: str, image: str) -> None:
        self.node, self.ns, self.image = node, ns, image
        self.created: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._poll, daemon=True)
        self._watch.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            for p in self.node.client.list("v1", "Pod", self.ns):
                name = p["metadata"]["name"]
                if (p.get("status") or {}).get("phase") == "Running" and name not in self.running:
                    self.running[name] = time.monotonic()
            self._stop.wait(0.1)

    def create(self, name: str) -> None:
        self.created[name] = time.monotonic()
        self.node.client.create(_pod(name, self.ns, self.image, self.node.name))

    def wait_all(self, timeout: float = 180) -> dict[str, float]:
        """Seconds to Running per pod, once every created pod runs."""
        wait_for(
            lambda: True if set(self.running) >= set(self.created) else None,
            timeout=timeout,
            interval=0.2,
            what=f"pods {sorted(set(self.created) - set(self.running))} to run",
        )
        return {n: self.running[n] - self.created[n] for n in self.created}

    def close(self) -> None:
        self._stop.set()
        self._watch.join(5)


def _prepare_failures(node: LiveNode, ns: str) -> tuple[list[str], dict[str, str]]:
    """``(failures, authorizer_races)``: the kubelet's prepare failures of the namespace's pods
    (events), and apart from them, by pod, those where the kubelet's own read of the claim was
    refused by the API server's node authorizer ("no relationship found between node"): its
    graph had not yet linked the new pod's claim to the node, before any driver was called."""
    failures, races = [], {}
    for e in node.client.list("v1", "Event", ns):
        msg = str(e.get("message"))
        if (
            e.get("reason") != "FailedPrepareDynamicResources"
            and "PrepareDynamicResources" not in msg
        ):
            continue
        pod = str((e.get("involvedObject") or {}).get("name"))
        if "fetch ResourceClaim" in msg and "no relationship found between node" in msg:
            races[pod] = msg
        else:
            failures.append(f"{pod}: {msg}")
    return failures, races


def test_a_rolling_update_of_the_driver_fails_no_prepare(
    kube_node: LiveNode,
    fake_nvml_lib: Path,
    node_namespace: str,
    sleeper_image: str,
    driver_root: Path,
) -> None:
    node, ns = kube_node, node_namespace
    a = NodeDriverProcess(
        node, driver_root, fake_nvml_lib, instance=f"a-{uuid.uuid4()}", health_port=_free_port()
    )
    b: NodeDriverProcess | None = None
    clock = PodClock(node, ns, sleeper_image)
    try:
        _wait_ready(a)
        apply_objects(node.client, [template("share-1g", ns, "1Gi", 5)])
        for i in range(BASELINE_PODS):
            clock.create(f"before-{i}")
            time.sleep(PACE)
        baseline = clock.wait_all()

        # The roll: B starts while pods keep coming; once B is ready (registered and serving,
        # when the DaemonSet controller would delete the old pod), A gets SIGTERM.
        handed_over: dict[str, float] = {}

        def roll() -> None:
            nonlocal b
            b = NodeDriverProcess(
                node,
                driver_root,
                fake_nvml_lib,
                instance=f"b-{uuid.uuid4()}",
                health_port=_free_port(),
            )
            _wait_ready(b)
            handed_over["b ready"] = time.monotonic()
            a.proc.send_signal(signal.SIGTERM)
            a.proc.wait(60)
            handed_over["a gone"] = time.monotonic()

        roller = threading.Thread(target=roll)
        n = 0
        while sum(t > handed_over.get("a gone", 1e18) for t in clock.created.values()) < AFTER_PODS:
            clock.create(f"during-{n}")
            n += 1
            if n == 2:
                roller.start()
            assert n < 120, f"the roll did not finish:\nA:\n{a.output[-3000:]}"
            time.sleep(PACE)
        roller.join(60)
        assert not roller.is_alive()
        during = clock.wait_all()
        during = {k: v for k, v in during.items() if k.startswith("during-")}
        assert b is not None
        # Pods were created while A was stopping, not only before and after.
        stopping = [
            k
            for k, t in clock.created.items()
            if handed_over["b ready"] <= t <= handed_over["a gone"]
        ]
        assert stopping, (handed_over, clock.created)

        failures, races = _prepare_failures(node, ns)
        assert failures == []
        if races:
            print(
                f"\nnot the driver's: the node authorizer refused the kubelet's claim read: {races}"
            )
        slowest = max(baseline.values())
        late = {n: round(t, 2) for n, t in during.items() if t > slowest + SLACK and n not in races}
        assert late == {}, (
            f"pods slower than the slowest without a roll ({slowest:.2f} s) + {SLACK} s: {late}"
        )
        print(
            f"\npod start without a roll: max {slowest:.2f} s, mean "
            f"{sum(baseline.values()) / len(baseline):.2f} s; during the roll: max "
            f"{max(during.values()):.2f} s, mean {sum(during.values()) / len(during):.2f} s; "
            f"A stopped {handed_over['a gone'] - handed_over['b ready']:.2f} s after B was ready; "
            f"{len(stopping)} pod(s) created while A was stopping"
        )

        # A removed its own sockets only, and said so; B serves and publishes.
        root = node.kubelet_root_dir
        assert a.proc.returncode == 0, a.output[-3000:]
        assert not registration_socket(root, DRIVER, a.instance).exists()
        assert not dra_socket(root, DRIVER, a.instance).exists()
        assert registration_socket(root, DRIVER, b.instance).is_socket()
        assert dra_socket(root, DRIVER, b.instance).is_socket()
        stopped = [ln for ln in a.output.splitlines() if " tessera driver: stopped in " in ln]
        assert len(stopped) == 1
        assert str(registration_socket(root, DRIVER, a.instance)) in stopped[0]
        assert str(dra_socket(root, DRIVER, a.instance)) in stopped[0]
        print(stopped[0])
        t_roll = clock.created["during-0"]
        print(
            "during the roll (created s after the first, seconds to Running): "
            + ", ".join(
                f"{k} {clock.created[k] - t_roll:.1f}/{v:.2f}" for k, v in sorted(during.items())
            )
            + f"; B ready at {handed_over['b ready'] - t_roll:.1f}, A gone at "
            f"{handed_over['a gone'] - t_roll:.1f}"
        )
        assert "another driver instance serves this node" in b.output
        assert (driver_root / "state" / "publisher").read_text().strip() == b.instance
        assert wait_for(
            lambda: (
                True
                if str(registration_socket(root, DRIVER, a.instance))
                not in _registered_sockets(node)
                else None
            ),
            timeout=30,
            what="the kubelet to drop instance A",
        )

        # One state for both: every pod's claim is recorded once, with its CDI spec; B then
        # unprepares them all, those A prepared included.
        checkpoint = json.loads((driver_root / "state" / "checkpoint.json").read_text())
        claims = {
            c["metadata"]["uid"]
            for c in node.client.list("resource.k8s.io/v1", "ResourceClaim", ns)
        }
        assert set(checkpoint["claims"]) == claims and len(claims) == len(clock.created)
        for uid in claims:
            assert (node.cdi_spec_dir / f"{DRIVER}-claim_{uid}.json").is_file()
        for name in clock.created:
            node.client.delete("v1", "Pod", name, ns)
        wait_for(
            lambda: (
                True
                if json.loads((driver_root / "state" / "checkpoint.json").read_text())["claims"]
                == {}
                else None
            ),
            timeout=120,
            what="instance B to unprepare every claim",
            last=lambda: b.output[-3000:] if b else "",
        )
        assert not any(
            (node.cdi_spec_dir / f"{DRIVER}-claim_{uid}.json").exists() for uid in claims
        )
        assert sorted(os.listdir(driver_root / "state" / "locks")) == []
    finally:
        clock.close()
        # Pods go while a driver still runs (their claims must be unprepared before the
        # namespace can be deleted).
        for p in node.client.list("v1", "Pod", ns):
            node.client.delete("v1", "Pod", p["metadata"]["name"], ns)
        with contextlib.suppress(Exception):
            wait_for(
                lambda: True if not node.client.list("v1", "Pod", ns) else None,
                timeout=120,
                what="the pods to go",
            )
        for d in (a, b):
            if d is not None:
                d.stop()


def test_readyz_is_ready_only_once_the_kubelet_registered_the_plugin(
    kube_node: LiveNode, fake_nvml_lib: Path, driver_root: Path
) -> None:
    node = kube_node
    instance = f"r-{uuid.uuid4()}"
    reg = str(registration_socket(node.kubelet_root_dir, DRIVER, instance))
    kubelet = _kubelet_pid(node)
    # The real kubelet, paused: it cannot register the plugin until it is continued.
    os.kill(kubelet, signal.SIGSTOP)
    drv = None
    try:
        drv = NodeDriverProcess(
            node, driver_root, fake_nvml_lib, instance=instance, health_port=_free_port()
        )

        def serving() -> dict[str, Any] | None:
            assert drv is not None and drv.proc.poll() is None, drv.output if drv else ""
            r = drv.readyz()
            return r[1] | {"status": r[0]} if r is not None and r[1].get("serving") else None

        before = wait_for(serving, timeout=60, interval=0.1, what="the DRA service to answer")
        time.sleep(1.0)
        again = drv.readyz()
        assert again is not None
    finally:
        os.kill(kubelet, signal.SIGCONT)
    assert (before["status"], before["ok"], before["registered"]) == (503, False, False)
    assert (again[0], again[1]["ok"], again[1]["registered"]) == (503, False, False)
    after = _wait_ready(drv, timeout=60)
    assert (after["ok"], after["registered"], after["serving"]) == (True, True, True)
    assert reg in _registered_sockets(node)  # the kubelet agrees
    drv.stop()
    assert " tessera driver: stopped in " in drv.output
    wait_for(
        lambda: True if reg not in _registered_sockets(node) else None,
        timeout=30,
        what="the kubelet to drop the stopped instance",
    )
