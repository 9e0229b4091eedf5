"""The projector's batches (``projections/runner.py``): what arrives while the store is busy
goes to it as one batch, a write waiting for its position is answered only once the batch
holding it is applied, and a batch the store could not take is retried whole, never skipped.

A real SQLite log in a temporary file; the store is the memory store behind a gate the test
opens by hand, and a failure it is told to raise once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from hutch.core.events import Event
from hutch.eventlog.sqlite import SqliteEventLog
from hutch.projections.memory import MemoryProjectionStore
from hutch.projections.runner import Projector
from tests.contracts.test_eventlog import ev
from tests.unit.projector_fixtures import sqlite_log, started_projector  # noqa: F401  (fixtures: log, projector)


class GatedStore(MemoryProjectionStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[int]] = []  # the positions of each apply, failed ones too
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next: Exception | None = None

    async def apply(self, events: Sequence[Event]) -> None:
        self.calls.append([e.position or 0 for e in events])
        await self.gate.wait()
        if self.fail_next is not None:
            failure, self.fail_next = self.fail_next, None
            raise failure
        await super().apply(events)


@pytest.fixture
async def store() -> GatedStore:
    return GatedStore()


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.005)


async def first_batch_held(log: SqliteEventLog, store: GatedStore, projector: Projector) -> int:
    """Append one event and hold its batch in the store; returns its position."""
    store.gate.clear()
    (first,) = await log.append([ev("sbx_a", 0)])
    await settle()
    assert store.calls == [[first]]
    return first


async def test_what_arrives_while_the_store_is_busy_is_one_batch_and_visible_only_once_applied(
        log: SqliteEventLog, store: GatedStore, projector: Projector) -> None:
    first = await first_batch_held(log, store, projector)
    later = [p for i in range(10) for p in await log.append([ev(f"sbx_{i % 3}", i), ev(f"sbx_{i % 3}", 100 + i)])]
    waiting = asyncio.create_task(projector.wait_for(later[0]))
    await settle()
    assert not waiting.done(), "not visible while its batch waits for the store"
    assert projector.position < first

    store.gate.set()
    await asyncio.wait_for(waiting, 5)
    await projector.wait_for(later[-1], timeout=5)
    assert store.calls == [[first], later], "the twenty events that arrived meanwhile went as one batch"
    assert await store.position() == later[-1]


async def test_a_batch_the_store_could_not_take_is_retried_whole(
        log: SqliteEventLog, store: GatedStore, projector: Projector) -> None:
    first = await first_batch_held(log, store, projector)
    later = [p for i in range(5) for p in await log.append([ev("sbx_b", i)])]
    store.fail_next = ConnectionError("the store went away")
    waiting = asyncio.create_task(projector.wait_for(later[-1], timeout=5))
    store.gate.set()  # the first batch takes the failure, then is retried
    await asyncio.wait_for(waiting, 5)
    assert store.calls[0] == store.calls[1] == [first], "the failed batch again, the same events"
    assert [p for call in store.calls[1:] for p in call] == [first, *later], "nothing skipped or applied twice"
    assert await store.position() == later[-1]
