"""Typed application keys: the app's long-lived parts, owned by cleanup_ctx."""

from __future__ import annotations

from aiohttp import web

from api.config import Config
from api.service import Engine

CONFIG: web.AppKey[Config] = web.AppKey("config", Config)
ENGINE: web.AppKey[Engine] = web.AppKey("engine", Engine)
API_KEY: web.AppKey[str] = web.AppKey("api_key", str)
API_KEY_ID: web.RequestKey[str] = web.RequestKey("api_key_id", str)
