"""``/ssh-keys``: the public keys that open the SSH gateway (api/ssh_gateway.py) to an
organization's sandboxes. Listed by anyone in the organization (a key limited to projects:
those registered within them); added and removed by its members and admins (a key grants what a member's API key grants, within the projects of
the API key that added it, for as long as that API key lives: revoking it removes them).
The same public key may be registered by several organizations; registering never says
whether another has it. Records are events in the log, like API keys: every replica's
gateway knows a removal within the projection lag.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from hutch.api.http import json_body, ok
from hutch.api.keys import ENGINE, PRINCIPAL, TENANTS
from hutch.core import tenancy
from hutch.core.tenancy import SshKeyRecord
from hutch.service.tenancy import now_utc

routes = web.RouteTableDef()


def render_ssh_key(k: SshKeyRecord) -> dict[str, Any]:
    return {"id": k.ssh_key_id, "orgId": k.org_id, "name": k.name, "publicKey": k.public_key,
            "fingerprint": k.fingerprint, "createdAt": k.created_at, "addedBy": k.added_by,
            "projects": list(k.projects)}


@routes.get("/ssh-keys")
async def list_ssh_keys(request: web.Request) -> web.Response:
    principal, directory, now = request[PRINCIPAL], request.app[TENANTS].directory, now_utc()
    # Those of a revoked or expired API key open nothing any more: not listed as if they did.
    # A key limited to projects sees those registered within them (core.tenancy.within).
    keys = sorted((k for k in directory.ssh_keys.values() if k.org_id == principal.org_id
                   and directory.ssh_key_live(k, now) and tenancy.within(principal.projects, k.projects)),
                  key=lambda k: k.created_at)
    return ok({"sshKeys": [render_ssh_key(k) for k in keys]})


@routes.post("/ssh-keys")
async def add_ssh_key(request: web.Request) -> web.Response:
    body = await json_body(request)
    key = await request.app[ENGINE].tenancy.add_ssh_key(request[PRINCIPAL], body.get("publicKey"), body.get("name"))
    return ok(render_ssh_key(key), http_status=201)


@routes.delete("/ssh-keys/{ssh_key_id}")
async def remove_ssh_key(request: web.Request) -> web.Response:
    principal = request[PRINCIPAL]
    key = await request.app[ENGINE].tenancy.remove_ssh_key(principal.org_id, request.match_info["ssh_key_id"],
                                                           principal.projects)
    return ok(render_ssh_key(key))
