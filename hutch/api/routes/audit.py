"""The audit stream of one sandbox (the ``auditStreamUrl`` a create returns).

Like output streams it is unauthenticated on purpose: the URL carries an HMAC of the sandbox
id under the server's secret, so holding the URL is the capability. The body is NDJSON, one
``projections.audit.audit_record`` per event of the sandbox, read from the log itself (the
source of truth; no auditor process is needed), then followed live until the sandbox ends
(``?follow=false`` returns what is there now)."""

from __future__ import annotations

import json

from aiohttp import web

from hutch.api.access import PUBLIC, needs
from hutch.api.http import base_url, q_bool
from hutch.api.keys import ENGINE
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


@routes.get("/streams/audit/{sandbox_id}/{token}")
@needs(PUBLIC)
async def audit_stream(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE]
    sandbox_id, token = request.match_info["sandbox_id"], request.match_info["token"]
    if not secrets_match(token, audit_stream_id(engine, sandbox_id)):
        raise NotFound("audit stream not found")
    follow = q_bool(request, "follow") is not False
    # Before reading the log: nothing falls in between. Bounded: a reader that stops reading
    # holds at most _BACKLOG events, and catches up from the log when it reads again.
    queue = engine.projector.listen(sandbox_id=sandbox_id, limit=_BACKLOG)
    try:
        sandbox = await engine.store.get_sandbox(sandbox_id)
        if sandbox is None:
            raise NotFound("audit stream not found")
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        last = 0
        for event in await engine.log.read(0, sandbox_id=sandbox_id):
            await resp.write(_line(audit_record(event)))
            last = event.position or last
        ended = sandbox.status.is_final
        while follow and not ended:
            if queue.overflowed:
                queue.overflowed = False
                events = await engine.log.read(last, sandbox_id=sandbox_id)
            else:
                events = [await queue.get()]
            for event in events:
                if (event.position or 0) <= last:
                    continue
                await resp.write(_line(audit_record(event)))
                last = event.position or last
            current = await engine.store.get_sandbox(sandbox_id)
            ended = current is None or current.status.is_final
            if ended:  # the end may have come while events waited or were missed: the log has them
                for event in await engine.log.read(last, sandbox_id=sandbox_id):
                    await resp.write(_line(audit_record(event)))
        await resp.write_eof()
        return resp
    finally:
        engine.projector.unlisten(queue)
