"""The webhook's HTTPS server: Starlette routes served by uvicorn, with certificate reload.

Routes:

* ``POST /mutate-pods``: ``admission.k8s.io/v1`` AdmissionReview (see
  :mod:`tessera.webhook.admission`); HTTP 400 for a body that is not one, 413 over
  :data:`~tessera.webhook.admission.MAX_BODY`; never 500. HAMi pods become DRA claims, or, in
  mode ``legacy``, keep their requests and get the legacy scheduler (docs/legacy.md).
* ``POST /mutate-pods-legacy`` (modes ``legacy`` and ``both``): the same, for legacy mode always
  (the chart sends it the pods of namespaces labelled ``gpu.tessera.dev/mode=legacy``).
* ``GET /healthz``: ``ok`` while the process serves.
* ``GET /readyz``: ``ok`` once the ResourceSlice cache has its first list (503 before, and
  503 while draining).

Shutdown (:func:`serve`): on SIGTERM the server first **drains** for ``drain`` seconds: it keeps
answering every request (admissions included) while the endpoints controller removes the pod
from the Service, ``/readyz`` answers 503, and every response carries ``Connection: close`` so
that the API server's kept-alive connections go away and its next request is routed to another
replica. Then it stops accepting connections, finishes the requests in flight and returns.

TLS: :class:`CertReloader` keeps the serving certificate in step with ``--tls-cert-file`` /
``--tls-private-key-file``: the files are checked every ``reload_interval`` seconds (cert-manager
and the kubelet replace a mounted Secret's files atomically), a new pair is loaded only once it
parses and matches, and new connections get it; a broken pair is logged and the old one kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tessera.kube.client import ApiError, load_cert_chain_data
from tessera.webhook.admission import MAX_BODY, BadReview, ClusterView, Decision, decide
from tessera.webhook.templates import FRESH, NEEDED, TemplateStore, template_key

log = logging.getLogger("tessera.webhook")

#: The modes a webhook serves: ``dra`` (HAMi pods become claims), ``legacy`` (they keep their
#: requests and get the legacy scheduler), ``both`` (by path, below).
MODES = ("dra", "legacy", "both")
#: The admission paths: DRA's (legacy's in mode ``legacy``) and legacy mode's.
MUTATE_PATH = "/mutate-pods"
MUTATE_LEGACY_PATH = "/mutate-pods-legacy"
PATHS = (MUTATE_PATH, MUTATE_LEGACY_PATH)


class CertReloader:
    """An ``ssl.SSLContext`` (server side, TLS >= 1.2) serving ``cert_file``/``key_file``, and
    :meth:`check` to load them again when they changed. Raises ``OSError``/``ssl.SSLError`` at
    construction when the first pair cannot be loaded."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.loads = 0
        self._seen = self._stamp()
        self._load_into(self.context)

    def _stamp(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for p in (self.cert_file, self.key_file):
            st = os.stat(p)  # follows the ..data symlink of a mounted Secret
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _load_into(self, ctx: ssl.SSLContext) -> None:
        # Read both files once, so that the pair checked is the pair loaded.
        # Nothing is written to disk (the chart's root file system is read-only, with no /tmp).
        cert, key = self.cert_file.read_bytes(), self.key_file.read_bytes()
        probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        load_cert_chain_data(probe, cert, key)  # raises before the live context is touched
        load_cert_chain_data(ctx, cert, key)
        self.loads += 1

    def check(self) -> bool:
        """Reload when the files changed; True if a new pair is now served."""
        try:
            stamp = self._stamp()
        except OSError as e:
            log.warning("TLS files: %s; keeping the current certificate", e)
            return False
        if stamp == self._seen:
            return False
        try:
            self._load_into(self.context)
        except (OSError, ssl.SSLError, ValueError) as e:
            log.warning(
                "TLS files changed but cannot be loaded (%s); keeping the current certificate", e
            )
            return False
        self._seen = stamp
        log.info("reloaded the serving certificate from %s", self.cert_file)
        return True


@dataclass
class Counters:
    """What the webhook did since it started (``/readyz?verbose`` shows them)."""

    reviews: int = 0
    converted: int = 0
    denied: int = 0
    bad_requests: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class Webhook:
    """The admission handler: ``view`` (the cluster's slices), ``store`` (templates on the API
    server; None only when nothing may be created, e.g. a benchmark of the decision alone, or
    legacy mode alone), ``ready`` (whether the slice cache is synced); ``mode`` (:data:`MODES`)
    and ``legacy_scheduler`` say which path converts for which mode (:data:`PATHS`)."""

    def __init__(
        self,
        view: ClusterView,
        store: TemplateStore | None,
        ready: Callable[[], bool] = lambda: True,
        *,
        mode: str = "dra",
        legacy_scheduler: str = "",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: must be one of {', '.join(MODES)}")
        if mode != "dra" and not legacy_scheduler:
            raise ValueError(f"mode {mode!r} needs legacy_scheduler (the legacy scheduler's name)")
        self.mode = mode
        self.legacy_scheduler = legacy_scheduler
        self.view = view
        self.store = store
        self.ready = ready
        self.counters = Counters()
        #: Set when a drain starts (:func:`serve`): answers close their connection, ``/readyz``
        #: is 503. A plain attribute, set from a signal handler (no lock may be taken there).
        self.draining = False
        self._writes: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def admit(self, body: bytes, legacy: bool = False) -> tuple[int, dict[str, Any] | str]:
        """HTTP status and AdmissionReview (or the text of a 400) for one request body;
        ``legacy``: converted for legacy mode (:func:`~.admission.decide`'s ``legacy_scheduler``)."""
        self.counters.reviews += 1
        sched = self.legacy_scheduler if legacy else ""
        try:
            d = decide(body, self.view, lint_new=False, legacy_scheduler=sched)
            if d.unlinted:
                # A shape first seen since the slices changed: its lint runs every selector on
                # every device (300 ms for 1,000 GPUs); in a thread, other admissions go on.
                try:
                    await asyncio.to_thread(self.view.lint_shapes, d.unlinted)
                except Exception:  # decide() below lints again, and denies naming what broke
                    log.exception("linting new template shapes failed")
                d = decide(body, self.view, legacy_scheduler=sched)
        except BadReview as e:
            self.counters.bad_requests += 1
            return 400, str(e)
        if d.templates and self.store is not None:
            waits = []
            for t in d.templates:
                state = self.store.state(t)
                if state != FRESH:
                    write = self._write(t)
                    if state == NEEDED:  # DUE: the stamp is refreshed while the answer goes out
                        waits.append(write)
            if waits:
                await self._ensure(d, waits)
        if d.allowed and d.patch:
            self.counters.converted += 1
        if not d.allowed:
            self.counters.denied += 1
            log.info("denied pod %s: %s", d.pod or d.uid, d.message)
        return 200, d.review()

    def _write(self, template: dict[str, Any]) -> asyncio.Task[None]:
        """The one write (create or stamp, in a worker thread) of ``template`` in flight, started
        if none is: concurrent admissions of one shape share it instead of each writing."""
        assert self.store is not None
        key = template_key(template)
        task = self._writes.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                asyncio.to_thread(self.store.ensure, template)
            )
            self._writes[key] = task

            def done(t: asyncio.Task[None]) -> None:
                self._writes.pop(key, None)
                if not t.cancelled() and t.exception() is not None:
                    log.warning(
                        "ResourceClaimTemplate %s/%s: create or stamp failed: %s",
                        *key,
                        t.exception(),
                    )

            task.add_done_callback(done)
        return task

    async def _ensure(self, d: Decision, writes: list[asyncio.Task[None]]) -> None:
        try:
            # shielded: a client that goes away must not cancel a write other admissions share
            await asyncio.shield(asyncio.gather(*writes))
        except ApiError as e:
            code = e.status if 400 <= e.status < 500 else 503
            d.deny(
                code,
                e.reason or "ServiceUnavailable",
                f"tessera webhook could not create the pod's ResourceClaimTemplate: {e.message or e}",
            )

    def _closing(self, response: Response) -> Response:
        """``response``, with ``Connection: close`` while draining (the client reconnects,
        through the Service, to a replica that is not going away)."""
        if self.draining:
            response.headers["connection"] = "close"
        return response

    def app(self) -> Starlette:
        def mutate_for(legacy: bool) -> Callable[[Request], Awaitable[Response]]:
            async def route(request: Request) -> Response:
                return await mutate(request, legacy)

            return route

        async def mutate(request: Request, legacy: bool) -> Response:
            length = request.headers.get("content-length")
            if length is not None and length.isdigit() and int(length) > MAX_BODY:
                self.counters.bad_requests += 1
                return PlainTextResponse(f"body over the {MAX_BODY}-byte limit", status_code=413)
            body = await request.body()
            status, payload = await self.admit(body, legacy)
            if isinstance(payload, str):
                return self._closing(PlainTextResponse(payload, status_code=status))
            return self._closing(JSONResponse(payload, status_code=status))

        async def healthz(_: Request) -> Response:
            return self._closing(PlainTextResponse("ok"))

        async def readyz(request: Request) -> Response:
            if self.draining:
                return self._closing(PlainTextResponse("draining: shutting down", status_code=503))
            if not self.ready():
                return PlainTextResponse("ResourceSlice cache not synced yet", status_code=503)
            if "verbose" in request.query_params:
                c = self.counters
                return JSONResponse(
                    {
                        "reviews": c.reviews,
                        "converted": c.converted,
                        "denied": c.denied,
                        "badRequests": c.bad_requests,
                    }
                )
            return PlainTextResponse("ok")

        return Starlette(
            routes=[
                Route(MUTATE_PATH, mutate_for(self.mode == "legacy"), methods=["POST"]),
                *(
                    [Route(MUTATE_LEGACY_PATH, mutate_for(True), methods=["POST"])]
                    if self.mode != "dra"
                    else []
                ),
                Route("/healthz", healthz, methods=["GET"]),
                Route("/readyz", readyz, methods=["GET"]),
            ]
        )


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, with a drain period between the first SIGTERM and the shutdown."""

    def __init__(
        self,
        config: uvicorn.Config,
        drain: float,
        on_drain: Callable[[], None] | None,
        log_stop: Callable[[str], None] | None,
    ) -> None:
        super().__init__(config)
        self.drain = drain
        self.on_drain = on_drain
        self.log_stop = log_stop or (lambda _m: None)
        self.drain_started: float | None = None  # time.monotonic() of the first SIGTERM
        self._drain_logged = False

    def handle_exit(self, sig: int, frame: Any) -> None:
        import signal
        import time

        # Signal handler: only flags here; on_tick (the event loop) does the rest. SIGTERM is
        # not recorded for uvicorn to raise again once serving ended: the command then returns,
        # logs its stop and exits 0.
        if sig == signal.SIGTERM:
            if self.drain > 0 and self.drain_started is None:
                self.drain_started = time.monotonic()
                if self.on_drain is not None:
                    self.on_drain()
            else:
                self.should_exit = True  # no drain, or a second SIGTERM: stop now
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        import time

        if self.drain_started is not None and not self.should_exit:
            if not self._drain_logged:
                self._drain_logged = True
                self.log_stop(
                    f"SIGTERM: draining for {self.drain:g} s (requests still served, "
                    "connections closed after each answer, /readyz 503)"
                )
            if time.monotonic() - self.drain_started >= self.drain:
                self.log_stop(
                    f"drained for {time.monotonic() - self.drain_started:.1f} s: no longer "
                    "accepting; finishing the requests in flight"
                )
                self.should_exit = True
        return await super().on_tick(counter)


async def serve(
    app: Any,
    *,
    host: str,
    port: int,
    certs: CertReloader | None,
    reload_interval: float = 2.0,
    ready: Callable[[int], None] | None = None,
    drain: float = 0.0,
    on_drain: Callable[[], None] | None = None,
    log_stop: Callable[[str], None] | None = None,
) -> None:
    """Serve ``app`` on ``host:port`` until SIGINT/SIGTERM: HTTPS with ``certs`` (checked for
    new files every ``reload_interval`` seconds), plain HTTP without. ``ready(port)`` is called
    once listening.

    On SIGTERM it first drains for ``drain`` seconds (``on_drain()`` is called when that
    starts, from the signal handler: it may only set flags; see the module doc): requests keep
    being served. Then (at once for SIGINT, a second SIGTERM, or ``drain`` 0) it stops
    accepting, finishes the requests in flight and returns within 5 seconds, idle keep-alive
    connections or not. ``log_stop(line)`` is told when the drain starts and ends. uvloop and
    httptools: the fastest of uvicorn's loops and parsers (``docs/benchmarks.md``)."""
    tls: dict[str, Any] = {}
    if certs is not None:
        tls = {"ssl_certfile": str(certs.cert_file), "ssl_keyfile": str(certs.key_file)}
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        timeout_keep_alive=30,
        timeout_graceful_shutdown=5,
        **tls,
    )  # graceful shutdown bounded: an idle client that never answers TLS close_notify holds it 30 s
    config.load()
    if certs is not None:
        config.ssl = certs.context  # our context: its certificate is swapped in place on reload
    server = _DrainingServer(config, drain, on_drain, log_stop)

    async def watch_files() -> None:
        while certs is not None:
            await asyncio.sleep(reload_interval)
            certs.check()

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        if ready is not None:
            sockets = [s for srv in getattr(server, "servers", []) for s in srv.sockets]
            ready(sockets[0].getsockname()[1] if sockets else port)

    tasks = [asyncio.ensure_future(watch_files()), asyncio.ensure_future(announce())]
    try:
        await server.serve()
    finally:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
