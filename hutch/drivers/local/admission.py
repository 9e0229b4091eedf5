"""The local driver's admission: a create this host has no room for is refused, 503
``NO_CAPACITY`` naming what is short, before anything of it is made or recorded; one larger
than the host could hold even empty (its MemTotal, or its commit limit) is a 400 naming
``resources.memory`` and the most a sandbox can have (a 503 is retried, in vain). The check
is core/capacity.py's, the one the node driver's placement and a node agent ask: the memory
limits of the host's sandboxes against ``memory_limit`` (HUTCH_MEMORY_COMMIT_LIMIT; else
MEMORY_OVERCOMMIT x MemTotal), each new one against MemAvailable, and their count against
``max_sandboxes`` (HUTCH_MAX_SANDBOXES). Without it one tenant could create sandboxes until
the host's memory was committed many times over or its pids ran out, and every other tenant's
sandboxes and the server itself met the OOM killer and failing forks.

Counted: every live sandbox's memory limit (a filesystem-paused one too: its resume boots it
again without asking), and the creates under way. ``reserve`` (the engine's, before it
records the sandbox) holds room at once, in one step of the event loop, so two creates at
once cannot both take the last of it; the provision turns the hold into a sandbox, and a
create that fails first releases it, or it lapses ``RESERVATION`` after it was taken, or
after the create's last long step: a create whose runtime is built first, or its install
layer (``busy``: the driver's builds and ``prepare``), keeps its hold while it waits, and
``renew`` restarts the count when the step ends. Its hold lapsed at 30 s whatever it waited
for, and a host filled meanwhile failed the create already recorded.

The warm pool's idle sandboxes (pool.py) hold memory and pids as a sandbox does, so they
count too, as claimable capacity: a refill starts one only where the host has room for it
beside every sandbox, hold and other spare (``spare``), so a host at its bound grows no
spares. A create is not refused for them (a spare is the room a create takes), and a create
that claims one is counted once: its hold, then its sandbox, the spare gone from the count
as it is claimed (``spare_gone``). A create made from scratch beside spares may take the
host past its bound by them: once it is made, ``surplus`` names the spares to destroy.
Before, a full host went on filling its pool, and the sandboxes of a host at its
HUTCH_MAX_SANDBOXES came with two more idle ones per runtime that nothing counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import attrs

from hutch.core import capacity
from hutch.core.driver_types import ResourceLimits
from hutch.core.errors import NoCapacity

RESERVATION = 30.0  # seconds a create's hold lasts without its provision


@attrs.frozen
class HostLimits:
    """What this host takes in sandboxes (the server's settings)."""

    max_sandboxes: int = capacity.MAX_SANDBOXES
    memory_limit: int | None = None  # the memory limits it takes in all; None: MEMORY_OVERCOMMIT x MemTotal


def host_memory() -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes, from /proc/meminfo."""
    values: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                values[key] = int(rest.split()[0]) * 1024
    return values.get("MemTotal", 0), values.get("MemAvailable", 0)


@attrs.frozen
class _Hold:
    memory: int
    lapses: float  # time.monotonic()
    runtime: str


def _idle(sandbox_id: str, runtime: str) -> bool:
    return False


class HostAdmission:
    def __init__(self, limits: HostLimits, memory: Callable[[], tuple[int, int]] = host_memory,
                 busy: Callable[[str, str], bool] = _idle) -> None:
        """``busy(sandbox, runtime)``: whether a create is still in a long step (its runtime's
        build, its install layer's), its hold kept past ``RESERVATION``."""
        self.limits = limits
        self._memory = memory
        self._busy = busy
        self._live: dict[str, int] = {}  # sandbox -> the memory it is counted as
        self._committed = 0  # their sum
        self._held: dict[str, _Hold] = {}  # creates under way
        self._spares: dict[str, int] = {}  # the warm pool's idle sandboxes and those starting: name -> memory
        self.counted = False  # whether the live sandboxes were counted (``count``) since the start

    def count(self, live: Mapping[str, ResourceLimits]) -> None:
        """The live sandboxes, whole (``LocalDriver.alive``): a count that drifted is right again."""
        self._live = {sid: capacity.need(limits)[0] for sid, limits in live.items()}
        self._committed = sum(self._live.values())
        for sid in self._live:
            self._held.pop(sid, None)
        self.counted = True

    def reserve(self, sandbox_id: str, resources: ResourceLimits, runtime: str = "") -> None:
        """Hold room for the sandbox, or raise NoCapacity naming what is short."""
        now = time.monotonic()
        for sid, hold in [(sid, hold) for sid, hold in self._held.items() if hold.lapses < now]:
            if self._busy(sid, hold.runtime):
                self._held[sid] = attrs.evolve(hold, lapses=now + RESERVATION)
            else:
                del self._held[sid]
        if sandbox_id in self._held or sandbox_id in self._live:
            return
        memory, _cpu = capacity.need(resources)
        total, available = self._memory()
        # A hold counts as the sandbox it becomes: its limit committed, not its limit gone from
        # MemAvailable, which a made sandbox's is not either (it shows there as it is used).
        # Taken from both, the 41st of creates at once of 512Mi on a host with 20Gi available
        # would be refused where the same creates one after another are made.
        room = self._room(total, available)
        most = capacity.largest(room)
        if memory > most:  # even an empty host could not hold it: no wait helps
            raise capacity.too_large(memory, most, "on this host")
        why = capacity.shortfall(room, memory, 0, (0, 0, len(self._held)))
        if why:
            raise NoCapacity(f"no room for a sandbox of {capacity.human(memory)} memory: {why}; "
                             "try again once sandboxes end", field="resources")
        self._held[sandbox_id] = _Hold(memory, now + RESERVATION, runtime)

    def _room(self, total: int, available: int, *, spares: bool = False) -> capacity.Room:
        """The host with its sandboxes' and holds' limits committed (and its spares', if ``spares``)."""
        held = sum(h.memory for h in self._held.values()) + (sum(self._spares.values()) if spares else 0)
        return capacity.Room(name="the host", memory_total=total, memory_available=available,
                             memory_committed=self._committed + held, sandboxes=len(self._live),
                             max_sandboxes=self.limits.max_sandboxes, memory_limit=self.limits.memory_limit)

    def spare(self, name: str, memory: int | None) -> bool:
        """Room for one more idle sandbox of the warm pool, of ``memory``: counted at once (it is
        starting) if the host has room for it beside every sandbox, hold and spare; else False."""
        if name in self._spares:
            return True
        need = capacity.need(ResourceLimits(memory_bytes=memory))[0]
        room = self._room(*self._memory(), spares=True)
        if capacity.shortfall(room, need, 0, (0, 0, len(self._held) + len(self._spares))):
            return False
        self._spares[name] = need
        return True

    def spare_gone(self, name: str) -> None:
        """A spare claimed (its create's hold counts it now), destroyed or never started."""
        self._spares.pop(name, None)

    def surplus(self) -> list[str]:
        """The spares past the host's bounds (its sandbox count, its commit limit) beside its
        sandboxes and holds, newest first: the pool destroys them. MemAvailable is not asked:
        what a spare uses shows in it already."""
        total, _ = self._memory()
        limit = total * capacity.MEMORY_OVERCOMMIT if self.limits.memory_limit is None else self.limits.memory_limit
        count = len(self._live) + len(self._held) + len(self._spares) - self.limits.max_sandboxes
        memory = self._committed + sum(h.memory for h in self._held.values()) + sum(self._spares.values()) - limit
        out: list[str] = []
        for name, need in reversed(self._spares.items()):
            if count <= 0 and memory <= 0:
                break
            out.append(name)
            count, memory = count - 1, memory - need
        return out

    def made(self, sandbox_id: str, resources: ResourceLimits) -> None:
        self._held.pop(sandbox_id, None)
        if sandbox_id not in self._live:
            self._live[sandbox_id] = memory = capacity.need(resources)[0]
            self._committed += memory

    def renew(self, *, sandbox_id: str = "", runtime: str = "") -> None:
        """The holds of ``sandbox_id``, or of creates of ``runtime``, last ``RESERVATION`` from
        now: a long step of theirs (``busy``) just ended."""
        lapses = time.monotonic() + RESERVATION
        for sid, hold in list(self._held.items()):
            if sid == sandbox_id or (runtime and hold.runtime == runtime):
                self._held[sid] = attrs.evolve(hold, lapses=lapses)

    def release(self, sandbox_id: str) -> None:
        """A create that did not get as far as its sandbox: its hold ends."""
        self._held.pop(sandbox_id, None)

    def ended(self, sandbox_id: str) -> None:
        self._held.pop(sandbox_id, None)
        self._committed -= self._live.pop(sandbox_id, 0)
