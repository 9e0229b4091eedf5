"""The three topics of a Kafka event log (see ``eventlog.kafka``): created on start when
missing, with unlimited retention (the log is the source of truth), then checked."""

from __future__ import annotations

import asyncio
import time

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from hutch.core.errors import LogUnavailable
from hutch.eventlog.kafka_records import TOPIC_CONFIG


async def ensure_topics(bootstrap: str, topic: str, order_topic: str, indexed_topic: str, *, partitions: int,
                        replication: int | None, client_id: str) -> tuple[str | None, int]:
    """Create ``topic`` (``partitions`` partitions), ``order_topic`` and ``indexed_topic`` (one
    each) when missing and wait until every broker knows them. Returns the cluster id and the events topic's own
    partition count, which decides where keys live (an existing topic keeps its count)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id=client_id)
    await admin.start()
    try:
        meta = await admin.describe_cluster()
        replication = replication or min(3, len(meta["brokers"]))
        wanted = [
            NewTopic(topic, partitions, replication, topic_configs=TOPIC_CONFIG),
            NewTopic(order_topic, 1, replication, topic_configs=TOPIC_CONFIG),
            NewTopic(indexed_topic, 1, replication, topic_configs=TOPIC_CONFIG),
        ]
        existing = set(await admin.list_topics())
        missing = [t for t in wanted if t.name not in existing]
        if missing:
            try:
                resp = await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                resp = None  # another process won the race
            for name, code, *_ in getattr(resp, "topic_errors", ()):
                if code not in (0, TopicAlreadyExistsError.errno):
                    raise LogUnavailable(f"cannot create Kafka topic {name}: error code {code}")
        deadline = time.monotonic() + 30
        while True:  # a new topic takes a moment to reach the metadata of every broker
            described = await admin.describe_topics([topic, order_topic, indexed_topic])
            errors = {t["topic"]: t["error_code"] for t in described if t["error_code"] != 0}
            if not errors and all(t["partitions"] for t in described):
                break
            if time.monotonic() > deadline:
                raise LogUnavailable(f"Kafka topics not available: error codes {errors}")
            await asyncio.sleep(0.05)
        for t in described:
            count = len(t["partitions"])
            if t["topic"] == topic:
                partitions = count
            elif count != 1:
                raise LogUnavailable(f"Kafka topic {t['topic']} must have one partition, has {count}")
        return meta.get("cluster_id"), partitions
    finally:
        await admin.close()
