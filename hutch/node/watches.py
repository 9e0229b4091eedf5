"""Directory watches over a websocket: the first text message is the request (``{"path",
"recursive"}``), answered ``{"opened": true}`` or ``{"error": …, "status": …}``; then each
``{"ask": "flush" | "next"}`` is answered ``{"events": [[kind, name], …]}``, ``{"ended": why}``
or an error. The watch ends when the socket closes (drivers/node/watch.py is the other end)."""

from __future__ import annotations

import json

from aiohttp import WSMsgType, web

from hutch.core.driver_types import WatchEnded
from hutch.core.errors import HutchError, InvalidInput
from hutch.node.keys import DRIVER


async def watch(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=4 << 20)
    await ws.prepare(request)
    try:
        first = await ws.receive(timeout=30)
        if first.type != WSMsgType.TEXT:
            raise InvalidInput("watch: the first message must be the request (JSON text)")
        body = json.loads(first.data)
        dir_watch = await request.app[DRIVER].watch_dir(request.match_info["id"], str(body["path"]),
                                                        recursive=bool(body.get("recursive")))
    except HutchError as err:
        await ws.send_json({"error": err.to_wire(), "status": err.status or 500})
        await ws.close()
        return ws
    except (ValueError, KeyError, TypeError) as err:
        await ws.send_json({"error": InvalidInput(f"watch: bad request: {err}").to_wire(), "status": 400})
        await ws.close()
        return ws
    await ws.send_json({"opened": True})
    try:
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            ask = json.loads(msg.data).get("ask")
            try:
                events = await (dir_watch.flush() if ask == "flush" else dir_watch.next())
            except WatchEnded as ended:
                await ws.send_json({"ended": str(ended)})
                break
            except HutchError as err:
                await ws.send_json({"error": err.to_wire(), "status": err.status or 500})
                break
            await ws.send_json({"events": [[e.kind, e.name] for e in events]})
    finally:
        await dir_watch.close()
        await ws.close()
    return ws


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/sandboxes/{id}/watch", watch)
