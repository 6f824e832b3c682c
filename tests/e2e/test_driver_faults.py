"""File-system faults at prepare, made real where the machine allows: ``tessera driver`` (a real
process, the fake NVML, a live control plane, a fake kubelet over the real sockets) keeps its
state directory on a 2 MiB tmpfs mounted for the test, which is filled up (a full disk) and
made read-only (a read-only bind mount over it); the CDI directory is removed while the driver runs; and a failing fsync
is injected (no file system here fails fsync on demand): the driver process runs with
``os.fsync`` and ``os.fdatasync`` wrapped to raise EIO while a flag file exists.

Each fault must give the claim one clear line, leave nothing of it (no claim directory, CDI
spec, temporary file or checkpoint entry), leave the other claims of the call prepared, and
the next prepare must succeed once the fault is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .driverkit import *  # noqa: F403 (fixtures)
from .driverkit import DriverEnv, DriverProcess, allocated_claim

pytestmark = pytest.mark.cluster

DRIVER = "gpu.tessera.dev"
#: ``python -c`` program: ``tessera`` with ``os.fsync`` and ``os.fdatasync`` failing (EIO) while the flag file named
#: by ``$TESSERA_TEST_FAIL_FSYNC`` exists.
FSYNC_SEAM = """
import errno, os, runpy, sys
_flag = os.environ["TESSERA_TEST_FAIL_FSYNC"]
def failing(real):
    def sync(fd):
        if os.path.exists(_flag):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd)
    return sync
