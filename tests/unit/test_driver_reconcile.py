"""Mapping region slots to host pids, and what a claim holds beyond its charges
(tessera.enforcement.reconcile): /proc as the node driver sees it with the host's PID namespace."""

from __future__ import annotations

import os
from pathlib import Path

from tessera.enforcement.reconcile import (
    format_driver_usage,
    host_pid,
    reconcile_claim,
    unaccounted,
)
from tessera.enforcement.region import RegionGpu, RegionSlot, RegionSnapshot

MiB = 1 << 20
UUID = "GPU-00000000-1111-2222-3333-444444444444"


def _proc(root: Path, pid: int, ns_file: Path, nspid: str, start: int) -> None:
    d = root / str(pid)
    (d / "ns").mkdir(parents=True)
    os.link(ns_file, d / "ns" / "pid")  # the same inode: the same PID namespace
    (d / "status").write_text(f"Name:\tpython3\nPid:\t{pid}\nNSpid:\t{nspid}\n")
    fields = " ".join(["S"] + ["0"] * 18 + [str(start)])
    (d / "stat").write_text(f"{pid} (python 3) {fields} 0 0\n")


def _slot(index: int, pid: int, ns: int, start: int, used: int) -> RegionSlot:
    return RegionSlot(index, pid, ns, start, 1, (used,), (1,), True)


def test_a_containers_process_is_found_by_its_namespace_pid_and_start(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    ns_a, ns_b = tmp_path / "ns-a", tmp_path / "ns-b"
    ns_a.write_text("")
    ns_b.write_text("")
    _proc(proc, 4100, ns_a, "4100\t7", 900)  # pid 7 in container A
    _proc(proc, 4200, ns_b, "4200\t7", 950)  # pid 7 in container B
    _proc(proc, 4300, ns_a, "4300\t8", 990)
    ino_a, ino_b = os.stat(ns_a).st_ino, os.stat(ns_b).st_ino
    assert host_pid(_slot(0, 7, ino_b, 950, 0), str(proc)) == 4200
    assert host_pid(_slot(0, 7, ino_a, 900, 0), str(proc)) == 4100
    assert host_pid(_slot(0, 7, ino_a, 901, 0), str(proc)) is None  # pid reused since
    assert host_pid(_slot(0, 9, ino_a, 900, 0), str(proc)) is None


def test_unaccounted_sums_what_each_process_holds_beyond_its_charge() -> None:
    slots = (_slot(0, 7, 1, 0, 364 * MiB), _slot(1, 8, 1, 0, 500 * MiB), _slot(2, 9, 1, 0, 0))
    snap = RegionSnapshot(1, 0, 0, 3, (RegionGpu(0, UUID, 1 << 30, 0, 0, 0, 0),), slots)
    pids = {0: 4100, 1: 4300, 2: None}
    figures = {UUID.lower(): {4100: 576 * MiB, 4300: 480 * MiB}}
    # 212 MiB beyond slot 0's charge; slot 1 is charged more than the driver shows (no credit);
    # slot 2 has no host process
    got = unaccounted(snap, figures, lambda s: pids[s.index])
    assert got == {UUID: 212 * MiB}
    assert format_driver_usage(got) == f"version 2\ngpu {UUID} unaccounted {212 * MiB}\n"


def test_the_claim_file_maps_each_live_slot_to_its_host_pid(tmp_path: Path) -> None:
    """``reconcile_claim`` writes the unaccounted bytes and, per slot with a host process, its
    index, generation, namespace pid and host pid (the lines the pacer matches, core.c)."""
    slots = (
        RegionSlot(3, 1, 77, 900, 5, (364 * MiB,), (1,), True),
        RegionSlot(0, 1, 78, 950, 2, (0,), (1,), True),
        RegionSlot(1, 9, 78, 990, 4, (0,), (1,), True),
    )
    snap = RegionSnapshot(1, 5, 0, 4, (RegionGpu(0, UUID, 1 << 30, 0, 0, 0, 0),), slots)
    pids = {3: 4100, 0: 4200, 1: None}  # slot 1's process has exited
    seen: list[int] = []

    def pid_of(s: RegionSlot) -> int | None:
        seen.append(s.index)
        return pids[s.index]

    path = reconcile_claim(tmp_path, snap, {UUID: {4100: 576 * MiB}}, pid_of)
    assert path == tmp_path / "driver" / "usage"
    assert path.read_text() == (
        f"version 2\ngpu {UUID} unaccounted {212 * MiB}\npid 0 2 1 4200\npid 3 5 1 4100\n"
    )
    assert sorted(seen) == [0, 1, 3]  # one /proc scan per slot, shared by both parts
    assert path.stat().st_mode & 0o777 == 0o444
