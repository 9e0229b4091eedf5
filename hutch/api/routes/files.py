"""/fs/…: files in a sandbox, and PATCH /sandbox/env/{id}.

Every path is resolved by the driver inside the sandbox's own view, as the sandbox
user; relative paths resolve to the workspace. Reads, downloads and uploads stream.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import stat
from collections.abc import AsyncIterator
from typing import IO, Any

from aiohttp import web

from hutch.api.http import json_body, ok, q_choice, stream
from hutch.api.keys import CONFIG, ENGINE, PRINCIPAL, TENANTS
from hutch.api.parse import parse_env, parse_files
from hutch.core.driver_types import FileInfo
from hutch.core.errors import InvalidInput
from hutch.service import archives
from hutch.service.spool_room import Spooled

routes = web.RouteTableDef()

_CONTENT_TYPES = {"tar.gz": "application/gzip", "tar": "application/x-tar", "zip": "application/zip"}


def _path(value: object, field: str = "path", *, default: str | None = None) -> str:
    if value is None or value == "":
        if default is not None:
            return default
        raise InvalidInput(f"{field}: required", field=field)
    if not isinstance(value, str):
        raise InvalidInput(f"{field}: expected a string", field=field)
    if "\x00" in value or len(value) > 4096:
        raise InvalidInput(f"{field}: not a usable path", field=field)
    return value


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:  # left out or null, as every other optional field
        return False
    if not isinstance(value, bool):
        raise InvalidInput(f"{key}: expected true or false", field=key)
    return value


async def _sandbox(request: web.Request) -> str:
    sandbox_id = request.match_info["sandbox_id"]
    await request.app[ENGINE].files.ready(sandbox_id)
    return sandbox_id


@routes.post("/fs/mkdir/{sandbox_id}")
async def mkdir(request: web.Request) -> web.Response:
    body = await json_body(request)
    sid = await _sandbox(request)
    await request.app[ENGINE].files.mkdir(sid, _path(body.get("path")), parents=_flag(body, "recursive"))
    return ok()


@routes.post("/fs/rm/{sandbox_id}")
async def rm_file(request: web.Request) -> web.Response:
    body = await json_body(request)
    sid = await _sandbox(request)
    found = await request.app[ENGINE].files.remove(sid, _path(body.get("path")), directory=False, recursive=False)
    return ok(top={"found": found})


@routes.post("/fs/rmdir/{sandbox_id}")
async def rm_dir(request: web.Request) -> web.Response:
    body = await json_body(request)
    sid = await _sandbox(request)
    found = await request.app[ENGINE].files.remove(
        sid, _path(body.get("path")), directory=True, recursive=_flag(body, "recursive")
    )
    return ok(top={"found": found})


@routes.get("/fs/list/{sandbox_id}")
async def list_files(request: web.Request) -> web.Response:
    sid = await _sandbox(request)
    entries = await request.app[ENGINE].files.list(sid, _path(request.query.get("path"), default="."))
    # Rendered in a thread: a listing may hold core.limits.LIST_ENTRIES entries (30 MB of JSON),
    # over a second of the event loop, every tenant's requests waiting behind it.
    body = await asyncio.to_thread(_listing, entries)
    return web.Response(body=body, content_type="application/json", charset="utf-8")


def _listing(entries: list[FileInfo]) -> bytes:
    files = [
        {
            "path": e.name,
            "size": e.size,
            "isDir": e.is_dir,
            "isSymlink": e.is_symlink,
            **({"linkTarget": e.link_target} if e.link_target is not None else {}),
            "mode": f"{stat.S_IMODE(e.mode):04o}",
            "modTime": dt.datetime.fromtimestamp(e.mod_time, dt.UTC).isoformat().replace("+00:00", "Z"),
        }
        for e in entries
    ]
    return json.dumps({"success": True, "data": {"files": files}}).encode()


@routes.get("/fs/download/{sandbox_id}")
async def download(request: web.Request) -> web.StreamResponse:
    fmt = q_choice(request, "format", archives.FORMATS, "tar.gz") or "tar.gz"
    sid = await _sandbox(request)
    root = _path(request.query.get("path"), default=".")
    chunks = await request.app[ENGINE].files.archive(sid, root, fmt)  # a missing path: 404 before any byte
    name = f"{sid}.{fmt}"
    return await stream(request, chunks, _CONTENT_TYPES[fmt], headers={"Content-Disposition": f'attachment; filename="{name}"'})


@routes.post("/fs/upload/{sandbox_id}")
async def upload(request: web.Request) -> web.Response:
    fmt = q_choice(request, "format", (*archives.FORMATS, "tgz", "tar+gzip"))
    fmt = "tar.gz" if fmt in ("tgz", "tar+gzip") else fmt
    sid = await _sandbox(request)
    config = request.app[CONFIG]
    dest = _path(request.query.get("path"), default=".")
    files = request.app[ENGINE].files
    async with files.spooling(sid) as room:  # the organization's spooled transfers, together bounded
        room.grow_to(min(request.content_length or 0, config.max_upload_bytes))  # refused before a byte
        spooled = await archives.spool(_counted(request.content.iter_chunked(256 * 1024), room,
                                                config.max_upload_bytes),
                                       config.max_upload_bytes, room.directory)
        return await _unpack(request, sid, dest, fmt, spooled)


async def _counted(chunks: AsyncIterator[bytes], room: Spooled, most: int) -> AsyncIterator[bytes]:
    """The body's chunks, each counted in the room as it arrives (past ``most`` the spool
    itself refuses the upload, 413: one too large is that, not one too many)."""
    got = 0
    async for chunk in chunks:
        got += len(chunk)
        room.grow_to(min(got, most))
        yield chunk


async def _unpack(request: web.Request, sid: str, dest: str, fmt: str | None, spooled: IO[bytes]) -> web.Response:
    config = request.app[CONFIG]
    with spooled:
        # The body may take as long as its sender likes: a key revoked (or expired) meanwhile
        # unpacks nothing (Unauthorized, a 401 naming why).
        request.app[TENANTS].key_expiry(request[PRINCIPAL].key_id)
        done = await request.app[ENGINE].files.extract(
            sid, dest, fmt, spooled,
            archives.Limits(max_bytes=config.max_upload_bytes, max_entries=config.max_archive_entries),
        )
    return ok({"files": done.files, "directories": done.directories, "symlinks": done.symlinks, "bytes": done.bytes})


@routes.post("/fs/{sandbox_id}")
async def write_files(request: web.Request) -> web.Response:
    body = await json_body(request)
    files = parse_files(body.get("files"), "files")
    sid = await _sandbox(request)
    for f in files:
        await request.app[ENGINE].files.write(sid, f.path, _once(f.content), mode=f.mode, parents=True)
    return ok({"filesWritten": len(files)}, top={"filesWritten": len(files)})


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


@routes.get("/fs/{sandbox_id}")
async def read_file(request: web.Request) -> web.StreamResponse:
    sid = await _sandbox(request)
    path = _path(request.query.get("path"))
    return await stream(request, request.app[ENGINE].files.read(sid, path), "application/octet-stream")


@routes.patch("/sandbox/env/{sandbox_id}")
async def set_env(request: web.Request) -> web.Response:
    body = await json_body(request)
    if not isinstance(body.get("env"), dict):
        raise InvalidInput("env: expected an object of string (set) or null (delete) values", field="env")
    changes = parse_env(body["env"], "env", allow_null=True)
    env = await request.app[ENGINE].control.set_env(request.match_info["sandbox_id"], changes)
    return ok({"env": env})
