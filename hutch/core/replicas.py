"""The replicas seam: which API process (replica) owns a sandbox, and whether it still lives.

Several ``hutch serve`` processes may share one event log and one PostgreSQL store. Each
sandbox has one owner, the replica that created it (or took it over): the owner's driver
runs it, its executions and their output writers live in the owner's process, and only the
owner appends that sandbox's lifecycle events. A request reaching another replica is
forwarded to the owner (``api.replication``), so there is one writer per sandbox without a
distributed lock on every command.

Liveness is a lease: a replica renews it every ``RENEW_SECONDS``; one not renewed for
``LEASE_SECONDS`` is dead, and exactly one survivor claims its sandboxes (the store decides
who wins). A replica that finds itself claimed while still running stops serving: its
sandboxes are somebody else's now.

Adapters: ``SoleReplica`` here (one process; the embedded profile and any single server)
and ``projections.replicas.PostgresReplicas`` (leases and owners in PostgreSQL).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator

import attrs

LEASE_SECONDS = 10.0
RENEW_SECONDS = 2.0
CURRENT_MARGIN = 0.2  # of a lease: how much sooner than the database a replica doubts its own


@attrs.frozen
class Owner:
    replica_id: str
    url: str
    alive: bool


Handle = dict[str, str]  # what a driver needs to adopt a sandbox it did not place (Driver.handle)


@attrs.frozen
class Tenant:
    """Whose a sandbox is, kept with its owner row: a survivor that ends one no event records
    (service/takeover.py) files that end under the organization that asked for it."""

    org_id: str
    project_id: str | None = None


@attrs.frozen
class Claimed:
    """What one take-over moved to this replica: a dead replica's sandboxes and their handles,
    and whose each is where its owner row says (rows from before it was kept say nothing)."""

    dead_replica: str
    sandboxes: tuple[tuple[str, Handle | None], ...]
    tenants: tuple[tuple[str, Tenant], ...] = ()  # sandbox id, whose it is


class Replicas(abc.ABC):
    me: str  # this replica's id
    url: str  # where the other replicas reach it
    claimed: bool = False  # a renewal found this replica claimed by another: it serves nothing now
    # Set by ``start``: its previous run (same id) had been claimed by a survivor, which ends what
    # that run placed ahead (the nomad driver's idle warm pool jobs: Adoption.lost_leftovers).
    taken_over: bool = False

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Register (or renew) this replica's lease."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Give the lease up: a replica stopped on purpose is taken over at once."""

    @property
    def shared(self) -> bool:
        """True if other replicas can exist (forwarding and take-over are worth doing)."""
        return False

    @abc.abstractmethod
    async def own(self, sandbox_id: str, tenant: Tenant | None = None) -> None:
        """Record this replica as the owner of a new sandbox, and whose it is (``tenant``)."""

    async def set_handle(self, sandbox_id: str, handle: Handle) -> None:  # noqa: B027 - optional
        """Where the driver placed it, kept for whoever takes it over."""

    async def foreign_handles(self) -> list[Handle]:
        """The handles of sandboxes other replicas own: a driver recovering its own leftovers
        must not reap them (they may have been taken over from this replica)."""
        return []

    @abc.abstractmethod
    async def owner(self, sandbox_id: str) -> Owner | None:
        """Who owns it; None if no replica ever recorded it (made before replicas existed)."""

    async def address(self, replica_id: str) -> Owner | None:
        """Where another replica is, and whether it lives; None if no such replica."""
        return None

    @abc.abstractmethod
    async def disown(self, sandbox_id: str, *, lazily: bool = False) -> None:
        """The sandbox ended: no one owns it any more. ``lazily``: nobody waits on it (a
        sandbox that ended), so the adapter may hold it back a moment to write it with others."""

    @abc.abstractmethod
    async def renew(self) -> bool:
        """Renew this replica's lease; False if another replica has claimed it (we are lost)."""

    @abc.abstractmethod
    async def claim_dead(self) -> list[Claimed]:
        """Take over every replica whose lease ran out; what was claimed (possibly nothing)."""

    def owns(self, sandbox_id: str) -> bool:
        """Known here to be ours (no round trip): created or taken over by this replica, and
        its lease is ``current`` (after a stall, ``owner`` asks the store)."""
        return True

    def remembers(self, sandbox_id: str) -> bool:
        """Created or taken over by this replica and not disowned since, whether or not its
        lease is current (what to disown when a sandbox ends)."""
        return True

    def current(self) -> bool:
        """This replica's lease is surely still held: its last renewal began less than a lease
        ago, less a margin for the database's clock. False after a stall (a frozen process, a
        starved loop): another replica may have taken its sandboxes over meanwhile, and what
        ``owns`` remembers is not to be trusted until a renewal says so."""
        return True

    async def live_count(self) -> int:
        """How many replicas hold a live lease, this one included (at least 1)."""
        return 1

    @contextlib.asynccontextmanager
    async def serialised(self, key: str) -> AsyncIterator[None]:
        """Held by one replica at a time, for what must not interleave across replicas (an
        organization's quota check and the create it allows). The caller already holds its
        process's own lock on ``key``; with no other replica there is nothing more to hold."""
        yield

    async def mine(self, sandbox_id: str) -> bool:
        """True unless another replica owns it (unrecorded sandboxes are everyone's: legacy)."""
        if self.owns(sandbox_id):
            return True
        found = await self.owner(sandbox_id)
        return found is None or found.replica_id == self.me


class SoleReplica(Replicas):
    """One process, no one to forward to or take over from: everything is ours."""

    def __init__(self, me: str = "sole", url: str = "") -> None:
        self.me, self.url = me, url

    async def own(self, sandbox_id: str, tenant: Tenant | None = None) -> None:
        return None

    async def owner(self, sandbox_id: str) -> Owner | None:
        return None

    async def disown(self, sandbox_id: str, *, lazily: bool = False) -> None:
        return None

    async def renew(self) -> bool:
        return True

    async def claim_dead(self) -> list[Claimed]:
        return []
