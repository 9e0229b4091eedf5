"""Time travel on the wire (service/history.py): ``GET /sandbox/{id}?asOf=…`` (in sandboxes.py)
and ``GET /sandbox/sandboxes/{id}/history``; and forks (service/fork.py), the sandbox's other
relation across time: ``POST /sandbox/{id}/fork``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from hutch.api.http import json_body, ok
from hutch.api.keys import API_KEY_ID, ENGINE, PRINCIPAL
from hutch.api.render import operator, redact_event, render_sandbox
from hutch.core.errors import InvalidInput
from hutch.core.events import Event
from hutch.core.models import SandboxState
from hutch.core.tenancy import Access
from hutch.service.history import STEPS

routes = web.RouteTableDef()


def _event(request: web.Request, ev: Event) -> dict[str, Any]:
    return {"eventId": ev.event_id, "type": ev.type, "createdAt": ev.created_at, "position": ev.position,
            "event": redact_event(ev, operator=operator(request))}


def _env(request: web.Request, sb: SandboxState) -> dict[str, str]:
    """The env as it was: values for keys that may set it (and so read it through setEnv),
    names only for read-only keys."""
    principal = request.get(PRINCIPAL)
    if principal is None or principal.may(Access.WRITE):
        return dict(sb.spec.env)
    return {k: "***" for k in sb.spec.env}


async def render_as_of(request: web.Request, sandbox_id: str, ref: str) -> dict[str, Any]:

    event, state = await request.app[ENGINE].history.as_of(sandbox_id, ref)
    return {**render_sandbox(request, state), "env": _env(request, state), "asOf": _event(request, event)}


@routes.get("/sandbox/sandboxes/{sandbox_id}/history")
async def sandbox_history(request: web.Request) -> web.Response:
    """A page of the timeline: ``?limit=`` steps (1000 unless asked), ``?after=`` the ``next``
    of the page before; ``next`` is null on the last page."""
    limit = _whole(request, "limit", STEPS)
    after = _whole(request, "after", 0)
    steps, following = await request.app[ENGINE].history.timeline(request.match_info["sandbox_id"],
                                                                    after=after, limit=limit)
    return ok({"history": [{**_event(request, ev), "status": sb.status.value, "executions": sb.executions}
                           for ev, sb in steps], "next": following})


def _whole(request: web.Request, name: str, default: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise InvalidInput(f"{name}: expected a whole number, got {raw!r}", field=name)
    return int(raw)


def _or(value: object, default: object) -> object:
    return default if value is None else value  # null: left out, as every optional field


@routes.post("/sandbox/{sandbox_id}/fork")
async def fork_sandbox(request: web.Request) -> web.Response:

    body = await json_body(request, required=False)
    snap, made = await request.app[ENGINE].forks.fork(request.match_info["sandbox_id"], _or(body.get("count"), 1),
                                                     api_key_id=request.get(API_KEY_ID))
    return ok({"snapshotId": snap.snapshot_id,
               "sandboxes": [render_sandbox(request, c.sandbox) for c in made]}, http_status=201)
