"""The embedded event log: one SQLite file in WAL mode with synchronous=FULL.

WAL + FULL fsyncs the log on every commit, so an acknowledged append survives kill -9
and power loss. Appends arriving while a commit is in flight are grouped into the next
transaction (group commit), which is what keeps throughput up when fsync is slow.

All SQLite calls run on one long-lived thread so the event loop never blocks on disk. The
loop hands it work through a queue and the thread answers once per batch with one
``call_soon_threadsafe`` (issue 37: a ``ThreadPoolExecutor`` submit, its wrapped future and a
flush task per commit cost more loop turns and GIL hand-offs than the fsync itself). One
thread doing every call in queue order is also what makes an acknowledged append visible to
any read that follows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import queue
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs

from hutch.core import counters, phases
from hutch.core.errors import LogUnavailable
from hutch.core.eventlog.base import EventLog
from hutch.core.events import Encoded, Event, decode_or_unreadable, encode

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

# Rows per INSERT statement: 4 host parameters a row, far below SQLite's limit (32766), and
# a batch this size or smaller is written by a single statement.
_ROWS_PER_INSERT = 250


@functools.lru_cache(maxsize=_ROWS_PER_INSERT)
def _insert_sql(rows: int) -> str:
    return "INSERT INTO events (event_id, sandbox_id, type, record) VALUES " + ",".join(["(?,?,?,?)"] * rows)


def _row(item: Event | Encoded) -> tuple[str, str, str, str]:
    if isinstance(item, Encoded):  # the recorder's bytes: not encoded again
        ev = item.event
        return ev.event_id, ev.sandbox_id, ev.type, item.record
    return item.event_id, item.sandbox_id, item.type, json.dumps(encode(item), separators=(",", ":"))


def _appended(item: Event | Encoded, position: int) -> Event:
    """The event as this process's subscribers get it: with its record's size when it came
    encoded (the projections' folds count it: ``core.events.recorded_size``)."""
    if isinstance(item, Encoded):
        return attrs.evolve(item.event, position=position, size=item.size)
    return attrs.evolve(item, position=position)


@attrs.define(slots=True)
class _Append:
    events: Sequence[Event | Encoded]
    fut: asyncio.Future[list[int]]


@attrs.define(slots=True)
class _Call:
    fn: Callable[..., Any]
    args: tuple[object, ...]
    fut: asyncio.Future[Any]


@attrs.define(slots=True)
class _Stop:
    """The thread's last job: close the file, answer, end."""

    fut: asyncio.Future[None]


class SqliteEventLog(EventLog):
    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._jobs: queue.SimpleQueue[_Append | _Call | _Stop] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._live: set[asyncio.Queue[list[Event]]] = set()
        self._last = 0
        self._identity: str | None = None

    def _submit(self, job: _Append | _Call) -> None:
        if self._thread is None or self._closed:
            raise LogUnavailable(f"event log {self.path} is {'closed' if self._closed else 'not started'}")
        self._jobs.put(job)

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        with phases.span("eventlog: a call in its thread, handoffs included"):
            fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
            self._submit(_Call(fn, args, fut))
            return await fut

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
        self._thread = threading.Thread(target=self._serve, name="eventlog", daemon=True)
        self._thread.start()
        try:
            self._last = await self._run(self._open)
        except BaseException as err:
            await self._stop()  # no thread left waiting for work that cannot come
            if isinstance(err, sqlite3.Error | OSError):
                raise LogUnavailable(f"cannot open event log {self.path}: {err}") from err
            raise

    async def close(self) -> None:
        if self._thread is not None and not self._closed:
            await self._stop()

    async def _stop(self) -> None:
        """Every job queued before this one is done and answered, then the file is closed."""
        assert self._thread is not None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closed = True
        self._jobs.put(_Stop(done))
        await done
        self._thread.join()  # it has answered: only its return is left

    # ---------------------------------------------------------------- the thread

    def _serve(self) -> None:
        """The log's thread: take everything queued, write the appends among it as one
        transaction per run of appends, run the calls in between in order, answer the loop
        once."""
        while True:
            jobs = [self._jobs.get()]
            while True:
                try:
                    jobs.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            answers: list[tuple[Any, ...]] = []
            appends: list[_Append] = []
            stopping = False
            for job in jobs:
                if isinstance(job, _Append):
                    appends.append(job)
                    continue
                if appends:
                    answers.append(self._write(appends))
                    appends = []
                if isinstance(job, _Call):
                    try:
                        answers.append(("call", job.fut, job.fn(*job.args), None))
                    except Exception as err:  # handed to the caller
                        answers.append(("call", job.fut, None, err))
                else:  # _Stop: nothing is queued after it (the log refuses new jobs once closed)
                    if self._conn is not None:
                        conn, self._conn = self._conn, None
                        conn.close()
                    answers.append(("call", job.fut, None, None))
                    stopping = True
            if appends:
                answers.append(self._write(appends))
            # Each answer goes to the loop its caller awaits on (one, but for a log a test
            # shares between event loops).
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Any, ...]]] = {}
            for answer in answers:
                fut = answer[1] if answer[0] == "call" else answer[1][0].fut
                by_loop.setdefault(fut.get_loop(), []).append(answer)
            for loop, theirs in by_loop.items():
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(self._settle, theirs)
            if stopping:
                return

    def _write(self, appends: list[_Append]) -> tuple[Any, ...]:
        """One transaction for these appends: ("append", appends, first position, error)."""
        try:
            assert self._conn is not None, "event log not started"
            rows = [_row(ev) for job in appends for ev in job.events]
            with phases.span("eventlog: sqlite INSERT + COMMIT (WAL fsync), in its thread"):
                last = self._insert(self._conn, rows)
        except Exception as err:  # handed to the appenders: the thread must go on
            return ("append", appends, 0, err)
        # AUTOINCREMENT gives each row one more than the largest so far, and the write lock is
        # held from the first row to the commit: the rows are last-n+1 .. last, in order.
        return ("append", appends, last - len(rows) + 1, None)

    @staticmethod
    def _insert(conn: sqlite3.Connection, rows: list[tuple[str, str, str, str]]) -> int:
        """Insert and commit ``rows``; the last one's position. One statement outside a
        transaction is its own: the insert and the commit's fsync are a single sqlite3_step,
        so this thread gives up and takes back the GIL once, not once per statement."""
        chunks = [rows[i:i + _ROWS_PER_INSERT] for i in range(0, len(rows), _ROWS_PER_INSERT)]
        if len(chunks) == 1:
            return int(conn.execute(_insert_sql(len(rows)), [v for row in rows for v in row]).lastrowid or 0)
        conn.execute("BEGIN IMMEDIATE")
        try:
            for chunk in chunks:
                last = int(conn.execute(_insert_sql(len(chunk)), [v for row in chunk for v in row]).lastrowid or 0)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return last

    # ---------------------------------------------------------------- the loop's side

    def _settle(self, answers: list[tuple[Any, ...]]) -> None:
        """On the loop: the thread's answers for one batch, in the order it did them."""
        for kind, target, value, err in answers:
            if kind == "call":
                if not target.done():
                    if err is not None:
                        target.set_exception(err)
                    else:
                        target.set_result(value)
                continue
            appends: list[_Append] = target
            counters.count("hutch_eventlog_writes_total")
            counters.count("hutch_eventlog_write_events_total", sum(len(job.events) for job in appends))
            if err is not None:
                for job in appends:
                    if not job.fut.done():
                        job.fut.set_exception(LogUnavailable(f"event log append failed: {err}")
                                              if isinstance(err, sqlite3.Error) else err)
                continue
            position = value
            appended: list[Event] = []
            for job in appends:
                positions = list(range(position, position + len(job.events)))
                position += len(job.events)
                if self._live:
                    appended += [_appended(e, p) for e, p in zip(job.events, positions, strict=True)]
                if not job.fut.done():
                    job.fut.set_result(positions)
            self._last = position - 1
            for live in self._live:
                live.put_nowait(appended)

    # ---------------------------------------------------------------- append

    async def append(self, events: Sequence[Event | Encoded]) -> list[int]:
        if not events:
            return []
        counters.count("hutch_eventlog_appends_total")
        counters.count("hutch_eventlog_append_events_total", len(events))
        fut: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        t0 = phases.start()
        self._submit(_Append(events, fut))
        try:
            return await fut
        finally:
            phases.end("eventlog: an append, queued to acknowledged", t0)

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
