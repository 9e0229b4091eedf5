"""/sandbox/…snapshot…: take, build (init, upload, finalize), get, list, tag, delete, lineage,
public listing, and download of snapshots (service/snapshots.py does the work)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from hutch.api.access import PUBLIC, needs
from hutch.api.http import base_url, json_body, ok, q_bool, q_choice, q_int, q_offset, stream
from hutch.api.keys import API_KEY_ID, AT_ONCE, CONFIG, ENGINE, STILL_AUTHORIZED, TENANTS
from hutch.api.parse import expect, parse_env
from hutch.api.render import lineage_entry, snapshot_info
from hutch.core import limits
from hutch.core.blobs import BlobNotFound
from hutch.core.errors import InvalidInput, SnapshotNotFound, Unauthorized
from hutch.core.models import SnapshotState
from hutch.core.snapshots import check_name
from hutch.core.tenancy import secrets_match
from hutch.projections.base import SNAPSHOT_SORTS, SnapshotQuery
from hutch.service.snapshots import LINEAGE_MAX, unchanged
from hutch.service.tenancy import Tenants, project_for

routes = web.RouteTableDef()

def _render(request: web.Request, snap: SnapshotState) -> dict[str, Any]:
    return snapshot_info(snap, f"{base_url(request)}/sandbox/snapshots/{snap.snapshot_id}/download")


def _str(body: dict[str, Any], key: str, most: int = limits.TEXT_CHARS) -> str | None:
    value = expect(body, key, str, "a string")
    limits.check_chars(value, key, most)
    return value


def _flag(body: dict[str, Any], key: str) -> bool:
    return bool(expect(body, key, bool, "true or false"))


def _str_map(body: dict[str, Any], key: str) -> dict[str, str]:
    value = body.get(key) or {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidInput(f"{key}: expected an object of string values", field=key)
    # A snapshot's env becomes its sandboxes' env, so the same limits; its metadata is kept as given.
    if key == "env":
        limits.check_env(parse_env(value, key))
    else:
        limits.check_metadata(value, key)
    return dict(value)


@routes.post("/sandbox/{sandbox_id}/snapshot")
async def take(request: web.Request) -> web.Response:
    body = await json_body(request, required=False)
    snap = await request.app[ENGINE].snapshots.take(
        request.match_info["sandbox_id"], name=_str(body, "name"), description=_str(body, "description"),
        tag=_str(body, "tag"), public=_flag(body, "public"), api_key_id=request.get(API_KEY_ID),
    )
    return ok(_render(request, snap), http_status=201)


def _list_query(request: web.Request, *, public: bool | None, hi: int) -> SnapshotQuery:
    sort = request.query.get("sort") or "createdAt"
    if sort not in SNAPSHOT_SORTS:
        raise InvalidInput(f"sort: expected one of {', '.join(sorted(SNAPSHOT_SORTS))}, got {sort!r}", field="sort")
    return SnapshotQuery(
        source_sandbox_id=request.query.get("sandboxId") or None,
        name=request.query.get("name") or None,
        tag=request.query.get("tag") or None,
        public=public,
        forks=bool(q_bool(request, "forks")),  # a fork's instant is listed only when asked for
        limit=q_int(request, "limit", 50, lo=1, hi=hi),
        offset=q_offset(request),
        sort=sort,
        direction=q_choice(request, "direction", ("asc", "desc"), "desc") or "desc",
    )


@routes.get("/sandbox/snapshots")
async def list_(request: web.Request) -> web.Response:
    found, total = await request.app[ENGINE].snapshots.list(_list_query(request, public=None, hi=1000))
    return ok({"snapshots": [_render(request, s) for s in found], "total": total})


@routes.get("/sandbox/snapshots/public")
@needs(PUBLIC)
async def list_public(request: web.Request) -> web.Response:
    found, total = await request.app[ENGINE].snapshots.list(_list_query(request, public=True, hi=100))
    return ok({"snapshots": [snapshot_info(s) for s in found], "total": total})


@routes.get("/sandbox/snapshots/public/{ref:.+}")
@needs(PUBLIC)
async def get_public(request: web.Request) -> web.Response:
    snap = await request.app[ENGINE].snapshots.resolve(request.match_info["ref"], "snapshotRef", public_only=True)
    return ok(snapshot_info(snap))


@routes.get("/sandbox/snapshots/lineage")
async def lineage(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    limit = q_int(request, "limit", 100, lo=1, hi=LINEAGE_MAX)
    ref, name, tag = (request.query.get(k) or None for k in ("snapshot", "name", "tag"))
    if ref and name:
        raise InvalidInput("snapshot: give either snapshot or name (with an optional tag), not both", field="snapshot")
    if ref:
        start = await engine.snapshots.resolve(ref, "snapshot")
    elif name and tag:
        start = await engine.snapshots.resolve(f"{name}:{tag}", "name")
    elif name:  # a bare name: its newest snapshot, whatever it is tagged
        found, _ = await engine.snapshots.list(SnapshotQuery(name=check_name(name), limit=1))
        if not found:
            raise SnapshotNotFound(f"name: no snapshot named {name!r}", field="name")
        start = found[0]
    else:
        raise InvalidInput("snapshot: give snapshot (an id or name:tag) or name", field="snapshot")
    chain = await engine.snapshots.lineage(start, limit)
    return ok({"lineage": [lineage_entry(s, deleted) for s, deleted in chain], "total": len(chain)})


@routes.post("/sandbox/snapshots/build")
async def build_init(request: web.Request) -> web.Response:
    body = await json_body(request)
    runtime = body.get("runtime")
    if not isinstance(runtime, str) or not runtime:
        raise InvalidInput("runtime: required, a runtime name (python:3.13) or id (srt_...)", field="runtime")
    # ``encrypt`` (the Agentuity CLI asks it for every private build): a server that encrypts
    # answers a ``publicKey`` to encrypt the upload with; hutch keeps archives on its own disk
    # like every other file it holds and answers none (``encrypted: false``), so the client
    # uploads the plain archive. Checked for type like every flag.
    _flag(body, "encrypt")
    engine = request.app[ENGINE]
    made, existing = await engine.snapshots.build_init(
        runtime=runtime, name=_str(body, "name"), tag=_str(body, "tag"),
        description=_str(body, "description"), message=_str(body, "message"),
        content_hash=_str(body, "contentHash"), force=_flag(body, "force"), public=_flag(body, "public"),
        api_key_id=request.get(API_KEY_ID),
        # hutch's: the project it belongs to (a key limited to one project: that one).
        project_id=project_for(_str(body, "projectId"), request.app[TENANTS].directory, "snapshots"),
    )
    if existing is not None:
        return ok(unchanged(existing))
    assert made is not None
    token = engine.snapshots.upload_token(made.snapshot_id)
    url = f"{base_url(request)}/sandbox/snapshots/{made.snapshot_id}/upload?token={token}"
    return ok({"snapshotId": made.snapshot_id, "uploadUrl": url, "encrypted": False}, http_status=201)


@routes.put("/sandbox/snapshots/{snapshot_id}/upload")
async def upload(request: web.Request) -> web.Response:
    """Authorised by the API key or by the upload URL's token (a presigned URL, as the
    client expects), which is good for this one snapshot only, and only while the key that
    made the build lives (revoked or expired, its presigned URLs are too)."""
    engine = request.app[ENGINE]
    snapshot_id = request.match_info["snapshot_id"]
    check = request.get(STILL_AUTHORIZED)
    counted: contextlib.AbstractContextManager[None] = contextlib.nullcontext()  # with a key: at auth
    if API_KEY_ID not in request:
        token = request.query.get("token", "")
        if not secrets_match(token, engine.snapshots.upload_token(snapshot_id)):
            raise Unauthorized("upload: the token does not match this snapshot's upload URL")
        snap = await engine.snapshots.get(snapshot_id, include_building=True, own=True)
        maker = snap.api_key_id
        check = _maker_lives(request.app[TENANTS], maker) if maker is not None else None
        if check is not None:
            check()
        # An upload holds its socket for as long as its sender likes: one of the organization's
        # requests at once (api/at_once.py), as with its key.
        counted = request.app[AT_ONCE].slot(snap.org_id)
    with counted:
        await engine.snapshots.upload(snapshot_id, _while_authorized(check, request.content.iter_chunked(1 << 20)),
                                      request.app[CONFIG].max_upload_bytes, declared=request.content_length)
    return ok({"success": True, "scanned": False, "message": "stored; archives are checked when finalized"})


def _maker_lives(tenants: Tenants, maker: str) -> Callable[[], object]:
    def check() -> None:
        try:
            tenants.key_expiry(maker)
        except Unauthorized as err:
            raise Unauthorized(f"upload: the key that made this URL is no longer valid ({err.message})") from None
    return check


async def _while_authorized(check: Callable[[], object] | None, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """An upload lasts as long as its sender likes: nothing sent after its key ended is stored."""
    async for chunk in chunks:
        if check is not None:
            check()
        yield chunk


@routes.post("/sandbox/snapshots/{snapshot_id}/finalize")
async def finalize(request: web.Request) -> web.Response:
    body = await json_body(request, required=False)
    snap = await request.app[ENGINE].snapshots.finalize(
        request.match_info["snapshot_id"], env=_str_map(body, "env"), metadata=_str_map(body, "metadata"),
        dependencies=body.get("dependencies"), packages=body.get("packages"),
    )
    return ok(_render(request, snap))


@routes.get("/sandbox/snapshots/{snapshot_id}/download")
async def download(request: web.Request) -> web.StreamResponse:
    snapshot_id = request.match_info["snapshot_id"]
    snapshots = request.app[ENGINE].snapshots
    await snapshots.get(snapshot_id)
    archives = snapshots.archives
    try:  # before answering: a missing archive is still a JSON 4xx
        size = (await archives.store.stat(archives.key(snapshot_id))).size
    except BlobNotFound:  # taken from an empty env-only build
        raise InvalidInput(f"snapshot {snapshot_id} has no files to download", field="snapshotId") from None
    # An archive never changes once its snapshot is ready: its stored size is the answer's length.
    return await stream(request, archives.read(snapshot_id), "application/gzip", content_length=size,
                        headers={"Content-Disposition": f'attachment; filename="{snapshot_id}.tar.gz"'})


@routes.get("/sandbox/snapshots/{snapshot_id}")
async def get(request: web.Request) -> web.Response:
    snap = await request.app[ENGINE].snapshots.resolve(request.match_info["snapshot_id"], "snapshotId")
    return ok(_render(request, snap))


@routes.patch("/sandbox/snapshots/{snapshot_id}")
async def tag(request: web.Request) -> web.Response:
    body = await json_body(request)
    if "tag" not in body:
        raise InvalidInput("tag: required (a tag, or null to remove it)", field="tag")
    if body["tag"] is not None and not isinstance(body["tag"], str):
        raise InvalidInput(f"tag: expected a string or null, got {body['tag']!r}", field="tag")
    snap = await request.app[ENGINE].snapshots.set_tag(request.match_info["snapshot_id"], body["tag"] or None)
    return ok(_render(request, snap))


@routes.delete("/sandbox/snapshots/{snapshot_id}")
async def delete(request: web.Request) -> web.Response:
    await request.app[ENGINE].snapshots.delete(request.match_info["snapshot_id"])
    return ok()
