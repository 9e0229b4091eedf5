"""What a nomad sandbox holds now, for E2B's metrics, each figure from where it cannot be
forged by the sandbox where that is possible, and from where it is on a cluster too:

- its totals (memory, CPUs, disk limit): the job the driver registered (what the plugin
  enforces), read once per sandbox;
- memory held now and its page cache: the plugin's usage verb (containerd-driver's
  cgroupUsage: the container's cgroup, read on its client through an alloc exec, as its CPU
  seconds are); from a plugin built before it said them, the memory held comes from Nomad's
  allocation stats (the plugin's TaskStats: ``memory.current``; the servers forward the call
  to that node, so the API server needs no way onto it) and the page cache is not known;
- its disk: the exec agent's ``disk`` helper inside the sandbox (helpers.py), as the
  sandbox's own counts: the task's disk-limit file system, or its workspace and the files its
  writable layer holds. Nothing outside the sandbox sees its overlay's upper directory
  through Nomad's API, and the plugin answers nothing about it.

The page cache has no other source: the container has no cgroup file system to read it from,
and Nomad's stats carry what TaskStats measures ("Usage" only). A client runs the new plugin
once ``./scripts/services start nomad`` has rebuilt it (its sources' hash) and restarted
Nomad."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from hutch.core.errors import HutchError
from hutch.drivers.base import Usage
from hutch.drivers.nomad.client import NomadClient
from hutch.drivers.nomad.execs import plugin_verb
from hutch.drivers.nomad.helpers import AgentHelpers
from hutch.drivers.nomad.jobs import TASK
from hutch.drivers.nomad.state import NomadSandbox

log = logging.getLogger(__name__)

USAGE_TIMEOUT = 2.0  # seconds for one usage read (an alloc exec on the sandbox's client)
NOMAD_READ_TIMEOUT = 5.0  # seconds for a read of Nomad's API (a job, an allocation's stats) under load
DISK_TIMEOUT = 30.0  # seconds for a disk reading (without a disk limit, a walk of the sandbox's files)


@attrs.frozen
class Sizes:
    """A sandbox's limits, as its job says them."""

    memory_bytes: int
    cpu_count: int
    disk_limited: bool


def sizes_of(job: dict[str, Any]) -> Sizes:
    """A sandbox job's (jobs.job_spec) memory limit, CPUs (its CFS quota, rounded up) and
    whether it has a disk limit."""
    task = job["TaskGroups"][0]["Tasks"][0]
    config = task.get("Config") or {}
    return Sizes(memory_bytes=int(task["Resources"]["MemoryMB"]) * 2**20,
                 cpu_count=max(1, math.ceil(int(config.get("cpu_millis") or 1000) / 1000)),
                 disk_limited=bool(config.get("disk_bytes")))


class NowReadings:
    """The sandbox's totals (cached per sandbox: a job's resources never change) and what it
    holds now."""

    def __init__(self, client: NomadClient, helpers: AgentHelpers) -> None:
        self._client, self._helpers = client, helpers
        self._sizes: dict[str, Sizes] = {}

    async def sizes(self, sb: NomadSandbox) -> Sizes:
        found = self._sizes.get(sb.id)
        if found is None:
            found = self._sizes[sb.id] = sizes_of(await self._client.job(sb.job_id))
        return found

    def forget(self, sandbox_id: str) -> None:
        self._sizes.pop(sandbox_id, None)

    async def memory_now(self, sb: NomadSandbox) -> int | None:
        stats = await self._client.allocation_stats(sb.alloc_id)
        memory = ((stats.get("ResourceUsage") or {}).get("MemoryStats") or {})
        if "Usage" not in (memory.get("Measured") or []):
            return None
        return int(memory["Usage"])

    async def disk(self, sb: NomadSandbox) -> tuple[int, int]:
        return await self._helpers.disk(sb, limited=(await self.sizes(sb)).disk_limited)

    async def usage(self, sb: NomadSandbox, *, disk: bool = False) -> Usage:
        """CPU, peak memory and (a current plugin) memory now and its page cache from the
        plugin's usage verb (the container's cgroup accounting, read on the client); its memory
        and CPU totals from its job; with ``disk`` (E2B's metrics) its disk too, and the memory
        it holds from Nomad where the plugin does not say it (above: from where)."""
        used = await self._plugin_usage(sb)
        now: dict[str, Any] = {}
        # Each bounded as the verb is (a client cut off answers nothing, and a status read must
        # not wait for the heartbeat timeout that declares it lost), and each on its own: one
        # source failing leaves only its fields unknown.
        async def read(what: str, seconds: float, reading: Callable[[], Awaitable[dict[str, Any]]]) -> None:
            try:
                async with asyncio.timeout(seconds):
                    now.update(await reading())
            except (TimeoutError, HutchError) as err:
                log.warning("sandbox %s: its %s was not read: %s", sb.id, what,
                            getattr(err, "message", None) or "timed out")

        async def totals() -> dict[str, Any]:
            sizes = await self.sizes(sb)
            return {"memory_total_bytes": sizes.memory_bytes, "cpu_count": sizes.cpu_count}

        async def memory() -> dict[str, Any]:
            return {"memory_bytes": await self.memory_now(sb)}

        async def disk_now() -> dict[str, Any]:
            used_bytes, total = await self.disk(sb)
            return {"disk_used_bytes": used_bytes, "disk_total_bytes": total}

        await read("memory and CPU totals", NOMAD_READ_TIMEOUT, totals)
        if disk and used.memory_bytes is None:  # an older plugin: Nomad's own reading
            await read("memory", NOMAD_READ_TIMEOUT, memory)
        if disk:
            await read("disk", DISK_TIMEOUT, disk_now)  # without a disk limit, a walk of what it wrote
        return attrs.evolve(used, **now)

    async def _plugin_usage(self, sb: NomadSandbox) -> Usage:
        for _ in range(2):  # an alloc exec now and then fails to start on a busy client: once more
            try:
                async with asyncio.timeout(USAGE_TIMEOUT):
                    code, out = await plugin_verb(self._client, sb.alloc_id, TASK, {"usage": True})
            except TimeoutError:
                return Usage()  # unreachable: asking again would only wait again
            except HutchError:
                continue
            if code == 0:
                break
        else:
            return Usage()
        data = json.loads(out or b"{}")
        peak, held, cache = (data.get(k) for k in ("memoryPeakBytes", "memoryBytes", "memoryCacheBytes"))
        # Memory now and its page cache: from a plugin that reads them (containerd-driver's
        # cgroupUsage); an older one on a client says neither.
        return Usage(cpu_seconds=data.get("cpuSeconds"), memory_peak_bytes=int(peak) if peak is not None else None,
                     memory_bytes=int(held) if held is not None else None,
                     memory_cache_bytes=int(cache) if cache is not None else None)
