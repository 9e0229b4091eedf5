"""``hutch mcp --http HOST:PORT``: the MCP tools over streamable HTTP (hutch/mcp_server.py).

Every request carries ``Authorization: Bearer <hutch API key>``; the key is checked with the
hutch server on each request (a revoked key stops working at once) and anything else is
answered 401 before the MCP SDK sees it; a websocket is refused (400), key or not. The SDK binds an MCP session to the key that opened
it, so a session id that leaks is useless with another key (it answers 404). The SDK holds at
most 10,000 sessions for everyone; one organization holds at most ``--max-org-sessions`` of
them (100), so that one opening sessions as fast as it can does not leave the others none.

Sessions are what own sandboxes here, so this endpoint speaks the session-bearing (handshake)
protocol versions. A request at a sessionless version (2026-07-28: one self-contained request
per POST, nothing that ends) is answered with UNSUPPORTED_PROTOCOL_VERSION naming the handshake
versions, and clients fall back to the initialize handshake (the MCP SDK's ``auto`` mode does).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Container
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Receive, Scope, Send

from hutch import mcp_listener
from hutch.client import SandboxClient
from hutch.core.waiting import HEAD_SECONDS, default_waiting
from hutch.edge import out_of_files
from hutch.edge.out_of_files import open_file_limit
from hutch.errors import HutchError, Unauthorized
from hutch.mcp_server import McpSessions, bearer_key, build_server

log = logging.getLogger(__name__)

PATH = "/mcp"
RECHECK_SECONDS = 5.0  # a key found valid (any request of its) is not asked about again sooner
ORG_SESSIONS = 100  # the sessions one organization may hold open at once (--max-org-sessions)


class KeyGate:
    """ASGI middleware: no key, or a key the hutch server refuses, is a 401 with a reason."""

    def __init__(self, app: ASGIApp, hutch_url: str | None, live: Callable[[], Container[str]],
                 org_sessions: int = ORG_SESSIONS, end: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.app, self.hutch_url, self.live, self.org_sessions = app, hutch_url, live, org_sessions
        self.end = end  # ends an open session (by id), as its idle timeout would
        self._held: dict[str, set[str]] = {}  # organization -> the ids of the sessions it opened
        # session id -> the key that opened it (the SDK holds it too, as the session's owner)
        self._keys: dict[str, str] = {}
        self._valid: dict[str, float] = {}  # key -> when the hutch server last took it
        self._opening: dict[str, int] = {}  # organization -> its opening requests in flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # the server's start and stop: no client's connection
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await _refuse_other(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        key = bearer_key(headers.get("authorization"))
        if key is None:
            await _refuse(send, 401, "an Authorization: Bearer <hutch API key> header is required")
            return
        tenant = await self._check(key)
        if isinstance(tenant, tuple):
            await _refuse(send, *tenant)
            return
        version = headers.get("mcp-protocol-version")
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            data = {"supported": list(HANDSHAKE_PROTOCOL_VERSIONS), "requested": version}
            await _refuse(send, 400, f"protocol version {version} has no sessions, and hutch's MCP sessions own "
                          "the sandboxes they create: use the initialize handshake",
                          code=types.UNSUPPORTED_PROTOCOL_VERSION, data=data)
            return
        # The SDK binds each MCP session to the principal of the request that opened it.
        self._valid[key] = time.monotonic()
        principal = hashlib.sha256(key.encode()).hexdigest()
        scope["user"] = AuthenticatedUser(AccessToken(token=key, client_id=principal, scopes=[]))
        if scope["method"] == "POST" and "mcp-session-id" not in headers:  # what may open a session
            await self._open(tenant or principal, key, scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _open(self, tenant: str, key: str, scope: Scope, receive: Receive, send: Send) -> None:
        """A request that may open a session, if its organization has room for one more."""
        held = self._still_open(tenant)
        if len(held) + self._opening.get(tenant, 0) >= self.org_sessions:
            await self._end_revoked(held, key)
            held = self._still_open(tenant)
        if len(held) + self._opening.get(tenant, 0) >= self.org_sessions:
            await _refuse(send, 429, f"your organization has {self.org_sessions} MCP sessions open, the most this "
                          "server holds for one: end one (the client's DELETE) or let one idle out (30 minutes)")
            return
        opened: list[str] = []

        async def watch(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                opened.extend(v.decode("latin-1") for k, v in message.get("headers", ()) if k.lower() == b"mcp-session-id")
            await send(message)

        self._opening[tenant] = self._opening.get(tenant, 0) + 1
        try:
            await self.app(scope, receive, watch)
        finally:
            self._opening[tenant] -= 1
            if not self._opening[tenant]:
                del self._opening[tenant]
            # Added to the organization's set as it is now: the one read before this request
            # was served may have been replaced meanwhile (_still_open, for any request), and
            # put back, it dropped the sessions of the requests that overlapped this one.
            if opened:
                self._held.setdefault(tenant, set()).update(opened)
                self._keys.update(dict.fromkeys(opened, key))

    def _still_open(self, tenant: str) -> set[str]:
        """The tenant's sessions still open. The SDK ends sessions (a DELETE, an idle timeout)
        without telling the gate, so every organization's ended ones are forgotten here."""
        live = self.live()
        for org in list(self._held):
            self._held[org] = {sid for sid in self._held[org] if sid in live}
            if not self._held[org]:
                del self._held[org]
        for sid in [sid for sid in self._keys if sid not in live]:
            del self._keys[sid]
        for key in set(self._valid) - set(self._keys.values()):  # the keys of open sessions
            del self._valid[key]
        return self._held.get(tenant, set())

    async def _end_revoked(self, held: set[str], asking: str) -> None:
        """End the sessions whose key the hutch server now refuses (revoked, expired): every
        request of theirs is a 401, so no DELETE ends them, and they held their organization's
        room until they idled out (30 minutes). Asked only with the organization at its limit,
        about each key holding its sessions that the server has not taken in RECHECK_SECONDS:
        each check is a request with that key, spending its rate, and one member opening
        sessions at the limit as fast as it can must not spend the other members' rates."""
        if self.end is None:
            return
        now = time.monotonic()
        keys = {k for sid in held if (k := self._keys.get(sid)) and (k not in self._valid or
                                                                      now - self._valid[k] >= RECHECK_SECONDS)}
        checked = await asyncio.gather(*(self._check(k) for k in keys))
        refused = {k for k, found in zip(keys, checked, strict=True) if isinstance(found, tuple) and found[0] == 401}
        self._valid.update((k, now) for k in keys - refused)
        for sid in [sid for sid in held if self._keys.get(sid) in refused]:
            await self.end(sid)

    async def _check(self, key: str) -> str | tuple[int, str] | None:
        """When the hutch server takes the key: the key's organization (None for an operator's
        key, which sees several); else the HTTP status to answer and why."""
        try:
            async with SandboxClient(self.hutch_url, key) as client:
                orgs = await client.tenancy.list_orgs()  # any key may: it answers the key's own organization
        except Unauthorized as err:
            return 401, f"the hutch server refused this API key: {err.message}"
        except HutchError as err:  # the key's rate limit (429) is the client's to hear; else the server's
            status = err.status if err.status is not None and 400 <= err.status < 500 else 502
            return status, f"the hutch server could not check the API key: {err.message}"
        return orgs[0].id if len(orgs) == 1 else None


