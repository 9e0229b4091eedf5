"""Whether a host has room for one more sandbox (pure): the one check the node driver's
placement, a node agent's own admission and the local driver's create all ask.

A sandbox's memory limit is a ceiling, mostly idle: a host takes ``MEMORY_OVERCOMMIT`` times
its memory in limits (or the sum its operator set), and no sandbox larger than the memory it
really has available now (MemAvailable). Whatever their limits, sandboxes are counted too:
each holds a pid 1, cgroups, mounts, inodes and a share of the host's pids, which no memory
figure shows until the host runs out of them. CPU is counted where the caller gives the
host's cores (the node driver spreads sandboxes by it); a ceiling of CPU committed many times
over slows sandboxes down without failing any, so the local driver does not refuse for it.
"""

from __future__ import annotations

import attrs

from hutch.core.driver_types import ResourceLimits
from hutch.core.errors import InvalidInput

# What a sandbox without limits is counted as: the drivers' own defaults.
DEFAULT_MEMORY = 512 << 20
DEFAULT_CPU = 1000
MEMORY_OVERCOMMIT = 32
CPU_OVERCOMMIT = 8
# Per host unless its operator says otherwise (HUTCH_MAX_SANDBOXES; a node agent's
# HUTCH_NODE_MAX_SANDBOXES): an idle sandbox holds ~0.45 MiB of the host's memory that no
# limit counts, most of it kernel objects (docs/idle.md), and at least one pid.
MAX_SANDBOXES = 4000

Held = tuple[int, int, int]  # memory, cpu millis and sandboxes held for creates under way


@attrs.frozen
class Room:
    """A host's capacity and what its sandboxes' limits commit of it."""

    name: str  # as the refusal names it ("n1", "the host")
    memory_total: int
    memory_available: int
    memory_committed: int = 0
    sandboxes: int = 0
    max_sandboxes: int = MAX_SANDBOXES
    memory_limit: int | None = None  # the memory limits it takes in all; None: MEMORY_OVERCOMMIT x memory_total
    cpus: int | None = None  # None: CPU is not counted
    cpu_committed_millis: int = 0


def need(resources: ResourceLimits) -> tuple[int, int]:
    """The memory and cpu a sandbox of ``resources`` is counted as."""
    return resources.memory_bytes or DEFAULT_MEMORY, resources.cpu_millis or DEFAULT_CPU


def human(n: int) -> str:
    """Memory as an operator reads it (exact quantities like 21474560Ki are not)."""
    gib = 1 << 30
    if n % gib == 0:
        return f"{n // gib}Gi"
    return f"{n / gib:.1f}Gi" if n >= gib else f"{n >> 20}Mi"


def largest(room: Room) -> int:
    """The most memory one sandbox can have on ``room`` even with nothing else running: no more
    than its memory (MemTotal), nor than its sandboxes' limits may commit in all."""
    limit = room.memory_total * MEMORY_OVERCOMMIT if room.memory_limit is None else room.memory_limit
    return min(room.memory_total, limit)


def too_large(memory: int, most: int, where: str) -> InvalidInput:
    """A sandbox larger than ``most`` (``largest`` of every host that could take it): a 400, not
    a 503 NO_CAPACITY, which the clients retry for ~30 s (docs/wire.md) though no wait helps."""
    return InvalidInput(f"resources.memory: {human(memory)} is more than any sandbox can have {where} "
                        f"(at most {human(most)})", field="resources.memory")


def shortfall(room: Room, memory: int, cpu: int, reserved: Held = (0, 0, 0)) -> str | None:
    """What ``room`` lacks for one more sandbox of ``memory`` bytes and ``cpu`` millis, with
    ``reserved`` held for creates under way, or None if it has room."""
    if room.sandboxes + reserved[2] >= room.max_sandboxes:
        return f"{room.name} runs its maximum of {room.max_sandboxes} sandboxes"
    limit = room.memory_total * MEMORY_OVERCOMMIT if room.memory_limit is None else room.memory_limit
    free_memory = min(room.memory_available, limit - room.memory_committed) - reserved[0]
    if memory > free_memory:
        return f"{room.name} has {human(max(free_memory, 0))} memory free"
    if room.cpus is None:
        return None
    free_cpu = room.cpus * 1000 * CPU_OVERCOMMIT - room.cpu_committed_millis - reserved[1]
    if cpu > room.cpus * 1000:
        return f"{room.name} has {room.cpus * 1000}m cpu in all"
    if cpu > free_cpu:
        return f"{room.name} has {max(free_cpu, 0)}m cpu uncommitted"
    return None
