"""``HUTCH_PHASES=1`` (core/phases.py) at an HTTP server's edge: each request timed whole, by
method and route, from the first middleware to the handler's answer (what aiohttp spends
parsing before and writing after is outside it), and every span written to
``<data dir>/phases.json`` when the server stops, for bench/phases.py to read."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from hutch.core import phases

FILE = "phases.json"


def request_middleware(prefix: str = "") -> Middleware:
    """``prefix`` tells the servers' spans apart in one bench's breakdown (``"agent: "``)."""

    @web.middleware
    async def timed(request: web.Request, handler: Handler) -> web.StreamResponse:
        t0 = phases.start()
        try:
            return await handler(request)
        finally:
            resource = request.match_info.route.resource
            phases.end(f"{prefix}request {request.method} {resource.canonical if resource else request.path}", t0)

    return timed


def file_ctx(data_dir: Callable[[web.Application], Path]) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context writing the spans at the server's stop; append it first, so it runs
    last: after the driver's own spans at shutdown."""

    async def write(app: web.Application) -> AsyncIterator[None]:
        try:
            yield
        finally:
            (data_dir(app) / FILE).write_text(json.dumps(phases.taken()))

    return write
