"""Tenancy at the API edge: who a key is, what it may touch, how fast it may ask; and the
directory's writes (``TenancyWrites``), which the routes call and never record themselves.

``Tenants`` keeps this process's copy of the directory (organizations, projects, keys:
``core.tenancy.Directory``), loaded from the projection store at start and then folded from
the events the projector hands it, so a key created or revoked through any replica is known
here as soon as this replica's projector has read the event (the revocation lag the README
gives). A key check is a SHA-256 and a dictionary hit: no store round trip per request.

The bootstrap key (``api-key`` in the data dir, or ``HUTCH_API_KEY``) is the server's
administrator: it acts for ``org_local`` unless ``orgId`` names another organization, and
only it creates organizations.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

import attrs

from hutch.core import tenancy
from hutch.core.errors import InvalidInput, RateLimited, Unauthorized
from hutch.core.events import Event, EventData
from hutch.core.models import SandboxSpec
from hutch.core.tenancy import (
    LOCAL_ORG,
    SCOPE,
    ApiKeyRecord,
    Directory,
    OrganizationRecord,
    Principal,
    ProjectRecord,
    Role,
    SshKeyRecord,
)
from hutch.projections.base import ProjectionStore, is_tenancy_event


def bootstrap_key_id(secret: str) -> str:
    """The id events name the bootstrap key by (as before tenancy: audit records keep matching)."""
    return "key_" + hashlib.sha256(secret.encode()).hexdigest()[:12]


@attrs.define
class Bucket:
    """A token bucket: ``rate`` tokens a second, at most ``burst`` held."""

    rate: float
    burst: float
    tokens: float
    stamp: float

    def take(self, now: float) -> float:
        """0 when a token was taken; else the seconds until one will be there."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


def parse_rate(value: str | None, setting: str = "HUTCH_RATE_LIMIT") -> tuple[float, int] | None:
    """``"20"`` (per second, burst 2x) or ``"20:100"`` (per second : burst); "" = none."""
    if not value:
        return None
    rate_s, _, burst_s = value.partition(":")
    try:
        rate = float(rate_s)
        burst = int(burst_s) if burst_s else max(1, math.ceil(rate * 2))
    except ValueError:
        raise InvalidInput(f"{setting}: expected requests per second, optionally :burst (20 or 20:100), "
                           f"got {value!r}", field=setting) from None
    if not (tenancy.RATE_MIN <= rate <= tenancy.RATE_MAX) or not 1 <= burst <= tenancy.BURST_MAX:
        raise InvalidInput(f"{setting}: rate from {tenancy.RATE_MIN:g} to {tenancy.RATE_MAX:g} a second and burst "
                           f"from 1 to {tenancy.BURST_MAX:g}, got {value!r}", field=setting)
    return rate, burst


