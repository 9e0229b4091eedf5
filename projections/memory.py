"""The embedded projection store: dictionaries, rebuilt from the log at every start."""

from __future__ import annotations

from collections.abc import Sequence

from core.events import Event
from core.models import Execution, Sandbox, Snapshot
from core.snapshots import evolve_snapshot, is_snapshot_event
from core.tenancy import Directory
from projections.base import (
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
                fold(self._sandboxes, self._executions, self._by_sandbox, event)
            self._position = event.position

    async def get_sandbox(self, sandbox_id: str) -> Sandbox | None:
        return self._sandboxes.get(sandbox_id)

    async def list_sandboxes(self, query: SandboxQuery) -> tuple[list[Sandbox], int]:
        found = [s for s in self._sandboxes.values() if matches(s, query)]
        found.sort(key=sort_key(query), reverse=query.direction == "desc")
        return found[query.offset : query.offset + query.limit], len(found)

    async def get_execution(self, execution_id: str) -> Execution | None:
        return self._executions.get(execution_id)

    async def list_executions(self, sandbox_id: str, limit: int | None = None) -> list[Execution]:
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
        self._clear()
