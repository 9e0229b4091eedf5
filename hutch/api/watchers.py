"""A request as a waiter of an execution (service/watchers.py counts them): run its work while
its client stays, and tell the count when the client left first."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiohttp import web

from hutch.api.keys import STILL_AUTHORIZED
from hutch.core.errors import Unauthorized
from hutch.service.watchers import Watchers

T = TypeVar("T")

# How often held requests' connections are looked at (all of them by one timer: ``_Looks``).
# A client that left is noticed well within the abandon grace (3 s).
_POLL_SECONDS = 0.5


async def hold(watchers: Watchers, request: web.Request, execution_id: str, work: Awaitable[T], *,
               counts: bool) -> tuple[T | None, bool]:
    """Run ``work`` (a long-poll, a stream copy) watching the request's connection; as a
    waiter of ``execution_id`` when it ``counts`` (the caller may act on the sandbox).
    Returns (its result, False), or (None, True) when the client went away first (``work``
    is then cancelled)."""
    if not counts:
        try:
            return await while_client_stays(request, work)
        except ConnectionError:
            return None, True
    watchers.attach(execution_id)
    gone = False
    try:
        result, gone = await while_client_stays(request, work)
        return result, gone
    except asyncio.CancelledError:
        gone = True  # the server cancels a handler whose client disconnected
        raise
    except ConnectionError:
        gone = True  # the copy to a client that left failed
        return None, True
    finally:
        watchers.detach(execution_id, abandoned=gone and _may_still_act(request))


def _may_still_act(request: web.Request) -> bool:
    """Whether the key that waited still lives: one revoked (or expired) meanwhile cancels
    nothing by leaving, as it could not by asking."""
    if (still := request.get(STILL_AUTHORIZED)) is None:
        return True
    try:
        still()
    except Unauthorized:
        return False
    return True


class _Looks:
    """One look every ``_POLL_SECONDS`` at the connection of every request held in this event
    loop, by one timer for them all. A timer of each held request's own (``asyncio.wait`` with
    a timeout, every 0.2 s) cost the server 11% of a core for 1,000 long-polls doing nothing:
    a tenant could spend the server's CPU by holding requests."""

    def __init__(self) -> None:
        self.held: dict[asyncio.Future[Any], web.Request] = {}
        self.gone: set[asyncio.Future[Any]] = set()
        self._timer: asyncio.Task[None] | None = None

    def add(self, task: asyncio.Future[Any], request: web.Request) -> None:
        self.held[task] = request
        if self._timer is None or self._timer.done():
            self._timer = asyncio.ensure_future(self._look())

    def discard(self, task: asyncio.Future[Any]) -> None:
        self.held.pop(task, None)
        self.gone.discard(task)

    async def _look(self) -> None:
        while self.held:
            await asyncio.sleep(_POLL_SECONDS)
            for task, request in list(self.held.items()):
                transport = request.transport
                if not task.done() and (transport is None or transport.is_closing()):
                    self.gone.add(task)
                    task.cancel()


_LOOKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Looks] = weakref.WeakKeyDictionary()


async def while_client_stays(request: web.Request, work: Awaitable[T]) -> tuple[T | None, bool]:
    """Run ``work``, looking at the request's connection every ``_POLL_SECONDS`` (aiohttp does
    not cancel a handler whose client left, and a long-poll or a quiet stream writes nothing
    that would fail). Returns (its result, False), or (None, True) when the client went away
    first or ``work`` was cancelled; ``work`` is then cancelled. Its own errors are raised."""
    task = asyncio.ensure_future(work)
    looks = _LOOKS.setdefault(asyncio.get_running_loop(), _Looks())
    looks.add(task, request)
    try:
        try:
            return await task, False
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if task.cancelled() and (task in looks.gone or me is None or not me.cancelling()):
                return None, True  # the client left (or the work was cancelled on its own)
            raise  # this handler is being cancelled (the server stops)
    finally:
        looks.discard(task)
        if not task.done():
            task.cancel()
