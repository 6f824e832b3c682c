"""`tessera monitor` as a process over regions written by the real enforcement library (C
processes over the fake libcuda) and over fake NVML, scraped by a real Prometheus server.

The stack (module scope): three claims in a region directory laid out as the driver keeps it
(``<dir>/<claim>/usage``, ``limits``, optional ``claim.json``), C processes holding GPU
memory through ``libtessera-enforce.so``, a truncated region and one of another version,
the exporter (``tessera monitor --no-api``) and Prometheus scraping it every second with the
repository's alert rules loaded. PromQL over HAMi's and Tessera's names must return the bytes
the processes hold.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from native_helpers import PHYS, UUIDS, Build, Claim, MiB, wait_line

from prom_server import REPO, Prometheus, prometheus
from tessera.enforcement import region as R
from tessera.enforcement.layout import REGION_FILE
from tessera.enforcement.limits import GpuLimit

pytestmark = pytest.mark.native

UTIL = 37  # FAKE_GPU_UTIL: what fake NVML reports as utilization.gpu
RULES = REPO / "deploy" / "monitoring" / "tessera-alerts.yaml"
DASHBOARD = REPO / "deploy" / "monitoring" / "tessera-dashboard.json"


@dataclass
class Stack:
    region_dir: Path
    exporter: subprocess.Popen[str]
    url: str
    log: list[str]
    prom: Prometheus
    procs: dict[str, subprocess.Popen[str]]

    def scrape(self) -> str:
        with urllib.request.urlopen(self.url, timeout=10) as r:
            return str(r.read().decode())


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of the one series ``name`` whose labels include ``labels``, in exposition text."""
    found = []
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        lab = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
        if all(lab.get(k) == v for k, v in labels.items()):
            found.append(float(line.rsplit(" ", 1)[1]))
    assert len(found) == 1, f"{name}{labels}: {len(found)} series in\n{text}"
    return found[0]