async def _refuse_other(scope: Scope, receive: Receive, send: Send) -> None:
    """A connection that is no HTTP request, refused before the app sees it, key or not: no route
    serves one, and passed on it reached the app with no key asked (a websocket did)."""
    if scope["type"] != "websocket":  # what ASGI asks of an app handed a kind it does not know
        raise ValueError(f"hutch mcp --http: an ASGI connection of type {scope['type']!r} is not served")
    await receive()  # websocket.connect, which the refusal answers
    message = f"websocket connections are not served: MCP is at {PATH} over streamable HTTP"
    if "websocket.http.response" in scope.get("extensions", {}):
        await _refuse(send, 400, message, kind="websocket.http")
    else:  # a server that cannot answer a handshake with HTTP answers a close before accept with 403
        await send({"type": "websocket.close", "code": 1008, "reason": message})


async def _refuse(send: Send, status: int, message: str, *, code: int = types.INVALID_REQUEST,
                  data: Any = None, kind: str = "http") -> None:
    error: dict[str, Any] = {"code": code, "message": message, **({"data": data} if data is not None else {})}
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="hutch"'))
    await send({"type": f"{kind}.response.start", "status": status, "headers": headers})
    await send({"type": f"{kind}.response.body", "body": body})


def app(hutch_url: str | None, host: str, org_sessions: int = ORG_SESSIONS) -> ASGIApp:
    server = build_server(McpSessions(hutch_url, per_connection=True))
    # host: the SDK turns on its DNS-rebinding guard (allowed Host headers) for a loopback bind.
    served = server.streamable_http_app(streamable_http_path=PATH, host=host)
    manager = server.session_manager

    async def end(session_id: str) -> None:  # as the SDK ends an idle one (its key refused: its sandboxes stay, logged)
        transport = manager._server_instances.get(session_id)
        if transport is not None:
            await manager._discard_session(session_id, transport)

    # The SDK's table of open sessions (by id) is the one record of which have ended.
    return KeyGate(served, hutch_url, lambda: manager._server_instances, org_sessions, end)


def serve_http(hutch_url: str | None, host: str, port: int, org_sessions: int = ORG_SESSIONS, *,
               head_seconds: float = HEAD_SECONDS, most_waiting: int | None = None) -> None:
    """``head_seconds``, ``most_waiting``: each request head's deadline, and the bound on the
    connections waiting for one (None: a share of the open-file limit): mcp_listener.py."""
    http = mcp_listener.protocol(head_seconds, most_waiting or default_waiting(open_file_limit()))
    config = uvicorn.Config(app(hutch_url, host, org_sessions), host=host, port=port, log_level="warning",
                            lifespan="on", http=http, backlog=mcp_listener.BACKLOG)
    server = uvicorn.Server(config)
    shown = f"[{host}]" if ":" in host else host
    sys.stderr.write(f"hutch mcp: serving MCP on http://{shown}:{port}{PATH} for the hutch server at "
                     f"{hutch_url}\n")
    sys.stderr.flush()

    async def run() -> None:
        # Out of descriptors, accept() fails: shed waiting connections, log it once in a while.
        out_of_files.install(asyncio.get_running_loop(), http.waiting.shed, log)
        await server.serve()

    asyncio.run(run())
