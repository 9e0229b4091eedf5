"""The E2B wire's requests count toward their organization's requests at once (api/at_once.py),
as hutch's own routes do.

A command's output stream (Connect's Start and Connect), a watch and a download each hold a
socket for as long as they run. Only hutch's routes were counted: a tenant holding a few
hundred streams in each of a few sandboxes over E2B's wire took the server's file
descriptors, and with them every other tenant's requests, past the bound its own routes
keep. The organization is read as each route's own check reads it (the API key, or a sandbox's
access token checked against its signature); a request that names none (a bad key or token,
which its route then refuses, a public port's stranger) is not counted.
"""

from __future__ import annotations

import contextlib

from aiohttp import web
from aiohttp.typedefs import Handler

from hutch.api.e2b.access import SANDBOX_HEADER, TOKEN_HEADER, hutch_id, token_of
from hutch.api.e2b.public import TRAFFIC_HEADER
from hutch.api.keys import AT_ONCE, ENGINE, TENANTS
from hutch.core.errors import HutchError


def _org(request: web.Request) -> str | None:
    tenants = request.app[TENANTS]
    try:
        key = request.headers.get("X-API-Key", "").strip()
        if key:
            return tenants.authenticate(key).org_id
        token = (request.headers.get(TOKEN_HEADER) or request.headers.get(TRAFFIC_HEADER) or "").strip()
        sandbox_id = hutch_id(request.headers.get(SANDBOX_HEADER, "").strip())
        found = token_of(request.app[ENGINE], sandbox_id, token) if sandbox_id else None
        if found is not None:  # an envd or a traffic token: its route says what it may open
            return tenants.principal_for(found[0]).org_id
    except HutchError:  # its route refuses it, saying why
        return None
    return None


@web.middleware
async def held_per_org(request: web.Request, handler: Handler) -> web.StreamResponse:
    org_id = _org(request)
    with request.app[AT_ONCE].slot(org_id) if org_id is not None else contextlib.nullcontext():
        return await handler(request)