class Tenants:
    def __init__(self, bootstrap_secret: str, *, default_rate: tuple[float, int] | None = None) -> None:
        self._bootstrap_secret = bootstrap_secret
        self.bootstrap = Principal(key_id=bootstrap_key_id(bootstrap_secret), org_id=LOCAL_ORG, role=Role.ADMIN,
                                   server_admin=True)
        self.directory = Directory()
        self.default_rate = default_rate
        # Replicas sharing the load (api/replication.py keeps it): each takes its share of a
        # key's rate, so a key behind a balancer over N of them gets its rate, not N times it.
        self.replicas = 1
        self._buckets: dict[str, Bucket] = {}
        self._loading: list[Event] | None = None
        self._changed = asyncio.Event()  # set (and replaced) at every tenancy change: see until_refused

    # ---------------------------------------------------------------- following the log

    async def load(self, store: ProjectionStore) -> None:
        """Take the store's directory; events the projector hands over meanwhile are kept and
        folded on top (those the store already holds are skipped by position)."""
        self._loading = []
        try:
            loaded = await store.directory()
            for event in self._loading:
                _fold(loaded, event)
            self.directory = loaded
        finally:
            self._loading = None
        self._changed_now()

    def observe(self, batch: Sequence[Event]) -> None:
        """The projector's hook: called with every batch it has settled, before waiters wake."""
        changed = False
        for event in batch:
            if not is_tenancy_event(event):
                continue
            if self._loading is not None:
                self._loading.append(event)
            _fold(self.directory, event)
            changed = True
        if changed:
            self._changed_now()

    def _changed_now(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ------------------------------------------------------- sessions that outlive a request

    async def until_refused(self, check: Callable[[], str | None]) -> str:
        """Wait until ``check`` raises ``Unauthorized`` and return its message. A terminal or
        an SSH session is let in once and may then stay open for days: without this, a key
        revoked (or expired, or an SSH key removed) went on typing into the shell it had
        opened. ``check`` returns when the access expires (ISO-8601, as the records hold
        times; None: never) and is asked again at every tenancy change and at that time."""
        while True:
            try:
                expires = check()
            except Unauthorized as err:
                return err.message
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_seconds_until(expires)):
                    await changed.wait()

    def recheck(self) -> None:
        """Something outside the log that lets a session in changed (a Web App sign-out):
        ``until_refused`` asks its ``check`` again now."""
        self._changed_now()

    def key_expiry(self, key_id: str) -> str | None:
        """The key's expiry (None: none; the bootstrap key's); ``Unauthorized`` once it is revoked
        or expired, as ``principal_for`` refuses it."""
        self.principal_for(key_id)
        key = self.directory.keys.get(key_id)
        return key.expires_at if key is not None else None

    def ssh_key_expiry(self, ssh_key_id: str) -> str | None:
        """An SSH key's expiry (its adder's; None: none); ``Unauthorized`` once it opens nothing
        (removed, or the API key that added it revoked or expired)."""
        record = self.directory.ssh_keys.get(ssh_key_id)
        if record is None or not self.directory.ssh_key_live(record, now_utc()):
            raise Unauthorized(f"SSH key {ssh_key_id} was removed, or the API key that added it revoked or expired")
        adder = self.directory.keys.get(record.added_by) if record.added_by else None
        return adder.expires_at if adder is not None else None

    # ---------------------------------------------------------------- requests

    def authenticate(self, secret: str) -> Principal:
        if tenancy.secrets_match(secret, self._bootstrap_secret):
            return self.bootstrap
        key = self.directory.key_for(secret)
        if key is None:
            raise Unauthorized("invalid API key")
        if key.revoked_at is not None:
            raise Unauthorized(f"API key {key.key_id} was revoked at {key.revoked_at}")
        if key.expires_at is not None and key.expires_at <= now_utc():
            raise Unauthorized(f"API key {key.key_id} expired at {key.expires_at}")
        return Principal(key_id=key.key_id, org_id=key.org_id, role=key.role, projects=key.projects)

    def principal_for(self, key_id: str) -> Principal:
        """The principal of a key by its id (a Web App session names its key so): the same
        refusals as ``authenticate``, so a revoked or expired key ends its sessions too."""
        if key_id == self.bootstrap.key_id:
            return self.bootstrap
        key = self.directory.keys.get(key_id)
        if key is None:
            raise Unauthorized("the session's key is unknown here; sign in again")
        if key.revoked_at is not None:
            raise Unauthorized(f"API key {key.key_id} was revoked at {key.revoked_at}")
        if key.expires_at is not None and key.expires_at <= now_utc():
            raise Unauthorized(f"API key {key.key_id} expired at {key.expires_at}")
        return Principal(key_id=key.key_id, org_id=key.org_id, role=key.role, projects=key.projects)

    def knows(self, secret: str) -> bool:
        """A hutch key, valid or not any more (the proxy never forwards one)."""
        return tenancy.secrets_match(secret, self._bootstrap_secret) or self.directory.key_for(secret) is not None

    def throttle(self, principal: Principal, *, public: bool = False) -> None:
        """Raise ``RateLimited`` (429, with the seconds to wait) when the key is over its rate.
        ``public``: anonymous traffic to a public port of a sandbox the key made, counted at
        the same rate in a bucket of its own: whoever reaches the port must not spend the
        key's own requests (its owner's API calls answered 429 by a stranger's traffic)."""
        key = self.directory.keys.get(principal.key_id)
        # A rate recorded before the bounds were checked (core.tenancy.RATE_MIN) is read as the least.
        rate = ((max(key.rate, tenancy.RATE_MIN), key.burst or max(1, math.ceil(key.rate * 2)))
                if key and key.rate else self.default_rate)
        if rate is None:
            return
        now = time.monotonic()
        share = (rate[0] / self.replicas, max(1.0, rate[1] / self.replicas))
        name = f"{principal.key_id} public" if public else principal.key_id
        bucket = self._buckets.get(name)
        if bucket is None or bucket.rate != share[0] or bucket.burst != share[1]:
            bucket = self._buckets[name] = Bucket(share[0], share[1], share[1], now)
        wait = bucket.take(now)
        if wait > 0:
            over = f", {self.replicas} replicas each allowing its share" if self.replicas > 1 else ""
            # Public traffic is anyone's: its answer names no key (whose sandbox it is stays unsaid).
            who = "public traffic to this sandbox's ports" if public else f"key {principal.key_id}"
            raise RateLimited(f"rate limit: {who} may make {rate[0]:g} requests a second "
                              f"(burst {rate[1]}{over}); retry in {wait:.2f} s", retry_after=wait)


