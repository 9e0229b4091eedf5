"""The reverse proxy to a sandbox's exposed port (network.port).

URL scheme: a sandbox created with ``network.port`` gets ``url`` =
``{public base}/proxy/{sandboxId}/``, or with a wildcard domain configured
(``HUTCH_SANDBOX_DOMAIN``, e.g. ``sandboxes.example.com``, whose ``*.`` points at this
server) ``{scheme}://{port}-{id}.{domain}/`` where ``id`` is the sandbox id without its
``sbx_`` prefix (an underscore is not allowed in a host name: RFC 1123, and no TLS
certificate can name one), so an app is served at ``/`` as the seeds' per-sandbox
hostnames serve it (many web apps break under a path prefix). Requests whose Host is
such a name are proxied whatever their path (``host_middleware``); the path form keeps
working. ``{url}{path}?{query}`` reaches ``/{path}?{query}`` on that port inside the
sandbox, HTTP (bodies streamed both ways, no buffering) and
websockets (frames relayed both ways). The app sees ``X-Forwarded-For``,
``X-Forwarded-Proto``, ``X-Forwarded-Host`` and ``X-Forwarded-Prefix: /proxy/{sandboxId}``.

Like the Agentuity service's sandbox URLs, the URL is public: no API key is needed (and
a request carrying this server's API key has it removed before it reaches the sandbox).
A paused sandbox is resumed by a request; a request counts as activity for the idle
timeout. The driver says where the port is (``Driver.port_target``): on the local
driver a host-only veth address, so a port of a sandbox without network is reachable
through this proxy and nothing else.

Origins (``api/proxy_origin.py``): no content a sandbox serves acts with a hutch credential.
The host form is the sandbox's own origin, the one for apps: hutch's cookies never reach
it, its cookies stay on its own host, and no host under the domain answers as the API or
the Web App (``host_middleware``). The path form is on hutch's own origin, so its documents
are served sandboxed into an opaque origin (``Content-Security-Policy: sandbox`` without
``allow-same-origin``): no cookies reach the sandbox and none can be set, no
``localStorage``/``sessionStorage``/IndexedDB, no service worker, and its requests to its
own URLs are cross-origin (``Access-Control-Allow-Origin: *`` is added so simple ones and
module scripts still work; a request that needs a preflight reaches the sandbox's app as
an ``OPTIONS`` it must answer). Enough for a status page or an API; an app needing cookies
or storage wants the host form.

A URL that serves nothing (an unknown id; any organization's sandbox without a port, not
on that port, or ended) answers one 404, word for word: the proxy tells nothing of which
sandboxes exist, and wakes none that it would not serve.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from hutch.api.access import PUBLIC, needs
from hutch.api.keys import AT_ONCE, CONFIG, ENGINE, FORWARD_TO_OWNER, TENANTS
from hutch.api.proxy_origin import answer_headers, request_headers
from hutch.api.render import PROXY_PREFIX
from hutch.api.watchers import while_client_stays
from hutch.core.errors import (
    DriverFailure,
    IllegalTransition,
    NotFound,
    NotSupported,
    SandboxNotFound,
)

routes = web.RouteTableDef()
PREFIX = PROXY_PREFIX
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("proxy_session", aiohttp.ClientSession)
# Never passed on as they came. ``expect``: this server answers a client's 100-continue itself
# (aiohttp) and streams the body as it comes; passed on, the relay would wait for the far
# side's own 100, which a server that just reads the body never sends: a hang.
HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length", "expect"}
_CHUNK = 256 * 1024
# The largest websocket message relayed, either way: aiohttp reads a message whole before it
# is passed on, so without a bound a sandbox's port (or any visitor of a public port URL) had
# the server hold one as large as it liked. Tornado's (Jupyter's) default is 10 MiB.
WS_MESSAGE_MAX = 16 << 20
# Either end of a relayed websocket: the client's (server side) or the sandbox's (client side).
_WebSocket = web.WebSocketResponse | aiohttp.ClientWebSocketResponse


def _sandbox_host(request: web.Request) -> tuple[str, int] | None:
    """(sandbox id, port) when the request's Host is under the wildcard domain; None when it
    is not (the API's own host). A host under the domain that names no sandbox's port is
    nobody's: 404, never the API."""
    domain = request.app[CONFIG].sandbox_domain
    if not domain:
        return None
    host = request.host.lower().rstrip(".")
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    under = "." + domain.lower().rsplit(":", 1)[0]
    if not name.endswith(under):
        return None
    label = name.removesuffix(under)
    port, dash, body = label.partition("-")
    if not (dash and port.isdigit() and len(body) == 26 and body.isalnum() and body.isascii()):
        raise SandboxNotFound(f"no sandbox port at {request.host}")
    return "sbx_" + body, int(port)


def _not_served(sandbox_id: str) -> SandboxNotFound:
    """What every URL that serves nothing answers, word for word as an unknown id's."""
    return SandboxNotFound(f"sandbox {sandbox_id} not found", sandbox_id=sandbox_id)


async def _exposes(request: web.Request, sandbox_id: str, port: int | None) -> str:
    """The sandbox exists, is not deleted and exposes ``port`` (any port for the path form):
    its organization."""
    try:
        sb = await request.app[ENGINE].reads.require(sandbox_id)
    except NotFound:
        raise _not_served(sandbox_id) from None
    exposed = sb.spec.network.port
    if exposed is None or (port is not None and exposed != port):
        raise _not_served(sandbox_id)
    return sb.spec.org_id


@web.middleware
async def host_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Requests to ``{port}-{id}.{domain}`` go to that sandbox's port at the same path: public,
    like the path form (no API key, and this server's key is never passed on). No request
    whose Host is under the domain reaches the API or the Web App."""
    found = _sandbox_host(request)
    if found is None:
        return await handler(request)
    sandbox_id, port = found
    org_id = await _exposes(request, sandbox_id, port)
    forward = request.app.get(FORWARD_TO_OWNER)
    if forward is not None:
        with request.app[AT_ONCE].slot(org_id):  # a relayed request holds a socket here too
            if (forwarded := await forward(request, sandbox_id)) is not None:
                return forwarded  # another replica's sandbox (api/replication.py)
    return await serve(request, sandbox_id, request.path.removeprefix("/"), prefix="")


# How long a relay keeps an idle connection: under another replica's deadline for the next
# request head (HUTCH_REQUEST_HEAD_SECONDS, 10 s by default; edge/listener.py), and under the 5 s
# that Node's and uvicorn's servers (what sandboxes often serve) keep one, so no relayed POST
# goes out on a connection the other end is closing at that instant (aiohttp retries no POST:
# the visitor would get a 502).
IDLE_SECONDS = 4.0


async def session_ctx(app: web.Application) -> AsyncIterator[None]:
    session = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        connector=aiohttp.TCPConnector(limit=0, force_close=False, keepalive_timeout=IDLE_SECONDS),
        auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())
    app[SESSION] = session
    try:
        yield
    finally:
        await session.close()


# What this proxy tells the app, set below (X-Forwarded-For is appended to, as proxies do).
_OURS = frozenset({"x-forwarded-proto", "x-forwarded-host", "x-forwarded-prefix"})


def _forward_headers(request: web.Request, prefix: str) -> dict[str, str]:
    headers: dict[str, str] = {}
    tenants = request.app[TENANTS]
    for name, value in request_headers(request.headers.items(), path_form=bool(prefix)):
        low = name.lower()
        if (low in HOP and low != "content-length") or low.startswith("sec-websocket-"):
            continue
        if low == "authorization" and tenants.knows(value.partition(" ")[2].strip()):
            continue  # never hand a hutch key (any organization's, revoked ones too) to the sandbox
        if low.startswith("x-hutch-forwarded-"):
            continue  # nor what replicas relaying a request tell each other (api/replication.py)
        if low in _OURS:
            continue  # the app trusts these as hutch's: never the visitor's word
        headers[name] = value
    peer = request.remote or ""
    prior = request.headers.get("X-Forwarded-For")
    headers["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
    headers["X-Forwarded-Proto"] = request.scheme
    headers["X-Forwarded-Host"] = request.host
    if prefix:
        headers["X-Forwarded-Prefix"] = prefix
    return headers


async def _target(request: web.Request, sandbox_id: str, tail: str) -> tuple[str, str]:
    """Where the sandbox's port is, and the sandbox's organization."""
    engine = request.app[ENGINE]
    org_id = await _exposes(request, sandbox_id, None)  # before anything wakes it
    try:
        host, port = await engine.ports.target(sandbox_id)  # not ended; wakes a paused one; activity
    except (NotFound, IllegalTransition, NotSupported):
        raise _not_served(sandbox_id) from None
    query = f"?{request.query_string}" if request.query_string else ""
    return f"{host}:{port}/{tail}{query}", org_id


@routes.route("*", PREFIX + "/{sandbox_id}")
@needs(PUBLIC)  # like Agentuity's sandbox URLs: the sandbox's own app decides
async def bare(request: web.Request) -> web.Response:
    raise web.HTTPPermanentRedirect(f"{PREFIX}/{request.match_info['sandbox_id']}/")


@routes.route("*", PREFIX + "/{sandbox_id}/{tail:.*}")
@needs(PUBLIC)
async def proxy(request: web.Request) -> web.StreamResponse:
    sandbox_id = request.match_info["sandbox_id"]
    return await serve(request, sandbox_id, request.match_info.get("tail", ""), prefix=f"{PREFIX}/{sandbox_id}")


async def serve(request: web.Request, sandbox_id: str, tail: str, *, prefix: str) -> web.StreamResponse:
    target, org_id = await _target(request, sandbox_id, tail)
    headers = _forward_headers(request, prefix)
    session = request.app[SESSION]
    # Two sockets a request (the client's, the sandbox's): one of its organization's share.
    with request.app[AT_ONCE].slot(org_id):
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await relay_websocket(request, session, f"ws://{target}", headers)
        path_form = bool(prefix)
        return await relay_http(request, session, f"http://{target}", headers,
                                unreachable=f"sandbox {sandbox_id}: nothing answers on its port",
                                malformed=f"sandbox {sandbox_id}: its port's answer",
                                answer=lambda upstream: answer_headers(upstream, path_form=path_form))


Answer = Callable[[Iterable[tuple[str, str]]], list[tuple[str, str]]]


async def relay_http(request: web.Request, session: aiohttp.ClientSession, url: str, headers: dict[str, str], *,
                     unreachable: str, malformed: str = "the far side's answer",
                     answer: Answer = list) -> web.StreamResponse:
    """``request`` relayed to ``url``, bodies streamed both ways (the replicas' forwarding too).
    A client that leaves drops the upstream request at once, even while the upstream says
    nothing (a long-poll, a quiet stream): the far side then sees its waiter leave as if the
    client had been its own (api/watchers.py). ``answer``: which of the far side's headers
    the client gets (a sandbox's: ``proxy_origin.answer_headers``; a replica's: all). A head
    that is not HTTP (a sandbox's port is anyone's program) is a 502 saying so: ``malformed``
    names whose answer it was."""
    prepared: list[web.StreamResponse] = []
    relayed, gone = await while_client_stays(request, _relay_http(request, session, url, headers, unreachable,
                                                                 malformed, answer, prepared))
    if gone or relayed is None:  # the client left: nobody reads it
        return prepared[0] if prepared else web.Response(status=499)
    return relayed


async def _relay_http(request: web.Request, session: aiohttp.ClientSession, url: str, headers: dict[str, str],
                      unreachable: str, malformed: str, answer: Answer,
                      prepared: list[web.StreamResponse]) -> web.StreamResponse:
    body: bytes | AsyncIterator[bytes] | None = None
    if request.body_exists and getattr(request, "_read_bytes", None) is not None:
        body = await request.read()  # a middleware read it already (the orgId lookup)
    elif request.body_exists:
        body = request.content.iter_chunked(_CHUNK)
    try:
        upstream_cm = session.request(request.method, url, headers=headers, data=body, allow_redirects=False)
        upstream = await upstream_cm.__aenter__()
    except (TimeoutError, aiohttp.ClientConnectionError) as err:
        raise DriverFailure(f"{unreachable} ({type(err).__name__})") from err
    except aiohttp.ClientResponseError as err:  # the parser refused its head: nothing of it passes
        why = err.message.splitlines()[0].strip().rstrip(":") if err.message else "unreadable"
        raise DriverFailure(f"{malformed} is a malformed HTTP answer ({why})") from err
    try:
        if upstream.status < 200:  # a 101 (aiohttp reads past the other 1xx) to a request that asked for no upgrade
            # Relayed, a front that takes any 101 as an upgrade would make the client's
            # connection a raw tunnel to this server, past the front's own rules.
            raise DriverFailure(f"{malformed} is a malformed HTTP answer ({upstream.status} {upstream.reason} "
                                "to a request that asked for no upgrade)")
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for name, value in answer((k, v) for k, v in upstream.headers.items() if k.lower() not in HOP):
            resp.headers.add(name, value)
        if upstream.headers.get("Content-Length") is not None and request.method != "HEAD":
            resp.content_length = int(upstream.headers["Content-Length"])
        await resp.prepare(request)
        prepared.append(resp)
        try:
            async for chunk in upstream.content.iter_chunked(_CHUNK):
                await resp.write(chunk)  # waits for the client: backpressure both ways
        except aiohttp.ClientPayloadError:
            # Cut short of what its head announced: so is the client's answer, and its
            # connection ends. Ended cleanly, a chunked answer would pass for whole, and a
            # kept-alive connection would have the next answer read as the rest of this body.
            _cut(request, resp)
            return resp
        await resp.write_eof()
        return resp
    finally:
        await upstream_cm.__aexit__(None, None, None)


def _cut(request: web.Request, resp: web.StreamResponse) -> None:
    resp.force_close()
    if request.transport is not None:
        request.transport.abort()  # before aiohttp's own write_eof could end the body cleanly


async def relay_websocket(request: web.Request, session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> web.StreamResponse:
    protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    try:
        upstream = await session.ws_connect(url, headers=headers, protocols=protocols, autoping=True,
                                              max_msg_size=WS_MESSAGE_MAX)
    except (TimeoutError, aiohttp.ClientError) as err:
        raise DriverFailure(f"websocket to the sandbox failed: {err}") from err
    client = web.WebSocketResponse(protocols=[upstream.protocol] if upstream.protocol else (), autoping=True,
                                   max_msg_size=WS_MESSAGE_MAX)
    await client.prepare(request)

    async def pump(src: _WebSocket, dst: _WebSocket) -> None:
        async for msg in src:
            if msg.type == aiohttp.WSMsgType.TEXT:
                await dst.send_str(msg.data)
            elif msg.type == aiohttp.WSMsgType.BINARY:
                await dst.send_bytes(msg.data)
            else:
                break
        await dst.close()

    tasks = [asyncio.ensure_future(pump(client, upstream)), asyncio.ensure_future(pump(upstream, client))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
        await client.close()
    return client
