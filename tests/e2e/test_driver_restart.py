"""Restart safety: ``tessera driver`` (a real process) is killed with SIGKILL 100 times at random
points during a stream of prepares and unprepares from a fake kubelet (three concurrent
callers over the real unix sockets, retrying a failed call as the kubelet does), and restarted
each time. At the end the node's state (checkpoint, CDI specs, limits files, regions) must be
exactly what the API server's claims and the kubelet's view say: nothing leaked, nothing lost,
and every claim always prepared with the same content.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.enforcement.limits import read_limits
from tessera.enforcement.region import read_region

from .conftest import LiveCluster
from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import GIB, DriverEnv, allocated_claim

pytestmark = pytest.mark.cluster

KILLS = int(os.environ.get("TESSERA_RESTART_KILLS", "100"))
CLAIMS = 24
CALLERS = 3


class DriverProcess:
    """``tessera driver`` for ``env`` as a child process."""

    def __init__(self, env: DriverEnv) -> None:
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = env.root / "driver.log"

    def start(self) -> None:
        e = self.env
        argv = [
            sys.executable,
            "-m",
            "tessera",
            "driver",
            "--node-name",
            e.node,
            "--kubeconfig",
            str(e.kubeconfig),
            "--kubelet-root-dir",
            str(e.kubelet_root),
            "--cdi-dir",
            str(e.cdi_dir),
            "--state-dir",
            str(e.state_dir),
            "--dev-root",
            str(e.dev_root),
            "--nvml-library",
            str(e.nvml_lib),
            "--health-address",
            "",
            "--rescan-seconds",
            "30",
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv, env=e.env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            self.proc.wait(timeout=30)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_sigkill_100_times_during_prepare_and_unprepare(
    driver_env: DriverEnv, kube_cluster: LiveCluster, kube_namespace: str
) -> None:
    env = driver_env
    ns = kube_namespace
    rng = random.Random(20261201)
    share = "0b0d3b4e-9f0c-4cf5-8c8e-{:012x}"
    claims: list[dict[str, Any]] = []
    for i in range(CLAIMS):
        gpu = i % len(env.gpus)
        mem, cores = (i % 4 + 1) * GIB, 5 * (i % 5)
        claims.append(
            allocated_claim(
                env.client,
                ns,
                f"c{i}",
                [
                    {
                        "request": "gpu",
                        "driver": "gpu.tessera.dev",
                        "pool": env.node,
                        "device": f"gpu-{gpu}",
                        "shareID": share.format(i),
                        "consumedCapacity": {"memory": f"{mem // GIB}Gi", "cores": str(cores)},
                    }
                ],
                env.node,
            )
        )
    expect = {
        c["metadata"]["uid"]: (env.gpus[i % len(env.gpus)].uuid, (i % 4 + 1) * GIB, 5 * (i % 5))
        for i, c in enumerate(claims)
    }
    refs = {c["metadata"]["uid"]: (ns, c["metadata"]["name"], c["metadata"]["uid"]) for c in claims}

    drv = DriverProcess(env)
    drv.start()
    kubelet = env.kubelet()
    prepared: set[str] = set()  # the kubelet's view: claims whose prepare succeeded last
    responses: dict[str, Any] = {}  # first prepare response per claim
    lock = threading.Lock()
    busy: set[str] = set()
    stop = threading.Event()
    errors: list[str] = []
    ops = [0]

    def call(uid: str, unprep: bool) -> None:
        """One kubelet operation, retried until the driver answers (it may be dead)."""
        while True:
            try:
                if unprep:
                    r = kubelet.unprepare([refs[uid]], timeout=20)
                    if r.claims[uid].error:
                        errors.append(f"unprepare {uid}: {r.claims[uid].error}")
                        return
                    with lock:
                        prepared.discard(uid)
                else:
                    r = kubelet.prepare([refs[uid]], timeout=20)
                    entry = r.claims[uid]
                    if entry.error:
                        errors.append(f"prepare {uid}: {entry.error}")
                        return
                    with lock:
                        if uid in responses and responses[uid] != entry:
                            errors.append(
                                f"prepare {uid} answered differently: {responses[uid]} vs {entry}"
                            )
                        responses.setdefault(uid, entry)
                        prepared.add(uid)
                ops[0] += 1
                return
            except grpc.RpcError:
                time.sleep(0.02)  # the driver is down or restarting: retry, as the kubelet does

    def caller(seed: int) -> None:
        r = random.Random(seed)
        while not stop.is_set():
            uid = r.choice(list(refs))
            with lock:
                if uid in busy:
                    continue
                busy.add(uid)
                unprep = uid in prepared
            try:
                call(uid, unprep)
            finally:
                with lock:
                    busy.discard(uid)

    threads = [threading.Thread(target=caller, args=(s,), daemon=True) for s in range(CALLERS)]
    for t in threads:
        t.start()
    kill_points: list[float] = []
    starting = [0]
    try:
        for _ in range(KILLS):
            if rng.random() < 0.25:
                # Kill it while it starts (reconciling its files, publishing...).
                delay = rng.uniform(0.0, 1.5)
                starting[0] += 1
            else:
                # Let it come up (the killed one cannot answer: an answer is the new one's) and
                # serve the stream for a random while.
                deadline = time.monotonic() + 120
                while True:
                    assert drv.alive(), f"driver exited:\n{drv.log.read_text()[-3000:]}"
                    assert time.monotonic() < deadline, "driver did not come up"
                    try:
                        kubelet.get_info()
                        break
                    except grpc.RpcError:
                        time.sleep(0.01)
                delay = rng.uniform(0.0, 0.5)
            kill_points.append(delay)
            time.sleep(delay)
            drv.kill()
            drv.start()
        # Let the stream run against a driver that stays up, then finish it.
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(timeout=120)
    finally:
        stop.set()
    try:
        assert not errors, errors[:5]
        assert ops[0] > KILLS, f"only {ops[0]} operations completed"
        assert len(responses) == CLAIMS
        # Make sure the last driver is up, then compare the node's state with the kubelet's.
        deadline = time.monotonic() + 60
        while True:
            try:
                kubelet.get_info()
                break
            except grpc.RpcError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        cp = json.loads((env.state_dir / "checkpoint.json").read_text())["claims"]
        assert set(cp) == prepared
        assert {v["state"] for v in cp.values()} <= {"prepared"}
        specs = sorted(p.name for p in env.cdi_dir.iterdir())
        assert specs == sorted(f"gpu.tessera.dev-claim_{u}.json" for u in prepared)
        dirs = (
            sorted(p.name for p in (env.state_dir / "claims").iterdir())
            if (env.state_dir / "claims").is_dir()
            else []
        )
        assert dirs == sorted(prepared)
        for uid in prepared:
            lim = read_limits(str(env.state_dir / "claims" / uid / "limits"))
            assert [(g.uuid, g.memory, g.cores) for g in lim.gpus] == [expect[uid]]
            reg = read_region(str(env.state_dir / "claims" / uid / "region"))
            assert [(g.uuid, g.memory_limit, g.cores) for g in reg.gpus] == [expect[uid]]
            assert sorted(os.listdir(env.state_dir / "claims" / uid)) == [
                "driver",
                "limits",
                "region",
            ]
            spec = json.loads((env.cdi_dir / f"gpu.tessera.dev-claim_{uid}.json").read_text())
            assert spec["containerEdits"]["env"][0] == f"NVIDIA_VISIBLE_DEVICES={expect[uid][0]}"
        leftovers = [p.name for p in env.state_dir.iterdir() if p.name.startswith(".")]
        assert leftovers == []
        # Everything the kubelet still holds can be unprepared; then nothing is left.
        for uid in sorted(prepared):
            assert kubelet.unprepare([refs[uid]]).claims[uid].error == ""
        assert list(env.cdi_dir.iterdir()) == []
        assert json.loads((env.state_dir / "checkpoint.json").read_text())["claims"] == {}
        print(
            f"restart test: {KILLS} SIGKILLs ({starting[0]} during start-up), {ops[0]} completed operations, "
            f"kill delays {min(kill_points):.3f}..{max(kill_points):.3f} s, {len(responses)} claims prepared "
            f"at least once, {len(prepared)} prepared at the end"
        )
    finally:
        kubelet.close()
        drv.stop()
