"""Helpers shared by the native tests: build paths, a claim on the fake node, process I/O."""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from tessera.enforcement.layout import REGION_FILE
from tessera.enforcement.limits import GpuLimit, Limits, write_limits

REPO = Path(__file__).resolve().parents[2]
NATIVE = REPO / "native"
MiB = 1 << 20
GiB = 1 << 30

# Fake GPUs used by most tests (physical order, as NVML sees them).
UUIDS = [
    "GPU-00000000-1111-2222-3333-444444444444",
    "GPU-11111111-2222-3333-4444-555555555555",
    "GPU-22222222-3333-4444-5555-666666666666",
    "GPU-33333333-4444-5555-6666-777777777777",
]
PHYS = 16 * GiB


@dataclass(frozen=True)
class Build:
    """Paths of one build of the native tree."""

    root: Path
    lib: Path
    fake: Path
    bin: Path
    preload_prefix: tuple[str, ...] = ()  # sanitizer runtime that must be loaded first

    def prog(self, name: str) -> str:
        return str(self.bin / name)


PRIORITY: tuple[str, ...] = ("nice", "-n", "-10") if os.geteuid() == 0 else ()
"""The prefix every test program runs under: a raised CPU priority where the suite may set one
(root, as in CI). Pacing and contention are measured on wall-clock time, and a launch loop that
loses the CPU for longer than the fake's 20 ms queue leaves GPU time unused that no pacer can
give back: with four busy loops beside it, a 70 % tenant measured 65-68 % at nice 0 and
70.0-70.7 % at -10 (the suite's background control plane and kubelet are that load late in a
CI run). ``nice`` execs the program, so a process's pid is the program's."""


class Claim:
    """One claim on the fake node: a limits file, a region path and the process environment."""

    def __init__(
        self,
        tmp: Path,
        build: Build,
        gpus: list[GpuLimit],
        context_overhead: int = 0,
        state: Path | None = None,
        name: str = "claim",
        unlimited: tuple[str, ...] = (),
        shares: str | None = None,
    ) -> None:
        self.dir = tmp / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.build = build
        self.region = str(self.dir / REGION_FILE)
        self.limits_path = str(self.dir / "limits")
        self.limits = Limits(
            region=self.region,
            gpus=tuple(gpus),
            context_overhead=context_overhead,
            claim=f"default/{name}",
            claim_uid=f"uid-{name}",
            unlimited=unlimited,
            shares=shares,
        )
        write_limits(self.limits_path, self.limits)
        self.state = str(state or (tmp / "fake-gpu-state"))

    def env(self, preload: bool = True, **extra: str) -> dict[str, str]:
        e = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CUDA_", "FAKE_", "TESSERA_", "LD_PRELOAD"))
        }
        e["LD_LIBRARY_PATH"] = str(self.build.fake)
        e["FAKE_GPU_STATE"] = self.state
        e["FAKE_GPUS"] = ",".join(f"{u}={PHYS}" for u in UUIDS)
        e["TESSERA_LIMITS_FILE"] = self.limits_path
        e["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:exitcode=86"
        e["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1:exitcode=87"
        if preload:
            e["LD_PRELOAD"] = " ".join([*self.build.preload_prefix, str(self.build.lib)])
        e.update(extra)
        return e

    def run(
        self, prog: str, *args: str, timeout: float = 60, check: bool = True, **kw: str
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [*PRIORITY, self.build.prog(prog), *args],
            env=self.env(**kw),  # type: ignore[arg-type]
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"{prog} {args} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def tp(self, mode: str, *cmds: str, **kw: str) -> list[str]:
        """Run tp_cuda and return its stdout lines."""
        return self.run("tp_cuda", mode, *cmds, **kw).stdout.splitlines()

    def spawn(
        self, prog: str, *args: str, wrap: tuple[str, ...] = (), **kw: str
    ) -> subprocess.Popen[str]:
        """Start ``prog`` (under the command ``wrap``, e.g. ``unshare ...``, when given)."""
        return subprocess.Popen(
            [*PRIORITY, *wrap, self.build.prog(prog), *args],
            env=self.env(**kw),  # type: ignore[arg-type]
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def wait_line(p: subprocess.Popen[str], want: str, timeout: float = 30) -> list[str]:
    """Read p's stdout until a line equal to ``want``; return the lines read.

    The process is killed if the line has not come after ``timeout`` seconds.
    """
    assert p.stdout is not None
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    lines: list[str] = []
    try:
        for line in p.stdout:
            lines.append(line.rstrip("\n"))
            if lines[-1] == want:
                return lines
    finally:
        timer.cancel()
    err = p.stderr.read() if p.stderr else ""
    raise AssertionError(f"no {want!r} from process; got {lines}; stderr: {err}")


class Stepped:
    """``tp_cuda`` run in stages: between two stages the process waits (its ``wait`` command),
    alive and holding what it allocated, so that a test can read the claim's region.

    ``next()`` resumes the process (the first call starts it) and returns the lines the next
    stage printed; after the last stage the process must have exited with status 0.
    """

    def __init__(self, claim: Claim, mode: str, *stages: list[str], **env: str) -> None:
        args: list[str] = []
        for i, stage in enumerate(stages):
            args += stage if i == len(stages) - 1 else [*stage, "wait"]
        self.stages = len(stages)
        self.done = 0
        self.p = subprocess.Popen(
            [claim.build.prog("tp_cuda"), mode, *args],
            env=claim.env(**env),  # type: ignore[arg-type]
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def next(self, timeout: float = 30) -> list[str]:
        assert self.p.stdin is not None and self.p.stdout is not None
        if self.done:
            self.p.stdin.write("\n")
            self.p.stdin.flush()
        self.done += 1
        if self.done < self.stages:
            return wait_line(self.p, "waiting", timeout)[:-1]
        out, err = self.p.communicate(timeout=timeout)
        if self.p.returncode != 0:
            raise AssertionError(f"tp_cuda exited {self.p.returncode}\n{out}\n{err}")
        return out.splitlines()

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.communicate()

    def __enter__(self) -> Stepped:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
