"""envd's files: its filesystem service over Connect (Stat, MakeDir, ListDir, Move, Remove) and its
HTTP ``/files`` (download, and upload as octet-stream or multipart), on hutch's file access
of the sandbox the request's token opens (api/e2b/access.py). A relative path starts at the
sandbox account's home (/home/user, E2B's, on a driver that can name the account; else
hutch's /home/agentuity), and answers name it absolute."""

from __future__ import annotations

import posixpath
import stat
import string
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import BodyPartReader, web

from hutch.api.e2b import codec, connect
from hutch.api.e2b import filesystem_messages as msg
from hutch.api.e2b.access import SANDBOX_KEY, envd
from hutch.api.e2b.signed import SIGNED
from hutch.api.http import stream
from hutch.api.keys import ENGINE, STILL_AUTHORIZED
from hutch.core.driver_types import FileInfo, home_of
from hutch.core.errors import FileNotFound, InvalidInput, NotFound, NotSupported

routes = web.RouteTableDef()
MAX_DEPTH = 32
MAX_ENTRIES = 10_000  # one ListDir's answer is held whole: a tree larger than this is refused
_HOME_KEY: web.RequestKey[str] = web.RequestKey("e2b_home", str)


async def path_of(request: web.Request, value: object, field: str = "path") -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{field}: required, a path in the sandbox", field=field)
    if "\x00" in value or len(value) > 4096:
        raise InvalidInput(f"{field}: not a usable path", field=field)
    return posixpath.join(await _home(request), value)  # an absolute one stays as it is


async def _home(request: web.Request) -> str:
    """The home of the sandbox's account (E2B's "user": /home/user), where the drivers start a
    relative path too."""
    home = request.get(_HOME_KEY)
    if home is None:
        sb = await request.app[ENGINE].reads.require(request[SANDBOX_KEY])
        home = request[_HOME_KEY] = home_of(sb.spec.user)
    return home


def _entry(info: FileInfo, path: str) -> dict[str, Any]:
    kind = msg.DIRECTORY if info.is_dir else msg.FILE  # of what a symlink points to, as envd says
    return {"name": posixpath.basename(path.rstrip("/")) or "/", "type": kind, "path": path, "size": info.size,
            "mode": stat.S_IMODE(info.mode), "permissions": stat.filemode(info.mode), "owner": info.owner, "group": info.group,
            "modified_time": info.mod_time, "symlink_target": _target(info.link_target, path),
            "metadata": info.metadata or None}


def _target(link: str | None, path: str) -> str | None:
    """A symlink's target as an absolute path, as envd gives it."""
    return None if link is None else posixpath.normpath(posixpath.join(posixpath.dirname(path), link))


async def entry_at(request: web.Request, path: str) -> dict[str, Any]:
    """The entry at ``path``: found in its parent's listing (a listing of a directory is its
    children, not itself)."""
    engine, sandbox_id = request.app[ENGINE], request[SANDBOX_KEY]
    await engine.files.ready(sandbox_id)
    clean = posixpath.normpath(path)
    parent, name = posixpath.split(clean)
    if name in ("", "/", "."):
        return {"name": clean, "type": msg.DIRECTORY, "path": path, "size": 0, "mode": 0o755,
                "permissions": "drwxr-xr-x", "owner": "root", "group": "root"}
    for info in await engine.files.list(sandbox_id, parent or "."):
        if info.name == name:
            return _entry(info, path)
    raise FileNotFound(f"path {path!r} not found in sandbox {sandbox_id}", field="path")


async def _rpc(request: web.Request, schema: codec.Schema) -> tuple[connect.Call, dict[str, Any]]:
    call = await connect.read_request(request)
    if call.streaming:
        raise InvalidInput("this is a unary call: send application/json or application/proto", field="Content-Type")
    return call, codec.decode(schema, call.message, call.is_json)


def _answer(call: connect.Call, schema: codec.Schema, body: dict[str, Any]) -> web.Response:
    return connect.unary(codec.encode(schema, body, call.is_json), call.is_json)


@routes.post("/filesystem.Filesystem/Stat")
@envd
async def stat_entry(request: web.Request) -> web.Response:
    call, req = await _rpc(request, msg.PATH_REQUEST)
    return _answer(call, msg.ENTRY_RESPONSE, {"entry": await entry_at(request, await path_of(request, req.get("path")))})


