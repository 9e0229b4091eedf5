"""A sandbox's exposed port, as the API's reverse proxy wants it: a (host, port) it can
connect to. The port itself is on the agent's machine (a host-only veth), so the driver
listens on this host's loopback, one listener per sandbox, and carries each connection to the
agent in a signed websocket (hutch/node/ports.py splices it to the port).

Any other port its processes listen on (``connect``, E2B's hosts) is one end of a socketpair
whose other end this driver pumps over such a websocket, opened with ``?port=N``: the agent
connects inside the sandbox's network namespace and says first whether it could."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable

import aiohttp

from hutch.core.errors import DriverFailure, from_wire
from hutch.drivers.socketpump import pumped_socket

log = logging.getLogger(__name__)

Opener = Callable[[str, "int | None"], Awaitable[aiohttp.ClientWebSocketResponse]]
OPENED_WITHIN = 30.0  # seconds for the agent's first answer (its connect inside the sandbox)


class PortTunnels:
    def __init__(self, open_tunnel: Opener) -> None:
        self._open = open_tunnel
        self._servers: dict[str, asyncio.Server] = {}
        self._lock = asyncio.Lock()
        self._pumps: set[asyncio.Task[None]] = set()

    async def target(self, sandbox_id: str) -> tuple[str, int]:
        async with self._lock:
            server = self._servers.get(sandbox_id)
            if server is None:
                server = await asyncio.start_server(lambda r, w: self._carry(sandbox_id, r, w), "127.0.0.1", 0)
                self._servers[sandbox_id] = server
        return "127.0.0.1", server.sockets[0].getsockname()[1]

    async def _carry(self, sandbox_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ws = await self._open(sandbox_id, None)
        except Exception as err:  # the proxy sees a closed connection and answers 502 itself
            log.warning("sandbox %s: no tunnel to its port: %s", sandbox_id, err)
            writer.close()
            return
        await _splice(ws, reader, writer)

    async def connect(self, sandbox_id: str, port: int) -> socket.socket:
        """A socket connected to ``port`` on the sandbox's loopback, on its agent's node
        (ConnectionRefusedError when nothing listens there)."""
        ws = await self._open(sandbox_id, port)
        try:
            await _opened(ws, sandbox_id, port)
        except BaseException:
            await ws.close()
            raise
        return await pumped_socket(lambda reader, writer: _splice(ws, reader, writer), self._pumps, ws.close)

    async def drop(self, sandbox_id: str) -> None:
        server = self._servers.pop(sandbox_id, None)
        if server is not None:
            server.close()

    async def close(self) -> None:
        for sid in list(self._servers):
            await self.drop(sid)
        for pump in list(self._pumps):
            pump.cancel()
        for pump in list(self._pumps):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await pump


async def _opened(ws: aiohttp.ClientWebSocketResponse, sandbox_id: str, port: int) -> None:
    first = await ws.receive(timeout=OPENED_WITHIN)
    if first.type != aiohttp.WSMsgType.TEXT:
        raise DriverFailure(f"sandbox {sandbox_id}: its agent did not say whether port {port} answers")
    answer = json.loads(first.data)
    if answer.get("opened") is True:
        return
    if "refused" in answer:
        code = int(answer["refused"]) or errno.ECONNREFUSED
        raise OSError(code, f"port {port} of sandbox {sandbox_id}: {answer.get('message') or os.strerror(code)}")
    if "error" in answer:
        raise from_wire(int(answer.get("status", 500)), answer["error"])
    raise DriverFailure(f"sandbox {sandbox_id}: its agent answered {answer!r} for port {port}")


async def _splice(ws: aiohttp.ClientWebSocketResponse, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:
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
