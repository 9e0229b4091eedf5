"""What the Kafka event log promises beyond the EventLog contract (a real broker)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaTimeoutError

from hutch.core import counters, ids
from hutch.core.errors import InvalidInput, LogUnavailable
from hutch.core.events import Event, ExecutionStarted
from hutch.eventlog.kafka import KafkaEventLog
from hutch.eventlog.kafka_records import Record, partition_for
from hutch.service.composition import open_event_log
from tests.contracts.test_eventlog import ev
from tests.services import drop_topics, kafka_url


@pytest.fixture
async def url() -> AsyncIterator[str]:
    made = kafka_url("kafka")
    yield made
    await drop_topics(made)


async def opened(url: str, data_dir: Path, **kw: bool) -> KafkaEventLog:
    log = open_event_log(url, data_dir, **kw)
    assert isinstance(log, KafkaEventLog)
    await log.start()
    return log


async def test_events_survive_reopen_and_positions_keep_increasing(url: str, tmp_path: Path) -> None:
    log = await opened(url, tmp_path)
    first = await log.append([ev("sbx_a", 1), ev("sbx_b", 2)])
    await log.close()
    again = await opened(url, tmp_path)
    try:
        assert [e.position for e in await again.read()] == first
        (p,) = await again.append([ev("sbx_a", 3)])
        assert p > first[-1] and await again.last_position() == p
    finally:
        await again.close()


async def test_per_sandbox_reads_agree_with_the_global_order(url: str, tmp_path: Path) -> None:
    log = await opened(url, tmp_path)
    try:
        sandboxes = [ids.new_id("sandbox") for _ in range(5)]  # real ids: reads start at their time
        await asyncio.gather(*(log.append([ev(s, i)]) for i in range(40) for s in sandboxes[i % 5 : i % 5 + 1]))
        everything = await log.read()
        for sid in sandboxes:
            mine = [e for e in everything if e.sandbox_id == sid]
            assert [(e.event_id, e.position) for e in await log.read(sandbox_id=sid)] == [
                (e.event_id, e.position) for e in mine
            ]
            newest = await log.read(sandbox_id=sid, reverse=True, limit=3)
            assert [e.event_id for e in newest] == [e.event_id for e in mine[::-1][:3]]
            middle = mine[3].position or 0
            assert [e.event_id for e in await log.read(middle, sandbox_id=sid)] == [e.event_id for e in mine[4:]]
            # In pages (service/history.py): the keyed scan stops at a page's end, none skipped.
            paged, after = [], 0
            while page := await log.read(after, sandbox_id=sid, limit=3):
                paged += [e.event_id for e in page]
                after = page[-1].position or 0
            assert paged == [e.event_id for e in mine]
    finally:
        await log.close()


class Collector:
    """A consumer-group member that keeps what it is given (the keyed topic, via the index)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def resume_points(self, source: str, partitions: Sequence[int]) -> dict[int, int]:
        return {}

    async def deliver(self, source: str, records: Sequence[tuple[int, int, Event]]) -> None:
        self.events.extend(e for _, _, e in records)

    def mark_caught_up(self) -> None:
        pass


async def indexed(log: KafkaEventLog, want: set[str], within: float) -> list[Event]:
    """The events a fresh consumer group sees once it has every event id in ``want``."""
    member = Collector()
    group = asyncio.create_task(log.consume_group(f"test-{ids.new_id('event')}", member))
    try:
        deadline = time.monotonic() + within
        while not want <= {e.event_id for e in member.events}:
            assert time.monotonic() < deadline, f"not indexed within {within} s: {want - {e.event_id for e in member.events}}"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # a duplicate would arrive right behind
        return member.events
    finally:
        group.cancel()
        with contextlib.suppress(BaseException):
            await group


async def crash_indexer(log: KafkaEventLog) -> AIOKafkaProducer | None:
    """The indexer dies as with kill -9: its task ends, its producer is never closed."""
    assert log.indexer is not None and log._indexing is not None
    producer, log.indexer.producer = log.indexer.producer, None
    log._indexing.cancel()
    with contextlib.suppress(BaseException):
        await log._indexing
    return producer


