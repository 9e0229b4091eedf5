"""The production profile's blob store: PostgreSQL large objects, through asyncpg.

Why PostgreSQL: the production profile already runs it (no new service to run, secure
and back up), and a blob's row commits in the same database as the metadata that
refers to it. The README's scale-out section has the figures and the trade-off.

Layout: ``hutch_blobs(key, oid, size, sha256, created)`` (``storage/migrations/
006_blobs.sql``), one row per key naming one large object.

* ``put`` is one transaction: create a large object, write it in ``CHUNK`` pieces,
  then (under a per-key advisory lock, so concurrent puts of one key queue there) swap
  the row and unlink the object it replaced. An abort or a lost connection rolls back
  the object with the row: nothing half-written is ever visible, nothing leaks.
* ``get`` reads in a REPEATABLE READ READ ONLY transaction: the row and the object are
  the ones current when it started, even if a put or delete commits meanwhile.
* Large objects belong to the role that made them: every replica must connect as the
  same role (or be granted access), as it must for the projection tables anyway.

Each open ``get`` or ``put`` holds one pooled connection for as long as it streams, and a
put holds its transaction open: callers hand ``put`` a local stream (a spooled file),
never a slow remote producer.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncGenerator, AsyncIterable

import asyncpg

from hutch.core.blobs import (
    CHUNK,
    BlobInfo,
    BlobNotFound,
    BlobStore,
    BlobUnavailable,
    check_key,
    check_prefix,
)
from hutch.core.errors import InvalidInput
from hutch.storage.pg import Pool

_INV_WRITE = 0x20000
_INV_READ = 0x40000
_LOCK_CLASS = 0x626C6F62  # "blob": the first half of each per-key advisory lock
# Unlinks an object only if it is still there: a delete_prefix racing a put may have
# unlinked the object the put replaces, which must not fail the put.
_UNLINK = "SELECT lo_unlink(m.oid) FROM pg_largeobject_metadata m WHERE m.oid = ANY($1::oid[])"


class PostgresBlobStore(BlobStore):
    def __init__(self, dsn: str, *, min_size: int = 1, max_size: int = 10) -> None:
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise InvalidInput(f"blob store: {dsn!r} is not a postgresql:// URL", field="store")
        self.dsn = dsn
        self._pg = Pool(dsn, what="blob store", unavailable=BlobUnavailable, min_size=min_size, max_size=max_size)

    async def start(self) -> None:
        await self._pg.start()  # the one numbered schema, shared with the projection store

    async def close(self) -> None:
        await self._pg.close()

    def _conn(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        return self._pg.conn()

    async def put(self, key: str, chunks: AsyncIterable[bytes]) -> BlobInfo:
        check_key(key)
        digest, size = hashlib.sha256(), 0
        async with self._conn() as conn, conn.transaction():
            oid = await conn.fetchval("SELECT lo_create(0)")
            fd = await conn.fetchval("SELECT lo_open($1, $2)", oid, _INV_WRITE)
            pending = bytearray()
            async for chunk in chunks:
                digest.update(chunk)
                size += len(chunk)
                pending += chunk
                while len(pending) >= CHUNK:
                    await conn.execute("SELECT lowrite($1, $2)", fd, bytes(pending[:CHUNK]))
                    del pending[:CHUNK]
            if pending:
                await conn.execute("SELECT lowrite($1, $2)", fd, bytes(pending))
            await conn.execute("SELECT lo_close($1)", fd)
            await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _LOCK_CLASS, key)
            old = await conn.fetchval("SELECT oid FROM hutch_blobs WHERE key = $1", key)
            created = await conn.fetchval(
                "INSERT INTO hutch_blobs (key, oid, size, sha256) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (key) DO UPDATE SET oid = EXCLUDED.oid, size = EXCLUDED.size,"
                " sha256 = EXCLUDED.sha256, created = now() RETURNING created",
                key, oid, size, digest.hexdigest())
            if old is not None:
                await conn.execute(_UNLINK, [old])
        return BlobInfo(key=key, size=size, sha256=digest.hexdigest(), created=created.timestamp())

    async def get(self, key: str) -> AsyncGenerator[bytes, None]:
        check_key(key)
        async with self._conn() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            oid = await conn.fetchval("SELECT oid FROM hutch_blobs WHERE key = $1", key)
            if oid is None:
                raise BlobNotFound(f"blob {key!r} not found", key=key)
            fd = await conn.fetchval("SELECT lo_open($1, $2)", oid, _INV_READ)
            while block := await conn.fetchval("SELECT loread($1, $2)", fd, CHUNK):
                yield block

    async def stat(self, key: str) -> BlobInfo:
        check_key(key)
        async with self._conn() as conn:
            row = await conn.fetchrow("SELECT size, sha256, created FROM hutch_blobs WHERE key = $1", key)
        if row is None:
            raise BlobNotFound(f"blob {key!r} not found", key=key)
        return BlobInfo(key=key, size=row["size"], sha256=row["sha256"], created=row["created"].timestamp())

    async def exists(self, key: str) -> bool:
        check_key(key)
        async with self._conn() as conn:
            return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM hutch_blobs WHERE key = $1)", key))

    async def delete(self, key: str) -> bool:
        check_key(key)
        async with self._conn() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", _LOCK_CLASS, key)
            oid = await conn.fetchval("DELETE FROM hutch_blobs WHERE key = $1 RETURNING oid", key)
            if oid is not None:
                await conn.execute(_UNLINK, [oid])
        return oid is not None

    async def delete_prefix(self, prefix: str) -> int:
        check_prefix(prefix)
        async with self._conn() as conn, conn.transaction():
            oids = [r["oid"] for r in await conn.fetch(
                "DELETE FROM hutch_blobs WHERE left(key, char_length($1)) = $1 RETURNING oid", prefix)]
            if oids:
                await conn.execute(_UNLINK, oids)
        return len(oids)
