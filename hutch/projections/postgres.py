"""The production projection store: PostgreSQL through asyncpg.

Exactly once: ``apply`` reads the tracked log position (``projection_position``) with the
state a batch touches, skips every event at or below that position, folds the rest with
the shared ``projections.base.fold``, and writes the changed rows together with the new
position in one statement that only takes effect if the position is still the one it
read. A crash (of this process or of PostgreSQL) before that statement commits loses the
rows and the position together, so the batch is applied again; after it, both are there,
so the batch is skipped. Several projectors may share one database (an in-process
projector in each API process, or ``hutch projector``): a projector whose position moved
under it writes nothing and looks again. A store that holds *less* than this object
saw it hold (commits lost in a crash — commits do not wait for the WAL flush — a restored
backup, a reset) raises ``StoreBehind`` and the projector follows the log again from the
store's position: such losses are repaired from the log, never skipped. Until it has, reads
do not show the older state: each new session holds them (``hold_reads_on_reconnect``).

A batch the store refuses (``EventRefused``: a value PostgreSQL cannot hold, such as a NUL
in text or jsonb, or a fold that raised on a malformed event) is applied again event by
event; the event refused on its own is recorded in ``projection_skipped`` and the position
moves past it in one statement, so one poison event cannot hold back every later write.
Only SQLSTATE classes that blame the data refuse (see ``_REFUSING``); a store that cannot
be reached (connection refused or lost, pool closed, timeout, shutdown) raises
``StoreUnavailable`` and the projector retries the same events.

Each write NOTIFYs ``hutch_projection`` with the new position; a process that does not
run a projector itself can ``wait_for`` a position without polling.

The tables are part of the one numbered schema ``storage.schema`` applies when the pool
starts (``storage/migrations/``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from typing import Any, ParamSpec, TypeVar

import asyncpg
import attrs

from hutch.core import counters, phases
from hutch.core.errors import HutchError, InvalidInput
from hutch.core.events import Event
from hutch.core.lifecycle import execution_id_of
from hutch.core.models import ExecutionState, SandboxState, SnapshotState, SnapshotStatus
from hutch.core.serde import converter
from hutch.core.snapshots import FORK_OF, evolve_snapshot, is_snapshot_event
from hutch.core.tenancy import (
    ApiKeyRecord,
    Directory,
    OrganizationRecord,
    ProjectRecord,
    Record,
    SshKeyRecord,
)
from hutch.projections.base import (
    SNAPSHOT_SORTS,
    EventRefused,
    ProjectionStore,
    SandboxQuery,
    SkippedEvent,
    SnapshotQuery,
    StoreBehind,
    StoreCapabilities,
    fold,
    is_tenancy_event,
    skipped_event,
)
from hutch.projections.postgres_mirror import Loaded, Mirror
from hutch.projections.postgres_sql import LOAD, SKIP, SKIPPED, WRITE, where_clause
from hutch.storage.pg import Pool

log = logging.getLogger(__name__)
_P = ParamSpec("_P")
_T = TypeVar("_T")

PROJECTION = "state"
NOTIFY_CHANNEL = "hutch_projection"
# Events per transaction when applying a backlog (a rebuild, a projector catching up).
APPLY_CHUNK = 500
# SQLSTATE classes that blame what the events make, not the store: data exceptions (22: a NUL
# in text or jsonb, a number out of range), integrity constraints (23), program limits (54: a
# value too large for a row). Every other class is the store being away or busy (08
# connection, 57 shutdown or timeout, 53 resources, 40 serialization): retried, never skipped.
_REFUSING = ("22", "23", "54")
# An operator's reset or rebuild is answered once it is flushed, as before.
_FLUSHED = "SET LOCAL synchronous_commit TO on"
_SORT = {
    "createdAt": "created_at",
    "updatedAt": "updated_at",
    "name": "COALESCE(name, '')",
    "status": "status",
    "mode": "mode",
    "executions": "COALESCE((doc->>'executions')::bigint, 0)",
}



def _read_once_more(method: Callable[_P, Coroutine[Any, Any, _T]]) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """Retry a read once when the store was unavailable (see the reads section)."""

    @functools.wraps(method)
    async def read(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await method(*args, **kwargs)
        except ReadsHeld:
            raise  # held for READ_HOLD_SECONDS already: say so now
        except StoreUnavailable:
            return await method(*args, **kwargs)

    return read

class StoreUnavailable(HutchError):
    status = 503
    code = "STORE_UNAVAILABLE"
    retriable = True


class ReadsHeld(StoreUnavailable):
    """A read held past ``READ_HOLD_SECONDS`` while the store is checked against the log."""


# How long a read waits, after a new session, for the projector to check the store against
# the log's end (normally a few milliseconds: the log's end and the store's position read,
# a lost batch or two applied again) before it answers 503.
READ_HOLD_SECONDS = 10.0


def _json_default(value: object) -> object:
    if isinstance(value, (set, frozenset)):  # the converter leaves frozenset[str] fields as they are
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=_json_default)


def _sandbox(row: asyncpg.Record) -> SandboxState:
    return converter.structure(json.loads(row["doc"]), SandboxState)


def _execution(row: asyncpg.Record) -> ExecutionState:
    return converter.structure(json.loads(row["doc"]), ExecutionState)


def _snapshot(row: asyncpg.Record) -> SnapshotState:
    return converter.structure(json.loads(row["doc"]), SnapshotState)


class PostgresProjectionStore(ProjectionStore):
    capabilities = StoreCapabilities(shared=True, atomic_rebuild=True)

    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 10) -> None:
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise InvalidInput(f"store: {dsn!r} is not a postgresql:// URL", field="store")
        self.dsn = dsn
        # Stateless sessions: statements and transactions only; wait_for removes its listener.
        # Commits do not wait for the WAL flush (synchronous_commit off, sent at connect: no
        # statement): 0.2 against 1.5-2.4 ms a commit here, and a projection write is on the
        # way of every write's answer. Every table this pool writes is derived, rebuilt from
        # the log (Kafka, acks=all: the record): sandboxes, executions, snapshots, tenancy,
        # projection_skipped, and projection_position, which commits in the same transaction
        # as the rows it covers, so a crash that loses the last batches only takes the
        # position back with them and the projector applies them again. Reads are held after
        # a new session until that is done (``_read``). Tables that are no fold of the log
        # keep flushed commits, in their own pools: owner rows and replica leases
        # (projections/replicas.py), output chunks and streams, secrets (blobs/output_postgres.py),
        # blobs (blobs/postgres.py), the audit trail (projections/audit.py: its own
        # connection). ``rebuild`` and ``reset``, an operator's commands, flush too.
        self._pg = Pool(dsn, what="projection store", unavailable=StoreUnavailable,
                        min_size=min_size, max_size=max_size, stateless=True,
                        settings={"synchronous_commit": "off"})
        self._pg.on_connect = self._on_connect
        # Reads held since a new session (see ``hold_reads_on_reconnect``): the hold's number,
        # None when none is on; ``_released`` is set when none is.
        self._reconnected: Callable[[], None] | None = None
        self._holds = 0
        self._held: int | None = None
        self._released: asyncio.Event | None = None
        # The highest position this object saw the store hold: finding less means commits were
        # lost (see StoreBehind), which must not pass silently.
        self._floor = 0
        # What this object wrote last, so that a batch touching only that needs no LOAD.
        self._mirror = Mirror()

    # ---------------------------------------------------------------- lifetime

    async def start(self) -> None:
        await self._pg.start()

    async def close(self) -> None:
        await self._pg.close()

    def _conn(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        return self._pg.conn()

    # ---------------------------------------------------------------- reads after a new session

    def hold_reads_on_reconnect(self, reconnected: Callable[[], None]) -> None:
        self._released = asyncio.Event()
        self._released.set()
        self._reconnected = reconnected

    def _on_connect(self) -> None:
        """The pool opened a session: the server may have restarted since the last one (and
        lost the last batches, whose commits were not flushed). Hold the reads until the
        projector has checked; a session opened as the pool grows costs that check too."""
        if self._reconnected is None or self._released is None:
            return  # no projector answers for this store here (a command-line tool): as before
        self._holds += 1
        self._held = self._holds
        self._released.clear()
        self._reconnected()

    def reads_held(self) -> int | None:
        return self._held

    def release_reads(self, hold: int) -> bool:
        if self._held != hold:
            return self._held is None
        self._held = None
        if self._released is not None:
            self._released.set()
        return True

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[asyncpg.Connection]:
        """A session for a read of the projection, once no hold is on. The session is taken
        first: taking it may open the very session that begins a hold."""
        while True:
            async with self._conn() as conn:
                if self._held is None:
                    yield conn
                    return
            await self._until_released()

    async def _until_released(self) -> None:
        released = self._released
        assert released is not None
        try:
            async with asyncio.timeout(READ_HOLD_SECONDS):
                await released.wait()
        except TimeoutError:
            raise ReadsHeld(
                "the projection store reconnected to PostgreSQL and is not yet checked against the event log "
                "(its last applied batches may have been lost with the server and are being applied again); "
                f"reads wait for that, and it has taken more than {READ_HOLD_SECONDS:g} s: retry shortly") from None

    # ---------------------------------------------------------------- writes

    @_read_once_more
    async def position(self) -> int:
        async with self._conn() as conn:
            return int(await conn.fetchval("SELECT position FROM projection_position WHERE projection = $1", PROJECTION))

    async def apply(self, events: Sequence[Event]) -> None:
        # On the pool's held connection: the projector applies batch after batch, and each
        # writer's answer waits for its batch (``storage.pg.Pool.held``: no pool hand-off).
        for i in range(0, len(events), APPLY_CHUNK):
            async with self._pg.held() as conn:
                await self._apply_stepping(conn, events[i : i + APPLY_CHUNK])

    async def _apply_stepping(self, conn: asyncpg.Connection, events: Sequence[Event]) -> int:
        """``_apply_in``, stepping over poison: a batch the store refuses is applied again event
        by event, and an event refused on its own is recorded and skipped. Inside a transaction
        (``rebuild``) each try runs under a savepoint: a refused statement aborts only that."""
        try:
            async with _savepoint(conn):
                return await self._apply_in(conn, events)
        except EventRefused as refused:
            if len(events) == 1:
                return await self._skip_in(conn, events[0], refused)
            log.warning("projection store refused the batch at log positions %s-%s (%s); applying it event "
                        "by event", events[0].position, events[-1].position, refused)
        position = 0
        for event in events:
            position = await self._apply_stepping(conn, [event])
        return position

    async def _skip_in(self, conn: asyncpg.Connection, event: Event, refused: EventRefused) -> int:
        """Record ``event`` in ``projection_skipped`` and move the position past it, unless another
        projector did so (or applied it) first; returns the position."""
        skip = skipped_event(event, refused.__cause__ or refused)
        self._mirror.clear()  # the position moves without rows
        while True:
            start = int(await conn.fetchval(
                "SELECT position FROM projection_position WHERE projection = $1", PROJECTION))
            if start >= skip.position:
                self._floor = max(self._floor, start)
                return start
            if await conn.fetchval(SKIP, PROJECTION, start, skip.position, skip.event_id, skip.sandbox_id,
                                   skip.type, skip.error, skip.skipped_at, NOTIFY_CHANNEL):
                self._floor = max(self._floor, skip.position)
                return skip.position

    @_read_once_more
    async def skipped(self, limit: int = 100) -> tuple[list[SkippedEvent], int]:
        async with self._conn() as conn:
            rows = await conn.fetch(SKIPPED, limit)
            total = int(await conn.fetchval("SELECT count(*) FROM projection_skipped"))
        return [SkippedEvent(**dict(r)) for r in rows], total

    async def _apply_in(self, conn: asyncpg.Connection, events: Sequence[Event]) -> int:
        """Fold ``events`` and write the result with the new position; returns the position.

        Two round trips: one statement reads the tracked position and the state the events
        touch, one statement writes the changed rows *and* moves the position, atomically
        (data-modifying CTEs), on the condition that the position is still the one read. One,
        when the state is what this object wrote last (``postgres_mirror``): then the condition
        is that the position is still that write's. If
        another projector moved it meanwhile, nothing is written and the batch is looked at
        again. Works alone (each statement is its own transaction) and inside ``rebuild``'s."""
        for e in events:
            assert e.position is not None, "only events read from the log can be applied"
        # The state these events may touch: their sandboxes, the executions they name, and the
        # open executions of their sandboxes (a sandbox-level event can end them).
        sandbox_ids = sorted({e.sandbox_id for e in events if not is_snapshot_event(e) and not is_tenancy_event(e)})
        tenancy = any(is_tenancy_event(e) for e in events)
        snapshot_ids = sorted({e.sandbox_id for e in events if is_snapshot_event(e)})
        exec_ids = sorted({x for e in events if (x := execution_id_of(e)) is not None})
        while True:
            held = self._mirror.position
            # The mirror vouches for the store only ahead of its last write: events at or
            # below it come again after the store lost batches (StoreBehind), and LOAD checks.
            state = None if held is None or (events[0].position or 0) <= held else self._mirror.state_for(events)
            rows: Sequence[asyncpg.Record] = ()
            if held is not None and state is not None:
                start, from_mirror = held, True  # WRITE's condition proves the store still is there
            else:
                # Taken before the read: every write that finished before now is in its snapshot.
                floor = self._floor
                with _refusals("the ids"), phases.span("store: LOAD"):  # a NUL in an id is refused as an argument
                    rows = await conn.fetch(LOAD, PROJECTION, exec_ids, sandbox_ids, snapshot_ids, tenancy)
                start = next(int(r["seq"]) for r in rows if r["kind"] == "p")
                if start < floor:
                    self._floor = start  # said once; the caller feeds the log again from start
                    self._mirror.clear()
                    raise StoreBehind(start, floor)
                state, from_mirror = _loaded(rows), False
            todo = [e for e in events if (e.position or 0) > start]
            if not todo:
                self._floor = max(self._floor, start)
                return start
            position = todo[-1].position or start
            t0 = phases.start()
            try:
                changed = _fold_batch(rows, todo, state)
                rows_json = (_json(changed.sandbox_rows()), _json(changed.execution_rows()),
                             _json(changed.snapshot_rows()), _json(changed.tenancy_rows()))
            except Exception as err:  # pure Python: it raised on what the events hold
                raise EventRefused(f"folding the events raised {type(err).__name__}: {err}") from err
            phases.end("store: fold and encode", t0)
            with _refusals("the rows"), phases.span("store: WRITE (and its commit)"):
                moved = await conn.fetchval(WRITE, PROJECTION, start, position, rows_json[0], rows_json[1],
                                            NOTIFY_CHANNEL, rows_json[2], rows_json[3], list(state.absent))
            if moved:
                self._floor = max(self._floor, position)
                if not from_mirror or state.absent:
                    self._mirror.loaded(start, state, state.absent if from_mirror else sandbox_ids)
                self._mirror.wrote(position, todo, changed.sandboxes.values(), changed.executions.values(),
                                   changed.seqs)
                counters.count("hutch_projector_writes_total", labels=(("state", "mirror" if from_mirror else "load"),))
                return position
            self._mirror.clear()  # another projector wrote: what it holds is no longer the store's
            log.debug("projection position moved under us (another projector); looking again")

    @_read_once_more
    async def log_identity(self) -> str | None:
        async with self._conn() as conn:
            return await conn.fetchval("SELECT log_identity FROM projection_position WHERE projection = $1", PROJECTION)

    async def bind_log(self, identity: str) -> str:
        async with self._conn() as conn:
            return await conn.fetchval(
                "UPDATE projection_position SET log_identity = COALESCE(log_identity, $2) WHERE projection = $1 "
                "RETURNING log_identity", PROJECTION, identity)

    async def reset(self) -> None:
        async with self._conn() as conn, conn.transaction():
            await conn.execute(_FLUSHED)
            await self._reset_in(conn)

    async def _reset_in(self, conn: asyncpg.Connection) -> None:
        self._floor = 0
        self._mirror.clear()
        await conn.execute("SELECT position FROM projection_position WHERE projection = $1 FOR UPDATE", PROJECTION)
        # DELETE, not TRUNCATE: readers keep seeing the old rows until the rebuild commits.
        await conn.execute("DELETE FROM executions")
        await conn.execute("DELETE FROM sandboxes")
        await conn.execute("DELETE FROM snapshots")
        await conn.execute("DELETE FROM tenancy")
        await conn.execute("DELETE FROM projection_skipped")
        await conn.execute("UPDATE projection_position SET position = 0, log_identity = NULL WHERE projection = $1",
                           PROJECTION)

    async def rebuild(self, batches: AsyncIterator[Sequence[Event]] | Iterable[Sequence[Event]],
                      log_identity: str | None = None) -> int:
        """Reset and replay in one transaction, bound to the log of ``log_identity``: readers see
        the old state until the new one is complete, and a projector running meanwhile waits on
        the position lock, then carries on from the rebuilt position. Returns that position."""
        position = 0
        try:
            async with self._conn() as conn, conn.transaction():
                await conn.execute(_FLUSHED)
                await self._reset_in(conn)
                if log_identity is not None:
                    await conn.execute("UPDATE projection_position SET log_identity = $2 WHERE projection = $1",
                                       PROJECTION, log_identity)
                if hasattr(batches, "__aiter__"):
                    async for batch in batches:
                        position = await self._apply_stepping(conn, batch)
                else:
                    for batch in batches:
                        position = await self._apply_stepping(conn, batch)
        finally:
            self._mirror.clear()  # written in a transaction that may not have committed
        return position

    # ---------------------------------------------------------------- reads
    # Each read is retried once: after a PostgreSQL restart the pool may hand out a
    # connection that died with the old server (asyncpg learns so on its first use), and a
    # read is safe to repeat on the fresh connection the pool opens instead.

    @_read_once_more
    async def get_sandbox(self, sandbox_id: str, *, unrecorded: bool = False) -> SandboxState | None:
        async with self._read() as conn:
            row = await conn.fetchrow("SELECT doc FROM sandboxes WHERE sandbox_id = $1", sandbox_id)
        found = _sandbox(row) if row else None
        return None if found is not None and found.unrecorded and not unrecorded else found

    @_read_once_more
    async def event_bytes(self, org_id: str) -> int:
        async with self._read() as conn:
            return int(await conn.fetchval(
                "SELECT coalesce(sum(log_bytes), 0) FROM sandboxes WHERE org_id = $1", org_id))

    @_read_once_more
    async def list_sandboxes(self, query: SandboxQuery) -> tuple[list[SandboxState], int]:
        where, args = where_clause(query)
        sort = _SORT.get(query.sort, _SORT["createdAt"])
        direction = "DESC" if query.direction == "desc" else "ASC"
        sql_where = (" WHERE " + " AND ".join(where)) if where else ""
        async with self._read() as conn:
            total = int(await conn.fetchval(f"SELECT count(*) FROM sandboxes{sql_where}", *args))
            rows = await conn.fetch(
                f"SELECT doc FROM sandboxes{sql_where} ORDER BY {sort} {direction}, sandbox_id {direction}"
                f" LIMIT ${len(args) + 1} OFFSET ${len(args) + 2}",
                *args, query.limit, query.offset,
            )
        return [_sandbox(r) for r in rows], total

    @_read_once_more
    async def get_execution(self, execution_id: str) -> ExecutionState | None:
        async with self._read() as conn:
            row = await conn.fetchrow("SELECT doc FROM executions WHERE execution_id = $1", execution_id)
        return _execution(row) if row else None

    @_read_once_more
    async def list_executions(self, sandbox_id: str, limit: int | None = None) -> list[ExecutionState]:
        async with self._read() as conn:
            rows = await conn.fetch(
                "SELECT doc FROM executions WHERE sandbox_id = $1 ORDER BY seq DESC LIMIT $2", sandbox_id, limit
            )
        return [_execution(r) for r in rows]

    @_read_once_more
    async def get_snapshot(self, snapshot_id: str) -> SnapshotState | None:
        async with self._read() as conn:
            row = await conn.fetchrow("SELECT doc FROM snapshots WHERE snapshot_id = $1", snapshot_id)
        return _snapshot(row) if row else None

    @_read_once_more
    async def list_snapshots(self, query: SnapshotQuery) -> tuple[list[SnapshotState], int]:
        args: list[Any] = [SnapshotStatus.DELETED.value]
        where = ["status <> $1"]
        if query.ready_only:
            args.append(SnapshotStatus.READY.value)
            where.append(f"status = ${len(args)}")
        if query.building_only:
            args.append(SnapshotStatus.BUILDING.value)
            where.append(f"status = ${len(args)}")
        for column, value in (("org_id", query.org_id), ("source_sandbox_id", query.source_sandbox_id), ("name", query.name),
                              ("tag", query.tag), ("public", query.public), ("content_hash", query.content_hash)):
            if value is not None:
                args.append(value)
                where.append(f"{column} = ${len(args)}")
        if not query.forks:  # from the document, as projects below
            where.append(f"NOT (doc->'metadata' ? '{FORK_OF}')")
        if query.projects:  # from the document: no column (and no migration) for a filter this rare
            args.append(list(query.projects))
            where.append(f"doc->>'projectId' = ANY(${len(args)}::text[])")
        sort = {"createdAt": "created_at", "name": "name", "size": "size_bytes", "files": "file_count"}[
            SNAPSHOT_SORTS.get(query.sort, "createdAt")]
        direction = "DESC" if query.direction == "desc" else "ASC"
        sql_where = " WHERE " + " AND ".join(where)
        async with self._read() as conn:
            total = int(await conn.fetchval(f"SELECT count(*) FROM snapshots{sql_where}", *args))
            rows = await conn.fetch(
                f"SELECT doc FROM snapshots{sql_where} ORDER BY {sort} {direction}, snapshot_id {direction}"
                f" LIMIT ${len(args) + 1} OFFSET ${len(args) + 2}",
                *args, query.limit, query.offset,
            )
        return [_snapshot(r) for r in rows], total

    @_read_once_more
    async def directory(self) -> Directory:
        async with self._read() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            position = int(await conn.fetchval(
                "SELECT position FROM projection_position WHERE projection = $1", PROJECTION))
            rows = await conn.fetch("SELECT kind AS sandbox_id, doc FROM tenancy")
        found = _directory(rows)
        found.position = position
        return found

    # ---------------------------------------------------------------- waiting

    async def wait_for(self, position: int, timeout: float) -> None:
        """Return once the store applied ``position`` (for a process whose projector runs elsewhere)."""
        self._pg.require()
        advanced = asyncio.Event()

        def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
            if int(payload) >= position:
                advanced.set()

        async with self._conn() as conn:
            await conn.add_listener(NOTIFY_CHANNEL, on_notify)
            try:
                if int(await conn.fetchval(
                    "SELECT position FROM projection_position WHERE projection = $1", PROJECTION
                )) >= position:
                    return
                await asyncio.wait_for(advanced.wait(), timeout)
            finally:
                await conn.remove_listener(NOTIFY_CHANNEL, on_notify)


