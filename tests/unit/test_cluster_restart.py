"""``Cluster.restart_component`` / ``stop_component`` / ``start_component`` on real processes:
a component (a small Python server on a unix socket, probed as containerd's socket is) is
started as ``up`` starts one, then restarted in place with the same command line and
environment, killed with SIGKILL and started again; a record without its command line is
refused in one line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tessera.localcluster.cluster import Cluster, ClusterError, pid_alive

SERVER = """
import os, socket, sys, time
path = sys.argv[1]
if os.path.exists(path):
    os.unlink(path)
open(sys.argv[2], "a").write(f"{os.getpid()} {os.environ['CHAOS_MARK']}\\n")
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen()
while True:
    time.sleep(1)
"""


def _cluster(tmp_path: Path) -> tuple[Cluster, Path, Path]:
    c = Cluster(tmp_path / "state")
    c.log_dir.mkdir(parents=True)
    c.run_dir.mkdir(parents=True)
    sock, starts = tmp_path / "etcd.sock", tmp_path / "starts"
    state: dict[str, object] = {"components": {}}
    c._start_component(
        state,
        "etcd",
        [sys.executable, "-c", SERVER, str(sock), str(starts)],
        f"unix://{sock}",
        30,
        False,
        {"CHAOS_MARK": "same-env"},
    )
    return c, sock, starts


def test_restart_in_place_with_the_same_command_line_then_kill_and_start(tmp_path: Path) -> None:
    c, _sock, starts = _cluster(tmp_path)
    try:
        first = int(json.loads(c.state_file.read_text())["components"]["etcd"]["pid"])
        second = c.restart_component("etcd", timeout=30)
        assert second != first and not pid_alive(first) and pid_alive(second)
        c.stop_component("etcd", kill=True)
        assert not pid_alive(second)
        assert c.running_components() == []
        third = c.start_component("etcd", timeout=30)
        assert pid_alive(third)
        rec = json.loads(c.state_file.read_text())["components"]["etcd"]
        assert rec["pid"] == third and rec["env"] == {"CHAOS_MARK": "same-env"}
        # each start ran the recorded command line with the recorded environment
        assert starts.read_text().split("\n")[:-1] == [
            f"{p} same-env" for p in (first, second, third)
        ]
    finally:
        c.down()


def test_a_component_never_started_or_without_its_command_line_is_refused(
    tmp_path: Path,
) -> None:
    c, _sock, _ = _cluster(tmp_path)
    try:
        with pytest.raises(ClusterError) as e:
            c.restart_component("kubelet")
        assert str(e.value) == (
            f"{c.state_file}: no component 'kubelet' recorded (known: etcd); start the cluster "
            "with `tessera cluster up` (--kubelet for the node's components)"
        )
        st = json.loads(c.state_file.read_text())
        del st["components"]["etcd"]["argv"]
        c.state_file.write_text(json.dumps(st))
        with pytest.raises(ClusterError) as e:
            c.start_component("etcd")
        assert str(e.value) == (
            f"{c.state_file}: components.etcd has no argv (started by an older tessera): "
            "restart the whole cluster with `tessera cluster down` and `up`"
        )
    finally:
        c.down()
    assert not os.path.exists(c.run_dir / "etcd.pid")
