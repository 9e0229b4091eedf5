"""Who may do what on E2B's wire, and its refusals' shapes. The wire (api/e2b/server.py) is
the control plane the SDK reaches at ``E2B_API_URL`` and the in-sandbox API ("envd") it
reaches at ``E2B_SANDBOX_URL``, both at one address. A separate aiohttp application, not routes of hutch's own: its
answers are E2B's (``{"code": 404, "message": …}``, Connect's errors), not hutch's envelope,
and its keys come in ``X-API-Key`` and ``X-Access-Token`` instead of ``Authorization``. It
shares the server's engine, so what it does is recorded, scoped, metered and limited as any
other request.

Who may do what:
- control plane: ``X-API-Key`` is a hutch API key; the request acts for its organization
  (``acting``), as the auth middleware of api/app.py would.
- envd: the SDK sends no API key there, only the ``envdAccessToken`` the create (or connect)
  answered, and ``E2b-Sandbox-Id``. The token names the key it was given to (the one that
  created, connected to or read the sandbox) and is an HMAC of (sandbox, key) under the server
  secret: it opens that one sandbox, as that key, for as long as the key is valid and may write
  (a revoked key, or a read-only one, runs nothing).
- a sandbox's ports (api/e2b/public.py): the ``trafficAccessToken`` the create (or connect)
  answered, made as the envd token is (per sandbox and key, the same rules) but with another
  purpose signed into it. On E2B it is what a user hands out so that someone may reach a port;
  it opens the ports and nothing of envd (no command, no file), and neither token is made from
  the other. The envd token opens the ports too, as E2B's does."""

from __future__ import annotations

import functools
import hmac
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Handler

from hutch.api.e2b import connect
from hutch.api.keys import ENGINE, STILL_AUTHORIZED, TENANTS
from hutch.core import ids
from hutch.core.errors import HutchError, RateLimited, Unauthorized
from hutch.core.events import acting
from hutch.core.tenancy import Access, Principal
from hutch.service.engine import Engine

log = logging.getLogger("hutch.api.e2b")

SANDBOX_HEADER = "E2b-Sandbox-Id"
_ID_PREFIX = "sbx_"
TOKEN_HEADER = "X-Access-Token"
_RPC_PREFIXES = ("/process.", "/filesystem.")
PRINCIPAL_KEY: web.RequestKey[Principal] = web.RequestKey("e2b_principal", Principal)
SANDBOX_KEY: web.RequestKey[str] = web.RequestKey("e2b_sandbox", str)


def error(status: int, message: str) -> web.Response:
    return web.json_response({"code": status, "message": message}, status=status)


@web.middleware
async def rpc_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A refusal on a Connect route, in Connect's shape (api/e2b/connect.py)."""
    try:
        return await handler(request)
    except Exception as err:
        if not request.path.startswith(_RPC_PREFIXES) or isinstance(err, web.HTTPException):
            raise
        if not isinstance(err, HutchError | connect.RpcError):
            log.exception("unhandled error in %s %s", request.method, request.path)
        return connect.error_response(err)


@web.middleware
async def e2b_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every other refusal in E2B's shape."""
    try:
        return await handler(request)
    except RateLimited as err:
        response = error(429, err.message)
        response.headers["Retry-After"] = str(max(1, int(float(err.context.get("retry_after", 1)) + 0.999)))
        if err.context.get("close"):
            response.force_close()  # kept alive, a refused connection would hold its socket all the same
        return response
    except HutchError as err:
        return error(err.status or 500, err.message)
    except ConnectionResetError:
        raise  # the client left mid-answer (a download it stopped reading): nothing to answer
    except web.HTTPException as err:
        if err.status < 400:
            raise
        reason = "no such endpoint on the E2B wire" if err.status == 404 else err.reason
        return error(err.status, f"{request.method} {request.path}: {reason}")
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error(500, "internal error; see the server log")


def wire_id(sandbox_id: str) -> str:
    """A sandbox's id on E2B's wire: hutch's without its ``sbx_`` prefix. E2B's SDK puts the id
    in a host name (``{port}-{id}.{domain}``), where an underscore is no valid label character
    (E2B's SDK's resolver refuses the name; no certificate can name it)."""
    return sandbox_id.removeprefix(_ID_PREFIX)


def hutch_id(value: str) -> str:
    """The hutch id of a sandbox id the wire was given: E2B's form gains its prefix back;
    hutch's own (``sbx_…``) is taken too."""
    value = value.strip()
    return _ID_PREFIX + value if ids.is_id("sandbox", _ID_PREFIX + value) else value


# What a token opens, signed into it: a MAC for one purpose is no MAC for the other.
ENVD, TRAFFIC = "e2b-envd", "e2b-traffic"


