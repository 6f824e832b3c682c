"""Two driver instances on one node share the state directory (a rolling update): the file locks
and the checkpoint, run by real processes against one directory, keep every entry and never
answer from an older view. Also: the one log-line format of the long-running commands."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from tessera.cli._common import LogFormatter, log_line, timestamp
from tessera.driver.checkpoint import Checkpoint, ClaimEntry
from tessera.driver.kubelet import MAX_SOCKET_PATH, ClaimRef, dra_socket, registration_socket
from tessera.driver.locks import FileLock, InstanceLock
from tessera.driver.prepare import ClaimPlan

WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tessera.driver.checkpoint import Checkpoint, ClaimEntry
    from tessera.driver.kubelet import ClaimRef
    from tessera.driver.locks import FileLock
    from tessera.driver.prepare import ClaimPlan

    path, who, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    cp = Checkpoint(path)
    for i in range(n):
        uid = f"{who}-{i}"
        lk = FileLock(path.parent / "locks" / uid)
        lk.acquire()
        try:
            plan = ClaimPlan(ClaimRef("ns", uid, uid), "library", (), None, (), {}, digest=str(i))
            cp.update(put={uid: ClaimEntry.prepared(plan)})
            if i % 3 == 0:
                cp.update(drop=[uid])
        finally:
            lk.release(remove=cp.get(uid) is None)
    """
)


def tiny_plan(uid: str, digest: str = "") -> ClaimPlan:
    return ClaimPlan(ClaimRef("ns", uid, uid), "library", (), None, (), {}, digest=digest)


def prepared(uid: str) -> ClaimEntry:
    return ClaimEntry.prepared(tiny_plan(uid))


def test_two_processes_writing_one_checkpoint_lose_nothing(tmp_path: Path) -> None:
    cp_path = tmp_path / "checkpoint.json"
    n = 60
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(cp_path), who, str(n)])
        for who in ("a", "b")
    ]
    assert [p.wait(120) for p in procs] == [0, 0]
    want = {
        f"{who}-{i}": ClaimEntry.prepared(tiny_plan(f"{who}-{i}", str(i)))
        for who in ("a", "b")
        for i in range(n)
        if i % 3
    }
    assert json.loads(cp_path.read_text())["claims"] == {u: e.to_json() for u, e in want.items()}
    # a reader that loaded the file before sees the other processes' writes
    assert Checkpoint(cp_path).entries() == want
    # lock files of claims without an entry were removed by their last holder
    assert sorted(p.name for p in (tmp_path / "locks").iterdir()) == sorted(want)


def test_a_reader_sees_what_another_process_wrote(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    mine = Checkpoint(path)
    mine.update(put={"x": prepared("x")})
    code = (
        "import sys; from tessera.driver.checkpoint import Checkpoint, ClaimEntry; "
        "from tessera.driver.kubelet import ClaimRef; from tessera.driver.prepare import ClaimPlan; "
        "c = Checkpoint(__import__('pathlib').Path(sys.argv[1])); c.update(drop=['x'], "
        "put={'y': ClaimEntry.prepared(ClaimPlan(ClaimRef('ns', 'y', 'y'), 'library', (), None, (), {}))})"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True)
    assert mine.get("x") is None  # not answered from this process's older copy
    assert mine.uids() == ["y"]
    mine.update(put={"z": prepared("z")})  # merged onto the file as it is
    assert sorted(json.loads(path.read_text())["claims"]) == ["y", "z"]


def test_a_claim_lock_excludes_threads_and_survives_its_file_being_removed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "locks" / "uid-1"
    first = FileLock(path)
    assert first.acquire()
    assert not FileLock(path).acquire(blocking=False)
    got: list[float] = []

    def wait() -> None:
        lk = FileLock(path)
        lk.acquire()
        got.append(time.monotonic())
        lk.release()

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.3)
    assert got == []
    released = time.monotonic()
    first.release(remove=True)  # the waiter must not keep a lock on the removed file
    t.join(10)
    assert got and got[0] >= released
    again = FileLock(path)
    assert again.acquire(blocking=False)
    again.release()


def test_the_first_instance_is_alone_the_second_is_not(tmp_path: Path) -> None:
    code = (
        "import sys, time; from tessera.driver.locks import InstanceLock; "
        "l = InstanceLock(__import__('pathlib').Path(sys.argv[1])); "
        "print(l.join(), flush=True); time.sleep(30)"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "instances.lock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "True"
        second = InstanceLock(tmp_path / "instances.lock")
        assert second.join() is False
        second.leave()
    finally:
        p.kill()
        p.wait()
    third = InstanceLock(tmp_path / "instances.lock")
    assert third.join() is True  # the lock died with its process
    third.leave()


def test_rolling_update_socket_names_are_per_instance_and_fit() -> None:
    root = Path("/var/lib/kubelet")
    assert registration_socket(root, "gpu.tessera.dev") == (
        root / "plugins_registry" / "gpu.tessera.dev-reg.sock"
    )
    uid = "6a1f3c2e-8d4b-4f0a-9c7e-2b5d1e9f8a30"
    assert registration_socket(root, "gpu.tessera.dev", uid) == (
        root / "plugins_registry" / f"gpu.tessera.dev-{uid}-reg.sock"
    )
    assert dra_socket(root, "gpu.tessera.dev", uid) == (
        root / "plugins" / "gpu.tessera.dev" / f"dra-{uid}.sock"
    )
    deep = root / ("d" * (MAX_SOCKET_PATH - len(str(root)) - 60))
    reg, dra = (
        registration_socket(deep, "gpu.tessera.dev", uid),
        dra_socket(deep, "gpu.tessera.dev", uid),
    )
    assert len(str(reg)) <= MAX_SOCKET_PATH and uid not in reg.name
    assert re.fullmatch(r"gpu\.tessera\.dev-[0-9a-f]{16}-reg\.sock", reg.name)
    assert registration_socket(deep, "gpu.tessera.dev", "other") != reg
    assert dra.name.startswith("dra-") and len(str(dra)) <= MAX_SOCKET_PATH


def test_log_lines_start_with_an_rfc3339_utc_time() -> None:
    assert timestamp(0) == "1970-01-01T00:00:00.000Z"
    assert log_line("driver", "stopped", 1764639825.5) == (
        "2025-12-02T01:43:45.500Z tessera driver: stopped"
    )
    import logging

    rec = logging.LogRecord("tessera.webhook", logging.WARNING, __file__, 1, "x %s", ("y",), None)
    rec.created = 0.25
    assert LogFormatter("webhook").format(rec) == (
        "1970-01-01T00:00:00.250Z tessera webhook: warning: tessera.webhook: x y"
    )