@routes.post("/filesystem.Filesystem/MakeDir")
@envd
async def make_dir(request: web.Request) -> web.Response:
    """With its parents; a path that exists is already_exists (the SDK's make_dir: False)."""
    call, req = await _rpc(request, msg.PATH_REQUEST)
    path = await path_of(request, req.get("path"))
    try:
        await entry_at(request, path)
    except NotFound:
        pass
    else:
        raise connect.RpcError("already_exists", f"path {path!r} already exists")
    await request.app[ENGINE].files.mkdir(request[SANDBOX_KEY], path, parents=True)
    return _answer(call, msg.ENTRY_RESPONSE, {"entry": await entry_at(request, path)})


@routes.post("/filesystem.Filesystem/ListDir")
@envd
async def list_dir(request: web.Request) -> web.Response:
    call, req = await _rpc(request, msg.LIST_DIR_REQUEST)
    path, depth = await path_of(request, req.get("path")), req.get("depth") or 1
    if not 1 <= depth <= MAX_DEPTH:
        raise InvalidInput(f"depth: expected 1 to {MAX_DEPTH}, got {depth}", field="depth")
    root = await entry_at(request, path)
    if root["type"] != msg.DIRECTORY:
        raise InvalidInput(f"path {path!r} is not a directory", field="path")
    engine, sandbox_id = request.app[ENGINE], request[SANDBOX_KEY]
    entries: list[dict[str, Any]] = []

    async def walk(directory: str, level: int) -> None:
        """In envd's order (Go's WalkDir): each directory's entries by name, a subdirectory's
        own entries right after it."""
        for info in sorted(await engine.files.list(sandbox_id, directory), key=lambda i: i.name):
            entry = _entry(info, posixpath.join(directory, info.name))
            entries.append(entry)
            if len(entries) > MAX_ENTRIES:
                raise connect.RpcError("invalid_argument", f"more than {MAX_ENTRIES} entries below {path!r} "
                                       f"within depth {depth}; list a smaller depth or a narrower path")
            if info.is_dir and not info.is_symlink and level < depth:
                await walk(entry["path"], level + 1)

    await walk(path, 1)
    return _answer(call, msg.LIST_DIR_RESPONSE, {"entries": entries})


@routes.post("/filesystem.Filesystem/Remove")
@envd
async def remove(request: web.Request) -> web.Response:
    call, req = await _rpc(request, msg.PATH_REQUEST)
    path = await path_of(request, req.get("path"))
    try:
        entry = await entry_at(request, path)
    except NotFound:  # gone already: what was asked is so (envd answers the same)
        return _answer(call, msg.EMPTY, {})
    is_dir = entry["type"] == msg.DIRECTORY
    await request.app[ENGINE].files.remove(request[SANDBOX_KEY], path, directory=is_dir, recursive=is_dir)
    return _answer(call, msg.EMPTY, {})


@routes.post("/filesystem.Filesystem/Move")
@envd
async def move(request: web.Request) -> web.Response:
    """rename(2) in the sandbox, the destination's parents made: a missing source is not_found,
    a directory in the destination's place invalid_argument, each naming its path."""
    call, req = await _rpc(request, msg.MOVE_REQUEST)
    source = await path_of(request, req.get("source"), "source")
    destination = await path_of(request, req.get("destination"), "destination")
    engine, sandbox_id = request.app[ENGINE], request[SANDBOX_KEY]
    await engine.files.ready(sandbox_id)
    await engine.files.rename(sandbox_id, source, destination)
    return _answer(call, msg.ENTRY_RESPONSE, {"entry": await entry_at(request, destination)})


@routes.route("*", "/filesystem.Filesystem/{method}")
@envd
async def other(request: web.Request) -> web.Response:
    method = request.match_info["method"]
    raise connect.RpcError("unimplemented", f"filesystem.Filesystem/{method} is not supported by hutch yet "
                           "(docs/e2b.md)")


# ------------------------------------------------------------------ HTTP /files


_META_PREFIX = "x-metadata-"
_TOKEN = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~")
MAX_METADATA = 32  # pairs a file may carry
MAX_METADATA_KEY, MAX_METADATA_VALUE = 128, 1024  # within what the sandbox's xattrs hold


