"""Time travel: a sandbox as of any of its events, folded from the log.

The log is the source of truth and ``core.lifecycle.evolve_sandbox`` is the fold the
projections use, so the state "as of" an event is that fold stopped at the event: no
snapshots of state are kept for it. ``GET /sandbox/{id}?asOf=evt_…|<ISO time>`` answers it,
``GET /sandbox/sandboxes/{id}/history`` gives the status after every event (the timeline),
and ``hutch sandbox history`` prints both.

``as_of`` at or past the sandbox's last event answers from the projection store once that has
applied the event (two reads of one event: ``_present``). Before it, it reads the sandbox's
events in pages (``FIRST_PAGE``, each twice the last) only as far as the point asked: an
event id and a time both carry a time (ids are time-sortable, core/ids.py), and the read stops
at the first event made ``CLOCK_SLACK`` past it. Events are in log order, not strictly in time
order (replicas' clocks, an append held up), hence the slack. Before, every request read the sandbox's whole history, and a tenant could make each
one cost as much as its longest-lived sandbox had events.

The timeline comes in pages (``timeline``'s ``after`` and ``limit``: at most ``MAX_STEPS`` steps
an answer), and every fold gives the event loop a turn each ``YIELD_EVERY`` events, its log reads
at most ``MAX_PAGE`` events each. Before, the timeline of a sandbox with many events was one
answer (6,000 events: 1.7 MB), folded in one go on the loop (0.23 s during which no other
tenant's request was served, and it grew with the events: a tenant's executes make two each).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator

from hutch.core import ids
from hutch.core.errors import InvalidInput, NotFound
from hutch.core.eventlog.base import EventLog
from hutch.core.events import Event
from hutch.core.lifecycle import evolve_sandbox
from hutch.core.models import SandboxState
from hutch.service.reads import Reads

FIRST_PAGE = 64  # events read at first; each page after is twice the last
MAX_PAGE = 4096  # events read at once, at most
YIELD_EVERY = 256  # events folded between the loop's turns for other requests
STEPS = 1000  # the timeline's steps an answer, unless asked
MAX_STEPS = 10_000
CLOCK_SLACK = dt.timedelta(minutes=10)  # an event appended this much later than made (or another clock) is still found


class History:
    def __init__(self, log: EventLog, reads: Reads) -> None:
        self._log, self._reads = log, reads

    async def timeline(self, sandbox_id: str, *, after: int = 0,
                       limit: int = STEPS) -> tuple[list[tuple[Event, SandboxState]], int | None]:
        """The sandbox's events after log position ``after``, at most ``limit``, each with the
        sandbox as it was right after it; and the position to ask ``after`` for the next page
        (None: no more). A page is folded from the sandbox's first event: a later page costs
        as much as the events before it."""
        if isinstance(limit, bool) or not 1 <= limit <= MAX_STEPS:
            raise InvalidInput(f"limit: expected a whole number from 1 to {MAX_STEPS}, got {limit!r}", field="limit")
        if isinstance(after, bool) or after < 0:
            raise InvalidInput(f"after: expected a log position (a whole number, 0 or more), got {after!r}",
                               field="after")
        await self._reads.require(sandbox_id, include_deleted=True)  # scoped: another organization's is a 404
        out: list[tuple[Event, SandboxState]] = []
        async for event, state in self._fold(sandbox_id, None):
            if (event.position or 0) <= after:
                continue
            if len(out) == limit:
                return out, out[-1][0].position
            out.append((event, state))
        return out, None

    async def as_of(self, sandbox_id: str, ref: str) -> tuple[Event, SandboxState]:
        """The sandbox right after event ``ref`` (an event id), or after the last event at or
        before ``ref`` (an ISO 8601 time)."""
        await self._reads.require(sandbox_id, include_deleted=True)  # scoped: another organization's is a 404
        now = dt.datetime.now(dt.UTC)
        if ref.startswith("evt_"):
            made = ids.millis("event", ref)
            if made is None or made > (now + CLOCK_SLACK).timestamp() * 1000:  # none made yet: nothing to read
                raise NotFound(f"asOf: {ref} is not an event of sandbox {sandbox_id}")
            present = await self._present(sandbox_id)
            if present is not None and present[0].event_id == ref:
                return present
            async for event, state in self._fold(sandbox_id, _at(made) + CLOCK_SLACK):
                if event.event_id == ref:
                    return event, state
            raise NotFound(f"asOf: {ref} is not an event of sandbox {sandbox_id}")
        when = _time(ref)
        present = await self._present(sandbox_id)
        if present is not None and _created(present[0]) <= when:
            return present
        found = None
        async for event, state in self._fold(sandbox_id, when + CLOCK_SLACK if when < now else None):
            if _created(event) <= when:
                found = (event, state)
        if found is None:
            raise NotFound(f"asOf: sandbox {sandbox_id} did not exist yet at {ref}")
        return found

    async def _present(self, sandbox_id: str) -> tuple[Event, SandboxState] | None:
        """The sandbox's last event and its state now, from the projection store where that
        has applied the event and nothing of the sandbox came after it; else None (fold)."""
        last = await self._log.read(0, sandbox_id=sandbox_id, limit=1, reverse=True)
        if not last or last[0].position is None:
            return None
        store = self._reads.store
        if await store.position() < last[0].position:
            return None  # behind the log: the fold answers
        state = await store.get_sandbox(sandbox_id)
        again = await self._log.read(0, sandbox_id=sandbox_id, limit=1, reverse=True)
        if state is None or [e.position for e in again] != [last[0].position]:
            return None  # another event meanwhile: the state may be past this one
        return last[0], state

    async def _fold(self, sandbox_id: str, until: dt.datetime | None) -> AsyncIterator[tuple[Event, SandboxState]]:
        """The sandbox's events with its state right after each, up to the first made after
        ``until`` (None: all of them), read in pages."""
        state: SandboxState | None = None
        after, page, folded = 0, FIRST_PAGE, 0
        while True:
            events = await self._log.read(after, sandbox_id=sandbox_id, limit=page)
            for event in events:
                if until is not None and _created(event) > until:
                    return
                state = evolve_sandbox(state, event)
                if state is not None and not state.unrecorded:  # a lifecycle:discarded before its create: no sandbox yet
                    yield event, state
                folded += 1
                if folded % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # other requests' turn: the fold is pure Python
            if len(events) < page or events[-1].position is None:
                return
            after, page = events[-1].position, min(page * 2, MAX_PAGE)


def _at(millis: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(millis / 1000, dt.UTC)


def _created(event: Event) -> dt.datetime:
    return _parse(event.created_at) or dt.datetime.min.replace(tzinfo=dt.UTC)  # unreadable: the oldest


def _parse(text: str) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)


def _time(ref: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(ref.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"asOf: expected an event id (evt_…) or an ISO 8601 time, got {ref!r}",
                           field="asOf") from None
    if when.tzinfo is None:
        raise InvalidInput(f"asOf: {ref!r} needs a time zone, e.g. Z", field="asOf")
    return when