os.fsync, os.fdatasync = failing(os.fsync), failing(os.fdatasync)
sys.argv = ["tessera", *sys.argv[1:]]
runpy.run_module("tessera", run_name="__main__", alter_sys=True)
"""
NOT_KEPT = "; nothing of the claim was kept: the kubelet's retry prepares it once that is fixed"


class SeamedDriver(DriverProcess):
    def _pick_port(self) -> None:
        super()._pick_port()
        assert self.argv[1:3] == ["-m", "tessera"]
        self.argv[1:3] = ["-c", FSYNC_SEAM]


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def _leftovers(env: DriverEnv, uid: str) -> list[str]:
    """Whatever of claim ``uid`` is on the node, and any temporary file of an interrupted write."""
    found = [str(p) for p in env.cdi_dir.glob(f"*{uid}*")] if env.cdi_dir.exists() else []
    if (env.state_dir / "claims" / uid).exists():
        found.append(str(env.state_dir / "claims" / uid))
    found += [str(p) for p in env.state_dir.rglob(".*") if p.is_file()]
    found += [str(p) for p in env.cdi_dir.glob(".*")] if env.cdi_dir.exists() else []
    if uid in _checkpoint(env):
        found.append(f"checkpoint entry {uid}")
    return found


def _checkpoint(env: DriverEnv) -> dict[str, Any]:
    return dict(json.loads((env.state_dir / "checkpoint.json").read_text())["claims"])


@pytest.fixture
def small_state_dir(driver_env: DriverEnv) -> Any:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.fail("the fault tests mount a tmpfs: run them as root (the project's test VM is)")
    env = driver_env
    env.state_dir.mkdir()
    _sh("mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tessera-test-state", str(env.state_dir))
    try:
        yield env
    finally:
        subprocess.run(["umount", "-l", str(env.state_dir)], check=False)


def test_full_disk_read_only_state_vanished_cdi_dir_and_failing_fsync(
    small_state_dir: DriverEnv, kube_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = small_state_dir
    ns = kube_namespace
    flag = env.root / "fail-fsync"
    monkeypatch.setenv("TESSERA_TEST_FAIL_FSYNC", str(flag))
    refs: dict[str, tuple[str, str, str]] = {}
    for i, name in enumerate("abcde"):
        c = allocated_claim(
            env.client,
            ns,
            name,
            [
                {
                    "request": "gpu",
                    "driver": DRIVER,
                    "pool": env.node,
                    "device": f"gpu-{i}",
                    "shareID": f"5a1d7c3e-0b2f-4c6d-9e8a-{i:012x}",
                    "consumedCapacity": {"memory": "8Gi", "cores": "20"},
                }
            ],
            env.node,
        )
        refs[name] = (ns, name, c["metadata"]["uid"])
    uid = {k: r[2] for k, r in refs.items()}
    kubelet = env.kubelet()
    d = SeamedDriver(env).start()
    assert d.returncode is None, d.output

    def prepare(*names: str) -> dict[str, str]:
        r = kubelet.prepare([refs[n] for n in names])
        return {n: r.claims[uid[n]].error for n in names}

    try:
        assert prepare("a") == {"a": ""}
        spec_a = (env.cdi_dir / f"{DRIVER}-claim_{uid['a']}.json").read_bytes()

        # 1. A full disk: the usage region (225 KiB, allocated) cannot be made.
        free = os.statvfs(env.state_dir)
        filler = env.state_dir / "filler"
        with open(filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, free.f_bavail * free.f_frsize - 32 * 1024)
        got = prepare("a", "b")
        assert got["a"] == ""  # prepared before: answered, untouched
        assert got["b"] == (
            f"ResourceClaim {ns}/b: writing its files: No space left on device "
            f"({env.state_dir / 'claims' / uid['b'] / 'region'}){NOT_KEPT}"
        )
        assert _leftovers(env, uid["b"]) == []
        filler.unlink()
        assert prepare("b") == {"b": ""}

        # 2. A read-only state directory: the claim's lock cannot be made.
        # (a read-only bind mount over it: a remount of the tmpfs itself is refused while the
        # driver holds files open for writing)
        _sh("mount", "--bind", str(env.state_dir), str(env.state_dir))
        try:
            _sh("mount", "-o", "remount,bind,ro", str(env.state_dir))
            got = prepare("c")
        finally:
            _sh("umount", str(env.state_dir))
        assert got["c"] == (
            f"ResourceClaim {ns}/c: its lock: Read-only file system "
            f"({env.state_dir / 'locks' / uid['c']}){NOT_KEPT}"
        )
        assert _leftovers(env, uid["c"]) == []
        assert prepare("c") == {"c": ""}

        # 3. The CDI directory vanished: made again, and a recorded claim's spec rewritten.
        shutil.rmtree(env.cdi_dir)
        assert prepare("d", "a") == {"d": "", "a": ""}
        assert (env.cdi_dir / f"{DRIVER}-claim_{uid['d']}.json").is_file()
        assert (env.cdi_dir / f"{DRIVER}-claim_{uid['a']}.json").read_bytes() == spec_a

        # 4. The checkpoint's fsync fails: the claim is not recorded, its files go.
        before = (env.state_dir / "checkpoint.json").read_bytes()
        flag.touch()
        try:
            got = prepare("e")
        finally:
            flag.unlink()
        assert got["e"] == (
            f"ResourceClaim {ns}/e: recording it in the checkpoint: Input/output error "
            f"({env.state_dir / 'checkpoint.json'}){NOT_KEPT}"
        )
        assert _leftovers(env, uid["e"]) == []
        assert (env.state_dir / "checkpoint.json").read_bytes() == before
        assert prepare("e") == {"e": ""}

        # Everything is prepared once, exactly as recorded (b's and c's specs, gone with the CDI
        # directory, are written again at their next prepare); unprepare takes all of it.
        assert prepare(*"abcde") == dict.fromkeys("abcde", "")
        cp = _checkpoint(env)
        assert sorted(cp) == sorted(uid.values())
        for n in "abcde":
            assert (env.state_dir / "claims" / uid[n] / "limits").is_file()
            assert (
                json.loads((env.cdi_dir / f"{DRIVER}-claim_{uid[n]}.json").read_text())
                == cp[uid[n]]["plan"]["cdiSpec"]
            )
        r = kubelet.unprepare(list(refs.values()))
        assert all(not r.claims[u].error for u in uid.values())
        assert _checkpoint(env) == {}
        assert not list(env.cdi_dir.iterdir())
    finally:
        d.stop()
        kubelet.close()
        if d.returncode not in (None, 0, -15):
            print(d.output, file=sys.stderr)
    assert Path(env.state_dir).is_dir()
