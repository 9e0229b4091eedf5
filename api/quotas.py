"""Organization quotas, checked before anything is recorded (so a refusal leaves nothing).

Live sandboxes (not final) count against ``sandboxes`` and, by what they asked for, against
``memory_bytes`` and ``cpu_millis``; ready snapshots' archives against ``snapshot_bytes``.
A sandbox that gives no memory or CPU has the server's defaults filled into its spec before it
is recorded (api/defaults.py), so it counts what its driver enforces; one recorded before that
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

from hutch.api.defaults import SandboxDefaults
from hutch.api.reads import Reads
from hutch.core.errors import QuotaExceeded
from hutch.core.models import SandboxSpec
from hutch.core.quantities import format_bytes
from hutch.core.tenancy import Quota
from hutch.projections.base import SandboxQuery, SnapshotQuery


class Quotas:
    def __init__(self, reads: Reads, defaults: SandboxDefaults | None = None) -> None:
        self._reads = reads  # the store, and the organizations (their quotas) once the app sets them
        self.defaults = defaults or SandboxDefaults()

    def of(self, org_id: str) -> Quota:
        tenants = self._reads.tenants
        org = tenants.directory.orgs.get(org_id) if tenants is not None else None
        return org.quota if org is not None else Quota()

    def limits_sandboxes(self, org_id: str) -> bool:
        """Whether the organization's quota limits live sandboxes (their count, memory or CPU)."""
        quota = self.of(org_id)
        return quota.sandboxes is not None or quota.memory_bytes is not None or quota.cpu_millis is not None

    async def usage(self, org_id: str) -> dict[str, int]:
        live, count = await self._reads.store.list_sandboxes(SandboxQuery(org_id=org_id, live=True, limit=10**9))
        snaps, _ = await self._reads.store.list_snapshots(SnapshotQuery(org_id=org_id, limit=10**9))
        return {
            "sandboxes": count,
            "memory_bytes": sum(self.defaults.memory_of(sb.spec.resources) for sb in live),
            "cpu_millis": sum(self.defaults.cpu_of(sb.spec.resources) for sb in live),
            "snapshot_bytes": sum(s.size_bytes for s in snaps),
        }

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

    async def check_snapshot(self, org_id: str, size_bytes: int) -> None:
        limit = self.of(org_id).snapshot_bytes
        if limit is None:
            return
        used = (await self.usage(org_id))["snapshot_bytes"]
        if used + size_bytes > limit:
            raise QuotaExceeded(
                f"quota snapshot_bytes: organization {org_id} may keep {format_bytes(limit)} of snapshots; "
                f"it keeps {format_bytes(used)}, and this one is {format_bytes(size_bytes)}",
                quota="snapshot_bytes", limit=limit, used=used)

