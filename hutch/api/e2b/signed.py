"""envd's signed file URLs (``Sandbox.download_url`` / ``upload_url``): a URL that opens one
file, for one operation, without the access token in a header. The SDK signs
``{path}:{operation}:{user}:{envd access token}[:{expiration}]`` with SHA-256 (``v1_`` and the
digest in unpadded base64; ``operation`` is ``read`` for a download, ``write`` for an upload)
and puts it in the query (``signature``, ``signature_expiration`` in Unix seconds).

The URL does not say which key's token signed it (hutch's envd tokens are per sandbox and key:
api/e2b/access.py), so the server tries the token of each key that may hold one: the key that
created the sandbox first, the server's bootstrap key, then the newest 256 other keys of the
sandbox's organization that are not revoked (a URL signed with an older one is refused). Which sandbox
comes from the host (api/e2b/hosts.py): without host routing a signed URL names none and is not
served. What is cheap is checked first (the form, the expiry); the candidates cost two hashes
each. A match acts as that key's token would, with all its checks (a revoked, expired or
read-only key's URL runs nothing)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

from aiohttp import web

from hutch.api.e2b import query_params
from hutch.api.e2b.access import envd_token, wire_id
from hutch.api.keys import ENGINE, TENANTS
from hutch.core.errors import NotFound, Unauthorized

SIGNATURE = "signature"
# Set on a request a signature let in (api/e2b/hosts.py): it may touch the one path it signed.
SIGNED: web.RequestKey[bool] = web.RequestKey("e2b_signed", bool)
EXPIRATION = query_params.EXPIRATION.name
_PREFIX = "v1_"
_DIGEST_CHARS = 43  # 32 bytes in unpadded base64
# Keys tried besides the sandbox's creator and the bootstrap key, newest first: a bogus URL costs
# the server a hash pair for each (about 9 us on the shared 2 cores at a load average of 10),
# so an organization's key count must not set what an unauthenticated request may spend.
MAX_OTHER_KEYS = 256


def signature(path: str, operation: str, user: str, token: str, expiration: int | None) -> str:
    raw = f"{path}:{operation}:{user}:{token}" + ("" if expiration is None else f":{expiration}")
    return _PREFIX + base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode("ascii")


async def signed_token(request: web.Request, sandbox_id: str) -> str:
    """The envd token whose signature the request's query carries; ``Unauthorized`` (E2B's 401)
    when it carries none that is valid now."""
    query = request.query
    # A malformed expiration is a 400 naming it, as on every E2B route (api/e2b/query_params.py):
    # its form is public, so it is told before anything of the signature; empty, it is left out.
    raw = query.get(EXPIRATION)
    expiration = query_params.integer(query_params.EXPIRATION, raw) if raw else None
    given = query.get(SIGNATURE, "")
    if not (given.startswith(_PREFIX) and len(given) == len(_PREFIX) + _DIGEST_CHARS and given.isascii()):
        raise Unauthorized(f"{SIGNATURE}: not a v1 signature")
    if expiration is not None and expiration < time.time():
        raise Unauthorized("signature is already expired")  # envd's words, which E2B's tests expect
    operation = "write" if request.method == "POST" else "read"
    path, user = query.get("path", ""), query.get("username", "")
    engine, tenants = request.app[ENGINE], request.app[TENANTS]
    try:
        sb = await engine.reads.require(sandbox_id)
    except NotFound:
        sb = None
    if sb is not None:
        others = sorted((k for k in tenants.directory.keys.values() if k.org_id == sb.spec.org_id
                         and k.revoked_at is None and k.key_id != sb.api_key_id),
                        key=lambda k: k.created_at, reverse=True)[:MAX_OTHER_KEYS]
        keys = dict.fromkeys([sb.api_key_id or "", tenants.bootstrap.key_id, *(k.key_id for k in others)])
        for key_id in filter(None, keys):
            token = envd_token(engine, sandbox_id, key_id)
            if hmac.compare_digest(given, signature(path, operation, user, token, expiration)):
                return token
    # One answer whether the sandbox exists or not: the URL tells nothing of which do.
    raise Unauthorized(f"{SIGNATURE}: not a valid signature of {operation} {path!r} for sandbox "
                       f"{wire_id(sandbox_id)}")
