"""The one numbered PostgreSQL schema every PostgreSQL adapter shares (projection store, blob
store, output streams, replicas, audit sink): SQL files in ``storage/migrations/``, applied
in order at start under an advisory lock and recorded in ``schema_migrations``.

One schema rather than one per adapter: they share a database and its rows refer to each
other (a snapshot row names its archive's blob), so whichever adapter starts first brings
the whole schema up to date and the others find it done.
"""

from __future__ import annotations

from importlib import resources

import asyncpg

_MIGRATION_LOCK = 0x68757463  # "hutc": one advisory-lock key for every hutch migration run


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration shipped with hutch, oldest first."""
    found = []
    for entry in resources.files("hutch.storage.migrations").iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:3].isdigit():
            found.append((int(name[:3]), name, entry.read_text()))
    return sorted(found)


async def migrate(conn: asyncpg.Connection) -> list[str]:
    """Apply the migrations this database lacks; returns their names."""
    applied: list[str] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, name, sql in migrations():
            if version in done:
                continue
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, name)
            applied.append(name)
    return applied
