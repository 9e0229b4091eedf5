"""E2B's host routing: the SDK without ``E2B_SANDBOX_URL`` reaches a sandbox at
``https://{port}-{sandbox id}.{E2B_DOMAIN}`` (``Sandbox.get_host(port)``): envd at port 49983,
a signed file URL there too, and any other port as the sandbox's own: the code interpreter's
49999, or any port a process of it listens on (api/e2b/anyport.py). A request whose Host is such
a name is for that sandbox and port, whatever headers it carries; the rest of the wire then runs as with ``E2B_SANDBOX_URL`` (the sandbox's id as
``E2b-Sandbox-Id``, the port as ``E2b-Sandbox-Port``).

Origins: each name is a host of its own, so what a sandbox's port serves shares no origin with
the control plane nor with another sandbox. Under the domain only ``api.{domain}`` answers as
the control plane (the SDK's default ``E2B_API_URL``, ``https://api.{E2B_DOMAIN}``; it takes
keys in headers, never cookies); another name that is not ``{port}-{id}`` is a 404, and the
envd host answers envd's paths only (and takes the envd token only). A sandbox's port needs
its traffic access token or its envd token (``E2B-Traffic-Access-Token`` or
``X-Access-Token``) unless the sandbox was created public:
without one, 403 (E2B's answer, api/e2b/public.py); the port relay (api/e2b/ports.py) strips
every credential, so no hutch credential reaches the sandbox."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

from hutch.api.e2b.access import SANDBOX_HEADER, TOKEN_HEADER, error, hutch_id, wire_id
from hutch.api.e2b.ports import PORT_HEADER
from hutch.api.e2b.public import HOST_ROUTED
from hutch.api.e2b.signed import SIGNATURE, SIGNED, signed_token
from hutch.core import ids

ENVD_PORT = 49983
DOMAIN: web.AppKey[str] = web.AppKey("e2b_domain", str)  # set when host routing is on
_ENVD_PATHS = ("/health", "/files", "/process.", "/filesystem.")


def sandbox_host(host: str, domain: str) -> tuple[str, int] | None:
    """(sandbox id, port) when ``host`` is under ``domain``; None when it is not; ("", 0) for a
    name under the domain that names no sandbox's port."""
    host = host.lower()
    name = host if host.endswith("]") else host.rsplit(":", 1)[0]
    under = "." + domain
    name = name.rstrip(".")
    if not name.endswith(under) or name == "api" + under:  # api.{domain}: the control plane, E2B's default
        return None
    port, dash, given = name.removesuffix(under).partition("-")
    sandbox_id = hutch_id(given)
    if not (dash and port.isdigit() and len(port) <= 5 and 0 < int(port) <= 65535 and ids.is_id("sandbox", sandbox_id)):
        return "", 0
    return sandbox_id, int(port)


@web.middleware
async def host_routing(request: web.Request, handler: Handler) -> web.StreamResponse:
    domain = request.app.get(DOMAIN)
    found = sandbox_host(request.host, domain) if domain else None
    if found is None:
        return await handler(request)
    sandbox_id, port = found
    if not sandbox_id:
        return error(404, f"{request.host}: not a sandbox's host (expected {{port}}-{{sandbox id}}.{domain})")
    given = request.headers.get(SANDBOX_HEADER, "").strip()
    if given and hutch_id(given) != sandbox_id:
        return error(400, f"{SANDBOX_HEADER}: {given!r} is not the sandbox its host names ({wire_id(sandbox_id)})")
    headers = CIMultiDict(request.headers)
    headers[SANDBOX_HEADER] = wire_id(sandbox_id)
    if port == ENVD_PORT:
        if not request.path.startswith(_ENVD_PATHS):
            return error(404, f"{request.method} {request.path}: not an envd endpoint (sandbox {wire_id(sandbox_id)}'s envd)")
        headers.pop(PORT_HEADER, None)
        signed = request.path == "/files" and not headers.get(TOKEN_HEADER) and SIGNATURE in request.query
        if signed:
            headers[TOKEN_HEADER] = await signed_token(request, sandbox_id)
    else:
        signed = False
        headers[PORT_HEADER] = str(port)  # its token (or its being public) is api/e2b/public.py's to check
    routed = request.clone(headers=headers)
    routed[HOST_ROUTED] = port
    routed[SIGNED] = signed
    return await handler(routed)
