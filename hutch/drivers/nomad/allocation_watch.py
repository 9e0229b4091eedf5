"""The nomad driver's watch of its allocations (a mixin of
:class:`drivers.nomad.driver.NomadDriver`): Nomad's blocking queries, followed for as long as
the driver runs. An allocation of a live sandbox that fails, is lost, is OOM-killed or
completes on its own ends the sandbox, reported through ``Driver.set_listener`` so the engine
can end it with a lifecycle event; a warm pool's idle allocation that dies is replaced.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from hutch.core.errors import HutchError
from hutch.drivers.nomad.agents import ExecAgents
from hutch.drivers.nomad.client import NomadClient, NomadNotFound
from hutch.drivers.nomad.executions import RunningCommand
from hutch.drivers.nomad.jobs import LIVE
from hutch.drivers.nomad.placement import ENDED, NODE_GONE, alloc_reason
from hutch.drivers.nomad.pools import PoolEntry
from hutch.drivers.nomad.state import NomadSandbox, StateFiles
from hutch.drivers.nomad.usage import NowReadings

log = logging.getLogger(__name__)

# An allocation Nomad no longer has (its job purged): ended, with nothing left to stop.
PURGED: dict[str, Any] = {"ClientStatus": "complete", "DesiredStatus": "stop"}


class AllocationWatch:
    _client: NomadClient
    _agents: ExecAgents
    _states: StateFiles
    _readings: NowReadings
    _sandboxes: dict[str, NomadSandbox]
    _executions: dict[str, RunningCommand]
    _destroying: set[str]
    _paused: set[str]
    _pool: dict[str, deque[PoolEntry]]
    _refill_wakeup: asyncio.Event

    if TYPE_CHECKING:  # provided by NomadDriver and its other mixins; a stub here would shadow them in the MRO
        def _spawn(self, coro: Any, name: str) -> None: ...
        def _wake(self, sandbox_id: str) -> None: ...
        def _retire(self, entry: PoolEntry, *, alloc_id: str | None = None, node_lost: bool = False) -> None: ...
        async def _stop_job(self, job_id: str, alloc_id: str | None, *, node_lost: bool = False) -> None: ...
        async def report_ended(self, sandbox_id: str, reason: str, *, failed: bool) -> None: ...

    async def _watch(self) -> None:
        """Follow allocations; a live sandbox's allocation that ends on its own is reported."""
        index = 0
        while True:
            try:
                allocs, new_index = await self._client.blocking_get(
                    "/v1/allocations", index, "30s", prefix="", task_states="true")
            except HutchError as err:
                log.warning("nomad watch: %s", err.message)
                await asyncio.sleep(1)
                continue
            index = new_index if new_index >= index else 0
            by_alloc = {a["ID"]: a for a in allocs or [] if str(a.get("JobID", "")).startswith("hutch-")}
            await self._ask_for_missing(by_alloc)
            for sb in list(self._sandboxes.values()):
                alloc = by_alloc.get(sb.alloc_id)
                if alloc is None or sb.id in self._destroying:
                    continue
                if alloc is PURGED:
                    await self._lost(sb, "its Nomad job was purged outside hutch", failed=True)
                    continue
                status = alloc.get("ClientStatus")
                if status in ENDED or status in NODE_GONE or alloc.get("DesiredStatus") in ("stop", "evict"):
                    await self._lost(sb, alloc_reason(alloc), failed=status != "complete",
                                     node_lost=status in NODE_GONE)
            for runtime, pool in self._pool.items():
                # Stopping counts as dead: a create must not claim a job being stopped under it.
                dead = [(e, a) for e in pool if (a := by_alloc.get(e.alloc_id)) is not None
                        and (a.get("ClientStatus") not in LIVE or a.get("DesiredStatus") in ("stop", "evict"))]
                for entry, alloc in dead:
                    pool.remove(entry)
                    gone = alloc.get("ClientStatus") in NODE_GONE  # stopped, not purged (placement.stop_job)
                    stopping = alloc.get("ClientStatus") in LIVE  # its task waited for before the purge
                    self._retire(entry, alloc_id=entry.alloc_id if gone or stopping else None, node_lost=gone)
                if dead:
                    log.warning("warm pool %s: %d idle allocation(s) died; refilling", runtime, len(dead))
                    self._refill_wakeup.set()

    async def _ask_for_missing(self, by_alloc: dict[str, Any]) -> None:
        """A job purged at once (``nomad job stop -purge``, a sweep that does not wait for its
        task) takes its allocation out of the list with no stopped state in between: a sandbox
        or pool entry whose allocation the list lacks is asked for (rare: one just placed, as
        the list may predate it, or one gone), and one Nomad no longer has is marked
        ``PURGED`` in ``by_alloc``. It used to stay: a pool entry for good, handed to the next
        create, and a sandbox never reported ended."""
        known = [sb.alloc_id for sb in self._sandboxes.values() if sb.id not in self._destroying]
        known += [e.alloc_id for pool in self._pool.values() for e in pool]
        for alloc_id in dict.fromkeys(a for a in known if a not in by_alloc):
            try:
                by_alloc[alloc_id] = await self._client.allocation(alloc_id)
            except NomadNotFound:
                by_alloc[alloc_id] = PURGED
            except HutchError as err:  # Nomad briefly away: the next round asks again
                log.warning("nomad watch: reading allocation %s: %s", alloc_id, err.message)

    async def _lost(self, sb: NomadSandbox, reason: str, *, failed: bool, node_lost: bool = False) -> None:
        self._sandboxes.pop(sb.id, None)
        self._states.forget(sb.id)
        self._readings.forget(sb.id)
        for ex in self._executions.values():
            if ex.sandbox_id == sb.id:
                ex.stop.set()
        self._paused.discard(sb.id)
        self._wake(sb.id)
        log.warning("sandbox %s: its allocation %s ended: %s", sb.id, sb.alloc_id, reason)
        self._spawn(self._agents.drop(sb.id), f"exec-agent-drop-{sb.id}")
        self._spawn(self._stop_job(sb.job_id, sb.alloc_id, node_lost=node_lost), f"nomad-reap-{sb.job_id}")
        await self.report_ended(sb.id, f"the sandbox's Nomad allocation ended: {reason}", failed=failed)
