"""envd's directory watches over Connect: WatchDir (the events as a server stream) and the
polled kind (CreateWatcher, GetWatcherEvents, RemoveWatcher), on the driver's watch of the
directory (inotify inside the sandbox on the local driver; drivers/roles.py DirectoryWatching).

Bounded: at most MAX_PER_SANDBOX watchers (streams included) per sandbox, past it
resource_exhausted; a watcher's events wait in the driver's pipe and the kernel's queue, and
one that falls behind that far ends with an error saying events were lost. A watcher ends
with its directory or its sandbox; GetWatcherEvents then answers not_found saying so."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import secrets
from collections.abc import AsyncIterator
from typing import Any

import attrs
from aiohttp import web

from hutch.api.e2b import codec, connect
from hutch.api.e2b import filesystem_messages as msg
from hutch.api.e2b.access import SANDBOX_KEY, envd, still_valid
from hutch.api.e2b.files_routes import entry_at, path_of
from hutch.api.keys import ENGINE
from hutch.core.driver_types import DirWatch, WatchEnded, WatchEvent
from hutch.core.errors import HutchError, InvalidInput, NotFound

log = logging.getLogger("hutch.api.e2b")
routes = web.RouteTableDef()
MAX_PER_SANDBOX = 16
KEEPALIVE_DEFAULT = 50.0  # seconds between keep-alives on a quiet stream
FLUSH_SECONDS = 30.0  # a GetWatcherEvents waits this long for the sandbox's side of the watch
_TYPES = {"create": "EVENT_TYPE_CREATE", "write": "EVENT_TYPE_WRITE", "remove": "EVENT_TYPE_REMOVE",
          "rename": "EVENT_TYPE_RENAME", "chmod": "EVENT_TYPE_CHMOD"}


@attrs.frozen
class DirWatcher:
    sandbox_id: str
    path: str  # absolute, as the event entries' paths start
    include_entry: bool
    watch: DirWatch = attrs.field(eq=False)


class DirWatchers:
    """The open watchers of this server, by id (a random token: an id names one sandbox's)."""

    def __init__(self) -> None:
        self._by_id: dict[str, DirWatcher] = {}

    async def _prune(self) -> None:
        for watcher_id, w in list(self._by_id.items()):
            if w.watch.ended:
                await self.remove(w.sandbox_id, watcher_id)

    async def add(self, watcher: DirWatcher) -> str:
        await self._prune()
        if sum(w.sandbox_id == watcher.sandbox_id for w in self._by_id.values()) >= MAX_PER_SANDBOX:
            await watcher.watch.close()
            raise connect.RpcError("resource_exhausted", f"sandbox {watcher.sandbox_id} has {MAX_PER_SANDBOX} "
                                   "directory watchers already; remove one first")
        watcher_id = secrets.token_urlsafe(12)
        self._by_id[watcher_id] = watcher
        return watcher_id

    def get(self, sandbox_id: str, watcher_id: str) -> DirWatcher:
        w = self._by_id.get(watcher_id)
        if w is None or w.sandbox_id != sandbox_id:
            raise connect.RpcError("not_found", f"watcher {watcher_id!r} not found in sandbox {sandbox_id}")
        return w

    async def remove(self, sandbox_id: str, watcher_id: str) -> None:
        w = self.get(sandbox_id, watcher_id)
        del self._by_id[watcher_id]
        await w.watch.close()

    async def close_all(self) -> None:
        for watcher_id, w in list(self._by_id.items()):
            await self.remove(w.sandbox_id, watcher_id)


WATCHERS: web.AppKey[DirWatchers] = web.AppKey("e2b_watchers", DirWatchers)


async def watchers_ctx(app: web.Application) -> AsyncIterator[None]:
    app[WATCHERS] = DirWatchers()
    yield
    await app[WATCHERS].close_all()


async def _call(request: web.Request, schema: codec.Schema) -> tuple[connect.Call, dict[str, Any]]:
    call = await connect.read_request(request)
    return call, codec.decode(schema, call.message, call.is_json)


async def _open(request: web.Request, req: dict[str, Any]) -> tuple[str, DirWatcher]:
    """Watching has begun when this returns: a change made after it is never missed."""
    engine, sandbox_id = request.app[ENGINE], request[SANDBOX_KEY]
    path = await path_of(request, req.get("path"))
    await engine.files.ready(sandbox_id)
    watch = await engine.files.watch(sandbox_id, path, recursive=bool(req.get("recursive")))
    watcher = DirWatcher(sandbox_id, path, bool(req.get("include_entry")), watch)
    return await request.app[WATCHERS].add(watcher), watcher


async def _events(request: web.Request, watcher: DirWatcher, events: list[WatchEvent]) -> list[dict[str, Any]]:
    """envd's FilesystemEvents; with include_entry, the entry of each path that still exists."""
    out = []
    for e in events:
        event: dict[str, Any] = {"name": e.name, "type": _TYPES[e.kind]}
        if watcher.include_entry and e.name:
            with contextlib.suppress(NotFound, InvalidInput):  # gone since: no entry, as envd does
                event["entry"] = await entry_at(request, posixpath.join(watcher.path, e.name))
        out.append(event)
    return out


@routes.post("/filesystem.Filesystem/CreateWatcher")
@envd
async def create_watcher(request: web.Request) -> web.Response:
    call, req = await _call(request, msg.WATCH_REQUEST)
    watcher_id, _ = await _open(request, req)
    return connect.unary(codec.encode(msg.WATCHER_ID, {"watcher_id": watcher_id}, call.is_json), call.is_json)


def _watcher_id(req: dict[str, Any]) -> str:
    value = req.get("watcher_id")
    if not value:
        raise InvalidInput("watcher_id: required, as CreateWatcher answered it", field="watcher_id")
    return str(value)


@routes.post("/filesystem.Filesystem/GetWatcherEvents")
@envd
async def get_watcher_events(request: web.Request) -> web.Response:
    """Every event since the last call, of changes made before this one."""
    call, req = await _call(request, msg.WATCHER_ID)
    watcher_id, sandbox_id = _watcher_id(req), request[SANDBOX_KEY]
    watchers = request.app[WATCHERS]
    watcher = watchers.get(sandbox_id, watcher_id)
    await request.app[ENGINE].files.ready(sandbox_id)  # a paused sandbox's watcher is frozen with it: wake it
    try:
        async with asyncio.timeout(FLUSH_SECONDS):
            events = await watcher.watch.flush()
    except TimeoutError:
        raise connect.RpcError("deadline_exceeded", f"watcher {watcher_id!r}: the sandbox did not hand over its "
                               f"events within {FLUSH_SECONDS:g} s; ask again") from None
    except WatchEnded as ended:
        with contextlib.suppress(connect.RpcError):
            await watchers.remove(sandbox_id, watcher_id)
        raise connect.RpcError("not_found", f"watcher {watcher_id!r}: {ended}") from None
    except HutchError:
        with contextlib.suppress(connect.RpcError):
            await watchers.remove(sandbox_id, watcher_id)
        raise
    body = {"events": await _events(request, watcher, events)}
    return connect.unary(codec.encode(msg.WATCHER_EVENTS, body, call.is_json), call.is_json)


@routes.post("/filesystem.Filesystem/RemoveWatcher")
@envd
async def remove_watcher(request: web.Request) -> web.Response:
    call, req = await _call(request, msg.WATCHER_ID)
    await request.app[WATCHERS].remove(request[SANDBOX_KEY], _watcher_id(req))
    return connect.unary(codec.encode(msg.EMPTY, {}, call.is_json), call.is_json)


def _keepalive_interval(request: web.Request) -> float:
    with contextlib.suppress(ValueError):
        return max(1.0, float(request.headers.get("Keepalive-Ping-Interval", KEEPALIVE_DEFAULT)))
    return KEEPALIVE_DEFAULT


@routes.post("/filesystem.Filesystem/WatchDir")
@envd
async def watch_dir(request: web.Request) -> web.StreamResponse:
    """A start event once watching has begun, then each event as it comes, keep-alives on a
    quiet stream; the stream ends with the watch (an error naming why) or the client."""
    call, req = await _call(request, msg.WATCH_REQUEST)
    if not call.streaming:
        raise InvalidInput("WatchDir is a server stream: send application/connect+json or +proto",
                           field="Content-Type")
    watcher_id, watcher = await _open(request, req)  # an error before the stream is a unary-style answer
    interval = _keepalive_interval(request)

    async def send(**event: Any) -> None:
        still_valid(request)  # Unauthorized ends the stream: nothing more told to a revoked key
        await response.write(connect.envelope(codec.encode(msg.WATCH_DIR_RESPONSE, event, call.is_json)))

    try:
        response = await connect.open_stream(request, call.is_json)
        await send(start={})
        while True:
            try:
                async with asyncio.timeout(interval):
                    events = await watcher.watch.next()
            except TimeoutError:
                await send(keepalive={})
                continue
            request.app[ENGINE].files.touch(watcher.sandbox_id)
            for event in await _events(request, watcher, events):
                await send(filesystem=event)
    except ConnectionResetError:
        pass  # the client left
    except Exception as err:
        if not isinstance(err, HutchError | WatchEnded | connect.RpcError):
            log.exception("the watch stream of %s failed", watcher.path)
        if isinstance(err, WatchEnded):
            err = connect.RpcError("not_found", str(err))
        with contextlib.suppress(ConnectionResetError, NameError):
            await connect.end_stream(response, err)
    finally:
        with contextlib.suppress(connect.RpcError):
            await request.app[WATCHERS].remove(watcher.sandbox_id, watcher_id)
    return response
