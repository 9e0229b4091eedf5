"""A sandbox's run clock: the seconds it has not been frozen. A command's time limit counts
on it, so the time a paused sandbox spends frozen is not its commands' (as E2B's pause: a
command paused with its sandbox resumes with the time it had left). The local driver's
commands (and the node driver's, through its agents' local drivers) and the nomad driver's
(its limits are kept on the API side, as is its exec agent's silence watchdog) count on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class RunClock:
    """Monotonic seconds, stopped while the sandbox is frozen (``freeze``/``thaw``)."""

    def __init__(self) -> None:
        self._frozen_since: float | None = None
        self._frozen_for = 0.0

    def freeze(self) -> None:
        if self._frozen_since is None:
            self._frozen_since = time.monotonic()

    def thaw(self) -> None:
        if self._frozen_since is not None:
            self._frozen_for += time.monotonic() - self._frozen_since
            self._frozen_since = None

    @property
    def frozen(self) -> bool:
        return self._frozen_since is not None

    def __call__(self) -> float:
        now = self._frozen_since if self._frozen_since is not None else time.monotonic()
        return now - self._frozen_for


async def within(done: Awaitable[object], limit: float | None, clock: Callable[[], float] = time.monotonic) -> bool:
    """Wait for ``done`` at most ``limit`` seconds of ``clock``; whether it came in time.
    ``done`` is not cancelled when the time runs out. While the clock stands still (the
    sandbox frozen), the wait goes on: it is looked at again after the time that was left."""
    fut = asyncio.ensure_future(done)
    if limit is None:
        await asyncio.wait({fut})
        return True
    end = clock() + limit
    while not fut.done():
        left = end - clock()
        if left <= 0:
            return False
        await asyncio.wait({fut}, timeout=left)
    return True


async def sleep(seconds: float, clock: Callable[[], float]) -> None:
    """Sleep ``seconds`` of ``clock``: while it stands still (the sandbox frozen) the sleep
    goes on, looked at again after the time that was left."""
    end, left = clock() + seconds, seconds
    while left > 0:  # a poll only as often as the time left: not an event's job
        await asyncio.sleep(left)
        left = end - clock()
