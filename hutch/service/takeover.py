"""Taking over the sandboxes of a replica that was lost (api/replication.py finds them):
adopt what the driver still runs, fail the commands that died with the replica, and end or
keep each sandbox as its state says."""

from __future__ import annotations

import contextlib
import logging

from hutch.core.errors import EndedUnadopted
from hutch.core.eventlog.base import EventLog
from hutch.core.lifecycle import DESTROYED_ON_REQUEST, Fail, FinishExecution, Terminate
from hutch.core.models import ExecutionStatus, Mode, SandboxStatus
from hutch.core.replicas import Handle, Tenant
from hutch.drivers.roles import Adoption, SandboxLifecycle
from hutch.projections.base import ProjectionStore
from hutch.projections.runner import Projector
from hutch.service.control import SandboxControl
from hutch.service.reads import Reads
from hutch.service.recorder import Recorder
from hutch.service.timeouts import Reaper

log = logging.getLogger(__name__)


class Takeover:
    def __init__(self, *, log: EventLog, store: ProjectionStore, projector: Projector, reads: Reads,
                 recorder: Recorder, control: SandboxControl, reaper: Reaper, lifecycle: SandboxLifecycle,
                 adoption: Adoption) -> None:
        self._log, self._store, self._projector, self._reads = log, store, projector, reads
        self._recorder, self._control, self._reaper = recorder, control, reaper
        self._lifecycle, self._adoption = lifecycle, adoption

    async def sandbox_of_execution(self, execution_id: str, *, running: bool = False) -> str | None:
        """The sandbox an execution runs in (with ``running``: only while it has not ended);
        unscoped, for routing a request to the replica that owns it (every waiter of a command
        that ended asks: one of this replica's own is answered from what it folded)."""
        found = await self._reads.find_execution(execution_id)
        if found is None or (running and found.status.is_final):
            return None
        return found.sandbox_id

    async def leftovers(self, dead_replica: str) -> list[str]:
        """What the lost replica placed ahead of any sandbox (a warm pool), listed as its
        take-over is claimed; ended by ``discard_leftovers`` once its sandboxes are taken over."""
        return await self._adoption.lost_leftovers(dead_replica)

    async def discard_leftovers(self, leftovers: list[str], handles: list[Handle]) -> None:
        """After ``adopt`` of each claimed sandbox (each unrecorded one recorded ended first, so
        a late append of its create cannot make it live): ``leftovers`` but what ``handles`` name."""
        await self._adoption.discard_leftovers(leftovers, handles)

    async def adopt(self, sandbox_id: str, handle: Handle | None, why: str, tenant: Tenant | None = None) -> bool:
        """Take over one sandbox; returns whether this replica keeps it (False: it ended, or
        was never found, and its claim can go). ``tenant``: whose it is, as its owner row says."""
        await self._projector.wait_for(await self._log.last_position())  # the dead one's last events
        sb = await self._store.get_sandbox(sandbox_id)
        if sb is None:
            # Owned, and no event records it: the lost replica had it made (its owner row is
            # committed first) and died before its Create was appended (provisioning.py), or
            # before the make. Nobody can reach it through the API and nobody will record it
            # (the claim found its replica's lease lapsed, and a replica appends a made one only
            # while its lease holds): ended wherever it runs, not left holding a node's room.
            # Recorded ended first: an append of its create that began while that lease held
            # can still land (a replica frozen mid-append), and must not make it live again.
            log.warning("sandbox %s: no event records it and %s; ending it wherever it runs", sandbox_id, why)
            try:
                # Filed under its tenant (its owner row's): the only record of it is the tenant's
                # to read, not the operator's organization's, nor anybody else's.
                await self._recorder.discard(sandbox_id, f"{why} before it recorded the sandbox, which the "
                                                         "replica that took it over ended", tenant)
            finally:  # the log away: ended all the same (the error is logged); a late create is then unguarded
                await self._adoption.discard_unrecorded(sandbox_id, handle or {})
            return False
        if sb.status.is_final:
            return False
        # Where the log records the sandbox's node (the node driver's lifecycle:started), that
        # is where it runs: its create writes no handle row.
        failed = False
        try:
            adopted = (handle is not None or sb.node is not None) and await self._adoption.adopt(sb, handle or {})
        except EndedUnadopted as err:
            # It cannot be driven from here (nomad: its state file not written, so the driver
            # ended it). Said and recorded, not logged and passed by: the sandbox stayed
            # claimed and running, driven by no replica. The driver's words name host paths
            # and Nomad ids: the operator's log gets them, the tenant's reason does not. Only
            # this failure: any other (Nomad not answering) ended nothing, and this replica's
            # destroy cannot stop a job its driver never knew; recorded ended, it ran on.
            log.error("sandbox %s: taking it over failed: %s", sandbox_id, err.message)
            adopted, failed = False, True
        for ex in await self._store.list_executions(sandbox_id):
            if not ex.status.is_final:
                await self._recorder.command(sandbox_id, FinishExecution(ex.execution_id, ExecutionStatus.FAILED,
                                                                         error=why))
        if sb.status is SandboxStatus.STOPPING and adopted:  # a destroy the dead replica began
            await self._lifecycle.destroy(sandbox_id)
            await self._recorder.command(sandbox_id, Terminate(reason=DESTROYED_ON_REQUEST, deleted=True))
        elif not adopted or sb.status is SandboxStatus.CREATING:
            with contextlib.suppress(Exception):
                await self._lifecycle.destroy(sandbox_id)
            if failed:
                gone = "; the replica taking it over could not record it, and ended it"
            elif not adopted:
                gone = "; its processes were not found"
            else:
                gone = " while the sandbox was being created"
            await self._recorder.command(sandbox_id, Fail(reason=why + gone))
        elif sb.spec.mode is Mode.ONESHOT:
            await self._control.end(sandbox_id, Terminate(reason=why))
        else:
            await self._reaper.schedule(sandbox_id)
            return True
        return False