def _token(engine: Engine, purpose: str, sandbox_id: str, key_id: str) -> str:
    return f"{key_id}.{engine.streams.sign(f'{purpose}:{sandbox_id}:{key_id}')[:48]}"


def envd_token(engine: Engine, sandbox_id: str, key_id: str) -> str:
    return _token(engine, ENVD, sandbox_id, key_id)


def traffic_token(engine: Engine, sandbox_id: str, key_id: str) -> str:
    return _token(engine, TRAFFIC, sandbox_id, key_id)


def token_of(engine: Engine, sandbox_id: str, token: str) -> tuple[str, str] | None:
    """(the key id, ``ENVD`` or ``TRAFFIC``) of a token of this sandbox; None for anything else.
    ASCII first: compare_digest raises TypeError on other text (it was a 500 for anyone)."""
    key_id = token.rpartition(".")[0]
    if not key_id or not token.isascii() or not sandbox_id.isascii():
        return None
    for purpose in (ENVD, TRAFFIC):
        if hmac.compare_digest(token, _token(engine, purpose, sandbox_id, key_id)):
            return key_id, purpose
    return None


def _control_principal(request: web.Request, access: Access) -> Principal:
    key = request.headers.get("X-API-Key", "").strip()
    if not key:
        raise Unauthorized("missing X-API-Key header: send a hutch API key as E2B_API_KEY")
    tenants = request.app[TENANTS]
    principal = tenants.authenticate(key)
    tenants.throttle(principal)
    principal.require(access)
    return principal


async def envd_principal(request: web.Request, token: str | None = None, *, header: str = TOKEN_HEADER,
                         ports: bool = False) -> tuple[Principal, str]:
    """Who the envd token (``X-Access-Token``, or ``token`` from ``header`` when given) acts as,
    and for which sandbox. ``ports``: the request is for a sandbox's port, which its traffic
    token opens too; envd takes the envd token only."""
    given = request.headers.get(SANDBOX_HEADER, "").strip()  # refusals name it as the client gave it
    sandbox_id = hutch_id(given)
    token = (request.headers.get(TOKEN_HEADER, "") if token is None else token).strip()
    if not sandbox_id:
        raise Unauthorized(f"missing {SANDBOX_HEADER} header: which sandbox is this for?")
    if not token:
        raise Unauthorized(f"missing {TOKEN_HEADER} header: send the envdAccessToken the create answered")
    engine = request.app[ENGINE]
    # Checked before anything is looked up: a wrong token learns nothing about the sandbox.
    found = token_of(engine, sandbox_id, token)
    if found is None:
        raise Unauthorized(f"{header}: not a valid access token for sandbox {given}")
    key_id, purpose = found
    if purpose == TRAFFIC and not ports:
        raise Unauthorized(f"{header}: that is sandbox {given}'s trafficAccessToken, which opens only the "
                           "sandbox's ports; envd (commands, files) takes the envdAccessToken")
    tenants = request.app[TENANTS]
    principal = tenants.principal_for(key_id)
    tenants.throttle(principal)
    principal.require(Access.WRITE)
    if principal.server_admin:  # the administrator's sandbox may be in any organization
        sb = await engine.reads.require(sandbox_id)
        principal = principal.acting_for(sb.spec.org_id, tenants.directory)
    return principal, sandbox_id


def still_valid(request: web.Request) -> None:
    """``Unauthorized`` once the key the request acts as is revoked or expired. A stream
    (a command's output, a directory's changes) asks it before each message it sends: it was
    let in when it opened, and may stay open far longer than its key."""
    tenants = request.app[TENANTS]
    tenants.key_expiry(request[PRINCIPAL_KEY].key_id)


def _key_still_valid(request: web.Request, principal: Principal) -> Callable[[], str | None]:
    tenants = request.app[TENANTS]
    return lambda: tenants.key_expiry(principal.key_id)


def control(access: Access) -> Callable[[Handler], Handler]:
    """A control-plane handler: it runs as the X-API-Key's organization."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def run(request: web.Request) -> web.StreamResponse:
            principal = _control_principal(request, access)
            request[PRINCIPAL_KEY] = principal
            request[STILL_AUTHORIZED] = _key_still_valid(request, principal)
            with acting(principal):
                return await handler(request)

        return run

    return wrap


def envd(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Handler:
    """An envd handler: it runs as the key that created the sandbox its token opens."""

    @functools.wraps(handler)
    async def run(request: web.Request) -> web.StreamResponse:
        principal, sandbox_id = await envd_principal(request)
        request[PRINCIPAL_KEY] = principal
        request[SANDBOX_KEY] = sandbox_id
        request[STILL_AUTHORIZED] = _key_still_valid(request, principal)
        with acting(principal):
            return await handler(request)

    return run


