"""The recorder: THE one way a command turns into appended events.

Under the stream's lock: read the state, ``decide`` (``core.lifecycle`` for sandboxes, their
creation included; ``core.snapshots`` for snapshots; ``core.tenancy`` for an organization's
records, through ``record``), check that every event survives an encode/decode round trip,
append, and wait until the projector has applied the append (read-your-writes). Locks are per
stream (a sandbox, a snapshot, an organization's tenancy records): writes to one stream are
serialised on this server. Nothing appends but these methods (``_append`` is theirs).

What a sandbox's events take in the log counts against its organization's storage quota
(the log is kept for ever): ``meter`` (the engine's ``Quotas.admit_events``) is told the
bytes of every sandbox append before it is written, and refuses a create or an env change,
whose size the tenant chooses, that would pass the quota; the rest (a command started, a
status) is the server's to record, counted but never refused.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

import attrs

from hutch.core import ids, phases, snapshots
from hutch.core.errors import InvalidInput, ProjectionUnavailable
from hutch.core.eventlog.base import EventLog
from hutch.core.events import (
    Encoded,
    Event,
    EventData,
    SandboxCreated,
    SnapshotCreated,
    decode,
    encoded,
)
from hutch.core.lifecycle import (
    ChangeEnv,
    Command,
    Create,
    Discard,
    StartExecution,
    decide,
    decide_in_turn,
)
from hutch.core.models import SandboxState
from hutch.core.replicas import Tenant
from hutch.projections.base import ProjectionStore
from hutch.projections.runner import Projector
from hutch.service.reads import Reads

C = TypeVar("C", bound=Command)


def now_iso() -> str:
    return iso(dt.datetime.now(dt.UTC))


def iso(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _checked(event: Event) -> Encoded:
    """``event`` encoded as the log will write it, once it reads back as itself: an event
    the projector cannot read back would wedge every reader of the log, so it is refused
    before it is written. The log, and the quota's size, take these same bytes."""
    try:
        record = encoded(event)
        same = decode(json.loads(record.record)) == event
    except Exception as err:  # unencodable (bytes, an object) or unreadable: the same refusal
        raise InvalidInput(f"{event.type}: event does not survive serialisation ({err}); refusing to log it") from err
    if not same:
        raise InvalidInput(f"{event.type}: event does not survive serialisation; refusing to log it")
    return record


