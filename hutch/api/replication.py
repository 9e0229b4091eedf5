"""Several API replicas on one log and one database (``core.replicas``).

- **Forwarding.** A request about a sandbox another live replica owns is relayed to that
  replica (one HTTP hop; the wire does not change), so its driver, its executions and their
  output writers stay in one process. Reads the projection answers alike everywhere (the
  sandbox, its events, executions and jobs lists, an execution's status) are served here.
- **Take-over.** Every ``RENEW_SECONDS`` this replica renews its lease and claims the
  sandboxes of every replica whose lease ran out. A claimed sandbox is adopted by this
  replica's driver (the nomad driver finds its allocation), its unfinished executions end
  ``failed`` naming the lost replica (their processes were children of the dead replica's
  exec sessions), a oneshot sandbox ends, and one still being created or destroyed is
  finished off. A request about a dead replica's sandbox claims it at once.
- **Lost.** A replica that finds its own lease claimed (it stalled past the lease) stops
  serving sandboxes: they are another replica's now; the server process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncGenerator, Callable, Sequence

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from hutch.api.routes import proxy
from hutch.api.routes.streams import STDIN_TOKEN
from hutch.core.errors import DriverFailure, InvalidInput, ReplicaUnavailable
from hutch.core.events import Event
from hutch.core.replicas import RENEW_SECONDS, Claimed, Handle, Replicas, Tenant
from hutch.core.tenancy import secrets_match
from hutch.service.engine import Engine
from hutch.service.sandbox_streams import is_sandbox_stream

log = logging.getLogger(__name__)

FORWARDED = "X-Hutch-Forwarded-By"
REPLICA_HEADER = "X-Hutch-Replica"
FORWARD_TOKEN = "X-Hutch-Forwarded-Token"  # HMAC of the replica and the request under the shared secret
_ENDING = ("lifecycle:failed", "lifecycle:terminated", "lifecycle:discarded")
# GET routes that read only the projection (shared by every replica): never forwarded.
_LOCAL_READS = frozenset({
    "/sandbox/{sandbox_id}", "/sandbox/status/{sandbox_id}", "/cli/sandbox/{sandbox_id}",
    "/sandbox/sandboxes/{sandbox_id}/events", "/sandbox/sandboxes/{sandbox_id}/executions",
    "/sandbox/sandboxes/{sandbox_id}/history", "/sandbox/sandboxes/{sandbox_id}/jobs",
    "/sandbox/sandboxes/{sandbox_id}/jobs/{job_id}", "/sandbox/checkpoints/{sandbox_id}",
})
# GET routes whose reader waits for a command (api/watchers.py): sent to the replica running it.
_WAITERS = frozenset({"/sandbox/execution/{execution_id}", "/streams/{stream_id}"})


class Replication:
    def __init__(self, replicas: Replicas, engine: Engine, *, on_live: Callable[[int], None] | None = None) -> None:
        self.replicas = replicas
        self.engine = engine
        self._on_live = on_live  # told how many replicas live, every renewal (rate limit shares)
        self._claiming = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None  # reads other replicas' stdin streams
        # Sandboxes claimed whose take-over failed for a passing reason (Nomad or the log away):
        # ours by the claim, which is not made again, so tried again each round until adopted.
        self._unadopted: dict[str, tuple[Handle | None, str, Tenant | None]] = {}
        if replicas.shared:
            engine.inputs.holder, engine.inputs.remote = replicas.me, self.read_remote

    @property
    def lost(self) -> bool:
        """Another replica claimed this one's sandboxes (its lease ran out): it serves none."""
        return self.replicas.claimed

    # -- forwarding ----------------------------------------------------------------------

    async def target(self, request: web.Request, sandbox_id: str) -> str | None:
        """The owner's URL if another live replica owns the sandbox; None: serve it here."""
        return await self.owner_url(sandbox_id, relayed=bool(request.headers.get(FORWARDED)))

    async def owner_url(self, sandbox_id: str, *, relayed: bool) -> str | None:
        """The owner's URL if another live replica owns the sandbox; None: serve it here.
        ``relayed``: another replica sent it here as the owner; if it moved meanwhile, "try
        again" rather than a second hop."""
        if self.lost:
            raise ReplicaUnavailable(f"sandbox {sandbox_id}: this replica ({self.replicas.me}) was taken over; "
                                     "use another", sandbox_id=sandbox_id)
        current = self.replicas.current()
        if self.replicas.owns(sandbox_id):  # remembered, and the lease is current
            return None
        # Not known here, or after a stall (the lease may have lapsed and the sandbox moved):
        # the store decides.
        owner = await self.replicas.owner(sandbox_id)
        if not current and owner is not None and owner.replica_id == self.replicas.me and not owner.alive:
            raise ReplicaUnavailable(f"sandbox {sandbox_id}: this replica ({self.replicas.me}) missed its lease "
                                     "renewals and may be taken over; try again", sandbox_id=sandbox_id)
        if owner is not None and owner.replica_id != self.replicas.me and not owner.alive and current:
            await self.take_over()  # its replica is gone: ours now (or another survivor's)
            owner = await self.replicas.owner(sandbox_id)
        if owner is None or owner.replica_id == self.replicas.me:
            return None
        if not owner.alive:
            raise ReplicaUnavailable(f"sandbox {sandbox_id}: replica {owner.replica_id} owning it is gone and "
                                     "another is taking it over; try again", sandbox_id=sandbox_id)
        if relayed:
            raise ReplicaUnavailable(f"sandbox {sandbox_id} moved to replica {owner.replica_id}; try again",
                                     sandbox_id=sandbox_id)
        return owner.url

    async def forward(self, request: web.Request, sandbox_id: str) -> web.StreamResponse | None:
        """The owner's answer, relayed; None if the request is to be served here."""
        url = await self.target(request, sandbox_id)
        return None if url is None else await self.relay(request, url)

    async def forward_waiter(self, request: web.Request, sandbox_id: str) -> web.StreamResponse | None:
        """``forward`` for a waiter (``_WAITERS``): when the owner does not answer (killed,
        being taken over), served here from the shared projection, as any replica may."""
        try:
            return await self.forward(request, sandbox_id)
        except (ReplicaUnavailable, DriverFailure) as err:
            log.info("replica %s: a waiter of sandbox %s is served here: %s", self.replicas.me, sandbox_id, err)
            return None

    async def forward_upload(self, request: web.Request) -> web.StreamResponse | None:
        """``PUT /streams/{id}`` of a stdin stream another replica holds: relayed there."""
        holder = self.engine.inputs.holder_of(request.match_info.get("stream_id", ""))
        if request.method != "PUT" or holder is None:
            return None
        found = await self.replicas.address(holder)
        if found is None or not found.alive:
            raise InvalidInput(f"stream {request.match_info['stream_id']}: replica {holder} holding it is gone; "
                               "make another with POST /streams", field="stream")
        return await self.relay(request, found.url)

    async def read_remote(self, holder: str, stream_id: str) -> AsyncGenerator[bytes, None]:
        """A stdin stream another replica holds, for a command this one runs."""
        found = await self.replicas.address(holder)
        if found is None or not found.alive:
            raise InvalidInput(f"stream.stdin: replica {holder} holding stream {stream_id} is gone",
                               field="stream.stdin")
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                                  connector=aiohttp.TCPConnector(keepalive_timeout=proxy.IDLE_SECONDS))
        headers = {STDIN_TOKEN: self.engine.streams.sign("stdin:" + stream_id)}
        async with self._session.get(f"{found.url.rstrip('/')}/streams/{stream_id}/stdin", headers=headers) as resp:
            if resp.status != 200:
                body = await resp.json(content_type=None)
                raise InvalidInput(str(body.get("message") or f"stream.stdin: {stream_id}: HTTP {resp.status}"),
                                   field="stream.stdin")
            async for chunk in resp.content.iter_any():
                yield chunk

    async def sandbox_of(self, request: web.Request) -> str | None:
        info = request.match_info
        resource = info.route.resource
        if _waiter(request):
            return await self._waited_on(request)
        if request.method == "GET" and resource is not None and resource.canonical in _LOCAL_READS:
            return None
        if "sandbox_id" in info:
            return info["sandbox_id"]
        if "execution_id" in info and request.method != "GET":  # cancel: where the command runs
            return await self.engine.takeover.sandbox_of_execution(info["execution_id"])
        return None

    async def _waited_on(self, request: web.Request) -> str | None:
        """A long-poll for a running command, or a read of its output, is one of its waiters
        (api/watchers.py): served by the replica that runs it, so that its waiters all leaving
        cancels it wherever they came in. Once the command ended, any replica answers."""
        info = request.match_info
        if "execution_id" in info:
            execution_id = info["execution_id"] if request.query.get("wait") else None
        else:
            execution_id = self.engine.streams.execution_of(info.get("stream_id", ""))
        if execution_id is None or is_sandbox_stream(execution_id) or self.engine.executions.running(execution_id):
            return None  # not a command's waiter, or one this replica runs: no store read
        return await self.engine.takeover.sandbox_of_execution(execution_id, running=True)

    async def relay(self, request: web.Request, url: str) -> web.StreamResponse:
        # Host kept: the owner routes a port URL under the wildcard domain by it.
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in proxy.HOP or k.lower() in ("content-length", "host")}
        headers[FORWARDED] = self.replicas.me
        headers[FORWARD_TOKEN] = forward_token(self.engine, self.replicas.me, request.method, request.rel_url.raw_path_qs)
        session = request.app[proxy.SESSION]
        target = url.rstrip("/") + request.rel_url.raw_path_qs
        if request.headers.get("Upgrade", "").lower() == "websocket":
            for name in [k for k in headers if k.lower().startswith("sec-websocket-")]:
                del headers[name]
            return await proxy.relay_websocket(request, session, "ws" + target.removeprefix("http"), headers)
        return await proxy.relay_http(request, session, target, headers,
                                      unreachable=f"the replica at {url} owning this sandbox does not answer")

    # -- take-over -------------------------------------------------------------------------

    async def run(self) -> None:
        """Take dead replicas over, and share the live count out, until cancelled or lost."""
        while not self.lost:
            try:
                await self.take_over()
                if self._on_live is not None:
                    self._on_live(await self.replicas.live_count())
            except Exception:  # a database outage: try again next round
                log.warning("replica %s: take-over failed", self.replicas.me, exc_info=True)
            await asyncio.sleep(RENEW_SECONDS)

    async def take_over(self) -> None:
        async with self._claiming:
            for sandbox_id, (handle, why, tenant) in list(self._unadopted.items()):
                await self._adopt_one(sandbox_id, handle, why, tenant)
            claims = await self.replicas.claim_dead()
            # Every lost replica's leftovers are listed right after the claim, before any
            # adoption: one that returns meanwhile places new pool jobs under its old id, and
            # what it places after its claim is its own, not a leftover to end.
            leftovers = [await self._leftovers(claimed.dead_replica) for claimed in claims]
            for claimed, placed in zip(claims, leftovers, strict=True):
                log.warning("replica %s: took over %d sandbox(es) of lost replica %s", self.replicas.me,
                            len(claimed.sandboxes), claimed.dead_replica)
                await self._adopt(claimed, placed)

    async def _leftovers(self, dead_replica: str) -> list[str]:
        try:
            return await self.engine.takeover.leftovers(dead_replica)
        except Exception:
            log.exception("listing what lost replica %s placed ahead failed", dead_replica)
            return []

    async def _adopt(self, claimed: Claimed, leftovers: list[str]) -> None:
        why = f"the replica running it ({claimed.dead_replica}) was lost"
        tenants = dict(claimed.tenants)
        for sandbox_id, handle in claimed.sandboxes:
            await self._adopt_one(sandbox_id, handle, why, tenants.get(sandbox_id))
        if leftovers:  # its warm pool, idle or claimed by a create it never recorded: ended
            try:
                await self.engine.takeover.discard_leftovers(leftovers, [h for _, h in claimed.sandboxes if h])
            except Exception:
                log.exception("ending what lost replica %s placed ahead failed", claimed.dead_replica)

    async def _adopt_one(self, sandbox_id: str, handle: Handle | None, why: str, tenant: Tenant | None) -> None:
        try:
            kept = await self.engine.takeover.adopt(sandbox_id, handle, why, tenant)
        except Exception:
            log.exception("taking over sandbox %s failed; trying again on the next round", sandbox_id)
            self._unadopted[sandbox_id] = (handle, why, tenant)
            return
        self._unadopted.pop(sandbox_id, None)
        if not kept:
            try:
                await self.replicas.disown(sandbox_id)
            except Exception:  # it ended: its owner row is only left over (observe drops it too)
                log.exception("forgetting the owner of %s failed", sandbox_id)

    def observe(self, batch: Sequence[Event]) -> None:
        """Projector hook: a sandbox of ours that ended needs no owner any more."""
        for event in batch:
            if event.type in _ENDING and self.replicas.remembers(event.sandbox_id) and self.replicas.shared:
                task = asyncio.get_running_loop().create_task(self._disown(event.sandbox_id))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _disown(self, sandbox_id: str) -> None:
        try:
            await self.replicas.disown(sandbox_id, lazily=True)  # nobody waits: written with others
        except Exception:
            log.warning("forgetting the owner of %s failed", sandbox_id, exc_info=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task
        if self._session is not None:
            await self._session.close()


def _waiter(request: web.Request) -> bool:
    resource = request.match_info.route.resource
    return request.method == "GET" and resource is not None and resource.canonical in _WAITERS


async def keep_lease(replicas: Replicas, on_lost: Callable[[], None] | None) -> None:
    """Renew the lease every ``RENEW_SECONDS`` until cancelled, on a task of its own from the
    moment the replica registers: no other work (a slow start, a long take-over) may hold a
    renewal back past the lease, or the replica would doubt its own sandboxes (``current``)
    and then be claimed while alive. Claimed after all (it stalled): it stops serving."""
    while True:
        try:
            if not await replicas.renew():
                log.critical("replica %s: another replica claimed this one's sandboxes (its lease ran out); "
                             "no longer serving them", replicas.me)
                if on_lost is not None:
                    on_lost()
                return
        except Exception:  # a database outage: try again next round (the lease may lapse)
            log.warning("replica %s: lease renewal failed", replicas.me, exc_info=True)
        await asyncio.sleep(RENEW_SECONDS)


def deployment_tag(secret: bytes) -> str:
    """What the replicas of one deployment (one database) share and name what they place with
    (``Adoption.set_replica``): a digest of their shared secret, which it does not reveal (job
    meta is readable by whoever may list the Nomad cluster's jobs)."""
    return hashlib.sha256(b"hutch deployment\0" + secret).hexdigest()[:16]


def forward_token(engine: Engine, replica: str, method: str, path_qs: str) -> str:
    return engine.streams.sign(f"forward:{replica}:{method}:{path_qs}")


def relayed_by_a_replica(request: web.Request) -> bool:
    """The request came from another replica, relaying it here: that replica already counted
    it against the key's rate. The header alone proves nothing (a client may send it): the
    token, an HMAC under the replicas' shared secret, does."""
    replication = request.app.get(REPLICATION)
    by, token = request.headers.get(FORWARDED), request.headers.get(FORWARD_TOKEN)
    if replication is None or not by or not token:
        return False
    wanted = forward_token(replication.engine, by, request.method, request.rel_url.raw_path_qs)
    return secrets_match(token, wanted)


async def name_the_replica(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: which replica answered, for operators behind a balancer (a
    relayed answer keeps the owner's name). Informational: a sandbox's port may set it too."""
    replication = request.app.get(REPLICATION)
    if replication is not None and replication.replicas.shared:
        response.headers.setdefault(REPLICA_HEADER, replication.replicas.me)


REPLICATION: web.AppKey[Replication] = web.AppKey("replication", Replication)
ON_LOST: web.AppKey[Callable[[], None]] = web.AppKey("replica_lost", Callable[[], None])  # type: ignore[arg-type]


@web.middleware
async def replica_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """After auth: a request about a sandbox another replica owns goes there."""
    replication = request.app.get(REPLICATION)
    if replication is None or not replication.replicas.shared:
        return await handler(request)
    sandbox_id = await replication.sandbox_of(request)
    if not sandbox_id:
        forwarded = await replication.forward_upload(request)
    elif _waiter(request):
        forwarded = await replication.forward_waiter(request, sandbox_id)
    else:
        forwarded = await replication.forward(request, sandbox_id)
    return forwarded if forwarded is not None else await handler(request)
