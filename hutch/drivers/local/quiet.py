"""Requests in their launch phase, and background work that waits until none is.

A request holds the driver from the start of its provision until its command's helper is
started (a one-shot's create, its ``Start`` and ``StartExecution`` appends, then the exec),
or, for a create with no command, until ``SETTLED_GRACE`` after it is recorded
(``LocalDriver.settled``: time for its client's first execute, if it sends one at once, to
arrive and hold in turn), or from an exec's start to its helper's. Where the warm pool cannot start its sandboxes in
an idle cpu cgroup (pool.py: no ``cpu.idle``, a kernel before 5.15), its refill waits for no
hold before it starts each sandbox: on the same event loop (and, on a small machine, the same
cores) a refill that ran beside a launch doubled the ``Start`` append's time
(docs/benchmarks.md).
A hold lapses by itself after ``HOLD_MAX`` (a create that is never followed by an exec, a
caller that went away), and a waiter goes ahead after its own bound, so a steady load
defers a refill but never stops it.
"""

from __future__ import annotations

import asyncio
import contextlib

HOLD_MAX = 0.2  # s; a one-shot's create to its command's launch takes ~10 ms
# s; a create with no command answered: its client's execute, sent at once, holds within this.
# Released at the answer, a saturated machine's create -> execute pairs ran their execute
# beside the refill's start (0.96-1.12x in three runs); held for HOLD_MAX, a stream of creates
# never let the refill run and 98 % made their sandbox on the request's path (docs/benchmarks.md).
SETTLED_GRACE = 0.01


class Quiet:
    def __init__(self, hold_max: float = HOLD_MAX) -> None:
        self._hold_max = hold_max
        self._holds: dict[str, asyncio.TimerHandle] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def busy(self) -> bool:
        return bool(self._holds)

    def hold(self, key: str) -> None:
        """A request (``key``: a sandbox or execution id) is launching; again: refreshed."""
        old = self._holds.pop(key, None)
        if old is not None:
            old.cancel()
        self._holds[key] = asyncio.get_running_loop().call_later(self._hold_max, self.release, key)
        self._idle.clear()

    def shorten(self, key: str, most: float) -> None:
        """``key``'s hold, if it still has one, lapses ``most`` seconds from now at the latest."""
        old = self._holds.get(key)
        if old is not None and old.when() - asyncio.get_running_loop().time() > most:
            old.cancel()
            self._holds[key] = asyncio.get_running_loop().call_later(most, self.release, key)

    def release(self, *keys: str) -> None:
        for key in keys:
            handle = self._holds.pop(key, None)
            if handle is not None:
                handle.cancel()
        if not self._holds:
            self._idle.set()

    async def wait(self, most: float) -> None:
        """Until no request holds the driver, or ``most`` seconds, whichever is first."""
        if self._holds:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), most)
