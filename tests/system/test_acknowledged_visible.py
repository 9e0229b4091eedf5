"""An answer means the event is durable and visible: on the production profile, what one API
server acknowledged is in PostgreSQL the moment the answer arrives, for every other replica to
read, while each server's projector folds batches from its own last write where it can
(projections/postgres_mirror.py) and both write to the one store.

Servers A and B (fake driver: the log path is what is tested) share one Kafka topic and one
database. In turns, each creates a sandbox, changes its env, runs a command and a one-shot;
after every answer the test reads the store itself (what B, or any replica, reads) with no
wait, and B's API for A's sandboxes.
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


def _rows(database: str, sandbox_id: str) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The sandbox's row (its doc) and its executions' statuses, as the store holds them now."""
    async def read() -> tuple[dict[str, Any] | None, dict[str, str]]:
        conn = await asyncpg.connect(database)
        try:
            doc = await conn.fetchval("SELECT doc FROM sandboxes WHERE sandbox_id = $1", sandbox_id)
            execs = await conn.fetch("SELECT execution_id, status FROM executions WHERE sandbox_id = $1", sandbox_id)
        finally:
            await conn.close()
        return (json.loads(doc) if doc else None), {r["execution_id"]: r["status"] for r in execs}

    return asyncio.run(read())


def _until_final(server: Server, sandbox_id: str) -> str:
    deadline = time.monotonic() + 30
    while True:
        status = server.data("GET", f"/sandbox/{sandbox_id}")["status"]
        if status in ("terminated", "deleted", "failed"):
            return str(status)
        assert time.monotonic() < deadline, f"{sandbox_id} still {status}"
        time.sleep(0.01)


def test_what_one_replica_acknowledged_is_in_the_store_at_once(
    tmp_path: Path, shared: Callable[[], dict[str, str]], database: str
) -> None:
    a = Server(tmp_path / "a", **shared()).start()
    b = Server(tmp_path / "b", **shared()).start()
    try:
        for i in range(6):
            writer, other = (a, b) if i % 2 == 0 else (b, a)
            sid = writer.data("POST", "/sandbox", {"name": f"s{i}", "env": {"N": str(i)}})["sandboxId"]
            doc, _ = _rows(database, sid)
            assert doc is not None and doc["status"] == "idle", doc

            writer.call("PATCH", f"/sandbox/env/{sid}", {"env": {"M": "x"}})
            doc, _ = _rows(database, sid)
            assert doc is not None and doc["spec"]["env"] == {"N": str(i), "M": "x"}, doc
            assert other.data("GET", f"/sandbox/{sid}")["status"] == "idle"

            ex = writer.data("POST", f"/sandbox/{sid}/execute", {"command": ["echo", "hi"]})
            done = writer.data("GET", f"/sandbox/execution/{ex['executionId']}?wait=30s")
            assert done["status"] == "completed", done
            _, execs = _rows(database, sid)
            assert execs == {ex["executionId"]: "completed"}
            assert other.data("GET", f"/sandbox/execution/{ex['executionId']}")["status"] == "completed"

            one = writer.data("POST", "/sandbox", {"command": {"exec": ["echo", "x"], "mode": "oneshot"}})
            done = writer.data("GET", f"/sandbox/execution/{one['executionId']}?wait=30s")
            assert done["status"] == "completed", done
            _, execs = _rows(database, one["sandboxId"])
            assert execs == {one["executionId"]: "completed"}
            assert _until_final(writer, one["sandboxId"]) == "terminated"
            doc, _ = _rows(database, one["sandboxId"])
            assert doc is not None and doc["status"] == "terminated", doc
            assert other.data("GET", f"/sandbox/{one['sandboxId']}")["status"] == "terminated"

            writer.call("DELETE", f"/sandbox/{sid}")
            doc, _ = _rows(database, sid)
            assert doc is not None and doc["status"] == "deleted", doc
    finally:
        for s in (a, b):
            s.destroy_every_sandbox()
            s.stop()
