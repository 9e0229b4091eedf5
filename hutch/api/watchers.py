"""A request as a waiter of an execution (service/watchers.py counts them): run its work while
its client stays, and tell the count when the client left first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from aiohttp import web

from hutch.service.watchers import Watchers

T = TypeVar("T")

_POLL_SECONDS = 0.2  # how often a held request looks at its connection


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
        watchers.detach(execution_id, abandoned=gone)


async def while_client_stays(request: web.Request, work: Awaitable[T]) -> tuple[T | None, bool]:
    """Run ``work``, looking at the request's connection every ``_POLL_SECONDS`` (aiohttp does
    not cancel a handler whose client left, and a long-poll or a quiet stream writes nothing
    that would fail). Returns (its result, False), or (None, True) when the client went away
    first or ``work`` was cancelled; ``work`` is then cancelled. Its own errors are raised."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await asyncio.wait([task], timeout=_POLL_SECONDS)
            transport = request.transport
            if not task.done() and (transport is None or transport.is_closing()):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                return None, True
        if task.cancelled():
            return None, True
        return task.result(), False
    finally:
        if not task.done():
            task.cancel()
