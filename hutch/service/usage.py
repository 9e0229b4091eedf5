"""What sandboxes used and what the server counts: the usage report (service/stats.py) over
the projections and the driver, a live sandbox's usage so far, and the gauges /metrics shows."""

from __future__ import annotations

from typing import Any

from hutch.core.eventlog.base import EventLog
from hutch.core.models import SandboxStatus
from hutch.drivers.base import Metric, Usage
from hutch.drivers.roles import SandboxLifecycle, UsageReporting
from hutch.projections.base import ProjectionStore, SandboxQuery
from hutch.projections.runner import Projector
from hutch.service import stats
from hutch.service.reads import Reads


class UsageReports:
    def __init__(self, *, log: EventLog, store: ProjectionStore, projector: Projector, reads: Reads,
                 lifecycle: SandboxLifecycle, usage: UsageReporting) -> None:
        self._log, self._store, self._projector, self._reads = log, store, projector, reads
        self._lifecycle, self._usage = lifecycle, usage

    async def report(self, start: str | None, end: str | None, *, scope: SandboxQuery) -> dict[str, Any]:
        """Executions, jobs and resources used between ``start`` and ``end`` in ``scope``."""
        return await stats.usage(self._store, self._usage, start, end, scope=scope)

    async def so_far(self, sandbox_id: str) -> Usage:
        """What a live sandbox has used so far, from the driver (an ended one's is in its events)."""
        return await self._usage.usage(sandbox_id)

    @property
    def driver_name(self) -> str:
        return self._lifecycle.name

    async def now(self, sandbox_id: str) -> Usage:
        """What a live sandbox holds now, its disk included (E2B's metrics; may walk its files)."""
        return await self._usage.usage(sandbox_id, disk=True)

    async def counts(self, *, whole_server: bool) -> list[Metric]:
        """Sandboxes by status (the caller's organization's, or with ``whole_server`` every
        one), how far the log and the
        projections are, the events the projections stepped over, and which driver runs."""
        found: list[Metric] = []
        for status in SandboxStatus:
            query = SandboxQuery(status=status.value, limit=1, include_deleted=True)
            _, total = await self._store.list_sandboxes(query if whole_server else self._reads.scoped(query))
            found.append(Metric("hutch_sandboxes", total, "gauge", "sandboxes by status", {"status": status.value}))
        found.append(Metric("hutch_event_log_position", await self._log.last_position(), "gauge",
                            "position of the newest event in the log"))
        found.append(Metric("hutch_projection_position", self._projector.position, "gauge",
                            "position of the newest event the projections hold"))
        _, skipped = await self._store.skipped(limit=0)
        found.append(Metric("hutch_projection_skipped_events", skipped, "gauge",
                            "events the projection store refused on their own and stepped over (see the log's errors)"))
        found.append(Metric("hutch_driver_info", 1, "gauge", "the driver this server runs sandboxes with",
                            {"driver": self._lifecycle.name}))
        return found

    def driver_metrics(self) -> list[Metric]:
        """The driver's own gauges (warm pools: the server's, not any one tenant's)."""
        return self._usage.metrics()
