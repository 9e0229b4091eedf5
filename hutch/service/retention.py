"""Output retention: a sandbox's command output is kept while the sandbox lives and for
``HUTCH_OUTPUT_RETENTION`` (7 days by default) after it ended, then dropped.

Until it is dropped, output counts against its organization's storage quota
(service/quotas.py), so what an organization keeps is bounded by its quota and an
organization without one is bounded by what its live sandboxes write plus the window. The
sweep runs at start and then every tenth of the retention (at least every second, at most
every 10 minutes); a sandbox's output goes at the first sweep after its window, all its
streams at once (the output store's ``drop``). Which sandboxes have output is the output
store's to say (``kept``); whether and when one ended is the projection store's. A sandbox
the projection store does not know (yet) keeps its output: nothing is dropped unproven.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time

from hutch.core.output import OutputStreams
from hutch.projections.base import ProjectionStore

log = logging.getLogger(__name__)

DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600
MAX_SWEEP_SECONDS = 600.0


def _unix(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class OutputRetention:
    def __init__(self, store: ProjectionStore, outputs: OutputStreams,
                 retention_seconds: float = DEFAULT_RETENTION_SECONDS) -> None:
        self._store = store
        self._outputs = outputs
        self.seconds = retention_seconds

    @property
    def every(self) -> float:
        """Seconds between sweeps: a sandbox's output outlives its window by at most this."""
        return min(max(self.seconds / 10, 1.0), MAX_SWEEP_SECONDS)

    async def sweep(self, now: float | None = None) -> list[str]:
        """Drop the output of every sandbox that ended more than the retention ago; returns
        their ids."""
        cutoff = (time.time() if now is None else now) - self.seconds
        dropped = []
        for owner in await self._outputs.kept():
            sb = await self._store.get_sandbox(owner.sandbox_id)
            if sb is None or not sb.status.is_final or _unix(sb.updated_at) > cutoff:
                continue
            freed = await self._outputs.drop(owner)
            log.info("output of sandbox %s (%s) dropped: it ended at %s, %d bytes freed", owner.sandbox_id,
                     owner.org_id, sb.updated_at, freed)
            dropped.append(owner.sandbox_id)
        return dropped

    async def run(self) -> None:
        """Sweep now and every ``every`` seconds, for ever (a background task)."""
        while True:
            try:
                await self.sweep()
            except Exception:  # the next sweep tries again; a failed one leaves the rest as it was
                log.exception("dropping the output of ended sandboxes failed")
            await asyncio.sleep(self.every)
