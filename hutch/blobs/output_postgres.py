"""The production profile's output streams (the port is ``core.output``): chunks in
PostgreSQL, so a stream written through one API replica is read through any other and
outlives the host that ran its command.

Layout (``storage/migrations/008_output.sql``): ``hutch_output_chunks(stream_id,
start_pos, end_pos, data)``, one row per saved piece; ``hutch_secrets`` holds the secret
stream ids are signed with, made once by the first replica, so every replica issues and
accepts the same ids.

* Writing: ``write`` never blocks. Bytes are kept in memory (never more than the output
  cap) and saved as a chunk once 64 KiB are pending or 100 ms after the first pending
  byte; the chunk row and the NOTIFY that wakes followers are one statement. ``close``
  saves what is pending, then releases the stream: readers here see it closed at once, readers
  elsewhere once the release lands (``close`` does not wait for it).
* Open or closed: a stream is open while its writer's PostgreSQL session holds the
  stream's advisory lock (taken at ``open`` on one session per process, released at
  ``close``). A writer killed with its host loses its session, so its streams read as
  closed at once, with every chunk it saved: no marker has to be cleaned up.
* Reading follows a stream by NOTIFY, and re-checks every ``_RECHECK_SECONDS`` because a
  dead writer sends nothing. It checks "open" *before* fetching chunks: a stream seen
  closed has every chunk committed, so the fetch after it is the whole remainder. A stream
  written by this process (or closed by it, up to ``_CLOSED_KEPT`` of them) needs neither
  question: whether it is open and how many bytes it committed are known here, so a reader
  fetches only bytes committed past its position (a command's two streams cost 2.5
  statements per one-shot `true` before, for no bytes at all). A stream id is a command's
  and written once, by the replica that runs the command.

* Owners (``storage/migrations/010_output_owners.sql``): a stream opened with an owner gets a
  ``hutch_output_streams`` row with its first chunk, in the chunk's own statement, and its
  byte count with every chunk after; ``stored`` sums an organization's rows, ``drop`` deletes
  a sandbox's rows and their chunks in one statement.

Chunks are deleted only with their sandbox's output (``drop``); a stream without an owner
(saved before streams had owners) is kept.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable

import asyncpg

from hutch.core.blobs import BlobUnavailable
from hutch.core.errors import InvalidInput
from hutch.core.output import (
    CHUNK,
    OutputStreams,
    OutputWriter,
    StreamOwner,
    check_offset,
    check_stream_id,
)
from hutch.storage.pg import UNAVAILABLE, Pool, count_statements

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.1  # how long a byte waits at most before it is saved
_ROW_MAX = 1 << 20  # the largest chunk row (a big write is saved as several)
_RECHECK_SECONDS = 0.25  # a follower's safety net: a killed writer notifies nobody
_CLOSED_KEPT = 4096  # streams closed here whose end is remembered, the oldest forgotten first
_RETRIES = (0.2, 0.5, 1.0)  # a chunk's save is retried after these pauses, then dropped
_CHANNEL = "hutch_output"
_SAVE = ("WITH c AS (INSERT INTO hutch_output_chunks (stream_id, start_pos, end_pos, data)"
         " VALUES ($1, $2, $3, $4)) SELECT pg_notify('hutch_output', $1)")
_SAVE_OWNED = ("WITH c AS (INSERT INTO hutch_output_chunks (stream_id, start_pos, end_pos, data)"
               " VALUES ($1, $2, $3, $4)),"
               " o AS (INSERT INTO hutch_output_streams (stream_id, org_id, sandbox_id, bytes) VALUES ($1, $5, $6, $3)"
               " ON CONFLICT (stream_id) DO UPDATE SET bytes = EXCLUDED.bytes)"
               " SELECT pg_notify('hutch_output', $1)")
_STORED = "SELECT coalesce(sum(bytes), 0)::bigint FROM hutch_output_streams WHERE org_id = $1"
_KEPT = "SELECT DISTINCT org_id, sandbox_id FROM hutch_output_streams"
_DROP = ("WITH s AS (DELETE FROM hutch_output_streams WHERE org_id = $1 AND sandbox_id = $2"
         " AND NOT stream_id = ANY($3::text[]) RETURNING stream_id, bytes),"
         " c AS (DELETE FROM hutch_output_chunks WHERE stream_id IN (SELECT stream_id FROM s))"
         " SELECT coalesce(sum(bytes), 0)::bigint FROM s")
_HELD = ("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
         " AND classid = $1 AND objid = $2"
         " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))")
_FETCH_ROWS = 16
_FETCH = ("SELECT start_pos, end_pos, data FROM hutch_output_chunks"
          f" WHERE stream_id = $1 AND end_pos > $2 ORDER BY end_pos LIMIT {_FETCH_ROWS}")
_SECRET = ("WITH made AS (INSERT INTO hutch_secrets (name, value) VALUES ($1, $2)"
           " ON CONFLICT (name) DO NOTHING RETURNING value)"
           " SELECT value FROM made UNION ALL SELECT value FROM hutch_secrets WHERE name = $1 LIMIT 1")


# One row per stream, in the order asked (WITH ORDINALITY): the answers map back to the askers.
_LOCK_MANY = ("SELECT array_agg(pg_try_advisory_lock(k) ORDER BY n)"
              " FROM unnest($1::bigint[], $2::text[]) WITH ORDINALITY AS u(k, s, n)")
_UNLOCK_MANY = ("SELECT array_agg(ok ORDER BY n) FROM (SELECT pg_advisory_unlock(k) AS ok, pg_notify('hutch_output', s), n"
                " FROM unnest($1::bigint[], $2::text[]) WITH ORDINALITY AS u(k, s, n)) released")


class _Batch:
    """Lock or unlock requests waiting for the one statement that takes them all."""

    def __init__(self, query: str) -> None:
        self.query = query
        self.pending: list[tuple[str, asyncio.Future[bool]]] = []
        self.sending: asyncio.Task[None] | None = None


def lock_key(stream_id: str) -> int:
    """The stream's advisory lock: 64 bits of a hash of its id (signed, as PostgreSQL takes it)."""
    return int.from_bytes(hashlib.sha256(stream_id.encode()).digest()[:8], "big", signed=True)


