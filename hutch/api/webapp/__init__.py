"""The Web App, served by ``hutch serve`` itself at ``/app`` (static files in ``static/``,
shipped in the package; xterm.js pinned from npm in ``static/vendor``).

Signing in exchanges an API key for a session cookie (``sessions.py``): the browser never
keeps the key. The app then calls the same API as every client, with the cookie instead of
a bearer key, and follows ``GET /app/live``: the event log as server-sent events, scoped to
the key's organization, so pages update when something happens instead of polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

from aiohttp import web

from hutch.api.access import PUBLIC, needs
from hutch.api.http import json_body, ok
from hutch.api.keys import BY_SESSION, ENGINE, PRINCIPAL, STILL_AUTHORIZED, TENANTS
from hutch.api.refusals import ENDS_WHEN_REFUSED
from hutch.api.watchers import while_client_stays
from hutch.api.webapp.sessions import (
    HOST_ONLY,
    SESSIONS,
    Sessions,
    cookie_names,
    require_same_origin,
    session_cookie,
    tls_browser,
)
from hutch.core.errors import InvalidInput, NotFound, Unauthorized, UnsupportedMediaType
from hutch.core.tenancy import Access, Principal, visible

STATIC = Path(__file__).with_name("static")
_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml",
          ".png": "image/png"}
# The app loads nothing from elsewhere and may not be framed; inline scripts are not allowed
# (inline styles are: xterm.js writes its own <style> elements). Scripts only from the app's
# own files, never 'self' as a whole: the port proxy's path form (/proxy/…) is on this origin
# and serves what tenants write. No workers at all (the app has none). COOP: a page the app
# opens (a port URL) gets no handle on it.
_CSP = ("default-src 'self'; script-src {origin}/app/static/; worker-src 'none'; img-src 'self' data:; "
        "style-src 'self' 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "form-action 'self'")
_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache",
            "Cross-Origin-Opener-Policy": "same-origin"}
_HEARTBEAT = 15.0
_BACKLOG = 1000

routes = web.RouteTableDef()


@routes.get("/app")
@needs(PUBLIC)  # the sign-in page; everything it shows comes from the API, behind the session
async def index(request: web.Request) -> web.StreamResponse:
    return _file(request, STATIC / "index.html")


@routes.get("/app/static/{name:[A-Za-z0-9_./-]+}")
@needs(PUBLIC)
async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    path = (STATIC / name).resolve()
    if ".." in name.split("/") or not path.is_relative_to(STATIC.resolve()) or not path.is_file():
        raise NotFound(f"no such file in the app: {name}")
    return _file(request, path)


def _file(request: web.Request, path: Path) -> web.StreamResponse:
    # A path-restricted source needs the origin spelt out (CSP has no 'self' with a path).
    origin = f"{'https' if tls_browser(request) else 'http'}://{request.host}"
    return web.FileResponse(path, headers={**_HEADERS, "Content-Security-Policy": _CSP.format(origin=origin),
                                           "Content-Type": _TYPES.get(path.suffix, "application/octet-stream")})


@routes.post("/app/session")
@needs(PUBLIC)  # signing in: the key in the body is the credential
async def sign_in(request: web.Request) -> web.Response:
    # Login CSRF: another site's form would sign the visitor in as the attacker (then what she
    # does lands in the attacker's organization). A form cannot send JSON, nor another
    # origin's page this origin's Origin.
    require_same_origin(request, "signing in")
    if request.content_type != "application/json":
        raise UnsupportedMediaType(f"Content-Type: expected application/json, got {request.content_type}",
                                   field="Content-Type")
    body = await json_body(request)
    secret = body.get("apiKey")
    if not isinstance(secret, str) or not secret.strip():
        raise InvalidInput("apiKey: required (a hutch API key)", field="apiKey")
    principal = request.app[TENANTS].authenticate(secret.strip())  # 401 with its reason otherwise
    sessions: Sessions = request.app[SESSIONS]
    cookie, csrf = sessions.issue(principal.key_id)
    resp = ok(_me(principal) | {"csrf": csrf}, http_status=201)
    resp.headers["Cache-Control"] = "no-store"  # the CSRF token
    # Host-only (no Domain: no sandbox host under this one gets them), Path=/ (as __Host- needs).
    secure = tls_browser(request)
    name, csrf_name = cookie_names(request)
    resp.set_cookie(name, cookie, httponly=True, secure=secure, samesite="Strict", path="/",
                    max_age=int(sessions.ttl))
    resp.set_cookie(csrf_name, csrf, httponly=False, secure=secure, samesite="Strict", path="/",
                    max_age=int(sessions.ttl))
    return resp


async def no_store(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: an answer to a session's request (a sandbox's environment, its
    files, its output) is kept by no cache. Without it a browser keeps such answers on disk,
    there after sign-out for whoever uses the machine next."""
    if request.get(BY_SESSION):
        response.headers["Cache-Control"] = "no-store"


@routes.get("/app/session")
async def whoami(request: web.Request) -> web.Response:
    return ok(_me(request[PRINCIPAL]))


@routes.delete("/app/session")
@needs(Access.READ)  # any signed-in key may sign out, a read-only one too
async def sign_out(request: web.Request) -> web.Response:
    if cookie := session_cookie(request):
        request.app[SESSIONS].end(cookie)
        request.app[TENANTS].recheck()  # the terminals this session opened end now
    resp = ok({"signedOut": True})
    for name in cookie_names(request):
        resp.del_cookie(name, path="/", secure=name.startswith(HOST_ONLY) or None)  # a browser drops only what it could set
    return resp


def _still_in(request: web.Request) -> bool:
    """The key lives, and the session the feed came with is not signed out."""
    try:
        request[STILL_AUTHORIZED]()
    except Unauthorized:
        return False
    return True


def _me(p: Principal) -> dict[str, object]:
    return {"keyId": p.key_id, "orgId": p.org_id, "role": p.role.value,
            "projects": list(p.projects), "serverAdmin": p.server_admin}


@routes.get("/app/live")
async def live(request: web.Request) -> web.StreamResponse:
    """Server-sent events: one per event appended to the log that the caller may see, while
    its key lives: revoked or expired, the feed ends before it tells another one."""
    principal = request[PRINCIPAL]
    engine = request.app[ENGINE]
    request[ENDS_WHEN_REFUSED] = True  # it asks before each event, and ends cleanly (EventSource would retry a cut)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    # The organization's events only, and a bounded backlog: a browser that stopped reading
    # holds at most _BACKLOG of them, then its stream ends (EventSource reconnects).
    queue = engine.changes.listen(org_id=principal.org_id, limit=_BACKLOG)
    try:
        await resp.write(b": hutch live\n\n")
        while True:
            try:
                # Watching the connection: a stopping server closes it, and would otherwise
                # wait for the next heartbeat's failed write to be done with this handler.
                event, gone = await while_client_stays(request, asyncio.wait_for(queue.get(), _HEARTBEAT))
            except TimeoutError:
                if not _still_in(request):
                    break
                await resp.write(b": heartbeat\n\n")  # keeps proxies from closing an idle stream
                continue
            if gone or event is None or queue.overflowed or not _still_in(request):
                break
            if not visible(event.org_id, event.project) or event.org_id != principal.org_id:
                continue
            data = {"eventId": event.event_id, "type": event.type, "sandboxId": event.sandbox_id,
                    "createdAt": event.created_at, "position": event.position}
            await resp.write(f"data: {json.dumps(data)}\n\n".encode())
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        engine.changes.unlisten(queue)
    with contextlib.suppress(Exception):
        await resp.write_eof()
    return resp
