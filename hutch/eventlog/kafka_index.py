"""The keyed events topic of a Kafka event log, derived from its order topic (see
``eventlog.kafka``).

An append is one Produce to the order topic; that is the commit point. The keyed topic
``<topic>`` (events by sandbox over several partitions, each record carrying its position)
serves per-sandbox reads and consumer groups, and is copied from the order topic by one
indexer at a time, in Kafka transactions that also write the indexer's progress to
``<topic>.indexed``: a record is copied exactly once, and a copy and the progress that
covers it are committed together or not at all.

Progress record: ``{"next": N, "keyed": {partition: offset}}``: every order-topic record
below offset N is in the keyed topic, and, per keyed partition, the offset of the last record
copied. A reader uses the second half because a committed transaction becomes readable
partition by partition (each gets its commit marker on its own): it waits until its keyed
partition's stable offset has passed that offset, then knows the partition holds every copy
the progress claims. Whatever the order topic holds past N, the reader scans there itself,
so a per-sandbox read is complete whether or not an indexer runs (``KafkaEventLog.read``).

Who indexes: every writer runs an ``Indexer``; on start it leads, taking the one
transactional id ``hutch-index-<topic>``, which fences the previous leader and aborts the
transaction it left open. A fenced indexer stands by and leads again only once the progress
has stood still behind the order topic's end for ``STALL_CHECKS`` checks (its leader died
or hangs). So the last writer started indexes, and a dead leader is replaced within a few
seconds; meanwhile per-sandbox reads scan further and consumer groups wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from hutch.core import counters
from hutch.eventlog.kafka_records import (
    MAX_GROUP_EVENTS,
    PartitionReader,
    Record,
    is_marker,
    pack_batches,
    partition_for,
    retrieve_exception,
)

log = logging.getLogger(__name__)

STANDBY_CHECK_SECONDS = 1.0
# At most one copy transaction this often (bench/eventlog.py at 1,000 appends/s: a copy per
# fetched record raised the projection lag p50 from 6.8 to 15.6 ms, the indexer sharing the
# process's event loop). A copy costs the broker ~5 ms of CPU whatever it carries
# (AddPartitionsToTxn, EndTxn, a commit marker per partition): at 0.05 s one-shots at
# concurrency 16 paid 0.21 copies each, ~1 ms of the broker's CPU (bench/oneshot_cpu.py). Nothing
# waits on the copy but consumer groups (hutch audit); per-sandbox reads scan the order topic
# past it, so a longer interval only makes them scan a little more.
COPY_INTERVAL_SECONDS = 0.25
STALL_CHECKS = 2  # checks in a row that saw the progress stuck behind the end before leading


@attrs.frozen
class Progress:
    next_offset: int  # every order-topic record below this offset is in the keyed topic
    keyed: dict[int, int] = attrs.field(factory=dict)  # keyed partition -> offset of its last copy

    def encode(self) -> bytes:
        return json.dumps({"next": self.next_offset, "keyed": self.keyed}, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> Progress:
        doc = json.loads(value)
        return cls(int(doc["next"]), {int(k): int(v) for k, v in doc["keyed"].items()})


async def last_progress(indexed: PartitionReader, keyed: Callable[[int], Awaitable[PartitionReader]],
                        partitions: int) -> Progress:
    """The newest committed progress. A log without one (new, or written before the index
    existed, when both topics were written in one transaction) has everything in its keyed
    topic up to the highest position there."""
    async with indexed.lock:
        newest = await indexed.newest()  # before a commit marker, or aborted leaders' records
    if newest:
        return Progress.decode(newest[-1][2])
    highest, copies = 0, {}
    for partition in range(partitions):
        reader = await keyed(partition)
        async with reader.lock:
            # The old transactional writers ran three at a time: positions near a partition's
            # end need not rise with offsets, so the highest of the newest window counts.
            newest = await reader.newest()
        if newest:
            highest = max(highest, *(int(headers.get("position", b"0")) for *_, headers in newest))
            copies[partition] = newest[-1][0]
    return Progress(highest, copies)  # position p is order offset p - 1: the next to copy is offset p


class Indexer:
    """Copies the order topic into the keyed topic while it leads (see the module docstring)."""

    def __init__(self, *, topic: str, order_topic: str, indexed_topic: str, partitions: int,
                 progress: Callable[[], Awaitable[Progress]], end: Callable[[], Awaitable[int]],
                 producer: Callable[[str], Awaitable[AIOKafkaProducer]],
                 consumer: Callable[[], AIOKafkaConsumer]) -> None:
        self.topic, self.order_topic, self.indexed_topic = topic, order_topic, indexed_topic
        self.partitions = partitions
        self.transactional_id = f"hutch-index-{topic}"
        self._progress, self._end = progress, end
        self._new_producer, self._new_consumer = producer, consumer
        self.producer: AIOKafkaProducer | None = None
        self.leading = False

    async def run(self) -> None:
        """Lead, and stand by while fenced, until cancelled."""
        while True:
            try:
                await self._lead()
            except ProducerFenced:
                log.info("event log %s: another server indexes now; standing by", self.topic)
                await self._stand_by()
            except Exception as err:  # Kafka away, or a bug: log it and lead again, never stop quietly
                log.warning("event log %s: indexing failed (%s: %s); again in %g s", self.topic,
                            type(err).__name__, err, STANDBY_CHECK_SECONDS)
                await asyncio.sleep(STANDBY_CHECK_SECONDS)
            finally:
                self.leading = False
                await self._drop_producer()

    async def _lead(self) -> None:
        self.producer = await self._new_producer(self.transactional_id)  # fences the previous leader
        self.leading = True
        progress = await self._progress()  # read after fencing: its last transaction has ended
        keyed = dict(progress.keyed)
        order = TopicPartition(self.order_topic, 0)
        consumer = self._new_consumer()
        try:
            await consumer.start()
            consumer.assign([order])
            consumer.seek(order, progress.next_offset)
            done = progress.next_offset
            loop = asyncio.get_running_loop()
            while True:
                batch = await consumer.getmany(order, timeout_ms=1000, max_records=MAX_GROUP_EVENTS)
                records = batch.get(order, [])
                if records:
                    began = loop.time()
                    done = await self._copy(self.producer, records, keyed)
                    # Paced: a transaction per copy costs four round trips and the CPU that
                    # a server's requests need, so what arrives meanwhile waits for one copy.
                    await asyncio.sleep(began + COPY_INTERVAL_SECONDS - loop.time())
                elif (ahead := await consumer.position(order)) > done:
                    # Only commit markers lay ahead (a log written before the index existed):
                    # say so, or a standby would take the end it can never reach for a stall.
                    done = await self._copy(self.producer, [], keyed, upto=ahead)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def _copy(self, producer: AIOKafkaProducer, records: list[Any], keyed: dict[int, int],
                    *, upto: int | None = None) -> int:
        """One transaction: the records into their keyed partitions, then the progress.
        Returns the order offset copied up to."""
        by_partition: dict[int, list[Record]] = {}
        for rec in records:
            if is_marker(rec.headers):
                continue
            key = rec.key or b""
            by_partition.setdefault(partition_for(key.decode(errors="replace"), self.partitions), []).append(
                (key, rec.value, (("position", str(rec.offset + 1).encode()),)))
        async with producer.transaction():
            pending = []
            for partition, copies in by_partition.items():
                for builder, count in pack_batches(producer, copies):
                    fut = await producer.send_batch(builder, self.topic, partition=partition)
                    fut.add_done_callback(retrieve_exception)
                    pending.append((partition, fut, count))
            written = dict(keyed)
            for partition, fut, count in pending:
                meta = await fut
                written[partition] = max(written.get(partition, -1), meta.offset + count - 1)
            done = Progress(records[-1].offset + 1 if records else upto or 0, written)
            fut = await producer.send(self.indexed_topic, done.encode(), key=b"progress", partition=0)
            fut.add_done_callback(retrieve_exception)
            await fut
        keyed.update(written)
        counters.count("hutch_eventlog_index_copies_total")
        counters.count("hutch_eventlog_index_copy_events_total", sum(len(c) for c in by_partition.values()))
        return done.next_offset

    async def _stand_by(self) -> None:
        """Return once the progress stood still behind the end for STALL_CHECKS checks."""
        seen, stalled = -1, 0
        while stalled < STALL_CHECKS:
            await asyncio.sleep(STANDBY_CHECK_SECONDS)
            try:
                done, end = (await self._progress()).next_offset, await self._end()
            except KafkaError as err:
                log.warning("event log %s: standby check failed (%s)", self.topic, err)
                continue
            stalled = stalled + 1 if done < end and done == seen else 0
            seen = done
        log.warning("event log %s: the index stopped at offset %d; taking over", self.topic, seen)

    async def _drop_producer(self) -> None:
        old, self.producer = self.producer, None
        if old is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(old.stop(), 5)
