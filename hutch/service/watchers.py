"""Who waits for an execution, so that a command whose waiters all left can end.

The seeds' "Cancelling Commands" example aborts a command with an ``AbortSignal``; the real
client then only drops its connections: the long-poll for the execution and the output
streams it reads. The user means "stop it". So a waiter — a long-poll
(``GET /sandbox/execution/{id}?wait=…``) or a stream read of a command still running —
that disconnects before its answer is complete counts as abandoning the command, and when
no waiter is left the command is cancelled after a grace period (``HUTCH_ABANDON_GRACE``,
default 3 s).

Only a waiter that may act on the sandbox counts — one whose request, as it started, carried
a key allowed to write there (a member's or an admin's, within its projects). A read-only
key's long-poll and a keyless reader of a stream URL (a read capability, anyone's who has
the URL) are readers: they neither cancel the command by leaving nor keep it by staying.
Otherwise a read-only key, or anyone shown an output URL, could cancel other people's work. Any waiter that attaches within the grace keeps it running: a client that
merely lost its connection and comes back (the SDKs retry, the real client loops its
long-poll) loses nothing. Commands nobody ever waited for (fire and forget) and jobs
(which outlive their request by design) are never cancelled this way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable

GRACE_SECONDS = float(os.environ.get("HUTCH_ABANDON_GRACE", "3"))


class Watchers:
    def __init__(self, abandon: Callable[[str], Awaitable[object]], grace: float = GRACE_SECONDS) -> None:
        self._abandon = abandon  # cancels the execution (if it is still an exec that runs)
        self.grace = grace
        self._count: dict[str, int] = {}
        self._pending: dict[str, asyncio.Task[None]] = {}

    def close(self) -> None:
        for pending in self._pending.values():
            pending.cancel()
        self._pending.clear()

    def waiting(self, execution_id: str) -> int:
        return self._count.get(execution_id, 0)

    def attach(self, execution_id: str) -> None:
        self._count[execution_id] = self._count.get(execution_id, 0) + 1
        pending = self._pending.pop(execution_id, None)
        if pending is not None:
            pending.cancel()  # came back within the grace: keeps the command

    def detach(self, execution_id: str, *, abandoned: bool) -> None:
        left = self._count.get(execution_id, 1) - 1
        if left > 0:
            self._count[execution_id] = left
            return
        self._count.pop(execution_id, None)
        if abandoned and execution_id not in self._pending:
            self._pending[execution_id] = asyncio.create_task(self._after_grace(execution_id))

    async def _after_grace(self, execution_id: str) -> None:
        try:
            await asyncio.sleep(self.grace)
        except asyncio.CancelledError:
            return
        self._pending.pop(execution_id, None)
        with contextlib.suppress(Exception):
            await self._abandon(execution_id)
