"""``GET /sandbox/{id}/terminal``: a terminal over a websocket (docs/wire.md §3c).

Query: ``command`` (repeated: the argv; none = a login shell), ``rows``, ``cols``, ``cwd``,
``term``. The terminal is opened before the upgrade, so an unknown sandbox, a bad size or
a refused key is a plain JSON error like on every other route. Then binary frames carry
bytes both ways (input as typed, output as the screen gets it); text frames carry control
messages as JSON: ``{"type": "resize", "rows": R, "cols": C}`` from the client, and at the
end ``{"type": "exit", "exitCode": N}`` from the server, which then closes. A client that
closes first hangs the terminal up (SIGHUP to the session, then its tree is killed). The
terminal lives as long as the key that opened it (and the Web App session it was opened from):
once that key is revoked or expires (or the session signed out) the
server sends ``{"type": "error", "message": …}`` naming why, closes (1008) and kills the
terminal's tree, as it would at a hang-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import cast

from aiohttp import WSCloseCode, WSMsgType, web

from hutch.api.access import needs
from hutch.api.http import parse_json, q_int
from hutch.api.keys import ENGINE, STILL_AUTHORIZED, TENANTS
from hutch.api.refusals import ENDS_WHEN_REFUSED
from hutch.core.errors import InvalidInput, Unauthorized
from hutch.core.tenancy import Access
from hutch.service.terminals import ActiveTerminal, TerminalOptions, check_term

routes = web.RouteTableDef()

_DRAIN_IDLE = 0.2  # after the command exits: output still coming in this long is kept
_MAX_FRAME = 1 << 20


@routes.get("/sandbox/{sandbox_id}/terminal")
@needs(Access.WRITE)  # a GET, but it runs commands
async def terminal(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    sandbox_id = request.match_info["sandbox_id"]
    # Every refusal before the upgrade, in this order, so that the same request without the
    # upgrade (what a client does to learn why its handshake failed) gets the same answer.
    await engine.reads.require(sandbox_id)  # another organization's sandbox is a 404 before anything else
    opts = TerminalOptions(
        command=tuple(request.query.getall("command", [])),
        rows=q_int(request, "rows", 24, lo=1, hi=1000),
        cols=q_int(request, "cols", 80, lo=1, hi=1000),
        cwd=request.query.get("cwd") or None,
        term=request.query.get("term") or "xterm-256color",
    )
    check_term(opts.term)
    engine.terminals.check_supported()
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=_MAX_FRAME)
    if not ws.can_prepare(request).ok:
        raise InvalidInput("this endpoint is a websocket: connect with an Upgrade: websocket request",
                           field="Upgrade")
    tenants = request.app[TENANTS]
    # Unauthorized once the key that opens it is revoked or expired, or the Web App session it
    # was opened from is signed out.
    check = request[STILL_AUTHORIZED]
    request[ENDS_WHEN_REFUSED] = True  # relay ends it, telling why (not api/refusals.py's reset)
    active = await engine.terminals.open(sandbox_id, opts)
    try:
        await ws.prepare(request)
        await relay(ws, active, check, tenants.until_refused(check))
    finally:
        await active.close()
    return ws


async def relay(ws: web.WebSocketResponse, active: ActiveTerminal, check: Callable[[], object],
                refused: Awaitable[str]) -> None:
    """Carry bytes until the command exits (then tell its exit code), the client leaves or
    the key that opened it may no longer: ``check`` (raising ``Unauthorized``) is asked
    before every frame typed reaches the terminal, and ``refused`` ends the terminal the
    moment the key is revoked or expires, typed into or not."""
    output = asyncio.ensure_future(_pump_output(ws, active))
    inputs = asyncio.ensure_future(_pump_input(ws, active, check))
    exited = asyncio.ensure_future(active.wait())
    ended = asyncio.ensure_future(refused)
    try:
        await asyncio.wait({exited, inputs, ended}, return_when=asyncio.FIRST_COMPLETED)
        reason = _refusal(ended, inputs)
        if reason is not None and not exited.done():
            inputs.cancel()
            if not ws.closed:
                await ws.send_str(json.dumps({"type": "error", "message": f"terminal closed: {reason}"}))
                await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"key no longer valid")
        elif exited.done():
            # Output the command wrote just before it exited may still be on its way.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(output), _DRAIN_IDLE * 5)
            if not ws.closed:
                await ws.send_str(json.dumps({"type": "exit", "exitCode": exited.result()}))
                await ws.close()
    finally:
        for task in (output, inputs, exited, ended):
            task.cancel()
        for task in (output, inputs, exited, ended):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _pump_output(ws: web.WebSocketResponse, active: ActiveTerminal) -> None:
    while data := await active.read():
        if ws.closed:
            return
        await ws.send_bytes(data)


def _refusal(ended: asyncio.Future[str], inputs: asyncio.Future[None]) -> str | None:
    """Why the key may no longer use the terminal, if it may not."""
    if ended.done() and not ended.cancelled():
        return ended.result()
    if inputs.done() and not inputs.cancelled() and isinstance(inputs.exception(), Unauthorized):
        return cast(Unauthorized, inputs.exception()).message
    return None


async def _pump_input(ws: web.WebSocketResponse, active: ActiveTerminal, check: Callable[[], object]) -> None:
    async for msg in ws:
        if msg.type is WSMsgType.BINARY:
            check()  # Unauthorized: not one byte typed after the key ended reaches the terminal
            await active.write(msg.data)
        elif msg.type is WSMsgType.TEXT:
            await _control(ws, active, msg.data)
        else:
            return


async def _control(ws: web.WebSocketResponse, active: ActiveTerminal, text: str) -> None:
    try:
        message = parse_json(text, "message")
        if not isinstance(message, dict) or message.get("type") != "resize":
            raise ValueError(f"unknown control message {text[:100]!r} (expected {{\"type\": \"resize\", ...}})")
        rows, cols = message.get("rows"), message.get("cols")
        if type(rows) is not int or type(cols) is not int:  # true is an int to Python, not a size
            raise ValueError("resize: rows and cols must be integers")
        await active.resize(rows, cols)
    except (ValueError, InvalidInput) as err:
        await ws.send_str(json.dumps({"type": "error", "message": str(err)}))
