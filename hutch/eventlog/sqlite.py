"""The embedded event log: one SQLite file in WAL mode with synchronous=FULL.

WAL + FULL fsyncs the log on every commit, so an acknowledged append survives kill -9
and power loss. Appends arriving while a commit is in flight are grouped into the next
transaction (group commit), which is what keeps throughput up when fsync is slow.
All SQLite calls run on one dedicated thread so the event loop never blocks on disk.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import attrs

from hutch.core import counters, phases
from hutch.core.errors import LogUnavailable
from hutch.core.eventlog.base import EventLog
from hutch.core.events import Event, decode_or_unreadable, encode

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    position   INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id   TEXT NOT NULL UNIQUE,
    sandbox_id TEXT NOT NULL,
    type       TEXT NOT NULL,
    record     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_sandbox ON events (sandbox_id, position);
-- The log's identity: a random id given to the file when it is made (or, for a file of an
-- older hutch, when it is first opened), never changed: a replaced events.db has another.
CREATE TABLE IF NOT EXISTS log_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

# How often a subscriber re-reads when nothing was appended in this process
# (another process may share the file).
_POLL_SECONDS = 0.5


class SqliteEventLog(EventLog):
    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="eventlog")
        self._pending: list[tuple[Sequence[Event], asyncio.Future[list[int]]]] = []
        self._flushing: asyncio.Task[None] | None = None
        self._live: set[asyncio.Queue[list[Event]]] = set()
        self._last = 0
        self._identity: str | None = None

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        with phases.span("eventlog: a call in its thread, handoffs included"):
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript(_SCHEMA)
        conn.execute("INSERT OR IGNORE INTO log_meta (key, value) VALUES ('log_id', ?)", (str(uuid.uuid4()),))
        self._identity = "sqlite:" + conn.execute("SELECT value FROM log_meta WHERE key = 'log_id'").fetchone()[0]
        self._conn = conn
        row = conn.execute("SELECT COALESCE(MAX(position), 0) FROM events").fetchone()
        return int(row[0])

    async def start(self) -> None:
        try:
            self._last = await self._run(self._open)
        except sqlite3.Error as err:
            raise LogUnavailable(f"cannot open event log {self.path}: {err}") from err

    async def close(self) -> None:
        if self._flushing:
            await self._flushing
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await self._run(conn.close)
        self._executor.shutdown(wait=True)

    # ---------------------------------------------------------------- append

    async def append(self, events: Sequence[Event]) -> list[int]:
        if not events:
            return []
        counters.count("hutch_eventlog_appends_total")
        counters.count("hutch_eventlog_append_events_total", len(events))
        fut: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._pending.append((events, fut))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            counters.count("hutch_eventlog_writes_total")
            counters.count("hutch_eventlog_write_events_total", sum(len(evs) for evs, _ in batch))
            try:
                positions = await self._run(self._write, [evs for evs, _ in batch])
            except sqlite3.Error as err:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(LogUnavailable(f"event log append failed: {err}"))
                continue
            appended: list[Event] = []
            for (events, fut), pos in zip(batch, positions, strict=True):
                appended += [attrs.evolve(e, position=p) for e, p in zip(events, pos, strict=True)]
                if not fut.done():
                    fut.set_result(pos)
            self._last = positions[-1][-1]
            for queue in self._live:
                queue.put_nowait(appended)

    def _write(self, groups: list[Sequence[Event]]) -> list[list[int]]:
        assert self._conn is not None, "event log not started"
        conn = self._conn
        out: list[list[int]] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            for events in groups:
                positions = []
                for ev in events:
                    cur = conn.execute(
                        "INSERT INTO events (event_id, sandbox_id, type, record) VALUES (?, ?, ?, ?)",
                        (ev.event_id, ev.sandbox_id, ev.type, json.dumps(encode(ev), separators=(",", ":"))),
                    )
                    positions.append(int(cur.lastrowid or 0))
                out.append(positions)
            with phases.span("eventlog: sqlite COMMIT (WAL fsync), in its thread"):
                conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return out

    # ---------------------------------------------------------------- read

    def _select(self, after: int, sandbox_id: str | None, limit: int | None, reverse: bool) -> list[Event]:
        assert self._conn is not None, "event log not started"
        where: list[str] = []
        args: list[object] = []
        if reverse and after > 0:
            where.append("position < ?")
            args.append(after)
        elif not reverse:
            where.append("position > ?")
            args.append(after)
        if sandbox_id is not None:
            where.append("sandbox_id = ?")
            args.append(sandbox_id)
        sql = "SELECT position, record FROM events"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY position " + ("DESC" if reverse else "ASC")
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        rows = self._conn.execute(sql, args).fetchall()
        return [decode_or_unreadable(rec, pos) for pos, rec in rows]

    async def read(
        self, after: int = 0, *, sandbox_id: str | None = None, limit: int | None = None, reverse: bool = False
    ) -> list[Event]:
        return await self._run(self._select, after, sandbox_id, limit, reverse)

    async def last_position(self) -> int:
        conn = self._conn
        assert conn is not None, "the event log is not started"
        row = await self._run(lambda: conn.execute("SELECT COALESCE(MAX(position), 0) FROM events").fetchone())
        return int(row[0])

    async def identity(self) -> str | None:
        return self._identity

    async def subscribe(self, after: int = 0) -> AsyncIterator[Event]:
        """Catch up from disk, then take events straight from this process's appends
        (no re-read, no decode: the projector's hot path). A gap in positions (another
        process wrote to the file) or a quiet interval falls back to reading the file."""
        live: asyncio.Queue[list[Event]] = asyncio.Queue()
        self._live.add(live)  # before the first read, so nothing falls between the two
        try:
            position = after
            while True:
                batch = await self.read(position, limit=1000)
                for ev in batch:
                    assert ev.position is not None
                    position = ev.position
                    yield ev
                if len(batch) == 1000:
                    continue
                while True:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                    # cancellation racing its timeout, and an uncancellable subscriber
                    # hangs shutdown.
                    try:
                        async with asyncio.timeout(_POLL_SECONDS):
                            events = await live.get()
                    except TimeoutError:
                        break  # re-read the file
                    if events[0].position != position + 1 and events[0].position > position:  # type: ignore[operator]
                        break  # a gap: read it from the file
                    for ev in events:
                        if ev.position > position:  # type: ignore[operator]
                            position = ev.position  # type: ignore[assignment]
                            yield ev
        finally:
            self._live.discard(live)
