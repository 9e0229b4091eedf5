"""What the PostgreSQL projection store promises beyond the ProjectionStore contract."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from hutch.core.events import ExecutionStarted, SandboxEnvChanged, SandboxStarted, recorded_size
from hutch.projections import postgres
from hutch.projections.base import SandboxQuery, StoreBehind
from hutch.projections.postgres import PostgresProjectionStore, ReadsHeld, StoreUnavailable
from hutch.projections.runner import Projector
from hutch.service.composition import open_event_log
from tests.contracts.test_projection_store import Log, created
from tests.services import drop_database, fresh_database


@pytest.fixture
async def database() -> AsyncIterator[str]:
    url, name = await fresh_database("pgstore")
    yield url
    await drop_database(name)


async def set_position(url: str, position: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("UPDATE projection_position SET position = $1", position)
    finally:
        await conn.close()


async def test_two_stores_on_one_database_apply_each_event_once(database: str) -> None:
    a, b = PostgresProjectionStore(database), PostgresProjectionStore(database)
    await a.start()
    await b.start()
    try:
        log = Log()
        batch = [log("sbx_1", created()), log("sbx_1", SandboxStarted())]
        batch += [log("sbx_1", ExecutionStarted(f"exec_{i}", ("x",))) for i in range(20)]
        await asyncio.gather(*(s.apply(batch[:k]) for k in range(1, len(batch) + 1) for s in (a, b)))
        sb = await a.get_sandbox("sbx_1")
        assert sb is not None and sb.executions == 20
        assert len(await b.list_executions("sbx_1")) == 20 and await b.position() == log.position
    finally:
        await a.close()
        await b.close()


async def test_what_a_sandbox_wrote_to_the_log_is_kept_across_a_restart(database: str) -> None:
    """The count of a sandbox's log bytes lives in its row (log_bytes), not in the process: a
    store opened afresh on the database (a restart) reads the same eventBytes."""
    first = PostgresProjectionStore(database)
    await first.start()
    log = Log()
    try:
        await first.apply([log("sbx_1", created()), log("sbx_1", SandboxEnvChanged(set={"A": "x" * 4000}))])
    finally:
        await first.close()
    again = PostgresProjectionStore(database)
    await again.start()
    try:
        assert await again.event_bytes("org_local") == sum(recorded_size(e) for e in log.events) > 4000
    finally:
        await again.close()


async def test_a_store_that_lost_commits_says_so_instead_of_skipping(database: str) -> None:
    store = PostgresProjectionStore(database)
    await store.start()
    try:
        log = Log()
        await store.apply([log("sbx_1", created()), log("sbx_1", SandboxStarted())])
        await set_position(database, 1)  # as if the last commit had been lost in a crash
        with pytest.raises(StoreBehind) as behind:
            await store.apply([log("sbx_1", ExecutionStarted("exec_1", ("x",)))])
        assert behind.value.position == 1 and behind.value.expected == 2
    finally:
        await store.close()


async def test_the_held_write_connection_lost_is_replaced_and_nothing_is_skipped(database: str) -> None:
    """Batches are written on one connection held between them (storage.pg.Pool.held). Its
    backend killed under it (a restart, an administrator): the next apply takes a fresh
    connection, or says the store is away and the one after does; the same events are
    written, none skipped."""
    store = PostgresProjectionStore(database)
    await store.start()
    admin = await asyncpg.connect(database)
    try:
        log = Log()
        await store.apply([log("sbx_1", created())])
        held = store._pg._held
        assert held is not None
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", held.get_server_pid())
        batch = [log("sbx_1", SandboxStarted()), log("sbx_1", ExecutionStarted("exec_1", ("x",)))]
        try:  # the projector's way: a store away is retried with the same events
            await store.apply(batch)
        except StoreUnavailable:
            await store.apply(batch)
        assert store._pg._held is not None and store._pg._held is not held
        sb = await store.get_sandbox("sbx_1")
        assert sb is not None and sb.executions == 1 and sb.status.value == "running"
        assert await store.position() == log.position and (await store.skipped())[1] == 0
    finally:
        await admin.close()
        await store.close()


async def test_the_projector_repairs_a_store_that_fell_behind(database: str, tmp_path: Path) -> None:
    event_log = open_event_log("sqlite", tmp_path)
    await event_log.start()
    store = PostgresProjectionStore(database)
    await store.start()
    projector = Projector(event_log, store)
    try:
        await projector.start()
        first = Log()
        events = [first("sbx_1", created()), first("sbx_1", SandboxStarted())]
        positions = await event_log.append([e.__class__(e.event_id, e.sandbox_id, e.created_at, e.data) for e in events])
        await projector.wait_for(positions[-1])
        await set_position(database, 0)  # the store lost everything it had applied
        (p,) = await event_log.append([first("sbx_1", ExecutionStarted("exec_1", ("x",)))])
        await projector.wait_for(p, timeout=10)
        for _ in range(100):  # the projector re-applies from the store's position
            sb = await store.get_sandbox("sbx_1")
            if sb is not None and sb.executions == 1 and await store.position() == p:
                break
            await asyncio.sleep(0.05)
        sb = await store.get_sandbox("sbx_1")
        assert sb is not None and sb.executions == 1 and sb.status.value == "running"
        assert await store.position() == p
    finally:
        await projector.close()
        await store.close()
        await event_log.close()


async def _end_sessions(url: str) -> int:
    """End every other session on the database, as a server crash ends them."""
    conn = await asyncpg.connect(url)
    try:
        pids = [r["pid"] for r in await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND usename = current_user"
            " AND pid <> pg_backend_pid()")]
        # With wait_for, return only once they are gone (pg_terminate_backend only signals).
        await conn.execute("SELECT pg_terminate_backend(pid, 5000) FROM unnest($1::int[]) AS pid", pids)
        return len(pids)
    finally:
        await conn.close()


async def test_its_commits_do_not_wait_for_the_wal_flush_but_a_rebuild_does(database: str) -> None:
    """The projection is derived (the log is the record); an operator's rebuild is answered flushed."""
    store = PostgresProjectionStore(database)
    await store.start()
    try:
        async with store._conn() as conn:
            assert await conn.fetchval("SHOW synchronous_commit") == "off"
            async with conn.transaction():
                await conn.execute(postgres._FLUSHED)
                assert await conn.fetchval("SHOW synchronous_commit") == "on"
            assert await conn.fetchval("SHOW synchronous_commit") == "off"
    finally:
        await store.close()


