"""Typed application keys: the app's long-lived parts, owned by cleanup_ctx."""

from __future__ import annotations

from aiohttp import web

from hutch.api.config import Config
from hutch.api.service import Engine
from hutch.api.tenancy import Tenants
from hutch.core.tenancy import Principal

CONFIG: web.AppKey[Config] = web.AppKey("config", Config)
ENGINE: web.AppKey[Engine] = web.AppKey("engine", Engine)
TENANTS: web.AppKey[Tenants] = web.AppKey("tenants", Tenants)
SSH_GATEWAY: web.AppKey[object] = web.AppKey("ssh_gateway", object)  # api/ssh_gateway.py, when enabled
PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("principal", Principal)
API_KEY_ID: web.RequestKey[str] = web.RequestKey("api_key_id", str)
