"""The projection store's commits do not wait for the WAL flush (the Kafka log is the record),
so a PostgreSQL crash can lose its last applied batches. What the server answered before
must still show: a read after the store's sessions were lost waits until the projector has
checked the store against the log's end and applied the lost batches again (or answers 503
naming why), and never shows the sandbox missing or its command still running.

The crash is made deterministically, on the real server process, Kafka and PostgreSQL: the
rows and the position the last batches wrote are taken back, as a crash that lost their
commits leaves them, and every session of the server is ended, as the crash ends them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.system.server import Server

pytestmark = pytest.mark.slow


def _sql(database: str, work: Callable[[asyncpg.Connection], Any]) -> Any:
    async def run() -> Any:
        conn = await asyncpg.connect(database)
        try:
            return await work(conn)
        finally:
            await conn.close()

    return asyncio.run(run())


async def _position(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT position FROM projection_position WHERE projection = 'state'"))


def _lose_commits_after(database: str, position: int, sandbox_id: str) -> None:
    """The store as a crash leaves it when it lost every batch after ``position`` (they all
    wrote ``sandbox_id``'s rows only), and the server's sessions ended by that crash."""
    async def crash(conn: asyncpg.Connection) -> None:
        async with conn.transaction():
            assert await _position(conn) > position
            await conn.execute("DELETE FROM executions WHERE sandbox_id = $1", sandbox_id)
            await conn.execute("DELETE FROM sandboxes WHERE sandbox_id = $1", sandbox_id)
            await conn.execute("UPDATE projection_position SET position = $1 WHERE projection = 'state'", position)
        pids = [r["pid"] for r in await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND usename = current_user"
            " AND pid <> pg_backend_pid()")]
        assert pids, "the server held no session to end"
        # The timeout: returns once they are gone (without it, pg_terminate_backend only signals).
        await conn.execute("SELECT pg_terminate_backend(pid, 5000) FROM unnest($1::int[]) AS pid", pids)

    _sql(database, crash)


def _get(server: Server, path: str) -> Any:
    """A read through the API: 200, or a 503 that names the check (then asked again)."""
    deadline = time.monotonic() + 30
    while True:
        status, payload = server.call("GET", path)
        if status == 200:
            return payload["data"]
        assert status == 503 and "event log" in json.dumps(payload), (status, payload)
        assert time.monotonic() < deadline, payload
        time.sleep(0.2)


def test_reads_after_lost_projection_commits_show_what_was_answered(
    tmp_path: Path, shared: Callable[[], dict[str, str]], database: str
) -> None:
    a = Server(tmp_path / "a", **shared()).start()
    try:
        a.data("POST", "/sandbox", {"name": "kept"})
        before = _sql(database, _position)
        sid = a.data("POST", "/sandbox", {"name": "lost", "env": {"N": "1"}})["sandboxId"]
        ex = a.data("POST", f"/sandbox/{sid}/execute", {"command": ["echo", "hi"]})["executionId"]
        assert a.data("GET", f"/sandbox/execution/{ex}?wait=30s")["status"] == "completed"

        _lose_commits_after(database, before, sid)

        got = _get(a, f"/sandbox/{sid}")
        assert got["status"] == "idle" and got["name"] == "lost", got
        assert _get(a, f"/sandbox/execution/{ex}")["status"] == "completed"
        assert sid in {s["sandboxId"] for s in _get(a, "/sandbox?limit=100")["sandboxes"]}

        # The store itself holds it again, for every other replica to read.
        doc = _sql(database, lambda c: c.fetchval("SELECT doc FROM sandboxes WHERE sandbox_id = $1", sid))
        assert doc is not None and json.loads(doc)["spec"]["env"] == {"N": "1"}
        assert _sql(database, _position) > before
        # And it goes on: the next write is answered and shows.
        a.call("PATCH", f"/sandbox/env/{sid}", {"env": {"M": "x"}})
        assert _get(a, f"/sandbox/{sid}")["status"] == "idle"
    finally:
        a.destroy_every_sandbox()
        a.stop()
