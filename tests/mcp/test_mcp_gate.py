"""The session gate of ``hutch mcp --http`` (hutch/mcp_http.py KeyGate) on its own: the MCP
SDK's app stood in for by one that opens a session per request, the hutch server's key check
by a fixed organization, so that requests can be made to overlap exactly."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from hutch import mcp_http


class _Opening:
    """An ASGI app that opens a session per request, once ``go`` is set (requests in flight)."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.go = asyncio.Event()
        self.ids = (f"s{n}" for n in itertools.count())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.go.wait()
        sid = next(self.ids)
        self.live.add(sid)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"mcp-session-id", sid.encode())]})
        await send({"type": "http.response.body", "body": b"{}"})


async def _open(gate: mcp_http.KeyGate) -> int:
    scope = {"type": "http", "method": "POST", "path": "/mcp",
             "headers": [(b"authorization", b"Bearer k1"), (b"mcp-protocol-version", b"2025-11-25")]}
    statuses: list[int] = []

    async def receive() -> Any:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await gate(scope, receive, send)
    return statuses[0]


async def test_sessions_opened_together_all_count_against_the_limit() -> None:
    """Opening requests that overlap each took the organization's set of sessions as it was
    when they began, added their own and put it back: the last one to end put back a set
    without the others', so the next requests found room again. Opened in waves, one key
    held any number of sessions past --max-org-sessions."""
    app = _Opening()
    gate = mcp_http.KeyGate(app, None, lambda: app.live, org_sessions=4)

    async def org_x(key: str) -> str:
        return "org_x"

    gate._check = org_x  # type: ignore[method-assign]
    for _ in range(3):  # waves of opening requests in flight at once, each released together
        app.go.clear()
        wave = [asyncio.create_task(_open(gate)) for _ in range(4)]
        await asyncio.sleep(0.05)
        app.go.set()
        await asyncio.gather(*wave)
    assert len(app.live) == 4, f"{len(app.live)} sessions open, the limit 4"


class _Recording:
    """An ASGI app that records every connection it is handed and accepts a websocket."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.seen.append(scope["type"])
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.accept"})


async def _websocket(gate: mcp_http.KeyGate, headers: list[tuple[bytes, bytes]],
                     extensions: dict[str, Any]) -> list[Any]:
    scope = {"type": "websocket", "path": "/mcp", "headers": headers, "extensions": extensions}
    sent: list[Any] = []

    async def receive() -> Any:
        return {"type": "websocket.connect"}

    async def send(message: Any) -> None:
        sent.append(message)

    await gate(scope, receive, send)
    return sent


async def test_a_websocket_is_refused_before_the_app_sees_it() -> None:
    """Before: the gate let every connection that was not an HTTP request through to the MCP
    app as it came, with no key asked (meant for the lifespan); a websocket reached it keyless.
    Now a websocket is refused with or without a key (no route serves one): a 400 naming what
    is served, or, where the server cannot answer a websocket with HTTP, a close (its 403)."""
    app = _Recording()
    gate = mcp_http.KeyGate(app, None, lambda: set())
    for headers in ([], [(b"authorization", b"Bearer k1")]):
        sent = await _websocket(gate, headers, {"websocket.http.response": {}})
        assert [m["type"] for m in sent] == ["websocket.http.response.start", "websocket.http.response.body"], sent
        assert sent[0]["status"] == 400 and b"streamable HTTP" in sent[1]["body"], sent
        sent = await _websocket(gate, headers, {})
        assert [m["type"] for m in sent] == ["websocket.close"] and sent[0]["code"] == 1008, sent
    assert app.seen == []


async def test_the_lifespan_reaches_the_app_and_an_unknown_connection_is_refused() -> None:
    app = _Recording()
    gate = mcp_http.KeyGate(app, None, lambda: set())

    async def nothing(*_: Any) -> Any:
        return {"type": "lifespan.startup"}

    await gate({"type": "lifespan"}, nothing, nothing)
    with pytest.raises(ValueError, match="'telepathy'"):
        await gate({"type": "telepathy"}, nothing, nothing)
    assert app.seen == ["lifespan"]
