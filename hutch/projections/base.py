"""The ProjectionStore port.

A store holds the current state of sandboxes and executions plus the log position it
has applied up to, and applies each event together with that position atomically:
an event at or below the tracked position is ignored, so replays never double-apply
and a crash between events never skips one. Every backend passes
``tests/contracts/test_projection_store.py``.

A poison event (one whose state the store cannot hold, such as a NUL character PostgreSQL
refuses in text, or one the fold raises on) must not stop the projections: every later
write would wait for it in vain. ``apply`` steps over an event the store refuses *on its
own* (``EventRefused``), records it (``skipped``) and moves the position past it. A store
that cannot be reached is a different thing: that raises, and the caller retries the same
events; those are never skipped.

Abilities beyond the required methods are declared in ``StoreCapabilities`` (as a driver
declares its ``Capabilities``); the optional methods raise ``NotSupported`` unless a backend
declares and implements them.
"""

from __future__ import annotations

import abc
import datetime
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, ClassVar

import attrs

from hutch.core.errors import NotSupported
from hutch.core.events import Event, UnreadableRecord
from hutch.core.lifecycle import evolve_execution, evolve_sandbox, execution_id_of, execution_in
from hutch.core.models import (
    ExecutionState,
    SandboxState,
    SandboxStatus,
    SnapshotState,
    SnapshotStatus,
)
from hutch.core.snapshots import FORK_OF
from hutch.core.tenancy import TENANCY_EVENTS, Directory

log = logging.getLogger(__name__)


@attrs.frozen
class SandboxQuery:
    org_id: str | None = None  # None: every organization (the server's own reads)
    projects: tuple[str, ...] = ()  # () = every project
    name: str | None = None
    mode: str | None = None
    project_id: str | None = None
    snapshot_id: str | None = None  # made from this snapshot
    status: str | None = None
    live: bool | None = None  # only sandboxes that are not final
    deleted_only: bool = False
    include_deleted: bool = False
    limit: int = 50
    offset: int = 0
    sort: str = "createdAt"  # createdAt | updatedAt | name | status | mode | executions
    direction: str = "desc"


@attrs.frozen
class SnapshotQuery:
    org_id: str | None = None  # None: every organization (public ones are found with public=True)
    projects: tuple[str, ...] = ()  # () = every project and none; else only snapshots of these
    source_sandbox_id: str | None = None
    name: str | None = None
    tag: str | None = None
    public: bool | None = None
    content_hash: str | None = None
    ready_only: bool = True  # False: building ones too (never deleted ones)
    building_only: bool = False  # only builds not finalized yet (with ready_only=False)
    forks: bool = True  # False: without the snapshots a fork keeps of its instant (metadata FORK_OF)
    limit: int = 50
    offset: int = 0
    sort: str = "createdAt"  # createdAt | name | size | files (the CLI's created/size/files too)
    direction: str = "desc"


SNAPSHOT_SORTS = {"createdAt": "createdAt", "created": "createdAt", "name": "name", "size": "size",
                  "sizeBytes": "size", "files": "files", "fileCount": "files"}


def snapshot_matches(snap: SnapshotState, q: SnapshotQuery) -> bool:
    if snap.status is SnapshotStatus.DELETED or (q.ready_only and snap.status is not SnapshotStatus.READY):
        return False
    if q.building_only and snap.status is not SnapshotStatus.BUILDING:
        return False
    return (
        (q.org_id is None or snap.org_id == q.org_id)
        and (not q.projects or snap.project_id in q.projects)
        and (q.source_sandbox_id is None or snap.source_sandbox_id == q.source_sandbox_id)
        and (q.name is None or snap.name == q.name)
        and (q.tag is None or snap.tag == q.tag)
        and (q.public is None or snap.public == q.public)
        and (q.content_hash is None or snap.content_hash == q.content_hash)
        and (q.forks or FORK_OF not in snap.metadata)
    )


def snapshot_sort_key(q: SnapshotQuery) -> Callable[[SnapshotState], tuple[Any, str]]:
    field: dict[str, Callable[[SnapshotState], tuple[Any, str]]] = {
        "createdAt": lambda s: (s.created_at, s.snapshot_id),
        "name": lambda s: (s.name, s.snapshot_id),
        "size": lambda s: (s.size_bytes, s.snapshot_id),
        "files": lambda s: (s.file_count, s.snapshot_id),
    }
    return field[SNAPSHOT_SORTS.get(q.sort, "createdAt")]


class StoreBehind(Exception):
    """The store holds less than this store object saw it hold (a crash lost commits, a backup
    was restored, someone reset it). Whoever feeds it must follow the log again from
    ``position``; the store skips what it still has."""

    def __init__(self, position: int, expected: int) -> None:
        super().__init__(f"projection store is at position {position}, but was at {expected}")
        self.position = position
        self.expected = expected


