"""Typed application keys: the app's long-lived parts, owned by cleanup_ctx."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from hutch.api.at_once import AtOnce
from hutch.core.tenancy import Principal
from hutch.core.waiting import WaitingBound
from hutch.edge.listener import Waiting
from hutch.service.config import Config
from hutch.service.engine import Engine
from hutch.service.tenancy import Tenants

CONFIG: web.AppKey[Config] = web.AppKey("config", Config)
ENGINE: web.AppKey[Engine] = web.AppKey("engine", Engine)
TENANTS: web.AppKey[Tenants] = web.AppKey("tenants", Tenants)
AT_ONCE: web.AppKey[AtOnce] = web.AppKey("at_once", AtOnce)  # each organization's requests under way
# Connections waiting for a request head, on every HTTP listener of the server (edge/listener.py).
WAITING: web.AppKey[Waiting] = web.AppKey("waiting", WaitingBound)
E2B_PORT: web.AppKey[int] = web.AppKey("e2b_port", int)  # api/e2b/server.py, when enabled
E2B_TLS_PORT: web.AppKey[int] = web.AppKey("e2b_tls_port", int)  # its TLS listener, when enabled
SSH_GATEWAY: web.AppKey[object] = web.AppKey("ssh_gateway", object)  # api/ssh_gateway.py, when enabled
# Refuses the fields a route's JSON body does not take (api/body_fields.py); set by create_app.
BODY_CHECK: web.AppKey[Callable[[web.Request, dict[str, Any]], None]] = web.AppKey("body_check")
# A request to a sandbox's port that another replica owns goes there: the relayed answer, or
# None to serve it here (api/replication.py sets it; the port proxy calls it).
ForwardToOwner = Callable[[web.Request, str], Awaitable[web.StreamResponse | None]]
FORWARD_TO_OWNER: web.AppKey[ForwardToOwner] = web.AppKey("forward_to_owner")
PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("principal", Principal)
API_KEY_ID: web.RequestKey[str] = web.RequestKey("api_key_id", str)
# Asks again whether what let the request in still does (its key not revoked or expired, its
# Web App session not signed out): ``Unauthorized`` if not, else when that ends (ISO-8601, None:
# never). Set by the auth middleware; a request whose body or life is long asks it before acting.
STILL_AUTHORIZED: web.RequestKey[Callable[[], str | None]] = web.RequestKey("still_authorized")
# The request came with the Web App's session cookie: a browser's, whose answer it must not keep.
BY_SESSION: web.RequestKey[bool] = web.RequestKey("by_session", bool)
