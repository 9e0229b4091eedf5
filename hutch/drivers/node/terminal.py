"""A terminal on an agent, over its websocket (hutch/node/terminals.py has the protocol)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp

from hutch.core.driver_types import PtySession
from hutch.core.errors import DriverFailure, from_wire


class NodeTerminal(PtySession):
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, node: str) -> None:
        self._ws = ws
        self._node = node
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._reading = False

    @classmethod
    async def open(cls, ws: aiohttp.ClientWebSocketResponse, node: str, request: dict[str, object]) -> NodeTerminal:
        await ws.send_str(json.dumps(request))
        msg = await ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            await ws.close()
            raise DriverFailure(f"node agent {node} closed the terminal before it opened")
        answer = json.loads(msg.data)
        if "error" in answer:
            await ws.close()
            raise from_wire(int(answer.get("status", 500)), answer["error"])
        return cls(ws, node)

    async def read(self) -> bytes:
        self._reading = True
        try:
            return await self._read()
        finally:
            self._reading = False

    async def _read(self) -> bytes:
        while not self._exit.done():
            msg = await self._ws.receive()
            if msg.type == aiohttp.WSMsgType.BINARY:
                return bytes(msg.data)
            if msg.type == aiohttp.WSMsgType.TEXT:
                control = json.loads(msg.data)
                if "exit" in control:
                    self._exit.set_result(int(control["exit"]))
                continue
            # closed without an exit: the agent (or its node) went away
            self._exit.set_result(255)
        return b""

    async def write(self, data: bytes) -> None:
        with contextlib.suppress(ConnectionError):  # ended meanwhile: read() says so
            await self._ws.send_bytes(data)

    async def resize(self, rows: int, cols: int) -> None:
        with contextlib.suppress(ConnectionError):
            await self._ws.send_str(json.dumps({"resize": [rows, cols]}))

    async def wait(self) -> int:
        # One receiver at a time on a websocket: with a reader running, its exit frame ends this.
        while not self._reading and not self._exit.done():
            await self.read()
        return await self._exit

    async def close(self) -> None:
        await self._ws.close()
        if not self._exit.done():
            self._exit.set_result(129)  # hung up: SIGHUP
