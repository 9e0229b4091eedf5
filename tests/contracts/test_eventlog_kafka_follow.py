"""A Kafka subscriber has this process's appends as soon as they are acknowledged, without
waiting for a Fetch to bring them back (``eventlog.kafka_follow``): the projection wait of
every write was a Fetch longer. What it is handed does not change: every event once, in log
order, and another writer's events in between are never jumped (a real broker)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hutch.core.events import Event
from hutch.eventlog import kafka_follow
from hutch.eventlog.kafka import KafkaEventLog
from tests.contracts.test_eventlog import ev
from tests.contracts.test_eventlog_kafka import counted, opened
from tests.services import drop_topics, kafka_url


@pytest.fixture
async def url() -> AsyncIterator[str]:
    made = kafka_url("kafka")
    yield made
    await drop_topics(made)


@contextlib.asynccontextmanager
async def following(log: KafkaEventLog, after: int) -> AsyncIterator[list[Event]]:
    """What ``log.subscribe(after)`` hands out, as it comes."""
    got: list[Event] = []

    async def take() -> None:
        async for event in log.subscribe(after):
            got.append(event)

    task = asyncio.create_task(take())
    try:
        yield got
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


async def until(got: list[Event], n: int, within: float) -> None:
    for _ in range(int(within * 100)):
        if len(got) >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(got)} of {n} events handed out within {within} s: {got}")


def fetch_held(monkeypatch: pytest.MonkeyPatch, release: asyncio.Event) -> None:
    """The subscribers' Fetches start only once ``release`` is set."""
    fetch = kafka_follow._fetch

    async def held(*args: Any) -> None:
        await release.wait()
        await fetch(*args)

    monkeypatch.setattr(kafka_follow, "_fetch", held)


async def test_an_acknowledged_append_reaches_this_processs_subscriber_without_a_fetch(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = await opened(url, tmp_path)
    try:
        # The next record after it is ours (the log's first record is its epoch, a marker: a
        # subscriber learns of it from a Fetch, and hands out nothing past it before).
        (after,) = await log.append([ev("sbx_a", 0)])
        fetch_held(monkeypatch, asyncio.Event())  # never set: no Fetch is ever sent
        handed = counted("hutch_eventlog_acked_handed_events_total")
        async with following(log, after) as got:
            await asyncio.sleep(0.1)  # subscribed
            first = await log.append([ev("sbx_a", 1), ev("sbx_b", 2)])
            second = await log.append([ev("sbx_a", 3)])
            await until(got, 3, within=5)
        assert [e.position for e in got] == [*first, *second]
        assert got == await log.read(after), "the same events as the log holds"
        assert counted("hutch_eventlog_acked_handed_events_total") - handed == 3
    finally:
        await log.close()


async def test_another_writers_events_in_between_are_not_jumped(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine, other = await opened(url, tmp_path / "a"), await opened(url, tmp_path / "b")
    try:
        after = await mine.last_position()
        release = asyncio.Event()
        fetch_held(monkeypatch, release)
        async with following(mine, after) as got:
            await asyncio.sleep(0.1)
            (theirs,) = await other.append([ev("sbx_o", 1)])  # only a Fetch brings it here
            (ours,) = await mine.append([ev("sbx_m", 2)])  # acknowledged: not handed out past theirs
            await asyncio.sleep(0.3)
            assert got == [], "nothing before the other writer's event"
            release.set()
            await until(got, 2, within=10)
            (later,) = await mine.append([ev("sbx_m", 3)])  # follows on: handed out as acknowledged
            await until(got, 3, within=10)
            await asyncio.sleep(0.3)  # a copy the Fetch brings would come right behind
        assert [e.position for e in got] == [theirs, ours, later], "in log order, each once"
        assert got == await mine.read(after)
    finally:
        await mine.close()
        await other.close()
