"""Following what happens: the projector's change notices, and a sandbox's events from the
log and then as they are projected (the audit stream, the Web App's live view)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence

from hutch.core.errors import NotFound
from hutch.core.eventlog.base import EventLog
from hutch.core.events import Event
from hutch.projections.base import ProjectionStore
from hutch.projections.runner import Listener, Projector


class Changes:
    def __init__(self, log: EventLog, store: ProjectionStore, projector: Projector) -> None:
        self._log, self._store, self._projector = log, store, projector

    def listen(self, *, sandbox_id: str | None = None, org_id: str | None = None, limit: int = 0) -> Listener:
        """A bounded queue of the events projected from now on (Projector.listen's filters);
        give it back with ``unlisten``."""
        return self._projector.listen(sandbox_id=sandbox_id, org_id=org_id, limit=limit)

    def unlisten(self, queue: Listener) -> None:
        self._projector.unlisten(queue)

    def observe(self, observer: Callable[[Sequence[Event]], None]) -> None:
        """``observer`` sees every event as it is projected (replication, the tenant directory)."""
        self._projector.observers.append(observer)

    async def sandbox_events(self, sandbox_id: str, *, follow: bool, backlog: int) -> AsyncGenerator[Event, None]:
        """Every event of a sandbox, oldest first, then (``follow``) each new one until it ends.

        Unscoped: the caller has checked the right to see it. Raises NotFound before the first
        event for a sandbox that never was. Listens before reading the log, so nothing falls
        in between; a reader that stops reading holds at most ``backlog`` events and catches
        up from the log."""
        queue = self._projector.listen(sandbox_id=sandbox_id, limit=backlog)
        try:
            sandbox = await self._store.get_sandbox(sandbox_id)
        except BaseException:
            self._projector.unlisten(queue)
            raise
        if sandbox is None:
            self._projector.unlisten(queue)
            raise NotFound("audit stream not found")
        return self._follow(queue, sandbox_id, follow and not sandbox.status.is_final)

    async def _follow(self, queue: Listener, sandbox_id: str, follow: bool) -> AsyncGenerator[Event, None]:
        try:
            last = 0
            for event in await self._log.read(0, sandbox_id=sandbox_id):
                yield event
                last = event.position or last
            ended = not follow
            while not ended:
                if queue.overflowed:
                    queue.overflowed = False
                    events = await self._log.read(last, sandbox_id=sandbox_id)
                else:
                    events = [await queue.get()]
                for event in events:
                    if (event.position or 0) <= last:
                        continue
                    yield event
                    last = event.position or last
                current = await self._store.get_sandbox(sandbox_id)
                ended = current is None or current.status.is_final
                if ended:  # the end may have come while events waited or were missed: the log has them
                    for event in await self._log.read(last, sandbox_id=sandbox_id):
                        yield event
        finally:
            self._projector.unlisten(queue)
