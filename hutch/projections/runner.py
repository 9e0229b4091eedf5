"""The projector: tails the log into a store, and lets writers wait for their own
writes to be visible (read-your-writes) without polling.

A store is bound to one log (``EventLog.identity``, recorded by ``bind_log``). Before it
follows a log, at start and at every reconnect, the projector checks that the store is
bound to this log and holds no more than the log does; otherwise it refuses with
``LogMismatch`` and stops. Skipping is never an option: a store bound to another log
(or ahead of its own) would treat the log's new events as already applied, and every
write would be acknowledged into a log that no view shows. Once stopped, every write
that waits for the projector fails with ``ProjectionUnavailable`` (503) naming why.

A store whose commits a server crash can lose holds its reads after each new session
(``ProjectionStore.hold_reads_on_reconnect``); the projector then reads the log's end,
follows the log again from the store's position if the store holds less than it applied,
and lets the reads go once the store holds the log up to that end: no read shows state
older than a write answered before the crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from hutch.core import counters, phases
from hutch.core.errors import LogMismatch, ProjectionUnavailable
from hutch.core.eventlog.base import EventLog
from hutch.core.events import Event
from hutch.projections.base import ProjectionStore, StoreBehind

log = logging.getLogger(__name__)


# The most events applied in one store call when the projector has fallen behind.
MAX_BATCH = 1000


class _Rewound(Exception):
    """The log handed the projector an event at or below its position."""


class Listener(asyncio.Queue[Event]):
    """Events applied from now on, as one waiter wants them: those of one sandbox or one
    organization only (an event of another wakes nothing), at most ``limit`` held (0: no
    bound). A waiter whose client has stopped reading (a stalled stream) holds at most
    ``limit`` events, and what it missed is said by ``overflowed``; before, every waiter of
    the server held every event of every tenant, and each woke for each of them."""

    def __init__(self, *, sandbox_id: str | None = None, org_id: str | None = None, limit: int = 0) -> None:
        super().__init__(maxsize=limit)
        self.sandbox_id, self.org_id = sandbox_id, org_id
        self.overflowed = False

    def offer(self, event: Event) -> None:
        if (self.sandbox_id is not None and event.sandbox_id != self.sandbox_id) or \
                (self.org_id is not None and event.org_id != self.org_id):
            return
        try:
            self.put_nowait(event)
        except asyncio.QueueFull:
            self.overflowed = True


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
        self._listeners: list[Listener] = []
        self._told = 0  # the last position the listeners were told of
        self.failure: LogMismatch | None = None  # why the projector stopped, if it did
        # Called with each settled batch before writers waiting for it wake (service/tenancy.py:
        # a key revoked through another replica is refused here from then on).
        self.observers: list[Callable[[Sequence[Event]], None]] = []
        self._checking: asyncio.Task[None] | None = None  # the store against the log's end
        self._arrived = 0  # phases only: when the event that begins the next batch came
        # Phases only: a writer's wait (``wait_for``'s ``what``) by its position: [what, since,
        # when its batch was applied], so its time splits into queue, apply and wake (issue 35).
        self._timed: dict[int, list[Any]] = {}

    async def start(self) -> None:
        """Check the store belongs to this log, catch up with the whole log before returning,
        then follow it in the background. Raises ``LogMismatch`` when they part ways."""
        await self.verify()
        self._position = await self.store.position()
        if self.applies:
            backlog = await self.log.read(self._position)
            if backlog:
                await self.store.apply(backlog)
                self._position = backlog[-1].position or self._position
        else:
            last = await self.log.last_position()
            if last > self._position:
                await self.store.wait_for(last, timeout=600)
                self._position = last
        # Caught up with the log's end just now; from here on a new session is checked again.
        self.store.hold_reads_on_reconnect(self._reconnected)
        self._task = asyncio.create_task(self._follow(), name="projector")

    async def verify(self) -> None:
        """Refuse a store that folds another log, or that holds more than this log (LogMismatch);
        bind a store that is bound to no log yet to this one."""
        held = await self.store.position()  # before the log's end: appends meanwhile only add to it
        bound = await self.store.log_identity()
        identity = await self.log.identity()
        last = await self.log.last_position()
        fix = ("fix: to fold this log, rebuild the store from it (hutch projections rebuild --event-log URL "
               "--store URL, with this server's HUTCH_EVENT_LOG and HUTCH_STORE), or point HUTCH_STORE at the "
               "store of this log / HUTCH_EVENT_LOG at the log of this store")
        if bound is not None and identity is not None and bound != identity:
            raise LogMismatch(f"the projection store folds event log {bound}, not this one ({identity}); "
                              f"it has applied up to position {held} of that log; {fix}",
                              store_log=bound, log=identity)
        if held > last:
            raise LogMismatch(f"the projection store has applied up to position {held} of event log "
                              f"{bound or '(unrecorded)'}, but this log ({identity or 'empty, no identity yet'}) "
                              f"ends at position {last}: the log lost records, or it is another log; {fix}",
                              store_log=bound, log=identity)
        if bound is None and identity is not None:
            bound = await self.store.bind_log(identity)
            if bound != identity:  # another projector bound it to its own log just now
                raise LogMismatch(f"the projection store was just bound to event log {bound}, not this one "
                                  f"({identity}); {fix}", store_log=bound, log=identity)

    async def close(self) -> None:
        for task in (self._checking, self._task):
            if task:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _reconnected(self) -> None:
        """The store opened a session and holds its reads: check it (one check at a time; a
        hold that begins during one is checked again by the same task)."""
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(self._check(), name="projector-check")

    async def _check(self) -> None:
        """Let the store's reads go once it holds the log up to its end as of now. A store
        that holds less than this projector applied lost commits: follow the log again from
        what it holds (the follow task is restarted; its batch in hand is read again)."""
        while (hold := self.store.reads_held()) is not None:
            try:
                last = await self.log.last_position()
                # What was applied before the store's position is read: a batch applied while
                # the read is under way is not yet in the read, and is no lost commit.
                applied = self._position
                held = await self.store.position()
                if self.applies and held < applied and self._task is not None and self.failure is None:
                    log.warning("projection store holds position %d, below the %d applied (commits lost with "
                                "the server); re-applying from the log", held, applied)
                    self._task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await self._task
                    self._position = min(self._position, held)
                    self._task = asyncio.create_task(self._follow(), name="projector")
                if held < last:
                    await self.store.wait_for(last, timeout=30)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the log or the store still away: the reads stay held
                log.warning("cannot check the projection store against the log yet (%s); retrying", err)
                await asyncio.sleep(0.5)
                continue
            self.store.release_reads(hold)

    @property
    def position(self) -> int:
        return self._position

    async def _follow(self) -> None:
        reconnect = False
        while True:
            if reconnect:
                try:
                    await self.verify()
                except LogMismatch as err:
                    await self._stop(err)
                    return
                except Exception:  # the log or store is still away: verified on the next round
                    log.warning("projector cannot check the log's identity yet; retrying", exc_info=True)
                    await asyncio.sleep(0.5)
                    continue
            reconnect = True
            queue: asyncio.Queue[Event | BaseException] = asyncio.Queue(maxsize=10 * MAX_BATCH)
            pump = asyncio.create_task(self._pump(queue, self._position), name="projector-pump")
            try:
                while True:
                    first = await queue.get()
                    if isinstance(first, BaseException):
                        raise first
                    if (first.position or 0) <= self._position:
                        # The log went back under us (a Kafka topic deleted and recreated: the
                        # consumer starts again from its beginning). Check it is still ours.
                        raise _Rewound(f"the event log went back from position {self._position} "
                                       f"to {first.position}")
                    batch = [first]
                    while len(batch) < MAX_BATCH and not queue.empty():
                        item = queue.get_nowait()
                        if isinstance(item, BaseException):
                            queue.put_nowait(item)  # raised once this batch is in
                            break
                        batch.append(item)
                    timed = []
                    if phases.ON:  # queued behind the batch in flight, if any (issue 35)
                        phases.end(f"projector: a batch's first event came → its apply began ({first.type})",
                                   self._arrived)
                        timed = [t for e in batch if (t := self._timed.get(e.position or 0)) is not None]
                        for t in timed:
                            phases.end(f"projection wait{t[0]}: to its batch's apply (hand-off, the loop's other work first)",
                                       t[1])
                    t_apply = phases.start()
                    with phases.span("projector: store apply (one batch)"):
                        await self._settle(batch)
                    for t in timed:
                        phases.end(f"projection wait{t[0]}: its batch's apply", t_apply)
                        t[2] = phases.start()
                    self._position = batch[-1].position or self._position
                    for observe in self.observers:
                        observe(batch)
                    # A batch applied again (the store lost its commits) is not news: each
                    # position is told once.
                    news = [e for e in batch if (e.position or 0) > self._told]
                    self._told = max(self._told, self._position)
                    for q in self._listeners:
                        for event in news:
                            q.offer(event)
                    async with self._advanced:
                        self._advanced.notify_all()
            except asyncio.CancelledError:
                raise
            except StoreBehind:
                pass  # follow the log again at once, from the store's position
            except _Rewound as err:
                log.warning("%s; checking it is still the store's log", err)
            except Exception:  # the log hiccuped: resume from the tracked position
                log.exception("projector failed; retrying from position %d", self._position)
                await asyncio.sleep(0.5)
            finally:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump

    async def _stop(self, err: LogMismatch) -> None:
        log.error("projector stopped: %s", err.message)
        self.failure = err
        async with self._advanced:
            self._advanced.notify_all()

    async def _pump(self, queue: asyncio.Queue[Event | BaseException], after: int) -> None:
        try:
            async for event in self.log.subscribe(after):
                if phases.ON and queue.empty():  # the next batch's first event: when it came
                    self._arrived = phases.start()
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
                    counters.count("hutch_projector_batches_total")
                    counters.count("hutch_projector_events_total", len(batch))
                else:
                    await self.store.wait_for(batch[-1].position or 0, timeout=30)
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

    async def wait_for(self, position: int, timeout: float = 30.0, *, what: str = "") -> None:
        """Return once everything up to ``position`` is applied to the store. Raises
        ``ProjectionUnavailable`` when the projector stopped or ``timeout`` passed first.
        ``what``: with HUTCH_PHASES=1, the wait is timed in three spans named by it."""
        if self._position >= position:
            return
        if phases.ON and what:
            timed = self._timed.setdefault(position, [what, phases.start(), 0])
            try:
                await self._wait_for(position, timeout)
            finally:
                self._timed.pop(position, None)
            if timed[2]:
                phases.end(f"projection wait{what}: applied → its writer woke", timed[2])
            return
        await self._wait_for(position, timeout)

    async def _wait_for(self, position: int, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout), self._advanced:
                await self._advanced.wait_for(lambda: self._position >= position or self.failure is not None)
        except TimeoutError:
            raise ProjectionUnavailable(
                f"the event was appended at log position {position}, but the projections have not shown it "
                f"within {timeout:g} s (they are at position {self._position}: the projection store is away "
                "or far behind); the write is in the log and will show once they catch up") from None
        if self._position < position and self.failure is not None:
            raise ProjectionUnavailable(f"the event was appended at log position {position}, but the projector "
                                        f"stopped: {self.failure.message}")

    def listen(self, *, sandbox_id: str | None = None, org_id: str | None = None, limit: int = 0) -> Listener:
        """A queue of the events applied from now on (for waiters such as ?wait= long-polls):
        every one, or one sandbox's or organization's (``Listener``). A waiter that serves a
        client takes the narrowest it can and a ``limit``: what one tenant waits for must
        cost nothing when another tenant works."""
        q = Listener(sandbox_id=sandbox_id, org_id=org_id, limit=limit)
        self._listeners.append(q)
        return q

    def unlisten(self, q: Listener) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(q)
