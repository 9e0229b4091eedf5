"""Replica leases and sandbox owners in PostgreSQL (``core.replicas``; migration 009).

Every time is the database's ``now()``, so replicas on hosts whose clocks disagree still
agree on who is dead. A take-over is one statement: the dead replica's row is marked
claimed only if it is still unclaimed (two survivors racing: the row lock makes the second
find it claimed and move nothing), and its sandboxes change owner in the same statement.

Owner rows are written in batches: the owns and disowns asked for while one statement is on
its way go together in the next (one ``WITH ... DELETE``/``INSERT``), and a lazy disown (a
sandbox that ended: nobody waits) waits up to ``DISOWN_LINGER_SECONDS`` for company, so
on a busy replica it rides on the next create's own (2 statements per one-shot before).
Each caller is answered once its statement committed, or gets its error.

``serialised`` is a session advisory lock on its own connection (a pool of its own, so
creates waiting on it never starve the lease renewals): a replica that dies holding it
loses its session, and the lock with it; an unlock that fails ends the session too. Waiting
for a connection and for the lock are each bounded (``SERIALISED_WAIT_SECONDS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator

import asyncpg

from hutch.core.errors import ReplicaUnavailable
from hutch.core.replicas import (
    CURRENT_MARGIN,
    LEASE_SECONDS,
    Claimed,
    Handle,
    Owner,
    Replicas,
    Tenant,
)
from hutch.storage.pg import UNAVAILABLE, Pool

log = logging.getLogger(__name__)

SERIALISED_WAIT_SECONDS = 30  # waiting for a connection, then for the lock
DISOWN_LINGER_SECONDS = 0.5  # the longest a lazy disown waits for a statement to go with

# Who had claimed the row (NULL: nobody), read under its lock in the register's transaction: a
# survivor's claim either committed before (this run learns it was taken over) or comes after and
# finds the lease live. Not one statement: its snapshot could miss a claim committed meanwhile.
_CLAIMED_BY = "SELECT claimed_by FROM hutch_replicas WHERE replica_id = $1 FOR UPDATE"
_REGISTER = """
INSERT INTO hutch_replicas (replica_id, url, expires_at, claimed_by)
VALUES ($1, $2, now() + make_interval(secs => $3), NULL)
ON CONFLICT (replica_id) DO UPDATE
SET url = EXCLUDED.url, expires_at = EXCLUDED.expires_at, claimed_by = NULL"""
_RENEW = """
UPDATE hutch_replicas SET expires_at = now() + make_interval(secs => $2)
WHERE replica_id = $1 AND claimed_by IS NULL"""
_CLAIM = """
WITH dead AS (
    UPDATE hutch_replicas SET claimed_by = $1
    WHERE replica_id <> $1 AND claimed_by IS NULL AND expires_at < now()
    RETURNING replica_id
), moved AS (
    UPDATE hutch_sandbox_owners o SET replica_id = $1 FROM dead
    WHERE o.replica_id = dead.replica_id
    RETURNING dead.replica_id AS dead, o.sandbox_id, o.handle, o.org_id, o.project_id
)
SELECT d.replica_id AS dead, m.sandbox_id, m.handle, m.org_id, m.project_id
FROM dead d LEFT JOIN moved m ON m.dead = d.replica_id"""
# Owned ($2, whose: $4 and $5, in step) and disowned ($3) ids, disjoint: both as one statement
# (either may be empty). Owned again without a tenant: the one it had stays.
_OWNERS = """
WITH gone AS (DELETE FROM hutch_sandbox_owners WHERE replica_id = $1 AND sandbox_id = ANY($3::text[]))
INSERT INTO hutch_sandbox_owners (sandbox_id, replica_id, org_id, project_id)
SELECT t.sandbox_id, $1, t.org_id, t.project_id
  FROM unnest($2::text[], $4::text[], $5::text[]) AS t(sandbox_id, org_id, project_id)
ON CONFLICT (sandbox_id) DO UPDATE SET replica_id = EXCLUDED.replica_id,
   org_id = coalesce(EXCLUDED.org_id, hutch_sandbox_owners.org_id),
   project_id = CASE WHEN EXCLUDED.org_id IS NULL THEN hutch_sandbox_owners.project_id ELSE EXCLUDED.project_id END"""
_OWNER = """
SELECT o.replica_id, coalesce(r.url, '') AS url,
       coalesce(r.expires_at > now() AND r.claimed_by IS NULL, false) AS alive
FROM hutch_sandbox_owners o LEFT JOIN hutch_replicas r USING (replica_id)
WHERE o.sandbox_id = $1"""


def _clock() -> float:
    """Seconds that run on through a stopped process and a suspended host alike (monotonic
    stops during a suspend: a host woken after its lease ran out would still trust it)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