def _start_exporter(
    region_dir: Path, env: dict[str, str]
) -> tuple[subprocess.Popen[str], str, list[str]]:
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tessera",
            "monitor",
            "--port",
            "0",
            "--address",
            "127.0.0.1",
            "--region-dir",
            str(region_dir),
            "--node-name",
            "gpu-node-1",
            "--no-api",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stderr is not None
    log: list[str] = []
    timer = threading.Timer(60, p.kill)
    timer.start()
    try:
        for line in p.stderr:
            log.append(line.rstrip("\n"))
            m = re.search(r"serving (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        else:
            raise AssertionError(f"tessera monitor exited {p.wait()}: {log}")
    finally:
        timer.cancel()

    def drain() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            log.append(line.rstrip("\n"))

    threading.Thread(target=drain, daemon=True).start()
    return p, url, log


@pytest.fixture(scope="module")
def stack(plain: Build, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("monitor")
    regions = tmp / "claims"
    regions.mkdir()
    state = tmp / "gpu-state"
    # Claim "uid-a": one GPU, 128 MiB, 30 cores; the driver's claim.json names it and its pod.
    a = Claim(regions, plain, [GpuLimit(UUIDS[0], 128 * MiB, 30)], state=state, name="uid-a")
    (a.dir / "claim.json").write_text(
        json.dumps(
            {
                "version": 1,
                "uid": "uid-a",
                "namespace": "team-a",
                "name": "trainer-0-gpu",
                "driver": "gpu.tessera.dev",
                "pool": "gpu-node-1",
                "devices": [{"uuid": UUIDS[0], "device": "gpu-0"}],
                "pods": [
                    {
                        "namespace": "team-a",
                        "name": "trainer-0",
                        "uid": "pod-uid-1",
                        "containers": ["main"],
                    }
                ],
            }
        )
    )
    # Claim "uid-b": two GPUs, no claim.json (its limits file names it default/uid-b).
    b = Claim(
        regions,
        plain,
        [GpuLimit(UUIDS[1], 1024 * MiB, 50), GpuLimit(UUIDS[2], 2048 * MiB, 0)],
        state=state,
        name="uid-b",
    )
    # A truncated region and one of another layout version, beside them.
    bad = regions / "uid-truncated"
    bad.mkdir()
    R.create_region(str(bad / REGION_FILE), [(UUIDS[3], 64 * MiB, 10)])
    with open(bad / REGION_FILE, "r+b") as f:
        f.truncate(R.HEADER_SIZE + 10)
    other = regions / "uid-v2"
    other.mkdir()
    R.create_region(str(other / REGION_FILE), [(UUIDS[3], 64 * MiB, 10)])
    with open(other / REGION_FILE, "r+b") as f:
        f.seek(R.OFFSETS["h.version"])
        f.write((2).to_bytes(4, "little"))

    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        procs["a1"] = a.spawn(
            "tp_cuda", "link", "init", "dev", "0", "alloc", str(120 * MiB), "ready", "hold"
        )
        procs["b1"] = b.spawn(
            "tp_cuda",
            "link",
            "init",
            "dev",
            "1",
            "alloc",
            str(200 * MiB),
            "dev",
            "2",
            "alloc",
            str(50 * MiB),
            "ready",
            "hold",
        )
        procs["b2"] = b.spawn(
            "tp_cuda", "link", "init", "dev", "1", "alloc", str(300 * MiB), "ready", "hold"
        )
        for p in procs.values():
            wait_line(p, "holding")
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("FAKE_", "TESSERA_", "LD_PRELOAD"))
        }
        env.update(
            LD_LIBRARY_PATH=str(plain.fake),
            FAKE_GPU_STATE=str(state),
            FAKE_GPUS=",".join(f"{u}={PHYS}" for u in UUIDS),
            FAKE_GPU_UTIL=str(UTIL),
        )
        exporter, url, log = _start_exporter(regions, env)
        try:
            target = url.split("//", 1)[1].split("/", 1)[0]
            with prometheus(tmp / "prometheus", [target], rule_files=[RULES]) as prom:
                prom.wait(
                    'up{job="tessera-monitor"}', lambda r: bool(r) and r[0]["value"][1] == "1"
                )
                prom.wait("tessera_share_processes", lambda r: len(r) == 2)
                yield Stack(regions, exporter, url, log, prom, procs)
        finally:
            exporter.send_signal(signal.SIGTERM)
            assert exporter.wait(timeout=30) == 0
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def test_hami_names_answer_promql(stack: Stack) -> None:
    prom = stack.prom
    q = 'hami_vgpu_memory_used_bytes{namespace="team-a", pod="trainer-0", container="main", vdevice_index="0"}'
    assert prom.value(q) == 120 * MiB
    assert prom.value(f'hami_vgpu_memory_limit_bytes{{device_uuid="{UUIDS[0]}"}}') == 128 * MiB
    assert (
        prom.value(
            f'hami_container_device_memory_bytes{{pod="trainer-0", device_uuid="{UUIDS[0]}"}}'
        )
        == 120 * MiB
    )
    # Claim b has no pod metadata without the API: its series carry no pod, still per GPU.
    assert prom.value(f'hami_vgpu_memory_used_bytes{{device_uuid="{UUIDS[1]}"}}') == 500 * MiB
    assert prom.value(f'hami_vgpu_memory_used_bytes{{device_uuid="{UUIDS[2]}"}}') == 50 * MiB
    # Device level, from fake NVML: used = every byte the fake driver handed out.
    assert prom.value('hami_host_gpu_memory_used_bytes{device_index="1", zone="vGPU"}') == 500 * MiB
    assert prom.value(f'hami_host_gpu_utilization_ratio{{device_uuid="{UUIDS[0]}"}}') == UTIL
    assert prom.value('count(hami_host_gpu_memory_used_bytes{node="gpu-node-1"})') == len(UUIDS)
    assert prom.value('sum(hami_vgpu_memory_used_bytes{zone="vGPU"})') == (120 + 500 + 50) * MiB


def test_tessera_names_answer_promql(stack: Stack) -> None:
    prom = stack.prom
    sel = (
        'dra_claim_namespace="team-a", dra_claim_name="trainer-0-gpu", dra_pool_name="gpu-node-1", '
        'dra_device_name="gpu-0"'
    )
    assert prom.value(f"tessera_share_memory_used_bytes{{{sel}}}") == 120 * MiB
    assert prom.value(f"tessera_share_memory_limit_bytes{{{sel}}}") == 128 * MiB
    assert prom.value(f"tessera_share_cores_ratio{{{sel}}}") == 0.3
    assert (
        prom.value('tessera_share_processes{dra_claim_name="trainer-0-gpu", pod="trainer-0"}') == 1
    )
    assert (
        prom.value('tessera_share_processes{dra_claim_namespace="default", dra_claim_name="uid-b"}')
        == 2
    )
    assert (
        prom.value(f'tessera_share_memory_used_bytes{{dra_claim_name="uid-b", UUID="{UUIDS[1]}"}}')
        == 500 * MiB
    )
    assert (
        prom.value(f'tessera_share_cores_ratio{{dra_claim_name="uid-b", UUID="{UUIDS[2]}"}}') == 0
    )
    # Joins on the device: the share's bytes against the GPU's (NVML) total, by UUID.
    frac = prom.value(
        f'tessera_share_memory_used_bytes{{UUID="{UUIDS[1]}"}} / on (node, UUID) group_left() '
        "tessera_gpu_memory_total_bytes"
    )
    assert frac == 500 * MiB / PHYS
    assert prom.value(f'tessera_gpu_memory_used_bytes{{UUID="{UUIDS[1]}", gpu="1"}}') == 500 * MiB
    assert prom.value(f'tessera_gpu_utilization_ratio{{UUID="{UUIDS[3]}"}}') == UTIL / 100
    assert prom.value('tessera_monitor_nvml_up{node="gpu-node-1"}') == 1
    assert prom.query("tessera_monitor_api_up") == []  # --no-api


