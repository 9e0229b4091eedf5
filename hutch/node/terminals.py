"""Terminals over a websocket: the first text message is the TerminalRequest (JSON); binary
messages are bytes both ways; text messages are control: ``{"resize": [rows, cols]}`` in,
``{"opened": true}`` / ``{"error": …}`` / ``{"exit": code}`` out."""

from __future__ import annotations

import asyncio
import contextlib
import json

from aiohttp import WSMsgType, web

from hutch.core.driver_types import TerminalRequest
from hutch.core.errors import HutchError, InvalidInput
from hutch.node.keys import DRIVER


async def terminal(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=4 << 20)
    await ws.prepare(request)
    try:
        first = await ws.receive(timeout=30)
        if first.type != WSMsgType.TEXT:
            raise InvalidInput("terminal: the first message must be the request (JSON text)")
        body = json.loads(first.data)
        req = TerminalRequest(sandbox_id=request.match_info["id"], argv=[str(a) for a in body["argv"]],
                              env={str(k): str(v) for k, v in (body.get("env") or {}).items()},
                              cwd=body.get("cwd"), rows=int(body.get("rows", 24)), cols=int(body.get("cols", 80)))
        session = await request.app[DRIVER].open_terminal(req)
    except HutchError as err:
        await ws.send_json({"error": err.to_wire(), "status": err.status or 500})
        await ws.close()
        return ws
    except (ValueError, KeyError, TypeError) as err:
        await ws.send_json({"error": InvalidInput(f"terminal: bad request: {err}").to_wire(), "status": 400})
        await ws.close()
        return ws
    await ws.send_json({"opened": True})

    async def output() -> None:
        while data := await session.read():
            await ws.send_bytes(data)
        await ws.send_json({"exit": await session.wait()})

    pump = asyncio.ensure_future(output())
    try:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                await session.write(msg.data)
            elif msg.type == WSMsgType.TEXT:
                control = json.loads(msg.data)
                if "resize" in control:
                    rows, cols = control["resize"]
                    await session.resize(int(rows), int(cols))
        # The driver side hung up.
    finally:
        await session.close()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(pump, 5)
        await ws.close()
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/sandboxes/{id}/terminal", terminal)
