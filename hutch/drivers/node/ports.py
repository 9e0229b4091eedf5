"""A sandbox's exposed port, as the API's reverse proxy wants it: a (host, port) it can
connect to. The port itself is on the agent's machine (a host-only veth), so the driver
listens on this host's loopback, one listener per sandbox, and carries each connection to the
agent in a signed websocket (hutch/node/ports.py splices it to the port)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import aiohttp

log = logging.getLogger(__name__)

Opener = Callable[[str], Awaitable[aiohttp.ClientWebSocketResponse]]


class PortTunnels:
    def __init__(self, open_tunnel: Opener) -> None:
        self._open = open_tunnel
        self._servers: dict[str, asyncio.Server] = {}
        self._lock = asyncio.Lock()

    async def target(self, sandbox_id: str) -> tuple[str, int]:
        async with self._lock:
            server = self._servers.get(sandbox_id)
            if server is None:
                server = await asyncio.start_server(lambda r, w: self._carry(sandbox_id, r, w), "127.0.0.1", 0)
                self._servers[sandbox_id] = server
        return "127.0.0.1", server.sockets[0].getsockname()[1]

    async def _carry(self, sandbox_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ws = await self._open(sandbox_id)
        except Exception as err:  # the proxy sees a closed connection and answers 502 itself
            log.warning("sandbox %s: no tunnel to its port: %s", sandbox_id, err)
            writer.close()
            return

        async def up() -> None:
            while data := await reader.read(64 << 10):
                await ws.send_bytes(data)
            await ws.close()

        pump = asyncio.ensure_future(up())
        try:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    writer.write(msg.data)
                    await writer.drain()
        except ConnectionError:
            pass
        finally:
            pump.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await pump
            await ws.close()
            writer.close()

    async def drop(self, sandbox_id: str) -> None:
        server = self._servers.pop(sandbox_id, None)
        if server is not None:
            server.close()

    async def close(self) -> None:
        for sid in list(self._servers):
            await self.drop(sid)
