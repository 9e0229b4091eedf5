"""Audit subscribers: an append-only trail of who did what to which sandbox, and when.

``audit_record(event)`` is the pure part: one record per event, naming the acting API key
id (``actor``; see ``core.events.ACTOR``), never a secret (environment values are reduced
to their names). ``Auditor`` keeps a trail in PostgreSQL (table ``audit_trail``,
append-only by trigger) and/or a JSONL file:

* On a log that declares consumer groups (``EventLog.capabilities``: Kafka) it is a member
  of one (``--group``, default ``hutch-audit``) on the keyed events topic, so members
  share the partitions; a new group starts from the beginning of the log. Each sink remembers the (partition, offset) of every record it wrote and
  the auditor resumes after the larger of that and the group's committed offset, so a
  crash between writing and committing neither loses nor duplicates a record.
* On any other log (the embedded SQLite one) it subscribes to the whole log and resumes
  after the last position its sink holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from hutch.core.eventlog.base import EventLog
from hutch.core.events import Event, encode

log = logging.getLogger(__name__)

DEFAULT_GROUP = "hutch-audit"
LOG_SOURCE = "log"  # the source name of records read from a non-Kafka log (partition 0, offset = position)


def audit_record(event: Event) -> dict[str, Any]:
    """The audit view of one event: who (actor), what (type + detail), which sandbox, when."""
    detail = encode(event)["data"]
    spec = detail.pop("spec", None)
    if isinstance(spec, dict):
        detail.update({k: spec[k] for k in ("runtime", "name", "mode", "projectId", "command") if k in spec})
        if spec.get("network", {}).get("enabled"):
            detail["network"] = True
        if spec.get("env"):
            detail["envNames"] = sorted(spec["env"])  # names only: values are secrets
    detail.pop("secretHash", None)  # a created key's: not a secret, but nobody's business
    if isinstance(detail.get("set"), dict):  # env changes
        detail["set"] = sorted(detail["set"])
    return {
        "position": event.position,
        "eventId": event.event_id,
        "at": event.created_at,
        "sandboxId": event.sandbox_id,
        "type": event.type,
        "actor": event.actor,  # the API key id that acted (keyId, for those who look for it by that name)
        "keyId": event.actor,
        "orgId": event.org_id,
        "projectId": event.project,
        "detail": detail,
    }


class Sink(Protocol):
    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def resume_points(self, source: str) -> dict[int, int]:
        """partition -> the next offset to read, from what this sink already holds."""
    async def write(self, source: str, rows: Sequence[tuple[int, int, dict[str, Any]]]) -> None:
        """Durably append (partition, offset, record) rows; rows already held are skipped."""


class JsonlSink:
    """One JSON object per line: the record plus ``source``/``partition``/``offset``.
    Each write is fsynced before the auditor moves on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._next: dict[tuple[str, int], int] = {}
        self._fh: Any = None

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            with self.path.open("rb") as fh:
                for line in fh:
                    try:
                        row = json.loads(line)
                    except ValueError:
                        continue  # a torn last line after a crash: rewritten below
                    key = (row["source"], int(row["partition"]))
                    self._next[key] = max(self._next.get(key, 0), int(row["offset"]) + 1)
            self._truncate_torn_tail()
        self._fh = self.path.open("ab")

    def _truncate_torn_tail(self) -> None:
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as fh:
                fh.truncate(data.rfind(b"\n") + 1)

    async def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    async def resume_points(self, source: str) -> dict[int, int]:
        return {p: off for (s, p), off in self._next.items() if s == source}

    async def write(self, source: str, rows: Sequence[tuple[int, int, dict[str, Any]]]) -> None:
        lines = []
        for partition, offset, record in rows:
            key = (source, partition)
            if offset < self._next.get(key, 0):
                continue
            self._next[key] = offset + 1
            lines.append(json.dumps({**record, "source": source, "partition": partition, "offset": offset},
                                    separators=(",", ":")).encode() + b"\n")
        if lines:
            self._fh.write(b"".join(lines))
            self._fh.flush()
            await asyncio.to_thread(os.fsync, self._fh.fileno())


