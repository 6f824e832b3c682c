"""Compute shares on a time-sliced GPU: the fake driver's contention model (issue 23).

Each tenant is a claim of its own on the fake GPU 0; the fake GPU time-slices between their
processes (2 ms slices, preemption, streams sharing a context's turns, both event-stamp
models, ``native/fake/fake_sched.h``). Shares are the GPU time the model gave each process,
never the library's own figures (``contention.py``). The targets (±3 points, idle ≤ 3 %) are
measured by ``bench/bench_contention.py`` (docs/benchmarks.md); these tests allow
``TOLERANCE`` points because wall-clock pacing on a loaded CI machine adds noise of its own.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from contention import MATRIX, Case, Outcome, Tenant, errors, run_case
from native_helpers import UUIDS, Build, Claim, MiB

from tessera.enforcement.limits import GpuLimit

pytestmark = pytest.mark.native

TOLERANCE = float(os.environ.get("TESSERA_CONTENTION_TOLERANCE", "4"))
IDLE = float(os.environ.get("TESSERA_CONTENTION_IDLE", "5"))


def _holds(case: Case, out: Outcome) -> bool:
    return all(abs(e) <= TOLERANCE for e in errors(case, out)) and (
        not case.saturating or out.idle <= IDLE
    )


@pytest.mark.parametrize("case", MATRIX, ids=[c.name for c in MATRIX])
def test_shares_hold_under_contention(tmp_path: Path, plain: Build, case: Case) -> None:
    """Each case's shares within TOLERANCE points (and idle within IDLE % when the tenants
    could fill the GPU). A case outside is measured once more, and fails when both windows
    are: the tenants' launch loops (5 µs kernels: 140,000 launches a second for a 70 % share)
    need the CPU, and on the 2-core CI machine, late in the suite, the 30/70 5 µs case once
    came out at 29/64 % with 7 % idle; run on its own right after, the 18 cases passed 3 runs
    in 3."""
    out = run_case(
        tmp_path / "1", plain, list(case.tenants), seconds=2.0, warmup=2.0, stamp=case.stamp
    )
    if not _holds(case, out):
        again = run_case(
            tmp_path / "2", plain, list(case.tenants), seconds=2.0, warmup=2.0, stamp=case.stamp
        )
        assert _holds(case, again), (case.name, out, again)


def test_the_model_time_slices_unpaced_tenants(tmp_path: Path, plain: Build) -> None:
    """Without limiters the model is plain round-robin: two busy tenants split the GPU, a
    tenant on 4 streams gets no more than one on 1, and nothing idles."""
    out = run_case(
        tmp_path,
        plain,
        [Tenant(100, 200), Tenant(100, 500, "kernel", 4)],
        seconds=1.0,
        warmup=0.5,
        node_shares=False,
    )
    assert all(abs(s - 50) <= 2 for s in out.shares), out
    assert out.idle <= 1, out


def test_best_effort_tenants_are_held_to_what_guarantees_leave(
    tmp_path: Path, plain: Build
) -> None:
    """Three best-effort neighbours: round-robin alone would give the claim 25 %; the node's
    shares file holds them to 70 % together."""
    tenants = [Tenant(30), Tenant(0), Tenant(0), Tenant(0)]
    held = run_case(tmp_path / "held", plain, tenants, seconds=2.0, warmup=1.5)
    assert held.shares[0] >= 30 - TOLERANCE, held
    free = run_case(tmp_path / "free", plain, tenants, seconds=1.0, warmup=1.0, node_shares=False)
    assert free.shares[0] <= 26, free  # the same tenants without the node's file


def test_strict_caps_and_work_conserving_takes_idle_time(tmp_path: Path, plain: Build) -> None:
    """Alone on the GPU, a strict 30 stays at 30; a work-conserving 30 also uses idle time."""
    strict = run_case(tmp_path / "s", plain, [Tenant(30)], seconds=2.0, warmup=1.5)
    assert strict.shares[0] <= 31 and strict.shares[0] >= 30 - TOLERANCE, strict
    wc = run_case(
        tmp_path / "w", plain, [Tenant(30, policy="work-conserving")], seconds=2.0, warmup=2.0
    )
    assert wc.shares[0] >= 80, wc


def test_a_work_conserving_guarantee_beside_a_greedy_neighbour(
    tmp_path: Path, plain: Build
) -> None:
    """Work-conserving 30 and a best-effort tenant that wants everything: the claim keeps 30,
    the GPU does not idle."""
    out = run_case(
        tmp_path, plain, [Tenant(30, policy="work-conserving"), Tenant(0)], seconds=2.0, warmup=2.0
    )
    assert out.shares[0] >= 30 - TOLERANCE, out
    assert out.idle <= IDLE, out


@pytest.mark.parametrize(
    ("stamp", "low", "high"), [("scheduled", 190, 260), ("record", 1500, 2300)]
)
def test_the_two_event_stamp_models(
    tmp_path: Path, plain: Build, stamp: str, low: float, high: float
) -> None:
    """A 200 µs kernel bracketed by events on an idle stream while a neighbour saturates the
    GPU with 2 ms kernels: ~200 µs when events are stamped as the context runs, ~200 µs plus
    the neighbour's slice when stamped at record time (the pessimistic model)."""
    env = {"FAKE_SCHED": str(tmp_path / "model"), "FAKE_EVENT_STAMP": stamp}
    lim = [GpuLimit(UUIDS[0], 100 * MiB, 100)]
    hog = Claim(tmp_path, plain, lim, name="hog").spawn("tp_launch", "util", "3", "2000", **env)
    try:
        time.sleep(0.3)
        out = Claim(tmp_path, plain, lim, name="a").run("tp_launch", "evstamp", "1.5", "200", **env)
    finally:
        hog.communicate(timeout=30)
    fields = dict(kv.split("=") for kv in out.stdout.split())
    assert int(fields["samples"]) >= 20
    assert low <= float(fields["median_us"]) <= high, fields