class Recorder:
    def __init__(self, event_log: EventLog, store: ProjectionStore, projector: Projector, reads: Reads) -> None:
        self._log = event_log
        self._store = store
        self._projector = projector
        self._reads = reads
        self._locks: dict[str, asyncio.Lock] = {}
        self._owners: dict[str, tuple[str | None, str | None]] = {}  # stream id -> (org, project)
        # (org, bytes, refuse): awaited before a sandbox's events are appended (see above).
        self.meter: Callable[[str, int, bool], Awaitable[None]] | None = None

    def lock(self, stream: str) -> asyncio.Lock:
        return self._locks.setdefault(stream, asyncio.Lock())

    async def record(self, stream: str, decide: Callable[[], Iterable[EventData]]) -> list[Event]:
        """Append the events ``decide()`` returns about ``stream`` (a tenancy record's
        organization), deciding and appending under the stream's lock: checks such as a
        name's uniqueness hold against concurrent requests to this server."""
        async with self.lock(stream):
            return await self._append(stream, decide())

    async def command(self, sandbox_id: str, command: Command, *,
                      durable: Callable[[int], None] | None = None, minted: bool = False) -> list[Event]:
        """Decide ``command`` against the sandbox as it is and append what it produces.
        ``durable`` is called with the last position once the events are in the log, before
        they are projected. A ``Create`` is decided against whatever the store holds under
        the id, in any organization (nothing, or ``decide`` refuses it); ``minted``: the
        caller made the id just now (``ids.new_id``: 80 random bits), so nothing is under
        it and the store is not asked (a PostgreSQL round trip per create)."""
        if not isinstance(command, Create):
            return await self.command_many(sandbox_id, (command,), durable=durable)
        what = " (Create)" if phases.ON else ""  # a span's name, built only for a bench
        t0 = phases.start()
        async with self.lock(sandbox_id):
            phases.end("record: lock wait", t0)
            with phases.span("record: state read"):
                sb: SandboxState | None = None if minted else await self._store.get_sandbox(sandbox_id)
            self._reads.own(sandbox_id)  # before the append: its creation is folded as it lands
            try:
                with phases.span("record: decide"):
                    events = decide(sb, command)
                return await self._append(sandbox_id, events, durable=durable, what=what, metered=True)
            except BaseException:
                self._reads.disown(sandbox_id)
                raise

    async def command_many(self, sandbox_id: str, commands: Sequence[Command], *,
                           durable: Callable[[int], None] | None = None, minted: bool = False) -> list[Event]:
        """Decide ``commands`` in turn (``core.lifecycle.decide_in_turn``) against the sandbox
        as it is and append what they produce as ONE append: all of it durable, or none of it
        written. A create's ``Start`` and its command's ``StartExecution`` go together so that
        the way to the command's launch awaits one append, not two (on production, each is a
        Produce and a projection transaction). A ``Create`` may come first: a sandbox the driver
        made before anything was recorded (service/provisioning.py) is recorded created and
        started at once; ``minted`` as for ``command``."""
        what = f" ({'+'.join(type(c).__name__ for c in commands)})" if phases.ON else ""
        creates = bool(commands) and isinstance(commands[0], Create)  # the sandbox's first events
        t0 = phases.start()
        async with self.lock(sandbox_id):
            phases.end("record: lock wait", t0)
            with phases.span("record: state read"):
                sb = (None if minted else await self._store.get_sandbox(sandbox_id)) if creates \
                    else await self._reads.require(sandbox_id)
            if creates:
                self._reads.own(sandbox_id)  # as ``command`` does for a Create
            try:
                with phases.span("record: decide"):
                    events = decide_in_turn(sb, commands, sandbox_id)
                # Refused past the quota when any of them is the tenant's to size (its spec, env, argv).
                refusable = creates or any(isinstance(c, ChangeEnv | StartExecution) for c in commands)
                return await self._append(sandbox_id, events, durable=durable, what=what, metered=refusable or None)
            except BaseException:
                if creates:
                    self._reads.disown(sandbox_id)
                raise

    async def discard(self, sandbox_id: str, reason: str, tenant: Tenant | None = None) -> list[Event]:
        """Record that a sandbox no event records (its replica was lost before appending its
        create) is ended, before it is (service/takeover.py): a create of it that lands later
        is then folded ``failed`` with ``reason``, never live (core.lifecycle). Decided against
        the store as it is: a create that landed meanwhile is failed by it. ``tenant``: whose it
        is (its owner row's), for the envelope where no create says; None (a row from before
        it was kept): no organization, as before."""
        async with self.lock(sandbox_id):
            sb = await self._store.get_sandbox(sandbox_id)
            events = decide(sb, Discard(reason))
            owner = (sb.spec.org_id, sb.spec.project_id) if sb is not None else \
                (tenant.org_id, tenant.project_id) if tenant is not None else (None, None)
            try:
                return await self._append(sandbox_id, events, owner=owner)
            finally:
                self._owners.pop(sandbox_id, None)  # not remembered: a create landing late says whose it is

    async def act(self, sandbox_id: str, command_for: Callable[[SandboxState], C],
                  effect: Callable[[C], Awaitable[object]]) -> None:
        """A command with an effect outside the log (the driver pauses, checkpoints...): decided
        first, so a refusal touches nothing; the effect runs only when there is something to
        record, and the events are appended once it succeeded. Deleted sandboxes refuse."""
        async with self.lock(sandbox_id):
            sb = await self._reads.require(sandbox_id, include_deleted=False)
            command = command_for(sb)
            events = decide(sb, command)
            if events:
                await effect(command)
                await self._append(sandbox_id, events, metered=None)

    async def snapshot(self, snapshot_id: str, command: snapshots.SnapshotCommand) -> list[Event]:
        """Decide a snapshot command against the snapshot as stored and append what it produces."""
        async with self.lock(snapshot_id):
            snap = await self._store.get_snapshot(snapshot_id)
            return await self._append(snapshot_id, snapshots.decide(snapshot_id, snap, command))

    async def _append(self, stream: str, payloads: Iterable[EventData], *,
                     durable: Callable[[int], None] | None = None, metered: bool | None = False,
                     what: str = "", owner: tuple[str | None, str | None] | None = None) -> list[Event]:
        """Append events about ``stream``; the caller holds the stream's lock. ``durable``:
        what may start once the events are recorded, while the projector applies them.
        ``metered``: a sandbox's events, counted (None) or refused past the quota (True).
        ``owner``: their organization and project, where the caller knows better (``discard``)."""
        at = now_iso()
        payloads = list(payloads)
        if not payloads:
            return []
        org, project = owner if owner is not None else await self._owner(stream, payloads[0])
        events = [Event(ids.new_id("event"), stream, at, p, org=org, project=project) for p in payloads]
        with phases.span("record: round-trip check"):
            records = [_checked(e) for e in events]
        if metered is not False and self.meter is not None and org is not None:
            with phases.span("record: quota meter"):
                await self.meter(org, sum(r.size for r in records), bool(metered))
        t0 = phases.start()
        positions = await self._log.append(records)
        phases.end("record: append" + what, t0)
        if durable is not None and events:
            durable(positions[-1])
        t0 = phases.start()
        await self._projector.wait_for(positions[-1], what=what)
        phases.end("record: projection wait" + what, t0)
        return [attrs.evolve(e, position=p) for e, p in zip(events, positions, strict=True)]

    async def settled(self, position: int) -> None:
        """Return once the projections show ``position``, however long the store is away
        (what follows must be decided against it); raises only if the projector stopped."""
        while True:
            try:
                await self._projector.wait_for(position)
                return
            except ProjectionUnavailable:
                if self._projector.failure is not None:
                    raise

    def forget(self, stream: str) -> None:
        """An ended sandbox's lock and owner entry go: kept, both grew with every sandbox the
        server ever had (bench/soak.py: +71 MiB over 26,000 sandboxes). A later command on it
        makes them again."""
        lock = self._locks.get(stream)
        if lock is not None and not lock.locked():
            del self._locks[stream]
        self._owners.pop(stream, None)

    async def _owner(self, stream: str, first: object) -> tuple[str | None, str | None]:
        """The organization and project an event about ``stream`` belongs to (for the envelope:
        audit records name them). Fixed for a stream's life, so remembered."""
        if isinstance(first, SandboxCreated):
            found: tuple[str | None, str | None] = (first.spec.org_id, first.spec.project_id)
        elif isinstance(first, SnapshotCreated):
            found = (first.org_id, first.project_id)
        elif stream.startswith("org_"):
            found = (stream, None)
        elif stream in self._owners:
            return self._owners[stream]
        elif stream.startswith("snp_"):
            snap = await self._store.get_snapshot(stream)
            found = (snap.org_id, snap.project_id) if snap else (None, None)
        else:
            sb = await self._store.get_sandbox(stream)
            found = (sb.spec.org_id, sb.spec.project_id) if sb else (None, None)
        self._owners[stream] = found
        return found
