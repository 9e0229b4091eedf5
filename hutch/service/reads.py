"""Reads: queries over the projection store, seen through the request's tenancy scope, and
the long-polls that hold until the store shows a state (read-your-writes for the engine)."""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import attrs

from hutch.core import phases, tenancy
from hutch.core.errors import ExecutionNotFound, InvalidInput, SandboxNotFound
from hutch.core.eventlog.base import EventLog
from hutch.core.events import Event, SandboxCreated, SandboxDiscarded
from hutch.core.models import ExecutionState, SandboxState, SandboxStatus
from hutch.core.tenancy import LOCAL_ORG, SCOPE, visible
from hutch.projections.base import ProjectionStore, SandboxQuery, fold
from hutch.projections.runner import Projector

if TYPE_CHECKING:
    from hutch.service.tenancy import Tenants

T = TypeVar("T")

MAX_WAIT_SECONDS = 300.0  # the longest a long-poll is held (the client asks for 5m)
CREATING_WAIT_SECONDS = 60.0
ENDED_KEPT = 1024  # ended sandboxes still folded (``Reads.observe``), the oldest dropped first
ENDED_EXECUTIONS_KEPT = 4096  # ended executions of folded sandboxes kept, the oldest dropped first
DISCARDS_KEPT = 1024  # lifecycle:discarded of sandboxes no event recorded, kept for a create landing late