@contextlib.contextmanager
def _refusals(what: str) -> Iterator[None]:
    """Turn PostgreSQL refusing what the events hold into ``EventRefused``; anything else (the
    store away or busy) passes as it is. asyncpg's own ``DataError`` (an argument it cannot
    encode, such as a lone surrogate) is an InterfaceError *and* a ValueError; the
    InterfaceErrors of a lost connection or a closed pool are no ValueErrors."""
    try:
        yield
    except (asyncpg.PostgresError, asyncpg.InterfaceError) as err:
        data = isinstance(err, ValueError) or (getattr(err, "sqlstate", None) or "")[:2] in _REFUSING
        if not data:
            raise
        raise EventRefused(f"PostgreSQL refused {what}: {type(err).__name__}: {err}") from err


def _savepoint(conn: asyncpg.Connection) -> contextlib.AbstractAsyncContextManager[Any]:
    """A savepoint inside a transaction (a refused statement then aborts only it); outside one
    each statement is its own transaction already."""
    return conn.transaction() if conn.is_in_transaction() else contextlib.nullcontext()


TenancyRecord = Record
_TENANCY_KINDS: dict[str, type] = {"org": OrganizationRecord, "project": ProjectRecord, "key": ApiKeyRecord, "sshkey": SshKeyRecord}


