#!/usr/bin/env python3
"""Tessera GPU check: run the enforcement library on a real NVIDIA GPU and print a table.

First run on an H200 on 2026-12-04: docs/enforcement.md section 5.1. Needs: an NVIDIA driver,
nvidia-smi, gcc (or nvcc), make, python3; PyTorch is optional. Uses GPU 0. About 5 minutes;
a watchdog stops it after 8.

    python3 native/gpu-check/gpu_check.py [--keep]

Checks (targets from issue 5):
  1. two claims of 8000 MiB on one GPU: one allocates until refused (must get
     CUDA_ERROR_OUT_OF_MEMORY, and its physical usage seen by NVML must stay <= 8000 MiB)
     while the other keeps launching kernels;
  2. the same with PyTorch (torch.cuda.OutOfMemoryError, mem_get_info shows the limit);
  3. a 30/70 cores split: each tenant's share within 5 points;
  4. library overhead on a launch-heavy loop (< 1 %) and on cuMemAlloc/cuMemFree;
  5. (issue 23) the event-stamp question: process B saturates the GPU while process A
     brackets a 200 µs kernel with events on an otherwise idle stream: is the elapsed time
     ~200 µs (events stamped when A's context runs) or 200 µs plus the wait (stamped at
     record time)? docs/enforcement.md section 5;
  6. (issue 23) shares under contention, each within 3 points: 30/70 with 200 µs, 5 ms and
     10 ms kernels, 30 on 4 streams beside 70, 30 beside a best-effort tenant (held by the
     node's shares file), a work-conserving 30 alone (takes the idle GPU).

    python3 native/gpu-check/gpu_check.py --only evstamp,contention   # checks 5 and 6 only
    python3 native/gpu-check/gpu_check.py --only contention --log DIR  # + the pacer's log
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NATIVE = HERE.parent
MiB = 1 << 20
LIMIT_MIB = 8000
ROWS: list[tuple[str, str, str, str]] = []
LOG_DIR: Path | None = None  # --log: the tenants' library log (TESSERA_LOG_LEVEL=3) goes here


def row(check: str, result: str, target: str, ok: bool | None) -> None:
    ROWS.append((check, result, target, "n/a" if ok is None else ("PASS" if ok else "FAIL")))
    print(f"  {check}: {result} [{ROWS[-1][3]}]", flush=True)


def sh(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> str:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def kv(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


class Bench:
    def __init__(self, work: Path) -> None:
        self.work = work
        build = work / "build"
        sh(["make", "-C", str(NATIVE), f"BUILD={build}", "lib"])
        self.lib = str(build / "libtessera-enforce.so")
        src = str(HERE / "gpu_check.c")
        self.prog = str(work / "gpu_check")
        nvcc = shutil.which("nvcc")
        if nvcc:
            cuda = Path(nvcc).resolve().parent.parent
            sh([nvcc, "-x", "c", "-O2", "-DGC_DIRECT_LINK", "-D_GNU_SOURCE",
                f"-I{NATIVE / 'include'}", src, "-o", self.prog,
                f"-L{cuda / 'lib64' / 'stubs'}", "-lcuda", "-ldl"])
            self.how = "nvcc, linked against libcuda"
        else:
            sh(["gcc", "-std=c11", "-O2", "-D_GNU_SOURCE", f"-I{NATIVE / 'include'}", src, "-o",
                self.prog, "-ldl"])
            self.how = "gcc, libcuda via dlopen/dlsym"
        self.n = 0

    def claim(self, uuid: str, memory: int, cores: int, overhead: int,
              policy: str = "strict", shares: str | None = None) -> str:
        self.n += 1
        d = self.work / f"claim{self.n}"
        d.mkdir()
        pol = "" if policy == "strict" else f" policy {policy}"
        sh_line = f"shares {shares}\n" if shares else ""
        (d / "limits").write_text(
            f"version 1\nclaim gpu-check/c{self.n} uid-{self.n}\nregion {d / 'usage'}\n"
            f"context-overhead {overhead}\n{sh_line}gpu {uuid} memory {memory} cores {cores}{pol}\n")
        return str(d / "limits")

    def shares(self, uuid: str, guaranteed: int, best_effort: int) -> str:
        """The node's shares directory, as the driver writes it (tessera.enforcement.shares)."""
        d = self.work / f"shares{self.n}"
        d.mkdir(exist_ok=True)
        (d / uuid).write_text(
            f"version 1\nguaranteed {guaranteed}\nbest-effort {best_effort}\n")
        self.n += 1
        return str(d)

    def env(self, limits: str | None) -> dict[str, str]:
        e = {k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "LD_PRELOAD"))}
        e["CUDA_VISIBLE_DEVICES"] = "0"
        if limits:
            e["TESSERA_LIMITS_FILE"] = limits
            e["LD_PRELOAD"] = self.lib
            if LOG_DIR:
                e["TESSERA_LOG_LEVEL"] = "3"
        return e

    def run(self, limits: str | None, *args: str, timeout: float = 120) -> dict[str, str]:
        return kv(sh([self.prog, *args], env=self.env(limits), timeout=timeout))

    def spawn(self, limits: str | None, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([self.prog, *args], env=self.env(limits), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)


def nvml_used(pid: int) -> int:
    """Bytes NVML reports for pid on GPU 0 (0 if not listed)."""
    out = sh(["nvidia-smi", "-i", "0", "--query-compute-apps=pid,used_memory",
              "--format=csv,noheader,nounits"])
    for line in out.splitlines():
        p, used = (x.strip() for x in line.split(","))
        if p.isdigit() and int(p) == pid:
            return int(used) * MiB
    return 0


class Sampler:
    """Peak NVML memory of some pids, sampled every 0.2 s."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak = dict.fromkeys(pids, 0)
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self) -> None:
        while not self.stop.is_set():
            for p in self.pids:
                with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                    self.peak[p] = max(self.peak[p], nvml_used(p))
            time.sleep(0.2)

    def done(self) -> dict[int, int]:
        self.stop.set()
        self.t.join()
        return self.peak


def wait_ready(p: subprocess.Popen[str]) -> None:
    assert p.stdout is not None
    for line in p.stdout:
        if line.startswith("ready="):
            return
    raise RuntimeError(f"process exited early: {p.stderr.read() if p.stderr else ''}")


def check_memory(b: Bench, uuid: str, ctx: int) -> None:
    limit = LIMIT_MIB * MiB
    la, lb = b.claim(uuid, limit, 0, ctx), b.claim(uuid, limit, 0, ctx)
    keeper = b.spawn(la, "hold", "4000", "25")
    wait_ready(keeper)
    hog = b.spawn(lb, "oom", "256", "5")
    sampler = Sampler([keeper.pid, hog.pid])
    hog_out, hog_err = hog.communicate(timeout=120)
    keep_out, _ = keeper.communicate(timeout=120)
    peak = sampler.done()
    h, k = kv(hog_out), kv(keep_out)
    row("raw CUDA: over-limit alloc", f"result={h.get('refused_with')} after "
        f"{int(h.get('allocated', 0)) // MiB} MiB", "2 (OUT_OF_MEMORY)",
        h.get("refused_with") == "2")
    row("raw CUDA: cuMemGetInfo total", f"{int(h.get('meminfo_total', 0)) // MiB} MiB",
        f"{LIMIT_MIB} MiB", int(h.get("meminfo_total", 0)) == limit)
    over = peak[hog.pid] - limit
    row("raw CUDA: NVML peak of the over-allocator", f"{peak[hog.pid] // MiB} MiB "
        f"({over // MiB:+d} MiB vs limit)", "<= 8000 MiB (0 bytes past)", over <= 0)
    row("raw CUDA: neighbour keeps running", f"{k.get('kernels', '0')} kernels, exit "
        f"{keeper.returncode}", "> 0 kernels, exit 0",
        keeper.returncode == 0 and int(k.get("kernels", "0")) > 0)
    if hog.returncode != 0:
        print(hog_err, file=sys.stderr)


TORCH = r"""
import sys, torch
free, total = torch.cuda.mem_get_info()
print(f"total={total}")
xs = []
try:
    while True:
        xs.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        xs[-1].fill_(1)
except torch.cuda.OutOfMemoryError as e:
    print("oom=1")
print(f"allocated={len(xs) * (256 << 20)}")
print(f"reserved={torch.cuda.memory_reserved()}")
sys.stdout.flush()
import time; time.sleep(4)
"""


def check_torch(b: Bench, uuid: str, ctx: int) -> None:
    py = shutil.which("python3") or sys.executable
    probe = subprocess.run([py, "-c", "import torch; assert torch.cuda.is_available()"],
                           capture_output=True)
    if probe.returncode != 0:
        row("PyTorch", "torch not importable or no CUDA: not run", "-", None)
        return
    limit = LIMIT_MIB * MiB
    la, lb = b.claim(uuid, limit, 0, ctx), b.claim(uuid, limit, 0, ctx)
    keeper = b.spawn(la, "hold", "4000", "30")
    wait_ready(keeper)
    t = subprocess.Popen([py, "-c", TORCH], env=b.env(lb), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    sampler = Sampler([t.pid])
    out, err = t.communicate(timeout=180)
    peak = sampler.done()
    keeper.communicate(timeout=120)
    r = kv(out)
    row("PyTorch: OutOfMemoryError at the limit", f"oom={r.get('oom', '0')} after "
        f"{int(r.get('allocated', 0)) // MiB} MiB", "oom=1", r.get("oom") == "1")
    row("PyTorch: mem_get_info total", f"{int(r.get('total', 0)) // MiB} MiB",
        f"{LIMIT_MIB} MiB", int(r.get("total", 0)) == limit)
    over = peak[t.pid] - limit
    row("PyTorch: NVML peak", f"{peak[t.pid] // MiB} MiB ({over // MiB:+d} MiB)", "<= 8000 MiB",
        over <= 0)
    row("PyTorch: neighbour keeps running", f"exit {keeper.returncode}", "exit 0",
        keeper.returncode == 0)
    if t.returncode != 0:
        print(err[-2000:], file=sys.stderr)


def pmon(seconds: int) -> subprocess.Popen[str]:
    return subprocess.Popen(["nvidia-smi", "pmon", "-i", "0", "-s", "u", "-d", "1", "-c",
                             str(seconds)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)


def pmon_sm(out: str, pid: int) -> float | None:
    vals = []
    for line in out.splitlines():
        f = line.split()
        if len(f) > 3 and not line.startswith("#") and f[1] == str(pid) and f[3].isdigit():
            vals.append(int(f[3]))
    return statistics.mean(vals[2:-2]) if len(vals) > 5 else None


def check_split(b: Bench, uuid: str, ctx: int) -> None:
    cal = b.run(None, "calib", "500")
    iters, kus = cal["iters"], float(cal["kernel_us"])
    secs = 30
    procs = {}
    mon = pmon(secs)
    for cores in (30, 70):
        procs[cores] = b.spawn(b.claim(uuid, LIMIT_MIB * MiB, cores, ctx), "work", str(secs),
                               iters)
    res = {c: kv(p.communicate(timeout=secs + 60)[0]) for c, p in procs.items()}
    mon_out = mon.communicate(timeout=secs + 30)[0]
    for cores, r in res.items():
        share = 100.0 * int(r["kernels"]) * kus / 1e6 / float(r["wall_s"])
        sm = pmon_sm(mon_out, procs[cores].pid)
        row(f"cores {cores} (with {100 - cores} beside it)",
            f"{share:.1f} % of GPU time by work done; NVML sm {sm if sm is None else round(sm)} %",
            f"{cores} +/- 5", abs(share - cores) <= 5)
    alone = b.run(b.claim(uuid, LIMIT_MIB * MiB, 30, ctx), "work", "10", iters, timeout=80)
    share = 100.0 * int(alone["kernels"]) * kus / 1e6 / float(alone["wall_s"])
    row("cores 30 alone", f"{share:.1f} %", "30 +/- 5", abs(share - 30) <= 5)


def check_evstamp(b: Bench, uuid: str, ctx: int) -> None:
    cal = b.run(None, "calib", "200")
    alone = b.run(None, "evstamp", "4", cal["iters"])
    big = b.run(None, "calib", "2000")["iters"]
    hog = b.spawn(None, "work", "8", big)  # B: 2 ms kernels back to back
    time.sleep(1)
    busy = b.run(None, "evstamp", "4", cal["iters"])
    hog.communicate(timeout=60)
    med_a, med_b = float(alone["median_us"]), float(busy["median_us"])
    model = "stamped when scheduled" if med_b < 2 * med_a + 100 else "stamped at record (+wait)"
    row("event-stamp: 200 us kernel on an idle stream, alone / beside a saturating process",
        f"median {med_a:.0f} / {med_b:.0f} us (p90 {float(busy['p90_us']):.0f}, max "
        f"{float(busy['max_us']):.0f}): {model}", "(informational: which fake model)", None)


def _share(r: dict[str, str], kus: float) -> float:
    return 100.0 * int(r["kernels"]) * kus / 1e6 / float(r["wall_s"])


def check_contention(b: Bench, uuid: str, ctx: int) -> None:
    secs = 12
    mem = LIMIT_MIB * MiB // 2
    for kernel_us in (200, 5000, 10000):
        cal = b.run(None, "calib", str(kernel_us))
        iters, kus = cal["iters"], float(cal["kernel_us"])
        cases = [("30/70", [(30, "strict", 0, None), (70, "strict", 0, None)])]
        if kernel_us == 200:
            cases.append(("30 on 4 streams / 70", [(30, "strict", 4, None), (70, "strict", 0, None)]))
            cases.append(("work-conserving 30 alone", [(30, "work-conserving", 0, None)]))
        if kernel_us == 5000:
            sd = b.shares(uuid, 30, 1)
            cases.append(("30 beside best effort", [(30, "strict", 0, sd), (0, "strict", 0, sd)]))
        for name, tenants in cases:
            procs = []
            for cores, pol, streams, sd in tenants:
                lim = b.claim(uuid, mem, cores, ctx, pol, sd)
                args = ["work", str(secs), iters] + ([str(streams)] if streams else [])
                procs.append((cores, pol, b.spawn(lim, *args)))
            for cores, pol, p in procs:
                out, err = p.communicate(timeout=secs + 60)
                if LOG_DIR:
                    tag = f"{name}-{kernel_us}us-{pol}-{cores}".replace(" ", "_").replace("/", "_")
                    (LOG_DIR / f"{tag}.log").write_text(err)
                share = _share(kv(out), kus)
                if pol == "work-conserving":
                    row(f"{name}, {kernel_us} us", f"{share:.1f} %", ">= 90 (takes idle time)",
                        share >= 90)
                elif cores:
                    row(f"{name}, {kernel_us} us: cores {cores}", f"{share:.1f} %",
                        f"{cores} +/- 3", abs(share - cores) <= 3)
                else:
                    row(f"{name}, {kernel_us} us: best effort", f"{share:.1f} %",
                        "<= 70 + 3", share <= 73)


def check_overhead(b: Bench, uuid: str, ctx: int) -> None:
    lim = b.claim(uuid, LIMIT_MIB * MiB, 100, ctx)
    base, hooked = [], []
    for _ in range(3):
        base.append(float(b.run(None, "launches", "200000")["ns_per_launch"]))
        hooked.append(float(b.run(lim, "launches", "200000")["ns_per_launch"]))
    b0, h0 = statistics.median(base), statistics.median(hooked)
    row("launch-heavy loop overhead", f"{h0:.0f} vs {b0:.0f} ns/launch ({100 * (h0 / b0 - 1):+.2f} %)",
        "< 1 %", h0 / b0 - 1 < 0.01)
    lim70 = b.claim(uuid, LIMIT_MIB * MiB, 70, ctx)
    h70 = float(b.run(lim70, "launches", "200000")["ns_per_launch"])
    row("launch cost with the pacer on (cores 70)", f"{h70:.0f} ns/launch", "(informational)", None)
    a0 = float(b.run(None, "allocs", "2000", "64")["ns_per_alloc_free"])
    a1 = float(b.run(lim, "allocs", "2000", "64")["ns_per_alloc_free"])
    row("cuMemAlloc+cuMemFree 64 MiB", f"{a1 / 1000:.1f} vs {a0 / 1000:.1f} us "
        f"({100 * (a1 / a0 - 1):+.1f} %)", "(informational)", None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--only", help="comma-separated checks: memory,torch,split,overhead,"
                    "evstamp,contention (default: all)")
    ap.add_argument("--log", type=Path, help="write each contention tenant's library log "
                    "(TESSERA_LOG_LEVEL=3: the pacer's NVML readings and cost factor) here")
    args = ap.parse_args()
    global LOG_DIR
    if args.log:
        args.log.mkdir(parents=True, exist_ok=True)
        LOG_DIR = args.log
    checks = {"memory": check_memory, "torch": check_torch, "split": check_split,
              "overhead": check_overhead, "evstamp": check_evstamp,
              "contention": check_contention}
    chosen = [checks[c] for c in (args.only.split(",") if args.only else checks)]
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("9 minutes")))
    signal.alarm(9 * 60)
    work = Path(tempfile.mkdtemp(prefix="tessera-gpu-check."))
    t0 = time.monotonic()
    try:
        b = Bench(work)
        info = b.run(None, "info")
        uuid = info["uuid"]
        idle = b.spawn(None, "idle", "4")
        wait_ready(idle)
        time.sleep(1)
        ctx = nvml_used(idle.pid)
        idle.communicate(timeout=30)
        print(f"GPU 0: {info['name']} {uuid}, {info['sms']} SMs, {int(info['total']) // MiB} MiB; "
              f"context+module {ctx // MiB} MiB (used as context-overhead); built with {b.how}",
              flush=True)
        for f in chosen:
            try:
                f(b, uuid, ctx)
            except Exception as e:  # a failed check is a row, not the end of the run
                row(f.__name__, f"error: {e}"[:200], "-", False)
    finally:
        signal.alarm(0)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    w = [max(len(r[i]) for r in [("check", "result", "target", "verdict"), *ROWS]) for i in range(4)]
    print()
    for r in [("check", "result", "target", "verdict"), *ROWS]:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    print(f"\n{time.monotonic() - t0:.0f} s")
    return 0 if all(r[3] != "FAIL" for r in ROWS) else 1


if __name__ == "__main__":
    sys.exit(main())