async def test_a_dead_indexers_open_transaction_is_ended_by_the_next_writer(url: str, tmp_path: Path) -> None:
    """A server killed mid-copy leaves an open transaction on the keyed topic, which would hide
    every later copy from read_committed readers until it times out. The next writer takes the
    indexer's transactional id and so aborts it at once."""
    dead = await opened(url, tmp_path)
    before = await dead.append([ev("sbx_a", 1)])
    await indexed(dead, {e.event_id for e in await dead.read()}, within=8)
    producer = await crash_indexer(dead)
    assert producer is not None
    await producer.begin_transaction()
    # On the partition sbx_a's copies go to: the successor's must wait for this one to end.
    await (await producer.send(dead.topic, b'{"never": "committed"}', key=b"sbx_a",
                               partition=partition_for("sbx_a", dead.partitions)))
    # ... and the process dies here: nothing closes it.
    started = time.monotonic()
    successor = await opened(url, tmp_path)
    try:
        mine = [*before, *await successor.append([ev("sbx_a", 2)])]
        everything = await successor.read()
        assert [e.position for e in everything] == mine
        seen = await indexed(successor, {e.event_id for e in everything}, within=8)
        assert sorted(e.position or 0 for e in seen) == mine, "copied exactly once, nothing uncommitted"
        assert time.monotonic() - started < 8, "the open transaction was waited out, not aborted"
    finally:
        await successor.close()
        with contextlib.suppress(Exception):  # fenced: stopping it fails fast or times out
            await asyncio.wait_for(producer.stop(), 5)
        await dead.close()


def counted(name: str) -> int:
    return sum(v for n, _, v in counters.counts() if n == name)


async def test_the_indexers_copies_are_counted(url: str, tmp_path: Path) -> None:
    """GET /metrics shows what the keyed topic's copies cost: transactions and their events."""
    copies, events = counted("hutch_eventlog_index_copies_total"), counted("hutch_eventlog_index_copy_events_total")
    log = await opened(url, tmp_path)
    try:
        await log.append([ev("sbx_a", 1), ev("sbx_b", 2), ev("sbx_a", 3)])
        await indexed(log, {e.event_id for e in await log.read()}, within=8)
        assert counted("hutch_eventlog_index_copies_total") > copies
        assert counted("hutch_eventlog_index_copy_events_total") - events == 3  # the epoch record is no copy
    finally:
        await log.close()


async def test_per_sandbox_reads_see_appends_the_index_has_not_copied(url: str, tmp_path: Path) -> None:
    log = await opened(url, tmp_path)
    crashed = None
    try:
        sid = ids.new_id("sandbox")
        copied = await log.append([ev(sid, 1), ev(sid, 2)])
        await indexed(log, {e.event_id for e in await log.read()}, within=8)
        crashed = await crash_indexer(log)  # from here on nothing is copied
        later = await log.append([ev(sid, 3), ev("sbx_other", 4), ev(sid, 5)])
        assert [e.position for e in await log.read(sandbox_id=sid)] == [*copied, later[0], later[2]]
        assert [e.position for e in await log.read(sandbox_id=sid, reverse=True, limit=3)] == \
            [later[2], later[0], copied[1]]
        assert [e.position for e in await log.read(copied[1], sandbox_id=sid)] == [later[0], later[2]]
    finally:
        await log.close()
        if crashed is not None:
            await crashed.stop()


async def test_a_standby_indexer_takes_over_from_a_dead_one(url: str, tmp_path: Path) -> None:
    """Two writers: the last started indexes, the other stands by; when the indexer dies the
    standby leads within a few seconds, and every event is copied exactly once throughout."""
    first = await opened(url, tmp_path / "a")
    second = await opened(url, tmp_path / "b")  # leads: fences the first
    crashed = None
    try:
        await first.append([ev("sbx_a", 1)])
        await second.append([ev("sbx_b", 2)])
        await indexed(first, {e.event_id for e in await first.read()}, within=8)
        assert second.indexer is not None and second.indexer.leading
        crashed = await crash_indexer(second)
        await first.append([ev("sbx_a", 3)])
        await second.append([ev("sbx_b", 4)])
        everything = await first.read()
        seen = await indexed(first, {e.event_id for e in everything}, within=10)
        assert sorted(e.position or 0 for e in seen) == [e.position for e in everything]
        assert first.indexer is not None and first.indexer.leading
    finally:
        if crashed is not None:
            with contextlib.suppress(Exception):  # fenced: fails fast
                await crashed.stop()
        await second.close()
        await first.close()


