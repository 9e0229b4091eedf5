"""The projector's binding of a store to one log, on real logs (SQLite files; Kafka and
PostgreSQL through real servers in tests/system/test_log_identity.py).

A log swapped under a running projector (here: a wrapper that starts handing out another
file's events, as a recreated Kafka topic does when its consumer falls back to the
beginning) stops the projector; every write waiting for it then fails with
``ProjectionUnavailable`` (503) naming why, and so does a wait that times out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import attrs
import pytest

from hutch.core.errors import LogMismatch, ProjectionUnavailable
from hutch.core.eventlog.base import EventLog
from hutch.core.events import Event
from hutch.eventlog.sqlite import SqliteEventLog
from hutch.projections.memory import MemoryProjectionStore
from hutch.projections.runner import Projector
from tests.contracts.test_eventlog import ev


class Swappable(EventLog):
    """One log, then (after ``swap``) another one, as a recreated topic would be."""

    def __init__(self, first: EventLog) -> None:
        self.current = first
        self.swapped = asyncio.Event()

    async def swap(self, other: EventLog) -> None:
        self.current = other
        self.swapped.set()

    async def append(self, events: Sequence[Event]) -> list[int]:
        return await self.current.append(events)

    async def read(self, after: int = 0, *, sandbox_id: str | None = None, limit: int | None = None,
                   reverse: bool = False) -> list[Event]:
        return await self.current.read(after, sandbox_id=sandbox_id, limit=limit, reverse=reverse)

    async def last_position(self) -> int:
        return await self.current.last_position()

    async def identity(self) -> str | None:
        return await self.current.identity()

    async def subscribe(self, after: int = 0) -> AsyncIterator[Event]:
        log = self.current
        agen = log.subscribe(after)
        next_event = asyncio.ensure_future(agen.__anext__())
        swapped = asyncio.ensure_future(self.swapped.wait())
        try:
            while True:
                done, _ = await asyncio.wait([next_event, swapped], return_when=asyncio.FIRST_COMPLETED)
                if next_event in done:
                    yield next_event.result()
                    next_event = asyncio.ensure_future(agen.__anext__())
                    continue
                # The consumer of a recreated topic starts again from its beginning.
                async for event in self.current.subscribe(0):
                    yield event
        finally:
            next_event.cancel()
            swapped.cancel()
            await agen.aclose()  # type: ignore[attr-defined]  # an async generator's


async def opened(path: Path) -> SqliteEventLog:
    log = SqliteEventLog(path)
    await log.start()
    return log


async def test_a_log_swapped_under_a_running_projector_stops_it_and_writes_fail_503(tmp_path: Path) -> None:
    first, second = await opened(tmp_path / "a.db"), await opened(tmp_path / "b.db")
    log = Swappable(first)
    store = MemoryProjectionStore()
    projector = Projector(log, store)
    await projector.start()
    try:
        positions = await log.append([ev("sbx_a", i) for i in range(5)])
        await projector.wait_for(positions[-1], timeout=5)
        assert await store.log_identity() == await first.identity()
        await second.append([ev("sbx_b", 1)])
        await log.swap(second)
        (late,) = await log.append([ev("sbx_b", 2)])  # position 2 of the new log: "already applied"
        with pytest.raises(ProjectionUnavailable) as caught:
            await projector.wait_for(positions[-1] + 1, timeout=5)
        assert isinstance(projector.failure, LogMismatch)
        message = caught.value.message
        assert str(await first.identity()) in message and str(await second.identity()) in message
        assert "projector stopped" in message and "hutch projections rebuild" in message
        assert caught.value.status == 503
        assert late <= positions[-1] and await store.get_sandbox("sbx_b") is None  # nothing was skipped into view
    finally:
        await projector.close()
        await first.close()
        await second.close()


async def test_a_write_the_projections_do_not_show_in_time_fails_503(tmp_path: Path) -> None:
    log = await opened(tmp_path / "a.db")
    store = MemoryProjectionStore()
    projector = Projector(log, store)
    await projector.start()
    try:
        await projector.close()  # the projector is gone: nothing will show the append below
        (position,) = await log.append([ev("sbx_a", 1)])
        with pytest.raises(ProjectionUnavailable) as caught:
            await projector.wait_for(position, timeout=0.2)
        assert f"position {position}" in caught.value.message and "within 0.2 s" in caught.value.message
    finally:
        await log.close()


async def test_start_refuses_another_log_and_a_store_ahead_of_its_own(tmp_path: Path) -> None:
    first, second = await opened(tmp_path / "a.db"), await opened(tmp_path / "b.db")
    try:
        store = MemoryProjectionStore()
        await first.append([ev("sbx_a", i) for i in range(3)])
        await Projector(first, store).start()
        await second.append([ev("sbx_b", i) for i in range(5)])
        with pytest.raises(LogMismatch) as other:
            await Projector(second, store).start()
        assert str(await first.identity()) in other.value.message
        assert str(await second.identity()) in other.value.message
        # The same log, holding less than the store applied (restored from an older copy).
        ahead = MemoryProjectionStore()
        await ahead.bind_log(str(await second.identity()))
        held = await second.read()
        await ahead.apply([*held, *[attrs.evolve(e, position=(e.position or 0) + 100) for e in held]])
        with pytest.raises(LogMismatch) as lost:
            await Projector(second, ahead).start()
        assert "lost records" in lost.value.message and "position 105" in lost.value.message
    finally:
        await first.close()
        await second.close()


async def test_with_phases_on_a_writers_wait_is_timed_in_three_spans_and_then_forgotten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench/phases.py's split of a write's projection wait (issue 35): to its batch's apply (the
    hand-off and any batch in flight before it), the apply, the writer's wake. A wait that fails
    keeps nothing behind (a long bench would otherwise grow with every one)."""
    from hutch.core import phases

    monkeypatch.setattr(phases, "ON", True)
    phases.clear()
    log = await opened(tmp_path / "a.db")
    projector = Projector(log, MemoryProjectionStore())
    await projector.start()
    try:
        positions = await log.append([ev("sbx_a", i) for i in range(3)])
        await projector.wait_for(positions[-1], timeout=5, what=" (Test)")
        kept = {name: taken for name, taken in phases.taken().items() if name.startswith("projection wait (Test)")}
        assert sorted(kept) == ["projection wait (Test): applied → its writer woke",
                                "projection wait (Test): its batch's apply",
                                "projection wait (Test): to its batch's apply (hand-off, the loop's other work first)"], kept
        assert all(len(taken) == 1 for taken in kept.values()), kept
        await projector.close()  # nothing shows what follows
        (late,) = await log.append([ev("sbx_a", 9)])
        with pytest.raises(ProjectionUnavailable):
            await projector.wait_for(late, timeout=0.1, what=" (Late)")
        assert projector._timed == {}
        assert not any(name.startswith("projection wait (Late)") for name in phases.taken())
    finally:
        await projector.close()
        await log.close()
        phases.clear()