def _tenancy_key(record: TenancyRecord) -> tuple[str, str]:
    if isinstance(record, OrganizationRecord):
        return "org", record.org_id
    if isinstance(record, ProjectRecord):
        return "project", record.project_id
    if isinstance(record, SshKeyRecord):
        return "sshkey", record.ssh_key_id
    return "key", record.key_id


def _directory(rows: Iterable[asyncpg.Record]) -> Directory:
    """A directory from ``tenancy`` rows (their kind in the ``sandbox_id`` column of LOAD)."""
    found = Directory()
    for r in rows:
        found.put(converter.structure(json.loads(r["doc"]) if isinstance(r["doc"], str) else r["doc"],
                                      _TENANCY_KINDS[r["sandbox_id"]]))
    return found

@attrs.define
class _Changed:
    """The rows a batch of events changed, and their ``WRITE`` parameters."""

    sandboxes: dict[str, SandboxState] = attrs.field(factory=dict)
    executions: dict[str, ExecutionState] = attrs.field(factory=dict)
    seqs: dict[str, int] = attrs.field(factory=dict)  # each execution's order: its first event's position
    snapshots: dict[str, SnapshotState] = attrs.field(factory=dict)
    tenancy: dict[tuple[str, str], TenancyRecord] = attrs.field(factory=dict)

    def sandbox_rows(self) -> list[dict[str, Any]]:
        return [
            {"sandbox_id": x.sandbox_id, "status": x.status.value, "is_final": x.status.is_final,
             "name": x.spec.name, "mode": x.spec.mode.value, "project_id": x.spec.project_id,
             "org_id": x.spec.org_id, "log_bytes": x.log_bytes,
             "created_at": x.created_at, "updated_at": x.updated_at, "doc": converter.unstructure(x)}
            for x in self.sandboxes.values()
        ]

    def execution_rows(self) -> list[dict[str, Any]]:
        return [
            {"execution_id": x.execution_id, "sandbox_id": x.sandbox_id, "seq": self.seqs[x.execution_id],
             "status": x.status.value, "is_final": x.status.is_final, "doc": converter.unstructure(x)}
            for x in self.executions.values()
        ]

    def snapshot_rows(self) -> list[dict[str, Any]]:
        return [
            {"snapshot_id": x.snapshot_id, "status": x.status.value, "name": x.name, "tag": x.tag,
             "public": x.public, "source_sandbox_id": x.source_sandbox_id, "content_hash": x.content_hash,
             "size_bytes": x.size_bytes, "file_count": x.file_count, "org_id": x.org_id,
             "created_at": x.created_at, "doc": converter.unstructure(x)}
            for x in self.snapshots.values()
        ]

    def tenancy_rows(self) -> list[dict[str, Any]]:
        return [{"kind": kind, "id": id_, "org_id": x.org_id, "doc": converter.unstructure(x)}
                for (kind, id_), x in self.tenancy.items()]


