"""The local driver's warm pool: idle sandboxes started ahead of time.

For each runtime it has provisioned, the driver keeps ``HUTCH_WARM_POOL`` (default 2; 0
turns it off) idle sandboxes, refilled in the background one at a time as soon as one is
claimed. A pooled sandbox is started in a cpu cgroup marked idle (``cpu.idle``, kernel
5.15+): its launcher and pid 1 set up the namespaces and mounts, most of a start's CPU, only
when the other sandboxes leave a cpu unused, so a command running beside a refill preempts
it. Where the mark cannot be written, each start waits until no request is launching
(quiet.py: a refill beside a launch slowed it), which under a steady stream of creates left
the pool empty (74 % of creates made from scratch on the node agents); with the mark, it
waits for that at most ``IDLE_DEFER_MAX`` (its first steps run on the server's event loop). ``claim`` turns
one into a requested sandbox: its directory and cgroups are renamed to the requested id
(same parent, so nothing moves; its pids cgroup, under its organization's, is made then:
cgroups.py), the requested limits are written to its cgroup and the
idle mark cleared, the uid claim and ``meta.json`` follow the new id. No command has ever run in a pooled
sandbox, so a claimed one is indistinguishable from a freshly started one. Pooled
sandboxes are named ``_pool-<server pid>-<its start time>-...`` (state.POOL_NAME):
a pooled sandbox's /dev is sized when it starts (to a memory limit: launch.dev_bytes), so
one is claimed only for that memory limit, and a runtime's pool is filled for the server's
default memory limit (HUTCH_DEFAULT_MEMORY: what most creates ask for). It was filled for the
limit its latest sandbox asked for: a tenant creating at a size of its own then had every
other tenant's create made from scratch (and each of its creates tore down the pool and
started it again). Without a default given (a node agent) it still follows the latest;
``alive()`` does not see them, ``close()`` destroys them, and a later start reaps those
of a server that is gone. Needs cgroup v1 (v2 cannot rename cgroups): on v2 the pool
stays off. Where the host's admission counts (``SpareRoom``: admission.py, or a node
agent's, hutch/node/sandboxes.py), each spare is counted from its start to its claim or
destroy, a refill starts none the host has no room for, and ``trim`` destroys those a host
past its bounds has too many of.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Protocol

from hutch.core import runtimes
from hutch.core.errors import DriverFailure
from hutch.drivers.base import DEFAULT_PIDS, ProvisionRequest, ResourceLimits
from hutch.drivers.local import rootfs, uids
from hutch.drivers.local.cgroups import Cgroups
from hutch.drivers.local.helper import start_time
from hutch.drivers.local.launch import Launcher, dev_bytes
from hutch.drivers.local.quiet import Quiet
from hutch.drivers.local.state import POOL_PREFIX, LocalSandbox, Registry, is_live
from hutch.drivers.local.teardown import Teardown

log = logging.getLogger(__name__)

# Without the idle mark: how long a refill waits for no request to be launching (quiet.py)
# before it starts a sandbox anyway: a steady load defers the pool's refill, never stops it.
# An empty pool waits less: every create meanwhile starts its own sandbox (17 ms instead of 2).
REFILL_DEFER_MAX = 1.0


def cores_to_spare() -> bool:
    """Whether the last minute left a core unused (its load average below the CPUs)."""
    return os.getloadavg()[0] < (os.cpu_count() or 1)

EMPTY_DEFER_MAX = 0.25
# With the idle mark and a core to spare: how long a refill waits for no request to be
# launching. Its first steps (a Popen, cgroup, directory and meta.json writes: ~1.4 ms) run on
# the server's event loop, which the mark does nothing for: started at once, beside the create
# that claimed from the pool, they held up that create's append by as much (1.6 ms p50 from
# the append's call to its Produce, against 0.04-0.26 for the other appends of a one-shot;
# bench/phases.py at load 0.6, issue 35). A one-shot's hold ends at its command's launch,
# ~3 ms later; a bound this short keeps back-to-back creates finding the pool full.
IDLE_DEFER_MAX = 0.005


class SpareRoom(Protocol):
    """The host's admission, as the pool asks it: a server's (admission.HostAdmission) or a
    node agent's (hutch/node/sandboxes.py Admission, given by ``LocalDriver.count_spares``)."""

    def spare(self, name: str, memory: int | None) -> bool: ...

    def spare_gone(self, name: str) -> None: ...

    def surplus(self) -> list[str]: ...