def _metadata(request: web.Request, keeps: bool) -> dict[str, str]:
    """The upload's ``X-Metadata-<key>`` headers as the files' metadata (keys lowercased, as
    envd does), checked before anything is written."""
    meta: dict[str, str] = {}
    for header, value in request.headers.items():
        if not header.lower().startswith(_META_PREFIX):
            continue
        if not keeps:
            raise NotSupported(f"{header}: this server's driver cannot keep file metadata", field=header)
        key = header[len(_META_PREFIX):].lower()
        if not key or len(key) > MAX_METADATA_KEY or not set(key) <= _TOKEN:
            raise InvalidInput(f"{header}: a metadata key is 1 to {MAX_METADATA_KEY} HTTP token characters",
                               field=header)
        if len(value) > MAX_METADATA_VALUE or not all(" " <= c <= "~" for c in value):
            raise InvalidInput(f"{header}: a metadata value is up to {MAX_METADATA_VALUE} printable ASCII "
                               "characters", field=header)
        meta[key] = value
    if len(meta) > MAX_METADATA:
        raise InvalidInput(f"X-Metadata-*: at most {MAX_METADATA} pairs a file, got {len(meta)}", field="X-Metadata-*")
    return meta


@routes.get("/files")
@envd
async def download(request: web.Request) -> web.StreamResponse:
    engine, sandbox_id = request.app[ENGINE], request[SANDBOX_KEY]
    path = await path_of(request, request.query.get("path"))
    await engine.files.ready(sandbox_id)
    return await stream(request, engine.files.read(sandbox_id, path), "application/octet-stream")


async def _body_chunks(request: web.Request) -> AsyncIterator[bytes]:
    # A gzip upload (Content-Encoding: gzip) arrives inflated: aiohttp decodes the body.
    async for chunk in request.content.iter_chunked(2**16):
        request[STILL_AUTHORIZED]()  # an upload lasts as long as its sender likes: none after its key ended
        yield chunk


async def _part_chunks(request: web.Request, part: BodyPartReader) -> AsyncIterator[bytes]:
    while chunk := await part.read_chunk(2**16):
        request[STILL_AUTHORIZED]()
        yield chunk


@routes.post("/files")
@envd
async def upload(request: web.Request) -> web.Response:
    """One file (octet-stream, at ``path``) or several (multipart: each part's file name is its
    path, or ``path`` for a single part); parents are made. Answers what was written."""
    engine, sandbox_id = request.app[ENGINE], request[SANDBOX_KEY]
    keeps = engine.files.keeps_metadata
    meta = _metadata(request, keeps)
    await engine.files.ready(sandbox_id)
    written: list[str] = []
    # A signed URL (upload_url) signs one path: without it, a multipart body's parts would
    # write wherever their names say, past what the URL's maker granted.
    signed = request.get(SIGNED, False)
    if signed and not request.query.get("path"):
        raise InvalidInput("path: this signed upload URL names no file; sign one with upload_url(path)", field="path")
    if request.content_type == "multipart/form-data":
        reader = await request.multipart()
        given = request.query.get("path")
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise InvalidInput("body: nested multipart is not supported", field="body")
            if signed and written:
                raise InvalidInput(f"body: a signed upload URL writes the one file it signed ({written[0]}, "
                                   f"written); the part named {part.filename!r} is refused", field="body")
            path = await path_of(request, given if given and not written else part.filename, "file name")
            await engine.files.write(sandbox_id, path, _part_chunks(request, part), parents=True)
            if keeps:  # an overwrite keeps none of the old file's metadata, as envd's
                await engine.files.set_metadata(sandbox_id, path, meta)
            written.append(path)
    else:
        path = await path_of(request, request.query.get("path"))
        await engine.files.write(sandbox_id, path, _body_chunks(request), parents=True)
        if keeps:
            await engine.files.set_metadata(sandbox_id, path, meta)
        written.append(path)
    if not written:
        raise InvalidInput("body: no file in the upload", field="body")
    return web.json_response([{"name": posixpath.basename(p), "type": "file", "path": p, "metadata": meta or None}
                              for p in written])
