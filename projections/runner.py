"""The projector: tails the log into a store, and lets writers wait for their own
writes to be visible (read-your-writes) without polling."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from core.eventlog.base import EventLog
from core.events import Event
from projections.base import ProjectionStore

log = logging.getLogger(__name__)


class Projector:
    def __init__(self, log_: EventLog, store: ProjectionStore) -> None:
        self.log = log_
        self.store = store
        self._task: asyncio.Task[None] | None = None
        self._position = 0
        self._advanced = asyncio.Condition()
        self._listeners: list[asyncio.Queue[Event]] = []

    async def start(self) -> None:
        """Catch up with the whole log before returning, then follow it in the background."""
        self._position = await self.store.position()
        backlog = await self.log.read(self._position)
        if backlog:
            await self.store.apply(backlog)
            self._position = backlog[-1].position or self._position
        self._task = asyncio.create_task(self._follow(), name="projector")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def position(self) -> int:
        return self._position

    async def _follow(self) -> None:
        while True:
            try:
                async for event in self.log.subscribe(self._position):
                    await self.store.apply([event])
                    self._position = event.position or self._position
                    for q in self._listeners:
                        q.put_nowait(event)
                    async with self._advanced:
                        self._advanced.notify_all()
            except asyncio.CancelledError:
                raise
            except Exception:  # the log or store hiccuped: resume from the tracked position
                log.exception("projector failed; retrying from position %d", self._position)
                await asyncio.sleep(0.5)

    async def wait_for(self, position: int, timeout: float = 30.0) -> None:
        """Return once everything up to ``position`` is applied to the store."""
        if self._position >= position:
            return
        async with asyncio.timeout(timeout), self._advanced:
            await self._advanced.wait_for(lambda: self._position >= position)

    def listen(self) -> asyncio.Queue[Event]:
        """A queue of every event applied from now on (for waiters such as ?wait= long-polls)."""
        q: asyncio.Queue[Event] = asyncio.Queue()
        self._listeners.append(q)
        return q

    def unlisten(self, q: asyncio.Queue[Event]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(q)
