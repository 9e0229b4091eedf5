"""The code interpreter's port on E2B's wire. ``e2b-code-interpreter`` reaches port 49999 at
``E2B_SANDBOX_URL`` (the E2B listener) with ``E2b-Sandbox-Id`` and ``E2b-Sandbox-Port: 49999``
and the sandbox's envd token (``X-Access-Token``) and the ``trafficAccessToken`` the create
answered (``E2B-Traffic-Access-Token``; some calls send that one only): either opens the port
(api/e2b/public.py). Every token sent must be that sandbox's, so another organization's key
or token runs nothing. The relay is hutch's port proxy
(api/routes/proxy.py): bodies stream both ways, the request is the sandbox's activity.

What reaches the sandbox carries no hutch credential: the envd token is a key of hutch's (it
opens envd), so it is replaced by the interpreter's own token, made at create, kept in the
sandbox and in this server's memory (read back from the sandbox after a restart)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Iterable

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from hutch.api.e2b import anyport, public
from hutch.api.e2b.access import SANDBOX_HEADER
from hutch.api.keys import ENGINE
from hutch.api.routes.proxy import HOP, relay_http
from hutch.core.errors import DriverFailure, InvalidInput, NotFound, SandboxNotFound
from hutch.core.events import acting
from hutch.service.engine import Engine

RUNTIME = "code-interpreter"
PORT = 49999
PORT_HEADER = "E2b-Sandbox-Port"
TRAFFIC_HEADER = public.TRAFFIC_HEADER
TOKEN_FILE = "/home/agentuity/.hutch-interpreter-token"
SERVER = ("env", f"HUTCH_INTERPRETER_TOKEN_FILE={TOKEN_FILE}", "hutch-interpreter")
# The first kernel's imports on a busy 2-core host took up to 20 s (hutch/_interpreter.py).
START_SECONDS = 120.0
TOKEN_BYTES = 256  # secrets.token_urlsafe(32) is 43
_ENVD_PORT = "49983"
_DROPPED = {"x-access-token", public.TRAFFIC_HEADER.lower(), "x-api-key", SANDBOX_HEADER.lower(), PORT_HEADER.lower(),
            "authorization", "cookie"}
_UNSET = {"set-cookie", "set-cookie2"}

SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("e2b_port_session", aiohttp.ClientSession)
TOKENS: web.AppKey[dict[str, str]] = web.AppKey("e2b_interpreter_tokens", dict)


async def session_ctx(app: web.Application) -> AsyncIterator[None]:
    app[SESSION] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                         auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())
    try:
        yield
    finally:
        await app[SESSION].close()


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def start_interpreter(app: web.Application, sandbox_id: str) -> None:
    """``hutch-interpreter`` started as a job with a token of its own; returns once it answers."""
    engine = app[ENGINE]
    token = secrets.token_urlsafe(32)
    await engine.files.write(sandbox_id, TOKEN_FILE, _one(token.encode()), mode=0o600)
    app[TOKENS][sandbox_id] = token
    job = await engine.executions.start_job(sandbox_id, SERVER)
    deadline = time.monotonic() + START_SECONDS
    while not await _answers(app, engine, sandbox_id):
        state = await engine.reads.get_execution(job.execution_id)
        if state.status.is_final:
            raise DriverFailure(f"sandbox {sandbox_id}: hutch-interpreter ended ({state.status.value}) before it answered")
        if time.monotonic() > deadline:
            raise DriverFailure(f"sandbox {sandbox_id}: hutch-interpreter did not answer within {START_SECONDS:.0f}s")
        await asyncio.sleep(0.25)


async def _answers(app: web.Application, engine: Engine, sandbox_id: str) -> bool:
    host, port = await engine.ports.target(sandbox_id)
    try:
        async with app[SESSION].get(f"http://{host}:{port}/health") as resp:
            return resp.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False


async def _token(app: web.Application, sandbox_id: str) -> str:
    known = app[TOKENS].get(sandbox_id)
    if known is None:
        # The file is in the sandbox, its code's to rewrite: read no more than a token's length
        # (a sparse 100 GiB file costs it nothing); what is not one of ours the interpreter refuses.
        raw = b""
        chunks = app[ENGINE].files.read(sandbox_id, TOKEN_FILE)
        try:
            async for chunk in chunks:
                raw += chunk
                if len(raw) > TOKEN_BYTES:
                    return ""
        except (NotFound, InvalidInput):
            return ""  # not started (yet), or not a file: the interpreter refuses; read again on the next call
        finally:
            close = getattr(chunks, "aclose", None)  # the read in the sandbox ends now, not at collection
            if close is not None:
                await close()
        try:
            known = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            return ""
        app[TOKENS][sandbox_id] = known
    return known


def answer_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The sandbox's answer headers as the client gets them: no cookie. What answers on the
    port is the sandbox's to choose (its code may replace the interpreter), and this listener
    shares its host with hutch's API, whose cookies a ``Set-Cookie`` here would set or shadow
    (cookies do not keep to a port); E2B's clients send tokens, not cookies."""
    return [(name, value) for name, value in headers if name.lower() not in _UNSET]


def forget(app: web.Application, sandbox_id: str) -> None:
    app[TOKENS].pop(sandbox_id, None)


@web.middleware
async def port_relay(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request for a sandbox's port (``E2b-Sandbox-Port``, not envd's) relayed to it: the code
    interpreter's at ``E2B_SANDBOX_URL`` or its host; any other only at its own host
    (api/e2b/anyport.py), where what it serves has an origin of its own."""
    given = request.headers.get(PORT_HEADER, "").strip()
    if not given or given == _ENVD_PORT:
        return await handler(request)
    if not (given.isdigit() and len(given) <= 5 and 0 < int(given) <= 65535):
        raise InvalidInput(f"{PORT_HEADER}: {given!r} is not a port number (1-65535)", field=PORT_HEADER)
    port = int(given)
    principal, sandbox_id = await public.traffic_principal(request, port)
    with acting(principal):
        engine = request.app[ENGINE]
        sb = await engine.reads.require(sandbox_id)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP | _DROPPED}
        if port == PORT and sb.spec.runtime == RUNTIME and sb.spec.network.port == PORT:
            host, target = await engine.ports.target(sandbox_id)
            headers["X-Access-Token"] = await _token(request.app, sandbox_id)
            query = f"?{request.query_string}" if request.query_string else ""
            return await relay_http(request, request.app[SESSION], f"http://{host}:{target}{request.path}{query}",
                                    headers, unreachable=f"sandbox {sandbox_id}: nothing answers on port {port}",
                                    malformed=f"sandbox {sandbox_id}: port {port}'s answer", answer=answer_headers)
        if request.get(public.HOST_ROUTED) != port:
            raise SandboxNotFound(f"sandbox {sandbox_id}: port {port} is served at its own host only "
                                  f"({port}-{{sandbox id}}.{{E2B_DOMAIN}}, Sandbox.get_host), not at E2B_SANDBOX_URL")
        return await anyport.relay(request, engine, sb, port, headers, answer_headers)
