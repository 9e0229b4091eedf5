"""``HUTCH_PHASES=1`` (core/phases.py) at the HTTP edge: each request timed whole, by method
and route, from the first middleware to the handler's answer (what aiohttp spends parsing
before and writing after is outside it), and every span written to ``<data dir>/phases.json``
when the server stops, for bench/phases.py to read."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler

from hutch.api.keys import CONFIG
from hutch.core import phases

FILE = "phases.json"


@web.middleware
async def request_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    t0 = phases.start()
    try:
        return await handler(request)
    finally:
        resource = request.match_info.route.resource
        phases.end(f"request {request.method} {resource.canonical if resource else request.path}", t0)


async def file_ctx(app: web.Application) -> AsyncIterator[None]:
    try:
        yield
    finally:
        path = app[CONFIG].data_dir / FILE
        path.write_text(json.dumps(phases.taken()))
