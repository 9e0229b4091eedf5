"""Terminals: an interactive shell (or any command) on a pseudo-terminal in a sandbox.

For programs that drive a terminal (an agent using a shell, a test typing into vim) and for
``hutch ssh``::

    async with await client.terminal(sandbox_id, rows=40, cols=120) as term:
        await term.write("ls -la\\n")
        print((await term.read()).decode())
        await term.write("exit 3\\n")
        assert await term.wait() == 3

Over the server's websocket (``GET /sandbox/{id}/terminal``, docs/wire.md §3c). ``read`` gives
what the screen gets (the terminal's echo included), ``b""`` once the command has ended.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence

import aiohttp

from hutch._connection import Connected, Connection, segment
from hutch.errors import ConnectionFailed, ServerError, error_from_response

__all__ = ["Terminal", "open_terminal"]


class Terminal:
    """An open terminal. Use as ``async with`` (closing hangs it up) or call :meth:`close`."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, sandbox_id: str) -> None:
        self.sandbox_id = sandbox_id
        self._ws = ws
        #: The command's exit code once it has ended (128+n when killed by signal n).
        self.exit_code: int | None = None
        self._ended = asyncio.Event()

    async def __aenter__(self) -> Terminal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def read(self) -> bytes:
        """The next output; ``b""`` once the command has ended (then :attr:`exit_code` is set)."""
        while not self._ended.is_set():
            msg = await self._ws.receive()
            if msg.type is aiohttp.WSMsgType.BINARY:
                return bytes(msg.data)
            if msg.type is aiohttp.WSMsgType.TEXT:
                body = json.loads(msg.data)
                if body.get("type") == "exit":
                    self.exit_code = int(body["exitCode"])
                    self._ended.set()
                elif body.get("type") == "error":
                    raise ServerError(f"terminal: {body.get('message')}", code="BAD_REQUEST", status=400)
            else:  # closed (by the server after the exit, or the connection dropped)
                self._ended.set()
        return b""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while data := await self.read():
            yield data

    async def write(self, data: bytes | str) -> None:
        """Input, as typed: ``"\\x03"`` is Ctrl-C, ``"\\x04"`` Ctrl-D."""
        await self._ws.send_bytes(data.encode() if isinstance(data, str) else data)

    async def resize(self, rows: int, cols: int) -> None:
        await self._ws.send_str(json.dumps({"type": "resize", "rows": rows, "cols": cols}))

    async def wait(self) -> int:
        """Read (and drop) output until the command ends; its exit code."""
        while await self.read():
            pass
        if self.exit_code is None:
            raise ConnectionFailed(f"the terminal of {self.sandbox_id} closed before its command ended")
        return self.exit_code

    async def close(self) -> None:
        """Hang up (the session gets SIGHUP). Idempotent."""
        self._ended.set()
        await self._ws.close()


async def open_terminal(client: Connected | Connection, sandbox_id: str, command: Sequence[str] | None = None, *,
                        rows: int = 24, cols: int = 80, cwd: str | None = None,
                        term: str | None = None) -> Terminal:
    """Start ``command`` (default: a login shell) on a new terminal of the sandbox (``client``:
    a :class:`hutch.client.SandboxClient`, or the connection under one)."""
    conn = client if isinstance(client, Connection) else client.connection
    params: list[tuple[str, str]] = [("rows", str(rows)), ("cols", str(cols))]
    params += [("command", part) for part in command or ()]
    if cwd:
        params.append(("cwd", cwd))
    if term:
        params.append(("term", term))
    if conn.org_id is not None:  # by hand: ``command`` repeats, which Connection.params cannot say
        params.append(("orgId", conn.org_id))
    path = f"/sandbox/{segment(sandbox_id)}/terminal"
    try:
        ws = await (await conn.session()).ws_connect(conn.url + path, params=params, headers=conn.auth_headers(),
                                                     heartbeat=30.0, max_msg_size=1 << 20)
    except aiohttp.WSServerHandshakeError as err:
        # The refusal's words are in a JSON body the handshake does not keep: the same
        # request without the upgrade answers them (the route checks before it upgrades).
        await _explain(conn, path, params, err, sandbox_id)
        raise  # not reached: _explain raises
    except (aiohttp.ClientError, OSError) as err:
        raise ConnectionFailed(f"cannot reach hutch server at {conn.url}: {err}") from err
    return Terminal(ws, sandbox_id)


async def _explain(conn: Connection, path: str, params: list[tuple[str, str]],
                   err: aiohttp.WSServerHandshakeError, sandbox_id: str) -> None:
    try:
        async with (await conn.session()).get(conn.url + path, params=params, headers=conn.auth_headers()) as resp:
            body = await resp.json(content_type=None)
            status = resp.status
    except (aiohttp.ClientError, OSError, ValueError):
        body, status = None, err.status
    if status != err.status or not isinstance(body, dict):  # it did not fail the same way
        body = {"success": False, "message": f"terminal refused: HTTP {err.status} {err.message}"}
        status = err.status
    raise error_from_response(status, body, sandbox_id=sandbox_id)
