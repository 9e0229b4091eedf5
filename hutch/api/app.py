"""The aiohttp application: middlewares (envelope, auth), routes, and the lifetimes of
the event log, projection store, driver and engine (owned by one cleanup_ctx)."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import logging
import math
import os
import re
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from hutch.api import body_fields, memory, openapi, refusals
from hutch.api.access import PUBLIC, access_of, needs
from hutch.api.at_once import AtOnce, default_limit, raise_open_file_limit
from hutch.api.http import check_query, parse_json
from hutch.api.keys import (
    API_KEY_ID,
    AT_ONCE,
    BODY_CHECK,
    BY_SESSION,
    CONFIG,
    E2B_PORT,
    E2B_TLS_PORT,
    ENGINE,
    FORWARD_TO_OWNER,
    PRINCIPAL,
    SSH_GATEWAY,
    STILL_AUTHORIZED,
    TENANTS,
    WAITING,
)
from hutch.api.query_params import check_declared
from hutch.api.replication import (
    ON_LOST,
    REPLICATION,
    Replication,
    deployment_tag,
    keep_lease,
    name_the_replica,
    relayed_by_a_replica,
    replica_middleware,
)
from hutch.api.routes import (
    audit,
    checkpoints,
    cli,
    files,
    history,
    jobs,
    metrics,
    nodes,
    proxy,
    runtime_builds,
    sandboxes,
    snapshots,
    ssh_keys,
    streams,
    terminals,
)
from hutch.api.routes import tenancy as tenancy_routes
from hutch.api.webapp import no_store
from hutch.api.webapp import routes as webapp_routes
from hutch.api.webapp.sessions import SESSIONS, Sessions, session_cookie
from hutch.core import phases
from hutch.core.errors import HutchError, InvalidInput, RateLimited, Unauthorized
from hutch.core.events import ACTOR
from hutch.core.paths import LOCK_FILE, URL_FILE
from hutch.core.quantities import parse_bytes, parse_duration
from hutch.core.tenancy import SCOPE, Access, Scope
from hutch.edge import phases as edge_phases
from hutch.edge.listener import serve, waiting
from hutch.service import archives
from hutch.service.background import Background
from hutch.service.checkpoints import CheckpointLimits
from hutch.service.composition import server_parts
from hutch.service.config import Config, resolve_api_key
from hutch.service.defaults import SandboxDefaults
from hutch.service.engine import Engine
from hutch.service.tenancy import Tenants, parse_rate

log = logging.getLogger("hutch.api")

_UPLOAD_URL = re.compile(r"^/sandbox/snapshots/snp_[A-Za-z0-9]+/upload$")
_ORG_IN_BODY_MAX = 2**20  # JSON bodies up to this size are looked into for an orgId


def _error(status: int, message: str, code: str, **extra: object) -> web.Response:
    return web.json_response({"success": False, "message": message, "code": code, **extra}, status=status)


@web.middleware
async def envelope_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        check_query(request)
        check_declared(request)
        return await handler(request)
    except RateLimited as err:
        wait = math.ceil(float(err.context.get("retry_after", 1)))
        resp = web.json_response(err.to_wire(), status=err.status, headers={"Retry-After": str(max(1, wait))})
        if err.context.get("close"):
            resp.force_close()  # kept alive, a refused connection would hold its socket all the same (api/at_once.py)
        return resp
    except HutchError as err:  # every kind the server raises has a status; 500 for one that has none
        return web.json_response(err.to_wire(), status=err.status or 500)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[CONFIG].max_body_bytes
        return _error(413, f"body: larger than the {limit} bytes this server accepts", "PAYLOAD_TOO_LARGE")
    except web.HTTPException as err:
        if err.status < 400:
            raise
        code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(err.status, "HTTP_ERROR")
        message = f"{request.method} {request.path}: " + (
            "no such endpoint" if err.status == 404 else err.reason
        )
        return _error(err.status, message, code)
    except ConnectionResetError:
        raise  # the connection is gone (the client left, or api/refusals.py cut it): nothing to answer
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error(500, "internal error; see the server log", "INTERNAL_ERROR")


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Key -> principal (organization, projects, role) -> rate limit -> the route's access.
    The scope it sets is what every lookup below sees (``core.tenancy.SCOPE``)."""
    t0 = phases.start()
    access = access_of(request.method, request.match_info.route.handler)
    if access == PUBLIC:
        return await handler(request)  # the path (a stream id, a port URL) is the capability
    if request.method == "PUT" and _UPLOAD_URL.match(request.path) and "token" in request.query \
            and "Authorization" not in request.headers:
        return await handler(request)  # a presigned snapshot upload URL: the handler checks its token
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    tenants = request.app[TENANTS]
    cookie: str | None = None
    if not header and (cookie := session_cookie(request)):  # the Web App's session (api/webapp/)
        request[BY_SESSION] = True  # its answer, a refusal too, is kept by no cache (webapp.no_store)
        principal = tenants.principal_for(request.app[SESSIONS].check(request, cookie))
    elif not header:
        raise Unauthorized("missing Authorization header; send 'Authorization: Bearer <api key>'")
    elif scheme.lower() != "bearer" or not token:
        raise Unauthorized("Authorization header must be 'Bearer <api key>'")
    else:
        principal = tenants.authenticate(token.strip())
    if not relayed_by_a_replica(request):  # counted where it came in (api/replication.py)
        tenants.throttle(principal)
    principal = principal.acting_for(await _requested_org(request), tenants.directory)
    principal.require(Access(access))
    request[PRINCIPAL] = principal
    request[API_KEY_ID] = principal.key_id
    request[STILL_AUTHORIZED] = _still_authorized(tenants, principal.key_id, request.app.get(SESSIONS), cookie)
    # Reset after the request: aiohttp serves a keep-alive connection's requests in one task.
    actor = ACTOR.set(principal.key_id)  # events this request causes name the key that acted
    scope = SCOPE.set(Scope(principal.org_id, principal.projects))
    phases.end("auth and tenancy", t0)
    try:
        with request.app[AT_ONCE].slot(principal.org_id):  # its share of the server's sockets
            return await handler(request)
    finally:
        SCOPE.reset(scope)
        ACTOR.reset(actor)


