"""Any port a nomad sandbox's processes listen on, for the server alone (E2B's
``{port}-{id}.{domain}`` hosts), not only the one it declared: the plugin's connect verb
(containerd-driver/connect.go) connects to the port on the sandbox's loopback, inside its
network namespace, and splices that connection to an alloc exec's stdin and stdout. The
server's end is one side of a socketpair whose other side is pumped over that exec (as the
node driver pumps its agent's websocket, drivers/node/ports.py). The sandbox gains no network
by it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import json
import socket

import aiohttp

from hutch.core.errors import DriverFailure
from hutch.drivers.nomad.client import NomadClient
from hutch.drivers.nomad.execs import ENVELOPE
from hutch.drivers.socketpump import pumped_socket

OPENED_WITHIN = 30.0  # seconds for the plugin's first answer (its connect inside the sandbox)
EXIT_REFUSED = 4  # the connect verb: nothing listens there (connect.go)
CHUNK = 64 << 10


class PortConnections:
    def __init__(self, client: NomadClient) -> None:
        self._client = client
        self._pumps: set[asyncio.Task[None]] = set()

    async def connect(self, alloc_id: str, task: str, sandbox_id: str, port: int) -> socket.socket:
        """A socket connected to ``port`` on the sandbox's loopback (ConnectionRefusedError
        when nothing listens there)."""
        ws = await self._client.exec_socket(alloc_id, task, [ENVELOPE, json.dumps({"connect": port})])
        try:
            early = await _opened(ws, sandbox_id, port)
        except BaseException:
            await ws.close()
            raise
        return await pumped_socket(lambda reader, writer: _splice(ws, reader, writer), self._pumps, ws.close, early)

    async def close(self) -> None:
        for pump in list(self._pumps):
            pump.cancel()
        for pump in list(self._pumps):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await pump


def _frame(msg: aiohttp.WSMessage) -> dict:
    if msg.type != aiohttp.WSMsgType.TEXT:
        raise ConnectionResetError(errno.ECONNRESET, f"the exec stream ended ({msg.type.name})")
    frame: dict = json.loads(msg.data)
    return frame


def _stdout(frame: dict) -> bytes:
    part = frame.get("stdout") or {}
    return base64.b64decode(part["data"]) if part.get("data") else b""


async def _opened(ws: aiohttp.ClientWebSocketResponse, sandbox_id: str, port: int) -> bytes:
    """Wait for the plugin's first line; what came after it (the sandbox's first bytes)."""
    seen = b""
    async with asyncio.timeout(OPENED_WITHIN):
        while True:
            frame = _frame(await ws.receive())
            seen += _stdout(frame)
            line, newline, rest = seen.partition(b"\n")
            if newline and line == b'{"opened":true}':
                return rest
            if frame.get("exited"):
                code = int((frame.get("result") or {}).get("exit_code", 0))
                said = seen.decode(errors="replace").strip()[:300]
                if code == EXIT_REFUSED:
                    raise ConnectionRefusedError(errno.ECONNREFUSED, f"port {port} of sandbox {sandbox_id}: {said}")
                raise DriverFailure(f"sandbox {sandbox_id}: connecting to its port {port} failed (exit {code}): {said}; "
                                    "its client's hutch-containerd plugin may predate the connect verb")


async def _splice(ws: aiohttp.ClientWebSocketResponse, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:
    async def up() -> None:
        while data := await reader.read(CHUNK):
            await ws.send_str(json.dumps({"stdin": {"data": base64.b64encode(data).decode()}}))
        await ws.send_str(json.dumps({"stdin": {"close": True}}))  # the sandbox's server reads end of file

    pump = asyncio.ensure_future(up())
    try:
        while True:
            frame = _frame(await ws.receive())
            if data := _stdout(frame):
                writer.write(data)
                await writer.drain()
            if frame.get("exited"):
                break
    except (ConnectionError, ValueError):
        pass
    finally:
        pump.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await pump
        await ws.close()
        writer.close()
