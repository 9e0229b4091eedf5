"""Where the embedded projection store keeps deleted sandboxes: a private SQLite file, not RAM.

A deleted sandbox stays readable (``GET`` by id, ``list`` with ``includeDeleted``, its
executions, its history) but no longer changes, so the memory store moves it and its
executions here and forgets them. Without that the embedded server's memory grows with every
sandbox ever made (~2.6 KiB each: the soak test went 54 → 75 MiB over 8,132 sandboxes).

The file is SQLite's anonymous temporary database (``sqlite3.connect("")``): on disk, private
to this process, deleted when it closes; its page cache is bounded. It needs no place of its
own because the memory store is rebuilt from the log at every start anyway. Rows are pickled
model objects: they never leave this process, so no wire format is involved.
"""

from __future__ import annotations

import pickle
import sqlite3
from collections.abc import Iterator
from typing import TypeVar

from hutch.core.models import ExecutionState, SandboxState

T = TypeVar("T")
BATCH = 500  # rows decoded at a time when a listing scans the archive


class EndedArchive:
    def __init__(self) -> None:
        self._db = sqlite3.connect("", isolation_level=None, check_same_thread=False)  # one loop uses it
        self._db.executescript(
            """
            PRAGMA cache_size = -256;  -- KiB: rows are written once and seldom read again
            CREATE TABLE sandboxes (id TEXT PRIMARY KEY, org_id TEXT, log_bytes INTEGER NOT NULL,
                                    row BLOB NOT NULL);
            CREATE INDEX sandboxes_org ON sandboxes (org_id);
            CREATE TABLE executions (id TEXT PRIMARY KEY, sandbox_id TEXT NOT NULL,
                                     seq INTEGER NOT NULL, row BLOB NOT NULL);
            CREATE INDEX executions_sandbox ON executions (sandbox_id, seq);
            """
        )
        self.count = 0  # sandboxes archived

    def close(self) -> None:
        self._db.close()

    def put(self, sandbox: SandboxState, executions: list[ExecutionState]) -> None:
        """Archive a sandbox and its executions (in the order they were made), replacing any
        earlier copy: a late event can change a deleted sandbox (see MemoryProjectionStore)."""
        with self._db:  # one transaction: the sandbox and its executions together or not at all
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM executions WHERE sandbox_id = ?", (sandbox.sandbox_id,))
            replaced = self._db.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox.sandbox_id,)).rowcount
            self._db.execute("INSERT INTO sandboxes VALUES (?, ?, ?, ?)",
                             (sandbox.sandbox_id, sandbox.spec.org_id, sandbox.log_bytes, pickle.dumps(sandbox)))
            self._db.executemany(
                "INSERT INTO executions VALUES (?, ?, ?, ?)",
                [(ex.execution_id, sandbox.sandbox_id, seq, pickle.dumps(ex)) for seq, ex in enumerate(executions)],
            )
        self.count += 1 - replaced

    def take(self, sandbox_id: str) -> tuple[SandboxState, list[ExecutionState]] | None:
        """Remove and return an archived sandbox with its executions (oldest first)."""
        found = self.sandbox(sandbox_id)
        if found is None:
            return None
        executions = self.executions(sandbox_id)[::-1]
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM executions WHERE sandbox_id = ?", (sandbox_id,))
            self._db.execute("DELETE FROM sandboxes WHERE id = ?", (sandbox_id,))
        self.count -= 1
        return found, executions

    def log_bytes(self, org_id: str) -> int:
        """What the archived sandboxes of an organization took in the event log."""
        row = self._db.execute("SELECT coalesce(sum(log_bytes), 0) FROM sandboxes WHERE org_id = ?", (org_id,)).fetchone()
        return int(row[0])

    def sandbox(self, sandbox_id: str) -> SandboxState | None:
        row = self._db.execute("SELECT row FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
        return None if row is None else _load(row[0], SandboxState)

    def execution(self, execution_id: str) -> ExecutionState | None:
        row = self._db.execute("SELECT row FROM executions WHERE id = ?", (execution_id,)).fetchone()
        return None if row is None else _load(row[0], ExecutionState)

    def executions(self, sandbox_id: str, limit: int | None = None) -> list[ExecutionState]:
        """Newest first, as the store lists them."""
        rows = self._db.execute(
            "SELECT row FROM executions WHERE sandbox_id = ? ORDER BY seq DESC LIMIT ?",
            (sandbox_id, -1 if limit is None else limit),
        )
        return [_load(r[0], ExecutionState) for r in rows]

    def sandboxes(self, org_id: str | None) -> Iterator[SandboxState]:
        """Every archived sandbox (of one organization, or all), decoded a batch at a time."""
        cursor = (self._db.execute("SELECT row FROM sandboxes") if org_id is None
                  else self._db.execute("SELECT row FROM sandboxes WHERE org_id = ?", (org_id,)))
        while batch := cursor.fetchmany(BATCH):
            for (row,) in batch:
                yield _load(row, SandboxState)


def _load(row: bytes, kind: type[T]) -> T:
    value = pickle.loads(row)  # our own rows, written by put() in this process
    assert isinstance(value, kind), f"archive row is a {type(value).__name__}, not a {kind.__name__}"
    return value