def test_tenants_in_their_own_pid_namespaces_are_corrected_by_the_drivers_host_pids(
    tmp_path: Path, plain: Build
) -> None:
    """30/70 with 5 ms kernels (longer than a slice), each tenant in a pid namespace of its
    own (pid 1 there, as in a pod). NVML reports host pids, so the correction loop cannot find
    a slot there by itself: without the node driver's mapping the 30 under-uses as with no
    loop at all (measured 21.8), and so it does with a mapping whose lines name another
    generation of the slot (same slot and pid 1, as for an earlier owner: never used); with the driver writing
    each slot's host pid into ``driver/usage`` (``reconcile_claim``, as
    ``NodeDriver.reconcile`` does), both hold (measured 29.7 / 70.0)."""
    tenants = [Tenant(30, 5000), Tenant(70, 5000)]
    for mode in ("", "stale"):
        bare = run_case(
            tmp_path / f"bare{mode}",
            plain,
            tenants,
            seconds=2.0,
            warmup=2.5,
            pid_namespaces=True,
            driver_pids=mode,
        )
        assert bare.shares[0] <= 30 - 5, (mode, bare)
    mapped = run_case(
        tmp_path / "mapped",
        plain,
        tenants,
        seconds=2.0,
        warmup=2.5,
        pid_namespaces=True,
        driver_pids="current",
    )
    assert all(abs(e) <= TOLERANCE for e in errors(Case("", tuple(tenants)), mapped)), mapped
    assert mapped.idle <= IDLE, mapped
    # the tenant was pid 1 of its namespace, and the file mapped its slot to a host pid
    usage = mapped.usage[0]
    assert usage[0] == "version 2", usage
    assert [ln.split()[3] for ln in usage if ln.startswith("pid ")] == ["1"], usage
