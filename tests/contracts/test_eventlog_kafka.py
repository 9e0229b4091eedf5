"""What the Kafka event log promises beyond the EventLog contract (a real broker)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hutch.api.composition import open_event_log
from hutch.core import ids
from hutch.core.errors import LogUnavailable
from hutch.eventlog.kafka import KafkaEventLog
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
    finally:
        await log.close()


async def test_a_restarted_writer_ends_the_transaction_its_predecessor_left_open(url: str, tmp_path: Path) -> None:
    """A server killed mid-append leaves an open transaction, which would hide every later event
    from read_committed readers until it times out. The next writer on the same data dir takes
    over its transactional ids and so aborts it at once."""
    dead = await opened(url, tmp_path)
    (before,) = await dead.append([ev("sbx_a", 1)])
    producer = dead._slots[0].producer
    assert producer is not None
    await producer.begin_transaction()
    await (await producer.send(dead.order_topic, b'{"never": "committed"}', partition=0))
    # ... and the process dies here: nothing closes it.
    started = time.monotonic()
    successor = await opened(url, tmp_path)
    try:
        (after,) = await successor.append([ev("sbx_a", 2)])
        assert [e.position for e in await successor.read()] == [before, after]
        assert time.monotonic() - started < 8, "the open transaction was waited out, not aborted"
    finally:
        await successor.close()
        await dead.close()  # its producers were fenced: closing them fails fast or times out (5 s)


async def test_a_read_only_log_refuses_appends_and_takes_no_producer(url: str, tmp_path: Path) -> None:
    writer = await opened(url, tmp_path)
    reader = await opened(url, tmp_path, read_only=True)
    try:
        (p,) = await writer.append([ev("sbx_a", 1)])
        assert [e.position for e in await reader.read()] == [p]
        with pytest.raises(LogUnavailable):
            await reader.append([ev("sbx_a", 2)])
        (q,) = await writer.append([ev("sbx_a", 3)])  # the writer was not fenced by the reader
        assert q > p
    finally:
        await reader.close()
        await writer.close()
