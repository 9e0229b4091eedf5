"""The production event log: Apache Kafka, through aiokafka.

Two topics per log, written together in one Kafka transaction per group commit:

* ``<topic>`` — the events, keyed by sandbox id over several partitions (6 by default), so
  each sandbox's events stay in order in one partition, per-sandbox reads touch one
  partition, and consumer groups (``hutch audit``) spread partitions over their members.
  Every record carries its log position in a ``position`` header.
* ``<topic>.order`` — the same records in one partition. Its offsets *are* the global
  order: ``position = offset + 1`` (0 stays "before the first event").

Why this design: the contract wants one total order that agrees with append order
(``read(after)``, ``subscribe(after)``, ``last_position()``, the events API's paging, the
projector's single tracked position). Kafka orders only within a partition, so a
global position needs a sequencer. Encoding (partition, offset) into one int gives *a*
total order, but not append order: an event appended later could get a smaller
position than one already acknowledged, and a projector that already applied the
larger one would skip it. A sequence kept outside Kafka (a database counter) couples
the log to the store and still leaves the gap-between-sequence-and-write problem.
A single-partition topic is Kafka's own sequencer: the broker assigns offsets in the
order it appends, with no coordination between writers. Writing both topics in one
transaction keeps them identical for ``read_committed`` readers: an event is in both or
in neither, and an aborted or half-written append is invisible. Positions have gaps
(each commit marker takes an offset of the order topic); the port only asks them to
be strictly increasing.

Durability: the producer is transactional, which implies idempotence and
``acks=all``; ``append`` returns only after the transaction committed, i.e. after the
broker acknowledged every record. An append whose commit failed ambiguously (the
broker went away mid-commit) is resolved before anyone is told: the producer is
re-created under the same transactional id — Kafka then finishes or aborts the open
transaction — and the order topic is searched for the events' ids. Found: they are
acknowledged with their positions. Not found: they are written again. So a retry
never duplicates an event, and a broker restart only delays appends (up to
``append_timeout``) instead of failing them.

The transactional id is derived from the host, the data dir and the topic: a
restarted server (kill -9 included) fences its previous incarnation and aborts the
transaction it left open at once, instead of blocking ``read_committed`` readers until
the transaction times out. Two servers on one data dir are already refused by the
data-dir lock.

Identity: the cluster id, the topic, and the log's epoch, ``kafka:<cluster>/<topic>@<epoch>``.
The epoch is a record written once at the start of the order topic by the first writer
that finds it empty (a random id in an ``epoch`` header; readers skip it: it is no event).
A recreated topic gets a new one, so a projection store bound to the old log refuses the
new one (``projections.runner``). Logs made before epochs existed have their first
event's id as theirs. Should two writers start on one empty topic at once, both write an
epoch; the first in the topic is the log's, and both read that one back.

Topics are created on start when missing, with unlimited retention (the log is the
source of truth). Never change the partition count of an existing topic: per-sandbox
reads look in the partition the key hashes to.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, KafkaTimeoutError

from hutch.core.errors import InvalidInput, LogUnavailable
from hutch.core.eventlog.base import EventLog, GroupMember, LogCapabilities
from hutch.core.events import Event
from hutch.eventlog.kafka_groups import consume_group
from hutch.eventlog.kafka_records import (
    DEFAULT_PARTITIONS,
    EPOCH_HEADER,
    ID_CLOCK_SLACK_MS,
    MAX_EVENT_BYTES,
    MAX_GROUP_EVENTS,
    PartitionReader,
    ProducerSlot,
    decode_record,
    id_millis,
    is_epoch,
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
        transactional_id: str | None = None,
        append_timeout: float = 60.0,
        txn_timeout: float = 8.0,
        producers: int = 3,
        writer: bool = True,
        client_id: str = "hutch",
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.order_topic = f"{topic}.order"
        self.partitions = partitions
        self.replication = replication
        self.append_timeout = append_timeout
        self.txn_timeout = txn_timeout
        self.client_id = client_id
        self.transactional_id = transactional_id or f"hutch-{socket.gethostname()}-{topic}"
        # Several producers, so a new transaction need not wait for the previous one's commit
        # markers (the broker answers CONCURRENT_TRANSACTIONS until they are written).
        self._slots = [ProducerSlot(f"{self.transactional_id}-{i}") for i in range(producers if writer else 0)]
        self._idle: list[ProducerSlot] = []
        self._watcher: AIOKafkaConsumer | None = None  # asks for end offsets; never fetches
        self._readable_waiters: list[tuple[dict[TopicPartition, int], asyncio.Future[None]]] = []
        self._readable_poller: asyncio.Task[None] | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._readers: dict[TopicPartition, PartitionReader] = {}
        self._order_tp = TopicPartition(self.order_topic, 0)
        self._pending: list[tuple[Sequence[Event], asyncio.Future[list[int]]]] = []
        self._scan_from = 0  # no record of an unresolved append of ours lies below this offset
        self._closed = False
        self.cluster_id: str | None = None
        self._identity: str | None = None

    @classmethod
    def from_url(cls, url: str, data_dir: Path, *, writer: bool = True) -> KafkaEventLog:
        bootstrap, topic, params = parse_url(url)
        unknown = set(params) - {"partitions", "replication", "transactional_id"}
        if unknown:
            raise InvalidInput(f"event log: unknown parameter(s) {sorted(unknown)} in {url!r}", field="event_log")
        tid = params.get("transactional_id") or "hutch-" + hashlib.sha256(
            f"{socket.gethostname()}\0{data_dir.resolve()}\0{bootstrap}\0{topic}".encode()
        ).hexdigest()[:24]
        return cls(
            bootstrap,
            topic,
            partitions=int(params.get("partitions", DEFAULT_PARTITIONS)),
            replication=int(params["replication"]) if "replication" in params else None,
            transactional_id=tid,
            writer=writer,
        )

    # ---------------------------------------------------------------- lifetime

    async def start(self) -> None:
        try:
            await self._ensure_topics()
            self._watcher = self._consumer()
            await self._watcher.start()
            for slot in self._slots:
                await slot.replace(self._new_producer)
            self._idle = list(self._slots)
            reader = await self._reader(self._order_tp)
            async with reader.lock:
                first, end = await reader.bounds()
            if end == first and self._slots:
                await self._write_epoch()
            async with reader.lock:
                self._scan_from = (await reader.bounds())[1]
        except KafkaError as err:
            await self.close()
            raise LogUnavailable(f"cannot open the Kafka event log at {self.bootstrap}: {err}") from err

    async def close(self) -> None:
        self._closed = True
        if self._inflight:
            await asyncio.wait(list(self._inflight), timeout=self.append_timeout)
        for fut in [f for _, f in self._pending]:
            if not fut.done():
                fut.set_exception(LogUnavailable("the Kafka event log closed before the append was written"))
        self._pending = []
        if self._readable_poller is not None:
            self._readable_poller.cancel()
        for slot in self._slots:
            await slot.close()
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
            self.bootstrap, self.topic, self.order_topic, partitions=self.partitions,
            replication=self.replication, client_id=self.client_id)

    async def _write_epoch(self) -> None:
        """Start an empty log with its epoch record (order topic only: it has no sandbox)."""
        producer = self._slots[0].producer
        assert producer is not None
        epoch = uuid.uuid4().hex
        async with producer.transaction():
            fut = await producer.send(self.order_topic, value=json.dumps({"epoch": epoch}).encode(), partition=0,
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

    async def _new_producer(self, transactional_id: str) -> AIOKafkaProducer:
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
            max_batch_size=1 * 2**20,
        )
        try:
            await producer.start()  # init_transactions: fences an older incarnation, ends its open txn
        except BaseException:
            with contextlib.suppress(Exception):
                await producer.stop()
            raise
        return producer

    async def _reader(self, tp: TopicPartition) -> PartitionReader:
        reader = self._readers.get(tp)
        if reader is None:
            consumer = self._consumer()
            await consumer.start()
            consumer.assign([tp])
            consumer.pause(tp)
            reader = self._readers.setdefault(tp, PartitionReader(consumer, tp))
            if reader.consumer is not consumer:
                await consumer.stop()
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

    async def append(self, events: Sequence[Event]) -> list[int]:
        if not events:
            return []
        if not self._slots:
            raise LogUnavailable("this Kafka event log was opened read-only")
        if self._closed:
            raise LogUnavailable("the Kafka event log is not started")
        fut: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._pending.append((events, fut))
        self._dispatch()
        return await fut

    def _dispatch(self) -> None:
        """Hand pending appends to idle producers, one transaction per producer at a time."""
        while self._pending and self._idle:
            slot = self._idle.pop(0)  # the longest idle: its last commit is surely complete
            group: list[tuple[Sequence[Event], asyncio.Future[list[int]]]] = []
            count = 0
            while self._pending and (not group or count + len(self._pending[0][0]) <= MAX_GROUP_EVENTS):
                item = self._pending.pop(0)
                group.append(item)
                count += len(item[0])
            task = asyncio.create_task(self._commit_group(slot, group), name="kafka-eventlog-commit")
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _commit_group(
        self, slot: ProducerSlot, group: list[tuple[Sequence[Event], asyncio.Future[list[int]]]]
    ) -> None:
        flat = [e for evs, _ in group for e in evs]
        try:
            positions = await self._write_resolving(slot, flat)
        except Exception as err:
            error = err if isinstance(err, LogUnavailable) else LogUnavailable(f"event log append failed: {err}")
            for _, fut in group:
                if not fut.done():
                    fut.set_exception(error)
        else:
            i = 0
            for evs, fut in group:
                if not fut.done():
                    fut.set_result(positions[i : i + len(evs)])
                i += len(evs)
        finally:
            self._idle.append(slot)
            if not self._closed:
                self._dispatch()

    async def _write_resolving(self, slot: ProducerSlot, events: list[Event]) -> list[int]:
        """Write in one transaction; on failure find out what the broker kept, then retry the rest."""
        deadline = time.monotonic() + self.append_timeout
        delay = 0.1
        while True:
            # Everything appended before this transaction began lies below this offset.
            floor = self._scan_from
            try:
                return await self._write(slot, events)
            except KafkaError as err:
                failure = err
            log.warning("Kafka append of %d event(s) failed (%s); resolving", len(events), failure)
            while True:
                if time.monotonic() > deadline or self._closed:
                    raise LogUnavailable(
                        f"the Kafka event log did not accept the append within {self.append_timeout:g}s: {failure}"
                    ) from failure
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                try:
                    await slot.replace(self._new_producer)
                    found = await self._find(events, floor)
                    break
                except KafkaError as err:
                    failure = err
                    log.warning("Kafka still unavailable (%s); retrying", err)
            if found is not None:
                return found

    async def _write(self, slot: ProducerSlot, events: list[Event]) -> list[int]:
        producer = slot.producer
        if producer is None:
            raise LogUnavailable("the Kafka event log is closed")
        # A transaction stuck on a vanished broker would otherwise wait for the broker to time
        # it out after it comes back; bounding it here lets the caller re-create the producer,
        # which ends the stuck transaction at once.
        txn = asyncio.ensure_future(self._transact(producer, events))
        try:
            offsets, keyed = await asyncio.wait_for(asyncio.shield(txn), self.txn_timeout)
        except TimeoutError:
            txn.cancel()
            txn.add_done_callback(retrieve_exception)
            raise KafkaTimeoutError(f"transaction not committed within {self.txn_timeout:g}s") from None
        # The commit marker follows the last record.
        self._scan_from = max(self._scan_from, offsets[-1] + 2)
        # The commit returns once the coordinator decided; the markers that make the records
        # readable reach the partitions a moment later. Acknowledge once they are readable, so
        # a read that follows an append sees it.
        await self._until_readable({self._order_tp: offsets[-1], **keyed})
        return [off + 1 for off in offsets]

    async def _transact(self, producer: AIOKafkaProducer, events: list[Event]) -> tuple[list[int], dict[TopicPartition, int]]:
        """One transaction: the events into the order partition, then into their keyed
        partitions with their positions. Returns the order offsets and, per keyed partition,
        the last offset written. Records go in explicit record batches: a batch gets
        consecutive offsets, and building batches costs far less than a send() per record."""
        values = [record_bytes(e) for e in events]
        keys = [e.sandbox_id.encode() for e in events]
        async with producer.transaction():
            order = pack_batches(producer, [(k, v, ()) for k, v in zip(keys, values, strict=True)])
            offsets: list[int] = []
            for builder, count in order:
                fut = await producer.send_batch(builder, self.order_topic, partition=0)
                fut.add_done_callback(retrieve_exception)
                base = (await fut).offset
                offsets.extend(range(base, base + count))
            by_partition: dict[int, list[tuple[bytes, bytes, tuple[tuple[str, bytes], ...]]]] = {}
            for e, k, v, off in zip(events, keys, values, offsets, strict=True):
                by_partition.setdefault(partition_for(e.sandbox_id, self.partitions), []).append(
                    (k, v, (("position", str(off + 1).encode()),))
                )
            pending = []
            for partition, records in by_partition.items():
                for builder, count in pack_batches(producer, records):
                    fut = await producer.send_batch(builder, self.topic, partition=partition)
                    fut.add_done_callback(retrieve_exception)
                    pending.append((fut, count))
            keyed: dict[TopicPartition, int] = {}
            for fut, count in pending:
                meta = await fut
                tp = TopicPartition(meta.topic, meta.partition)
                keyed[tp] = max(keyed.get(tp, -1), meta.offset + count - 1)
        return offsets, keyed

    async def _until_readable(self, last: dict[TopicPartition, int]) -> None:
        """Wait until every partition's last stable offset passed the given offsets.

        One poller serves every waiting commit, so concurrent commits share each round of
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

    async def _find(self, events: list[Event], floor: int) -> list[int] | None:
        """Positions of ``events`` if the failed transaction committed after all, else None.

        Called after the producer was re-created under the same transactional id, which makes
        the broker finish or abort the open transaction first. A transaction is all or nothing,
        so finding one event decides."""
        wanted = {e.event_id: i for i, e in enumerate(events)}
        found: dict[int, int] = {}
        reader = await self._reader(self._order_tp)
        async with reader.lock:
            _, end = await reader.bounds()
            async for off, _, value, _ in reader.scan(floor, end):
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
                    if is_epoch(headers):
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
                chunk = [decode_record(v, off + 1) async for off, _, v, h in reader.scan(lower, upper) if not is_epoch(h)]
                newest.extend(reversed(chunk))
                upper, window = lower, window * 2
            return newest[:limit] if limit is not None else newest

    async def _read_sandbox(self, sandbox_id: str, after: int, limit: int | None, reverse: bool) -> list[Event]:
        tp = TopicPartition(self.topic, partition_for(sandbox_id, self.partitions))
        key = sandbox_id.encode()
        reader = await self._reader(tp)
        async with reader.lock:
            first, end = await reader.bounds()
            born = id_millis(sandbox_id)
            if born is not None:
                found = await reader.consumer.offsets_for_times({tp: max(0, born - ID_CLOCK_SLACK_MS)})
                hit = found.get(tp)
                first = max(first, hit.offset if hit is not None else end)
            matches: list[Event] = []
            if not reverse:
                async for _, k, value, headers in reader.scan(first, end):
                    if k != key:
                        continue
                    pos = int(headers["position"])
                    if pos > after:
                        matches.append(decode_record(value, pos))
            else:
                upper, window = end, 2 * (limit or 500) + 16
                while upper > first and (limit is None or len(matches) < limit):
                    lower = max(first, upper - window)
                    async for _, k, value, headers in reader.scan(lower, upper):
                        pos = int(headers["position"])
                        if k == key and (after <= 0 or pos < after):
                            matches.append(decode_record(value, pos))
                    upper, window = lower, window * 2
        # Writers from different processes may interleave in a partition: order by position.
        matches.sort(key=lambda e: e.position or 0, reverse=reverse)
        return matches[:limit] if limit is not None else matches

    async def last_position(self) -> int:
        newest = await self.read(0, limit=1, reverse=True)
        return newest[0].position or 0 if newest else 0

    async def subscribe(self, after: int = 0) -> AsyncIterator[Event]:
        # Long-polls: the broker answers as soon as a commit makes new events readable.
        consumer = self._consumer(fetch_max_wait_ms=500)
        tp = self._order_tp
        started = False
        try:
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
                for rec in batch.get(tp, []):
                    if not is_epoch(rec.headers):
                        yield decode_record(rec.value, rec.offset + 1)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def consume_group(self, group: str, member: GroupMember) -> None:
        await consume_group(self.bootstrap, self.topic, group, member)
