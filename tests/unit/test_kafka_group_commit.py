"""Group commit in the Kafka event log, without a broker: appends that arrive while a Produce
is on its way share the next one, each is answered only once the batch it went in is
durable, and a batch that fails fails every append in it (``KafkaEventLog._dispatch``).

The broker is a stand-in for ``_write_resolving`` (one call = one acknowledged Produce, or
one that failed after its resolve gave up) whose answers the test releases by hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from hutch.core.errors import LogUnavailable
from hutch.core.events import Event
from hutch.eventlog.kafka import KafkaEventLog
from hutch.eventlog.kafka_records import MAX_GROUP_EVENTS, Record
from tests.contracts.test_eventlog import ev


class Broker:
    """Holds each Produce until the test answers it."""

    def __init__(self) -> None:
        self.batches: list[list[Event]] = []
        self.answers: list[asyncio.Future[None]] = []
        self.written = 0
        self.arrived = asyncio.Event()

    async def write(self, events: list[Event], records: list[Record]) -> list[int]:
        assert len(events) == len(records)
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.batches.append(events)
        self.answers.append(answer)
        self.arrived.set()
        await answer  # raises what the test fails the batch with
        base, self.written = self.written, self.written + len(events)
        return [base + 1 + i for i in range(len(events))]

    async def produced(self, n: int) -> None:
        """Wait until ``n`` Produce calls were made."""
        while len(self.batches) < n:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 5)


@pytest.fixture
def broker() -> Broker:
    return Broker()


@pytest.fixture
def log(broker: Broker) -> KafkaEventLog:
    made = KafkaEventLog("localhost:1", "unit")  # never started: nothing reaches a network
    made._write_resolving = broker.write  # type: ignore[method-assign]
    return made


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def appending(log: KafkaEventLog, sandbox: str, sizes: Sequence[int],
                    given: list[list[Event]] | None = None) -> list[asyncio.Task[list[int]]]:
    """One append per size, each of that many events (kept in ``given``), started at once."""
    batches = [[ev(sandbox, i * 100 + j) for j in range(n)] for i, n in enumerate(sizes)]
    if given is not None:
        given.extend(batches)
    tasks = [asyncio.create_task(log.append(events)) for events in batches]
    await settle()
    return tasks


async def test_appends_made_while_a_produce_is_in_flight_share_the_next_one(log: KafkaEventLog, broker: Broker) -> None:
    (first,) = await appending(log, "sbx_a", [1])
    await broker.produced(1)
    given: list[list[Event]] = []
    waiting = await appending(log, "sbx_b", [1, 2, 1, 3, 1, 1, 2, 1, 1, 1], given)  # during the first Produce
    assert len(broker.batches) == 1, "one Produce at a time: the others wait for it"
    assert not first.done() and not any(t.done() for t in waiting), "nothing is answered before it is durable"

    broker.answers[0].set_result(None)
    assert await first == [1]
    await broker.produced(2)
    assert len(broker.batches) == 2 and len(broker.batches[1]) == 14, "the ten appends went as one Produce"
    await settle()
    assert not any(t.done() for t in waiting), "answered only once their own batch is durable"

    broker.answers[1].set_result(None)
    answers = [await t for t in waiting]
    assert answers == [[2], [3, 4], [5], [6, 7, 8], [9], [10], [11, 12], [13], [14], [15]]
    # Each append's events went in its order, at the positions it was answered with.
    assert [e.event_id for e in broker.batches[1]] == [e.event_id for events in given for e in events]
    assert log._pending == [] and not log._writing


async def test_a_failed_batch_fails_every_append_in_it_and_the_next_batch_still_goes(
        log: KafkaEventLog, broker: Broker) -> None:
    (first,) = await appending(log, "sbx_a", [1])
    await broker.produced(1)
    doomed = await appending(log, "sbx_b", [1, 2, 1, 1])
    broker.answers[0].set_result(None)
    assert await first == [1]
    await broker.produced(2)
    later = await appending(log, "sbx_c", [1, 1])  # arrive during the doomed Produce: not in it

    broker.answers[1].set_exception(LogUnavailable("the broker did not take it"))
    for task in doomed:
        with pytest.raises(LogUnavailable, match="did not take it"):
            await task
    await broker.produced(3)
    assert [len(b) for b in broker.batches] == [1, 5, 2]
    assert not any(t.done() for t in later)
    broker.answers[2].set_result(None)
    assert [await t for t in later] == [[2], [3]], "none of the failed batch was acknowledged"


async def test_an_error_that_is_not_the_logs_own_is_said_as_one(log: KafkaEventLog, broker: Broker) -> None:
    tasks = await appending(log, "sbx_a", [1])
    await broker.produced(1)
    more = await appending(log, "sbx_a", [1, 1])
    broker.answers[0].set_result(None)
    await tasks[0]
    await broker.produced(2)
    broker.answers[1].set_exception(RuntimeError("boom"))
    for task in more:
        with pytest.raises(LogUnavailable, match="event log append failed: boom"):
            await task


async def test_a_group_holds_at_most_max_group_events(log: KafkaEventLog, broker: Broker) -> None:
    (first,) = await appending(log, "sbx_a", [1])
    await broker.produced(1)
    big = MAX_GROUP_EVENTS // 2 + 1
    waiting = await appending(log, "sbx_b", [big, big])  # two together would exceed the bound
    broker.answers[0].set_result(None)
    await first
    await broker.produced(2)
    assert len(broker.batches[1]) == big
    broker.answers[1].set_result(None)
    await broker.produced(3)
    assert len(broker.batches[2]) == big
    broker.answers[2].set_result(None)
    assert [len(await t) for t in waiting] == [big, big]


async def test_close_fails_appends_still_waiting_for_a_produce(log: KafkaEventLog, broker: Broker) -> None:
    (first,) = await appending(log, "sbx_a", [1])
    await broker.produced(1)
    waiting = await appending(log, "sbx_b", [1, 1])
    log.append_timeout = 0.2  # close() waits this long for the Produce in flight
    await log.close()
    for task in waiting:
        with pytest.raises(LogUnavailable, match="closed before the append was written"):
            await task
    assert not first.done(), "the Produce in flight is still unanswered: not acknowledged"
    first.cancel()
