"""Consumer groups on the Kafka event log (``KafkaEventLog.consume_group``): members of one
group share the events topic's partitions, each resuming at the later of the group's
committed offset and what the member says it already holds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import KafkaError

from hutch.core.eventlog.base import GroupMember
from hutch.eventlog.kafka_records import MAX_EVENT_BYTES, decode_record

log = logging.getLogger(__name__)


async def consume_group(bootstrap: str, topic: str, group: str, member: GroupMember, *,
                        index_done: Callable[[], Awaitable[dict[int, int] | None]],
                        client_id: str = "hutch-audit") -> None:
    """Follow ``topic`` as a member of ``group`` until cancelled. ``index_done`` says what the
    keyed topic holds once the index has copied the whole order topic (None before): a member
    has caught up only when it read that far (``eventlog.kafka_index``)."""

    class Resume(ConsumerRebalanceListener):  # aiokafka is untyped: a subclass of Any
        async def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        async def on_partitions_assigned(self, assigned: Any) -> None:
            held = await member.resume_points(topic, [tp.partition for tp in assigned])
            for tp in assigned:
                committed = await consumer.committed(tp)
                # The member holds everything below its point: resume at the later of the two.
                ours = held.get(tp.partition, 0)
                if ours or committed:
                    consumer.seek(tp, max(ours, committed or 0))

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",  # a new member starts from the beginning of the log
        isolation_level="read_committed",
        max_partition_fetch_bytes=MAX_EVENT_BYTES + 2**16,
    )
    consumer.subscribe([topic], listener=Resume())
    await consumer.start()
    try:
        await _follow(consumer, topic, member, index_done)
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()


async def _follow(consumer: AIOKafkaConsumer, topic: str, member: GroupMember,
                  index_done: Callable[[], Awaitable[dict[int, int] | None]]) -> None:
    while True:
        try:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
        except KafkaError as err:
            log.warning("consumer group: fetch failed (%s); retrying", err)
            await asyncio.sleep(0.5)
            continue
        for tp, records in batches.items():
            events = [(tp.partition, rec.offset,
                       decode_record(rec.value, int(dict(rec.headers or ())["position"])))
                      for rec in records]
            await member.deliver(topic, events)
            with contextlib.suppress(KafkaError):  # the member's resume points cover a lost commit
                await consumer.commit({tp: records[-1].offset + 1})
        if not batches and consumer.assignment():
            copied = await index_done()
            if copied is None:
                continue
            ends = await consumer.end_offsets(list(consumer.assignment()))
            if all([end > copied.get(tp.partition, -1) and await consumer.position(tp) >= end
                    for tp, end in ends.items()]):
                member.mark_caught_up()
