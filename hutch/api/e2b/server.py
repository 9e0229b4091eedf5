"""E2B's wire on its own listener (``hutch serve --e2b-port``): one aiohttp application with
the control plane (api/e2b/control_routes.py) and envd (api/e2b/envd_routes.py), sharing the
server's engine and tenants; who may do what is api/e2b/access.py's."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

from aiohttp import web

from hutch.api import refusals
from hutch.api.at_once import AtOnce, default_limit
from hutch.api.e2b import (
    control_routes,
    envd_routes,
    files_routes,
    held,
    hosts,
    metrics,
    ports,
    query_params,
    snapshot_routes,
    watch_routes,
)
from hutch.api.e2b.access import e2b_errors, rpc_errors
from hutch.api.e2b.idempotency import IdempotentCreates
from hutch.api.e2b.processes import Processes
from hutch.api.keys import AT_ONCE, ENGINE, TENANTS
from hutch.core.waiting import HEAD_SECONDS, default_waiting
from hutch.edge.listener import Runner, Site, Waiting
from hutch.edge.listener import waiting as waiting_bound
from hutch.edge.out_of_files import open_file_limit
from hutch.service.engine import Engine
from hutch.service.tenancy import Tenants


def create_e2b_app(engine: Engine, tenants: Tenants, domain: str | None = None,
                   at_once: AtOnce | None = None) -> web.Application:
    """``at_once``: the hutch API's count of each organization's requests under way, shared
    (api/e2b/held.py); a count of its own when served alone (tests)."""
    app = web.Application(middlewares=[e2b_errors, rpc_errors, refusals.end_when_refused, hosts.host_routing,
                                       held.held_per_org, ports.port_relay, query_params.checked_query],
                          client_max_size=16 * 2**20)
    refusals.install(app)
    app[AT_ONCE] = at_once if at_once is not None else AtOnce(default_limit())
    if domain:
        app[hosts.DOMAIN] = domain
    app[ENGINE] = engine
    app[envd_routes.PROCESSES] = Processes()
    app[control_routes.IDEMPOTENCY] = IdempotentCreates()
    app[TENANTS] = tenants
    app[ports.TOKENS] = {}
    app[metrics.CPU_READINGS] = metrics.CpuReadings()
    app.cleanup_ctx.append(ports.session_ctx)
    app.cleanup_ctx.append(watch_routes.watchers_ctx)
    app.add_routes(metrics.routes)  # before control_routes' GET /sandboxes/{sandbox_id}
    app.add_routes(control_routes.routes)
    app.add_routes(snapshot_routes.routes)
    app.add_routes(envd_routes.routes)
    app.add_routes(watch_routes.routes)  # before files_routes' catch-all for the rest of Filesystem
    app.add_routes(files_routes.routes)
    return app


SHUTDOWN_SECONDS = 2.0


@contextlib.asynccontextmanager
async def serving(engine: Engine, tenants: Tenants, host: str, port: int, *,
                  tls: tuple[int, ssl.SSLContext] | None = None,
                  domain: str | None = None, at_once: AtOnce | None = None, waiting: Waiting | None = None,
                  head_seconds: float = HEAD_SECONDS) -> AsyncIterator[tuple[int, int | None]]:
    """Serve the E2B wire on ``host``:``port`` (0: a free one) while the block runs, and over TLS
    on ``tls``'s port with host routing under ``domain`` (api/e2b/hosts.py); yields the ports.
    ``waiting``, ``head_seconds``: the hutch API's bound on connections waiting for a request
    head, shared (the process's descriptors), and its deadline for one (edge/listener.py)."""
    # Its streams (a command's output, a terminal) last as long as what they follow: at shutdown
    # they are cut after a moment, not waited for (the SDK sees a broken stream and asks /health).
    runner = Runner(create_e2b_app(engine, tenants, domain if tls else None, at_once),
                    waiting if waiting is not None else waiting_bound(default_waiting(open_file_limit())), head_seconds,
                    shutdown_timeout=SHUTDOWN_SECONDS)
    await runner.setup()
    try:
        bound = await _site(Site(runner, host, port), port)
        # Site: its TLS handshakes have the head deadline too (aiohttp's TCPSite leaves asyncio's 60 s).
        bound_tls = await _site(Site(runner, host, tls[0], ssl_context=tls[1]), tls[0]) if tls else None
        yield bound, bound_tls
    finally:
        await runner.cleanup()


async def _site(site: web.TCPSite, port: int) -> int:
    await site.start()
    server = site._server  # the bound socket: the port the OS picked when given 0
    sockets = getattr(server, "sockets", None) or []
    return int(sockets[0].getsockname()[1]) if sockets else port
