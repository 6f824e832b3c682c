"""Reconciling a claim's charge with the driver's own per-process figure.

The enforcement library charges what it sees: allocations (in whole pages), pool and graph-pool
reserves, and ``context-overhead`` per context. The NVIDIA driver also holds, per process, what
no call shows: a context and its modules larger than ``context-overhead``, ``__device__``
globals, local memory grown at launch, the slack of pages shared by small allocations
(docs/enforcement.md section 4.6). NVML reports the whole per process
(``nvmlDeviceGetComputeRunningProcesses``, ``usedGpuMemory``), by host pid.

Host pids and other claims' processes are seen only on the node, so this runs in the node
driver (:meth:`tessera.driver.node.NodeDriver.reconcile`), never in a tenant's container:

1. :func:`host_pid` maps each live region slot to its host process: the slot's PID-namespace
   inode and pid against ``/proc/<pid>/ns/pid`` and the last ``NSpid`` of
   ``/proc/<pid>/status``, and its start time against ``/proc/<pid>/stat``;
2. :func:`unaccounted` sums per GPU of the claim ``max(0, NVML figure - slot charge)``;
3. :func:`write_driver_usage` writes that into ``<claim dir>/driver/usage``, a directory only
   the driver writes and the claim's containers mount read-only; the library holds that much
   back from the claim's limit at every charge and counts it as used in the queries. The same
   file carries the slot -> host pid mapping of step 1, which the pacer's correction loop needs
   to find the claim's processes in NVML's per-process utilisation when they run in a pid
   namespace of their own (docs/enforcement.md section 5).

:func:`reconcile_claim` does the three steps for one claim. The file (``version 2``)::

    version 2
    gpu <UUID> unaccounted <bytes>
    pid <slot index> <slot generation> <pid in the slot's namespace> <host pid>

``native/src/core.c`` is its one reader; a ``pid`` line is used only while the slot still
has that generation and pid, so a mapping written before the slot was reused is never used.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from tessera.enforcement._files import write_atomic
from tessera.enforcement.layout import DRIVER_DIR, DRIVER_USAGE_FILE
from tessera.enforcement.region import RegionSlot, RegionSnapshot

#: GPU UUID -> {host pid: bytes the driver holds for that process on the GPU}.
PerProcess = Mapping[str, Mapping[int, int]]


def _ns_pid(status: str) -> int | None:
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            parts = line.split()[1:]
            return int(parts[-1]) if parts else None
    return None


def _start_time(stat: str) -> int | None:
    tail = stat.rsplit(")", 1)[-1].split()
    return int(tail[19]) if len(tail) > 19 else None  # field 22, counted after the ')'


def host_pid(slot: RegionSlot, proc: str = "/proc") -> int | None:
    """The host pid of the process that owns ``slot``, or None when no process of this
    machine matches it (exited, or a slot whose identity was overwritten). Reads
    ``<proc>/<pid>/ns/pid``, ``status`` (``NSpid``) and ``stat`` (start time) of every pid:
    needs the host's PID namespace (``hostPID``) to see the containers' processes."""
    try:
        pids = [int(p) for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        base = f"{proc}/{pid}"
        try:
            if os.stat(f"{base}/ns/pid").st_ino != slot.pid_ns:
                continue
            with open(f"{base}/status") as f:
                if _ns_pid(f.read()) != slot.pid:
                    continue
            with open(f"{base}/stat") as f:
                if slot.start_time and _start_time(f.read()) != slot.start_time:
                    continue
        except (OSError, ValueError):
            continue
        return pid
    return None


def unaccounted(
    snap: RegionSnapshot,
    per_process: PerProcess,
    pid_of: Callable[[RegionSlot], int | None] = host_pid,
) -> dict[str, int]:
    """Per GPU of the claim (UUID as in the region, upper/lower case kept): the bytes its live
    processes hold by the driver's figures beyond what each is charged,
    ``sum over slots of max(0, per_process[uuid][host pid] - slot.used[gpu])``. A slot without
    a host process, or a GPU NVML does not list the process on, adds 0."""
    out: dict[str, int] = {}
    by_uuid = {k.lower(): v for k, v in per_process.items()}
    pids = {s.index: pid_of(s) for s in snap.slots}
    for g in snap.gpus:
        figures = by_uuid.get(g.uuid.lower(), {})
        extra = 0
        for s in snap.slots:
            pid = pids[s.index]
            if pid is None or pid not in figures or g.index >= len(s.used):
                continue
            extra += max(0, figures[pid] - s.used[g.index])
        out[g.uuid] = extra
    return out


#: ``driver/usage`` format version (module docstring); 2 added the ``pid`` lines.
DRIVER_USAGE_VERSION = 2


def format_driver_usage(
    values: Mapping[str, int], pids: Mapping[RegionSlot, int] | None = None
) -> str:
    """The ``driver/usage`` text (the format ``native/src/core.c`` reads, module docstring):
    ``version 2``, one ``gpu <UUID> unaccounted <bytes>`` line per GPU of ``values``, and one
    ``pid <slot index> <generation> <namespace pid> <host pid>`` line per slot of ``pids``
    (slot -> its host pid, from :func:`host_pid`), in slot order."""
    lines = [f"version {DRIVER_USAGE_VERSION}"]
    lines += [f"gpu {u} unaccounted {int(b)}" for u, b in sorted(values.items())]
    for s, hp in sorted((pids or {}).items(), key=lambda kv: kv[0].index):
        lines.append(f"pid {s.index} {s.generation} {s.pid} {int(hp)}")
    return "\n".join(lines) + "\n"


def write_driver_usage(
    claim_dir: str | Path,
    values: Mapping[str, int],
    pids: Mapping[RegionSlot, int] | None = None,
) -> Path:
    """Replace ``<claim_dir>/driver/usage`` with :func:`format_driver_usage` of ``values`` and
    ``pids`` (mode 0444, atomic rename in a directory the containers mount read-only, so a
    new file is seen there). Returns its path. Raises OSError."""
    d = Path(claim_dir) / DRIVER_DIR
    d.mkdir(mode=0o755, exist_ok=True)
    path = d / DRIVER_USAGE_FILE
    write_atomic(str(path), format_driver_usage(values, pids).encode(), 0o444, ".usage.")
    return path


def reconcile_claim(
    claim_dir: str | Path,
    snap: RegionSnapshot,
    per_process: PerProcess,
    pid_of: Callable[[RegionSlot], int | None] = host_pid,
) -> Path:
    """One claim's reconcile: map each live slot of ``snap`` to its host pid once
    (``pid_of``), write the unaccounted bytes per GPU and that mapping (slots with a host
    process) into ``<claim_dir>/driver/usage``. Returns its path. Raises OSError."""
    found = {s.index: pid_of(s) for s in snap.slots}
    pids = {s: hp for s in snap.slots if (hp := found[s.index]) is not None}
    values = unaccounted(snap, per_process, lambda s: found.get(s.index))
    return write_driver_usage(claim_dir, values, pids)


def nvml_per_process(nvml: object) -> dict[str, dict[int, int]]:
    """NVML's per-process used memory of every GPU (``nvmlDeviceGetComputeRunningProcesses``
    through nvidia-ml-py ``nvml``): UUID -> {host pid: bytes}. A GPU whose list cannot be read
    is left out (its claims count 0 unaccounted)."""
    n: object = nvml
    out: dict[str, dict[int, int]] = {}
    count = n.nvmlDeviceGetCount()  # type: ignore[attr-defined]
    for i in range(count):
        try:
            h = n.nvmlDeviceGetHandleByIndex(i)  # type: ignore[attr-defined]
            uuid = n.nvmlDeviceGetUUID(h)  # type: ignore[attr-defined]
            procs = n.nvmlDeviceGetComputeRunningProcesses(h)  # type: ignore[attr-defined]
        except n.NVMLError:  # type: ignore[attr-defined]
            continue
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        figures: dict[int, int] = {}
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            if isinstance(used, int):
                figures[int(p.pid)] = figures.get(int(p.pid), 0) + used
        out[uuid] = figures
    return out
