"""The devices' health for the kubelet (KEP-4680): one judgement for the device taints and the
health report, over the slices the publisher builds from real inventories (MIG devices and
dynamic-MIG placements included), and the feed the health streams read."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

from tessera.driver.backend import LIBRARY
from tessera.driver.publish import TAINT_KEY, GpuRecord, desired_slices
from tessera.driver.resourcehealth import (
    HEALTHY,
    NOT_WATCHED,
    UNHEALTHY,
    UNKNOWN,
    DeviceHealth,
    HealthFeed,
    health_report,
)
from tessera.inventory import load_inventory
from tessera.inventory.mig import DynamicMIG

REPO = Path(__file__).resolve().parents[2]
A100_MIG = REPO / "tests" / "data" / "mig" / "a100-pcie-40gb.2g10gb-3x1g5gb.nvidia-smi-q-x.xml"
H100 = "gpud__nvidia-query_testdata__nvidia-smi-q.535.161.08.8xH100-80GB-HBM3.txt"
NODE = "node-a"
NOW = 1_800_000_000.0


def _records(corpus: Path) -> list[GpuRecord]:
    """8x H100 (GPUs 0-1 in MIG mode, for dynamic MIG) and, as GPU 8, an A100 with static MIG
    instances."""
    h100 = [
        replace(g, mig_enabled=g.index < 2) for g in load_inventory(corpus / "inventories" / H100)
    ]
    a100 = [replace(g, index=8) for g in load_inventory(A100_MIG)]
    return [GpuRecord(g, g.index, ok_since=NOW - 600) for g in [*h100, *a100]]


def _slices(records: list[GpuRecord], now: float) -> list[dict]:
    return desired_slices(
        NODE, "gpu.tessera.dev", records, LIBRARY, 1, now, 60, DynamicMIG(gpus=(0, 1)), "test"
    )


def _tainted(slices: list[dict]) -> dict[str, str]:
    return {
        d["name"]: t["value"]
        for s in slices
        for d in s["spec"].get("devices") or []
        for t in d.get("taints") or []
        if t["key"] == TAINT_KEY
    }


def test_report_lists_every_published_device_and_agrees_with_the_taints(corpus: Path) -> None:
    records = _records(corpus)
    uuid = {r.gpu.index: r.gpu.uuid for r in records}
    records[1].xid, records[1].xid_at = 48, NOW - 5  # dynamic-MIG GPU: ECC fault
    records[4].health = "lost"
    records[8].health = "missing"  # static-MIG GPU
    slices = _slices(records, NOW)
    report = health_report(slices, records, NOW, 60)

    published = sorted(
        (s["spec"]["pool"]["name"], d["name"])
        for s in slices
        for d in s["spec"].get("devices") or []
    )
    assert [(h.pool, h.device) for h in report] == published
    assert {h.pool for h in report} == {NODE}
    # The whole dynamic GPU, its placements and the static MIG devices are all there.
    names = {h.device for h in report}
    assert "gpu-1" in names and any(n.startswith("gpu-1-mig-") for n in names)
    assert any(n.startswith("gpu-8-mig-") for n in names)

    unhealthy = {h.device: h.message for h in report if h.health == UNHEALTHY}
    assert set(unhealthy) == set(_tainted(slices)), "the report and the taints disagree"
    assert {h.health for h in report if h.device not in unhealthy} == {HEALTHY}
    for name, msg in unhealthy.items():
        assert len(msg) <= 1024
        if name == "gpu-1" or name.startswith("gpu-1-"):
            assert _tainted(slices)[name] == "xid-48"
            assert f"GPU {uuid[1]}: XID 48 (double-bit ECC error)" in msg
        elif name == "gpu-4":
            assert _tainted(slices)[name] == "lost"
            assert f"GPU {uuid[4]} is lost" in msg and "fell off the bus" in msg
        else:
            assert name.startswith("gpu-8-mig-"), name
            assert _tainted(slices)[name] == "missing"
            assert f"GPU {uuid[8]} vanished" in msg

    # 60 s after the XID (and answering all along) GPU 1 is healthy again in both.
    later = NOW + 60
    slices = _slices(records, later)
    report = health_report(slices, records, later, 60)
    again = {h.device for h in report if h.health == UNHEALTHY}
    assert again == set(_tainted(slices))
    assert not any(n == "gpu-1" or n.startswith("gpu-1-") for n in again)


def test_without_nvml_healthy_looking_devices_are_unknown(corpus: Path) -> None:
    records = _records(corpus)[:8]
    records[2].health = "missing"  # nvidia-smi no longer lists it: still judged
    slices = _slices(records, NOW)
    report = {h.device: h for h in health_report(slices, records, NOW, 60, watched=False)}
    assert report["gpu-2"].health == UNHEALTHY
    assert {h.health for n, h in report.items() if n != "gpu-2"} == {UNKNOWN}
    assert report["gpu-3"].message == NOT_WATCHED


def test_a_device_naming_no_known_gpu_is_unknown(corpus: Path) -> None:
    records = _records(corpus)[:8]
    slices = _slices(records, NOW)
    [dev] = [d for s in slices for d in s["spec"].get("devices") or [] if d["name"] == "gpu-5"]
    dev["attributes"]["uuid"] = {"string": "GPU-nobody"}
    report = {h.device: h for h in health_report(slices, records, NOW, 60)}
    assert report["gpu-5"].health == UNKNOWN
    assert "GPU-nobody" in report["gpu-5"].message
    assert report["gpu-4"].health == HEALTHY


def test_feed_sends_at_once_on_change_and_periodically() -> None:
    feed = HealthFeed(period=0.3)
    a = (DeviceHealth(NODE, "gpu-0", HEALTHY),)
    b = (DeviceHealth(NODE, "gpu-0", UNHEALTHY, "GPU X: XID 79"),)
    done = threading.Event()
    got: list[tuple[tuple[DeviceHealth, ...], float]] = []
    arrived = threading.Condition()

    def read() -> None:
        for item in feed.stream(lambda: not done.is_set(), tick=0.05):
            with arrived:
                got.append(item)
                arrived.notify_all()

    def wait_for(n: int) -> None:
        with arrived:
            assert arrived.wait_for(lambda: len(got) >= n, timeout=10), got

    t = threading.Thread(target=read, daemon=True)
    t.start()
    assert feed.publish(a, NOW)  # a stream opened before any report waits for the first
    wait_for(1)
    assert got[0] == (a, NOW)
    assert not feed.publish(a, NOW + 1)  # same report: no change, no early message
    wait_for(2)  # ... but it is sent again after the period
    assert got[1] == (a, NOW + 1)
    assert feed.publish(b, NOW + 2)
    wait_for(3)
    assert got[2] == (b, NOW + 2)
    done.set()
    t.join(timeout=5)
    assert not t.is_alive()