class Uncounted:
    """No admission counts the host (a driver without HostLimits, nor an agent's)."""

    def spare(self, name: str, memory: int | None) -> bool:
        return True

    def spare_gone(self, name: str) -> None:
        pass

    def surplus(self) -> list[str]:
        return []


def pool_size() -> int:
    try:
        return max(0, int(os.environ.get("HUTCH_WARM_POOL", "2")))
    except ValueError:
        return 2


class PoolRefill:
    """Tasks that must finish before the driver closes (pool fills, destroys)."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Future[None]] = set()

    def track(self, task: asyncio.Future[None]) -> None:
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.track(asyncio.create_task(coro))

    async def drain(self) -> None:
        while self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)


class WarmPool:
    """The idle pooled sandboxes of one driver, per runtime."""

    def __init__(self, registry: Registry, cgroups: Cgroups | None, launcher: Launcher, teardown: Teardown,
                 background: PoolRefill, runtime_cache: Path, quiet: Quiet, memory: int | None = None,
                 room: SpareRoom | None = None) -> None:
        self._registry = registry
        self._room = room or Uncounted()
        self._runtime_cache = runtime_cache
        self._cgroups = cgroups
        self._launcher = launcher
        self._teardown = teardown
        self._background = background
        self._quiet = quiet
        self.size = pool_size()
        self.idle: dict[str, list[LocalSandbox]] = {}  # runtime -> idle pooled sandboxes
        self._filling: set[str] = set()
        self._memory: dict[str, int | None] = {}  # runtime -> the memory limit its pool is filled for
        self._default_memory = memory  # the one it is always filled for (None: the latest asked)
        self._fill_slots = asyncio.Semaphore(1)
        self._seq = itertools.count()
        self._tag = ""
        self.closed = False

    def start(self) -> None:
        """Name this server's pooled sandboxes after it (its pid and start time)."""
        me = os.getpid()
        self._tag = f"{POOL_PREFIX}{me}-{start_time(me)}-{secrets.token_hex(4)}"

    async def claim(self, req: ProvisionRequest) -> LocalSandbox | None:
        """Turn an idle pooled sandbox into ``req``'s; None when none is left."""
        pool = self.idle.get(req.runtime)
        wanted = dev_bytes(req.resources.memory_bytes, rootless=False)
        while pool:
            fits = [sb for sb in pool if sb.dev_bytes == wanted]
            if not fits:
                return None
            pooled = fits[-1]
            pool.remove(pooled)
            self._room.spare_gone(pooled.id)  # the claiming create's hold counts it from here
            try:
                return self._adopt(pooled, req)
            except Exception as err:  # e.g. reaped by another server on this data dir
                log.warning("pooled sandbox %s unusable (%s); destroying it", pooled.id, err)
                await self._teardown.teardown(pooled.id)
                await self._teardown.teardown(req.sandbox_id)  # if the rename went through
        return None

    def _adopt(self, pooled: LocalSandbox, req: ProvisionRequest) -> LocalSandbox:
        """Renames and a few small writes, done on the event loop (see Launcher.create)."""
        assert self._cgroups is not None
        if not is_live(pooled):
            raise DriverFailure("its init is gone")
        sid = req.sandbox_id
        root = self._registry.sandbox_root
        old_dir, new_dir = root / pooled.id, root / sid
        self._cgroups.rename(pooled.id, sid, org=req.org_id)  # its pids cgroup made under its organization's
        # Not renamed back should this fail: the caller tears down both names (claim), and the
        # cgroups are ``sid``'s there.
        os.rename(old_dir, new_dir)
        # From here on the sandbox is ``sid``'s: on failure the caller tears ``sid`` down.
        uids.move_claim(pooled.uid, old_dir, new_dir)
        res = req.resources
        # cpu: written before its first command (cgroups.apply_cpu), like a new sandbox's
        self._cgroups.set_limits(sid, memory=res.memory_bytes, cpu_millis=None, pids=res.pids or DEFAULT_PIDS)
        self._cgroups.set_idle(sid, False)  # scheduled as a fresh sandbox from here on
        sb = LocalSandbox(id=sid, uid=pooled.uid, runtime=req.runtime, env=dict(req.env),
                     init_pid=pooled.init_pid, init_start=pooled.init_start, dev_bytes=pooled.dev_bytes,
                     memory_bytes=res.memory_bytes, cpu_millis=res.cpu_millis, disk_bytes=res.disk_bytes,
                     making=req.network_enabled or req.port is not None)  # its network: made after the claim
        self._registry.write_meta(sb)
        return sb

    def refill(self, runtime: str, memory: int | None = None) -> None:
        """Keep ``size`` idle sandboxes of ``runtime`` for the server's default memory, or for
        ``memory`` (the latest one asked) where there is none."""
        if self.size <= 0 or self.closed or runtime in self._filling:
            return
        if self._default_memory is not None:
            memory = self._default_memory
        changed = self._memory.get(runtime, memory) != memory
        self._memory[runtime] = memory
        if not changed and len(self.idle.get(runtime, ())) >= self.size:
            return
        self._filling.add(runtime)
        self._background.spawn(self._fill(runtime))

    async def _fill(self, runtime: str) -> None:
        recipe = runtimes.find(runtime)
        assert recipe is not None
        lower = rootfs.rootfs_path(self._runtime_cache, recipe)
        pool = self.idle.setdefault(runtime, [])
        memory = self._memory.get(runtime)
        try:
            for stale in [sb for sb in pool if sb.dev_bytes != dev_bytes(memory, rootless=False)]:
                pool.remove(stale)  # sized for another memory limit: none would fit
                await self._teardown.teardown(stale.id)
                self._room.spare_gone(stale.id)
            while not self.closed and len(pool) < self.size:
                name = f"{self._tag}-{next(self._seq)}"
                if not self._room.spare(name, memory):  # a host at its bound grows no spares
                    return
                try:
                    if not await self._start_one(runtime, name, memory, lower, pool):
                        return
                finally:
                    if all(sb.id != name for sb in pool):
                        self._room.spare_gone(name)
        finally:
            self._filling.discard(runtime)

    async def _start_one(self, runtime: str, name: str, memory: int | None, lower: Path,
                         pool: list[LocalSandbox]) -> bool:
        """Start the spare ``name`` into ``pool``; False if it was not (closed, failed)."""
        idle = self._cgroups is not None and self._cgroups.set_idle(name, True)
        # In the idle cgroup a refill costs a launch beside it nothing while the machine
        # has a core to spare (sequential creates then claim 72 % instead of 6 %); on
        # saturated cores it still took ~10 % of the one-shots a second (bench/compare.py,
        # c=8): then it waits for quiet as without the mark.
        if idle and cores_to_spare():
            await self._quiet.wait(IDLE_DEFER_MAX)
        else:
            await self._quiet.wait(REFILL_DEFER_MAX if pool else EMPTY_DEFER_MAX)
        if self.closed:  # closed while it waited: nothing to start
            await self._teardown.teardown(name)  # its marked cpu cgroup, if any
            return False
        async with self._fill_slots:  # one sandbox started at a time, across runtimes
            try:
                sb = await self._launcher.create(
                    ProvisionRequest(sandbox_id=name, runtime=runtime, resources=ResourceLimits(memory_bytes=memory)),
                    [lower], None, pooled=True)
            except Exception as err:
                log.warning("warm pool: starting a %s sandbox failed: %s", runtime, err)
                await self._teardown.teardown(name)
                return False
            if self.closed:
                await self._teardown.teardown(name)
                return False
            # Its first command's memory leaf, made now rather than on that command's
            # way (0.3-0.65 ms: cgroups.py); fresh and empty, as a new one would be.
            # Its memory cgroup too (made at a first command otherwise: cgroups.py).
            if self._cgroups is not None:
                with contextlib.suppress(OSError):
                    self._cgroups.apply_memory(name, memory)
                    self._cgroups.make_spare(name)
            pool.append(sb)
        return True

    def count_in(self, room: SpareRoom) -> None:
        """The admission that counts the spares from here on (before any is started)."""
        self._room = room

    def trim(self) -> None:
        """Destroy (in the background) the idle sandboxes the host is past its bounds with
        (its admission's ``surplus``). One still starting is not among the idle: the next trim."""
        names = self._room.surplus()
        if not names:
            return
        for pool in self.idle.values():
            for sb in [sb for sb in pool if sb.id in names]:
                pool.remove(sb)
                self._background.spawn(self._destroy(sb.id))

    async def _destroy(self, name: str) -> None:
        try:
            await self._teardown.teardown(name)
        finally:
            self._room.spare_gone(name)  # counted until its memory and pids are the host's again

    async def close(self) -> None:
        """Destroy the idle sandboxes (fills in progress already finished: see LocalDriver.close)."""
        for sandboxes in self.idle.values():
            while sandboxes:
                with contextlib.suppress(Exception):
                    await self._destroy(sandboxes.pop().id)