async def _held(conn: asyncpg.Connection, stream_id: str) -> bool:
    """Whether some session holds the stream's lock (its writer is alive)."""
    key = lock_key(stream_id) & 0xFFFFFFFFFFFFFFFF
    return bool(await conn.fetchval(_HELD, key >> 32, key & 0xFFFFFFFF))


class PostgresOutputWriter(OutputWriter):
    def __init__(self, store: PostgresOutputStreams, stream_id: str, cap: int, owner: StreamOwner | None) -> None:
        super().__init__(stream_id, cap, owner)
        self._store = store
        self._pending = bytearray()
        self._saved = 0  # where the next chunk starts
        self._full = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None

    def _save(self, data: bytes) -> None:
        self._pending += data
        if len(self._pending) >= CHUNK:
            self._full.set()
        if self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        try:
            while self._pending:
                if len(self._pending) < CHUNK and not self.closed:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(FLUSH_SECONDS):
                            await self._full.wait()
                self._full.clear()
                data = bytes(self._pending[:_ROW_MAX])
                del self._pending[:len(data)]
                await self._store._save_chunk(self.stream_id, self._saved, data, self.owner)
                self._saved += len(data)
        finally:
            self._pump = None

    async def finish(self) -> None:
        """Save everything pending (at once: no waiting out the flush delay)."""
        self.closed = True
        self._full.set()
        if self._pump is not None:
            await self._pump
        if self._pending:
            await self._drain()