async def test_a_read_only_log_refuses_appends_and_takes_no_producer(url: str, tmp_path: Path) -> None:
    writer = await opened(url, tmp_path)
    reader = await opened(url, tmp_path, read_only=True)
    try:
        (p,) = await writer.append([ev("sbx_a", 1)])
        assert [e.position for e in await reader.read()] == [p]
        with pytest.raises(LogUnavailable):
            await reader.append([ev("sbx_a", 2)])
        (q,) = await writer.append([ev("sbx_a", 3)])
        assert q > p
        # It runs no indexer, so it never fences the writer's: the writer's goes on copying.
        assert reader.indexer is None and writer.indexer is not None
        await indexed(reader, {e.event_id for e in await reader.read()}, within=8)
        assert writer.indexer.leading
    finally:
        await reader.close()
        await writer.close()


async def test_an_append_larger_than_one_batch_is_refused_whole(url: str, tmp_path: Path) -> None:
    """An append is one record batch (all or nothing); one that cannot be one is refused,
    naming its size, and nothing of it is written."""
    log = await opened(url, tmp_path)
    try:
        big = [Event(ids.new_id("event"), "sbx_a", "2026-01-01T00:00:00.000Z",
                     ExecutionStarted(execution_id=f"exec_{i}", command=("echo", "x" * 5 * 2**20)))
               for i in range(2)]
        with pytest.raises(InvalidInput, match=r"takes \d+ bytes"):
            await log.append(big)
        (p,) = await log.append([ev("sbx_a", 1)])
        assert [e.position for e in await log.read()] == [p]
    finally:
        await log.close()


async def test_an_append_whose_answer_was_lost_is_found_not_written_twice(url: str, tmp_path: Path) -> None:
    """The broker wrote the batch but the writer never heard: the append is resolved below a
    bound written by a new producer, found, and acknowledged once. A batch that never reached
    the broker is written again, once. Readers skip the bounds."""
    log = await opened(url, tmp_path)
    try:
        real = log._write
        calls = 0

        async def answer_lost(records: list[Record]) -> list[int]:
            nonlocal calls
            calls += 1
            if calls == 1:
                await real(records)  # the broker wrote it...
                raise KafkaTimeoutError("the answer was lost")  # ...and the writer never heard
            return await real(records)

        log._write = answer_lost  # type: ignore[method-assign]
        positions = await log.append([ev("sbx_a", 1), ev("sbx_a", 2)])
        assert calls == 1, "found, not written again"
        assert [e.position for e in await log.read()] == positions

        calls = 0

        async def never_sent(records: list[Record]) -> list[int]:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise KafkaTimeoutError("no broker")
            return await real(records)

        log._write = never_sent  # type: ignore[method-assign]
        more = await log.append([ev("sbx_a", 3)])
        assert calls == 2, "not found below the bound, so written again"
        assert [e.position for e in await log.read()] == positions + more
        assert [e.position for e in await log.read(sandbox_id="sbx_a")] == positions + more
    finally:
        await log.close()


async def test_an_answer_that_never_comes_ends_the_wait_but_not_the_batch(url: str, tmp_path: Path) -> None:
    """A Produce whose answer does not come within ``append_timeout`` ends the writer's wait
    (the resolve above takes over) without cancelling the batch in the producer: it may
    still be delivered, and the resolve finds it then."""
    log = await opened(url, tmp_path)
    try:
        assert log._producer is not None
        batch: asyncio.Future[object] = asyncio.get_running_loop().create_future()  # never answered

        async def send_batch(*args: object, **kw: object) -> asyncio.Future[object]:
            return asyncio.shield(batch)  # as aiokafka hands it out

        log._producer.send_batch = send_batch  # type: ignore[method-assign]
        log.append_timeout = 0.3
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await log._write([(b"sbx_a", ev("sbx_a", 1).event_id.encode(), ())])
        assert 0.25 < time.monotonic() - started < 5
        assert not batch.done(), "the batch itself is left to the producer"
    finally:
        await log.close()
