"""A sandbox's ports, tunnelled: a sandbox port is a host-only veth on the agent's machine (or,
for any other port its processes open, its own loopback), unreachable from the API's host. The
node driver opens a websocket here per TCP connection and the agent splices its binary
messages to the port, both ways.

Without ``port`` the websocket reaches the port the sandbox declared at create. With
``?port=N`` it reaches N on the sandbox's own loopback, through the local driver's
``port_connect`` (a socket made in the sandbox's network namespace): never a port of the node
itself, the agent's own listener included. That form answers first, in a text message,
``{"opened": true}``, ``{"refused": errno, "message": …}`` (nothing listens: the API says
nothing answers) or ``{"error": …, "status": …}``; binary messages follow."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import WSMsgType, web

from hutch.core.errors import HutchError, InvalidInput
from hutch.node.keys import DRIVER, error_response


def _port(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit() and 0 < int(raw) < 65536):
        raise InvalidInput(f"port must be a TCP port number (1-65535), not {raw!r}", field="port")
    return int(raw)


async def _splice(ws: web.WebSocketResponse, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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


async def _any_port(request: web.Request, raw: str) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=4 << 20)
    await ws.prepare(request)
    try:
        sock = await request.app[DRIVER].port_connect(request.match_info["id"], _port(raw))
    except HutchError as err:
        await ws.send_json({"error": err.to_wire(), "status": err.status or 500})
        await ws.close()
        return ws
    except OSError as err:
        await ws.send_json({"refused": err.errno or 0, "message": err.strerror or str(err)})
        await ws.close()
        return ws
    try:
        reader, writer = await asyncio.open_connection(sock=sock)
    except BaseException:
        sock.close()
        raise
    await ws.send_json({"opened": True})
    await _splice(ws, reader, writer)
    return ws


async def tunnel(request: web.Request) -> web.StreamResponse:
    if "port" in request.query:
        return await _any_port(request, request.query["port"])
    try:
        host, declared = await request.app[DRIVER].port_target(request.match_info["id"])
        reader, writer = await asyncio.open_connection(host, declared)
    except HutchError as err:
        return error_response(err)
    except OSError as err:
        return web.json_response({"success": False, "code": "DRIVER_ERROR",
                                  "message": f"the sandbox's port does not answer: {err.strerror}"}, status=502)
    ws = web.WebSocketResponse(max_msg_size=4 << 20)
    await ws.prepare(request)
    await _splice(ws, reader, writer)
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/sandboxes/{id}/port", tunnel)
