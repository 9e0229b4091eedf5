"""The embedded log's writer thread (hutch/eventlog/sqlite.py): what an acknowledgement means
when appends of any size arrive together, a refused append, and use outside start..close.
The contract every backend keeps is tests/contracts/test_eventlog.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hutch.core import counters, ids
from hutch.core.errors import LogUnavailable
from hutch.core.events import Event, ExecutionStarted
from hutch.eventlog.sqlite import SqliteEventLog


def ev(n: int, sandbox_id: str = "sbx_a") -> Event:
    return Event(ids.new_id("event"), sandbox_id, "2026-01-01T00:00:00.000Z",
                 ExecutionStarted(execution_id=f"exec_{n}", command=("echo", str(n))))


def count(name: str) -> int:
    return sum(value for n, _, value in counters.counts() if n == name)


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[SqliteEventLog]:
    log = SqliteEventLog(tmp_path / "events.db")
    await log.start()
    yield log
    await log.close()


async def test_appends_of_mixed_sizes_arriving_together_get_the_positions_they_are_read_at(
        log: SqliteEventLog) -> None:
    # 600 rows is more than one INSERT statement takes: that batch is several in a transaction.
    sizes = [1, 3, 600, 1, 2, 251, 1]
    batches = [[ev(i * 1000 + j, f"sbx_{i}") for j in range(n)] for i, n in enumerate(sizes)]
    results = await asyncio.gather(*(log.append(b) for b in batches))
    by_position = {e.position: e.event_id for e in await log.read()}
    for batch, positions in zip(batches, results, strict=True):
        assert [by_position[p] for p in positions] == [e.event_id for e in batch]
    assert sorted(by_position) == list(range(1, sum(sizes) + 1))


async def test_appends_waiting_behind_a_commit_share_the_next_one(log: SqliteEventLog) -> None:
    writes, appends = count("hutch_eventlog_writes_total"), count("hutch_eventlog_appends_total")
    results = await asyncio.gather(*(log.append([ev(i)]) for i in range(100)))
    assert count("hutch_eventlog_appends_total") - appends == 100
    assert count("hutch_eventlog_writes_total") - writes < 100 / 4, "no group commit"
    # acknowledged means readable by whoever reads next
    assert await log.last_position() == max(p for r in results for p in r)


async def test_a_refused_append_fails_by_name_and_the_log_goes_on(log: SqliteEventLog) -> None:
    first = ev(1)
    await log.append([first])
    with pytest.raises(LogUnavailable, match=r"event log append failed: UNIQUE constraint failed: events\.event_id"):
        await log.append([ev(2), first])
    assert [e.event_id for e in await log.read()] == [first.event_id]  # none of the refused batch
    assert await log.append([ev(3)]) == [2]  # a rolled-back insert uses up no position


async def test_appends_queued_at_close_are_written_and_the_log_refuses_more(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "events.db")
    await log.start()
    pending = [asyncio.ensure_future(log.append([ev(i)])) for i in range(20)]
    await asyncio.sleep(0)  # each has queued its job
    await log.close()
    assert sorted(p for fut in pending for p in fut.result()) == list(range(1, 21))
    with pytest.raises(LogUnavailable, match=r"event log .*events\.db is closed"):
        await log.append([ev(21)])
    with pytest.raises(LogUnavailable, match="is closed"):
        await log.read()
    await log.close()  # twice is fine

    again = SqliteEventLog(tmp_path / "events.db")
    await again.start()
    assert await again.last_position() == 20
    await again.close()


async def test_an_append_before_start_is_refused_by_name(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "events.db")
    with pytest.raises(LogUnavailable, match=r"event log .*events\.db is not started"):
        await log.append([ev(1)])


def test_a_log_opened_on_one_event_loop_answers_on_the_next(tmp_path: Path) -> None:
    # As a module-scoped fixture does: start on one loop, append on each test's own.
    log = SqliteEventLog(tmp_path / "events.db")
    asyncio.run(log.start())

    async def append_and_read() -> list[int]:
        positions = await asyncio.wait_for(log.append([ev(1)]), 10)
        assert [e.position for e in await asyncio.wait_for(log.read(), 10)] == positions
        return positions

    assert asyncio.run(append_and_read()) == [1]
    asyncio.run(log.close())


async def test_a_log_that_cannot_open_says_which_file_and_leaves_no_thread(tmp_path: Path) -> None:
    (tmp_path / "events.db").write_bytes(b"not a database, " * 512)
    log = SqliteEventLog(tmp_path / "events.db")
    with pytest.raises(LogUnavailable, match=r"cannot open event log .*events\.db: file is not a database"):
        await log.start()
    assert log._thread is not None and not log._thread.is_alive()
    with pytest.raises(LogUnavailable, match="is closed"):
        await log.append([ev(1)])


async def test_a_log_whose_folder_cannot_be_made_says_so_and_leaves_no_thread(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    log = SqliteEventLog(tmp_path / "a-file" / "events.db")
    with pytest.raises(LogUnavailable, match=r"cannot open event log .*a-file/events\.db: .*File exists"):
        await log.start()
    assert log._thread is not None and not log._thread.is_alive()
