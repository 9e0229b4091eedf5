"""The audit stream of one sandbox (the ``auditStreamUrl`` a create returns).

Like output streams it is unauthenticated on purpose: the URL carries an HMAC of the sandbox
id under the server's secret, so holding the URL is the capability. The body is NDJSON, one
``projections.audit.audit_record`` per event of the sandbox, read from the log itself (the
source of truth; no auditor process is needed), then followed live until the sandbox ends
(``?follow=false`` returns what is there now)."""

from __future__ import annotations

import contextlib
import json

from aiohttp import web

from hutch.api.access import PUBLIC, needs
from hutch.api.http import base_url, q_bool
from hutch.api.keys import AT_ONCE, ENGINE
from hutch.api.render import NODE_FIELDS
from hutch.core.errors import NotFound
from hutch.core.tenancy import secrets_match
from hutch.projections.audit import audit_record
from hutch.service.engine import Engine

routes = web.RouteTableDef()
_BACKLOG = 256  # events a follower holds while its reader is not reading


def audit_stream_id(engine: Engine, sandbox_id: str) -> str:
    return engine.streams.derive(sandbox_id, "audit")


def audit_stream_url(request: web.Request, engine: Engine, sandbox_id: str) -> str:
    return f"{base_url(request)}/streams/audit/{sandbox_id}/{audit_stream_id(engine, sandbox_id)}"


def _line(record: dict) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode() + b"\n"


def _tenant_view(record: dict) -> dict:
    """The URL is handed to the sandbox's creator: nodes stay the operator's (NODE_FIELDS)."""
    for field in NODE_FIELDS:
        record["detail"].pop(field, None)
    return record


@routes.get("/streams/audit/{sandbox_id}/{token}")
@needs(PUBLIC)
async def audit_stream(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    sandbox_id, token = request.match_info["sandbox_id"], request.match_info["token"]
    if not secrets_match(token, audit_stream_id(engine, sandbox_id)):
        raise NotFound("audit stream not found")
    follow = q_bool(request, "follow") is not False
    # A follower holds a socket (and its backlog) for as long as the sandbox lives: one of its
    # organization's requests at once (api/at_once.py), as a read of its output streams is.
    sb = await engine.reads.sandbox(sandbox_id)
    org_id = sb.spec.org_id if sb is not None else None
    with request.app[AT_ONCE].slot(org_id) if org_id is not None else contextlib.nullcontext():
        return await _follow(request, engine, sandbox_id, follow)


async def _follow(request: web.Request, engine: Engine, sandbox_id: str, follow: bool) -> web.StreamResponse:
    events = await engine.changes.sandbox_events(sandbox_id, follow=follow, backlog=_BACKLOG)
    async with contextlib.aclosing(events):
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        async for event in events:
            await resp.write(_line(_tenant_view(audit_record(event))))
        await resp.write_eof()
        return resp