class PostgresSink:
    """Rows of ``audit_trail`` (see storage/migrations/002_audit.sql)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._pool: Any = None

    async def start(self) -> None:
        import asyncpg

        from hutch.storage.schema import migrate

        self._pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=2)
        async with self._pool.acquire() as conn:
            await migrate(conn)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def resume_points(self, source: str) -> dict[int, int]:
        rows = await self._pool.fetch(
            "SELECT source_partition, max(source_offset) AS last FROM audit_trail WHERE source = $1"
            " GROUP BY source_partition", source,
        )
        return {int(r["source_partition"]): int(r["last"]) + 1 for r in rows}

    async def write(self, source: str, rows: Sequence[tuple[int, int, dict[str, Any]]]) -> None:
        if not rows:
            return
        # PostgreSQL text and jsonb cannot hold U+0000; an event carrying one (a poison event:
        # tests/system/test_poison.py) would be refused, and retried, for ever. Kept, marked.
        rows = [(p, off, _without_nul(r)) for p, off, r in rows]
        await self._pool.executemany(
            "INSERT INTO audit_trail (event_id, position, sandbox_id, type, actor, at, detail,"
            " source, source_partition, source_offset, org_id, project_id)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, $12) ON CONFLICT (event_id) DO NOTHING",
            [
                (r["eventId"], r["position"], r["sandboxId"], r["type"], r["actor"], r["at"],
                 json.dumps(r["detail"], separators=(",", ":")), source, p, off, r["orgId"], r["projectId"])
                for p, off, r in rows
            ],
        )


def _without_nul(value: Any) -> Any:
    """``value`` with every U+0000 in its strings (keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_nul(v) for v in value]
    return value


class Auditor:
    """Feeds every event of the log, once, to each sink."""

    def __init__(self, event_log: EventLog, sinks: Sequence[Sink], *, group: str = DEFAULT_GROUP,
                 org: str | None = None) -> None:
        if not sinks:
            raise ValueError("an auditor needs at least one sink (PostgreSQL and/or JSONL)")
        self.log = event_log
        self.sinks = list(sinks)
        self.group = group
        self.org = org  # keep only this organization's records (a per-tenant trail)
        self.written = 0
        self.caught_up = asyncio.Event()  # set once the backlog present at start is written

    async def run(self) -> None:
        for sink in self.sinks:
            await sink.start()
        try:
            if self.log.capabilities.consumer_groups:
                await self.log.consume_group(self.group, self)
            else:
                await self._run_subscription()
        finally:
            for sink in self.sinks:
                with contextlib.suppress(Exception):
                    await sink.close()

    async def _write(self, source: str, rows: list[tuple[int, int, dict[str, Any]]]) -> None:
        if self.org is not None:
            rows = [row for row in rows if row[2]["orgId"] == self.org]
        for sink in self.sinks:
            await sink.write(source, rows)
        self.written += len(rows)

    async def _run_subscription(self) -> None:
        after = min([(await s.resume_points(LOG_SOURCE)).get(0, 1) - 1 for s in self.sinks])
        last = await self.log.last_position()
        if after >= last:
            self.caught_up.set()
        async for event in self.log.subscribe(after):
            pos = event.position or 0
            await self._write(LOG_SOURCE, [(0, pos, audit_record(event))])
            if pos >= last:
                self.caught_up.set()

    # ---------------------------------------------------------------- as a consumer group member

    async def resume_points(self, source: str, partitions: Sequence[int]) -> dict[int, int]:
        """Every sink holds everything below its own point: resume at the lowest (records a
        sink already holds are skipped by that sink)."""
        held = [await s.resume_points(source) for s in self.sinks]
        return {p: min(h.get(p, 0) for h in held) for p in partitions}

    async def deliver(self, source: str, records: Sequence[tuple[int, int, Event]]) -> None:
        await self._write(source, [(partition, offset, audit_record(event)) for partition, offset, event in records])

    def mark_caught_up(self) -> None:
        self.caught_up.set()
