"""The extender's HTTP(S) server: ``POST /prioritize`` (ExtenderArgs -> HostPriorityList), ``GET /healthz``;
in legacy mode (a :class:`~tessera.extender.legacy.LegacyExtender`) also ``POST /filter``
(ExtenderArgs -> ExtenderFilterResult) and ``POST /bind`` (ExtenderBindingArgs ->
ExtenderBindingResult), and ``/prioritize`` ranks by its decision.

A malformed body gets HTTP 400; kube-scheduler then ignores the extender for that pod when the
extender is configured ``ignorable: true`` (as ``deploy/webhook/scheduler-config.yaml`` does).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tessera.extender.legacy import LegacyExtender
from tessera.extender.prioritize import BadArgs, UsageView, prioritize

MAX_BODY = 16 * 2**20
log = logging.getLogger(
    "tessera.extender"
)  # ExtenderArgs with full Node objects of a large cluster


def make_app(
    view: UsageView | None,
    default_policy: str = "first-fit",
    ready: Callable[[], bool] = lambda: True,
    legacy: LegacyExtender | None = None,
) -> Starlette:
    """The Starlette app of ``tessera extender`` (``legacy``: with ``filter`` and ``bind``)."""

    async def prioritize_route(request: Request) -> Response:
        body = await request.body()
        return await run_in_threadpool(answer, body)

    def verb(name: str, call: Callable[[Any], Any]) -> Callable[[Request], Any]:
        async def route(request: Request) -> Response:
            body = await request.body()
            return await run_in_threadpool(reply, name, call, body)

        return route

    def reply(name: str, call: Callable[[Any], Any], body: bytes) -> Response:
        if len(body) > MAX_BODY:
            return PlainTextResponse(f"body over the {MAX_BODY}-byte limit", status_code=413)
        try:
            result = call(json.loads(body))
        except (BadArgs, ValueError, RecursionError) as e:
            log.warning("%s: bad arguments: %s", name, e)
            return PlainTextResponse(f"bad {name} arguments: {e}", status_code=400)
        if name == "filter" and log.isEnabledFor(logging.INFO):
            log.info("filter: fits %s; not %s", result.get("NodeNames"), result.get("FailedNodes"))
        return JSONResponse(result)

    def answer(body: bytes) -> Response:  # may read claims from the API server: off the event loop
        if len(body) > MAX_BODY:
            return PlainTextResponse(f"body over the {MAX_BODY}-byte limit", status_code=413)
        try:
            args = json.loads(body)
            if legacy is not None:
                result = legacy.prioritize(args)
            else:
                assert view is not None
                result = prioritize(args, view, default_policy)
        except (BadArgs, ValueError, RecursionError) as e:
            log.warning("prioritize: not an ExtenderArgs: %s", e)
            return PlainTextResponse(f"not an ExtenderArgs: {e}", status_code=400)
        if log.isEnabledFor(logging.INFO):
            meta = (args.get("Pod") or {}).get("metadata") or {}
            log.info(
                "prioritize %s/%s: %s",
                meta.get("namespace"),
                meta.get("name"),
                ", ".join(f"{r['Host']}={r['Score']}" for r in result),
            )
        return JSONResponse(result)

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        return (
            PlainTextResponse("ok")
            if ready()
            else PlainTextResponse("caches not synced", status_code=503)
        )

    routes = [
        Route("/prioritize", prioritize_route, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    if legacy is not None:
        routes += [
            Route("/filter", verb("filter", legacy.filter), methods=["POST"]),
            Route("/bind", verb("bind", legacy.bind), methods=["POST"]),
        ]
    return Starlette(routes=routes)