class EventRefused(Exception):
    """The store cannot hold what these events make (a value its columns refuse, a fold that
    raised on a malformed event): nothing of them was written. Never raised for a store that
    is away (that is retried, see ``ProjectionStore.apply``)."""


@attrs.frozen
class SkippedEvent:
    """An event ``apply`` stepped over because the store refused it on its own."""

    position: int
    event_id: str
    sandbox_id: str
    type: str
    error: str  # why the store refused it
    skipped_at: str  # ISO 8601, UTC


# The longest reason kept for a skipped event: a driver's error can quote a whole document.
MAX_SKIP_ERROR = 2000


def _printable(text: str, limit: int) -> str:
    """``text`` as any store can hold it: the NUL that made the event poison must not make its
    record poison too, nor a lone surrogate (both shown escaped)."""
    text = text.replace("\x00", "\\u0000").encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def skipped_event(event: Event, err: BaseException) -> SkippedEvent:
    """The record of stepping over ``event``; logged as an error (operators look for these)."""
    reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    skip = SkippedEvent(
        position=event.position or 0, event_id=_printable(event.event_id, 200),
        sandbox_id=_printable(event.sandbox_id, 200), type=_printable(event.type, 100),
        error=_printable(reason, MAX_SKIP_ERROR),
        skipped_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    )
    log.error("projection store refused event %s (%s of %s) at log position %d; stepped over it: %s",
              skip.event_id, skip.type, skip.sandbox_id, skip.position, skip.error)
    return skip


@attrs.frozen
class StoreCapabilities:
    """What a store can do beyond the required methods; callers check these flags, never the
    store's type. ``tests/contracts`` holds each backend to exactly what it declares."""

    # ``wait_for``: the store is shared between processes and tells a waiter when another
    # process applied a position (``HUTCH_PROJECTOR=external``: ``hutch projector`` applies).
    shared: bool = False
    # ``rebuild``: reset and replay as one transaction; readers keep the old state meanwhile.
    atomic_rebuild: bool = False


class ProjectionStore(abc.ABC):
    capabilities: ClassVar[StoreCapabilities] = StoreCapabilities()

    async def start(self) -> None:  # noqa: B027
        pass

    async def close(self) -> None:  # noqa: B027
        pass

    # A store whose commits do not wait for the WAL flush (the PostgreSQL store: its tables
    # are derived, the log is the record) can lose its last applied batches in a server
    # crash. Its reads must then not show state older than a write already answered: from
    # each new session on it holds them until the projector of this process has checked the
    # store against the log's end (``Projector``), and a read held too long answers 503.
    # A store that loses nothing it answered (memory: one process) never holds.

    def hold_reads_on_reconnect(self, reconnected: Callable[[], None]) -> None:  # noqa: B027
        """From now on, each new session holds the reads and calls ``reconnected``."""

    def reads_held(self) -> int | None:
        """The hold the reads are under (to name in ``release_reads``), None when none is."""
        return None

    def release_reads(self, hold: int) -> bool:
        """Let the reads go, unless a newer hold began after ``hold`` (then False)."""
        return True

    @abc.abstractmethod
    async def position(self) -> int:
        """Log position of the last applied event (0 when empty)."""

    @abc.abstractmethod
    async def log_identity(self) -> str | None:
        """The identity of the event log this store folds (``EventLog.identity``), None when
        not bound to one yet."""

    @abc.abstractmethod
    async def bind_log(self, identity: str) -> str:
        """Record ``identity`` as the store's log unless it is bound already; returns the
        identity the store is bound to afterwards (another projector may have been first)."""

    @abc.abstractmethod
    async def apply(self, events: Sequence[Event]) -> None:
        """Fold events in log order; skip any at or below ``position()``. An event the store
        refuses on its own is stepped over: recorded in ``skipped``, logged as an error, and
        the position moves past it, so later events apply and their writers' waits end. A
        store that cannot be reached raises instead (the caller retries these events)."""

    @abc.abstractmethod
    async def skipped(self, limit: int = 100) -> tuple[list[SkippedEvent], int]:
        """The events ``apply`` stepped over, oldest first (at most ``limit``), and how many
        there are in all. ``reset`` forgets them; a rebuild records them again."""

    @abc.abstractmethod
    async def get_sandbox(self, sandbox_id: str, *, unrecorded: bool = False) -> SandboxState | None:
        """The sandbox, or None. One only a survivor's ``lifecycle:discarded`` records
        (``SandboxState.unrecorded``) is kept for the fold and its tenant's reads of its end,
        and is returned only when asked for (``unrecorded``): there is no sandbox to show."""

    @abc.abstractmethod
    async def list_sandboxes(self, query: SandboxQuery) -> tuple[list[SandboxState], int]:
        """One page and the total matching the filters."""

    @abc.abstractmethod
    async def event_bytes(self, org_id: str) -> int:
        """What the events of the organization's sandboxes take in the log (the sum of their
        ``log_bytes``, deleted sandboxes' too: the log keeps them)."""

    @abc.abstractmethod
    async def get_execution(self, execution_id: str) -> ExecutionState | None: ...

    @abc.abstractmethod
    async def list_executions(self, sandbox_id: str, limit: int | None = None) -> list[ExecutionState]:
        """Newest first."""

    @abc.abstractmethod
    async def get_snapshot(self, snapshot_id: str) -> SnapshotState | None:
        """Deleted ones too (status ``deleted``): lineage still names them."""

    @abc.abstractmethod
    async def list_snapshots(self, query: SnapshotQuery) -> tuple[list[SnapshotState], int]:
        """One page and the total matching the filters (never deleted ones)."""

    @abc.abstractmethod
    async def directory(self) -> Directory:
        """Organizations, projects and keys as of ``position`` (a copy the caller may fold on)."""

    @abc.abstractmethod
    async def reset(self) -> None:
        """Forget everything (position back to 0, bound to no log) so a rebuild can replay a log."""

    async def wait_for(self, position: int, timeout: float) -> None:
        """Return once the store applied ``position``, whoever applied it (``capabilities.shared``)."""
        raise NotSupported(f"store {type(self).__name__} cannot wait for another process's projector")

    async def rebuild(self, batches: AsyncIterator[Sequence[Event]] | Iterable[Sequence[Event]],
                      log_identity: str | None = None) -> int:
        """Reset and replay ``batches`` in one transaction, bound to ``log_identity``; returns the
        position reached (``capabilities.atomic_rebuild``)."""
        raise NotSupported(f"store {type(self).__name__} cannot rebuild in one transaction")


