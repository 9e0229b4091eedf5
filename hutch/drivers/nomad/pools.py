"""Warm pools of the nomad driver: idle allocations placed ahead of time per runtime, so a
create that asks for nothing else claims one instead of waiting for Nomad to schedule and
containerd to start a task (~2 ms instead of ~0.6-0.9 s: README, bench/cluster.py).

Sizes are either fixed (``HUTCH_NOMAD_POOL=base:latest=2,python:3.13=1``) or **adaptive**
(``HUTCH_NOMAD_POOL=auto``, what ``hutch serve`` does by default): per runtime, enough idle
allocations to cover the creates expected while one placement takes
(``rate x placement time x 2``, at least one for a runtime used in the last ``idle_after``
seconds, and one for the default runtime always, so a fresh install's creates are warm),
all within a memory budget per client node (``HUTCH_NOMAD_POOL_MEMORY``, MiB; each idle
allocation reserves the default memory). A runtime nobody asked for drains to nothing.
The pool is per cluster: the spread scheduler places its allocations across the clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from hutch.core import runtimes
from hutch.core.errors import DriverFailure, HutchError, InvalidInput
from hutch.drivers.base import Metric, ResourceLimits
from hutch.drivers.nomad.jobs import LIVE, default_resources, job_spec, sized

if TYPE_CHECKING:
    from hutch.drivers.nomad.agents import ExecAgents
    from hutch.drivers.nomad.client import NomadClient

log = logging.getLogger(__name__)

DEFAULT_MEMORY_BUDGET_MB = 2048  # per client node: four idle allocations of the default 512 MiB


@attrs.define
class PoolEntry:
    job_id: str
    alloc_id: str
    runtime: str


@attrs.define
class PoolSizing:
    """How many idle allocations each runtime should have: fixed, or adaptive (``fixed=None``)."""

    fixed: dict[str, int] | None = None
    memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB  # per client node
    window: float = 120.0  # seconds of creates the rate is measured over
    idle_after: float = 600.0  # seconds without a create after which a runtime's pool drains
    default_runtime: str | None = runtimes.DEFAULT_RUNTIME
    _creates: dict[str, deque[float]] = attrs.field(factory=dict)
    _placement_s: float = 1.0  # EWMA of how long one placement takes

    @property
    def adaptive(self) -> bool:
        return self.fixed is None

    def record_create(self, runtime: str, now: float | None = None) -> None:
        if self.adaptive:
            self._creates.setdefault(runtime, deque()).append(time.monotonic() if now is None else now)

    def record_placement(self, seconds: float) -> None:
        self._placement_s = 0.8 * self._placement_s + 0.2 * seconds

    def runtimes(self) -> set[str]:
        if self.fixed is not None:
            return {rt for rt, n in self.fixed.items() if n > 0}
        return set(self._creates) | ({self.default_runtime} if self.default_runtime else set())

    def targets(self, nodes: int, now: float | None = None) -> dict[str, int]:
        if self.fixed is not None:
            return {rt: n for rt, n in self.fixed.items() if n > 0}
        now = time.monotonic() if now is None else now
        demand: dict[str, int] = {}
        for runtime, times in self._creates.items():
            while times and times[0] < now - max(self.window, self.idle_after):
                times.popleft()
            recent = sum(1 for t in times if t >= now - self.window)
            if not times:
                continue  # idle: drains
            demand[runtime] = max(1, math.ceil(recent / self.window * self._placement_s * 2))
        if self.default_runtime:
            demand[self.default_runtime] = max(1, demand.get(self.default_runtime, 0))
        entry_mb = max(1, (default_resources().memory_bytes or 0) // 2**20)
        room = max(0, nodes) * self.memory_budget_mb // entry_mb
        total = sum(demand.values())
        if total <= room:
            return demand
        # Over budget: every runtime in use keeps one while there is room, the rest in proportion.
        out = dict.fromkeys(demand, 0)
        for runtime in sorted(demand, key=lambda r: -demand[r])[:room]:
            out[runtime] = 1
        spare = room - sum(out.values())
        extra = {rt: n - 1 for rt, n in demand.items() if out[rt]}
        extra_total = sum(extra.values())
        for runtime, n in extra.items():
            if spare > 0 and extra_total:
                out[runtime] += min(n, spare * n // extra_total)
        return out


def pool_sizing_from_env(value: str | None, memory_mb: str | None = None) -> PoolSizing:
    """``HUTCH_NOMAD_POOL``: ``auto`` (adaptive), ``off`` or empty (none), or fixed sizes
    ``"base:latest=2,python:3.13=1"``; ``HUTCH_NOMAD_POOL_MEMORY``: MiB per client node."""
    budget = DEFAULT_MEMORY_BUDGET_MB
    if memory_mb not in (None, ""):
        if not str(memory_mb).isdigit():
            raise InvalidInput(f"HUTCH_NOMAD_POOL_MEMORY: expected MiB per client node, got {memory_mb!r}",
                               field="nomad_pool_memory")
        budget = int(str(memory_mb))
    text = (value or "").strip()
    if text == "auto":
        return PoolSizing(fixed=None, memory_budget_mb=budget)
    sizes: dict[str, int] = {}
    if text != "off":
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            name, sep, count = part.rpartition("=")
            if not sep or not count.isdigit():
                raise InvalidInput(f"HUTCH_NOMAD_POOL: expected auto, off or runtime=count,…; got {part!r}",
                                   field="nomad_pool")
            sizes[name] = int(count)
    return PoolSizing(fixed=sizes, memory_budget_mb=budget)


class WarmPools:
    """The pool half of :class:`drivers.nomad.driver.NomadDriver` (a mixin: it uses the
    driver's Nomad client, job naming, images and task spawning)."""

    _client: NomadClient
    _available: set[str]
    datacenters: list[str]
    pool_sizing: PoolSizing
    _pool: dict[str, deque[PoolEntry]]
    _pool_starting: dict[str, int]
    _pool_claims: int
    _pool_misses: int
    _pool_nodes: int
    _refill_wakeup: asyncio.Event
    _refilling: bool
    _agents: ExecAgents
    _replica_id: str | None  # roles.Adoption.set_replica: marks the jobs, for a survivor's sweep
    _deployment: str | None  # the same: which deployment's replica that is

    # Provided by NomadDriver (the class this is mixed into).
    def _job_prefix(self) -> str:
        raise NotImplementedError

    def _image(self, recipe: Any, layer: str | None = None) -> str:
        raise NotImplementedError

    def _spawn(self, coro: Any, name: str) -> None:
        raise NotImplementedError

    async def _place(self, job: dict[str, Any]) -> str:
        raise NotImplementedError

    async def _stop_job(self, job_id: str, alloc_id: str | None, *, node_lost: bool = False) -> None:
        raise NotImplementedError

    def _init_pools(self, sizing: PoolSizing) -> None:
        self.pool_sizing = sizing
        self._pool = {}
        self._pool_starting = {}
        self._pool_claims = 0
        self._pool_misses = 0
        self._pool_nodes = 1
        self._refill_wakeup = asyncio.Event()
        self._refilling = False

    @property
    def pool_sizes(self) -> dict[str, int]:
        """The current target per runtime (fixed, or what the adaptive sizing wants now)."""
        return self.pool_sizing.targets(self._pool_nodes)

    def _start_pools(self) -> None:
        """Warm pools for the runtimes that have images (again after a first-use build)."""
        for runtime in self.pool_sizing.runtimes():
            if runtime in self._available:
                self._pool.setdefault(runtime, deque())
        if (self._pool or self.pool_sizing.adaptive) and not self._refilling:
            self._refilling = True
            self._spawn(self._refill_loop(), "nomad-pool")
        self._refill_wakeup.set()

    def _claim(self, runtime: str, resources: ResourceLimits) -> PoolEntry | None:
        self.pool_sizing.record_create(runtime)
        if self.pool_sizing.adaptive and runtime in self._available:
            self._pool.setdefault(runtime, deque())
        self._refill_wakeup.set()
        if runtime not in self._pool:
            return None
        pool = self._pool[runtime]
        if sized(resources) != sized(ResourceLimits()) or not pool:  # an entry has the default size
            self._pool_misses += 1
            return None
        self._pool_claims += 1
        return pool.popleft()

    def pool_metrics(self) -> dict[str, Any]:
        """Warm pool sizes and counters (the API's metrics show them)."""
        targets = self.pool_sizes
        return {
            "mode": "auto" if self.pool_sizing.adaptive else "fixed",
            "pools": {rt: {"target": targets.get(rt, 0), "ready": len(pool),
                           "starting": self._pool_starting.get(rt, 0)}
                      for rt, pool in self._pool.items()},
            "claims": self._pool_claims,
            "misses": self._pool_misses,
        }

    def _pool_metric_list(self) -> list[Metric]:
        pools = self.pool_metrics()
        out = [Metric("hutch_nomad_pool_claims_total", pools["claims"], "counter",
                      "creates served from a warm pool"),
               Metric("hutch_nomad_pool_misses_total", pools["misses"], "counter",
                      "creates that had to be scheduled cold")]
        for runtime, pool in sorted(pools["pools"].items()):
            for key, text in (("target", "warm pool size wanted now"), ("ready", "idle allocations ready to claim"),
                              ("starting", "allocations being placed to refill the pool")):
                out.append(Metric(f"hutch_nomad_pool_{key}", pool[key], "gauge", text, {"runtime": runtime}))
        return out

    async def _count_nodes(self) -> None:
        with contextlib.suppress(HutchError):
            nodes = await self._client.nodes()
            self._pool_nodes = max(1, sum(1 for n in nodes if n.get("Status") == "ready"
                                          and n.get("SchedulingEligibility", "eligible") == "eligible"))

    async def _refill_loop(self) -> None:
        counted = 0.0
        while True:
            self._refill_wakeup.clear()
            if self.pool_sizing.adaptive and time.monotonic() - counted > 30:
                await self._count_nodes()
                counted = time.monotonic()
            targets = self.pool_sizes
            for runtime, pool in self._pool.items():
                target = targets.get(runtime, 0)
                missing = target - len(pool) - self._pool_starting.get(runtime, 0)
                for _ in range(max(0, missing)):
                    self._pool_starting[runtime] = self._pool_starting.get(runtime, 0) + 1
                    self._spawn(self._add_to_pool(runtime), f"nomad-pool-{runtime}")
                while len(pool) > target:  # less wanted now: the oldest idle allocations go
                    self._retire(pool.popleft())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._refill_wakeup.wait(), 5)

    def _rejoin_pools(self, left: list[PoolEntry]) -> None:
        """Idle allocations a previous run of this data dir left (adoption.py): each starts its
        agent (the last one ended with that run's session) before a create can claim it, as a
        placed one does; counted as starting meanwhile, so no other is placed for it."""
        for entry in left:
            self._pool_starting[entry.runtime] = self._pool_starting.get(entry.runtime, 0) + 1
            self._spawn(self._add_to_pool(entry.runtime, left=entry), f"nomad-pool-{entry.runtime}")

    def _marks(self) -> dict[str, str]:
        """Job meta saying which replica (of which deployment) placed a job: a claim of a pool
        job is not recorded until its create's handle is, so a survivor ends a lost replica's
        by this (adoption.py: lost_leftovers); and replicas whose data dirs have one path share
        a job prefix, so a replica's start-up recovery leaves the others' jobs by it."""
        marks = {"hutch.replica": self._replica_id} if self._replica_id else {}
        if self._deployment:
            marks["hutch.deployment"] = self._deployment
        return marks

    async def _add_to_pool(self, runtime: str, left: PoolEntry | None = None) -> None:
        """Place an idle allocation of ``runtime`` (or take back ``left``), start its agent, and
        put it in the pool; one that fails is taken down."""
        recipe = runtimes.find(runtime)
        assert recipe is not None
        job_id = left.job_id if left is not None else f"{self._job_prefix()}pool-{uuid.uuid4().hex[:12]}"
        meta = {"hutch.pool": runtime, **self._marks()}
        settled = False  # in the pool, or failed and taken down
        try:
            if left is not None:
                alloc_id = left.alloc_id
            else:
                started = time.monotonic()
                alloc_id = await self._place(job_spec(job_id, self._image(recipe), self.datacenters,
                                                      ResourceLimits(), meta))
                self.pool_sizing.record_placement(time.monotonic() - started)
            await self._agents.warm(job_id, alloc_id, runtime)  # agents.py: so its claimer's commands are fast
            # It may have ended while its agent started; the watcher looks at entries only.
            alloc = await self._client.allocation(alloc_id)
            if alloc.get("ClientStatus") not in LIVE or alloc.get("DesiredStatus") != "run":
                # Imported here: this module is read without python-nomad (service/config.py checks
                # HUTCH_NOMAD_POOL on a plain `pip install hutch`), and placement.py needs it.
                from hutch.drivers.nomad.placement import alloc_reason

                raise DriverFailure(f"allocation {alloc_id} ended as it was placed: {alloc_reason(alloc)}")
            self._pool.setdefault(runtime, deque()).append(PoolEntry(job_id, alloc_id, runtime))
            settled = True
        except HutchError as err:
            log.warning("warm pool %s: placing an allocation failed: %s", runtime, err.message)
            await self._discard(job_id)
            settled = True
            await asyncio.sleep(2)  # counted as starting meanwhile: a failing placement is not retried at once
        finally:
            if not settled:  # cancelled half-way (the driver closing): nothing of it stays placed
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._discard(job_id))
            self._pool_starting[runtime] -= 1
            self._refill_wakeup.set()

    async def _discard(self, job_id: str) -> None:
        await self._agents.drop(job_id)
        with contextlib.suppress(HutchError):
            await self._client.deregister(job_id, purge=True)

    def _retire(self, entry: PoolEntry, *, alloc_id: str | None = None, node_lost: bool = False) -> None:
        """An idle allocation leaves its pool: its job stopped, its agent's session ended."""
        self._spawn(self._agents.drop(entry.job_id), f"exec-agent-drop-{entry.job_id}")
        self._spawn(self._stop_job(entry.job_id, alloc_id, node_lost=node_lost), f"nomad-reap-{entry.job_id}")

    async def _drain_pools(self) -> None:
        """Idle pool allocations are cheap to place again and must not pile up on the nodes."""
        drains = [entry.job_id for pool in self._pool.values() for entry in pool]
        self._pool.clear()
        for job_id in drains:
            with contextlib.suppress(HutchError):
                await self._client.deregister(job_id, purge=True)


def fixed_sizes(sizes: Mapping[str, int] | None) -> PoolSizing:
    return PoolSizing(fixed=dict(sizes or {}))
