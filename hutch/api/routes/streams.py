"""Streams. ``GET /streams/{id}``: output, unauthenticated on purpose (the stream id is the
capability): an execution's, or a sandbox's own (service/sandbox_streams.py). ``POST /streams`` and ``PUT /streams/{id}``: stdin, as Agentuity's stream
service takes it (service/input_streams.py), behind the API key."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from hutch.api.access import PUBLIC, needs
from hutch.api.http import json_body, ok
from hutch.api.keys import AT_ONCE, ENGINE, PRINCIPAL, TENANTS
from hutch.api.watchers import hold
from hutch.core import limits
from hutch.core.errors import HutchError, InvalidInput, NotFound
from hutch.core.tenancy import SCOPE, Access, Scope, secrets_match
from hutch.service.sandbox_streams import is_sandbox_stream

routes = web.RouteTableDef()


@routes.get("/streams/{stream_id}")
@needs(PUBLIC)
async def read_stream(request: web.Request) -> web.StreamResponse:
    outputs = request.app[ENGINE].output
    stream_id = request.match_info["stream_id"]
    if not await outputs.exists(stream_id):
        raise NotFound(f"stream {stream_id} not found")
    engine = request.app[ENGINE]
    owner = engine.streams.execution_of(stream_id)
    org_id = await _org_of(request, owner)
    # A reader of the organization's output holds a socket as its long-polls do: one of its share.
    with request.app[AT_ONCE].slot(org_id) if org_id is not None else contextlib.nullcontext():
        return await _read(request, stream_id, owner)


async def _org_of(request: web.Request, owner: str | None) -> str | None:
    """The organization whose sandbox writes a stream (None: a stream with no known owner)."""
    if owner is None:
        return None
    reads = request.app[ENGINE].reads
    if not is_sandbox_stream(owner):
        ex = await reads.find_execution(owner)
        if ex is None:
            return None
        owner = ex.sandbox_id
    sb = await reads.sandbox(owner)
    return sb.spec.org_id if sb is not None else None


async def _read(request: web.Request, stream_id: str, owner: str | None) -> web.StreamResponse:
    engine = request.app[ENGINE]
    outputs = engine.output
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream", "Cache-Control": "no-store"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)

    async def copy() -> None:
        async for chunk in outputs.read(stream_id):
            await resp.write(chunk)
        await resp.write_eof()

    if owner is not None and is_sandbox_stream(owner):
        async for chunk in engine.sandbox_output.follow(owner, engine.streams.kind_of(stream_id)):
            await resp.write(chunk)
        await resp.write_eof()
    elif owner is None:
        await copy()
    else:  # a reader that may act on the command is a waiter: leaving, it cancels (api/watchers.py)
        await hold(engine.watchers, request, owner, copy(), counts=await _may_act(request, owner))
    return resp


async def _may_act(request: web.Request, execution_id: str) -> bool:
    """Whether this stream read carries a key that may act on the execution's sandbox. The URL
    alone is a read capability: a keyless reader (or a read-only key's) must not be able to
    cancel the command by hanging up. A bad key here is no refusal, just no key: the URL
    still reads."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    try:
        principal = request.app[TENANTS].authenticate(token.strip())
    except HutchError:
        return False
    if not principal.may(Access.WRITE):
        return False
    if principal.server_admin:
        return True  # acts for every organization
    scope = SCOPE.set(Scope(principal.org_id, principal.projects))
    try:
        await request.app[ENGINE].reads.get_execution(execution_id)  # its organization and projects only
        return True
    except HutchError:
        return False
    finally:
        SCOPE.reset(scope)


@routes.post("/streams")
async def create_input(request: web.Request) -> web.Response:
    body = await json_body(request) if request.body_exists else {}
    name = body.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidInput(f"name: expected a string, got {name!r}", field="name")
    limits.check_chars(name, "name", limits.NAME_CHARS)
    stream_id = request.app[ENGINE].inputs.create(name or "")
    # The stream service answers {id} at the top level (the real client reads it there).
    return web.json_response({"success": True, "id": stream_id, "data": {"id": stream_id}}, status=201)


@routes.put("/streams/{stream_id}")
async def upload_input(request: web.Request) -> web.Response:
    sent = await request.app[ENGINE].inputs.upload(request.match_info["stream_id"], _while_key_lives(request))
    return ok({"bytes": sent})


async def _while_key_lives(request: web.Request) -> AsyncIterator[bytes]:
    """The body, chunk by chunk, while the key sending it lives: an upload may last as long as
    its command, and nothing sent after the key's revocation or expiry reaches the command."""
    tenants, key_id = request.app[TENANTS], request[PRINCIPAL].key_id
    async for chunk in request.content.iter_chunked(65536):
        tenants.key_expiry(key_id)  # Unauthorized: the upload ends here, a 401 naming why
        yield chunk



STDIN_TOKEN = "X-Hutch-Replica-Token"  # HMAC of the stream id under the replicas' shared secret


@routes.get("/streams/{stream_id}/stdin")
@needs(PUBLIC)  # between replicas: the token, signed with the secret they share, is the capability
async def read_input(request: web.Request) -> web.StreamResponse:
    """A stdin stream of this replica, read by a command another replica runs (api/replication.py)."""
    engine = request.app[ENGINE]
    stream_id = request.match_info["stream_id"]
    token = request.headers.get(STDIN_TOKEN, "")
    if not secrets_match(token, engine.streams.sign("stdin:" + stream_id)):
        raise NotFound(f"stream {stream_id} not found")
    reader = engine.inputs.reader(stream_id)  # a 400 naming it if it is not here or taken
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    resp.enable_chunked_encoding()
    try:
        await resp.prepare(request)
        async for chunk in reader:
            await resp.write(chunk)  # fails once the reading replica is done: the upload ends
        await resp.write_eof()
    finally:
        await reader.aclose()
    return resp
