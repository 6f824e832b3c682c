"""The extender's HTTP(S) server: ``POST /prioritize`` (ExtenderArgs -> HostPriorityList), ``GET /healthz``.

A malformed body gets HTTP 400; kube-scheduler then ignores the extender for that pod when the
extender is configured ``ignorable: true`` (as ``deploy/webhook/scheduler-config.yaml`` does).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tessera.extender.prioritize import BadArgs, UsageView, prioritize

MAX_BODY = 16 * 2**20  # ExtenderArgs with full Node objects of a large cluster


def make_app(view: UsageView, default_policy: str = "first-fit", ready: Callable[[], bool] = lambda: True) -> Starlette:
    """The Starlette app of ``tessera extender``."""

    async def prioritize_route(request: Request) -> Response:
        body = await request.body()
        if len(body) > MAX_BODY:
            return PlainTextResponse(f"body over the {MAX_BODY}-byte limit", status_code=413)
        try:
            args = json.loads(body)
            return JSONResponse(prioritize(args, view, default_policy))
        except (BadArgs, ValueError, RecursionError) as e:
            return PlainTextResponse(f"not an ExtenderArgs: {e}", status_code=400)

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        return PlainTextResponse("ok") if ready() else PlainTextResponse("caches not synced", status_code=503)

    return Starlette(routes=[
        Route("/prioritize", prioritize_route, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ])
