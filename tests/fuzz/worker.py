"""Runs ``tessera`` commands in-process, one after the other, under a time and memory bound.

Reads a JSON list of argument lists from a file; writes one JSON line per run on stdout:
``{"i", "exit", "traceback", "stderr", "seconds", "rss_mib"}``. The whole worker runs under
``RLIMIT_AS`` (``--memory-mib``), so a run that grows without bound fails with MemoryError
(reported as a traceback); each run gets ``--seconds`` of wall time (SIGALRM), after which it
is reported as a hang.

    python tests/fuzz/worker.py --seconds 20 --memory-mib 3072 runs.json
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import time
import traceback
from typing import Any


class Hang(BaseException):
    """Raised by the alarm: the run took longer than its bound."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--memory-mib", type=int, default=3072)
    ap.add_argument("runs", help="JSON file: a list of argument lists")
    a = ap.parse_args()
    limit = a.memory_mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with open(a.runs) as f:
        runs = json.load(f)
    from click.testing import CliRunner

    from tessera.cli import main as cli

    signal.signal(signal.SIGALRM, _alarm)
    for i, args in enumerate(runs):
        t0 = time.perf_counter()
        result: dict[str, Any] = {"i": i}
        try:
            signal.setitimer(signal.ITIMER_REAL, a.seconds)
            r = CliRunner().invoke(cli, args, catch_exceptions=True)
            signal.setitimer(signal.ITIMER_REAL, 0)
            result["exit"] = r.exit_code
            result["stderr"] = r.stderr
            exc = r.exception
            if exc is not None and not isinstance(exc, SystemExit):
                result["traceback"] = "".join(
                    traceback.format_exception(type(exc), exc, exc.__traceback__)
                )[-4000:]
        except Hang:
            result["exit"] = None
            result["traceback"] = f"hang: still running after {a.seconds} s"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        result["seconds"] = round(time.perf_counter() - t0, 3)
        result["rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
