"""Tenants competing for one fake GPU: the contention model of ``native/fake/fake_sched.h``.

Every tenant is one claim (its own limits file and region) running ``tp_launch util`` on the
fake GPU 0; all of them map one model file (``FAKE_SCHED``). A tenant's share is the GPU time
the *model* gave its process (``busy_ns`` of its context, read from the model file) divided by
the model time that passed, over a window that starts after a warm-up and ends before any
tenant stops; nothing the enforcement library records is used. Shared by
``tests/native/test_contention.py`` and ``bench/bench_contention.py``.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from native_helpers import UUIDS, Build, Claim, MiB

from tessera.enforcement.layout import DRIVER_DIR, DRIVER_USAGE_FILE
from tessera.enforcement.limits import GpuLimit
from tessera.enforcement.reconcile import reconcile_claim
from tessera.enforcement.region import RegionError, read_region
from tessera.enforcement.shares import gpu_shares, write_shares

# Layout of fake_sched.h (its _Static_asserts pin these numbers).
_DEV_OFF = 128
_CTX_OFF = 64
_CTX_SIZE = 22640
_DEV_SIZE = 64 + 16 * _CTX_SIZE
_NCTX = 16


@dataclass(frozen=True)
class Tenant:
    """One claim on the shared GPU: ``cores`` (0 = best effort), kernel length in µs, launch
    family (``kernel``, ``ex``, ``coop``, ``graph``), streams it launches on (1..8)."""

    cores: int
    kernel_us: int = 200
    kind: str = "kernel"
    streams: int = 1
    policy: str = "strict"


@dataclass(frozen=True)
class Outcome:
    """Shares (percent of the window's GPU time, one per tenant, in order) and GPU idle %.
    ``usage``: each tenant's ``driver/usage`` lines read at the end of the window, while the
    tenants still run (empty tuple when no driver loop ran or it had not written one yet)."""

    shares: tuple[float, ...]
    idle: float
    usage: tuple[tuple[str, ...], ...] = ()


@dataclass(frozen=True)
class Snapshot:
    t: int
    idle_ns: int
    busy: dict[int, int]  # pid -> busy ns


_MAGIC = 0x4653434845443031


def read_model(path: Path, dev: int = 0) -> Snapshot | None:
    """The model's time, idle time and per-process GPU time of device ``dev``; None while the
    file is not initialised yet."""
    raw = path.read_bytes() if path.exists() else b""
    if len(raw) < _DEV_OFF + 2 * _DEV_SIZE or struct.unpack_from("<Q", raw)[0] != _MAGIC:
        return None
    base = _DEV_OFF + dev * _DEV_SIZE
    t, idle, _cur, nctx = struct.unpack_from("<QQiI", raw, base)
    busy: dict[int, int] = {}
    for i in range(min(nctx, _NCTX)):
        off = base + _CTX_OFF + i * _CTX_SIZE
        pid, _live, b = struct.unpack_from("<iIQ", raw, off)
        busy[pid] = busy.get(pid, 0) + b
    return Snapshot(t, idle, busy)


def _unshare_prefix() -> list[str]:
    """``unshare`` putting the command in a pid namespace of its own (the process is pid 1
    there); as root directly, else in a user namespace too. The host's /proc stays mounted, as
    the node driver's is with ``hostPID``."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--pid", "--kill-child"]


def _child_pid(p: subprocess.Popen[str], timeout: float = 10) -> int:
    """The host pid of the process ``unshare`` (``p``) forked into the new namespace."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            kids = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
        except OSError:
            kids = []
        if kids:
            return int(kids[0])
        time.sleep(0.01)
    raise AssertionError(f"unshare (pid {p.pid}) forked no process")


def _driver_loop(
    claims: list[Claim], stop: threading.Event, stale: bool, period: float = 0.1
) -> None:
    """What the node driver's reconcile does for each claim (``NodeDriver.reconcile``): map
    the region's live slots to host pids and write ``driver/usage`` (no NVML memory figures
    here: nothing unaccounted). ``stale``: each slot's line names another claim of the slot (a
    generation that is not the slot's, as a file written before the slot was reused does)."""
    while not stop.is_set():
        for c in claims:
            try:
                snap = read_region(c.region)
                if stale:
                    old = [dataclasses.replace(s, generation=s.generation + 1) for s in snap.slots]
                    snap = dataclasses.replace(snap, slots=tuple(old))
                reconcile_claim(c.dir, snap, {})
            except (RegionError, OSError):
                pass  # the region is not created yet
        stop.wait(period)


