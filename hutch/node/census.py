"""The agent's count of the sandboxes it runs and the memory and CPU their limits commit:
what a capacity read (every second, from every API replica) and a create's admission answer.

Kept as sandboxes are made, destroyed and seen to end, instead of asking the driver for every
live sandbox each time: that reads each sandbox's init in /proc (about 35 µs a sandbox here),
tens of milliseconds on the agent's event loop at a node of a thousand, once per create and
once a second per replica. The driver's own list is read whole at the first use and again
every ``RECOUNT`` seconds, so a sandbox counted wrongly (an end the agent was not told of:
every init's end is watched, so a rare miss) is counted right within that time; until then
it errs towards a fuller node. Once a minute, not more often: at every 10 s the whole reads
were most of an idle node's CPU (1,000 idle sandboxes: 2.0 -> 7.0 ms a second of the agent's
CPU, bench/idle_cluster.py), each one stall of the loop."""

from __future__ import annotations

import time

from hutch.core.errors import SandboxNotFound
from hutch.drivers.local.driver import LocalDriver


class Census:
    RECOUNT = 60.0  # seconds between whole reads of the driver's sandboxes

    def __init__(self) -> None:
        self._live: dict[str, tuple[int, int]] = {}  # sandbox -> (memory bytes, cpu millis) committed
        self._read_at = float("-inf")

    async def current(self, driver: LocalDriver) -> dict[str, tuple[int, int]]:
        if time.monotonic() - self._read_at >= self.RECOUNT:
            # LocalDriver.alive reads without yielding to the loop: no create or end lands
            # between its list and the swap.
            live = {sid: committed for sid in await driver.alive() if (committed := _limits(driver, sid))}
            self._live, self._read_at = live, time.monotonic()
        return self._live

    def known(self) -> dict[str, tuple[int, int]] | None:
        """The count as it stands, without a read of the driver's (None: never read yet)."""
        return None if self._read_at == float("-inf") else self._live

    def made(self, driver: LocalDriver, sandbox_id: str) -> None:
        if committed := _limits(driver, sandbox_id):
            self._live[sandbox_id] = committed

    def ended(self, sandbox_id: str) -> None:
        self._live.pop(sandbox_id, None)


def _limits(driver: LocalDriver, sandbox_id: str) -> tuple[int, int] | None:
    try:
        limits = driver.limits(sandbox_id)
    except SandboxNotFound:  # ended meanwhile
        return None
    return limits.memory_bytes or 0, limits.cpu_millis or 0
