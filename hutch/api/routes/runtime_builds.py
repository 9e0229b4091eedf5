"""``POST /sandbox/runtimes/{name}/build``: build a catalog runtime now, its progress streamed.

What a runtime's first use does (``Driver.build_runtime``), asked for ahead of time (the Web
App's Runtimes page, scripts): a member may, since any member's first use would. The answer
is server-sent events: ``{"line": …}`` per build step as it happens, then ``{"done": true}``
or ``{"error": …}``. A build already running (a first use, another request) is joined, not
started twice; a built runtime answers ``done`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from aiohttp import web

from hutch.api.keys import ENGINE
from hutch.core import runtimes
from hutch.core.errors import HutchError, RuntimeNotFound

routes = web.RouteTableDef()


@routes.post("/sandbox/runtimes/{name}/build")
async def build(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if runtimes.find(name) is None:
        known = ", ".join(r.name for r in runtimes.CATALOG)
        raise RuntimeNotFound(f"runtime: unknown runtime {name!r}; known runtimes: {known}", field="name")
    catalog = request.app[ENGINE].runtimes
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    await resp.prepare(request)
    lines: asyncio.Queue[str | None] = asyncio.Queue()

    async def run() -> dict[str, object]:
        try:
            await catalog.build(name, lines.put_nowait)
            return {"done": True, "available": name in catalog.available()}
        except HutchError as err:
            return {"error": err.message}
        finally:
            lines.put_nowait(None)

    if name in catalog.available() and name not in catalog.building():
        await resp.write(f"data: {json.dumps({'done': True, 'available': True})}\n\n".encode())
        await resp.write_eof()
        return resp
    task = asyncio.ensure_future(run())
    try:
        while (line := await lines.get()) is not None:
            await resp.write(f"data: {json.dumps({'line': line})}\n\n".encode())
        await resp.write(f"data: {json.dumps(await task)}\n\n".encode())
    except (ConnectionResetError, asyncio.CancelledError):
        pass  # the client left; the build goes on for whoever else waits on it
    with contextlib.suppress(Exception):
        await resp.write_eof()
    return resp
