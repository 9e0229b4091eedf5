"""The EventLog contract, run against every backend."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import attrs
import pytest

from hutch.core import ids
from hutch.core.errors import NotSupported
from hutch.core.eventlog.base import EventLog, LogCapabilities
from hutch.core.events import Event, ExecutionStarted, SandboxStarted, encoded
from hutch.service.composition import open_event_log
from tests.services import drop_topics, kafka_url

BACKENDS = ["sqlite", "kafka"]


def backend_url(name: str) -> str:
    """The event-log URL for a backend; Kafka gets a fresh topic on the test broker."""
    return kafka_url("log") if name == "kafka" else name


@pytest.fixture(params=BACKENDS)
async def event_log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EventLog]:
    url = backend_url(request.param)
    log = open_event_log(url, tmp_path)
    await log.start()
    yield log
    await log.close()
    if url.startswith("kafka://"):
        await drop_topics(url)


# What each backend declares it can do beyond the port's required methods, and the optional
# method each flag stands for. A backend declares a flag exactly when it implements the method.
DECLARED = {
    "SqliteEventLog": LogCapabilities(),
    "KafkaEventLog": LogCapabilities(consumer_groups=True),
}
OPTIONAL_METHODS = {"consumer_groups": "consume_group"}


class Collector:
    """A consumer group member that keeps what it is given (``EventLog.consume_group``)."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.caught_up = asyncio.Event()

    async def resume_points(self, source: str, partitions: Sequence[int]) -> dict[int, int]:
        return {}

    async def deliver(self, source: str, records: Sequence[tuple[int, int, Event]]) -> None:
        self.events.extend(event for _, _, event in records)

    def mark_caught_up(self) -> None:
        self.caught_up.set()


async def test_declares_exactly_what_it_implements(event_log: EventLog) -> None:
    assert event_log.capabilities == DECLARED[type(event_log).__name__]
    assert set(OPTIONAL_METHODS) == {f.name for f in LogCapabilities.__attrs_attrs__}
    for flag, method in OPTIONAL_METHODS.items():
        implemented = getattr(type(event_log), method) is not getattr(EventLog, method)
        assert getattr(event_log.capabilities, flag) == implemented, (flag, method)
    appended = await event_log.append([ev("sbx_a", 1), ev("sbx_b", 2)])
    member = Collector()
    if not event_log.capabilities.consumer_groups:
        with pytest.raises(NotSupported):
            await event_log.consume_group("contract", member)
        return
    task = asyncio.create_task(event_log.consume_group("contract-" + ids.new_id("event"), member))
    try:
        await asyncio.wait_for(member.caught_up.wait(), 60)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert sorted(e.position or 0 for e in member.events) == appended


def ev(sandbox_id: str, n: int = 0) -> Event:
    return Event(ids.new_id("event"), sandbox_id, "2026-01-01T00:00:00.000Z",
                 ExecutionStarted(execution_id=f"exec_{n}", command=("echo", str(n))))


def exec_id(event: Event) -> str:
    """The execution id of an event ``ev`` made."""
    assert isinstance(event.data, ExecutionStarted)
    return event.data.execution_id


async def test_empty_log(event_log: EventLog) -> None:
    assert await event_log.last_position() == 0
    assert await event_log.read() == []


async def test_append_assigns_increasing_positions_and_reads_back(event_log: EventLog) -> None:
    first = await event_log.append([ev("sbx_a", 1), ev("sbx_b", 2)])
    second = await event_log.append([ev("sbx_a", 3)])
    positions = first + second
    assert positions == sorted(positions) and len(set(positions)) == 3
    events = await event_log.read()
    assert [e.position for e in events] == positions
    assert [exec_id(e) for e in events] == ["exec_1", "exec_2", "exec_3"]
    assert await event_log.last_position() == positions[-1]


async def test_read_after_position_per_sandbox_limit_and_reverse(event_log: EventLog) -> None:
    positions = []
    for i in range(6):
        positions += await event_log.append([ev("sbx_a" if i % 2 == 0 else "sbx_b", i)])
    assert [e.position for e in await event_log.read(positions[2])] == positions[3:]
    a = await event_log.read(sandbox_id="sbx_a")
    assert [exec_id(e) for e in a] == ["exec_0", "exec_2", "exec_4"]
    assert len(await event_log.read(limit=2)) == 2
    rev = await event_log.read(sandbox_id="sbx_b", reverse=True, limit=2)
    assert [exec_id(e) for e in rev] == ["exec_5", "exec_3"]


