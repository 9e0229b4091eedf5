"""Output stream URLs. Unauthenticated on purpose: the stream id is the capability."""

from __future__ import annotations

from aiohttp import web

from api.keys import ENGINE
from core.errors import NotFound

routes = web.RouteTableDef()


@routes.get("/streams/{stream_id}")
async def read_stream(request: web.Request) -> web.StreamResponse:
    outputs = request.app[ENGINE].outputs
    stream_id = request.match_info["stream_id"]
    if not outputs.exists(stream_id):
        raise NotFound(f"stream {stream_id} not found")
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream", "Cache-Control": "no-store"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)

    async def copy() -> None:
        async for chunk in outputs.read(stream_id):
            await resp.write(chunk)
        await resp.write_eof()

    execution_id = request.app[ENGINE].streams.execution_of(stream_id)
    if execution_id is None:
        await copy()
    else:  # a reader is a waiter: its client leaving for good cancels the command (api/watchers.py)
        await request.app[ENGINE].watchers.hold(request, execution_id, copy())
    return resp
