"""The driver's device health for the kubelet (KEP-4680) read the way the kubelet reads it:
the real ``tessera driver`` process serves ``DRAResourceHealth`` on its DRA unix socket and a
client built from the same ``k8s.io/kubelet`` protos holds a ``NodeWatchResources`` stream open
while the fake NVML reports an ECC XID, a GPU fallen off the bus and a vanished GPU. Each fault
must reach both readers - the device taint in the API server and the health stream - within
10 s of the fake NVML event (a bounded wait, not a timing figure: bench/ measures speed), with
rescans 30 s apart: the XID events and the 2 s presence probe carry it.

The node's GPUs are the 8x H100 80GB HBM3 of a corpus inventory, served by the fake NVML.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from tessera.driver.kubelet import HEALTH_SERVICES, MAX_HEALTH_STREAMS
from tessera.driver.publish import TAINT_KEY
from tessera.driver.resourcehealth import TIMEOUT_SECONDS
from tessera.kube.workloads import wait_for

from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import DriverEnv, DriverProcess, node_slices

pytestmark = pytest.mark.cluster

#: The issue's bound: a fake NVML event is in the taints and in the health report within it.
WITHIN = 10.0
#: Rescans far apart: only the XID events and the presence probe can meet WITHIN.
RESCAN = "30"


@pytest.fixture
def slow_rescan_driver(driver_env: DriverEnv) -> Iterator[tuple[DriverEnv, DriverProcess]]:
    """``tessera driver`` on ``driver_env`` with ``--rescan-seconds 30``, stopped after."""
    d = DriverProcess(driver_env, "--rescan-seconds", RESCAN).start()
    assert d.returncode is None, d.output
    try:
        yield driver_env, d
    finally:
        d.stop()


def _published(env: DriverEnv) -> set[tuple[str, str]]:
    return {
        (s["spec"]["pool"]["name"], d["name"])
        for s in node_slices(env.client, env.node)
        for d in s["spec"].get("devices") or []
    }


def _taint(env: DriverEnv, device: str) -> str | None:
    for s in node_slices(env.client, env.node):
        for d in s["spec"].get("devices") or []:
            if d["name"] == device:
                vals = [t["value"] for t in d.get("taints") or [] if t["key"] == TAINT_KEY]
                return vals[0] if vals else None
    raise AssertionError(f"device {device} is not published")


def _fault_reaches_both(
    env: DriverEnv,
    watch: Any,
    device: str,
    taint: str,
    words: list[str],
    inject: Any,
) -> dict[tuple[str, str], tuple[str, str]]:
    """Inject a fake NVML fault, then wait (bounded by WITHIN from the injection) for the
    device's taint and an UNHEALTHY health message naming ``words``; returns that message."""
    t0 = time.monotonic()
    inject()
    key = (env.node, device)
    _, devices, _ = watch.wait(
        lambda m: m.get(key, ("",))[0] == "UNHEALTHY", WITHIN, f"{device} UNHEALTHY", after=t0
    )
    left = max(0.1, WITHIN - (time.monotonic() - t0))
    wait_for(lambda: _taint(env, device) == taint or None, timeout=left, what=f"taint {taint}")
    msg = devices[key][1]
    for w in words:
        assert w in msg, (w, msg)
    assert len(msg) <= 1024
    return devices


