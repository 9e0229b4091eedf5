"""/nodes: the machines the node driver places sandboxes on, the operator's only (the server
administrator's key): a tenant that could list them, or drain one, would learn or steer where
other tenants' sandboxes run."""

from __future__ import annotations

from aiohttp import web

from hutch.api.access import needs
from hutch.api.http import json_body, ok
from hutch.api.keys import ENGINE
from hutch.core.errors import InvalidInput
from hutch.core.serde import to_wire
from hutch.core.tenancy import Access

routes = web.RouteTableDef()


def _flag(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidInput(f"{name}: expected true or false, got {value!r}", field=name)
    return value


@routes.get("/nodes")
@needs(Access.SERVER)
async def list_nodes(request: web.Request) -> web.Response:
    found = await request.app[ENGINE].nodes.list()
    return ok({"nodes": to_wire(found), "total": len(found)})


@routes.post("/nodes/{node}/drain")
@needs(Access.SERVER)
async def drain_node(request: web.Request) -> web.Response:
    body = await json_body(request, required=False)
    undo, move = _flag(body, "undo"), _flag(body, "move")
    if undo and move:
        raise InvalidInput("move: a node put back in service (undo) has nothing to move off it", field="move")
    drained = await request.app[ENGINE].nodes.drain(request.match_info["node"], draining=not undo, move=move)
    return ok(to_wire(drained))
