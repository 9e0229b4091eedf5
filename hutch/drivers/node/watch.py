"""A directory watch on an agent, over its websocket (hutch/node/watches.py has the protocol).
One ask at a time: an ask cut short (its caller gone) is not asked again, its answer is the
next one read, so no event is lost, at most handed out one call late."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from hutch.core.driver_types import DirWatch, WatchEnded, WatchEvent
from hutch.core.errors import DriverFailure, from_wire


class NodeDirWatch(DirWatch):
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, node: str, path: str) -> None:
        self._ws, self._node, self._path = ws, node, path
        self._lock = asyncio.Lock()
        self._outstanding = False
        self._ended: str | None = None

    @classmethod
    async def open(cls, ws: aiohttp.ClientWebSocketResponse, node: str, path: str, recursive: bool) -> NodeDirWatch:
        await ws.send_str(json.dumps({"path": path, "recursive": recursive}))
        answer = await cls._answer(ws, node)
        if "error" in answer:
            await ws.close()
            raise from_wire(int(str(answer.get("status", 500))), answer["error"])
        return cls(ws, node, path)

    @staticmethod
    async def _answer(ws: aiohttp.ClientWebSocketResponse, node: str) -> dict[str, object]:
        msg = await ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            await ws.close()
            raise DriverFailure(f"node agent {node} closed the watch")
        answer = json.loads(msg.data)
        assert isinstance(answer, dict)
        return answer

    @property
    def ended(self) -> bool:
        return self._ended is not None or self._ws.closed

    async def _ask(self, what: str) -> list[WatchEvent]:
        if self._ended is not None:
            raise WatchEnded(self._ended)
        async with self._lock:
            if not self._outstanding:
                await self._ws.send_str(json.dumps({"ask": what}))
                self._outstanding = True
            try:
                answer = await self._answer(self._ws, self._node)
            except DriverFailure as err:
                self._ended = f"the watch of {self._path} ended ({err})"
                raise WatchEnded(self._ended) from None
            self._outstanding = False
        if "ended" in answer:
            self._ended = str(answer["ended"])
            raise WatchEnded(self._ended)
        if "error" in answer:
            self._ended = f"the watch of {self._path} failed"
            raise from_wire(int(str(answer.get("status", 500))), answer["error"])
        events = answer.get("events")
        assert isinstance(events, list)
        return [WatchEvent(kind, str(name)) for kind, name in events]

    async def flush(self) -> list[WatchEvent]:
        return await self._ask("flush")

    async def next(self) -> list[WatchEvent]:
        return await self._ask("next")

    async def close(self) -> None:
        self._ended = self._ended or f"the watch of {self._path} was stopped"
        await self._ws.close()