def test_health_stream_reports_faults_with_the_taints(
    slow_rescan_driver: tuple[DriverEnv, DriverProcess],
) -> None:
    env, _d = slow_rescan_driver
    kubelet = env.kubelet()
    try:
        info = kubelet.get_info()
        assert list(info.supported_versions) == ["v1.DRAPlugin", *HEALTH_SERVICES]
        watch = kubelet.watch_health("v1.DRAResourceHealth")
        # A new stream gets the current state at once: every published device, healthy.
        _, first, resp = watch.wait(lambda m: True, WITHIN, "a first message")
        published = _published(env)
        assert len(published) == 8
        assert set(first) == published
        assert {h for h, _ in first.values()} == {"HEALTHY"}
        assert {d.health_check_timeout_seconds for d in resp.devices} == {TIMEOUT_SECONDS}
        assert all(abs(d.last_updated_time - time.time()) < 120 for d in resp.devices)

        # An ECC XID (48: double-bit ECC error) on GPU 2: tainted xid-48 and reported.
        u2 = env.gpus[2].uuid
        got = _fault_reaches_both(
            env,
            watch,
            "gpu-2",
            "xid-48",
            [f"GPU {u2}", "XID 48", "ECC"],
            lambda: env.set_gpus(xids=[(1, u2, 48)]),
        )
        assert {d for d, (h, _) in got.items() if h == "UNHEALTHY"} == {(env.node, "gpu-2")}
        # xid_recovery_seconds=2: healthy again, in both.
        watch.wait(
            lambda m: m[(env.node, "gpu-2")][0] == "HEALTHY", 30, "gpu-2 HEALTHY after the XID"
        )
        wait_for(lambda: _taint(env, "gpu-2") is None or None, timeout=30, what="taint gone")

        # GPU 3 falls off the bus (NVML answers GPU_IS_LOST).
        u3 = env.gpus[3].uuid
        _fault_reaches_both(
            env,
            watch,
            "gpu-3",
            "lost",
            [f"GPU {u3} is lost", "fell off the bus"],
            lambda: env.set_gpus(xids=[(1, u2, 48)], lost=[u3]),
        )
        # GPU 7 vanishes from NVML: still published, reported vanished.
        u7 = env.gpus[7].uuid
        got = _fault_reaches_both(
            env,
            watch,
            "gpu-7",
            "missing",
            [f"GPU {u7} vanished"],
            lambda: env.set_gpus(xids=[(1, u2, 48)], lost=[u3], gone=[u7]),
        )
        assert set(got) == published
        unhealthy = {d for d, (h, _) in got.items() if h == "UNHEALTHY"}
        assert unhealthy == {(env.node, "gpu-3"), (env.node, "gpu-7")}

        # The v1alpha1 service (the kubelet's fallback) streams the same state, at once, and
        # sends it again when nothing changed (the kubelet marks silent devices Unknown).
        old = kubelet.watch_health("v1alpha1.DRAResourceHealth")
        _, a, _ = old.wait(lambda m: True, WITHIN, "a first v1alpha1 message")
        assert a == watch.messages[-1][1]
        t1 = time.monotonic()
        _, b, _ = old.wait(lambda m: True, 30, "a periodic v1alpha1 message", after=t1 + 0.001)
        assert b == a
        old.close()
        watch.close()
    finally:
        kubelet.close()


def test_health_streams_end_when_the_driver_stops(
    running_driver: tuple[DriverEnv, DriverProcess],
) -> None:
    env, d = running_driver
    kubelet = env.kubelet()
    try:
        watches = [kubelet.watch_health() for _ in range(MAX_HEALTH_STREAMS)]
        for w in watches:
            w.wait(lambda m: True, WITHIN, "a first message")
        # One stream more than the driver serves is refused, naming the socket; it holds a
        # server thread each, and prepare calls must keep theirs.
        extra = kubelet.watch_health()
        assert extra.ended.wait(WITHIN)
        assert extra.error is not None and extra.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert str(env.kubelet().dra_socket) in extra.error.details()
        for _ in range(10):  # more calls than the 8 prepare threads, one after the other
            assert len(kubelet.prepare([], timeout=10).claims) == 0
        watches.pop().close()
        deadline = time.monotonic() + WITHIN
        while True:  # the closed stream's thread is given back once the server sees the cancel
            watch = kubelet.watch_health()
            try:
                watch.wait(lambda m: True, 2, "a message on a stream opened after one closed")
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
        watches.append(watch)
        d.stop()
        # The open stream did not hold the stop for its grace period (30 s): it ended.
        m = re.search(r"stopped in ([0-9.]+) s", d.output)
        assert m, d.output
        assert float(m.group(1)) < 10, d.output
        for w in watches:
            assert w.ended.wait(5), "a health stream is still open after the driver stopped"
            assert w.error is None, w.error  # ended cleanly (EOF), not broken
    finally:
        kubelet.close()
