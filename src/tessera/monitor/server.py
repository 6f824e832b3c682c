"""Run the exporter: the HTTP endpoint and the API refresher.

:func:`start` serves a :class:`~tessera.monitor.collector.TesseraCollector` through
:class:`~tessera.monitor.exposition.Exposition`; the allocation view is re-read from the API server every
``api_interval`` seconds in a background thread, so a scrape never waits on the network.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tessera.api.errors import TesseraError
from tessera.kube.client import ApiError, KubeClient, api_problem
from tessera.monitor.allocation import AllocationView, fetch_allocation_view
from tessera.monitor.collector import TesseraCollector
from tessera.monitor.exposition import Exposition, serve
from tessera.monitor.nvml import Nvml
from tessera.monitor.regions import RegionDir


class MonitorError(TesseraError):
    """The exporter cannot start (port taken, region directory missing, API unreadable)."""


class ApiRefresher:
    """Keeps the node's :class:`AllocationView` fresh. :meth:`refresh` reads once (raising
    :class:`MonitorError`); :meth:`run_forever` re-reads every ``interval`` seconds in a
    daemon thread, logging failures and keeping the last good view (``up`` turns 0)."""

    def __init__(
        self, client: KubeClient, node: str, interval: float, log: Callable[[str], None]
    ) -> None:
        self.client = client
        self.node = node
        self.interval = interval
        self.log = log
        self._lock = threading.Lock()
        self._view: AllocationView | None = None
        self._up = False
        self._last = 0.0
        self._stop = threading.Event()
        self._failing = False

    def snapshot(self) -> tuple[AllocationView | None, bool, float]:
        with self._lock:
            return self._view, self._up, self._last

    def refresh(self) -> None:
        try:
            view = fetch_allocation_view(self.client, self.node)
        except ApiError as e:
            with self._lock:
                self._up = False
            raise MonitorError(api_problem(e, self.client.server)) from e
        except (ValueError, KeyError, TypeError) as e:
            with self._lock:
                self._up = False
            raise MonitorError(
                f"the API server {self.client.server} returned objects this monitor cannot read: {e}"
            ) from e
        with self._lock:
            self._view, self._up, self._last = view, True, view.fetched_at

    def run_forever(self) -> threading.Thread:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                try:
                    self.refresh()
                    if self._failing:
                        self.log(f"API server {self.client.server} readable again")
                    self._failing = False
                except MonitorError as e:
                    if not self._failing:
                        self.log(f"{e} (keeping the last figures; tessera_monitor_api_up is 0)")
                    self._failing = True

        t = threading.Thread(target=loop, name="tessera-monitor-api", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Running:
    """A started exporter: ``url`` of its metrics endpoint; :meth:`stop` shuts it down."""

    url: str
    port: int
    collector: TesseraCollector
    _httpd: Any
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        for c in self._closers:
            with contextlib.suppress(Exception):
                c()


def start(
    *,
    node: str,
    region_dir: str,
    port: int,
    address: str = "0.0.0.0",
    nvml: Nvml | None = None,
    api: ApiRefresher | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> Running:
    """Serve ``/metrics`` on ``address:port`` (0 = any free port). ``api`` must have been
    refreshed once; it is re-read in the background from now on. Raises
    :class:`MonitorError` when the address cannot be bound."""
    regions = RegionDir(region_dir)
    collector = TesseraCollector(node, regions, nvml.sample if nvml is not None else None, api, log)
    expo = Exposition()
    try:
        httpd, _thread = serve(address, port, lambda: expo.render(collector.collect()))
    except OSError as e:
        raise MonitorError(
            f"cannot listen on {address}:{port}: {e.strerror or e}: choose another --port or --address"
        ) from e
    bound = int(httpd.server_port)
    host = "127.0.0.1" if address in ("0.0.0.0", "") else address
    closers: list[Callable[[], None]] = []
    if api is not None:
        api.run_forever()
        closers.append(api.stop)
    if nvml is not None:
        closers.append(nvml.close)
    return Running(f"http://{host}:{bound}/metrics", bound, collector, httpd, closers)
