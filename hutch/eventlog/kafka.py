"""The production event log: Apache Kafka, through aiokafka.

Three topics per log:

* ``<topic>.order`` — the events in one partition. Its offsets *are* the global order:
  ``position = offset + 1`` (0 stays "before the first event"). An append is one Produce
  of one record batch here, and that is its commit point.
* ``<topic>`` — the same events keyed by sandbox id over several partitions (6 by default),
  so per-sandbox reads touch one partition and consumer groups (``hutch audit``) spread
  partitions over their members. Every record carries its position in a ``position`` header.
  Copied from the order topic, exactly once, by an indexer (``eventlog.kafka_index``).
* ``<topic>.indexed`` — how far that copy got.

Why this design: the contract wants one total order that agrees with append order
(``read(after)``, ``subscribe(after)``, ``last_position()``, the events API's paging, the
projector's single tracked position). Kafka orders only within a partition, so a
global position needs a sequencer. Encoding (partition, offset) into one int gives *a*
total order, but not append order: an event appended later could get a smaller
position than one already acknowledged, and a projector that already applied the
larger one would skip it. A sequence kept outside Kafka (a database counter) couples
the log to the store and still leaves the gap-between-sequence-and-write problem.
A single-partition topic is Kafka's own sequencer: the broker assigns offsets in the
order it appends, with no coordination between writers.

Until 2026-11 both topics were written in one Kafka transaction per append. That cost
16.5 ms an append (AddPartitionsToTxn, Produce, EndTxn, then the commit markers) against
2.0 ms for one idempotent Produce on the same broker, and an execute appends twice. So the
append writes only the order topic, and the keyed topic follows a moment later; a
per-sandbox read covers the gap by scanning the order topic past the index's progress, so
it still sees every append acknowledged before it began. Consumer groups see an event once
the indexer copied it.

Durability and atomicity: the producer is idempotent with ``acks=all``; ``append``
returns once the broker acknowledged the batch, which is readable from then on (no
transaction: the last stable offset is the high watermark). One append is one record
batch, which Kafka writes whole or not at all; an append too big for one batch is refused.
The producer retries a batch it could not deliver under its producer id and sequence
number, so the broker keeps one copy however often it arrives; an append waits for that (up
to ``append_timeout``), so a broker restart delays appends instead of failing them. If the
wait runs out or the batch fails, the append is resolved before anyone is told: the producer
is abandoned at once (its sender stopped, its connections closed), a new one writes a
*resolve bound* (a record every reader skips) with ``acks=all``, and the order topic below
that bound is searched for the events' ids. Found: they are acknowledged with their
positions. Not found: they are written again. What this cannot rule out, unlike the
transactions it replaced (which fenced the old producer): a request of the abandoned
producer that the broker had read but appends only after the bound would be written twice
(readers then see that event twice).

Identity: the cluster id, the topic, and the log's epoch, ``kafka:<cluster>/<topic>@<epoch>``.
The epoch is a record written once at the start of the order topic by the first writer
that finds it empty (a random id in an ``epoch`` header; readers skip it: it is no event).
A recreated topic gets a new one, so a projection store bound to the old log refuses the
new one (``projections.runner``). Logs made before epochs existed have their first
event's id as theirs. Should two writers start on one empty topic at once, both write an
epoch; the first in the topic is the log's, and both read that one back.

A subscriber in the writing process has that process's appends as soon as they are
acknowledged, and everything else as its Fetches bring it (``eventlog.kafka_follow``).

Topics are created on start when missing, with unlimited retention (the log is the
source of truth). Never change the partition count of an existing topic: per-sandbox
reads look in the partition the key hashes to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import attrs
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from hutch.core import counters, phases
from hutch.core.errors import InvalidInput, LogUnavailable
from hutch.core.eventlog.base import EventLog, GroupMember, LogCapabilities
from hutch.core.events import Encoded, Event
from hutch.eventlog.kafka_follow import Inbox, follow
from hutch.eventlog.kafka_groups import consume_group
from hutch.eventlog.kafka_index import Indexer, Progress, last_progress
from hutch.eventlog.kafka_records import (
    DEFAULT_PARTITIONS,
    EPOCH_HEADER,
    GROUP_BYTES,
    ID_CLOCK_SLACK_MS,
    MAX_APPEND_BYTES,
    MAX_EVENT_BYTES,
    MAX_GROUP_EVENTS,
    RECORD_OVERHEAD,
    RESOLVE_HEADER,
    PartitionReader,
    Record,
    decode_record,
    id_millis,
    is_marker,
    pack_batches,
    parse_url,
    partition_for,
    record_bytes,
    retrieve_exception,
)
from hutch.eventlog.kafka_topics import ensure_topics

log = logging.getLogger(__name__)
class KafkaEventLog(EventLog):
    capabilities = LogCapabilities(consumer_groups=True)

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        partitions: int = DEFAULT_PARTITIONS,
        replication: int | None = None,
        append_timeout: float = 60.0,
        produce_timeout: float = 8.0,
        writer: bool = True,
        client_id: str = "hutch",
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.order_topic = f"{topic}.order"
        self.indexed_topic = f"{topic}.indexed"
        self.partitions = partitions
        self.replication = replication
        self.append_timeout = append_timeout
        self.produce_timeout = produce_timeout
        self.client_id = client_id
        self.writer = writer
        self._producer: AIOKafkaProducer | None = None
        self._writing = False  # one Produce at a time: appends waiting meanwhile go in the next
        self._watcher: AIOKafkaConsumer | None = None  # asks for end offsets; never fetches
        self._readable_waiters: list[tuple[dict[TopicPartition, int], asyncio.Future[None]]] = []
        self._readable_poller: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._readers: dict[TopicPartition, PartitionReader] = {}
        self._subscribers: set[Inbox] = set()  # handed this process's appends once acknowledged
        self._making_reader = asyncio.Lock()
        self._order_tp = TopicPartition(self.order_topic, 0)
        self._indexed_tp = TopicPartition(self.indexed_topic, 0)
        self._pending: list[tuple[Sequence[Event], list[Record], int, asyncio.Future[list[int]]]] = []
        self._scan_from = 0  # no record of an unresolved append of ours lies below this offset
        self._closed = False
        self.indexer: Indexer | None = None
        self._indexing: asyncio.Task[None] | None = None
        self.cluster_id: str | None = None
        self._identity: str | None = None
        # bench/phases.py only (HUTCH_PHASES=1): when each Produce was acknowledged, by its last
        # position, so that the subscriber can time how long its events took to reach it.
        self._acked_at: dict[int, int] = {}

    @classmethod
    def from_url(cls, url: str, data_dir: Path, *, writer: bool = True) -> KafkaEventLog:
        bootstrap, topic, params = parse_url(url)
        unknown = set(params) - {"partitions", "replication", "transactional_id"}
        if unknown:
            raise InvalidInput(f"event log: unknown parameter(s) {sorted(unknown)} in {url!r}", field="event_log")
        # transactional_id: still accepted, no longer used (appends take no transaction).
        return cls(
            bootstrap,
            topic,
            partitions=int(params.get("partitions", DEFAULT_PARTITIONS)),
            replication=int(params["replication"]) if "replication" in params else None,
            writer=writer,
        )

    # ---------------------------------------------------------------- lifetime

    async def start(self) -> None:
        try:
            await self._ensure_topics()
            self._watcher = self._consumer()
            await self._watcher.start()
            if self.writer:
                self._producer = await self._new_producer(None)
            reader = await self._reader(self._order_tp)
            async with reader.lock:
                first, end = await reader.bounds()
            if end == first and self.writer:
                await self._write_epoch()
            async with reader.lock:
                self._scan_from = (await reader.bounds())[1]
        except KafkaError as err:
            await self.close()
            raise LogUnavailable(f"cannot open the Kafka event log at {self.bootstrap}: {err}") from err
        if self.writer:
            self.indexer = Indexer(
                topic=self.topic, order_topic=self.order_topic,
                indexed_topic=self.indexed_topic, partitions=self.partitions, progress=self._progress,
                end=self._order_end, producer=self._new_producer, consumer=lambda: self._consumer(fetch_max_wait_ms=500))
            self._indexing = asyncio.create_task(self.indexer.run(), name="kafka-eventlog-indexer")

    async def close(self) -> None:
        self._closed = True
        if self._indexing is not None:
            self._indexing.cancel()
            with contextlib.suppress(BaseException):
                await self._indexing
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=self.append_timeout)
        for fut in [f for *_, f in self._pending]:
            if not fut.done():
                fut.set_exception(LogUnavailable("the Kafka event log closed before the append was written"))
        self._pending = []
        if self._readable_poller is not None:
            self._readable_poller.cancel()
        for _, waiter in self._readable_waiters:  # reads waiting on it fail now, not in a minute
            if not waiter.done():
                waiter.set_exception(LogUnavailable("the Kafka event log closed"))
        self._readable_waiters = []
        await self._drop_producer()
        if self._watcher is not None:
            watcher, self._watcher = self._watcher, None
            with contextlib.suppress(Exception):
                await watcher.stop()
        readers, self._readers = list(self._readers.values()), {}
        for r in readers:
            with contextlib.suppress(Exception):
                await r.consumer.stop()

    async def _ensure_topics(self) -> None:
        self.cluster_id, self.partitions = await ensure_topics(
            self.bootstrap, self.topic, self.order_topic, self.indexed_topic, partitions=self.partitions,
            replication=self.replication, client_id=self.client_id)

    async def _write_epoch(self) -> None:
        """Start an empty log with its epoch record (order topic only: it has no sandbox)."""
        assert self._producer is not None
        epoch = uuid.uuid4().hex
        fut = await self._producer.send(self.order_topic, value=json.dumps({"epoch": epoch}).encode(), partition=0,
                                        headers=[(EPOCH_HEADER, epoch.encode())])
        fut.add_done_callback(retrieve_exception)
        await fut
        log.info("event log %s/%s: new log, epoch %s", self.cluster_id, self.topic, epoch)

    async def identity(self) -> str | None:
        if self._identity is None:
            reader = await self._reader(self._order_tp)
            async with reader.lock:
                first, end = await reader.bounds()
                async for _, _, value, headers in reader.scan(first, min(end, first + 1)):
                    epoch = headers[EPOCH_HEADER].decode() if EPOCH_HEADER in headers else \
                        decode_record(value, 1).event_id
                    self._identity = f"kafka:{self.cluster_id or '?'}/{self.topic}@{epoch}"
        return self._identity

    async def _new_producer(self, transactional_id: str | None) -> AIOKafkaProducer:
        """The appender's idempotent producer (no id), or the indexer's transactional one."""
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=self.client_id,
            transactional_id=transactional_id,
            enable_idempotence=True,
            acks="all",
            max_request_size=MAX_EVENT_BYTES + 2**16,
            transaction_timeout_ms=10_000,
            request_timeout_ms=15_000,
            linger_ms=0,
            max_batch_size=MAX_EVENT_BYTES,
        )
        try:
            await producer.start()  # transactional: init_transactions fences an older holder of the id
        except BaseException:
            with contextlib.suppress(Exception):
                await producer.stop()
            raise
        return producer

    async def _drop_producer(self) -> None:
        old, self._producer = self._producer, None
        if old is not None:
            # stop() flushes what is pending, which never ends while the broker is away.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(old.stop(), 5)

    async def _reader(self, tp: TopicPartition) -> PartitionReader:
        reader = self._readers.get(tp)
        if reader is None:
            async with self._making_reader:  # one per partition (the indexer reads beside requests)
                reader = self._readers.get(tp)
                if reader is None:
                    consumer = self._consumer()
                    try:
                        await consumer.start()
                    except BaseException:  # cancelled half-way (a close): nothing left open
                        with contextlib.suppress(Exception):
                            await consumer.stop()
                        raise
                    consumer.assign([tp])
                    consumer.pause(tp)
                    reader = self._readers[tp] = PartitionReader(consumer, tp)
        return reader

    def _consumer(self, *, fetch_max_wait_ms: int = 0) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            client_id=self.client_id,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=MAX_EVENT_BYTES + 2**16,
            fetch_max_wait_ms=fetch_max_wait_ms,
            request_timeout_ms=15_000,
        )

    # ---------------------------------------------------------------- append

    async def append(self, events: Sequence[Event | Encoded]) -> list[int]:
        if not events:
            return []
        if not self.writer:
            raise LogUnavailable("this Kafka event log was opened read-only")
        if self._closed:
            raise LogUnavailable("the Kafka event log is not started")
        # Encoded once (by the recorder, or here): the size check and the Produce (and a resend)
        # use the same bytes.
        plain = [e.event if isinstance(e, Encoded) else e for e in events]
        records: list[Record] = [(e.sandbox_id.encode(), record_bytes(x), ()) for e, x in zip(plain, events, strict=True)]
        size = sum(len(key) + len(value) + RECORD_OVERHEAD for key, value, _ in records)
        if size > MAX_APPEND_BYTES:
            raise InvalidInput(f"an append of {len(events)} event(s) takes {size} bytes; "
                               f"at most {MAX_APPEND_BYTES} fit in one record batch")
        counters.count("hutch_eventlog_appends_total")
        counters.count("hutch_eventlog_append_events_total", len(events))
        fut: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._pending.append((plain, records, size, fut))
        self._dispatch()
        return await fut

    def _dispatch(self) -> None:
        """Send what is pending as one record batch, unless a Produce is on its way already."""
        if self._writing or not self._pending:
            return
        group: list[tuple[Sequence[Event], list[Record], asyncio.Future[list[int]]]] = []
        count = size = 0
        while self._pending and (not group or (count + len(self._pending[0][0]) <= MAX_GROUP_EVENTS
                                               and size + self._pending[0][2] <= GROUP_BYTES)):
            events, records, bytes_, fut = self._pending.pop(0)
            group.append((events, records, fut))
            count, size = count + len(events), size + bytes_
        self._writing = True
        task = asyncio.create_task(self._commit_group(group), name="kafka-eventlog-append")
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _commit_group(self, group: list[tuple[Sequence[Event], list[Record], asyncio.Future[list[int]]]]) -> None:
        try:
            positions = await self._write_resolving([e for evs, _, _ in group for e in evs],
                                                    [r for _, recs, _ in group for r in recs])
        except Exception as err:
            error = err if isinstance(err, LogUnavailable) else LogUnavailable(f"event log append failed: {err}")
            for *_, fut in group:
                if not fut.done():
                    fut.set_exception(error)
        else:
            i = 0
            for evs, _, fut in group:
                if not fut.done():
                    fut.set_result(positions[i : i + len(evs)])
                i += len(evs)
            # Before the writers run (they wake on the loop's next turns): their projection
            # waits need these, and a Fetch would bring them back a millisecond later.
            self._hand_to_subscribers(group, positions)
        finally:
            self._writing = False
            if not self._closed:
                self._dispatch()

    def _hand_to_subscribers(self, group: list[tuple[Sequence[Event], list[Record], asyncio.Future[list[int]]]],
                             positions: list[int]) -> None:
        """This process's subscribers get an acknowledged group at once (``eventlog.kafka_follow``)."""
        if not self._subscribers:
            return
        try:
            events = (e for evs, _, _ in group for e in evs)
            values = (value for _, recs, _ in group for _, value, _ in recs)
            appended = [attrs.evolve(e, position=p, size=len(v))
                        for e, p, v in zip(events, positions, values, strict=True)]
        except Exception:  # never in the way of the answers: the Fetch brings them anyway
            log.exception("acknowledged events not handed to this process's subscribers")
            return
        for inbox in self._subscribers:
            inbox.acknowledged(appended)

    async def _write_resolving(self, events: list[Event], records: list[Record]) -> list[int]:
        """Write as one batch. The idempotent producer retries a batch it could not deliver
        under its producer id and sequence number, so the broker keeps one copy however often
        it arrives: wait for it (up to ``append_timeout``: a broker restart delays appends).
        If it failed or the wait ran out, find out what the broker kept (abandon the producer,
        write a bound with a new one, search below it); not there, write it again."""
        deadline = time.monotonic() + 2 * self.append_timeout
        delay = 0.1
        while True:
            floor = self._scan_from  # everything appended before this batch was sent lies below
            try:
                return await self._write(records)
            except (KafkaError, TimeoutError) as err:
                failure: BaseException = err
            log.warning("Kafka append of %d event(s) failed (%s); resolving", len(events), failure)
            while True:
                if self._closed or time.monotonic() > deadline:
                    raise LogUnavailable(f"the Kafka event log did not take the append ({failure}); whether it "
                                         "was written is not known until the broker answers") from failure
                try:
                    await self._abandon_producer()
                    self._producer = await self._new_producer(None)
                    found = await self._find(events, floor, await self._bound())
                    break
                except (KafkaError, TimeoutError) as err:
                    failure = err
                    log.warning("Kafka still unavailable (%s); retrying", err)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
            if found is not None:
                return found

    async def _write(self, records: list[Record]) -> list[int]:
        producer = self._producer
        if producer is None:
            raise LogUnavailable("the Kafka event log is closed")
        ((builder, n),) = pack_batches(producer, records)  # append() sized the group to fit one
        counters.count("hutch_eventlog_writes_total")
        counters.count("hutch_eventlog_write_events_total", n)
        t0 = phases.start()
        fut = await producer.send_batch(builder, self.order_topic, partition=0)
        fut.add_done_callback(retrieve_exception)
        # ``fut`` is aiokafka's shield over the batch: a timeout cancels only it, never the
        # batch (the resolve finds it if the producer delivers it still). Awaited under
        # asyncio.timeout, not wait_for(shield(...)): on 3.11 those two layers cost two more
        # loop turns between the broker's answer and the writer (and the next Produce).
        async with asyncio.timeout(self.append_timeout):
            meta = await fut
        phases.end("log: Produce, send to acks=all answer", t0)
        base = meta.offset
        self._scan_from = max(self._scan_from, base + n)
        if phases.ON and len(self._acked_at) < 10_000:
            self._acked_at[base + n] = phases.start()
        return [base + 1 + i for i in range(n)]

    async def _abandon_producer(self) -> None:
        """Stop the producer at once, batches undelivered or not: ``stop()`` would wait for
        them, and a producer left running would deliver the failed batch behind the search
        for it. aiokafka has no public way to do this (its sender task and client are private)."""
        old, self._producer = self._producer, None
        if old is None:
            return
        sender = getattr(old, "_sender", None)
        task = getattr(sender, "sender_task", None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        old._closed = True  # its stop() and __del__ would flush what the sender no longer sends
        with contextlib.suppress(Exception):
            await asyncio.wait_for(old.client.close(), 5)

    async def _bound(self) -> int:
        """Write a resolve bound with the new producer and return its offset. Acknowledged with
        acks=all, it lies behind every record the broker appended before it, and those are
        readable once it is: a batch of the abandoned producer that reached the leader but not
        yet its followers is found below it, not written a second time."""
        assert self._producer is not None
        fut = await self._producer.send(self.order_topic, value=b"{}", partition=0,
                                        headers=[(RESOLVE_HEADER, b"1")])
        fut.add_done_callback(retrieve_exception)
        meta = await asyncio.wait_for(asyncio.shield(fut), self.produce_timeout)
        self._scan_from = max(self._scan_from, meta.offset + 1)
        return int(meta.offset)

    async def _until_readable(self, last: dict[TopicPartition, int]) -> None:
        """Wait until every partition's last stable offset passed the given offsets.

        One poller serves every waiting reader, so concurrent waits share each round of
        ListOffsets requests instead of each polling on its own."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._readable_waiters.append((dict(last), fut))
        if self._readable_poller is None or self._readable_poller.done():
            self._readable_poller = asyncio.create_task(self._poll_readable(), name="kafka-readable")
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.append_timeout)
        except TimeoutError:
            raise LogUnavailable(f"committed events did not become readable within {self.append_timeout:g}s") from None

    async def _poll_readable(self) -> None:
        assert self._watcher is not None
        delay = 0.0005
        while self._readable_waiters:
            wanted = {tp for offsets, _ in self._readable_waiters for tp in offsets}
            try:
                ends = await self._watcher.end_offsets(list(wanted))
            except KafkaError as err:
                for _, fut in self._readable_waiters:
                    if not fut.done():
                        fut.set_exception(err)
                self._readable_waiters = []
                return
            # Waiters that arrived during the request stay for the next round.
            still = []
            for offsets, fut in self._readable_waiters:
                if fut.done():
                    continue
                if all(tp in ends and ends[tp] > off for tp, off in offsets.items()):
                    fut.set_result(None)
                else:
                    still.append((offsets, fut))
            progressed = len(still) < len(self._readable_waiters)
            self._readable_waiters = still
            delay = 0.0005 if progressed else min(delay * 2, 0.05)
            if still:
                await asyncio.sleep(delay)

    async def _find(self, events: list[Event], floor: int, bound: int) -> list[int] | None:
        """Positions of ``events`` if the failed Produce was written after all (between
        ``floor`` and the resolve ``bound``), else None. An append is one record batch, all or
        nothing, so finding one event decides."""
        wanted = {e.event_id: i for i, e in enumerate(events)}
        found: dict[int, int] = {}
        reader = await self._reader(self._order_tp)
        async with reader.lock:
            async for off, _, value, headers in reader.scan(floor, bound):
                if is_marker(headers):
                    continue
                i = wanted.get(decode_record(value, off + 1).event_id)  # never raises: another writer's record too
                if i is not None:
                    found[i] = off + 1
        if not found:
            return None
        if len(found) != len(events):
            raise LogUnavailable("the Kafka event log holds part of an append; refusing to guess")
        log.info("the failed append had committed after all; acknowledging it")
        return [found[i] for i in range(len(events))]

    # ---------------------------------------------------------------- read

    async def read(
        self, after: int = 0, *, sandbox_id: str | None = None, limit: int | None = None, reverse: bool = False
    ) -> list[Event]:
        if limit is not None and limit <= 0:
            return []
        try:
            if sandbox_id is None:
                return await self._read_all(after, limit, reverse)
            return await self._read_sandbox(sandbox_id, after, limit, reverse)
        except KafkaError as err:
            raise LogUnavailable(f"cannot read the Kafka event log: {err}") from err

    async def _read_all(self, after: int, limit: int | None, reverse: bool) -> list[Event]:
        reader = await self._reader(self._order_tp)
        async with reader.lock:
            first, end = await reader.bounds()
            if not reverse:
                out: list[Event] = []
                async for off, _, value, headers in reader.scan(max(first, after), end):
                    if is_marker(headers):
                        continue
                    out.append(decode_record(value, off + 1))
                    if limit is not None and len(out) >= limit:
                        break
                return out
            # Newest first: scan windows backwards from the upper bound.
            upper = min(end, after - 1) if after > 0 else end
            newest: list[Event] = []
            window = 2 * (limit or 500) + 16
            while upper > first and (limit is None or len(newest) < limit):
                lower = max(first, upper - window)
                chunk = [decode_record(v, off + 1) async for off, _, v, h in reader.scan(lower, upper) if not is_marker(h)]
                newest.extend(reversed(chunk))
                upper, window = lower, window * 2
            return newest[:limit] if limit is not None else newest

    async def _read_sandbox(self, sandbox_id: str, after: int, limit: int | None, reverse: bool) -> list[Event]:
        """The keyed partition up to the index's progress, then the order topic past it
        (see ``eventlog.kafka_index``): every event appended before the read began."""
        progress = await self._progress()
        tp = TopicPartition(self.topic, partition_for(sandbox_id, self.partitions))
        if tp.partition in progress.keyed:  # the copies it claims may still await their commit marker
            await self._until_readable({tp: progress.keyed[tp.partition]})
        key = sandbox_id.encode()
        matches: dict[int, Event] = {}
        wanted = (lambda pos: after <= 0 or pos < after) if reverse else (lambda pos: pos > after)
        order = await self._reader(self._order_tp)
        async with order.lock:  # usually a few records: those the indexer has not copied yet
            _, end = await order.bounds()
            async for off, k, value, _ in order.scan(progress.next_offset, end):
                if k == key and wanted(off + 1):
                    matches[off + 1] = decode_record(value, off + 1)
        reader = await self._reader(tp)
        async with reader.lock:
            first, end = await reader.bounds()
            born = id_millis(sandbox_id)
            if born is not None:
                found = await reader.consumer.offsets_for_times({tp: max(0, born - ID_CLOCK_SLACK_MS)})
                hit = found.get(tp)
                first = max(first, hit.offset if hit is not None else end)
            if not reverse:
                # The keyed copies are in log order: past the first ``limit`` of them, none is
                # wanted (a paged read, service/history.py, stops early instead of reading on).
                keyed: set[int] = set()
                async with contextlib.aclosing(reader.scan(first, end)) as records:  # parked at once on a break
                    async for _, k, value, headers in records:
                        pos = int(headers["position"])
                        if k == key and wanted(pos):
                            matches[pos] = decode_record(value, pos)
                            keyed.add(pos)
                            if limit is not None and len(keyed) >= limit:
                                break
            else:
                upper, window = end, 2 * (limit or 500) + 16
                while upper > first and (limit is None or len(matches) < limit):
                    lower = max(first, upper - window)
                    async for _, k, value, headers in reader.scan(lower, upper):
                        pos = int(headers["position"])
                        if k == key and wanted(pos):
                            matches[pos] = decode_record(value, pos)
                    upper, window = lower, window * 2
        # Keyed copies and order records overlap past the progress read: one event per position.
        ordered = sorted(matches.values(), key=lambda e: e.position or 0, reverse=reverse)
        return ordered[:limit] if limit is not None else ordered

    async def _progress(self) -> Progress:
        return await last_progress(await self._reader(self._indexed_tp),
                                   lambda p: self._reader(TopicPartition(self.topic, p)), self.partitions)

    async def _order_end(self) -> int:
        reader = await self._reader(self._order_tp)
        async with reader.lock:
            return (await reader.bounds())[1]

    async def last_position(self) -> int:
        newest = await self.read(0, limit=1, reverse=True)
        return newest[0].position or 0 if newest else 0

    async def subscribe(self, after: int = 0) -> AsyncIterator[Event]:
        # The order topic as the broker hands it out, and this process's own appends as soon
        # as they are acknowledged, whichever comes first (``eventlog.kafka_follow``).
        inbox = Inbox()
        self._subscribers.add(inbox)
        try:
            async for event in follow(self._consumer(fetch_max_wait_ms=500), self._order_tp, after, inbox,
                                      self._acked_at):
                yield event
        finally:
            self._subscribers.discard(inbox)

    async def consume_group(self, group: str, member: GroupMember) -> None:
        await consume_group(self.bootstrap, self.topic, group, member, index_done=self._index_done)

    async def _index_done(self) -> dict[int, int] | None:
        """Per keyed partition, its last copy, once the index has copied the whole order topic."""
        end = await self._order_end()
        progress = await self._progress()
        return progress.keyed if progress.next_offset >= end else None
