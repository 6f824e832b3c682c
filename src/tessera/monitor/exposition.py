"""The text exposition (format 0.0.4) of the collector's metric families, and the HTTP
endpoint that serves it.

prometheus-client's ``generate_latest`` validates and escapes every label of every sample on
every scrape; with 100 shares that is ~1,500 samples of ~10 labels, most of a 50 ms budget.
A share's labels do not change between scrapes, so :class:`Exposition` renders each label set
once and keeps the text; values are formatted with prometheus-client's own ``floatToGoString``
and label names are sorted as it sorts them, so the bytes are the same as ``generate_latest``'s
(``tests/unit/test_monitor.py`` compares them). The families are prometheus-client's
(``GaugeMetricFamily``, ``CounterMetricFamily``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString

_MAX_CACHED = 200_000


def _escape_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class Exposition:
    """Renders metric families as the Prometheus text format, caching label strings.

    Label names must be valid legacy Prometheus names (they are: :mod:`tessera.monitor.metrics`
    defines them); values may be any text. Thread-safe.
    """

    def __init__(self) -> None:
        self._labels: dict[tuple[tuple[str, str], ...], str] = {}
        self._lock = threading.Lock()

    def _labelstr(self, labels: dict[str, str]) -> str:
        key = tuple(labels.items())  # a family's samples keep its label order: sort on a miss only
        s = self._labels.get(key)
        if s is None:
            s = (
                "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(key)) + "}"
                if key
                else ""
            )
            with self._lock:
                if len(self._labels) >= _MAX_CACHED:
                    self._labels.clear()
                self._labels[key] = s
        return s

    def render(self, families: Iterable[Metric]) -> bytes:
        out: list[str] = []
        for m in families:
            name, kind = m.name, m.type
            if kind == "counter":
                name += "_total"
            elif kind == "unknown":
                kind = "untyped"
            doc = m.documentation.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
            for s in m.samples:  # (no _created/_gsum samples: the collector makes none)
                out.append(f"{s.name}{self._labelstr(s.labels)} {floatToGoString(s.value)}\n")
        return "".join(out).encode()


class _Handler(BaseHTTPRequestHandler):
    render: Callable[[], bytes]

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is served")
            return
        try:
            body = type(self).render()
        except Exception as e:  # one failed scrape must not stop the server
            self.send_error(500, f"collecting failed: {e}")
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # no access log


def serve(
    address: str, port: int, render: Callable[[], bytes]
) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Serve ``render()`` on ``http://address:port/metrics`` from a daemon thread (one thread
    per request). Raises ``OSError`` when the address cannot be bound."""
    handler = type("TesseraMetricsHandler", (_Handler,), {"render": staticmethod(render)})
    httpd = ThreadingHTTPServer((address, port), handler)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, name="tessera-monitor-http", daemon=True)
    t.start()
    return httpd, t
