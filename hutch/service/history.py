"""Time travel: a sandbox as of any of its events, folded from the log.

The log is the source of truth and ``core.lifecycle.evolve_sandbox`` is the fold the
projections use, so the state "as of" an event is that fold stopped at the event: no
snapshots of state are kept for it. ``GET /sandbox/{id}?asOf=evt_…|<ISO time>`` answers it,
``GET /sandbox/sandboxes/{id}/history`` gives the status after every event (the timeline),
and ``hutch sandbox history`` prints both.
"""

from __future__ import annotations

import datetime as dt

from hutch.core.errors import InvalidInput, NotFound
from hutch.core.eventlog.base import EventLog
from hutch.core.events import Event
from hutch.core.lifecycle import evolve_sandbox
from hutch.core.models import SandboxState
from hutch.service.reads import Reads


class History:
    def __init__(self, log: EventLog, reads: Reads) -> None:
        self._log, self._reads = log, reads

    async def timeline(self, sandbox_id: str) -> list[tuple[Event, SandboxState]]:
        """Every event of the sandbox with the sandbox as it was right after it."""
        await self._reads.require(sandbox_id, include_deleted=True)  # scoped: another organization's is a 404
        state: SandboxState | None = None
        out: list[tuple[Event, SandboxState]] = []
        for event in await self._log.read(0, sandbox_id=sandbox_id):
            state = evolve_sandbox(state, event)
            if state is not None and not state.unrecorded:  # a lifecycle:discarded before its create: no sandbox yet
                out.append((event, state))
        return out

    async def as_of(self, sandbox_id: str, ref: str) -> tuple[Event, SandboxState]:
        """The sandbox right after event ``ref`` (an event id), or after the last event at or
        before ``ref`` (an ISO 8601 time)."""
        return _as_of(await self.timeline(sandbox_id), sandbox_id, ref)


def _as_of(steps: list[tuple[Event, SandboxState]], sandbox_id: str, ref: str) -> tuple[Event, SandboxState]:
    if ref.startswith("evt_"):
        for event, state in steps:
            if event.event_id == ref:
                return event, state
        raise NotFound(f"asOf: {ref} is not an event of sandbox {sandbox_id}")
    try:
        when = dt.datetime.fromisoformat(ref.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"asOf: expected an event id (evt_…) or an ISO 8601 time, got {ref!r}",
                           field="asOf") from None
    if when.tzinfo is None:
        raise InvalidInput(f"asOf: {ref!r} needs a time zone, e.g. Z", field="asOf")
    found = None
    for event, state in steps:
        if dt.datetime.fromisoformat(event.created_at.replace("Z", "+00:00")) <= when:
            found = (event, state)
    if found is None:
        raise NotFound(f"asOf: sandbox {sandbox_id} did not exist yet at {ref}")
    return found
