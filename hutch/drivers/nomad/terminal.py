"""Terminals of the nomad driver: a command on a pseudo-terminal of the container's own devpts.

The alloc exec websocket with ``tty=true`` (``NomadClient.exec_socket``). The plugin runs the
command exactly as an execution's (containerd-driver/handle.go ``exec``: the same envelope of
env, cwd and tag, the container's user, cgroup, limits and seccomp filter), except that runc
gives it a terminal made inside the container, whose screen comes back as stdout frames.
Input frames are what is typed, ``tty_size`` resizes, and closing stdin hangs up: the shim
closes the terminal's master, and the session gets SIGHUP.

The plugin writes one byte on stderr (which a command on a terminal never has) once the
command runs, so opening waits for a first frame: a command the plugin refuses to start (no
such working directory) fails the open with its words, as on the local driver, instead of
giving a terminal that ends at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp

from hutch.core.errors import InvalidInput
from hutch.drivers.base import PtySession, TerminalRequest
from hutch.drivers.nomad.access import SandboxAccess
from hutch.drivers.nomad.client import KILL_GRACE, STDIN_CHUNK, ExecFailed
from hutch.drivers.nomad.execs import ENVELOPE, command_envelope, recover, refused
from hutch.drivers.nomad.jobs import TASK

if TYPE_CHECKING:
    from hutch.drivers.nomad.client import NomadClient

_HANGUP_GRACE = 1.0  # seconds a hung-up session has to exit before its tree is killed
_KILLED = 128 + 9  # what wait() says when no exit ever came (the sandbox went)
_QUEUED = 64  # output frames held for a slow reader; then Nomad's stream is held back


class NomadTerminals:
    """The driver's ``open_terminal`` (NomadDriver delegates to one of these, as to NomadFiles)."""

    def __init__(self, access: SandboxAccess) -> None:
        self._access = access

    async def open_terminal(self, req: TerminalRequest) -> PtySession:
        sb = self._access.running(req.sandbox_id)
        self._access.check_not_paused(sb)
        if not req.argv:
            raise InvalidInput("command must not be empty", field="command")
        envelope = command_envelope(self._access.command_env(sb, req.env), req.cwd)
        try:
            return await NomadTerminal.start(
                self._access.client, sb.alloc_id, envelope, req.argv, rows=req.rows, cols=req.cols,
                kill=lambda: self._access.kill_tagged(sb, envelope["tag"]))
        except ExecFailed as err:
            refused(err, sb.id, gone=self._access.gone(sb.id), cwd=envelope["cwd"])
            raise


class NomadTerminal(PtySession):
    def __init__(self, client: NomadClient, alloc_id: str, tag: str, ws: aiohttp.ClientWebSocketResponse,
                 kill: Callable[[], Awaitable[None]]) -> None:
        self._client = client
        self._alloc_id = alloc_id
        self._tag = tag
        self._ws = ws
        self._kill = kill
        loop = asyncio.get_running_loop()
        self._started: asyncio.Future[None] = loop.create_future()
        self._exited: asyncio.Future[int] = loop.create_future()
        self._output: asyncio.Queue[bytes] = asyncio.Queue(_QUEUED)  # b"": the end
        self._received = {"stdout": 0, "stderr": 0}
        self._ended = False
        self._closed = False
        self._pump = asyncio.create_task(self._receive(), name=f"nomad-terminal-{tag}")

    @classmethod
    async def start(cls, client: NomadClient, alloc_id: str, envelope: dict[str, Any], argv: Sequence[str], *,
                    rows: int, cols: int, kill: Callable[[], Awaitable[None]]) -> NomadTerminal:
        """Run ``argv`` on a terminal of ``rows`` x ``cols``; returns once it runs (ExecFailed:
        the plugin did not start it)."""
        command = [ENVELOPE, json.dumps({**envelope, "ttySize": {"height": rows, "width": cols}}), *argv]
        ws = await client.exec_socket(alloc_id, TASK, command, tty=True)
        term = cls(client, alloc_id, envelope["tag"], ws, kill)
        try:
            await asyncio.shield(term._started)
        except BaseException:
            await term.close()
            raise
        return term

    async def _receive(self) -> None:
        code: int | None = None
        reason = ""
        try:
            while True:
                msg = await self._ws.receive()
                if msg.type is aiohttp.WSMsgType.TEXT:
                    if not self._started.done():
                        self._started.set_result(None)
                    frame = json.loads(msg.data)
                    part = frame.get("stdout")
                    if part and part.get("data"):
                        await self._emit("stdout", base64.b64decode(part["data"]))
                    if frame.get("exited"):
                        code = int((frame.get("result") or {}).get("exit_code", 0))
                        break
                elif msg.type is aiohttp.WSMsgType.CLOSE:
                    reason = msg.extra or ""
                    break
                elif msg.type in (aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    break
            if not self._started.done():
                self._started.set_exception(ExecFailed(reason or "the exec stream closed before the terminal ran"))
                self._started.exception()  # retrieved: start() raises it
                code = _KILLED
            elif code is None:
                # Nomad can close the stream before the exit frame (execs.py): the plugin knows.
                code = await recover(self._client, self._alloc_id, TASK, self._tag, self._received, self._emit)
        finally:
            if not self._exited.done():
                self._exited.set_result(_KILLED if code is None else code)
            if not self._closed:  # (close ends the output itself)
                await self._output.put(b"")

    async def _emit(self, stream: str, data: bytes) -> None:
        self._received[stream] += len(data)
        if stream == "stdout" and not self._closed:  # stderr: only the plugin's "started" byte
            await self._output.put(data)

    async def read(self) -> bytes:
        if self._ended or self._closed:
            return b""
        data = await self._output.get()
        self._ended = not data
        return data

    async def _send(self, frame: dict[str, Any]) -> None:
        with contextlib.suppress(ConnectionError, aiohttp.ClientError):  # the stream already ended
            await self._ws.send_str(json.dumps(frame))

    async def write(self, data: bytes) -> None:
        for start in range(0, len(data), STDIN_CHUNK):
            if self._closed:
                return
            await self._send({"stdin": {"data": base64.b64encode(data[start:start + STDIN_CHUNK]).decode()}})

    async def resize(self, rows: int, cols: int) -> None:
        if not self._closed:
            await self._send({"tty_size": {"height": rows, "width": cols}})

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        while not self._output.empty():  # a pump held by a full queue moves on (and drops the rest)
            self._output.get_nowait()
        self._output.put_nowait(b"")  # for a reader waiting
        if not self._exited.done():
            await self._send({"stdin": {"close": True}})  # the hangup
            try:
                await asyncio.wait_for(asyncio.shield(self._exited), _HANGUP_GRACE)
            except TimeoutError:
                await self._kill()  # what ignores SIGHUP goes with its whole tree
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._exited), KILL_GRACE)
        self._pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._pump
        await self._ws.close()
