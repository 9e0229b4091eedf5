"""The projector: tails the log into a store, and lets writers wait for their own
writes to be visible (read-your-writes) without polling."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from core.eventlog.base import EventLog
from core.events import Event
from projections.base import ProjectionStore, StoreBehind

log = logging.getLogger(__name__)


# The most events applied in one store call when the projector has fallen behind.
MAX_BATCH = 1000


class Projector:
    """Follows the log from the store's tracked position.

    ``apply=True`` (the default): folds each event into the store. Whatever has arrived
    while the store was busy is applied as one batch, so the projector keeps up with
    bursts instead of paying one store transaction per event.

    ``apply=False``: another process (``hutch projector``) applies; this one only waits
    until the store reports each position applied (``store.wait_for``), so read-your-writes
    and the listeners of long-polls work the same in an API process that does not project.
    """

    def __init__(self, log_: EventLog, store: ProjectionStore, *, apply: bool = True) -> None:
        self.log = log_
        self.store = store
        self.applies = apply
        self._task: asyncio.Task[None] | None = None
        self._position = 0
        self._advanced = asyncio.Condition()
        self._listeners: list[asyncio.Queue[Event]] = []

    async def start(self) -> None:
        """Catch up with the whole log before returning, then follow it in the background."""
        self._position = await self.store.position()
        if self.applies:
            backlog = await self.log.read(self._position)
            if backlog:
                await self.store.apply(backlog)
                self._position = backlog[-1].position or self._position
        else:
            last = await self.log.last_position()
            if last > self._position:
                await self.store.wait_for(last, timeout=600)  # type: ignore[attr-defined]
                self._position = last
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
            queue: asyncio.Queue[Event | BaseException] = asyncio.Queue(maxsize=10 * MAX_BATCH)
            pump = asyncio.create_task(self._pump(queue, self._position), name="projector-pump")
            try:
                while True:
                    first = await queue.get()
                    if isinstance(first, BaseException):
                        raise first
                    batch = [first]
                    while len(batch) < MAX_BATCH and not queue.empty():
                        item = queue.get_nowait()
                        if isinstance(item, BaseException):
                            queue.put_nowait(item)  # raised once this batch is in
                            break
                        batch.append(item)
                    await self._settle(batch)
                    self._position = batch[-1].position or self._position
                    for q in self._listeners:
                        for event in batch:
                            q.put_nowait(event)
                    async with self._advanced:
                        self._advanced.notify_all()
            except asyncio.CancelledError:
                raise
            except StoreBehind:
                pass  # follow the log again at once, from the store's position
            except Exception:  # the log hiccuped: resume from the tracked position
                log.exception("projector failed; retrying from position %d", self._position)
                await asyncio.sleep(0.5)
            finally:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump

    async def _pump(self, queue: asyncio.Queue[Event | BaseException], after: int) -> None:
        try:
            async for event in self.log.subscribe(after):
                await queue.put(event)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            await queue.put(err)

    async def _settle(self, batch: list[Event]) -> None:
        """Apply (or see applied) one batch, retrying while the store is away: the events stay
        in hand, so an outage delays them and never skips one."""
        delay = 0.1
        while True:
            try:
                if self.applies:
                    await self.store.apply(batch)
                else:
                    await self.store.wait_for(batch[-1].position or 0, timeout=30)  # type: ignore[attr-defined]
                return
            except asyncio.CancelledError:
                raise
            except StoreBehind as behind:
                # Follow the log again from what the store holds (see StoreBehind).
                log.warning("%s; re-applying from the log", behind)
                self._position = behind.position
                raise
            except Exception as err:
                log.warning("projection store unavailable (%s); retrying batch at position %s",
                            err, batch[0].position)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

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
