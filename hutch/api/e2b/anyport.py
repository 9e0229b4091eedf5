"""Any port a sandbox's process listens on, at its own host ``{port}-{id}.{domain}`` (E2B's
``get_host``): the request relayed over a connection the driver makes into the sandbox
(``Ports.connect``: for the local driver, a socket made in the sandbox's network namespace, so
a sandbox without network gains none). A port the sandbox declared at create goes the way
hutch's proxy reaches it, so every driver serves that one.

Nothing of the client's credentials reaches the sandbox (api/e2b/ports.py strips them), nor
does a cookie it sets come back: the host is the sandbox's own, but a browser would keep a
cookie for the whole domain if the sandbox asked for one."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.client_proto import ResponseHandler

from hutch.api.routes.proxy import relay_http, relay_websocket
from hutch.core.models import SandboxState
from hutch.service.engine import Engine

Answer = Callable[[Iterable[tuple[str, str]]], list[tuple[str, str]]]


class _SocketConnector(aiohttp.BaseConnector):
    """One request's connection: the socket ``make`` gives, already connected."""

    def __init__(self, make: Callable[[], Awaitable[socket.socket]]) -> None:
        super().__init__(force_close=True, limit=1)
        self._make = make

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> ResponseHandler:
        try:
            sock = await self._make()
        except OSError as err:  # nothing listens (refused), or gone: relay_http's "nothing answers"
            raise aiohttp.ClientConnectionError(str(err)) from err
        _, proto = await self._loop.create_connection(self._factory, sock=sock)
        return proto


async def relay(request: web.Request, engine: Engine, sb: SandboxState, port: int, headers: dict[str, str],
                answer: Answer) -> web.StreamResponse:
    sandbox_id = sb.sandbox_id
    query = f"?{request.query_string}" if request.query_string else ""
    unreachable = f"sandbox {sandbox_id}: nothing answers on port {port}"
    if sb.spec.network.port == port:
        host, target = await engine.ports.target(sandbox_id)
        connector: aiohttp.BaseConnector = aiohttp.TCPConnector(force_close=True, limit=1)
        url = f"http://{host}:{target}{request.path}{query}"
    else:
        connector = _SocketConnector(lambda: engine.ports.connect(sandbox_id, port))
        url = f"http://127.0.0.1:{port}{request.path}{query}"
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                                     timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)) as session:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            # The client's handshake headers are its own connection's; ws_connect makes the sandbox's.
            own = {k: v for k, v in headers.items() if not k.lower().startswith("sec-websocket-")}
            return await relay_websocket(request, session, "ws" + url.removeprefix("http"), own)
        return await relay_http(request, session, url, headers, unreachable=unreachable,
                                malformed=f"sandbox {sandbox_id}: port {port}'s answer", answer=answer)
