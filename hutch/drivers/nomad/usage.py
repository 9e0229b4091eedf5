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

import math
from typing import Any

import attrs

from hutch.drivers.nomad.client import NomadClient
from hutch.drivers.nomad.helpers import AgentHelpers
from hutch.drivers.nomad.state import NomadSandbox


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
