"""Who a request for a sandbox's port acts as. With a token (``E2B-Traffic-Access-Token`` or
``X-Access-Token``: the sandbox's traffic token or its envd token): the key it was given to,
every token sent checked (constant time, api/e2b/access.py) against that one sandbox.
Without one: only a sandbox created with E2B's ``network.allowPublicTraffic: true`` is
served, at its own host only, acting as the key that created it; any other answers 403,
E2B's answer, the same whether the sandbox exists or not (at ``E2B_SANDBOX_URL``, 401 as ever).

The opt-in is kept in the sandbox's metadata under ``PUBLIC_KEY`` as JSON ``true``: fixed at
create, and out of reach of E2B's metadata, whose values are strings (a string there opens
nothing). A hutch API create may set it too: the creator's own choice, as on E2B's wire."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from hutch.api.e2b.access import SANDBOX_HEADER, TOKEN_HEADER, envd_principal, hutch_id
from hutch.api.keys import ENGINE, TENANTS
from hutch.core import ids
from hutch.core.errors import Forbidden, Unauthorized
from hutch.core.models import SandboxState
from hutch.core.tenancy import Principal

TRAFFIC_HEADER = "E2B-Traffic-Access-Token"
PUBLIC_KEY = "e2b.allowPublicTraffic"
# The port a request's host named (api/e2b/hosts.py): a port other than the interpreter's is
# served only so, on an origin of its own.
HOST_ROUTED: web.RequestKey[int] = web.RequestKey("e2b_host_port", int)


def mark(metadata: dict[str, Any], allow_public: bool) -> None:
    """The create's opt-in into its metadata; anything a caller put under the key is dropped."""
    metadata.pop(PUBLIC_KEY, None)
    if allow_public:
        metadata[PUBLIC_KEY] = True


def is_public(sb: SandboxState) -> bool:
    meta = sb.spec.metadata
    return isinstance(meta, dict) and meta.get(PUBLIC_KEY) is True


async def traffic_principal(request: web.Request, port: int) -> tuple[Principal, str]:
    tokens = [(h, t.strip()) for h in (TOKEN_HEADER, TRAFFIC_HEADER) if (t := request.headers.get(h, "").strip())]
    if tokens:
        principal, sandbox_id = await envd_principal(request, tokens[0][1], header=tokens[0][0], ports=True)
        for header, other in tokens[1:]:  # every token sent must open this sandbox, not only the first
            await envd_principal(request, other, header=header, ports=True)
        return principal, sandbox_id
    if request.get(HOST_ROUTED) is None:  # at E2B_SANDBOX_URL, one origin for every sandbox: never public
        raise Unauthorized(f"missing {TOKEN_HEADER} or {TRAFFIC_HEADER} header: send the sandbox's access token")
    given = request.headers.get(SANDBOX_HEADER, "").strip()
    refused = Forbidden(f"sandbox {given}: port {port} needs the sandbox's traffic access token "
                        f"({TRAFFIC_HEADER} header)")
    sandbox_id = hutch_id(given)
    if not ids.is_id("sandbox", sandbox_id):
        raise refused
    sb = await request.app[ENGINE].reads.sandbox(sandbox_id)  # unscoped: no key names an organization
    if sb is None or not is_public(sb) or not sb.api_key_id:
        raise refused
    tenants = request.app[TENANTS]
    try:
        principal = tenants.principal_for(sb.api_key_id)
    except Unauthorized:  # its creator's key is revoked or expired: the port closes with it
        raise refused from None
    tenants.throttle(principal, public=True)  # a bucket of its own: strangers spend none of the key's rate
    if principal.server_admin:  # the administrator's sandbox may be in any organization
        principal = principal.acting_for(sb.spec.org_id, tenants.directory)
    return principal, sandbox_id
