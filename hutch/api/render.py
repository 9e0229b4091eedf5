"""A sandbox and an execution as the wire shows them to a request: their stream URLs and port
URL depend on the address the request came in on (api/wire.py builds the rest)."""

from __future__ import annotations

from aiohttp import web

from hutch.api import wire
from hutch.api.http import base_url
from hutch.api.keys import CONFIG, ENGINE
from hutch.core.models import Execution, Sandbox
from hutch.drivers.base import Usage
from hutch.service.engine import Engine


def stream_urls(request: web.Request, engine: Engine, owner_id: str) -> tuple[str, str]:
    """The output stream URLs of an execution, or of a sandbox (all its executions' output:
    service/sandbox_streams.py)."""
    base = base_url(request)
    return (
        f"{base}/streams/{engine.streams.derive(owner_id, 'stdout')}",
        f"{base}/streams/{engine.streams.derive(owner_id, 'stderr')}",
    )


def render_sandbox(request: web.Request, sb: Sandbox, usage: Usage | None = None) -> dict:
    engine = request.app[ENGINE]
    urls = stream_urls(request, engine, sb.initial_execution_id or sb.sandbox_id)
    return wire.sandbox_info(sb, urls, port_url(request, sb), usage)


def port_url(request: web.Request, sb: Sandbox) -> str | None:
    port = sb.spec.network.port
    return sandbox_url(request, base_url(request), sb.sandbox_id, port) if port is not None else None


def render_execution(request: web.Request, ex: Execution) -> dict:
    out, err = stream_urls(request, request.app[ENGINE], ex.execution_id)
    return wire.execution_info(ex, out, err)


PROXY_PREFIX = "/proxy"  # the path form of a port URL (api/routes/proxy.py serves it)


def sandbox_url(request: web.Request, base: str, sandbox_id: str, port: int) -> str:
    """A sandbox port's URL: its own host under HUTCH_SANDBOX_DOMAIN when set, else the path form."""
    domain = request.app[CONFIG].sandbox_domain
    if domain:
        scheme = base.split("://", 1)[0]
        return f"{scheme}://{port}-{sandbox_id.removeprefix('sbx_')}.{domain}/"
    return f"{base}{PROXY_PREFIX}/{sandbox_id}/"