class Reads:
    def __init__(self, store: ProjectionStore, event_log: EventLog, projector: Projector) -> None:
        self.store = store
        self.log = event_log
        self.projector = projector
        self.tenants: Tenants | None = None  # set by the app (service/tenancy.py); None: one organization
        # Sandboxes waiting for their runtime's first build (service/provisioning.py keeps it):
        # a wait for them to leave ``creating`` holds as long as the build takes.
        self.building: set[str] = set()
        # The live sandboxes this process created, folded from the events its projector applied
        # (``observe``): the command path reads them without a PostgreSQL round trip (14 reads
        # per one-shot before). Only this process's own: it is their one writer
        # (core/replicas.py), so their events reach the store through this projector and are
        # folded here before any writer waiting for them wakes; another replica's events
        # would reach the store before this projector, and those sandboxes are read there.
        self._mine: set[str] = set()
        self._folded: dict[str, SandboxState] = {}
        # Ended ones stay folded a while, oldest dropped first: the reaper and the client
        # read them once more just after they end (up to 3.5 store reads per one-shot).
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.ended_kept = ENDED_KEPT
        # Their executions, folded alike (2.7 store reads per one-shot before: the long-poll's
        # read, and one more each time it woke). Every running one is kept (a sandbox's end
        # ends them); ended ones up to a bound, the oldest dropped first: the store has them.
        self._executions: dict[str, ExecutionState] = {}
        self._runs: dict[str, builtins.list[str]] = {}  # a folded sandbox's executions held here
        self._ended_runs: collections.OrderedDict[str, str] = collections.OrderedDict()  # id -> its sandbox
        self.ended_executions_kept = ENDED_EXECUTIONS_KEPT
        self._folded_to = 0  # the last log position folded: a re-applied batch folds once
        # A survivor's lifecycle:discarded of a sandbox no event recorded yet (service/takeover.py),
        # rare: this process's own create of it may land after it (an append that began while its
        # lease held), and is folded onto it, failed, as the stores fold it.
        self._discards: collections.OrderedDict[str, Event] = collections.OrderedDict()
        projector.observers.append(self.observe)

    # ---------------------------------------------------------------- own sandboxes

    def own(self, sandbox_id: str) -> None:
        """This process is about to record ``sandbox_id``'s creation: fold its events from it."""
        self._mine.add(sandbox_id)

    def disown(self, sandbox_id: str) -> None:
        self._mine.discard(sandbox_id)
        self._folded.pop(sandbox_id, None)
        self._ended.pop(sandbox_id, None)
        for execution_id in self._runs.pop(sandbox_id, ()):
            self._executions.pop(execution_id, None)
            self._ended_runs.pop(execution_id, None)

    def observe(self, batch: Sequence[Event]) -> None:
        """Projector observer: runs once a batch is applied, before the writers waiting wake."""
        for event in batch:
            position = event.position or 0
            if position and position <= self._folded_to:
                continue
            self._folded_to = max(self._folded_to, position)
            sandbox_id = event.sandbox_id
            if isinstance(event.data, SandboxDiscarded) and sandbox_id not in self._folded:
                self._discards[sandbox_id] = event
                while len(self._discards) > DISCARDS_KEPT:
                    self._discards.popitem(last=False)
            if sandbox_id not in self._mine:
                continue
            before = self._folded.get(sandbox_id)
            if before is None and not isinstance(event.data, SandboxCreated):
                continue
            if before is None and (discard := self._discards.pop(sandbox_id, None)) is not None:
                fold(self._folded, self._executions, self._runs, discard)  # its create lands on it
            try:
                # The stores' own fold (projections/base.py), its executions with it. An
                # unreadable record is one the store steps over (fold raises on it), and the
                # store refuses what the fold raises on: it answers from then on.
                after, executions = fold(self._folded, self._executions, self._runs, event)
            except Exception:
                after, executions = None, []
            if after is None or after.status is SandboxStatus.DELETED:
                # Deleted: the stores archive it (later events fold apart), so they answer.
                self.disown(sandbox_id)
                continue
            for ex in executions:
                if ex.status.is_final:
                    self._ended_run(ex)
            if after.status.is_final:
                self._ended[sandbox_id] = None
                while len(self._ended) > self.ended_kept:  # nothing kept per sandbox ever had
                    self.disown(next(iter(self._ended)))

    def _ended_run(self, ex: ExecutionState) -> None:
        """An execution ended: kept a while for its waiters, the oldest ended one dropped
        beyond the bound (``fold`` looks up every id a sandbox's list names: dropped from both)."""
        self._ended_runs[ex.execution_id] = ex.sandbox_id
        while len(self._ended_runs) > self.ended_executions_kept:
            execution_id, sandbox_id = self._ended_runs.popitem(last=False)
            self._executions.pop(execution_id, None)
            with contextlib.suppress(KeyError, ValueError):
                self._runs[sandbox_id].remove(execution_id)

    async def sandbox(self, sandbox_id: str) -> SandboxState | None:
        """The sandbox as the projections hold it, unscoped: folded here if it is this
        process's own (live, or ended a little while ago), else from the store."""
        found = self._folded.get(sandbox_id)
        return found if found is not None else await self.store.get_sandbox(sandbox_id)

    # ---------------------------------------------------------------- scope

    def scoped(self, query: SandboxQuery) -> SandboxQuery:
        """``query`` limited to what the request being served may see."""
        scope = SCOPE.get()
        if scope is None:
            return query
        return attrs.evolve(query, org_id=scope.org_id, projects=scope.projects)

    def resolved(self, query: SandboxQuery) -> SandboxQuery:
        """The query in the caller's scope, a project's name filtering like its id."""
        query = self.scoped(query)
        if query.project_id and self.tenants is not None:
            with contextlib.suppress(InvalidInput):
                project = tenancy.resolve_project(self.tenants.directory, query.org_id or LOCAL_ORG, query.project_id)
                query = attrs.evolve(query, project_id=project)
        return query

    # ---------------------------------------------------------------- sandboxes

    async def require(self, sandbox_id: str, *, include_deleted: bool = True) -> SandboxState:
        sb = await self.sandbox(sandbox_id)
        if sb is None or (sb.status is SandboxStatus.DELETED and not include_deleted) or not visible(
                sb.spec.org_id, sb.spec.project_id):
            # Another organization's sandbox is as absent as one that never was.
            raise SandboxNotFound(f"sandbox {sandbox_id} not found", sandbox_id=sandbox_id)
        return sb

    async def list(self, query: SandboxQuery) -> tuple[builtins.list[SandboxState], int]:
        return await self.store.list_sandboxes(self.resolved(query))

    async def wait_status(self, sandbox_id: str, statuses: set[SandboxStatus], wait: float) -> SandboxState:
        await self.require(sandbox_id)
        return await self.wait(
            lambda: self.require(sandbox_id), lambda s: s.status in statuses, min(wait, MAX_WAIT_SECONDS), sandbox_id
        )

    async def wait_not_creating(self, sandbox_id: str) -> SandboxState:
        sb = await self.require(sandbox_id, include_deleted=False)
        ready: set[SandboxStatus] = {s for s in SandboxStatus if s is not SandboxStatus.CREATING}
        if sb.status is SandboxStatus.CREATING:
            sb = await self.wait_status(sandbox_id, ready, CREATING_WAIT_SECONDS)
        while sb.status is SandboxStatus.CREATING and sandbox_id in self.building:
            sb = await self.wait_status(sandbox_id, ready, MAX_WAIT_SECONDS)  # a first build takes minutes
        return sb

    async def events(self, sandbox_id: str, *, limit: int, reverse: bool) -> builtins.list[Event]:
        try:
            await self.require(sandbox_id)
        except SandboxNotFound:
            # No sandbox, but its end may be there: one only a survivor's lifecycle:discarded
            # records (service/takeover.py) is filed under the organization that asked for it,
            # whose to read (the store, not the log: a 404 costs no log scan). To everybody
            # else, and where the record names nobody (from before that was kept), as absent.
            ended = await self.store.get_sandbox(sandbox_id, unrecorded=True)
            if ended is None or not ended.unrecorded or not ended.spec.org_id or \
                    not visible(ended.spec.org_id, ended.spec.project_id):
                raise
        return await self.log.read(0, sandbox_id=sandbox_id, limit=limit, reverse=reverse)

    # ---------------------------------------------------------------- executions and jobs

    async def find_execution(self, execution_id: str) -> ExecutionState | None:
        """The execution as the projections hold it, unscoped: folded here if its sandbox is
        (``observe``), else from the store."""
        found = self._executions.get(execution_id)
        return found if found is not None else await self.store.get_execution(execution_id)

    async def visible_execution(self, execution_id: str) -> ExecutionState:
        ex = await self.find_execution(execution_id)
        if ex is not None and SCOPE.get() is not None:
            sb = await self.sandbox(ex.sandbox_id)
            if sb is None or not visible(sb.spec.org_id, sb.spec.project_id):
                ex = None
        if ex is None:
            raise ExecutionNotFound(f"execution {execution_id} not found", execution_id=execution_id)
        return ex

    async def get_execution(self, execution_id: str, wait: float = 0.0) -> ExecutionState:
        ex = await self.visible_execution(execution_id)
        if ex.status.is_final or wait <= 0:
            return ex
        return await self.wait(
            lambda: self.execution(execution_id), lambda e: e.status.is_final, min(wait, MAX_WAIT_SECONDS),
            ex.sandbox_id,
        )

    async def execution(self, execution_id: str) -> ExecutionState:
        """An execution known to exist (the engine recorded it), unscoped."""
        ex = await self.find_execution(execution_id)
        assert ex is not None
        return ex

    async def list_executions(self, sandbox_id: str, limit: int | None) -> builtins.list[ExecutionState]:
        await self.require(sandbox_id)
        found = [e for e in await self.store.list_executions(sandbox_id) if e.type != "job"]
        return found[:limit] if limit is not None else found

    async def get_job(self, sandbox_id: str, job_id: str) -> ExecutionState:
        await self.require(sandbox_id)
        job = await self.find_execution(job_id)
        if job is None or job.type != "job" or job.sandbox_id != sandbox_id:
            raise ExecutionNotFound(f"job {job_id} not found in sandbox {sandbox_id}", job_id=job_id)
        return job

    async def list_jobs(self, sandbox_id: str, limit: int | None) -> builtins.list[ExecutionState]:
        await self.require(sandbox_id)
        jobs = [e for e in await self.store.list_executions(sandbox_id) if e.type == "job"]
        return jobs[:limit] if limit is not None else jobs

    # ---------------------------------------------------------------- waiting

    async def wait(self, read: Callable[[], Awaitable[T]], done: Callable[[T], bool], wait: float,
                   sandbox_id: str) -> T:
        """Hold until ``done(read())`` or ``wait`` seconds pass; returns the last read. Woken by
        ``sandbox_id``'s events only (one pending wake is enough: each re-reads)."""
        queue = self.projector.listen(sandbox_id=sandbox_id, limit=1)
        deadline = time.monotonic() + wait
        t_held = t_woken = phases.start()
        try:
            while True:
                value = await read()
                remaining = deadline - time.monotonic()
                if done(value) or remaining <= 0:
                    phases.end("long-poll: woken to answer", t_woken)
                    phases.end("long-poll: held", t_held)
                    return value
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await queue.get()
                t_woken = phases.start()
                while not queue.empty():  # coalesce a burst of events into one re-read
                    queue.get_nowait()
        finally:
            self.projector.unlisten(queue)