def test_bad_regions_are_reported_once_and_the_others_still_served(stack: Stack) -> None:
    prom = stack.prom
    assert prom.value('tessera_share_region_readable{dra_claim_uid="uid-truncated"}') == 0
    assert prom.value('tessera_share_region_readable{dra_claim_uid="uid-v2"}') == 0
    assert prom.value("sum(tessera_share_region_readable)") == 2
    assert (
        prom.query('tessera_share_memory_used_bytes{dra_claim_uid=~"uid-truncated|uid-v2"}') == []
    )
    truncated = [line for line in stack.log if "uid-truncated" in line]
    other = [line for line in stack.log if "uid-v2" in line]
    assert len(truncated) == 1, stack.log  # once, not at every scrape
    assert f"region is {R.HEADER_SIZE + 10} bytes, expected {R.FILE_SIZE}" in truncated[0]
    assert len(other) == 1, stack.log
    assert (
        "region version 2 is newer than this reader's (versions 1): a newer driver and "
        "enforcement library made it; upgrade the monitor"
    ) in other[0]


def test_alert_rules_evaluate_on_real_figures(stack: Stack) -> None:
    prom = stack.prom
    # 120 of 128 MiB: the share is near its limit (alert pending: `for: 5m` has not elapsed).
    res = prom.wait('ALERTS{alertname="TesseraShareNearMemoryLimit"}', lambda r: len(r) == 1)
    labels = res[0]["metric"]
    assert labels["dra_claim_name"] == "trainer-0-gpu" and labels["pod"] == "trainer-0"
    assert labels["alertstate"] in ("pending", "firing")
    res = prom.wait('ALERTS{alertname="TesseraShareRegionUnreadable"}', lambda r: len(r) == 2)
    assert {r["metric"]["dra_claim_uid"] for r in res} == {"uid-truncated", "uid-v2"}
    # Claim b uses 500 of 1024 MiB and claim a's other GPUs hold nothing: no other share alert.
    assert (
        prom.query('ALERTS{alertname=~"TesseraShareIdle|TesseraGPUShareLimitsExceedMemory"}') == []
    )


def _dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    assert exprs
    return exprs


def test_dashboard_queries_run_on_real_figures(stack: Stack) -> None:
    answered = set()
    for expr in _dashboard_exprs():
        q = (
            expr.replace("$node", ".*")
            .replace("$namespace", ".*")
            .replace("$__rate_interval", "30s")
        )
        res = stack.prom.query(q)  # a PromQL error fails here
        if res:
            answered.add(expr.split("{", 1)[0])
    # Every share and NVML panel has data (allocation panels need the API: see tests/e2e).
    for name in (
        "tessera_share_memory_used_bytes",
        "tessera_share_memory_limit_bytes",
        "tessera_share_processes",
        "tessera_gpu_memory_used_bytes",
        "tessera_gpu_utilization_ratio",
        "tessera_share_cores_ratio",
    ):
        assert name in answered, name


def test_sigkilled_process_disappears_within_one_scrape(stack: Stack) -> None:
    before = stack.scrape()
    assert (
        _sample(before, "tessera_share_memory_used_bytes", dra_claim_name="uid-b", UUID=UUIDS[1])
        == 500 * MiB
    )
    victim = stack.procs["b2"]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = time.time()
    after = stack.scrape()  # the very next scrape
    assert (
        _sample(after, "tessera_share_memory_used_bytes", dra_claim_name="uid-b", UUID=UUIDS[1])
        == 200 * MiB
    )
    assert _sample(after, "tessera_share_processes", dra_claim_name="uid-b") == 1
    assert _sample(after, "hami_vgpu_memory_used_bytes", device_uuid=UUIDS[1]) == 200 * MiB

    # Prometheus: the first sample it scraped after the kill already has the new figure.
    def fresh(r: list[dict[str, Any]]) -> bool:
        return bool(r) and float(r[0]["value"][1]) > killed_at

    res = stack.prom.wait('timestamp(tessera_share_processes{dra_claim_name="uid-b"})', fresh)
    assert res
    assert stack.prom.value('tessera_share_processes{dra_claim_name="uid-b"}') == 1
    assert (
        stack.prom.value(
            f'tessera_share_memory_used_bytes{{dra_claim_name="uid-b", UUID="{UUIDS[1]}"}}'
        )
        == 200 * MiB
    )
    assert stack.prom.value("sum(hami_vgpu_memory_used_bytes)") == (120 + 200 + 50) * MiB