def run_case(
    tmp: Path,
    build: Build,
    tenants: list[Tenant],
    *,
    seconds: float = 3.0,
    warmup: float = 1.5,
    stamp: str = "scheduled",
    slice_us: int = 2000,
    extra_env: dict[str, str] | None = None,
    node_shares: bool = True,
    pid_namespaces: bool = False,
    driver_pids: str = "",
) -> Outcome:
    """Run the tenants together; measure each one's share of the GPU over ``seconds`` after
    ``warmup``. ``stamp`` is the event model (``scheduled`` or ``record``). ``node_shares``:
    the harness writes the GPU's shares file as the node driver does, and every limits file
    names its directory (without it, best-effort tenants are not held back).
    ``pid_namespaces``: each tenant runs in a pid namespace of its own, as in a pod.
    ``driver_pids``: ``current``, a thread does the node driver's reconcile every 100 ms (each
    claim's ``driver/usage`` with its slots' host pids); ``stale``, the same with each line
    naming another generation of its slot."""
    model = tmp / "fake-sched"
    env = {"FAKE_SCHED": str(model), "FAKE_SLICE_US": str(slice_us), "FAKE_EVENT_STAMP": stamp}
    env.update(extra_env or {})
    run_for = warmup + seconds + 1.0
    procs: list[subprocess.Popen[str]] = []
    claims: list[Claim] = []
    limits = [[GpuLimit(UUIDS[0], 100 * MiB, t.cores, t.policy)] for t in tenants]
    shares = str(tmp / "shares") if node_shares else None
    if shares:
        write_shares(shares, gpu_shares(limits), sync=False)
    stop = threading.Event()
    driver = threading.Thread(
        target=_driver_loop, args=(claims, stop, driver_pids == "stale"), daemon=True
    )
    try:
        for i, t in enumerate(tenants):
            c = Claim(tmp, build, limits[i], name=f"tenant{i}", shares=shares)
            claims.append(c)
            procs.append(
                c.spawn(
                    "tp_launch",
                    "util",
                    f"{run_for:.2f}",
                    str(t.kernel_us),
                    t.kind,
                    str(t.streams),
                    wrap=tuple(_unshare_prefix()) if pid_namespaces else (),
                    **env,
                )
            )
        if driver_pids:
            driver.start()
        pids = [_child_pid(p) if pid_namespaces else p.pid for p in procs]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            snap = read_model(model)
            if snap and all(p in snap.busy for p in pids):
                break
            time.sleep(0.02)
        time.sleep(warmup)
        a = read_model(model)
        time.sleep(seconds)
        b = read_model(model)
        # read now: once a tenant exits, the next reconcile drops its slot's pid line
        usage = tuple(_usage_lines(c) for c in claims) if driver_pids else ()
        assert a and b, f"{model}: the tenants never used the fake GPU"
        for p in procs:
            _out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
    finally:
        stop.set()
        if driver.is_alive():
            driver.join()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    dt = b.t - a.t
    assert dt > 0
    shares = tuple(100.0 * (b.busy[p] - a.busy.get(p, 0)) / dt for p in pids)
    return Outcome(shares, 100.0 * (b.idle_ns - a.idle_ns) / dt, usage)


def _usage_lines(c: Claim) -> tuple[str, ...]:
    try:
        return tuple((c.dir / DRIVER_DIR / DRIVER_USAGE_FILE).read_text().splitlines())
    except FileNotFoundError:
        return ()


@dataclass(frozen=True)
class Case:
    """One row of the matrix: tenants and the event model. ``saturating``: the limited shares
    sum to 100 (or best-effort tenants take the rest), so the GPU should not idle."""

    name: str
    tenants: tuple[Tenant, ...]
    stamp: str = "scheduled"

    @property
    def saturating(self) -> bool:
        return sum(t.cores for t in self.tenants) == 100 or any(t.cores == 0 for t in self.tenants)


def _t(
    *spec: tuple[int, int] | tuple[int, int, str] | tuple[int, int, str, int],
) -> tuple[Tenant, ...]:
    return tuple(Tenant(*s) for s in spec)


# The case matrix of issue 23: splits, kernel lengths 5 µs..10 ms (a slice is 2 ms), 1..4
# streams, the four launch families, both event models, best-effort neighbours.
MATRIX: tuple[Case, ...] = (
    Case("30/70, 200 µs", _t((30, 200), (70, 200))),
    Case("50/50, 200 µs", _t((50, 200), (50, 200))),
    Case("20/30/50, 200 µs", _t((20, 200), (30, 200), (50, 200))),
    Case("30/70, 5 µs", _t((30, 5), (70, 5))),
    Case("30/70, 1 ms", _t((30, 1000), (70, 1000))),
    Case("30/70, 5 ms", _t((30, 5000), (70, 5000))),
    Case("30/70, 10 ms", _t((30, 10000), (70, 10000))),
    Case("30 on 4 streams / 70", _t((30, 200, "kernel", 4), (70, 200))),
    Case("70 alone on 4 streams", _t((70, 200, "kernel", 4))),
    Case("30/70, cuLaunchKernelEx", _t((30, 200, "ex"), (70, 200, "ex"))),
    Case("30/70, cooperative", _t((30, 200, "coop"), (70, 200, "coop"))),
    Case("30/70, graph", _t((30, 200, "graph"), (70, 200, "graph"))),
    Case("30 + best effort, 5 ms", _t((30, 5000), (0, 5000))),
    Case("30 + 3 best effort, 200 µs", _t((30, 200), (0, 200), (0, 200), (0, 200))),
    Case("30/70, record stamps", _t((30, 200), (70, 200)), "record"),
    Case("20/30/50, 5 ms, record stamps", _t((20, 5000), (30, 5000), (50, 5000)), "record"),
    Case("50/50, 10 ms on 2 streams, record", _t((50, 10000, "kernel", 2), (50, 10000)), "record"),
    Case("30 + best effort, record stamps", _t((30, 200), (0, 200)), "record"),
)


def errors(case: Case, out: Outcome) -> list[float]:
    """Signed error (points) of each limited tenant's share against its cores."""
    return [s - t.cores for t, s in zip(case.tenants, out.shares, strict=True) if t.cores > 0]
