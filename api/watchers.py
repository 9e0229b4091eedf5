"""Who waits for an execution, so that a command whose waiters all left can end.

The seeds' "Cancelling Commands" example aborts a command with an ``AbortSignal``; the real
client then only drops its connections: the long-poll for the execution and the output
streams it reads. The user means "stop it". So a waiter — a long-poll
(``GET /sandbox/execution/{id}?wait=…``) or a stream read of a command still running —
that disconnects before its answer is complete counts as abandoning the command, and when
no waiter is left the command is cancelled after a grace period (``HUTCH_ABANDON_GRACE``,
default 3 s).

Only a waiter that may act on the sandbox counts — one whose request, as it started, carried
a key allowed to write there (a member's or an admin's, within its projects). A read-only
key's long-poll and a keyless reader of a stream URL (a read capability, anyone's who has
the URL) are readers: they neither cancel the command by leaving nor keep it by staying.
Otherwise a read-only key, or anyone shown an output URL, could cancel other people's work. Any waiter that attaches within the grace keeps it running: a client that
merely lost its connection and comes back (the SDKs retry, the real client loops its
long-poll) loses nothing. Commands nobody ever waited for (fire and forget) and jobs
(which outlive their request by design) are never cancelled this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")

GRACE_SECONDS = float(os.environ.get("HUTCH_ABANDON_GRACE", "3"))
# How often held requests' connections are looked at (all of them by one timer: ``_Looks``).
# A client that left is noticed well within the abandon grace (3 s).
_POLL_SECONDS = 0.5


class Watchers:
    def __init__(self, abandon: Callable[[str], Awaitable[object]], grace: float = GRACE_SECONDS) -> None:
        self._abandon = abandon  # cancels the execution (if it is still an exec that runs)
        self.grace = grace
        self._count: dict[str, int] = {}
        self._pending: dict[str, asyncio.Task[None]] = {}

    def close(self) -> None:
        for pending in self._pending.values():
            pending.cancel()
        self._pending.clear()

    def waiting(self, execution_id: str) -> int:
        return self._count.get(execution_id, 0)

    def attach(self, execution_id: str) -> None:
        self._count[execution_id] = self._count.get(execution_id, 0) + 1
        pending = self._pending.pop(execution_id, None)
        if pending is not None:
            pending.cancel()  # came back within the grace: keeps the command

    def detach(self, execution_id: str, *, abandoned: bool) -> None:
        left = self._count.get(execution_id, 1) - 1
        if left > 0:
            self._count[execution_id] = left
            return
        self._count.pop(execution_id, None)
        if abandoned and execution_id not in self._pending:
            self._pending[execution_id] = asyncio.create_task(self._after_grace(execution_id))

    async def _after_grace(self, execution_id: str) -> None:
        try:
            await asyncio.sleep(self.grace)
        except asyncio.CancelledError:
            return
        self._pending.pop(execution_id, None)
        with contextlib.suppress(Exception):
            await self._abandon(execution_id)

    async def hold(self, request: web.Request, execution_id: str, work: Awaitable[T], *,
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
        self.attach(execution_id)
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
            self.detach(execution_id, abandoned=gone)


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
