"""A subscriber of the Kafka event log (``KafkaEventLog.subscribe``): the order topic as the
broker hands it out, and this process's own appends as soon as they are acknowledged.

Why both: an append's events reached the projector only once a Fetch brought them back,
1.2 ms p50 after the Produce's answer on one quiet box (bench/phases.py, 2026-11-30), on the
way of every write that waits for its projection (two per one-shot). The SQLite log hands its
own appends to its subscribers the same way (``eventlog.sqlite``).

What a subscriber gets does not change: every event once, in log order, only once it is
acknowledged (``acks=all``: readable by any consumer from then on). An acknowledged group is
handed out only when it follows on directly from the last record this subscriber saw (its
first offset is the next one); otherwise it is dropped here and comes with the Fetch, like
everyone else's events. The Fetch's copies of what was handed out already are skipped without
being decoded; a Fetch that goes back behind what it brought before (a recreated topic) is
handed on as it is, for the subscriber to see the log went back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from hutch.core import counters, phases
from hutch.core.events import Event
from hutch.eventlog.kafka_records import decode_record, is_marker

log = logging.getLogger(__name__)

BACKLOG = 256  # fetched batches and acknowledged groups waiting for a slow subscriber


class Inbox:
    """What one subscriber has not taken yet: fetched record batches, acknowledged groups."""

    def __init__(self) -> None:
        self.items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=BACKLOG)

    def acknowledged(self, events: Sequence[Event]) -> None:
        """This process's append, acknowledged, with its positions. Dropped when the subscriber
        is that far behind: the Fetch brings it."""
        with contextlib.suppress(asyncio.QueueFull):
            self.items.put_nowait(("acked", events))


async def _fetch(consumer: AIOKafkaConsumer, tp: TopicPartition, after: int, inbox: Inbox) -> None:
    """Long-polls: the broker answers as soon as a Produce makes new records readable."""
    try:
        started = False
        while not started:
            try:
                await consumer.start()
                started = True
            except KafkaError as err:
                log.warning("subscriber cannot reach Kafka (%s); retrying", err)
                await asyncio.sleep(1.0)
        consumer.assign([tp])
        consumer.seek(tp, after)  # position p is offset p - 1: the next one to read is offset `after`
        while True:
            try:
                batch = await consumer.getmany(tp, timeout_ms=1000, max_records=1000)
            except KafkaError as err:
                log.warning("subscriber fetch failed (%s); retrying", err)
                await asyncio.sleep(0.5)
                continue
            records = batch.get(tp)
            if records:
                await inbox.items.put(("fetched", records))
    except asyncio.CancelledError:
        raise
    except Exception as err:  # raised to the subscriber, not left to hang it
        await inbox.items.put(("failed", err))


async def follow(consumer: AIOKafkaConsumer, tp: TopicPartition, after: int, inbox: Inbox,
                 acked_at: dict[int, int]) -> AsyncIterator[Event]:
    """The events after position ``after``, in order. ``acked_at``: bench/phases.py's times of
    each Produce's answer, by its last position (empty unless HUTCH_PHASES=1)."""
    fetching = asyncio.create_task(_fetch(consumer, tp, after, inbox), name="kafka-subscriber-fetch")
    seen = after  # the last position handed out or passed (a marker), by either source
    fetched = after  # the last position the Fetch brought
    try:
        while True:
            kind, item = await inbox.items.get()
            if kind == "failed":
                raise item
            if kind == "acked":
                if item[0].position != seen + 1:
                    continue  # something lies between (another writer's, a marker): the Fetch has it
                seen = item[-1].position
                counters.count("hutch_eventlog_acked_handed_events_total", len(item))
                if phases.ON and (t0 := acked_at.pop(seen, 0)):
                    phases.end("log: Produce answered -> its last event subscribed", t0)
                for event in item:
                    yield event
                continue
            for rec in item:
                position = rec.offset + 1
                if fetched < position <= seen:
                    fetched = position
                    continue  # handed out already, as it was acknowledged
                fetched = seen = position
                if phases.ON and (t0 := acked_at.pop(position, 0)):
                    phases.end("log: Produce answered -> its last event subscribed", t0)
                if not is_marker(rec.headers):
                    yield decode_record(rec.value, position)
    finally:
        fetching.cancel()
        with contextlib.suppress(BaseException):
            await fetching
        with contextlib.suppress(Exception):
            await consumer.stop()
