"""File primitives and tar streams, bodies streamed both ways (never held whole)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from hutch.core.serde import converter
from hutch.node.keys import DRIVER, STREAMED

log = logging.getLogger(__name__)

CHUNK = 64 << 10


async def _streamed(request: web.Request, chunks: AsyncIterator[bytes], content_type: str) -> web.StreamResponse:
    """Pulls the first chunk before answering, so a missing path is a 404 before any byte."""
    try:
        first: bytes | None = await chunks.__anext__()
    except StopAsyncIteration:
        first = None
    resp = web.StreamResponse(headers={"Content-Type": content_type})
    await resp.prepare(request)
    try:
        if first is not None:
            await resp.write(first)
            async for chunk in chunks:
                await resp.write(chunk)
        await resp.write_eof()
    except Exception as err:  # past the status line: the only way left to say so is a cut stream
        log.warning("node agent: %s %s broke off: %s", request.method, request.path, err)
        if request.transport is not None:
            request.transport.close()
    finally:
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]  # async generators have it
    return resp


async def _body(request: web.Request) -> AsyncIterator[bytes]:
    async for chunk in request.content.iter_chunked(CHUNK):
        yield chunk


async def read_file(request: web.Request) -> web.StreamResponse:
    chunks = request.app[DRIVER].read_file(request.match_info["id"], request.query["path"])
    return await _streamed(request, chunks, "application/octet-stream")


async def write_file(request: web.Request) -> web.Response:
    q = request.query
    written = await request.app[DRIVER].write_file(request.match_info["id"], q["path"], _body(request),
                                                   mode=int(q.get("mode", "420")), parents=q.get("parents") == "1")
    return web.json_response({"written": written})


async def list_files(request: web.Request) -> web.Response:
    entries = await request.app[DRIVER].list_files(request.match_info["id"], request.query["path"])
    return web.json_response({"entries": [converter.unstructure(e) for e in entries]})


async def mkdir(request: web.Request) -> web.Response:
    body = await request.json()
    await request.app[DRIVER].mkdir(request.match_info["id"], str(body["path"]), parents=bool(body["parents"]))
    return web.json_response({"ok": True})


async def remove(request: web.Request) -> web.Response:
    body = await request.json()
    existed = await request.app[DRIVER].remove(request.match_info["id"], str(body["path"]),
                                               directory=bool(body["directory"]), recursive=bool(body["recursive"]))
    return web.json_response({"existed": existed})


async def symlink(request: web.Request) -> web.Response:
    body = await request.json()
    await request.app[DRIVER].symlink(request.match_info["id"], str(body["path"]), str(body["target"]))
    return web.json_response({"ok": True})


async def rename(request: web.Request) -> web.Response:
    body = await request.json()
    await request.app[DRIVER].rename(request.match_info["id"], str(body["source"]), str(body["destination"]))
    return web.json_response({"ok": True})


async def set_metadata(request: web.Request) -> web.Response:
    body = await request.json()
    metadata = {str(k): str(v) for k, v in dict(body["metadata"]).items()}
    await request.app[DRIVER].set_metadata(request.match_info["id"], str(body["path"]), metadata)
    return web.json_response({"ok": True})


async def export_tar(request: web.Request) -> web.StreamResponse:
    chunks = request.app[DRIVER].export_tar(request.match_info["id"], request.query["path"])
    return await _streamed(request, chunks, "application/x-tar")


async def import_tar(request: web.Request) -> web.Response:
    q = request.query
    await request.app[DRIVER].import_tar(request.match_info["id"], q["dest"], _body(request), gzipped=q.get("gzip") == "1")
    return web.json_response({"ok": True})


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/v1/sandboxes/{id}/file", read_file)
    r.add_put("/v1/sandboxes/{id}/file", write_file, name=STREAMED + "file")
    r.add_get("/v1/sandboxes/{id}/list", list_files)
    r.add_post("/v1/sandboxes/{id}/mkdir", mkdir)
    r.add_post("/v1/sandboxes/{id}/remove", remove)
    r.add_post("/v1/sandboxes/{id}/symlink", symlink)
    r.add_post("/v1/sandboxes/{id}/rename", rename)
    r.add_post("/v1/sandboxes/{id}/metadata", set_metadata)
    r.add_get("/v1/sandboxes/{id}/tar", export_tar)
    r.add_put("/v1/sandboxes/{id}/tar", import_tar, name=STREAMED + "tar")
