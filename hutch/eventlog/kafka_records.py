"""The pieces ``eventlog.kafka.KafkaEventLog`` is built from: its settings and URL, how an
event becomes a Kafka record and back, where a sandbox's events live, the epoch record, and
a parked partition reader.
See ``eventlog.kafka`` for the design."""

from __future__ import annotations

import asyncio
import functools
import json
import urllib.parse
from collections.abc import AsyncGenerator
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import murmur2

from hutch.core.errors import InvalidInput
from hutch.core.events import Encoded, Event, decode_or_unreadable, encode

DEFAULT_PARTITIONS = 6
MAX_EVENT_BYTES = 8 * 2**20
# An append is one record batch, and a batch is at most the topic's max.message.bytes.
MAX_APPEND_BYTES = MAX_EVENT_BYTES - 4096
RECORD_OVERHEAD = 64  # bytes a record takes besides its key and value (lengths, header), rounded up
# The most events and bytes one Produce (or one index transaction) carries; more pending
# appends wait for the next one.
MAX_GROUP_EVENTS = 5000
GROUP_BYTES = 2**20
# Time skew allowed between a sandbox id's timestamp and its first record's (per-sandbox reads
# start at that time instead of the partition's beginning).
ID_CLOCK_SLACK_MS = 10 * 60 * 1000
TOPIC_CONFIG = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
    "max.message.bytes": str(MAX_EVENT_BYTES),
}


def parse_url(url: str) -> tuple[str, str, dict[str, str]]:
    """``kafka://host:port[,host:port]/topic[?partitions=6&replication=1]``."""
    parts = urllib.parse.urlsplit(url)
    topic = parts.path.strip("/")
    if parts.scheme != "kafka" or not parts.netloc or not topic or "/" in topic:
        raise InvalidInput(
            f"event log: {url!r} is not kafka://HOST:PORT/TOPIC", field="event_log"
        )
    return parts.netloc, topic, dict(urllib.parse.parse_qsl(parts.query))


@functools.lru_cache(maxsize=65536)  # murmur2 is pure Python: hash each sandbox once
def partition_for(sandbox_id: str, partitions: int) -> int:
    """The Java client's default partitioner (murmur2), so other clients agree on where a key lives."""
    return int(murmur2(sandbox_id.encode()) & 0x7FFFFFFF) % partitions


def id_millis(sandbox_id: str) -> int | None:
    """The creation time a ULID-style id carries (see ``core.ids``), or None for other ids."""
    from hutch.core import ids

    if not ids.is_id("sandbox", sandbox_id):
        return None
    value = 0
    for ch in sandbox_id.split("_", 1)[1][:10]:
        value = value * 32 + "0123456789abcdefghjkmnpqrstvwxyz".index(ch)
    return value  # 10 chars = 50 bits: two zero bits, then the 48-bit timestamp


def retrieve_exception(fut: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (it is reported through another path)."""
    if not fut.cancelled():
        fut.exception()


Record = tuple[bytes, bytes, tuple[tuple[str, bytes], ...]]  # key, value, headers


def pack_batches(producer: AIOKafkaProducer, records: list[Record]) -> list[tuple[Any, int]]:
    """Pack (key, value, headers) records into record batches; returns (batch, record count)."""
    out: list[tuple[Any, int]] = []
    builder, count = producer.create_batch(), 0
    for key, value, headers in records:
        if builder.append(key=key, value=value, timestamp=None, headers=list(headers)) is None:
            out.append((builder, count))
            builder, count = producer.create_batch(), 0
            builder.append(key=key, value=value, timestamp=None, headers=list(headers))  # a first record always fits
        count += 1
    out.append((builder, count))
    return out


def record_bytes(event: Event | Encoded) -> bytes:
    if isinstance(event, Encoded):  # the recorder's record: not encoded again
        return event.record.encode()
    return json.dumps(encode(event), separators=(",", ":")).encode()


def decode_record(value: bytes, position: int) -> Event:
    # Never raises: a record nobody can decode must not stop every reader at its position.
    return decode_or_unreadable(value, position)


EPOCH_HEADER = "epoch"
RESOLVE_HEADER = "resolve"  # a bound written when resolving a failed append (eventlog.kafka)


def is_marker(headers: Any) -> bool:
    """The epoch record and resolve bounds (see ``eventlog.kafka``) are no events: every
    reader skips them."""
    return any(k in (EPOCH_HEADER, RESOLVE_HEADER)
               for k, _ in (headers.items() if isinstance(headers, dict) else headers or ()))


class PartitionReader:
    """One consumer parked on one partition; reads are serialised by its lock."""

    def __init__(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> None:
        self.consumer = consumer
        self.tp = tp
        self.lock = asyncio.Lock()

    async def bounds(self) -> tuple[int, int]:
        """(first offset, last stable offset): committed data lives in [first, end)."""
        c, tp = self.consumer, self.tp
        first = (await c.beginning_offsets([tp]))[tp]
        end = (await c.end_offsets([tp]))[tp]
        return first, end

    async def newest(self) -> list[tuple[int, bytes | None, bytes, dict[str, bytes]]]:
        """The newest committed records (at least one, unless there are none), looking back in
        growing windows past commit markers and aborted records. The caller holds the lock."""
        first, upper = await self.bounds()
        window = 4
        while upper > first:
            lower = max(first, upper - window)
            found = [rec async for rec in self.scan(lower, upper)]
            if found:
                return found
            upper, window = lower, window * 4
        return []

    async def scan(self, start: int, end: int) -> AsyncGenerator[tuple[int, bytes | None, bytes, dict[str, bytes]], None]:
        """(offset, key, value, headers) of committed records with start <= offset < end."""
        c, tp = self.consumer, self.tp
        if start >= end:
            return
        c.seek(tp, start)
        c.resume(tp)
        try:
            while await c.position(tp) < end:
                batch = await c.getmany(tp, timeout_ms=1000, max_records=10_000)
                for rec in batch.get(tp, []):
                    if rec.offset >= end:
                        return
                    yield rec.offset, rec.key, rec.value, dict(rec.headers or ())
        finally:
            # A parked reader does not fetch: its consumer's fetcher would otherwise poll forever.
            c.pause(tp)