async def test_encoded_events_are_appended_as_their_records(event_log: EventLog) -> None:
    """The recorder hands the log each event with its record (``core.events.Encoded``), so
    that its check, the quota and the log use one encoding; bare events may sit beside them."""
    given = [ev("sbx_a", 1), ev("sbx_b", 2), ev("sbx_a", 3)]
    positions = await event_log.append([encoded(given[0]), given[1], encoded(given[2])])
    back = await event_log.read()
    assert [e.position for e in back] == positions
    assert back == [attrs.evolve(e, position=p) for e, p in zip(given, positions, strict=True)]
    seen: list[Event] = []
    async with asyncio.timeout(30):
        async for e in event_log.subscribe(0):
            seen.append(e)
            if len(seen) == 3:
                break
    assert seen == back


async def test_payload_round_trips(event_log: EventLog) -> None:
    original = Event(ids.new_id("event"), "sbx_x", "2026-01-01T00:00:00.000Z", SandboxStarted())
    await event_log.append([original])
    (back,) = await event_log.read()
    assert back.event_id == original.event_id and back.data == original.data and back.type == "lifecycle:started"


async def test_concurrent_appends_are_all_kept_in_a_total_order(event_log: EventLog) -> None:
    results = await asyncio.gather(*(event_log.append([ev(f"sbx_{i % 3}", i)]) for i in range(200)))
    positions = [p for r in results for p in r]
    assert len(set(positions)) == 200
    assert [e.position for e in await event_log.read()] == sorted(positions)


async def test_subscribe_sees_backlog_then_new_events(event_log: EventLog) -> None:
    await event_log.append([ev("sbx_a", 1)])
    seen: list[Event] = []

    async def consume() -> None:
        async for e in event_log.subscribe(0):
            seen.append(e)
            if len(seen) == 3:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    await event_log.append([ev("sbx_a", 2), ev("sbx_b", 3)])
    await asyncio.wait_for(task, 5)
    assert [exec_id(e) for e in seen] == ["exec_1", "exec_2", "exec_3"]


async def test_subscribe_from_a_position_skips_earlier_events(event_log: EventLog) -> None:
    (p1,) = await event_log.append([ev("sbx_a", 1)])
    await event_log.append([ev("sbx_a", 2)])
    agen = event_log.subscribe(p1)
    first = await asyncio.wait_for(agen.__anext__(), 5)
    await agen.aclose()
    assert exec_id(first) == "exec_2"


async def test_events_survive_reopen(tmp_path: Path) -> None:
    log = open_event_log("sqlite", tmp_path)
    await log.start()
    await log.append([ev("sbx_a", 1), ev("sbx_a", 2)])
    await log.close()
    again = open_event_log("sqlite", tmp_path)
    await again.start()
    try:
        assert len(await again.read()) == 2
        (p,) = await again.append([ev("sbx_a", 3)])
        assert p == 3
    finally:
        await again.close()



@pytest.mark.parametrize("backend", BACKENDS)
async def test_identity_is_fixed_for_the_life_of_a_log_and_differs_between_logs(backend: str, tmp_path: Path) -> None:
    url, other_url = backend_url(backend), backend_url(backend)
    log = open_event_log(url, tmp_path)
    await log.start()
    other = open_event_log(other_url, tmp_path / "other")  # a fresh topic, another file
    await other.start()
    try:
        identity = await log.identity()
        assert identity, "a writer's log has an identity from its start, empty or not"
        await log.append([ev("sbx_a", 1)])
        assert await log.identity() == identity
        assert [exec_id(e) for e in await log.read()] == ["exec_1"]
        # The same log opened again (a restart, another process, a reader): the same identity.
        for read_only in (False, True):
            again = open_event_log(url, tmp_path, read_only=read_only)
            await again.start()
            try:
                assert await again.identity() == identity
            finally:
                await again.close()
        assert await other.identity() not in (None, identity)
    finally:
        await log.close()
        await other.close()
        for made in (url, other_url):
            if made.startswith("kafka://"):
                await drop_topics(made)