# ``Recorder.record``: the events a decision returns, decided and appended under the stream's
# lock. Taken as a callable so this module needs no recorder (whose reads need ``Tenants``).
Recording = Callable[[str, Callable[[], Iterable[EventData]]], Awaitable[list[Event]]]


class TenancyWrites:
    """The directory's writes: organizations, quotas, projects, API keys, SSH keys. Each is
    decided by ``core.tenancy`` against the directory under its organization's stream lock, so
    a name or key taken twice at once is refused once, and recorded in that stream. Each
    returns the record as the directory holds it: the projector folds the events into
    ``Tenants`` before the recorder returns."""

    def __init__(self, record: Recording, tenants: Callable[[], Tenants | None]) -> None:
        self._record = record
        self._tenants = tenants  # the app's, set once it has loaded (Engine.tenants)

    def _directory(self) -> Directory:
        tenants = self._tenants()
        if tenants is None:  # an engine without the app: nothing routes here
            raise RuntimeError("tenancy writes need the app's directory (Engine.tenants)")
        return tenants.directory

    async def create_org(self, name: object) -> OrganizationRecord:
        org_id = tenancy.org_id_for(tenancy.check_name(name, "name"))
        await self._record(org_id, lambda: [tenancy.create_org(self._directory(), name)[1]])
        return self._directory().orgs[org_id]

    async def set_quota(self, org_id: str, values: Mapping[str, object]) -> OrganizationRecord:
        """Fields given replace the organization's; ``None`` lifts a limit."""
        await self._record(org_id, lambda: [tenancy.set_quota(values, self._directory().orgs[org_id].quota)])
        return self._directory().orgs[org_id]

    async def create_project(self, org_id: str, name: object) -> ProjectRecord:
        [event] = await self._record(org_id, lambda: [tenancy.create_project(self._directory(), org_id, name)])
        assert isinstance(event.data, tenancy.ProjectCreated)  # the one event decided above
        return self._directory().projects[event.data.project_id]

    async def create_key(self, org_id: str, *, role: object, name: object = None, projects: object = (),
                         expires_at: object = None, rate: object = None, burst: object = None,
                         limit: tuple[str, ...] = (), field: str = "projects",
                         maker: str | None = None) -> tuple[str, ApiKeyRecord]:
        """(the key's secret, which is in this answer and nowhere else, ever; the key). ``limit``:
        the creating key's projects, which a new key may not reach past (``field`` names them);
        ``maker``: the creating key's id, whose expiry the new key may not reach past."""
        made: list[str] = []

        def decide() -> list[EventData]:
            directory = self._directory()
            creator = directory.keys.get(maker) if maker is not None else None  # the bootstrap key: in none
            secret, event = tenancy.create_key(directory, org_id, role=role, name=name, projects=projects,
                                               expires_at=expires_at, rate=rate, burst=burst, limit=limit,
                                               field=field, until=creator.expires_at if creator else None)
            made.append(secret)
            return [event]

        [event] = await self._record(org_id, decide)
        assert isinstance(event.data, tenancy.KeyCreated)
        return made[-1], self._directory().keys[event.data.key_id]

    async def revoke_key(self, org_id: str, key_id: str, limit: tuple[str, ...] = ()) -> ApiKeyRecord:
        """The key's revocation, and the removal of every SSH key it added; a key outside the
        revoking key's projects (``limit``) is not found."""
        await self._record(org_id, lambda: tenancy.revoke_key(self._directory(), org_id, key_id, limit))
        return self._directory().keys[key_id]

    async def add_ssh_key(self, principal: Principal, public_key: object, name: object) -> SshKeyRecord:
        """Registered by ``principal``'s key, within its projects, for as long as that key lives."""
        org_id = principal.org_id

        def decide() -> list[EventData]:
            return [tenancy.add_ssh_key(self._directory(), org_id, public_key, name, added_by=principal.key_id,
                                        projects=principal.projects, now=now_utc())]

        [event] = await self._record(org_id, decide)
        assert isinstance(event.data, tenancy.SshKeyAdded)
        return self._directory().ssh_keys[event.data.ssh_key_id]

    async def remove_ssh_key(self, org_id: str, ssh_key_id: str, limit: tuple[str, ...] = ()) -> SshKeyRecord:
        await self._record(org_id, lambda: [tenancy.remove_ssh_key(self._directory(), org_id, ssh_key_id, limit)])
        return self._directory().ssh_keys[ssh_key_id]


