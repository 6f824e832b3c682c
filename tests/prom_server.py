"""A real Prometheus server for tests: Debian's ``prometheus`` (installed by
``tools/prometheus/install.sh``, which ``make test`` runs), on loopback, with a temporary
config and data directory; stopped (and its files removed with the test's tmp dir) after."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prometheus_binary() -> str:
    """The ``prometheus`` binary; raises (tests fail, never skip) when it is not installed."""
    exe = shutil.which("prometheus")
    if exe is None:
        raise RuntimeError(
            "prometheus is not installed: run tools/prometheus/install.sh (make test does)"
        )
    return exe


class Prometheus:
    """A running server: :meth:`query` runs PromQL (instant query) and returns the result list."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.proc = proc
        self.log = log

    def api(self, path: str, **params: str) -> Any:
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=10) as r:
            doc = json.loads(r.read())
        if doc.get("status") != "success":
            raise AssertionError(f"Prometheus {path} {params}: {doc}")
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("/api/v1/query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float:
        """The single sample of ``expr``; fails unless exactly one series answers."""
        res = self.query(expr)
        assert len(res) == 1, f"{expr}: expected one series, got {res}"
        return float(res[0]["value"][1])

    def wait(self, expr: str, ok: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll ``expr`` until ``ok(result)`` is true; return the result."""
        deadline = time.monotonic() + timeout
        res: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            res = self.query(expr)
            if ok(res):
                return res
            time.sleep(0.25)
        raise AssertionError(
            f"{expr}: condition not met after {timeout}s; last result {res}; log tail:\n{self.tail()}"
        )

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


@contextmanager
def prometheus(
    tmp: Path, targets: Sequence[str], *, rule_files: Sequence[Path] = (), interval: str = "1s"
) -> Iterator[Prometheus]:
    """Start Prometheus scraping ``targets`` (``host:port``) every ``interval`` and evaluating
    ``rule_files`` as often; stop it (SIGTERM, then SIGKILL) when the block ends."""
    exe = prometheus_binary()
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = {
        "global": {
            "scrape_interval": interval,
            "evaluation_interval": interval,
            "scrape_timeout": interval,
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": "tessera-monitor", "static_configs": [{"targets": list(targets)}]}
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    log = tmp / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                exe,
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {proc.returncode}:\n{server.tail()}")
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prometheus not ready after 60s:\n{server.tail()}")
            time.sleep(0.2)
        yield server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