class PostgresOutputStreams(OutputStreams):
    def __init__(self, dsn: str, cap_bytes: int, verify: Callable[[str], bool] = lambda _id: False) -> None:
        super().__init__(cap_bytes, verify)
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise InvalidInput(f"output streams: {dsn!r} is not a postgresql:// URL", field="store")
        self.dsn = dsn
        # Stateless: its sessions only read chunks and locks and write rows (the stream locks
        # and LISTEN live on ``_session``), so a release needs no reset statement.
        self._pg = Pool(dsn, what="output streams", unavailable=BlobUnavailable, stateless=True)
        self._session: asyncpg.Connection | None = None  # holds this process's stream locks
        self._session_lock = asyncio.Lock()  # one statement at a time on it
        self._writers: dict[str, PostgresOutputWriter] = {}
        self._closed: collections.OrderedDict[str, int] = collections.OrderedDict()  # closed here: bytes saved
        self._waiters: dict[str, set[asyncio.Event]] = {}
        # Locks and unlocks asked for together (a command's stdout and stderr are opened and
        # closed at once) go as one statement: two round trips a command fewer.
        self._locking = _Batch(_LOCK_MANY)
        self._unlocking = _Batch(_UNLOCK_MANY)
        self._releasing: set[asyncio.Future[bool]] = set()  # closes' lock releases on their way

    async def start(self) -> None:
        await self._pg.start()  # the one numbered schema, shared with the projection store
        try:
            self._session = await asyncpg.connect(self.dsn, command_timeout=60)
            count_statements(self._session, "output streams session")
            await self._session.add_listener(_CHANNEL, self._notified)
        except (*UNAVAILABLE, asyncpg.PostgresError) as err:
            await self.close_store()
            raise BlobUnavailable(f"cannot open the PostgreSQL output streams: {err}") from err

    async def close_store(self) -> None:
        for stream_id in list(self._writers):
            with contextlib.suppress(Exception):
                await self.close(stream_id)
        if self._releasing:  # readers elsewhere see those streams closed now, not at the session's end
            await asyncio.wait(list(self._releasing), timeout=10)
        if self._session is not None:
            session, self._session = self._session, None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(session.close(), 10)  # its locks go with it
        await self._pg.close()

    def _notified(self, _conn: object, pid: int, _channel: str, payload: str) -> None:
        session = self._session
        if session is not None and not session.is_closed() and pid == session.get_server_pid():
            return  # our own save or close: its readers here were woken as it committed
        self._wake(payload)

    async def _on_session(self, query: str, *args: object) -> object:
        self._pg.require()
        async with self._session_lock:
            lost: BaseException | None = None
            if self._session is not None and not self._session.is_closed():
                try:
                    return await self._session.fetchval(query, *args)
                except (*UNAVAILABLE, asyncpg.InternalClientError) as err:
                    # A backend ended under us: its FATAL message can leave the protocol mid-state
                    # ("cannot switch to state 12; another operation is in progress").
                    lost = err
            try:  # on a new session: a restarted database must not stop every later command
                session = await self._reconnect()
                return await session.fetchval(query, *args)
            except (*UNAVAILABLE, asyncpg.PostgresError) as err:
                raise BlobUnavailable(f"PostgreSQL output streams: {err}" + (f" (after {lost})" if lost else "")) \
                    from err

    async def _reconnect(self) -> asyncpg.Connection:
        """A new session, holding again the locks of the streams still open here (readers
        elsewhere saw them closed meanwhile, and stopped reading them)."""
        old, self._session = self._session, None
        if old is not None:
            old.terminate()
        session = await asyncpg.connect(self.dsn, command_timeout=60)
        count_statements(session, "output streams session")
        try:
            await session.add_listener(_CHANNEL, self._notified)
            await session.execute("SELECT pg_try_advisory_lock(k) FROM unnest($1::bigint[]) AS k",
                                  [lock_key(stream_id) for stream_id in self._writers])
        except BaseException:
            session.terminate()
            raise
        self._session = session
        return session

    async def _batched(self, batch: _Batch, stream_id: str) -> bool:
        """``stream_id``'s lock taken or released (``batch``) in one statement with whatever
        other streams asked for the same meanwhile; True when PostgreSQL said so."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        batch.pending.append((stream_id, fut))
        if batch.sending is None:
            batch.sending = asyncio.create_task(self._send(batch))
        return await fut

    async def _send(self, batch: _Batch) -> None:
        try:
            while batch.pending:
                await asyncio.sleep(0)  # let the streams opened or closed with this one ask too
                asked, batch.pending = batch.pending, []
                ids = [stream_id for stream_id, _ in asked]
                try:
                    answers = await self._on_session(batch.query, [lock_key(i) for i in ids], ids)
                except Exception as err:
                    for _, fut in asked:
                        if not fut.done():
                            fut.set_exception(err)
                    continue
                assert isinstance(answers, list) and len(answers) == len(asked)
                for (_, fut), answer in zip(asked, answers, strict=True):
                    if not fut.done():
                        fut.set_result(bool(answer))
        finally:
            batch.sending = None

    def _conn(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        return self._pg.conn()

    async def secret(self) -> bytes:
        value = await self._on_session(_SECRET, "stream-ids", secrets.token_bytes(32))
        assert isinstance(value, bytes)
        return value

    async def open(self, stream_id: str, owner: StreamOwner | None = None) -> PostgresOutputWriter:
        writer = self._writers.get(check_stream_id(stream_id))
        if writer is None:
            if not await self._batched(self._locking, stream_id):
                raise InvalidInput(f"stream {stream_id} is already being written by another process")
            writer = self._writers[stream_id] = PostgresOutputWriter(self, stream_id, self.cap, owner)
            self._closed.pop(stream_id, None)
        elif writer.owner is None and writer.size == 0:
            writer.owner = owner
        return writer

    async def close(self, stream_id: str) -> None:
        writer = self._writers.get(check_stream_id(stream_id))
        if writer is None:
            return
        try:
            await writer.finish()
        except Exception:  # never in the way of the execution being recorded finished
            log.exception("output stream %s: saving its last bytes failed", stream_id)
        finally:
            self._writers.pop(stream_id, None)
            self._closed[stream_id] = writer._saved  # every byte saved is committed by now
            while len(self._closed) > _CLOSED_KEPT:
                self._closed.popitem(last=False)
            self._wake(stream_id)
            # Released after the last chunk committed: a reader elsewhere seeing it closed sees
            # them all. Not awaited: the close answers once every byte is committed, and the
            # release (with its NOTIFY) lands a round trip later without holding up what follows
            # it, the command's end being recorded (one statement fewer in series, per command).
            release = asyncio.ensure_future(self._batched(self._unlocking, stream_id))
            self._releasing.add(release)
            release.add_done_callback(self._released)

    def _released(self, release: asyncio.Future[bool]) -> None:
        self._releasing.discard(release)
        if not release.cancelled() and isinstance(err := release.exception(), Exception) \
                and not isinstance(err, BlobUnavailable):  # a lost session released it already
            log.error("output stream lock release failed: %s", err)

    async def _save_chunk(self, stream_id: str, start: int, data: bytes, owner: StreamOwner | None) -> None:
        query, args = (_SAVE, ()) if owner is None else (_SAVE_OWNED, (owner.org_id, owner.sandbox_id))
        for pause in (*_RETRIES, None):
            try:
                await self._on_session(query, stream_id, start, start + len(data), data, *args)
                break
            except (BlobUnavailable, asyncpg.PostgresError) as err:
                if pause is None:
                    log.error("output stream %s: %d bytes at %d lost: %s", stream_id, len(data), start, err)
                    return
                await asyncio.sleep(pause)
        self._wake(stream_id)

    def _wake(self, stream_id: str) -> None:
        for event in self._waiters.get(stream_id, ()):
            event.set()

    def _known(self, stream_id: str) -> tuple[bool, int] | None:
        """(open, bytes committed) of a stream written here, or closed here; None: ask PostgreSQL."""
        writer = self._writers.get(stream_id)
        if writer is not None:
            return True, writer._saved
        saved = self._closed.get(stream_id)
        return None if saved is None else (False, saved)

    async def is_open(self, stream_id: str) -> bool:
        known = self._known(check_stream_id(stream_id))
        if known is not None:
            return known[0]
        async with self._conn() as conn:
            return await _held(conn, stream_id)

    async def size(self, stream_id: str) -> int:
        async with self._conn() as conn:
            value = await conn.fetchval("SELECT max(end_pos) FROM hutch_output_chunks WHERE stream_id = $1",
                                        check_stream_id(stream_id))
        return int(value or 0)

    async def stored(self, org_id: str) -> int:
        async with self._conn() as conn:
            saved = int(await conn.fetchval(_STORED, org_id))
        # Written here and not saved yet (at most a chunk a stream, for 100 ms): counted already.
        return saved + sum(w.size - w._saved for w in self._writers.values()
                           if w.owner is not None and w.owner.org_id == org_id)

    async def kept(self) -> list[StreamOwner]:
        async with self._conn() as conn:
            rows = await conn.fetch(_KEPT)
        return [StreamOwner(r["org_id"], r["sandbox_id"]) for r in rows]

    async def drop(self, owner: StreamOwner) -> int:
        async with self._conn() as conn:
            return int(await conn.fetchval(_DROP, owner.org_id, owner.sandbox_id, list(self._writers)))

    async def read(self, stream_id: str, offset: int = 0) -> AsyncIterator[bytes]:
        check_offset(check_stream_id(stream_id), offset)
        changed = asyncio.Event()
        self._waiters.setdefault(stream_id, set()).add(changed)
        try:
            position = offset
            while True:
                changed.clear()
                known = self._known(stream_id)
                if known is not None and position >= known[1]:
                    live, rows = known[0], []  # nothing committed past the position
                else:
                    async with self._conn() as conn:
                        # "Open" before the fetch, in its own statement: see the module docstring.
                        live = known[0] if known is not None else await _held(conn, stream_id)
                        rows = await conn.fetch(_FETCH, stream_id, position)
                for row in rows:
                    data = row["data"][max(position - row["start_pos"], 0):]
                    for at in range(0, len(data), CHUNK):
                        yield data[at:at + CHUNK]
                    position = row["end_pos"]
                if not live and len(rows) < _FETCH_ROWS:
                    return  # closed before the fetch, and the fetch got to its end
                if rows:
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_RECHECK_SECONDS):
                        await changed.wait()
        finally:
            waiters = self._waiters.get(stream_id)
            if waiters is not None:
                waiters.discard(changed)
                if not waiters:
                    del self._waiters[stream_id]
