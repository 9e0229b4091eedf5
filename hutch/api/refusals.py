"""A long read ends when the key that opened it may no longer read.

A request is judged when it starts; a read can then last as long as its client likes: a
download of a large file read slowly, a long-poll, a feed. Without this, a key revoked or
expired (or a Web App session signed out) went on receiving what such a read had left to
send. ``end_when_refused`` (a middleware of the API and of the E2B wire) watches every GET
that lasts more than ``WATCH_AFTER`` seconds and carries ``STILL_AUTHORIZED``, through
``Tenants.until_refused`` (asked again at every tenancy change and at the key's expiry):

- an answer not yet begun (a long-poll) becomes a 401 naming why;
- an answer under way is cut: the connection is reset (a TCP reset, so what the server
  still held unsent is dropped rather than delivered) and the handler is cancelled, so the
  client sees an incomplete answer, never one that looks whole.

Only reads: a mutation that outlives its key did what it did (its own handler refuses a body
that arrives after the key ended, api/http.py), and a 401 afterwards would say it had not.
E2B's Connect streams are POSTs that ask before each message they send, and end with
``unauthenticated`` (api/e2b/envd_routes.py). GETs that end themselves more politely set
``ENDS_WHEN_REFUSED``: a terminal tells why, the Web App's live feed ends cleanly (a cut one
its EventSource would retry at once). Keyless reads (stream URLs, the audit stream: the URL
is the capability) carry no key to lose and are not watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable

from aiohttp import web

from hutch.api.keys import STILL_AUTHORIZED, TENANTS
from hutch.core.errors import Unauthorized

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# How long a request runs before it is watched. A watch is a task per request; most requests
# are done long before this, and cost one timer. A key revoked within it is caught when the
# watch starts (it asks at once): the delay is this at most, plus the revocation's way through
# the log.
WATCH_AFTER = 0.5
ENDS_WHEN_REFUSED: web.RequestKey[bool] = web.RequestKey("ends_when_refused", bool)
_PREPARED: web.RequestKey[bool] = web.RequestKey("answer_begun", bool)
_WATCHED = frozenset({"GET", "HEAD"})


class _Watch:
    def __init__(self, request: web.Request, task: asyncio.Task[object]) -> None:
        self.refused: str | None = None
        self._request, self._task = request, task
        self._watcher: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(WATCH_AFTER, self._start)

    def _start(self) -> None:
        check = self._request.get(STILL_AUTHORIZED)  # set by the auth in front of the handler
        if check is None or self._request.get(ENDS_WHEN_REFUSED):
            return
        self._watcher = asyncio.ensure_future(self._watch(check))

    async def _watch(self, check: Callable[[], str | None]) -> None:
        self.refused = await self._request.app[TENANTS].until_refused(check)
        if self.begun:
            reset(self._request)  # before anything else is written: not one more byte
        self._task.cancel()

    @property
    def begun(self) -> bool:
        return bool(self._request.get(_PREPARED))

    def stop(self) -> None:
        self._timer.cancel()
        if self._watcher is not None:
            self._watcher.cancel()


def reset(request: web.Request) -> None:
    """Close the connection with a TCP reset: unsent data is dropped, not flushed."""
    transport = request.transport
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


@web.middleware
async def end_when_refused(request: web.Request, handler: Handler) -> web.StreamResponse:
    task = asyncio.current_task()
    if request.method not in _WATCHED or task is None:
        return await handler(request)
    watch = _Watch(request, task)
    try:
        resp = await handler(request)
    except asyncio.CancelledError:
        if watch.refused is None or task.uncancel() > 0:
            raise  # not ours (the client left, the server stops)
        if watch.begun:
            raise ConnectionResetError(watch.refused) from None  # aiohttp: the connection is gone
        raise Unauthorized(watch.refused) from None
    finally:
        watch.stop()
    if watch.refused is not None:  # the handler swallowed the cancellation: the same ending
        if watch.begun:
            raise ConnectionResetError(watch.refused)
        raise Unauthorized(watch.refused)
    return resp


async def mark_begun(request: web.Request, _response: web.StreamResponse) -> None:
    """``on_response_prepare``: the answer's head is on its way; a refusal now cuts it."""
    request[_PREPARED] = True


def install(app: web.Application) -> None:
    """What ``end_when_refused`` needs of the app it is a middleware of."""
    app.on_response_prepare.append(mark_begun)
