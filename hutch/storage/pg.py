"""One asyncpg pool as the PostgreSQL adapters use it: opened with the numbered schema applied,
closed without hanging, and a connection error turned into the adapter's own "unavailable"
error (which the API answers 503), so a PostgreSQL outage is never a 500.

The projection store, the blob store, the output streams and the replica registry each own
one (their callers start and close them separately); each says what it is called in errors
and which exception means "unavailable". It lives below them all (``hutch.storage``) so no
adapter package imports another's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable

import asyncpg

from hutch.core import counters
from hutch.storage.schema import migrate

log = logging.getLogger(__name__)

# What a lost or refusing server looks like: retry later, never a bug in the request.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError, asyncpg.OperatorInterventionError)


_TABLE = re.compile(r"\b(?:from|into|update|join)\s+([a-z_][\w.]*)")
_PG_FUNCTION = re.compile(r"\b(pg_\w+)\s*\(")
_FUNCTION = re.compile(r"\s*select\s+([a-z_][\w.]*)\s*\(")
_kinds: dict[str, str] = {}  # the code's statements are a fixed set of strings


def _kind(query: str) -> str:
    """A statement's first keyword and the first table (or called function) it names:
    "select sandboxes", "insert output_chunks". Few enough to label, enough to find the caller."""
    kind = _kinds.get(query)
    if kind is None:
        q = query.lower()
        m = _TABLE.search(q) or _FUNCTION.match(q)
        if m is not None and m.group(1) == "unnest":  # rows of arguments: name what they drive
            m = _PG_FUNCTION.search(q) or m
        verb = q.split(None, 1)[0] if q.strip() else "?"
        kind = f"{verb} {m.group(1)}" if m else verb
        if len(_kinds) < 1000:  # a query built from values must not grow this without end
            _kinds[query] = kind
    return kind


def count_statements(conn: asyncpg.Connection, what: str) -> None:
    """Count every statement ``conn`` sends (``hutch_store_statements_total``) under ``what``
    and its kind: a statement is a round trip, whatever the machine's load."""
    def counted(record: asyncpg.connection.LoggedQuery) -> None:
        counters.count("hutch_store_statements_total", 1, (("store", what), ("kind", _kind(record.query))))

    conn.add_query_logger(counted)


class _KeptSession(asyncpg.Connection):
    """A connection handed back to the pool as it is (asyncpg still rolls back an open
    transaction and drops listener callbacks): no reset statement, one round trip less."""

    def get_reset_query(self) -> str:
        return ""


class Pool:
    def __init__(self, dsn: str, *, what: str, unavailable: Callable[[str], Exception],
                 min_size: int = 1, max_size: int = 10, stateless: bool = False,
                 settings: dict[str, str] | None = None) -> None:
        self.dsn = dsn
        self.what = what  # "projection store", "blob store": named in every error
        self._unavailable = unavailable
        self._min_size = min_size
        self._max_size = max_size
        # stateless: the caller's sessions leave nothing behind (no SET, no session advisory
        # lock, listeners removed), so release skips asyncpg's reset statement ("RESET ALL;
        # UNLISTEN *; ..."): 0.41 ms p50 on every release, about a dozen per execute.
        self._connection_class = _KeptSession if stateless else asyncpg.Connection
        # Session settings sent with the connection's startup packet: no statement, no round trip.
        self._settings = dict(settings or {})
        # Called for every session the pool opens (at start, as it grows, in place of a lost
        # one): the projection store holds its reads then (projections/postgres.py).
        self.on_connect: Callable[[], None] | None = None
        self._pool: asyncpg.Pool | None = None
        self._held: asyncpg.Connection | None = None  # ``held``'s connection, out of the pool
        self._holding = asyncio.Lock()

    @property
    def started(self) -> bool:
        return self._pool is not None

    async def start(self) -> None:
        """Open the pool and bring the one numbered schema up to date (``storage.schema``)."""
        try:
            # Commits wait for the WAL flush (synchronous_commit on) unless the owner says
            # otherwise in ``settings``: only the projection store does, for its derived tables
            # (projections/postgres.py says why that is safe and what its reads do about it).
            self._pool = await asyncpg.create_pool(self.dsn, min_size=self._min_size, max_size=self._max_size,
                                                   command_timeout=60, connection_class=self._connection_class,
                                                   init=self._init, server_settings=self._settings or None)
            async with self._pool.acquire() as conn:
                for name in await migrate(conn):
                    log.info("%s: applied migration %s", self.what, name)
        except (*UNAVAILABLE, asyncpg.PostgresError) as err:
            await self.close()
            raise self._unavailable(f"cannot open the PostgreSQL {self.what}: {err}") from err

    async def _init(self, conn: asyncpg.Connection) -> None:
        count_statements(conn, self.what)
        if self.on_connect is not None:
            self.on_connect()

    async def close(self) -> None:
        await self._drop_held()  # the pool's close waits for every connection to come back
        if self._pool is not None:
            pool, self._pool = self._pool, None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(pool.close(), 10)

    def require(self) -> asyncpg.Pool:
        if self._pool is None:
            raise self._unavailable(f"the PostgreSQL {self.what} is not started")
        return self._pool

    @contextlib.asynccontextmanager
    async def conn(self) -> AsyncIterator[asyncpg.Connection]:
        pool = self.require()
        try:
            async with pool.acquire() as conn:
                try:
                    yield conn
                except asyncpg.InternalClientError:
                    conn.terminate()  # asyncpg cannot use it again, but would hand it out again
                    raise
        except (*UNAVAILABLE, asyncpg.InternalClientError) as err:  # the latter: its end seen mid-statement
            # A session lost (its backend ended by a server crash or an administrator, its end
            # seen only now): the pool's other idle sessions most likely went with it, and a
            # read retried once must not meet the next of them. Each is opened afresh on use.
            await pool.expire_connections()
            raise self._unavailable(f"PostgreSQL {self.what}: {err}") from err

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[asyncpg.Connection]:
        """One connection kept out of the pool between uses, for a caller that uses it back to
        back (the projector's writes, one batch after another), one use at a time. Taking a
        connection from the pool and giving it back costs three loop turns (asyncpg's release
        runs in a task under ``asyncio.shield``): 0.27 against 0.08 ms for a ``SELECT 1`` on an
        idle loop, more on a busy one, and the projector's batch is on the way of every write's
        answer. A connection error drops it (the next use takes another), and so does a
        cancellation (a statement may be half-way); a statement's own error leaves it as it was."""
        async with self._holding:
            pool = self.require()
            try:
                if self._held is not None and not _usable(self._held):
                    await self._drop_held()  # its server went away while it was idle
                if self._held is None:
                    self._held = await pool.acquire()
                yield self._held
            except (*UNAVAILABLE, asyncpg.InternalClientError) as err:  # the latter: its end seen mid-statement
                await self._drop_held()
                raise self._unavailable(f"PostgreSQL {self.what}: {err}") from err
            except Exception:
                raise  # a refused value, a position that moved: the session is as it was
            except BaseException:
                await self._drop_held()
                raise

    async def _drop_held(self) -> None:
        conn, self._held = self._held, None
        if conn is not None and self._pool is not None:
            with contextlib.suppress(Exception):  # asyncpg may have taken it back already
                conn.terminate()  # its session may be mid-statement; the pool opens a fresh one
                await self._pool.release(conn)


def _usable(conn: asyncpg.Connection) -> bool:
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:  # asyncpg took it back into the pool when its backend ended
        return False

