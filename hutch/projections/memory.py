"""The embedded projection store: dictionaries, rebuilt from the log at every start.

It has no columns to refuse a value, but an event the fold raises on (a malformed one,
written by another writer or an older version) is stepped over all the same, its partial
changes undone, and listed by ``skipped`` (see ``projections.base``).

Deleted sandboxes (and their executions) move to an on-disk archive (projections/ended.py):
what a long-running server keeps in memory is what is alive, not everything it ever ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from hutch.core.events import Event
from hutch.core.lifecycle import execution_id_of
from hutch.core.models import ExecutionState, SandboxState, SandboxStatus, SnapshotState
from hutch.core.snapshots import evolve_snapshot, is_snapshot_event
from hutch.core.tenancy import Directory
from hutch.projections.base import (
    ProjectionStore,
    SandboxQuery,
    SkippedEvent,
    SnapshotQuery,
    fold,
    is_tenancy_event,
    matches,
    skipped_event,
    snapshot_matches,
    snapshot_sort_key,
    sort_key,
)
from hutch.projections.ended import EndedArchive

_V = TypeVar("_V")


class _Refused(Exception):
    """The fold raised on an event (its ``__cause__``)."""


class MemoryProjectionStore(ProjectionStore):
    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self._position = 0
        self._sandboxes: dict[str, SandboxState] = {}
        self._executions: dict[str, ExecutionState] = {}
        self._by_sandbox: dict[str, list[str]] = {}
        self._snapshots: dict[str, SnapshotState] = {}
        self._log: str | None = None
        self._directory = Directory()
        self._ended = EndedArchive()
        self._skipped: list[SkippedEvent] = []

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
            try:
                self._fold(event)
            except _Refused as refused:  # the fold raised on this event: step over it
                self._skipped.append(skipped_event(event, refused.__cause__ or refused))
            self._position = event.position

    def _fold(self, event: Event) -> None:
        try:
            if is_tenancy_event(event):  # Directory.apply builds every record before it puts one
                self._directory.apply(event.sandbox_id, event.created_at, event.data)
                return
            if is_snapshot_event(event):
                snap = evolve_snapshot(self._snapshots.get(event.sandbox_id), event)
                if snap is not None:
                    self._snapshots[event.sandbox_id] = snap
                return
        except Exception as err:
            raise _Refused from err
        # The archive is a file, and a full disk is no poison: its errors are not refusals.
        self._revive(event.sandbox_id)
        try:
            self._fold_sandbox(event)
        except Exception as err:
            raise _Refused from err
        finally:
            current = self._sandboxes.get(event.sandbox_id)
            if current is not None and current.status is SandboxStatus.DELETED:
                self._archive(event.sandbox_id)

    def _fold_sandbox(self, event: Event) -> None:
        """``fold``, all or nothing: one that raises half-way leaves the maps as they were, as
        a refused transaction leaves a database."""
        sid = event.sandbox_id
        sandbox = self._sandboxes.get(sid)
        ids = self._by_sandbox.get(sid)
        count = len(ids or ())
        eid = execution_id_of(event)
        touched = [eid] if eid is not None else list(ids or ())  # what fold may replace
        executions = {i: self._executions.get(i) for i in touched}
        try:
            fold(self._sandboxes, self._executions, self._by_sandbox, event)
        except Exception:
            _put(self._sandboxes, sid, sandbox)
            if ids is None:
                self._by_sandbox.pop(sid, None)
            else:
                del ids[count:]
            for i, ex in executions.items():
                _put(self._executions, i, ex)
            raise

    async def skipped(self, limit: int = 100) -> tuple[list[SkippedEvent], int]:
        return self._skipped[:limit], len(self._skipped)

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

    async def get_sandbox(self, sandbox_id: str, *, unrecorded: bool = False) -> SandboxState | None:
        found = self._sandboxes.get(sandbox_id) or self._ended.sandbox(sandbox_id)
        return None if found is not None and found.unrecorded and not unrecorded else found

    async def list_sandboxes(self, query: SandboxQuery) -> tuple[list[SandboxState], int]:
        found = [s for s in self._sandboxes.values() if matches(s, query)]
        if query.deleted_only or query.include_deleted or query.status == SandboxStatus.DELETED.value:
            found.extend(s for s in self._ended.sandboxes(query.org_id) if matches(s, query))
        found.sort(key=sort_key(query), reverse=query.direction == "desc")
        return found[query.offset : query.offset + query.limit], len(found)

    async def event_bytes(self, org_id: str) -> int:
        live = sum(s.log_bytes for s in self._sandboxes.values() if s.spec.org_id == org_id)
        return live + self._ended.log_bytes(org_id)

    async def get_execution(self, execution_id: str) -> ExecutionState | None:
        return self._executions.get(execution_id) or self._ended.execution(execution_id)

    async def list_executions(self, sandbox_id: str, limit: int | None = None) -> list[ExecutionState]:
        if sandbox_id not in self._sandboxes:
            return self._ended.executions(sandbox_id, limit)
        ids = self._by_sandbox.get(sandbox_id, [])[::-1]
        if limit is not None:
            ids = ids[:limit]
        return [self._executions[i] for i in ids]

    async def get_snapshot(self, snapshot_id: str) -> SnapshotState | None:
        return self._snapshots.get(snapshot_id)

    async def list_snapshots(self, query: SnapshotQuery) -> tuple[list[SnapshotState], int]:
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


def _put(into: dict[str, _V], key: str, value: _V | None) -> None:
    """Put ``value`` back under ``key`` (None: there was none)."""
    if value is None:
        into.pop(key, None)
    else:
        into[key] = value
