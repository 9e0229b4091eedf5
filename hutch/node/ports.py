"""A sandbox's exposed port, tunnelled: a sandbox port is a host-only veth on the agent's
machine, unreachable from the API's host. The node driver opens a websocket here per TCP
connection and the agent splices its binary messages to the port, both ways."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import WSMsgType, web

from hutch.core.errors import HutchError
from hutch.node.keys import DRIVER, error_response


async def tunnel(request: web.Request) -> web.StreamResponse:
    try:
        host, port = await request.app[DRIVER].port_target(request.match_info["id"])
        reader, writer = await asyncio.open_connection(host, port)
    except HutchError as err:
        return error_response(err)
    except OSError as err:
        return web.json_response({"success": False, "code": "DRIVER_ERROR",
                                  "message": f"the sandbox's port does not answer: {err.strerror}"}, status=502)
    ws = web.WebSocketResponse(max_msg_size=4 << 20)
    await ws.prepare(request)

    async def upstream() -> None:
        while data := await reader.read(64 << 10):
            await ws.send_bytes(data)
        await ws.close()

    pump = asyncio.ensure_future(upstream())
    try:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                writer.write(msg.data)
                await writer.drain()
    finally:
        pump.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await pump
        writer.close()
        await ws.close()
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/sandboxes/{id}/port", tunnel)
