"""A poison event in the log does not stop the production profile's writes.

Another writer to the Kafka topic (an older hutch, a tool: anything but this API, which
refuses a NUL at its door) appends an event whose state PostgreSQL cannot hold. Before the
projection store stepped over such events, the projector retried that batch for ever and
every later write through the API waited 30 s for its event and answered 503. Now the next
create is 201, the event is recorded in ``projection_skipped`` and counted in /metrics,
and a rebuild of the log steps over it the same way. A real server process on the shared
Kafka and PostgreSQL (see tests/system/test_production.py)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.system.server import KEY, Server
from tests.system.test_production import _dump, hutch, run

pytestmark = pytest.mark.slow


async def append_poison(url: str, data_dir: Path) -> tuple[str, str]:
    """Append, as another writer, a create whose name holds a NUL; (sandbox id, event id)."""
    from hutch.core import ids
    from hutch.core.events import Event, SandboxCreated
    from hutch.core.models import SandboxSpec
    from hutch.service.composition import open_event_log

    log = open_event_log(url, data_dir)  # another writer beside the server's
    await log.start()
    try:
        spec = SandboxSpec(runtime="base:latest", runtime_id="srt_x", name="nul\x00name")
        event = Event(ids.new_id("event"), ids.new_id("sandbox"), "2026-01-01T00:00:00.000Z", SandboxCreated(spec=spec))
        await log.append([event])
        return event.sandbox_id, event.event_id
    finally:
        await log.close()


async def skipped_rows(url: str) -> list[Any]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch("SELECT * FROM projection_skipped ORDER BY position"))
    finally:
        await conn.close()


def metrics(server: Server) -> list[str]:
    req = urllib.request.Request(server.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read().decode().splitlines()


def test_a_poison_event_from_another_writer_does_not_stop_later_writes(
    tmp_path: Path, database: str, kafka_log: Callable[[str], str]
) -> None:
    log = kafka_log("poison")
    server = Server(tmp_path / "data", HUTCH_EVENT_LOG=log, HUTCH_STORE=database).start()
    try:
        first = server.data("POST", "/sandbox", {"name": "before"})
        poison_id, poison_event = run(append_poison(log, tmp_path / "writer"))
        # Before the fix: 503 after the API's 30 s wait (the projector retried the poison for ever).
        status, body = server.call("POST", "/sandbox", {"name": "after"}, timeout=90)
        assert status == 201, body
        after = body["data"]["sandboxId"]
        assert server.data("GET", f"/sandbox/{after}")["name"] == "after"
        assert server.data("POST", f"/sandbox/{first['sandboxId']}/execute", {"command": ["true"]})["executionId"]
        assert server.call("GET", f"/sandbox/{poison_id}")[0] == 404
        rows = run(skipped_rows(database))
        assert [(r["event_id"], r["sandbox_id"], r["type"]) for r in rows] == [(poison_event, poison_id, "create")]
        assert "UntranslatableCharacterError" in rows[0]["error"]
        assert "hutch_projection_skipped_events 1" in metrics(server)
        assert f"refused event {poison_event}" in server.log.read_text()
    finally:
        server.stop()
    # The same log rebuilt into the store (one transaction) steps over the same event.
    live = run(_dump(database))
    out = hutch("projections", "rebuild", "--event-log", log, "--store", database, "--data-dir", str(tmp_path / "rb"))
    assert json.loads(out.stdout)["skipped"] == 1
    assert run(_dump(database)) == live and len(run(skipped_rows(database))) == 1


async def append_raw(url: str, values: list[bytes]) -> None:
    """Append records as a writer that is not hutch at all: straight onto the order partition
    every reader reads positions from, no transaction, no hutch encoding."""
    from aiokafka import AIOKafkaProducer

    from hutch.eventlog.kafka_records import parse_url

    bootstrap, topic, _ = parse_url(url)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(f"{topic}.order", value, partition=0)
    finally:
        await producer.stop()


def test_a_record_nobody_can_decode_is_stepped_over_and_survives_a_restart(
    tmp_path: Path, database: str, kafka_log: Callable[[str], str]
) -> None:
    """Not JSON, or an event type this hutch does not know: before, decoding raised inside the
    log reader, so the projector retried for ever (every write a 503) and a restarted server
    failed reading its backlog."""
    log = kafka_log("unreadable")
    env = {"HUTCH_EVENT_LOG": log, "HUTCH_STORE": database}
    server = Server(tmp_path / "data", **env).start()
    try:
        server.data("POST", "/sandbox", {"name": "before"})
        unknown = {"v": 1, "eventId": "evt_from_the_future", "sandboxId": "sbx_from_the_future",
                   "type": "no-such-type", "createdAt": "2026-01-01T00:00:00.000Z", "data": {}}
        run(append_raw(log, [b"\x00not json at all", json.dumps(unknown).encode()]))
        status, body = server.call("POST", "/sandbox", {"name": "after"}, timeout=90)
        assert status == 201, body
        rows = run(skipped_rows(database))
        assert [(r["type"], r["sandbox_id"]) for r in rows] == [("log:unreadable", ""),
                                                                 ("log:unreadable", "sbx_from_the_future")]
        assert rows[0]["event_id"].startswith("unreadable-") and rows[1]["event_id"] == "evt_from_the_future"
        assert "unknown event type 'no-such-type'" in rows[1]["error"]
        assert "hutch_projection_skipped_events 2" in metrics(server)
    finally:
        server.stop()
    again = Server(tmp_path / "data", **env).start()  # reads the whole backlog at start
    try:
        status, body = again.call("POST", "/sandbox", {"name": "after a restart"}, timeout=90)
        assert status == 201, body
        assert [s["name"] for s in again.data("GET", "/sandbox")["sandboxes"]].count("after") == 1
    finally:
        again.stop()


async def test_the_audit_trail_keeps_an_event_postgresql_cannot_store_as_is(database: str) -> None:
    """A NUL in an event (a poison event's command) is kept in ``audit_trail`` with U+FFFD in
    its place, instead of the sink refusing the batch and its consumer retrying it for ever."""
    from hutch.projections.audit import PostgresSink

    sink = PostgresSink(database)
    await sink.start()
    try:
        record = {"eventId": "evt_nul", "position": 7, "sandboxId": "sbx_nul", "type": "create",
                  "actor": "key\x00x", "at": "2026-11-28T00:00:00Z", "orgId": "org_local", "projectId": None,
                  "detail": {"command": ["echo", "a\x00b"], "k\x00": 1}}
        await sink.write("log", [(0, 7, record)])
        assert await sink.resume_points("log") == {0: 8}
    finally:
        await sink.close()
    conn = await asyncpg.connect(database)
    try:
        row = await conn.fetchrow("SELECT actor, detail FROM audit_trail WHERE event_id = 'evt_nul'")
    finally:
        await conn.close()
    assert row["actor"] == "key\ufffdx"
    assert json.loads(row["detail"]) == {"command": ["echo", "a\ufffdb"], "k\ufffd": 1}