def _still_authorized(tenants: Tenants, key_id: str, sessions: Sessions | None,
                      cookie: str | None) -> Callable[[], str | None]:
    """What let a request in, asked again: its key, and the Web App session it came with."""

    def still() -> str | None:
        expires = tenants.key_expiry(key_id)
        if cookie is None or sessions is None:
            return expires
        ends = sessions.ends_at(cookie)
        return ends if expires is None or _instant(ends) < _instant(expires) else expires

    return still


def _instant(iso: str) -> dt.datetime:
    at = dt.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return at if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)


async def _requested_org(request: web.Request) -> str | None:
    """``orgId`` as the real client sends it: in the query, or in a JSON body. Both given, they
    must agree: a request naming two organizations is refused, not read as either one."""
    query: object = request.query.get("orgId") or None
    value = query
    if request.method in ("POST", "PUT", "PATCH") and request.content_type == "application/json" \
            and (request.content_length or 0) <= _ORG_IN_BODY_MAX and request.body_exists:
        raw = await request.read()  # cached: the handler reads it again for free
        if b'"orgId"' in raw:
            with contextlib.suppress(InvalidInput):  # the handler's json_body names what is wrong
                body = parse_json(raw)
                got = body.get("orgId") if isinstance(body, dict) else None
                value = query if got is None else got  # null: not given
    if query is not None and value != query:
        raise InvalidInput(f"orgId: the body's {value!r} and the query's {query!r} differ", field="orgId")
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"orgId: expected an organization id, got {value!r}", field="orgId")
    return value


