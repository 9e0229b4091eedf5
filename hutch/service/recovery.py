"""Recovery on start-up: what the driver runs and what the log says is live are brought
back into agreement before the server takes requests."""

from __future__ import annotations

import contextlib
import logging

from hutch.core.events import PAUSE_FILESYSTEM
from hutch.core.lifecycle import Fail, FinishExecution, Terminate
from hutch.core.models import ExecutionStatus, Mode, SandboxStatus
from hutch.drivers.roles import NodeFleet, SandboxLifecycle
from hutch.projections.base import ProjectionStore, SandboxQuery
from hutch.service.control import SandboxControl
from hutch.service.recorder import Recorder

log = logging.getLogger(__name__)


class Recovery:
    def __init__(self, store: ProjectionStore, recorder: Recorder, control: SandboxControl, lifecycle: SandboxLifecycle,
                 fleet: NodeFleet) -> None:
        self._store = store
        self._recorder = recorder
        self._control = control
        self._lifecycle = lifecycle
        self._fleet = fleet

    async def run(self) -> None:
        """Sandboxes whose processes died with an old server end through a lifecycle event;
        running ones that no event gives an owner are destroyed. A driver of several machines
        is first told where the log says this replica's sandboxes were placed."""
        live, _ = await self._store.list_sandboxes(SandboxQuery(live=True, limit=10**9))
        self._fleet.recall({sb.sandbox_id: sb.node for sb in live
                            if sb.node is not None and await self._control.replicas.mine(sb.sandbox_id)})
        alive = await self._lifecycle.alive()
        await self._destroy_unowned(alive - {sb.sandbox_id for sb in live})
        for sb in live:
            if not await self._control.replicas.mine(sb.sandbox_id):
                continue  # another replica's (api/replication.py takes over those of dead ones)
            if sb.sandbox_id in alive and sb.status is SandboxStatus.PAUSED and sb.paused_mode == PAUSE_FILESYSTEM:
                continue  # paused filesystem-only: nothing of it ran to be lost; its files are kept
            if sb.sandbox_id in alive and sb.status in (SandboxStatus.IDLE, SandboxStatus.RUNNING):
                for ex in await self._store.list_executions(sb.sandbox_id):
                    if not ex.status.is_final:
                        await self._recorder.command(
                            sb.sandbox_id,
                            FinishExecution(ex.execution_id, ExecutionStatus.FAILED, error="the server restarted while it ran"),
                        )
                if sb.spec.mode is Mode.ONESHOT:
                    await self._control.end(sb.sandbox_id,
                                            Terminate(reason="the server restarted during the oneshot command"))
                continue
            reason = "the server restarted and the sandbox's processes were gone"
            if sb.status is SandboxStatus.CREATING:
                await self._recorder.command(sb.sandbox_id, Fail(reason=reason))
            else:
                await self._recorder.command(sb.sandbox_id, Terminate(reason=reason))
            with contextlib.suppress(Exception):
                await self._lifecycle.destroy(sb.sandbox_id)

    async def _destroy_unowned(self, candidates: set[str]) -> None:
        """The driver runs them but the log says none is live: either the log has no record of
        them (made while another log was in use: a swapped events.db, a store rebuilt from a new
        log) or it says they ended. No one could reach them through the API: destroyed.
        Except a create under way on another live replica: the driver makes a sandbox before
        its Create is appended (service/provisioning.py), after its owner row is committed."""
        replicas = self._control.replicas
        for sandbox_id in sorted(candidates):
            sb = await self._store.get_sandbox(sandbox_id)
            if sb is None or not sb.status.is_final:
                owner = await replicas.owner(sandbox_id)
                if owner is not None and owner.alive and owner.replica_id != replicas.me:
                    log.info("sandbox %s is running and not logged yet: replica %s is creating it",
                             sandbox_id, owner.replica_id)
                    continue
            why = "the event log has no record of it" if sb is None else f"the event log says it is {sb.status.value}"
            log.warning("sandbox %s is running but %s; destroying it", sandbox_id, why)
            with contextlib.suppress(Exception):
                await self._lifecycle.destroy(sandbox_id)
