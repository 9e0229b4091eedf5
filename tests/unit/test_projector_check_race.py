"""The projector's check of the store after a new session (``Projector._check``) against a
batch applied while the check reads the store's position.

Under load the PostgreSQL pool opens a session as it grows; the projector then reads the
store's position and compares it with what it has applied. A batch applied between that read
and the comparison made the store look behind (it was not: the read came first), so the
projector "re-applied" from the older position and every listener — the Web App's live
feed, an events stream, a long-poll — was told the same events twice (seen in CI: an
organization's own event again on ``/app/live``). Listeners are told each position once in
any case: a store that really lost commits is re-applied, not re-announced.

A real SQLite log; the memory store, made to hold its reads on a new session and to answer
a position read only when the test lets it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from hutch.core.events import Event
from hutch.eventlog.sqlite import SqliteEventLog
from hutch.projections.memory import MemoryProjectionStore
from hutch.projections.runner import Projector
from tests.contracts.test_eventlog import ev
from tests.unit.projector_fixtures import sqlite_log, started_projector  # noqa: F401  (fixtures: log, projector)


class SessionStore(MemoryProjectionStore):
    def __init__(self) -> None:
        super().__init__()
        self.applied: list[int] = []
        self.reconnected: Callable[[], None] | None = None
        self.held: int | None = None
        self.read_gate = asyncio.Event()
        self.read_gate.set()
        self.reading = asyncio.Event()  # a position read is under way behind the gate
        self.released = asyncio.Event()  # the projector let the reads go
        self.moved = asyncio.Event()  # a batch was applied

    async def apply(self, events: Sequence[Event]) -> None:
        self.applied += [e.position or 0 for e in events]
        await super().apply(events)
        self.moved.set()

    def hold_reads_on_reconnect(self, reconnected: Callable[[], None]) -> None:
        self.reconnected = reconnected

    def new_session(self) -> None:
        assert self.reconnected is not None
        self.held = 1
        self.released.clear()
        self.reconnected()

    def reads_held(self) -> int | None:
        return self.held

    def release_reads(self, hold: int) -> bool:
        self.held = None
        self.released.set()
        return True

    async def position(self) -> int:
        held = await super().position()  # as of the read's start, as a database answers
        self.reading.set()
        await self.read_gate.wait()
        return held

    async def wait_for(self, position: int, timeout: float = 30.0) -> None:
        """The store shows ``position`` (applied by this test's projector)."""
        async with asyncio.timeout(timeout):
            while self._position < position:
                self.moved.clear()
                await self.moved.wait()

    def lose_to(self, position: int) -> None:
        """A store whose last commits were lost (a server crash): it holds ``position`` only."""
        self._position = position


@pytest.fixture
async def store() -> SessionStore:
    return SessionStore()


async def _append(log: SqliteEventLog, projector: Projector, seq: int) -> int:
    (position,) = await log.append([ev("sbx_a", seq)])
    await projector.wait_for(position, timeout=5)
    return position


def _told(queue: asyncio.Queue[Event]) -> list[int]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait().position or 0)
    return out


async def test_a_batch_applied_during_the_check_is_not_taken_for_lost_commits(
        log: SqliteEventLog, store: SessionStore, projector: Projector) -> None:
    listener = projector.listen()
    first = await _append(log, projector, 0)
    store.read_gate.clear()
    store.new_session()  # the pool grew: the check reads the store's position...
    await asyncio.wait_for(store.reading.wait(), 5)
    second = await _append(log, projector, 1)  # ...while the next batch is applied
    store.read_gate.set()
    await asyncio.wait_for(store.released.wait(), 5)
    third = await _append(log, projector, 2)
    assert store.applied == [first, second, third], "nothing was applied twice: nothing was lost"
    assert _told(listener) == [first, second, third], "each event told once"


async def test_a_store_that_lost_commits_is_applied_again_but_listeners_are_told_once(
        log: SqliteEventLog, store: SessionStore, projector: Projector) -> None:
    listener = projector.listen()
    first = await _append(log, projector, 0)
    second = await _append(log, projector, 1)
    store.lose_to(first)  # the server crashed before flushing the second batch's commit
    store.new_session()
    await asyncio.wait_for(store.released.wait(), 5)
    third = await _append(log, projector, 2)
    assert store.applied == [first, second, second, third], "the lost batch applied again"
    assert await store.position() == third
    assert _told(listener) == [first, second, third], "each event told once"