def _lock_data_dir(data_dir: Path) -> int:
    """Two servers on one data dir would interleave one log and fight over sandboxes."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as err:
        os.close(fd)
        raise InvalidInput(f"data dir {data_dir} is in use by another hutch server", field="data_dir") from err
    return fd


def create_app(config: Config) -> web.Application:
    timed = [edge_phases.request_middleware()] if phases.ON else []  # a bench's (core/phases.py)
    # end_when_refused inside the envelope (its 401 is enveloped) and around the auth (it reads
    # what the auth leaves on the request once the handler has run a while).
    app = web.Application(middlewares=[*timed, envelope_middleware, refusals.end_when_refused, proxy.host_middleware,
                                       auth_middleware, replica_middleware],
                          client_max_size=config.max_body_bytes)
    refusals.install(app)
    app[CONFIG] = config
    app[AT_ONCE] = AtOnce(config.max_requests_per_org or default_limit())
    app[WAITING] = waiting(config.waiting_connections)
    app[BODY_CHECK] = _body_check(body_fields.table())
    app.router.add_get("/healthz", _health)
    app.router.add_get("/", _root)
    app.add_routes(tenancy_routes.routes)
    app.add_routes(cli.routes)  # the official Agentuity CLI's /cli/… and /services/stats calls
    app.add_routes(audit.routes)
    app.add_routes(checkpoints.routes)
    app.add_routes(files.routes)
    app.add_routes(jobs.routes)
    app.add_routes(metrics.routes)
    app.add_routes(nodes.routes)  # the node driver's machines: the operator's
    app.add_routes(snapshots.routes)  # before sandboxes: /sandbox/snapshots is not a sandbox id
    app.add_routes(sandboxes.routes)
    app.add_routes(streams.routes)
    app.add_routes(terminals.routes)
    app.add_routes(history.routes)
    app.add_routes(runtime_builds.routes)
    app.add_routes(webapp_routes)  # /app: the Web App
    app.add_routes(ssh_keys.routes)
    app.add_routes(proxy.routes)
    app.add_routes(openapi.routes)  # GET /openapi.json: every route above, described
    if phases.ON:  # first, so it writes last: after the engine's own spans at shutdown
        app.cleanup_ctx.append(edge_phases.file_ctx(lambda app: app[CONFIG].data_dir))
    app.cleanup_ctx.append(_engine_ctx)
    app.cleanup_ctx.append(proxy.session_ctx)
    app.on_response_prepare.append(name_the_replica)
    app.on_response_prepare.append(no_store)
    return app


def _body_check(fields: dict[tuple[str, str], body_fields.Fields]) -> Callable[[web.Request, dict[str, Any]], None]:
    def check(request: web.Request, body: dict[str, Any]) -> None:
        route = request.match_info.route
        path = re.sub(r"{([^}:]+):[^}]*}", r"{\1}", route.resource.canonical) if route.resource else ""
        found = fields.get((request.method, path))
        if found is not None:
            body_fields.check(body, found, f"{request.method} {path}")

    return check


@needs(PUBLIC)
async def _root(request: web.Request) -> web.Response:
    """A person who opens the server's address gets the Web App, not a 401 (the API lives under
    its own paths; GET /openapi.json describes it)."""
    raise web.HTTPFound("/app")


@needs(PUBLIC)
async def _health(request: web.Request) -> web.Response:
    data: dict[str, object] = {"status": "ok"}
    if (gateway := request.app.get(SSH_GATEWAY)) is not None:
        data["ssh"] = {"port": gateway.port}  # type: ignore[attr-defined]  # `hutch ssh --show`
    if (e2b_port := request.app.get(E2B_PORT)) is not None:
        e2b: dict[str, object] = {"port": e2b_port}
        if (tls_port := request.app.get(E2B_TLS_PORT)) is not None:  # E2B_DOMAIN for the SDK
            e2b.update(tlsPort=tls_port, domain=f"{request.app[CONFIG].e2b_domain}:{tls_port}")
        data["e2b"] = e2b
    return web.json_response({"success": True, "data": data})


async def _engine_ctx(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    config.data_dir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        lock_fd = _lock_data_dir(config.data_dir)
        stack.callback(os.close, lock_fd)
        tenants = Tenants(resolve_api_key(config)[0], default_rate=parse_rate(config.rate_limit))
        parts = server_parts(config)
        event_log, store, driver, blob_store, outputs = (parts.event_log, parts.store, parts.driver, parts.blobs,
                                                         parts.outputs)
        # Each part is closed (in reverse) however far the start got: a refusal at start
        # (a store bound to another log, a driver without its services) leaves nothing open.
        await event_log.start()
        stack.push_async_callback(event_log.close)
        await store.start()
        stack.push_async_callback(store.close)
        await blob_store.start()
        stack.push_async_callback(blob_store.close)
        await outputs.start()
        stack.push_async_callback(outputs.close_store)
        secret = await outputs.secret()  # shared by every replica on the production profile
        replicas = parts.replicas
        await replicas.start()  # before the driver: its recovery leaves other replicas' sandboxes alone
        stack.push_async_callback(replicas.close)
        if replicas.shared:
            # Renewed from now on, whatever the start costs (a slow recovery).
            lease = Background()
            lease.spawn(keep_lease(replicas, app.get(ON_LOST)), "lease")
            stack.push_async_callback(lease.close)
            driver.set_foreign(replicas.foreign_handles)
            driver.set_owner_check(replicas.mine)
            driver.set_replica(replicas.me, deployment_tag(secret), taken_over=replicas.taken_over)
        await driver.start()
        stack.push_async_callback(driver.close)
        # Counted again now that the driver may have raised the open-file limit (the local one does).
        app[AT_ONCE].limit = config.max_requests_per_org or default_limit()
        app[WAITING].limit = config.waiting_connections
        engine = Engine(event_log=event_log, store=store, driver=driver, outputs=outputs,
                        stream_secret=secret, data_dir=config.data_dir,
                        limits=archives.Limits(max_bytes=config.max_upload_bytes,
                                               max_entries=config.max_archive_entries),
                        blobs=blob_store, projector=parts.projector, replicas=replicas,
                        defaults=SandboxDefaults(memory=config.default_memory, cpu=config.default_cpu,
                                                 disk=config.default_disk),
                        checkpoint_limits=CheckpointLimits(
                            count=config.max_checkpoints,
                            bytes=parse_bytes("HUTCH_MAX_CHECKPOINT_BYTES", config.max_checkpoint_bytes)),
                        output_retention=parse_duration("HUTCH_OUTPUT_RETENTION", config.output_retention))
        stack.push_async_callback(engine.close)
        replication = Replication(replicas, engine, on_live=lambda n: setattr(tenants, "replicas", n))
        engine.changes.observe(replication.observe)
        stack.push_async_callback(replication.close)
        prebuild = config.prebuild_runtimes
        engine.changes.observe(tenants.observe)
        await engine.start()
        await tenants.load(store)
        engine.reads.tenants = tenants
        app[TENANTS] = tenants
        engine.provisioning.prebuild(prebuild)
        app[ENGINE] = engine
        app[REPLICATION] = replication
        if replicas.shared:
            app[FORWARD_TO_OWNER] = replication.forward
            engine.background.spawn(replication.run(), "replicas")  # take-overs
        app[SESSIONS] = Sessions(secret)
        if config.ssh_port is not None:
            from hutch.api.ssh_gateway import SshGateway  # asyncssh only where the gateway runs

            gateway = SshGateway(engine, tenants, config.data_dir, replication, app[AT_ONCE])
            await gateway.start(config.host, config.ssh_port)
            stack.push_async_callback(gateway.close)
            app[SSH_GATEWAY] = gateway
        if config.e2b_port is not None:
            from hutch.api.e2b.server import serving  # E2B's wire, on its own listener

            tls = None
            if config.e2b_tls_port is not None:
                from hutch.api.e2b.tls import server_context

                tls = (config.e2b_tls_port, server_context(config.data_dir, config.e2b_domain))
            app[E2B_PORT], tls_port = await stack.enter_async_context(
                serving(engine, tenants, config.host, config.e2b_port, tls=tls, domain=config.e2b_domain,
                        at_once=app[AT_ONCE], waiting=app[WAITING], head_seconds=config.request_head_seconds))
            if tls_port is not None:
                app[E2B_TLS_PORT] = tls_port
        yield


def run_server(config: Config) -> None:
    """Blocking: serve until interrupted. Prints the address, and a newly generated key once."""
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if config.e2b_tls_port is not None and config.e2b_port is None:  # not quietly left unserved
        raise InvalidInput("HUTCH_E2B_TLS_PORT (--e2b-tls-port) serves the E2B wire's TLS side: it needs "
                           "HUTCH_E2B_PORT (--e2b-port) too", field="HUTCH_E2B_TLS_PORT")
    config.data_dir.mkdir(parents=True, exist_ok=True)
    key, generated = resolve_api_key(config)
    if generated:
        print(f"hutch: generated API key (stored in {config.data_dir / 'api-key'}): {key}", flush=True)
    print(f"hutch: serving on http://{config.host}:{config.port} (data dir {config.data_dir}, driver {config.driver})", flush=True)
    if config.e2b_port is not None:
        print(f"hutch: E2B wire on {config.host}:{config.e2b_port or '(a free port: see GET /healthz)'}", flush=True)
    if config.e2b_port is not None and config.e2b_tls_port is not None:
        from hutch.api.e2b.tls import ca_file

        print(f"hutch: E2B wire over TLS on {config.host}:{config.e2b_tls_port or '(a free port: see GET /healthz)'}"
              f", sandboxes at {{port}}-{{id}}.{config.e2b_domain}, CA {ca_file(config.data_dir)}", flush=True)
    if config.ssh_port is not None:
        print(f"hutch: SSH gateway on {config.host}:{config.ssh_port or '(a free port: see GET /healthz)'}", flush=True)
    memory.limit_arenas()  # process-wide, so here rather than in create_app (tests share a process)
    raise_open_file_limit()  # likewise (api/at_once.py)
    app = create_app(config)
    app[ON_LOST] = lambda: os.kill(os.getpid(), signal.SIGTERM)  # claimed by another replica: stop
    app.cleanup_ctx.append(memory.trim_ctx)
    app.cleanup_ctx.append(_announce_ctx)
    # Its connections, and the E2B listener's, have a deadline for each request head and a bound
    # on those waiting for one (edge/listener.py).
    serve(app, config.host, config.port, app[WAITING], config.request_head_seconds)


async def _announce_ctx(app: web.Application) -> AsyncIterator[None]:
    """Where this server listens, in its data dir while it serves: a client on this machine with
    no URL and no HUTCH_URL finds it there (hutch/_config.py), as `hutch serve` then `hutch sb ls`
    promises. Written after the engine holds the data dir's lock."""
    config = app[CONFIG]
    host = "127.0.0.1" if config.host in ("0.0.0.0", "", "::") else config.host
    host = f"[{host}]" if ":" in host else host
    where = config.data_dir / URL_FILE
    if config.port:  # a port the OS picks (0) is not known here; such a server is found by URL only
        fd = os.open(where, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"http://{host}:{config.port}\n")
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            where.unlink()
