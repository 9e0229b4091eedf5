"""Disk checkpoints: named restore points of one sandbox's writable filesystem."""

from __future__ import annotations

from aiohttp import web

from hutch.api.http import json_body, ok
from hutch.api.keys import ENGINE
from hutch.core.errors import InvalidInput
from hutch.core.models import CheckpointState

routes = web.RouteTableDef()


def render(c: CheckpointState) -> dict:
    return {"id": c.checkpoint_id, "name": c.name, "createdAt": c.created_at, "parent": c.parent}


@routes.post("/sandbox/{sandbox_id}/checkpoint")
async def create(request: web.Request) -> web.Response:
    body = await json_body(request)
    name = body.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise InvalidInput("name: required, a non-empty string of at most 200 characters", field="name")
    cp = await request.app[ENGINE].checkpoints.create(request.match_info["sandbox_id"], name)
    return ok(render(cp), http_status=201)


@routes.get("/sandbox/checkpoints/{sandbox_id}")
async def list_(request: web.Request) -> web.Response:
    found = await request.app[ENGINE].checkpoints.list(request.match_info["sandbox_id"])
    return ok({"checkpoints": [render(c) for c in found]})


@routes.post("/sandbox/{sandbox_id}/checkpoint/{checkpoint_id}/restore")
async def restore(request: web.Request) -> web.Response:
    await request.app[ENGINE].checkpoints.restore(request.match_info["sandbox_id"], request.match_info["checkpoint_id"])
    return ok()


@routes.delete("/sandbox/{sandbox_id}/checkpoint/{checkpoint_id}")
async def delete(request: web.Request) -> web.Response:
    await request.app[ENGINE].checkpoints.delete(request.match_info["sandbox_id"], request.match_info["checkpoint_id"])
    return ok()