def is_tenancy_event(event: Event) -> bool:
    return isinstance(event.data, TENANCY_EVENTS)


def matches(sandbox: SandboxState, q: SandboxQuery) -> bool:
    """The list filters, shared by stores that filter in Python."""
    if sandbox.unrecorded:  # no reader sees one (SandboxState.unrecorded)
        return False
    if q.org_id is not None and sandbox.spec.org_id != q.org_id:
        return False
    if q.projects and sandbox.spec.project_id not in q.projects:
        return False
    if q.deleted_only:
        if sandbox.status is not SandboxStatus.DELETED:
            return False
    elif not q.include_deleted and sandbox.status is SandboxStatus.DELETED and q.status != "deleted":
        return False
    if q.status and sandbox.status.value != q.status:
        return False
    if q.live is True and sandbox.status.is_final:
        return False
    if q.live is False and not sandbox.status.is_final:
        return False
    if q.name and sandbox.spec.name != q.name:
        return False
    if q.mode and sandbox.spec.mode.value != q.mode:
        return False
    if q.snapshot_id and sandbox.spec.snapshot_id != q.snapshot_id:
        return False
    return not (q.project_id and sandbox.spec.project_id != q.project_id)


def sort_key(q: SandboxQuery) -> Callable[[SandboxState], tuple[Any, str]]:
    field: dict[str, Callable[[SandboxState], tuple[Any, str]]] = {
        "createdAt": lambda s: (s.created_at, s.sandbox_id),
        "updatedAt": lambda s: (s.updated_at, s.sandbox_id),
        "name": lambda s: (s.spec.name or "", s.sandbox_id),
        "status": lambda s: (s.status.value, s.sandbox_id),
        "mode": lambda s: (s.spec.mode.value, s.sandbox_id),
        "executions": lambda s: (s.executions, s.sandbox_id),
    }
    return field.get(q.sort, field["createdAt"])


def fold(
    sandboxes: dict[str, SandboxState], executions: dict[str, ExecutionState], by_sandbox: dict[str, list[str]], event: Event
) -> tuple[SandboxState | None, list[ExecutionState]]:
    """Apply one event to in-memory maps; returns what changed (for stores that persist rows)."""
    if isinstance(event.data, UnreadableRecord):
        raise EventRefused(f"the log record at position {event.position} cannot be read "
                           f"({event.data.reason}): {event.data.record[:200]!r}")
    changed_execs: list[ExecutionState] = []
    new_sb = evolve_sandbox(sandboxes.get(event.sandbox_id), event)
    if new_sb is not None:
        sandboxes[event.sandbox_id] = new_sb
    eid = execution_id_of(event)
    if eid is not None:
        ex = evolve_execution(executions.get(eid), event)
        if ex is not None:
            ex = execution_in(sandboxes.get(event.sandbox_id), ex, event.created_at)
            if eid not in executions:
                by_sandbox.setdefault(event.sandbox_id, []).append(eid)
            executions[eid] = ex
            changed_execs.append(ex)
    else:
        # Sandbox-level events can end running executions (terminated/failed under them).
        for running_id in by_sandbox.get(event.sandbox_id, []):
            old = executions[running_id]
            if old.status.is_final:
                continue
            ex = evolve_execution(old, event)
            if ex is not None and ex is not old:
                executions[running_id] = ex
                changed_execs.append(ex)
    return new_sb, changed_execs
