"""Poison events against a store that is away: only the first are stepped over.

A store that refuses what an event makes (a SQLSTATE that blames the data, a fold that
raises) steps over that event; a store that cannot be reached (connection refused or lost,
pool closed, timeout, shutdown, out of resources, a serialization failure) raises, and the
projector retries the same events until they apply. The PostgreSQL store runs here against
a stand-in connection, so each error class is raised exactly where a real one would be;
tests/contracts holds both stores to the skipping on a real database."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from hutch.core.events import Event, SandboxStarted
from hutch.eventlog.sqlite import SqliteEventLog
from hutch.projections.memory import MemoryProjectionStore
from hutch.projections.postgres import PostgresProjectionStore, StoreUnavailable
from hutch.projections.postgres_sql import SKIP, WRITE
from hutch.projections.runner import Projector
from tests.contracts.test_projection_store import Log, created


class Conn:
    """Answers the store's statements as PostgreSQL would; its row write raises ``error``."""

    def __init__(self, error: BaseException | None, load_error: BaseException | None = None) -> None:
        self.error = error
        self.load_error = load_error
        self.position = 0
        self.skips: list[tuple[Any, ...]] = []
        self.writes = 0
        self.terminated = False

    def is_in_transaction(self) -> bool:
        return False

    def terminate(self) -> None:
        self.terminated = True

    def is_closed(self) -> bool:
        return self.terminated

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        if self.load_error is not None:
            raise self.load_error
        return [{"kind": "p", "id": None, "sandbox_id": None, "seq": self.position, "doc": None}]

    async def fetchval(self, sql: str, *args: Any) -> Any:
        if sql is WRITE:
            self.writes += 1
            if self.error is not None:
                raise self.error
            self.position = args[2]
            return True
        if sql is SKIP:
            self.skips.append(args)
            self.position = args[2]
            return True
        return self.position  # the position read before a skip


class Pool:
    """asyncpg's pool as the store uses it: ``acquire()`` taken with ``async with`` (reads) or
    awaited and given back with ``release`` (the projector's held connection)."""

    def __init__(self, conn: Conn, unreachable: BaseException | None = None) -> None:
        self.conn = conn
        self.unreachable = unreachable
        self.released = 0

    def acquire(self) -> Acquired:
        return Acquired(self)

    async def release(self, conn: Conn) -> None:
        self.released += 1
        conn.terminated = False  # the pool opens the next one afresh


class Acquired:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def __await__(self) -> Generator[Any, None, Conn]:
        if self.pool.unreachable is not None:
            raise self.pool.unreachable
        return self.pool.conn
        yield  # a generator: awaitable

    async def __aenter__(self) -> Conn:
        return await self

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.release(self.pool.conn)


def store_on(conn: Conn, unreachable: BaseException | None = None) -> PostgresProjectionStore:
    store = PostgresProjectionStore("postgresql://127.0.0.1:1/unused")
    store._pg._pool = Pool(conn, unreachable)  # type: ignore[assignment]  # the stand-in above
    return store


def events() -> list[Event]:
    log = Log()
    return [log("sbx_1", created("one")), log("sbx_1", SandboxStarted()), log("sbx_2", created("two"))]


UNREACHABLE = [
    asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation"),
    asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
    asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
    asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout"),
    asyncpg.exceptions.TooManyConnectionsError("sorry, too many clients already"),
    asyncpg.exceptions.DiskFullError("could not extend file: No space left on device"),
    asyncpg.exceptions.SerializationError("could not serialize access"),
    asyncpg.exceptions.ReadOnlySQLTransactionError("cannot execute UPDATE in a read-only transaction"),
    asyncpg.exceptions.InterfaceError("pool is closed"),
    ConnectionRefusedError(111, "Connection refused"),
    TimeoutError(),
]


@pytest.mark.parametrize("error", UNREACHABLE, ids=lambda e: type(e).__name__)
async def test_a_store_that_cannot_be_reached_raises_and_skips_nothing(error: BaseException) -> None:
    conn = Conn(error)
    store = store_on(conn)
    with pytest.raises((StoreUnavailable, asyncpg.PostgresError)):
        await store.apply(events())
    assert conn.skips == [] and conn.position == 0
    conn.error = None  # it is back: the same events apply, none was stepped over
    await store.apply(events())
    assert conn.skips == [] and conn.position == 3


@pytest.mark.parametrize("error", [ConnectionRefusedError(111, "Connection refused"), TimeoutError(),
                                   asyncpg.exceptions.InterfaceError("pool is closed")],
                         ids=lambda e: type(e).__name__)
async def test_a_pool_that_cannot_connect_is_unavailable(error: BaseException) -> None:
    conn = Conn(None)
    with pytest.raises(StoreUnavailable):
        await store_on(conn, unreachable=error).apply(events())
    assert conn.writes == 0 and conn.skips == []


REFUSED = [
    asyncpg.exceptions.UntranslatableCharacterError("unsupported Unicode escape sequence"),
    asyncpg.exceptions.CharacterNotInRepertoireError("invalid byte sequence for encoding"),
    asyncpg.exceptions.NotNullViolationError("null value in column violates not-null constraint"),
    asyncpg.exceptions.ProgramLimitExceededError("index row size exceeds maximum"),
]


@pytest.mark.parametrize("error", REFUSED, ids=lambda e: type(e).__name__)
async def test_a_refused_event_is_stepped_over_and_recorded(error: BaseException) -> None:
    conn = Conn(error)
    made = events()
    await store_on(conn).apply(made)  # the batch is refused, then each of its events alone
    assert conn.position == 3 and [args[2] for args in conn.skips] == [1, 2, 3]
    assert conn.skips[0][3:6] == (made[0].event_id, "sbx_1", "create")
    assert type(error).__name__ in conn.skips[0][6] and str(error) in conn.skips[0][6]


async def test_ids_refused_as_query_arguments_are_stepped_over_a_lost_connection_is_not() -> None:
    """The state read takes the events' ids as arguments: PostgreSQL refuses a NUL in them
    (22021), asyncpg one it cannot encode (its client-side DataError, a ValueError)."""
    for error in (asyncpg.exceptions.CharacterNotInRepertoireError("invalid byte sequence for encoding"),
                  asyncpg.exceptions._base.DataError("invalid input for query argument $3")):
        conn = Conn(None, load_error=error)
        await store_on(conn).apply(events()[:1])
        assert [args[2] for args in conn.skips] == [1], error
    conn = Conn(None, load_error=asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"))
    with pytest.raises(StoreUnavailable):
        await store_on(conn).apply(events()[:1])
    assert conn.skips == []


class Flaky(MemoryProjectionStore):
    """A store that is away for its first ``outages`` applies."""

    def __init__(self, outages: int) -> None:
        super().__init__()
        self.outages = outages
        self.tries = 0

    async def apply(self, events: Sequence[Event]) -> None:
        self.tries += 1
        if self.tries <= self.outages:
            raise StoreUnavailable("PostgreSQL projection store: connection refused")
        await super().apply(events)


async def test_the_projector_retries_a_store_that_is_away_and_skips_nothing(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db")
    await log.start()
    store = Flaky(outages=0)
    projector = Projector(log, store)
    try:
        await projector.start()
        store.outages = store.tries + 3
        made = events()
        positions = await log.append([Event(e.event_id, e.sandbox_id, e.created_at, e.data) for e in made])
        await projector.wait_for(positions[-1], timeout=30)
        assert store.tries >= store.outages + 1
        assert await store.skipped() == ([], 0)
        assert await store.get_sandbox("sbx_2") is not None and await store.position() == positions[-1]
    finally:
        await projector.close()
        await log.close()
