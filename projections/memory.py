"""The embedded projection store: dictionaries, rebuilt from the log at every start.

Deleted sandboxes (and their executions) move to an on-disk archive (projections/ended.py):
what a long-running server keeps in memory is what is alive, not everything it ever ran.
"""

from __future__ import annotations

from collections.abc import Sequence

from hutch.core.events import Event
from hutch.core.models import Execution, Sandbox, SandboxStatus, Snapshot
from hutch.core.snapshots import evolve_snapshot, is_snapshot_event
from hutch.core.tenancy import Directory
from hutch.projections.base import (
    ProjectionStore,
    SandboxQuery,
    SnapshotQuery,
    fold,
    is_tenancy_event,
    matches,
    snapshot_matches,
    snapshot_sort_key,
    sort_key,
)
from hutch.projections.ended import EndedArchive


class MemoryProjectionStore(ProjectionStore):
    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._position = 0
        self._sandboxes: dict[str, Sandbox] = {}
        self._executions: dict[str, Execution] = {}
        self._by_sandbox: dict[str, list[str]] = {}
        self._snapshots: dict[str, Snapshot] = {}
        self._log: str | None = None
        self._directory = Directory()
        self._ended = EndedArchive()

    async def close(self) -> None:
        self._ended.close()

    async def position(self) -> int:
        return self._position

    async def log_identity(self) -> str | None:
        return self._log

    async def bind_log(self, identity: str) -> str:
        self._log = self._log or identity
        return self._log

    async def apply(self, events: Sequence[Event]) -> None:
        for event in events:
            assert event.position is not None, "only events read from the log can be applied"
            if event.position <= self._position:
                continue
            if is_tenancy_event(event):
                self._directory.apply(event.sandbox_id, event.created_at, event.data)
            elif is_snapshot_event(event):
                snap = evolve_snapshot(self._snapshots.get(event.sandbox_id), event)
                if snap is not None:
                    self._snapshots[event.sandbox_id] = snap
            else:
                self._revive(event.sandbox_id)
                sandbox, _ = fold(self._sandboxes, self._executions, self._by_sandbox, event)
                if sandbox is not None and sandbox.status is SandboxStatus.DELETED:
                    self._archive(event.sandbox_id)
            self._position = event.position

    def _archive(self, sandbox_id: str) -> None:
        """Move a deleted sandbox and its executions to the archive."""
        sandbox = self._sandboxes.pop(sandbox_id)
        ids = self._by_sandbox.pop(sandbox_id, [])
        self._ended.put(sandbox, [self._executions.pop(i) for i in ids])

    def _revive(self, sandbox_id: str) -> None:
        """An event for an archived sandbox (one that arrives after its deletion) folds into
        the sandbox as it was, in memory; if it is still deleted afterwards, back it goes."""
        if sandbox_id in self._sandboxes:
            return
        archived = self._ended.take(sandbox_id)
        if archived is None:
            return
        sandbox, executions = archived
        self._sandboxes[sandbox_id] = sandbox
        self._by_sandbox[sandbox_id] = [ex.execution_id for ex in executions]
        self._executions.update((ex.execution_id, ex) for ex in executions)

    async def get_sandbox(self, sandbox_id: str) -> Sandbox | None:
        return self._sandboxes.get(sandbox_id) or self._ended.sandbox(sandbox_id)

    async def list_sandboxes(self, query: SandboxQuery) -> tuple[list[Sandbox], int]:
        found = [s for s in self._sandboxes.values() if matches(s, query)]
        if query.deleted_only or query.include_deleted or query.status == SandboxStatus.DELETED.value:
            found.extend(s for s in self._ended.sandboxes(query.org_id) if matches(s, query))
        found.sort(key=sort_key(query), reverse=query.direction == "desc")
        return found[query.offset : query.offset + query.limit], len(found)

    async def get_execution(self, execution_id: str) -> Execution | None:
        return self._executions.get(execution_id) or self._ended.execution(execution_id)

    async def list_executions(self, sandbox_id: str, limit: int | None = None) -> list[Execution]:
        if sandbox_id not in self._sandboxes:
            return self._ended.executions(sandbox_id, limit)
        ids = self._by_sandbox.get(sandbox_id, [])[::-1]
        if limit is not None:
            ids = ids[:limit]
        return [self._executions[i] for i in ids]

    async def get_snapshot(self, snapshot_id: str) -> Snapshot | None:
        return self._snapshots.get(snapshot_id)

    async def list_snapshots(self, query: SnapshotQuery) -> tuple[list[Snapshot], int]:
        found = [s for s in self._snapshots.values() if snapshot_matches(s, query)]
        found.sort(key=snapshot_sort_key(query), reverse=query.direction == "desc")
        return found[query.offset : query.offset + query.limit], len(found)

    async def directory(self) -> Directory:
        copy = self._directory.copy()
        copy.position = self._position
        return copy

    async def reset(self) -> None:
        self._ended.close()
        self._clear()