class PostgresReplicas(Replicas):
    def __init__(self, dsn: str, *, me: str, url: str, lease_seconds: float = LEASE_SECONDS) -> None:
        self.me, self.url = me, url
        self.lease_seconds = lease_seconds
        # Stateless: plain statements only (the session locks have ``_locks``): no reset on release.
        self._pg = Pool(dsn, what="replica registry", unavailable=ReplicaUnavailable, min_size=1, max_size=4,
                        stateless=True)
        self._mine: set[str] = set()  # owned here: no query (a replica claimed away exits)
        self._held_until = 0.0  # on _clock(): the lease is surely ours until then (``current``)
        self._locks = Pool(dsn, what="replica locks", unavailable=ReplicaUnavailable, min_size=0, max_size=8)
        # Owner rows waiting for the next statement: id -> (owned, its callers' futures), in order.
        self._owners: dict[str, tuple[bool, list[asyncio.Future[None]]]] = {}
        self._tenants: dict[str, Tenant] = {}  # whose each owned one waiting there is

        self._writing: asyncio.Task[None] | None = None
        self._linger: asyncio.TimerHandle | None = None

    @property
    def shared(self) -> bool:
        return True

    async def start(self) -> None:
        await self._pg.start()
        await self._locks.start()
        began = _clock()
        async with self._pg.conn() as conn, conn.transaction():
            self.taken_over = await conn.fetchval(_CLAIMED_BY, self.me) is not None
            await conn.execute(_REGISTER, self.me, self.url, self.lease_seconds)
            rows = await conn.fetch("SELECT sandbox_id FROM hutch_sandbox_owners WHERE replica_id = $1", self.me)
        self._mine = {r["sandbox_id"] for r in rows}
        self._hold_from(began)

    async def close(self) -> None:
        """Stopped on purpose: the lease ends now, so a survivor takes the sandboxes over at once."""
        self._write_owners()  # lazy disowns too: written before the lease ends
        if (writing := self._writing) is not None:
            with contextlib.suppress(Exception):
                await writing
        if self._pg.started:
            try:
                async with self._pg.conn() as conn:
                    await conn.execute("UPDATE hutch_replicas SET expires_at = now() WHERE replica_id = $1 "
                                       "AND claimed_by IS NULL", self.me)
            except Exception:  # whatever the database says: the lease expires on its own
                pass
        await self._pg.close()
        await self._locks.close()

    async def live_count(self) -> int:
        async with self._pg.conn() as conn:
            found = await conn.fetchval("SELECT count(*) FROM hutch_replicas "
                                        "WHERE expires_at > now() AND claimed_by IS NULL")
        return max(1, int(found or 0))

    @contextlib.asynccontextmanager
    async def serialised(self, key: str) -> AsyncIterator[None]:
        # The connection is taken by hand: an error of the caller's inside must stay the
        # caller's, not read as these locks' database being unavailable.
        wait = SERIALISED_WAIT_SECONDS
        pool = self._locks.require()
        try:
            conn = await pool.acquire(timeout=wait)
        except TimeoutError as err:
            raise ReplicaUnavailable(f"{key}: no connection for the replicas' locks within {wait} s; "
                                     "try again") from err
        except UNAVAILABLE as err:
            raise ReplicaUnavailable(f"PostgreSQL replica locks: {err}") from err
        try:
            try:
                await conn.execute(f"SET lock_timeout = '{wait}s'")  # asyncpg resets it on release
                await conn.execute("SELECT pg_advisory_lock(hashtextextended($1, 0))", key)
            except asyncpg.LockNotAvailableError as err:
                raise ReplicaUnavailable(f"{key}: another replica held it for {wait} s; try again") from err
            except UNAVAILABLE as err:
                raise ReplicaUnavailable(f"PostgreSQL replica locks: {err}") from err
            try:
                yield
            finally:
                try:
                    await conn.execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))", key)
                except Exception as err:  # the session is gone or going: so is its lock
                    log.warning("replica lock %s: unlock failed (%s); ending its session", key, err)
                    conn.terminate()
        finally:
            await pool.release(conn)

    async def own(self, sandbox_id: str, tenant: Tenant | None = None) -> None:
        if tenant is not None:
            self._tenants[sandbox_id] = tenant
        await self._owner_row(sandbox_id, owned=True, now=True)
        self._mine.add(sandbox_id)

    async def _owner_row(self, sandbox_id: str, *, owned: bool, now: bool) -> None:
        """Own or disown ``sandbox_id`` with the next owners statement; returns once it committed.
        A later ask about the same id replaces an earlier one not sent yet (both are answered)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        _, waiting = self._owners.pop(sandbox_id, (owned, []))
        self._owners[sandbox_id] = (owned, [*waiting, fut])
        if now:
            self._write_owners()
        elif self._linger is None and self._writing is None:
            self._linger = asyncio.get_running_loop().call_later(DISOWN_LINGER_SECONDS, self._write_owners)
        await fut

    def _write_owners(self) -> None:
        """Start the writer unless it runs (it takes what is pending when its statement goes)."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self._writing is None and self._owners:
            self._writing = asyncio.get_running_loop().create_task(self._owners_writer(), name="replica-owners")

    async def _owners_writer(self) -> None:
        try:
            while self._owners:
                await asyncio.sleep(0)  # the owns asked for with this one go too
                batch, self._owners = self._owners, {}
                tenants, self._tenants = self._tenants, {}
                owned = [i for i, (own, _) in batch.items() if own]
                gone = [i for i, (own, _) in batch.items() if not own]
                whose = [tenants.get(i) for i in owned]
                orgs = [t.org_id if t is not None else None for t in whose]
                projects = [t.project_id if t is not None else None for t in whose]
                try:
                    async with self._pg.conn() as conn:
                        await conn.execute(_OWNERS, self.me, owned, gone, orgs, projects)
                except Exception as err:
                    for _, futs in batch.values():
                        for fut in futs:
                            if not fut.done():
                                fut.set_exception(err)
                    continue
                for _, futs in batch.values():
                    for fut in futs:
                        if not fut.done():
                            fut.set_result(None)
        finally:
            self._writing = None

    async def set_handle(self, sandbox_id: str, handle: Handle) -> None:
        async with self._pg.conn() as conn:
            await conn.execute("UPDATE hutch_sandbox_owners SET handle = $2::jsonb WHERE sandbox_id = $1",
                               sandbox_id, json.dumps(handle))

    async def foreign_handles(self) -> list[Handle]:
        async with self._pg.conn() as conn:
            rows = await conn.fetch("SELECT handle FROM hutch_sandbox_owners "
                                    "WHERE replica_id <> $1 AND handle IS NOT NULL", self.me)
        return [json.loads(r["handle"]) for r in rows]

    async def owner(self, sandbox_id: str) -> Owner | None:
        if self.owns(sandbox_id):
            return Owner(self.me, self.url, True)
        async with self._pg.conn() as conn:
            row = await conn.fetchrow(_OWNER, sandbox_id)
        return None if row is None else Owner(row["replica_id"], row["url"], bool(row["alive"]))

    async def address(self, replica_id: str) -> Owner | None:
        async with self._pg.conn() as conn:
            row = await conn.fetchrow("SELECT url, expires_at > now() AND claimed_by IS NULL AS alive "
                                      "FROM hutch_replicas WHERE replica_id = $1", replica_id)
        return None if row is None else Owner(replica_id, row["url"], bool(row["alive"]))

    async def disown(self, sandbox_id: str, *, lazily: bool = False) -> None:
        self._mine.discard(sandbox_id)
        await self._owner_row(sandbox_id, owned=False, now=not lazily)

    def owns(self, sandbox_id: str) -> bool:
        # Remembered only while the lease is current: after a stall the store decides.
        return sandbox_id in self._mine and self.current()

    def remembers(self, sandbox_id: str) -> bool:
        return sandbox_id in self._mine

    async def renew(self) -> bool:
        began = _clock()
        async with self._pg.conn() as conn:
            status = await conn.execute(_RENEW, self.me, self.lease_seconds)
        if not status.endswith(" 1"):
            self._held_until = 0.0
            self.claimed = True
            return False
        self._hold_from(began)
        return True

    def _hold_from(self, began: float) -> None:
        # The database set the expiry at its now() + lease, which came after ``began``.
        self._held_until = began + self.lease_seconds * (1 - CURRENT_MARGIN)

    def current(self) -> bool:
        return _clock() < self._held_until

    async def claim_dead(self) -> list[Claimed]:
        async with self._pg.conn() as conn:
            rows = await conn.fetch(_CLAIM, self.me)
        by_dead: dict[str, list[tuple[str, Handle | None]]] = {}
        tenants: dict[str, list[tuple[str, Tenant]]] = {}
        for row in rows:
            found = by_dead.setdefault(row["dead"], [])
            if row["sandbox_id"] is not None:
                found.append((row["sandbox_id"], json.loads(row["handle"]) if row["handle"] else None))
                self._mine.add(row["sandbox_id"])
                if row["org_id"] is not None:
                    tenants.setdefault(row["dead"], []).append(
                        (row["sandbox_id"], Tenant(row["org_id"], row["project_id"])))
        return [Claimed(dead, tuple(sandboxes), tuple(tenants.get(dead, ())))
                for dead, sandboxes in sorted(by_dead.items())]
