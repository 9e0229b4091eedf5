"""Organization quotas, checked before anything is recorded (so a refusal leaves nothing).

Live sandboxes (not final) count against ``sandboxes`` and, by what they asked for, against
``memory_bytes`` and ``cpu_millis``. ``snapshot_bytes`` is the organization's storage quota:
ready snapshots (their files' bytes and their records' lists of them), its sandboxes' disk checkpoints (their bytes on the host, as the
driver reports them), the archives of snapshot builds not finalized yet, uploads in
flight counted from their first byte (on this replica; stored ones on every replica), and
its commands' output as the output store keeps it (running commands' from their first byte;
kept until service/retention.py drops an ended sandbox's), and what its sandboxes' events take
in the event log (``event_bytes``: kept for ever, deleted sandboxes' too; a create or an env
change that would pass the quota is refused, ``admit_events``). An organization with no room left
runs no command (``output_budget``), and the commands it runs share what is left (on this
replica): past it their output is cut, as past the per-stream cap. A quota set or changed while
they run reaches them (``requota``, on every replica as the change is projected). What else it stores while
they run (a snapshot, a checkpoint, an upload) comes out of that share too (``charge``).
A sandbox that gives no memory or CPU has the server's defaults filled into its spec before it
is recorded (service/defaults.py), so it counts what its driver enforces; one recorded before that
counts the same defaults, so an organization cannot slip past a quota by asking for nothing.

An organization with a sandbox quota (``limits_sandboxes``) has its creates hold its lock from
the check to the append (applied, so the next check counts it): two creates cannot both take
the last slot, on one replica (the recorder's lock) nor on two (``Replicas.serialised``: a
PostgreSQL advisory lock when replicas share the store). An organization without one takes no lock: held until the
event was applied, it made that organization's creates one at a time (bench/soak.py, 200
clients for 2 minutes: create p50 15.1 s, execute 0.1 s; without the lock, create 3.0 s).
The trade-off: creates already past that branch when an organization's first sandbox quota
is set are not counted against it, so they can take it over the limit once (by at most the
creates in flight then).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Callable

from hutch.core.blobs import BlobNotFound, BlobStore
from hutch.core.errors import QuotaExceeded
from hutch.core.models import SandboxSpec, SnapshotState
from hutch.core.output import OutputStreams
from hutch.core.quantities import format_bytes
from hutch.core.snapshots import record_bytes
from hutch.core.tenancy import QuotaRecord
from hutch.drivers.roles import Checkpointing
from hutch.projections.base import SandboxQuery, SnapshotQuery
from hutch.service.defaults import SandboxDefaults
from hutch.service.output import OutputBudget
from hutch.service.reads import Reads

STORAGE = "snapshot_bytes"  # the quota that bounds every byte an organization keeps


class Quotas:
    def __init__(self, reads: Reads, defaults: SandboxDefaults | None = None, *, checkpointing: Checkpointing | None = None,
                 blobs: BlobStore | None = None, outputs: OutputStreams | None = None) -> None:
        self._reads = reads  # the store, and the organizations (their quotas) once the app sets them
        self.defaults = defaults or SandboxDefaults()
        self._checkpointing = checkpointing  # checkpoints' sizes
        self._blobs = blobs  # unfinalized builds' uploads
        self._outputs = outputs  # commands' output
        self._uploading: dict[str, dict[str, int]] = {}  # org -> snapshot -> bytes received so far
        self._output_budgets: dict[str, OutputBudget] = {}  # org -> what its running commands may keep
        self._records: dict[str, int] = {}  # snapshot -> its record's bytes
        # One holder at a time of a key, on this replica and across replicas (the engine sets it:
        # the recorder's lock and ``Replicas.serialised``); None: nothing to serialise with.
        self.serialise: Callable[[str], contextlib.AbstractAsyncContextManager[None]] | None = None

    @contextlib.asynccontextmanager
    async def storage_held(self, org_id: str) -> AsyncIterator[None]:
        """Held from a storage check to the record it allows (a snapshot taken, a build
        finalized), so that two of them cannot both take the last room: ten snapshots asked at
        once under a quota that holds one were all taken before. Only organizations with a
        storage quota take it (as ``limits_sandboxes`` for creates)."""
        if self.of(org_id).snapshot_bytes is None or self.serialise is None:
            yield
            return
        async with self.serialise(f"storage:{org_id}"):
            yield

    def of(self, org_id: str) -> QuotaRecord:
        tenants = self._reads.tenants
        org = tenants.directory.orgs.get(org_id) if tenants is not None else None
        return org.quota if org is not None else QuotaRecord()

    def limits_sandboxes(self, org_id: str) -> bool:
        """Whether the organization's quota limits live sandboxes (their count, memory or CPU)."""
        quota = self.of(org_id)
        return quota.sandboxes is not None or quota.memory_bytes is not None or quota.cpu_millis is not None

    async def usage(self, org_id: str) -> dict[str, int]:
        live, count = await self._reads.store.list_sandboxes(SandboxQuery(org_id=org_id, live=True, limit=10**9))
        snaps, _ = await self._reads.store.list_snapshots(SnapshotQuery(org_id=org_id, limit=10**9))
        checkpoints = 0
        if self._checkpointing is not None:
            for sb in live:
                if sb.checkpoints:
                    checkpoints += sum((await self._checkpointing.checkpoint_sizes(sb.sandbox_id)).values())
        uploads = await self._pending_uploads(org_id)
        output = await self._outputs.stored(org_id) if self._outputs is not None else 0
        events = await self._reads.store.event_bytes(org_id)
        snapshot_bytes = sum(s.size_bytes + self._record_of(s) for s in snaps)
        return {
            "sandboxes": count,
            "memory_bytes": sum(self.defaults.memory_of(sb.spec.resources) for sb in live),
            "cpu_millis": sum(self.defaults.cpu_of(sb.spec.resources) for sb in live),
            "snapshot_bytes": snapshot_bytes,
            "checkpoint_bytes": checkpoints,
            "upload_bytes": sum(uploads.values()),
            "output_bytes": output,
            "event_bytes": events,
            "storage_bytes": snapshot_bytes + checkpoints + sum(uploads.values()) + output + events,
        }

    def _record_of(self, snap: SnapshotState) -> int:
        """Its record's bytes (``core.snapshots.record_bytes``), reckoned once: a ready
        snapshot's files never change."""
        found = self._records.get(snap.snapshot_id)
        if found is None:
            found = self._records[snap.snapshot_id] = record_bytes(snap.files)
        return found

    async def _pending_uploads(self, org_id: str) -> dict[str, int]:
        """Bytes of each build not finalized yet: stored, or (larger) still arriving here."""
        out = dict(self._uploading.get(org_id, {}))
        if self._blobs is None:
            return out
        building, _ = await self._reads.store.list_snapshots(
            SnapshotQuery(org_id=org_id, ready_only=False, building_only=True, limit=10**9))
        for snap in building:
            try:
                size = (await self._blobs.stat(f"snapshots/{snap.snapshot_id}.tar.gz")).size
            except BlobNotFound:
                continue
            out[snap.snapshot_id] = max(out.get(snap.snapshot_id, 0), size)
        return out

    async def storage_room(self, org_id: str, *, replacing: str | None = None, allow_full: bool = False) -> int | None:
        """Bytes the organization may still store (None: no storage quota); refuses with
        QUOTA_EXCEEDED when there is none left (``allow_full``: only when it stores more than
        its quota). ``replacing``: a build whose earlier upload a new one replaces (not
        counted twice)."""
        limit = self.of(org_id).snapshot_bytes
        if limit is None:
            return None
        used = await self.usage(org_id)
        stored = used["storage_bytes"]
        if replacing is not None:
            stored -= (await self._pending_uploads(org_id)).get(replacing, 0)
        if stored > limit or (stored == limit and not allow_full):
            raise self._storage_full(org_id, limit, stored, "nothing more can be stored")
        return limit - stored

    def charge(self, org_id: str, size: int) -> None:
        """Bytes stored for the organization besides output (a snapshot, a checkpoint, an
        upload's chunk) come out of the room its running commands were given as they started
        (``output_budget``), so that the two do not each fill it; the next command's start
        counts the room afresh."""
        budget = self._output_budgets.get(org_id)
        if budget is not None and size > 0:
            budget.lower(size)

    def _storage_full(self, org_id: str, limit: int, used: int, what: str) -> QuotaExceeded:
        return QuotaExceeded(
            f"quota snapshot_bytes: organization {org_id} may store {format_bytes(limit)} (snapshots, checkpoints, "
            f"uploads not finalized, command output and its sandboxes' records in the event log); it stores {format_bytes(used)}, and {what}", quota=STORAGE,
            limit=limit, used=used)

    def past_room(self, org_id: str, room: int, size: int) -> QuotaExceeded:
        """The refusal of what was found, as it was read, to take ``size`` bytes of storage
        where ``room`` was left (a snapshot's export or archive, stopped there)."""
        limit = self.of(org_id).snapshot_bytes or 0
        return self._storage_full(org_id, limit, limit - room, f"this snapshot passed the {format_bytes(room)} "
                                  f"left at {format_bytes(size)} (the rest of it was not read)")

    async def admit_events(self, org_id: str, size: int, refuse: bool) -> None:
        """``size`` bytes of a sandbox's events about to be appended (the recorder's meter).
        ``refuse``: a create or an env change, refused with QUOTA_EXCEEDED (before anything is
        recorded) when they would pass the quota. Either way they come out of the running
        commands' room (``charge``), as they are kept for ever."""
        limit = self.of(org_id).snapshot_bytes
        if refuse and limit is not None:
            stored = (await self.usage(org_id))["storage_bytes"]
            if stored + size > limit:
                raise self._storage_full(org_id, limit, stored, (
                    f"this would write {format_bytes(size)} more to the event log, which keeps a sandbox's "
                    "env, metadata and every env change for ever: delete snapshots or checkpoints, or ask "
                    "the operator for a larger quota"))
        self.charge(org_id, size)

    async def output_budget(self, org_id: str, *, refuse_full: bool) -> OutputBudget:
        """What the organization's commands running here may still keep of their output (no
        limit when it has no storage quota, until one is set: ``requota``), counted afresh
        now. ``refuse_full``: QUOTA_EXCEEDED when there is no room left (an execute, a job); a
        create's command runs and keeps what fits."""
        budget = self._output_budgets.setdefault(org_id, OutputBudget())
        limit = self.of(org_id).snapshot_bytes
        if limit is None:
            budget.refill(None, budget.spent)
            return budget
        spent = budget.spent
        stored = (await self.usage(org_id))["storage_bytes"]
        budget.refill(limit - stored, spent)
        if refuse_full and stored >= limit:
            raise self._storage_full(org_id, limit, stored, "no command runs until it stores less (its output "
                                     "could not be kept): delete snapshots or checkpoints, or end sandboxes, whose "
                                     "output is dropped HUTCH_OUTPUT_RETENTION after they end")
        return budget

    async def requota(self, org_id: str) -> None:
        """The organization's quota changed: the commands running here keep to the new one
        from now on (their budget counted afresh, or unlimited when the quota went)."""
        budget = self._output_budgets.get(org_id)
        if budget is None:
            return
        limit = self.of(org_id).snapshot_bytes
        spent = budget.spent
        if limit is None:
            budget.refill(None, spent)
            return
        budget.refill(limit - (await self.usage(org_id))["storage_bytes"], spent)

    async def metered(self, org_id: str, snapshot_id: str, chunks: AsyncIterable[bytes],
                      room: int | None) -> AsyncIterator[bytes]:
        """``chunks`` counted against the organization's storage from the first byte on (so a
        concurrent check sees them), refused with QUOTA_EXCEEDED the moment they pass ``room``."""
        counts = self._uploading.setdefault(org_id, {})
        counts[snapshot_id] = 0
        try:
            async for chunk in chunks:
                counts[snapshot_id] += len(chunk)
                if room is not None and counts[snapshot_id] > room:
                    limit = self.of(org_id).snapshot_bytes or 0
                    raise self._storage_full(org_id, limit, limit - room + counts[snapshot_id],
                                             f"this upload passed the {format_bytes(room)} left")
                self.charge(org_id, len(chunk))
                yield chunk
        finally:
            counts.pop(snapshot_id, None)
            if not counts:
                self._uploading.pop(org_id, None)

    async def check_sandbox(self, org_id: str, spec: SandboxSpec, count: int = 1) -> None:
        """``count``: that many sandboxes of this spec at once (a fork), all or none."""
        if not self.limits_sandboxes(org_id):
            return
        quota = self.of(org_id)
        used = await self.usage(org_id)
        for field, adds, show in (
            ("sandboxes", count, str),
            ("memory_bytes", self.defaults.memory_of(spec.resources) * count, format_bytes),
            ("cpu_millis", self.defaults.cpu_of(spec.resources) * count, lambda v: f"{v}m"),
        ):
            limit = getattr(quota, field)
            if limit is not None and used[field] + adds > limit:
                raise QuotaExceeded(
                    f"quota {field}: organization {org_id} may have {show(limit)}; live sandboxes use "
                    f"{show(used[field])}, and {'this one' if count == 1 else f'these {count}'} would add {show(adds)}",
                    quota=field, limit=limit, used=used[field])

    async def check_snapshot(self, org_id: str, size_bytes: int, *, finalizing: str | None = None) -> None:
        """``finalizing``: a build whose upload becomes this snapshot (counted once, as it).
        Passed, the snapshot's bytes come out of the running commands' room (``charge``)."""
        limit = self.of(org_id).snapshot_bytes
        if limit is None:
            return
        used = (await self.usage(org_id))["storage_bytes"]
        if finalizing is not None:
            used -= (await self._pending_uploads(org_id)).get(finalizing, 0)
        if used + size_bytes > limit:
            raise self._storage_full(org_id, limit, used, f"this snapshot is {format_bytes(size_bytes)}")
        if finalizing is None:  # a build's upload was charged as it came
            self.charge(org_id, size_bytes)