def _loaded(rows: Sequence[asyncpg.Record]) -> Loaded:
    """The sandboxes and executions ``LOAD`` read (``rows``)."""
    exec_rows = sorted((r for r in rows if r["kind"] == "e"), key=lambda r: r["seq"])
    by_sandbox: dict[str, list[str]] = {}
    for r in exec_rows:
        by_sandbox.setdefault(r["sandbox_id"], []).append(r["id"])
    return Loaded(sandboxes={r["id"]: _sandbox(r) for r in rows if r["kind"] == "s"},
                  executions={r["id"]: _execution(r) for r in exec_rows},
                  seqs={r["id"]: int(r["seq"]) for r in exec_rows}, by_sandbox=by_sandbox)


def _fold_batch(rows: Sequence[asyncpg.Record], todo: Sequence[Event], state: Loaded) -> _Changed:
    """Fold ``todo`` into ``state`` (``LOAD``'s or the mirror's; left as it was) and the snapshots
    and tenancy records ``LOAD`` read (``rows``); what changed."""
    sandboxes, executions = dict(state.sandboxes), dict(state.executions)
    by_sandbox = {k: list(v) for k, v in state.by_sandbox.items()}
    seqs = dict(state.seqs)
    snapshots = {r["id"]: _snapshot(r) for r in rows if r["kind"] == "n"}
    directory = _directory(r for r in rows if r["kind"] == "t")
    changed = _Changed(seqs=seqs)
    for e in todo:
        if is_tenancy_event(e):
            for record in directory.apply(e.sandbox_id, e.created_at, e.data):
                changed.tenancy[_tenancy_key(record)] = record
            continue
        if is_snapshot_event(e):
            snap = evolve_snapshot(snapshots.get(e.sandbox_id), e)
            if snap is not None:
                snapshots[e.sandbox_id] = changed.snapshots[e.sandbox_id] = snap
            continue
        new_sb, new_execs = fold(sandboxes, executions, by_sandbox, e)
        if new_sb is not None:
            changed.sandboxes[new_sb.sandbox_id] = new_sb
        for ex in new_execs:
            changed.executions[ex.execution_id] = ex
            changed.seqs.setdefault(ex.execution_id, e.position or 0)
    return changed