def owned(spec: SandboxSpec, directory: Directory | None) -> SandboxSpec:
    """``spec`` in the request's organization, its ``projectId`` resolved (``project_for``)."""
    scope = SCOPE.get()
    return attrs.evolve(spec, org_id=scope.org_id if scope else LOCAL_ORG,
                        project_id=project_for(spec.project_id, directory, "sandboxes"))


def project_for(requested: str | None, directory: Directory | None, what: str) -> str | None:
    """The project something new (``what``: sandboxes, snapshots) is made in: ``requested`` (a
    name or id of one of the organization's projects) resolved; a key limited to projects
    must name one of them, or has it filled in when it is limited to exactly one."""
    scope = SCOPE.get()
    org = scope.org_id if scope else LOCAL_ORG
    project = requested
    if project is not None and directory is not None:
        project = tenancy.resolve_project(directory, org, project)
    if scope is not None and scope.projects:
        if project is None and len(scope.projects) == 1:
            project = scope.projects[0]
        if project not in scope.projects:
            raise InvalidInput(f"projectId: this key may only create {what} in projects "
                               f"{', '.join(scope.projects)}", field="projectId")
    return project


def _fold(directory: Directory, event: Event) -> None:
    if (event.position or 0) <= directory.position:
        return
    directory.apply(event.sandbox_id, event.created_at, event.data)
    directory.position = event.position or directory.position


def _seconds_until(when: str | None) -> float | None:
    """Seconds from now until ``when`` (ISO-8601 UTC, whole seconds: refused from that very
    instant on), a hair past it; None for None."""
    if when is None:
        return None
    at = dt.datetime.fromisoformat(when.replace("Z", "+00:00"))
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.UTC)
    return max(0.0, (at - dt.datetime.now(dt.UTC)).total_seconds()) + 0.001


def now_utc() -> str:
    """Now, as the directory's records hold times (so expiries compare as strings)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = ["TenancyWrites", "Tenants", "bootstrap_key_id", "now_utc", "owned", "parse_rate", "project_for", "tenancy"]