async def test_reads_after_a_new_session_wait_for_the_check_or_answer_503(
        database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = PostgresProjectionStore(database)
    await store.start()
    try:
        log = Log()
        await store.apply([log("sbx_1", created())])
        assert await store.get_sandbox("sbx_1") is not None  # the pool's session for reads, opened
        checks: list[int | None] = []
        store.hold_reads_on_reconnect(lambda: checks.append(store.reads_held()))
        assert await store.get_sandbox("sbx_1") is not None and checks == []  # no new session: no hold
        assert await _end_sessions(database) > 0
        read = asyncio.create_task(store.get_sandbox("sbx_1"))
        await asyncio.sleep(0.3)
        hold = store.reads_held()
        assert not read.done() and checks and hold is not None and checks[-1] == hold
        if hold > 1:
            assert not store.release_reads(hold - 1) and not read.done()  # an older hold lets nothing go
        assert store.release_reads(hold)
        assert (await asyncio.wait_for(read, 5)) is not None and store.reads_held() is None

        monkeypatch.setattr(postgres, "READ_HOLD_SECONDS", 0.2)
        await _end_sessions(database)
        with pytest.raises(ReadsHeld) as held:
            await store.list_sandboxes(SandboxQuery())
        assert held.value.status == 503 and "event log" in held.value.message
    finally:
        await store.close()


async def test_the_projector_lets_reads_go_once_the_lost_batches_are_applied_again(
        database: str, tmp_path: Path) -> None:
    """A crash lost the store's last batches and ended its sessions while the projector was
    idle: the next read waits for them to be applied again from the log; no new event needed."""
    event_log = open_event_log("sqlite", tmp_path)
    await event_log.start()
    store = PostgresProjectionStore(database)
    await store.start()
    projector = Projector(event_log, store)
    try:
        await projector.start()
        first = Log()
        events = [first("sbx_1", created()), first("sbx_1", SandboxStarted())]
        positions = await event_log.append([e.__class__(e.event_id, e.sandbox_id, e.created_at, e.data) for e in events])
        await projector.wait_for(positions[-1])
        conn = await asyncpg.connect(database)
        try:
            await conn.execute("DELETE FROM sandboxes")
            await conn.execute("UPDATE projection_position SET position = 0")
        finally:
            await conn.close()
        assert await _end_sessions(database) > 0
        sb = await asyncio.wait_for(store.get_sandbox("sbx_1"), 10)
        assert sb is not None and sb.status.value == "idle"
        assert await store.position() == positions[-1] and store.reads_held() is None
    finally:
        await projector.close()
        await store.close()
        await event_log.close()


async def test_a_value_postgresql_cannot_hold_is_stepped_over_not_retried_for_ever(database: str) -> None:
    """A NUL in text or jsonb (PostgreSQL refuses it, SQLSTATE 22P05) in an event another writer
    appended: the batch holding it applies event by event, the NUL one is recorded and
    skipped, and a waiter in another process sees the position pass it."""
    store, other = PostgresProjectionStore(database), PostgresProjectionStore(database)
    await store.start()
    await other.start()
    try:
        log = Log()
        batch = [log("sbx_1", created("one")), log("sbx_2", created("nul\x00name")), log("sbx_1", SandboxStarted()),
                 log("sbx_3", created("three"))]
        waiter = asyncio.create_task(other.wait_for(log.position, timeout=60))
        await store.apply(batch)
        await waiter
        assert await store.position() == log.position and await store.get_sandbox("sbx_2") is None
        sb = await store.get_sandbox("sbx_1")
        assert sb is not None and sb.status.value == "idle" and await store.get_sandbox("sbx_3") is not None
        # Poison in what the record names (a NUL, a lone surrogate asyncpg cannot encode): the
        # record of stepping over it must hold all the same.
        bad_ids = [log("sbx_\x00x", created()), log("sbx_\ud800y", created()), log("sbx_4", created("four"))]
        await store.apply(bad_ids)
        skipped, total = await other.skipped()
        assert total == 3 and [s.position for s in skipped] == [2, 5, 6]
        assert "UntranslatableCharacterError" in skipped[0].error and skipped[0].sandbox_id == "sbx_2"
        assert skipped[1].sandbox_id == "sbx_\\u0000x" and skipped[1].event_id == bad_ids[0].event_id
        assert skipped[2].sandbox_id == "sbx_\\ud800y" and "DataError" in skipped[2].error
        # A rebuild (one transaction) steps over the same events under savepoints.
        assert await other.rebuild([log.events], log_identity="log-a") == log.position
        assert [s.position for s in (await store.skipped())[0]] == [2, 5, 6]
        assert (await store.list_sandboxes(SandboxQuery()))[1] == 3
    finally:
        await store.close()
        await other.close()
